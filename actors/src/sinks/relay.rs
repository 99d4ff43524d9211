//! RelayActor: drives one [`Sink`]. Every `interval` and whenever the
//! outbox signal is raised, it claims the rows the sink owes (a claim with
//! an expiry, `SKIP LOCKED` on PostgreSQL, so relays of several nodes share
//! the work and a dead relay's rows come back), hands them to the sink,
//! completes what the sink took and gives the rest back at once. A sink
//! whose link is down is reconnected with capped backoff; meanwhile its
//! rows wait in the outbox. A batching sink (one that writes files) is
//! sent named batches instead, when its flush rule says, a stale batch
//! first. Each relay reports its sink's lag (`fastack_sink_lag_seconds`)
//! and warns while it falls behind.

use std::{marker::PhantomData, sync::Arc, time::Duration};

use chrono::Duration as ChronoDuration;
use fastack_core::metrics::SinkLabels;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::time::Instant;
use tracing::warn;

use crate::{child::ChildSpec, context::Ctx, signal::Wakes, sinks::Sink};
use fastack_core::backoff::Backoff;

/// How often the depth and lag gauges are refreshed.
const DEPTH_EVERY: Duration = Duration::from_secs(1);
/// A sink is behind when its oldest owed row waited this long (beyond its
/// flush age, for a batching sink).
const BEHIND: Duration = Duration::from_secs(60);

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

    fn claim_for(state: &RelayState<S>) -> ChronoDuration {
        ChronoDuration::from_std(state.sink.claim_for()).unwrap_or(ChronoDuration::seconds(30))
    }

    /// One round; returns whether there may be more to send at once.
    async fn pump(
        myself: &ActorRef<RelayMsg>,
        state: &mut RelayState<S>,
    ) -> Result<bool, ActorProcessingErr> {
        let ctx = state.ctx.clone();
        let claim_for = Self::claim_for(state);
        let sent = match state.sink.batches() {
            None => {
                let rows = ctx
                    .store
                    .outbox()
                    .claim(S::NAME, ctx.now(), claim_for, S::BATCH)
                    .await?;
                if rows.is_empty() {
                    return Ok(false);
                }
                let sent = state.sink.send(&ctx, &rows).await;
                (sent, rows.len() == S::BATCH as usize)
            }
            Some(flush) => {
                let now = ctx.now();
                let owed = ctx.store.outbox().owed(S::NAME, flush.rows).await?;
                let due = owed.events >= i64::from(flush.rows)
                    || owed
                        .oldest
                        .is_some_and(|t| (now - t).to_std().unwrap_or_default() >= flush.age);
                let Some(batch) = ctx
                    .store
                    .outbox()
                    .claim_batch(S::NAME, now, claim_for, due.then_some(flush.rows))
                    .await?
                else {
                    return Ok(false);
                };
                (state.sink.send_batch(&ctx, &batch).await, true)
            }
        };
        let (sent, more) = sent;
        ctx.store.outbox().complete(S::NAME, &sent.done).await?;
        if let Err(error) = ctx.store.outbox().release(S::NAME, &sent.retry).await {
            warn!(sink = %S::NAME, %error, "could not give rows back; they return when their claim expires");
        }
        if let Some(why) = sent.down {
            Self::link_down(myself, state, &why);
            return Ok(false);
        }
        Ok(more && !sent.done.is_empty())
    }

    async fn refresh_depth(state: &mut RelayState<S>) {
        if state.depth_at.is_some_and(|at| at.elapsed() < DEPTH_EVERY) {
            return;
        }
        state.depth_at = Some(Instant::now());
        let labels = SinkLabels {
            sink: S::NAME.as_str(),
        };
        if let Ok(depth) = state.ctx.store.outbox().depth(S::NAME).await {
            state
                .ctx
                .metrics
                .outbox_depth
                .get_or_create(&labels)
                .set(depth);
        }
        if let Ok(oldest) = state.ctx.store.outbox().oldest(S::NAME).await {
            let lag = oldest
                .and_then(|t| (state.ctx.now() - t).to_std().ok())
                .unwrap_or_default();
            state
                .ctx
                .metrics
                .sink_lag_seconds
                .get_or_create(&labels)
                .set(lag.as_secs() as i64);
            let allowed = BEHIND + state.sink.batches().map_or(Duration::ZERO, |f| f.age);
            if lag > allowed {
                warn!(
                    sink = %S::NAME,
                    lag_s = lag.as_secs(),
                    connected = state.connected,
                    "sink falling behind: its oldest owed event waits longer than it should"
                );
            }
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
        // A batching sink flushes by size or age: its timer is enough, and
        // waking it at every commit that writes outbox rows would only ask
        // again and again whether a batch is due.
        let signal = match state.sink.batches() {
            None => Some(&state.ctx.signals.outbox),
            Some(_) => None,
        };
        state.wakes = Some(Wakes::start(&myself, state.sink.interval(), signal, || {
            RelayMsg::Pump
        }));
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
                    while state.connected && Self::pump(&myself, state).await? {}
                }
                Self::refresh_depth(state).await;
            }
        }
        Ok(())
    }
}
