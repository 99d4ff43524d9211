//! ProcessorActor: turns a tenant's inbox rows into stored events.
//!
//! Each transaction renews the tenant's lease (fencing), applies the second
//! idempotency fence (`processed_jobs`), resolves identities, appends to
//! `tracked_events` and consumes the inbox rows. Woken by the ingest writer
//! (fast path) and by a periodic tick (recovery path, rows accepted by other
//! nodes, lease renewal). A crash loses nothing: the inbox is durable and
//! the supervisor restarts the processor.

use std::sync::Arc;

use chrono::Duration;
use fastack_core::{Error as CoreError, store::ProcessRequest};
use fastack_entities::TenantId;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::task::JoinHandle;
use tracing::{debug, info};

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
    ticker: Option<JoinHandle<()>>,
    /// When the last round ended, and whether a gathered round is scheduled.
    last_round: Option<std::time::Instant>,
    gathering: bool,
    /// Highest inbox `seq` this processor has consumed while holding the
    /// lease. Woken rounds read from a little below it (see
    /// [`straggler_window`]); ticks read the whole inbox of the tenant.
    cursor: Option<i64>,
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
        Ok(ProcessorState {
            ctx: args.ctx,
            shared: args.shared,
            tenant_id,
            holding: false,
            ticker: None,
            last_round: None,
            gathering: false,
            cursor: None,
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
        if !tick && let Some(last) = state.last_round {
            let since = last.elapsed();
            let gather = state.ctx.config.process_gather;
            if since < gather {
                if !state.gathering {
                    state.gathering = true;
                    myself.send_after(gather - since, || ProcessorMsg::Work);
                }
                return Ok(());
            }
        }
        state.gathering = false;
        state.shared.take_pending();
        let ctx = &state.ctx;
        let ttl = Duration::from_std(ctx.config.lease_ttl).unwrap_or(Duration::seconds(10));
        if tick || !state.holding {
            let held = ctx
                .store
                .try_lease(state.tenant_id, ctx.node_id, ctx.now(), ttl)
                .await?;
            if held != state.holding {
                info!(tenant = %state.tenant_id, node = %ctx.node_id, held, "processing lease changed");
                state.cursor = None;
            }
            state.holding = held;
        }
        if !state.holding {
            return Ok(());
        }
        let window = straggler_window(ctx);
        let mut after_seq = if tick {
            None
        } else {
            state.cursor.map(|c| c.saturating_sub(window))
        };
        let tenant = state.shared.tenant();
        let retention = ctx.config.plans.retention_for(&tenant);
        let emit_tracked = ctx.tracked_emit(state.tenant_id).await;
        loop {
            let now = ctx.now();
            let req = ProcessRequest {
                tenant_id: state.tenant_id,
                node_id: ctx.node_id,
                retention_class: retention as i16,
                limit: ctx.config.process_batch,
                now,
                lease_ttl: ttl,
                emit_tracked,
                after_seq,
            };
            match ctx.store.process_batch(&req).await {
                Ok(out) => {
                    if out.consumed == 0 {
                        break;
                    }
                    if let Some(last) = out.last_seq {
                        state.cursor = Some(state.cursor.map_or(last, |c| c.max(last)));
                        // Continue right after this batch: rows below it
                        // were either just consumed or are stragglers.
                        after_seq = Some(last);
                    }
                    ctx.metrics
                        .events_processed
                        .inc_by(out.appended.len() as u64);
                    let done = chrono::Utc::now();
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
                        "processed batch"
                    );
                    if out.consumed < ctx.config.process_batch as usize {
                        break;
                    }
                }
                Err(CoreError::LeaseLost) => {
                    info!(tenant = %state.tenant_id, "processing lease lost");
                    state.holding = false;
                    state.cursor = None;
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
        state.last_round = Some(std::time::Instant::now());
        Ok(())
    }
}
