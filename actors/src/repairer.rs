//! The repairer (a [`Periodic`] round, at start and every
//! `FASTACK_REPAIR_INTERVAL_MS`, 30 s): finds terminal jobs whose
//! pending-event marker is still set with no outbox row left (a crash
//! between a sink's completion and clearing the marker) and writes their
//! stored event body to the outbox again, same `ce-id`. Rows are claimed in
//! the database, so repairers of several nodes sweeping at once do the work
//! once.

use std::time::Duration as StdDuration;

use async_trait::async_trait;
use chrono::Duration;
use ractor::ActorProcessingErr;
use tracing::info;

use crate::{context::Ctx, periodic::Periodic};

#[derive(Clone, Copy, Debug)]
pub struct Repairer;

#[async_trait]
impl Periodic for Repairer {
    const NAME: &'static str = "repairer";

    fn every(&self, ctx: &Ctx) -> StdDuration {
        ctx.config.repair_interval
    }

    async fn run(&mut self, ctx: &Ctx) -> Result<(), ActorProcessingErr> {
        let emit = &ctx.routing.jobs;
        if !emit.any() {
            return Ok(());
        }
        // The claim outlasts a sweep, so a slow sink is not raced.
        let claim = Duration::from_std(ctx.config.repair_interval)
            .unwrap_or(Duration::seconds(30))
            .max(Duration::seconds(5));
        let repaired = ctx
            .store
            .jobs()
            .repair_pending_events(ctx.now(), claim, emit, 1_000)
            .await?;
        if !repaired.is_empty() {
            info!(
                jobs = repaired.len(),
                "re-emitting terminal events still marked pending"
            );
            ctx.metrics.events_repaired.inc_by(repaired.len() as u64);
            ctx.signals.deliveries.raise();
            ctx.signals.outbox.raise();
        }
        Ok(())
    }
}
