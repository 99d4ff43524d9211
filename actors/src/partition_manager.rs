//! The partition manager (a [`Periodic`] round, at start, every
//! `FASTACK_PARTITION_INTERVAL_MS` by the node's clock — injectable in
//! tests — and when signalled): creates the monthly partitions of
//! `tracked_events` ahead of time, schedules a retention job for every
//! partition past its class's retention (the job runner archives, verifies,
//! then drops it), and forgets idempotency keys and fence rows that
//! retention made useless. A failed round is logged and tried again next
//! round.

use std::time::Duration;

use async_trait::async_trait;
use fastack_core::retention;
use ractor::ActorProcessingErr;
use tracing::{info, warn};

use crate::{context::Ctx, periodic::Periodic, signal::Signal};

#[derive(Clone, Copy, Debug)]
pub struct PartitionManager;

#[async_trait]
impl Periodic for PartitionManager {
    const NAME: &'static str = "partition_manager";

    fn every(&self, ctx: &Ctx) -> Duration {
        ctx.config.partition_interval
    }

    fn signal<'c>(&self, ctx: &'c Ctx) -> Option<&'c Signal> {
        Some(&ctx.signals.partitions)
    }

    async fn run(&mut self, ctx: &Ctx) -> Result<(), ActorProcessingErr> {
        match retention::maintain(ctx.store.as_ref(), &ctx.config, ctx.now()).await {
            Ok(m) => {
                if !m.scheduled.is_empty() {
                    info!(partitions = ?m.due, jobs = m.scheduled.len(), "retention scheduled");
                    ctx.signals.jobs.raise();
                }
                if m.pruned_keys > 0 || m.pruned_fence > 0 {
                    info!(
                        keys = m.pruned_keys,
                        fence = m.pruned_fence,
                        "pruned expired idempotency state"
                    );
                }
            }
            Err(error) => warn!(%error, "partition maintenance failed; retrying next round"),
        }
        Ok(())
    }
}
