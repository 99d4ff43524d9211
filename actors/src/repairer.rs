//! RepairerActor: once at start and every `FASTACK_REPAIR_INTERVAL_MS`
//! (30 s), finds terminal jobs whose pending-event marker is still set with
//! no outbox row left (a crash between the broker's confirm and clearing
//! the marker) and writes their stored event body to the outbox again, same
//! `ce-id`. Rows are claimed in the database, so repairers of several nodes
//! sweeping at once do the work once.

use std::sync::Arc;

use chrono::Duration;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::task::JoinHandle;
use tracing::info;

use crate::context::Ctx;

pub struct RepairerActor;

pub struct RepairerArgs {
    pub ctx: Arc<Ctx>,
}

pub struct RepairerState {
    ctx: Arc<Ctx>,
    ticker: Option<JoinHandle<()>>,
}

/// Messages of the repairer.
#[derive(Debug)]
pub enum RepairerMsg {
    /// Look for terminal events still marked pending.
    Sweep,
}

impl Actor for RepairerActor {
    type Msg = RepairerMsg;
    type State = RepairerState;
    type Arguments = RepairerArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(RepairerState {
            ctx: args.ctx,
            ticker: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.ticker =
            Some(myself.send_interval(state.ctx.config.repair_interval, || RepairerMsg::Sweep));
        myself.send_message(RepairerMsg::Sweep)?;
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
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            RepairerMsg::Sweep => {
                let ctx = &state.ctx;
                let emit = ctx.job_emit();
                if !emit.any() {
                    return Ok(());
                }
                // The claim outlasts a sweep, so a slow relay is not raced.
                let claim = Duration::from_std(ctx.config.repair_interval)
                    .unwrap_or(Duration::seconds(30))
                    .max(Duration::seconds(5));
                let repaired = ctx
                    .store
                    .repair_pending_events(ctx.now(), claim, emit, 1_000)
                    .await?;
                if let Ok(outbox) = ctx.store.outbox_depth().await {
                    ctx.metrics.outbox_depth.set(outbox);
                }
                if !repaired.is_empty() {
                    info!(
                        jobs = repaired.len(),
                        "re-emitting terminal events still marked pending"
                    );
                    ctx.metrics.events_repaired.inc_by(repaired.len() as u64);
                    ctx.kick_relay();
                }
            }
        }
        Ok(())
    }
}
