//! WebhookDispatcherActor: hands due deliveries to one EndpointWorker per
//! endpoint (the deliveries are created by the transaction that writes each
//! event, `fastack_core::store::deliveries::fan_out`).
//!
//! Dispatch runs every 100 ms and when the deliveries signal is raised. It
//! claims due deliveries — a retry's due time is a column, so a
//! restart resumes the schedule — and routes them to their endpoint's
//! worker, at most [`BACKLOG_PER_SLOT`] × the concurrency ceiling per
//! endpoint in flight; the rest stay in the table for the next round.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use chrono::Duration as ChronoDuration;
use fastack_core::store::AttemptRecord;
use fastack_entities::{DeliveryId, EndpointId};
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use tracing::warn;

use super::{
    WebhookSettings,
    endpoint_worker::{
        BACKLOG_PER_SLOT, EndpointWorkerActor, EndpointWorkerArgs, EndpointWorkerMsg, http_client,
    },
};
use crate::{context::Ctx, signal::Wakes};

pub struct WebhookDispatcherActor;

pub struct WebhookDispatcherArgs {
    pub ctx: Arc<Ctx>,
}

pub struct WebhookDispatcherState {
    ctx: Arc<Ctx>,
    client: reqwest::Client,
    workers: HashMap<EndpointId, ActorRef<EndpointWorkerMsg>>,
    worker_ids: HashMap<ActorId, EndpointId>,
    in_flight: HashMap<EndpointId, HashSet<DeliveryId>>,
    /// Due deliveries were left in the table because an endpoint's backlog
    /// was full: dispatch again as soon as a slot frees, not at the next tick.
    throttled: bool,
    /// The last claim, made while an endpoint was full, found nothing: new
    /// deliveries wait for a claim until then.
    starved: Option<Instant>,
    /// Finished attempts not recorded yet, and whether a flush is due.
    finished: Vec<AttemptRecord>,
    flush_scheduled: bool,
    /// Its timer and signal, stopped with the state.
    wakes: Option<Wakes>,
}

/// Messages of the dispatcher.
#[derive(Debug)]
pub enum WebhookDispatcherMsg {
    /// Dispatch due deliveries (the timer).
    Tick,
    /// New deliveries were written.
    NewDeliveries,
    /// A worker finished an attempt: record it (batched).
    Done {
        endpoint: EndpointId,
        record: Box<AttemptRecord>,
    },
    /// Record the attempts gathered so far.
    Flush,
}

/// Finished attempts are recorded in one transaction when this many have
/// gathered, or this long after the first of them.
const FLUSH_AT: usize = 256;
const FLUSH_AFTER: Duration = Duration::from_millis(5);
/// Deliveries claimed per round at most.
const CLAIM_AT_MOST: usize = 200;
/// How long new deliveries wait for a claim after one found only full
/// endpoints' rows due.
const STARVED_PAUSE: Duration = Duration::from_millis(10);

impl WebhookDispatcherActor {
    /// Records the finished attempts. When that fails their claims expire
    /// and the deliveries are attempted again, with the same webhook-id
    /// (receivers are told to expect a repeat).
    async fn flush(state: &mut WebhookDispatcherState) {
        state.flush_scheduled = false;
        if state.finished.is_empty() {
            return;
        }
        let records = std::mem::take(&mut state.finished);
        if let Err(error) = state.ctx.store.deliveries().record_attempts(&records).await {
            warn!(%error, attempts = records.len(), "could not record webhook attempts; they will be made again");
        }
    }

    /// Deliveries one endpoint may have handed out at once.
    fn backlog(ctx: &Ctx) -> usize {
        WebhookSettings::of(&ctx.config).max_concurrency.max(1) * BACKLOG_PER_SLOT
    }

