//! ProcessorActor: turns a tenant's inbox rows into stored events.
//!
//! Each transaction renews the tenant's lease (fencing), takes the inbox
//! rows through the second idempotency fence (see
//! `fastack_core::store::processing`), resolves identities and appends to
//! `tracked_events`. Woken by the ingest writer (fast path) and by a
//! periodic tick (recovery path, rows accepted by other nodes, lease
//! renewal). A crash loses nothing: the inbox is durable and the supervisor
//! restarts the processor.
//!
//! Poison events: when the database refuses a batch because of its values,
//! the processor goes one row at a time to find the row at fault, counts a
//! failed attempt on it (kept in the inbox row) and retries it with
//! backoff; after `FASTACK_PROCESS_MAX_ATTEMPTS` the row moves to
//! quarantine and the tenant's later events go on. Every accepted event is
//! stored or in quarantine, never silently stuck.

use std::{sync::Arc, time::Instant};

use chrono::Duration;
use fastack_core::{
    Error as CoreError,
    store::{ProcessOutcome, ProcessRequest},
};
use fastack_entities::TenantId;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::context::{Ctx, TenantShared};

pub struct ProcessorActor;

pub struct ProcessorArgs {
    pub ctx: Arc<Ctx>,
    pub shared: Arc<TenantShared>,
}

pub struct ProcessorState {
    ctx: Arc<Ctx>,
    shared: Arc<TenantShared>,
    tenant_id: TenantId,
    /// Whether this node believes it holds the tenant's lease.
    holding: bool,
    /// Whether this processor ever held the lease (its first is routine).
    ever_held: bool,
    ticker: Option<JoinHandle<()>>,
    /// When the last round ended, and whether a gathered round is scheduled.
    last_round: Option<std::time::Instant>,
    /// How long the last round took: the gather wait is at most that.
    last_round_took: std::time::Duration,
    gathering: bool,
    /// Highest inbox `seq` this processor has consumed while holding the
    /// lease. Woken rounds read from a little below it (see
    /// [`straggler_window`]); ticks read the whole inbox of the tenant.
    cursor: Option<i64>,
    /// A row that failed processing waits until then for its next attempt.
    retry_at: Option<Instant>,
    /// Counts this processor in `fastack_processors` while its state lives
    /// (dropped however the actor ends: stopped, failed or killed).
    _alive: fastack_core::metrics::Held,
}

/// Wait before the next attempt of an event that failed `attempts` times:
/// 100 ms doubling, at most 2 s (five attempts take about 1.5 s).
fn retry_delay(attempts: u32) -> std::time::Duration {
    std::time::Duration::from_millis(100u64 << attempts.saturating_sub(1).min(4))
        .min(std::time::Duration::from_secs(2))
}

/// How a round ended.
enum Round {
    /// Nothing (more) to do now.
    Done,
    /// The database refused the batch of the rows above `after_seq`.
    Refused {
        error: CoreError,
        after_seq: Option<i64>,
    },
}

/// How far below its cursor a woken round starts reading. Inbox rows are
/// numbered when inserted but become visible when their commit ends, so a
/// group commit that started earlier can land rows below rows already
/// consumed. Overlapping commits on one node span at most this many
/// numbers; anything older (a very slow commit, another node) is found by
/// the next tick's full read. Without the cursor each round would walk the
/// index entries of every row deleted since the table was last vacuumed.
fn straggler_window(ctx: &crate::context::Ctx) -> i64 {
    (ctx.config.ingest_max_rows as i64).saturating_mul(4)
}

/// Messages of a tenant's processor.
#[derive(Debug)]
pub enum ProcessorMsg {
    /// New inbox rows were committed on this node.
    Work,
    /// Periodic: renew or take the lease and drain the inbox.
    Tick,
}

impl ProcessorActor {
    /// The request of one processing transaction of at most `limit` rows.
    fn request(state: &ProcessorState, after_seq: Option<i64>, limit: u32) -> ProcessRequest {
        let ctx = &state.ctx;
        let tenant = state.shared.tenant();
        ProcessRequest {
            tenant_id: state.tenant_id,
            node_id: ctx.node_id,
            retention_class: ctx.config.plans.retention_for(&tenant) as i16,
            limit,
            now: ctx.now(),
            lease_ttl: Duration::from_std(ctx.config.lease_ttl).unwrap_or(Duration::seconds(10)),
            tracked: ctx.routing.tracked.clone(),
            tracked_if_subscribed: ctx.routing.tracked_if_subscribed.clone(),
            after_seq,
            faults: ctx.faults.clone(),
        }
    }

