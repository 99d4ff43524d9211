//! PeriodicActor: "at start, every N, and whenever signalled, do X" — one
//! actor type for every timer of a node (the repairer, the partition
//! manager). The work is a [`Periodic`]; a round that returns an error fails
//! the actor, and the root starts it again after a backoff.

use std::{marker::PhantomData, sync::Arc, time::Duration};

use async_trait::async_trait;
use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::{
    child::ChildSpec,
    context::Ctx,
    signal::{Signal, Wakes},
};

#[async_trait]
pub trait Periodic: Clone + Send + Sync + 'static {
    /// Its name in logs and restarts.
    const NAME: &'static str;

    /// Time between rounds.
    fn every(&self, ctx: &Ctx) -> Duration;

    /// A signal that runs a round at once.
    fn signal<'c>(&self, _ctx: &'c Ctx) -> Option<&'c Signal> {
        None
    }

    /// One round.
    async fn run(&mut self, ctx: &Ctx) -> Result<(), ActorProcessingErr>;
}

pub struct PeriodicActor<P>(PhantomData<fn() -> P>);

pub struct PeriodicArgs<P> {
    pub ctx: Arc<Ctx>,
    pub work: P,
}

pub struct PeriodicState<P> {
    ctx: Arc<Ctx>,
    work: P,
    /// Its timer and signal, stopped with the state.
    wakes: Option<Wakes>,
}

/// Messages of a periodic actor.
#[derive(Debug)]
pub enum PeriodicMsg {
    /// Run one round now.
    Tick,
}

impl<P: Periodic> PeriodicActor<P> {
    pub fn child(work: P) -> ChildSpec {
        ChildSpec::new(P::NAME, move |ctx| {
            Some((
                PeriodicActor::<P>(PhantomData),
                PeriodicArgs {
                    ctx,
                    work: work.clone(),
                },
            ))
        })
    }
}

impl<P: Periodic> Actor for PeriodicActor<P> {
    type Msg = PeriodicMsg;
    type State = PeriodicState<P>;
    type Arguments = PeriodicArgs<P>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(PeriodicState {
            ctx: args.ctx,
            work: args.work,
            wakes: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let every = state.work.every(&state.ctx);
        state.wakes = Some(Wakes::start(
            &myself,
            every,
            state.work.signal(&state.ctx),
            || PeriodicMsg::Tick,
        ));
        myself.send_message(PeriodicMsg::Tick)?;
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            PeriodicMsg::Tick => state.work.run(&state.ctx).await,
        }
    }
}