    async fn dispatch(
        myself: &ActorRef<WebhookDispatcherMsg>,
        state: &mut WebhookDispatcherState,
    ) -> Result<(), ActorProcessingErr> {
        let ctx = state.ctx.clone();
        let backlog = Self::backlog(&ctx);
        // Endpoints whose workers hold all they may: their rows stay in the
        // table until a slot frees (see `Done`).
        let full: Vec<EndpointId> = state
            .in_flight
            .iter()
            .filter(|(_, busy)| busy.len() >= backlog)
            .map(|(e, _)| *e)
            .collect();
        if !full.is_empty() {
            state.throttled = true;
        }
        // No more than the endpoints at work have room for: claiming rows
        // only to give them back is churn.
        let room = state
            .in_flight
            .values()
            .map(|busy| backlog.saturating_sub(busy.len()))
            .filter(|r| *r > 0)
            .min()
            .unwrap_or(CLAIM_AT_MOST)
            .min(CLAIM_AT_MOST);
        let due = ctx
            .store
            .deliveries()
            .claim_due(
                ctx.now(),
                ChronoDuration::from_std(WebhookSettings::of(&ctx.config).claim)
                    .unwrap_or(ChronoDuration::seconds(60)),
                room as u32,
                &full,
            )
            .await?;
        state.starved =
            (due.is_empty() && !full.is_empty()).then(|| Instant::now() + STARVED_PAUSE);
        let mut later = Vec::new();
        for d in due {
            let endpoint = d.endpoint.id;
            let busy = state.in_flight.entry(endpoint).or_default();
            if busy.len() >= backlog || busy.contains(&d.id) {
                later.push(d.id);
                state.throttled = true;
                continue;
            }
            busy.insert(d.id);
            if busy.len() >= backlog {
                // Full now: the next claim comes when a slot frees.
                state.throttled = true;
            }
            let worker = match state.workers.get(&endpoint) {
                Some(w) => w.clone(),
                None => {
                    let (w, _) = Actor::spawn_linked(
                        None,
                        EndpointWorkerActor,
                        EndpointWorkerArgs {
                            ctx: ctx.clone(),
                            endpoint,
                            client: state.client.clone(),
                            report: {
                                let me = myself.clone();
                                Arc::new(move |endpoint, record| {
                                    let _ = me.cast(WebhookDispatcherMsg::Done {
                                        endpoint,
                                        record: Box::new(record),
                                    });
                                })
                            },
                        },
                        myself.get_cell(),
                    )
                    .await?;
                    state.worker_ids.insert(w.get_id(), endpoint);
                    state.workers.insert(endpoint, w.clone());
                    w
                }
            };
            let id = d.id;
            if worker
                .cast(EndpointWorkerMsg::Deliver {
                    delivery: Box::new(d),
                })
                .is_err()
            {
                later.push(id);
                if let Some(b) = state.in_flight.get_mut(&endpoint) {
                    b.remove(&id);
                }
            }
        }
        if !later.is_empty() {
            ctx.store.deliveries().release(&later).await?;
        }
        Ok(())
    }
}

impl Actor for WebhookDispatcherActor {
    type Msg = WebhookDispatcherMsg;
    type State = WebhookDispatcherState;
    type Arguments = WebhookDispatcherArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let client = http_client(
            WebhookSettings::of(&args.ctx.config).allow_private,
            WebhookSettings::of(&args.ctx.config).proxy.as_deref(),
        )?;
        Ok(WebhookDispatcherState {
            client,
            ctx: args.ctx,
            workers: HashMap::new(),
            worker_ids: HashMap::new(),
            in_flight: HashMap::new(),
            throttled: false,
            starved: None,
            finished: Vec::new(),
            flush_scheduled: false,
            wakes: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.wakes = Some(
            Wakes::start(&myself, Duration::from_millis(100), None, || {
                WebhookDispatcherMsg::Tick
            })
            .and_signal(&myself, &state.ctx.signals.deliveries, || {
                WebhookDispatcherMsg::NewDeliveries
            }),
        );
        myself.send_message(WebhookDispatcherMsg::Tick)?;
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.wakes = None;
        myself
            .stop_children_and_wait(Some("shutdown".to_owned()), Some(crate::SHUTDOWN_WAIT))
            .await;
        // What was delivered is recorded, so a restart does not send it again.
        Self::flush(state).await;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            WebhookDispatcherMsg::Tick => Self::dispatch(&myself, state).await?,
            // While a full endpoint's rows are all that is due, a claim per
            // new delivery would scan them for nothing: claim at most every
            // STARVED_PAUSE (another endpoint's row waits no longer), or when
            // a slot frees, or at the tick.
            WebhookDispatcherMsg::NewDeliveries
                if state.starved.is_some_and(|until| Instant::now() < until) => {}
            WebhookDispatcherMsg::NewDeliveries => Self::dispatch(&myself, state).await?,
            WebhookDispatcherMsg::Flush => Self::flush(state).await,
            WebhookDispatcherMsg::Done { endpoint, record } => {
                let delivery = record.delivery;
                state.finished.push(*record);
                if state.finished.len() >= FLUSH_AT {
                    Self::flush(state).await;
                } else if !state.flush_scheduled {
                    state.flush_scheduled = true;
                    myself.send_after(FLUSH_AFTER, || WebhookDispatcherMsg::Flush);
                }
                if let Some(b) = state.in_flight.get_mut(&endpoint) {
                    b.remove(&delivery);
                    if b.is_empty() {
                        state.in_flight.remove(&endpoint);
                    }
                }
                let refill = state
                    .in_flight
                    .get(&endpoint)
                    .is_none_or(|b| b.len() <= Self::backlog(&state.ctx) / 2);
                if state.throttled && refill {
                    state.throttled = false;
                    Self::dispatch(&myself, state).await?;
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let SupervisionEvent::ActorFailed(cell, _)
        | SupervisionEvent::ActorTerminated(cell, _, _) = &event
            && let Some(endpoint) = state.worker_ids.remove(&cell.get_id())
        {
            // The worker is started again on its endpoint's next delivery;
            // its in-flight deliveries come back when their claims expire.
            state.workers.remove(&endpoint);
            if matches!(event, SupervisionEvent::ActorFailed(..)) {
                state.ctx.metrics.restarted("endpoint_worker");
                warn!(%endpoint, "endpoint worker failed");
            }
        }
        Ok(())
    }
}