    /// Processes batches of `limit` rows until the inbox is drained.
    async fn drain(
        state: &mut ProcessorState,
        mut after_seq: Option<i64>,
        limit: u32,
    ) -> Result<Round, ActorProcessingErr> {
        loop {
            let req = Self::request(state, after_seq, limit);
            match state.ctx.store.processing().run(&req).await {
                Ok(out) => {
                    if out.consumed == 0 {
                        return Ok(Round::Done);
                    }
                    Self::processed(state, &out);
                    if let Some(last) = out.last_seq {
                        // Continue right after this batch: rows below it
                        // were either just consumed or are stragglers.
                        after_seq = Some(last);
                    }
                    if out.consumed < limit as usize {
                        return Ok(Round::Done);
                    }
                }
                Err(CoreError::LeaseLost) => {
                    info!(tenant = %state.tenant_id, "processing lease lost");
                    state.holding = false;
                    state.cursor = None;
                    return Ok(Round::Done);
                }
                Err(error) if error.is_refusal() => {
                    return Ok(Round::Refused { error, after_seq });
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn processed(state: &mut ProcessorState, out: &ProcessOutcome) {
        let ctx = &state.ctx;
        // The transaction has committed: the dispatcher and the sinks'
        // relays look now, not at their next poll.
        if out.deliveries > 0 {
            ctx.signals.deliveries.raise();
        }
        if out.outboxed > 0 {
            ctx.signals.outbox.raise();
        }
        if let Some(last) = out.last_seq {
            state.cursor = Some(state.cursor.map_or(last, |c| c.max(last)));
        }
        ctx.metrics
            .events_processed
            .inc_by(out.appended.len() as u64);
        if out.consumed > 0 {
            ctx.metrics
                .processing_round_events
                .observe(out.consumed as f64);
        }
        for (from, n) in [
            ("memory", out.identities_from_memory),
            ("database", out.identities_looked_up),
        ] {
            if n > 0 {
                ctx.metrics
                    .identities_resolved
                    .get_or_create(&fastack_core::metrics::ResolvedLabels { from })
                    .inc_by(n as u64);
            }
        }
        for (reason, n) in [("suppressed", out.suppressed), ("erasure", out.held)] {
            if n > 0 {
                ctx.metrics
                    .privacy_dropped_events
                    .get_or_create(&fastack_core::metrics::PrivacyLabels {
                        tenant: state.tenant_id.to_string(),
                        reason,
                    })
                    .inc_by(n as u64);
            }
        }
        let done = ctx.now();
        for received in &out.received {
            let lag = (done - *received).num_microseconds().unwrap_or(0).max(0);
            ctx.metrics
                .processing_lag_seconds
                .observe(lag as f64 / 1_000_000.0);
        }
        debug!(
            tenant = %state.tenant_id,
            consumed = out.consumed,
            appended = out.appended.len(),
            already_processed = out.already_processed,
            dropped = out.suppressed + out.held,
            "processed batch"
        );
    }

    /// The database refused a batch: process one row at a time up to the
    /// row at fault, count its failed attempt, and after the last attempt
    /// move it to quarantine and go on with the rest at once.
    async fn isolate(
        myself: &ActorRef<ProcessorMsg>,
        state: &mut ProcessorState,
        mut after_seq: Option<i64>,
    ) -> Result<(), ActorProcessingErr> {
        let ctx = state.ctx.clone();
        loop {
            let (error, at) = match Self::drain(state, after_seq, 1).await? {
                Round::Done => return Ok(()),
                Round::Refused { error, after_seq } => (error, after_seq),
            };
            let Some((seq, event_id)) = ctx
                .store
                .quarantine()
                .next_inbox_row(state.tenant_id, at)
                .await?
            else {
                return Ok(());
            };
            let reason = fastack_core::redact::redact(&error.to_string());
            let attempts = ctx
                .store
                .quarantine()
                .record_failure(state.tenant_id, seq, &reason)
                .await?;
            warn!(
                op = "process event",
                tenant = %state.tenant_id,
                event = %event_id,
                seq,
                attempt = attempts,
                max_attempts = ctx.config.process_max_attempts,
                %error,
                "processing an event failed"
            );
            if attempts < ctx.config.process_max_attempts {
                let delay = retry_delay(attempts);
                state.retry_at = Some(Instant::now() + delay);
                myself.send_after(delay, || ProcessorMsg::Work);
                return Ok(());
            }
            if let Some(q) = ctx
                .store
                .quarantine()
                .take(state.tenant_id, seq, ctx.now())
                .await?
            {
                ctx.metrics.quarantined_events.inc();
                warn!(
                    tenant = %state.tenant_id,
                    event = %q.event_id,
                    attempts = q.attempts,
                    error = %q.error,
                    "event moved to quarantine; the tenant's later events go on \
                     (fastack admin quarantine list --tenant <tenant>)"
                );
            }
            // The rest of the inbox, in batches again.
            match Self::drain(state, Some(seq), ctx.config.process_batch).await? {
                Round::Done => return Ok(()),
                Round::Refused { after_seq: at, .. } => after_seq = at,
            }
        }
    }
}

impl Actor for ProcessorActor {
    type Msg = ProcessorMsg;
    type State = ProcessorState;
    type Arguments = ProcessorArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let tenant_id = args.shared.tenant().id;
        let alive = fastack_core::metrics::Held::new(&args.ctx.metrics.processors);
        Ok(ProcessorState {
            ctx: args.ctx,
            shared: args.shared,
            tenant_id,
            holding: false,
            ever_held: false,
            ticker: None,
            last_round: None,
            last_round_took: std::time::Duration::ZERO,
            gathering: false,
            cursor: None,
            retry_at: None,
            _alive: alive,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.ticker =
            Some(myself.send_interval(state.ctx.config.poll_interval, || ProcessorMsg::Tick));
        // Resume whatever is already waiting (restart, takeover).
        myself.send_message(ProcessorMsg::Tick)?;
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(t) = state.ticker.take() {
            t.abort();
        }
        if state.holding {
            // Hand the tenant over promptly instead of waiting for expiry.
            let _ = state
                .ctx
                .store
                .processing()
                .release_lease(state.tenant_id, state.ctx.node_id)
                .await;
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let tick = matches!(message, ProcessorMsg::Tick);
        // Gather: right after a round, wait a little for more rows instead of
        // running a transaction per wake-up (many tenants, small commits).
        // The wait is at most what the last round took: under load rounds
        // grow and so does the gathering; a lone event waits for nothing.
        if !tick && let Some(last) = state.last_round {
            let since = last.elapsed();
            let gather = state.ctx.config.process_gather.min(state.last_round_took);
            if since < gather {
                if !state.gathering {
                    state.gathering = true;
                    myself.send_after(gather - since, || ProcessorMsg::Work);
                }
                return Ok(());
            }
        }
        state.gathering = false;
        let round_started = std::time::Instant::now();
        state.shared.take_pending();
        let ctx = &state.ctx;
        let ttl = Duration::from_std(ctx.config.lease_ttl).unwrap_or(Duration::seconds(10));
        if tick || !state.holding {
            let held = ctx
                .store
                .processing()
                .try_lease(state.tenant_id, ctx.node_id, ctx.now(), ttl)
                .await?;
            if held != state.holding {
                // A node's first lease on a tenant is routine (every start);
                // a lease taken over or lost later is worth a line.
                if held && !state.ever_held {
                    tracing::debug!(tenant = %state.tenant_id, node = %ctx.node_id, "processing lease taken");
                } else {
                    info!(tenant = %state.tenant_id, node = %ctx.node_id, held, "processing lease changed");
                }
                state.ever_held |= held;
                state.cursor = None;
            }
            state.holding = held;
        }
        if !state.holding {
            return Ok(());
        }
        if state.retry_at.is_some_and(|at| Instant::now() < at) {
            // A failed row waits for its next attempt (a Work is scheduled).
            return Ok(());
        }
        let window = straggler_window(ctx);
        let after_seq = if tick {
            None
        } else {
            state.cursor.map(|c| c.saturating_sub(window))
        };
        state.retry_at = None;
        if let Round::Refused { after_seq, .. } =
            Self::drain(state, after_seq, ctx.config.process_batch).await?
        {
            Self::isolate(&myself, state, after_seq).await?;
        }
        state.last_round = Some(std::time::Instant::now());
        state.last_round_took = round_started.elapsed();
        Ok(())
    }
}
