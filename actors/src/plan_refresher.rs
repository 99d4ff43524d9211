//! The plan refresher (a [`Periodic`] round every `FASTACK_PLAN_REFRESH_MS`,
//! 1 s): reads which tracking plan version is the latest of each tenant and
//! compiles what changed, so an install on any node is in force on this
//! one within a round.

use std::time::Duration;

use async_trait::async_trait;
use ractor::ActorProcessingErr;
use tracing::warn;

use crate::{context::Ctx, periodic::Periodic};

#[derive(Clone, Copy, Debug)]
pub struct PlanRefresher;

#[async_trait]
impl Periodic for PlanRefresher {
    const NAME: &'static str = "plan_refresher";

    fn every(&self, ctx: &Ctx) -> Duration {
        ctx.config.plan_refresh_interval
    }

    async fn run(&mut self, ctx: &Ctx) -> Result<(), ActorProcessingErr> {
        // The plans in force stay as they were until a read succeeds.
        if let Err(error) = ctx.plans.refresh(ctx.store.as_ref()).await {
            warn!(%error, "reading tracking plans failed; retrying next round");
        }
        Ok(())
    }
}
