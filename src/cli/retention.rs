//! `fastack admin partitions list` and `fastack admin retention run`: the
//! partitions of tracked_events, and the archive-verify-drop of those past
//! their retention, run here as retention jobs.

use clap::Subcommand;
use fastack_actors::Service;
use fastack_core::retention;
use fastack_entities::{JobKind, JobStatus};

use super::{
    jobs::run_jobs_here,
    print::{Align, Table, out, print},
};

#[derive(Subcommand)]
pub enum PartitionsCommand {
    /// Name, range, rows and retention class of every partition.
    List,
}

#[derive(Subcommand)]
pub enum RetentionCommand {
    /// Archive and drop every partition past its retention now.
    Run {
        /// Only say what would be archived and dropped.
        #[arg(long)]
        dry_run: bool,
    },
}

pub async fn partitions_command(
    service: &Service,
    json: bool,
    cmd: PartitionsCommand,
) -> anyhow::Result<()> {
    let PartitionsCommand::List = cmd;
    let parts = service.partitions().await?;
    let now = chrono::Utc::now();
    print(json, &parts, |ps| {
        let mut table = Table::new(&[
            ("NAME", 32, Align::Left),
            ("FROM", 10, Align::Left),
            ("TO", 10, Align::Left),
            ("CLASS", 6, Align::Right),
            ("ROWS", 12, Align::Right),
            ("RETENTION", 0, Align::Left),
        ]);
        for p in ps {
            let class = format!("{}m", p.retention_class);
            let state = if retention::is_due(&p.key, now) {
                "due"
            } else {
                "kept"
            };
            table.row(&[
                &p.table,
                &p.from.format("%Y-%m-%d"),
                &p.to.format("%Y-%m-%d"),
                &class,
                &p.rows,
                &state,
            ]);
        }
        table.to_string()
    })
}

pub async fn retention_command(
    service: &Service,
    json: bool,
    cmd: RetentionCommand,
) -> anyhow::Result<()> {
    let RetentionCommand::Run { dry_run } = cmd;
    run(service, json, dry_run).await
}

/// `admin retention run`: schedules retention jobs for due partitions and
/// runs them here, with a progress bar on a terminal and plain lines
/// otherwise.
async fn run(service: &Service, json: bool, dry_run: bool) -> anyhow::Result<()> {
    let now = chrono::Utc::now();
    if dry_run {
        let due: Vec<_> = service
            .partitions()
            .await?
            .into_iter()
            .filter(|p| retention::is_due(&p.key, now))
            .collect();
        return print(json, &due, |ds| {
            if ds.is_empty() {
                return "nothing is past its retention".to_owned();
            }
            ds.iter()
                .map(|p| {
                    format!(
                        "would archive and drop {} ({} rows, {} months)",
                        p.table, p.rows, p.retention_class
                    )
                })
                .collect::<Vec<_>>()
                .join("\n")
        });
    }
    let maintenance = service.maintain_retention().await?;
    let mut reports = Vec::new();
    let mut failures = 0;
    for job in run_jobs_here(service, json, JobKind::Retention, "rows").await? {
        let table = job.params["partition"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match &job.result {
            Some(report) if job.status == JobStatus::Completed => {
                if !json {
                    out!(
                        "{}: {} rows archived to {} ({} -> {} bytes), verified, dropped",
                        report["partition"].as_str().unwrap_or_default(),
                        report["row_count"],
                        report["path"].as_str().unwrap_or_default(),
                        report["size_bytes"],
                        report["compressed_bytes"]
                    )?;
                }
                reports.push(report.clone());
            }
            _ => {
                failures += 1;
                eprintln!(
                    "{table}: kept, retention failed: {}",
                    job.metadata["error"]["message"]
                        .as_str()
                        .unwrap_or_default()
                );
            }
        }
    }
    if json {
        out!("{}", serde_json::to_string_pretty(&reports)?)?;
    } else if reports.is_empty() && failures == 0 {
        out!(
            "nothing to do ({} partitions due, {} idempotency keys pruned)",
            maintenance.due.len(),
            maintenance.pruned_keys
        )?;
    }
    if failures > 0 {
        anyhow::bail!("{failures} partition(s) could not be archived; they were kept");
    }
    Ok(())
}
