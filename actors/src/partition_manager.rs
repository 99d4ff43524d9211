//! PartitionManagerActor: at start and every `FASTACK_PARTITION_INTERVAL_MS`
//! (by the node's clock, injectable in tests), creates the monthly
//! partitions of `tracked_events` ahead of time, schedules a retention job
//! for every partition past its class's retention (the job runner archives,
//! verifies, then drops it), and forgets idempotency keys and fence rows
//! that retention made useless.

use std::sync::Arc;

use fastack_core::retention;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::context::Ctx;

pub struct PartitionManagerActor;

pub struct PartitionManagerArgs {
    pub ctx: Arc<Ctx>,
}

pub struct PartitionManagerState {
    ctx: Arc<Ctx>,
    ticker: Option<JoinHandle<()>>,
}

/// Messages of the partition manager.
#[derive(Debug)]
pub enum PartitionManagerMsg {
    /// Run one maintenance round now.
    Tick,
}

impl Actor for PartitionManagerActor {
    type Msg = PartitionManagerMsg;
    type State = PartitionManagerState;
    type Arguments = PartitionManagerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        *args.ctx.partition_manager.write() = Some(myself);
        Ok(PartitionManagerState {
            ctx: args.ctx,
            ticker: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.ticker = Some(
            myself.send_interval(state.ctx.config.partition_interval, || {
                PartitionManagerMsg::Tick
            }),
        );
        myself.send_message(PartitionManagerMsg::Tick)?;
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
        *state.ctx.partition_manager.write() = None;
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            PartitionManagerMsg::Tick => {
                let ctx = &state.ctx;
                let now = ctx.now();
                match retention::maintain(ctx.store.as_ref(), &ctx.config, now).await {
                    Ok(m) => {
                        if !m.scheduled.is_empty() {
                            info!(partitions = ?m.due, jobs = m.scheduled.len(), "retention scheduled");
                            ctx.kick_jobs();
                        }
                        if m.pruned_keys > 0 || m.pruned_fence > 0 {
                            info!(
                                keys = m.pruned_keys,
                                fence = m.pruned_fence,
                                "pruned expired idempotency state"
                            );
                        }
                    }
                    Err(error) => {
                        warn!(%error, "partition maintenance failed; retrying next round")
                    }
                }
            }
        }
        Ok(())
    }
}
