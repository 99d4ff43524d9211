//! RelayActor: drives one [`Sink`]. Every `interval` and whenever the
//! outbox signal is raised, it claims the rows the sink owes (a claim with
//! an expiry, `SKIP LOCKED` on PostgreSQL, so relays of several nodes share
//! the work and a dead relay's rows come back), hands them to the sink,
//! completes what the sink took and gives the rest back at once. A sink
//! whose link is down is reconnected with capped backoff; meanwhile its
//! rows wait in the outbox.

use std::{marker::PhantomData, sync::Arc, time::Duration};

use chrono::Duration as ChronoDuration;
use fastack_core::metrics::SinkLabels;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::time::Instant;
use tracing::warn;

use crate::{context::Ctx, root::ChildSpec, signal::Wakes, sinks::Sink};
use fastack_core::backoff::Backoff;

/// How long a claimed row stays with this relay before others may take it.
const CLAIM: ChronoDuration = ChronoDuration::seconds(30);
/// How often the depth gauge is refreshed.
const DEPTH_EVERY: Duration = Duration::from_secs(1);

pub struct RelayActor<S>(PhantomData<fn() -> S>);

pub struct RelayArgs<S> {
    pub ctx: Arc<Ctx>,
    pub sink: S,
}

pub struct RelayState<S> {
    ctx: Arc<Ctx>,
    sink: S,
    connected: bool,
    /// A reconnect is scheduled: pumps wait for it.
    reconnecting: bool,
    backoff: Backoff,
    depth_at: Option<Instant>,
    /// Its timer and signal, stopped with the state.
    wakes: Option<Wakes>,
}

/// Messages of a relay.
#[derive(Debug)]
pub enum RelayMsg {
    /// Send whatever the sink owes.
    Pump,
    /// (Re)connect the sink (sent after a backoff).
    Connect,
}

impl<S: Sink> RelayActor<S> {
    /// The relay of the sink `make` builds, as a child of the root (named
    /// `relay_<sink>` in restarts and logs).
    pub fn child(make: fn(&Ctx) -> Option<S>) -> ChildSpec {
        ChildSpec::new(
            Box::leak(format!("relay_{}", S::NAME).into_boxed_str()),
            move |ctx| {
                make(&ctx).map(|sink| (RelayActor::<S>(PhantomData), RelayArgs { ctx, sink }))
            },
        )
    }

    fn link_down(myself: &ActorRef<RelayMsg>, state: &mut RelayState<S>, why: &str) {
        state.connected = false;
        if !state.reconnecting {
            state.reconnecting = true;
            let delay = state.backoff.next_delay();
            warn!(
                sink = %S::NAME,
                why,
                delay_ms = delay.as_millis() as u64,
                "sink link down, reconnecting after backoff"
            );
            myself.send_after(delay, || RelayMsg::Connect);
        }
    }

    /// One round; returns how many rows the sink took.
    async fn pump(
        myself: &ActorRef<RelayMsg>,
        state: &mut RelayState<S>,
    ) -> Result<usize, ActorProcessingErr> {
        let ctx = state.ctx.clone();
        let rows = ctx
            .store
            .claim_outbox(S::NAME, ctx.now(), CLAIM, S::BATCH)
            .await?;
        if rows.is_empty() {
            return Ok(0);
        }
        let sent = state.sink.send(&ctx, &rows).await;
        ctx.store.complete_outbox(S::NAME, &sent.done).await?;
        if let Err(error) = ctx.store.release_outbox(S::NAME, &sent.retry).await {
            warn!(sink = %S::NAME, %error, "could not give rows back; they return when their claim expires");
        }
        if let Some(why) = sent.down {
            Self::link_down(myself, state, &why);
        }
        Ok(sent.done.len())
    }

    async fn refresh_depth(state: &mut RelayState<S>) {
        if state.depth_at.is_some_and(|at| at.elapsed() < DEPTH_EVERY) {
            return;
        }
        state.depth_at = Some(Instant::now());
        if let Ok(depth) = state.ctx.store.outbox_depth(S::NAME).await {
            state
                .ctx
                .metrics
                .outbox_depth
                .get_or_create(&SinkLabels {
                    sink: S::NAME.as_str(),
                })
                .set(depth);
        }
    }
}

impl<S: Sink> Actor for RelayActor<S> {
    type Msg = RelayMsg;
    type State = RelayState<S>;
    type Arguments = RelayArgs<S>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(RelayState {
            ctx: args.ctx,
            sink: args.sink,
            connected: false,
            reconnecting: false,
            backoff: Backoff::new(Duration::from_millis(200), fastack_core::backoff::MAX_DELAY),
            depth_at: None,
            wakes: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.wakes = Some(Wakes::start(
            &myself,
            state.sink.interval(),
            Some(&state.ctx.signals.outbox),
            || RelayMsg::Pump,
        ));
        myself.send_message(RelayMsg::Connect)?;
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.wakes = None;
        state.sink.close().await;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            RelayMsg::Connect => {
                state.reconnecting = false;
                if state.connected {
                    return Ok(());
                }
                match state.sink.connect(&state.ctx).await {
                    Ok(()) => {
                        state.connected = true;
                        state.backoff.started();
                        myself.send_message(RelayMsg::Pump)?;
                    }
                    Err(why) => Self::link_down(&myself, state, &why),
                }
            }
            RelayMsg::Pump => {
                if state.connected {
                    // Drain: keep going while full batches come back.
                    while state.connected && Self::pump(&myself, state).await? == S::BATCH as usize
                    {
                    }
                }
                Self::refresh_depth(state).await;
            }
        }
        Ok(())
    }
}
