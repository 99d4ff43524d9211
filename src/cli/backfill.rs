//! `fastack admin backfill <sink>`: a tenant's stored events of a range
//! written to a sink that neither holds nor owes them, as a `backfill` job
//! run here with a progress bar.

use fastack_actors::{
    Service,
    sinks::{self, BackfillRequest},
};
use fastack_core::store::TimeRange;
use fastack_entities::{JobKind, JobStatus};

use super::{
    jobs::{ended, run_jobs_here},
    print::print,
};

#[derive(clap::Args)]
pub struct BackfillArgs {
    /// The sink (one that has a backfill).
    #[arg(value_parser = clap::builder::PossibleValuesParser::new(
        fastack_actors::sinks::with_backfill().into_iter().map(|s| s.0)
    ))]
    sink: String,
    /// Tenant id or name.
    #[arg(long)]
    tenant: String,
    /// Start of the range (RFC 3339, by when events occurred).
    #[arg(long)]
    from: chrono::DateTime<chrono::Utc>,
    /// End of the range, excluded.
    #[arg(long)]
    to: chrono::DateTime<chrono::Utc>,
    /// Replace what the sink holds for the range with what storage holds,
    /// instead of adding what it lacks (the sink's documentation says
    /// what it replaces and when it refuses).
    #[arg(long)]
    rewrite: bool,
}

/// Queues a sink's backfill job and runs it here (with every other queued
/// backfill: a node's job runner takes any this command leaves), then
/// prints its result.
pub async fn backfill(service: &Service, json: bool, args: BackfillArgs) -> anyhow::Result<()> {
    let (sink, work) =
        sinks::backfill_of(service.config(), &args.sink).map_err(anyhow::Error::msg)?;
    let Some(range) = TimeRange::new(args.from, args.to) else {
        anyhow::bail!("--to must be after --from");
    };
    let tenant = service.resolve_tenant(&args.tenant).await?;
    let request = BackfillRequest {
        tenant: tenant.id,
        range,
        rewrite: args.rewrite,
    };
    let queued = sinks::backfill_job(sink, &request, chrono::Utc::now());
    service.queue_job(&queued).await?;
    run_jobs_here(service, json, JobKind::Backfill, work.unit()).await?;
    let job = ended(service, queued.tenant_id, queued.id, "backfill job").await?;
    let document: serde_json::Value = serde_json::from_str(&job.document())?;
    print(json, &document, |d| match d["status"].as_str() {
        Some("completed") => format!("backfill {}: {}", job.id, work.summary(&d["result"])),
        _ => format!(
            "backfill {} failed: {}",
            job.id,
            d["metadata"]["error"]["message"]
                .as_str()
                .unwrap_or_default()
        ),
    })?;
    if job.status != JobStatus::Completed {
        anyhow::bail!("the backfill failed");
    }
    Ok(())
}
