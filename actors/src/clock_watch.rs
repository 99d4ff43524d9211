//! The clock watch (a [`Periodic`] round every second): warns while the
//! machine's wall clock has moved away from the node's clock (the wall
//! clock at start advanced by the monotonic clock, `fastack_core::clock`).
//! The node keeps its own time through a step; an operator who corrected
//! the machine's clock learns here that the node follows at its next start.

use std::time::Duration;

use async_trait::async_trait;
use ractor::ActorProcessingErr;
use tracing::warn;

use crate::{context::Ctx, periodic::Periodic};

/// A drift the node does not mention (NTP slews far less than this).
const TOLERATED: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug)]
pub struct ClockWatch;

#[async_trait]
impl Periodic for ClockWatch {
    const NAME: &'static str = "clock_watch";

    fn every(&self, _ctx: &Ctx) -> Duration {
        // Two clock reads: cheap; repeated warnings are counted by the log.
        Duration::from_secs(1)
    }

    async fn run(&mut self, ctx: &Ctx) -> Result<(), ActorProcessingErr> {
        if let Some(drift) = ctx.clock.wall_drift()
            && drift.abs().to_std().unwrap_or(Duration::MAX) > TOLERATED
        {
            warn!(
                drift_ms = drift.num_milliseconds(),
                "the machine's wall clock moved since this node started; the node keeps \
                 counting from its start (leases, retries and received times are unaffected) \
                 and follows the wall clock after a restart"
            );
        }
        Ok(())
    }
}
