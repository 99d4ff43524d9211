//! `fastack admin erasure …` and `fastack admin suppression …`: a tenant's
//! erasure requests (the tenant API's, made by an operator: the same rules
//! and the same job) and its suppressions, through the runtime's service.

use anyhow::Context;
use clap::Subcommand;
use fastack_actors::Service;
use fastack_core::{
    erasure::ErasureRequest,
    store::{Person, Subject, SubjectKind, Window},
    validate::parse_timestamp,
};
use fastack_entities::{ContactId, Job, JobId, JobKind};
use serde_json::Value;

use super::{
    jobs::{ended, run_jobs_here},
    print::{Align, Table, print},
};

#[derive(Subcommand)]
pub enum ErasureCommand {
    /// Erase people from every store (a job of kind `erasure`; a running
    /// node takes it, or `--here` runs it in this process). Name them by
    /// any identifier, repeating the flags: 1 to 5,000 in all.
    Request {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
        /// A user id (repeatable).
        #[arg(long = "user-id")]
        user_ids: Vec<String>,
        /// An anonymous id (repeatable).
        #[arg(long = "anonymous-id")]
        anonymous_ids: Vec<String>,
        /// A contact id (repeatable).
        #[arg(long = "contact-id")]
        contact_ids: Vec<ContactId>,
        /// Also drop their future events until the suppression is lifted.
        #[arg(long)]
        suppress: bool,
        /// Erase only events that occurred at or after this instant (RFC
        /// 3339); with a window the contact stays.
        #[arg(long)]
        from: Option<String>,
        /// Erase only events that occurred before this instant.
        #[arg(long)]
        to: Option<String>,
        /// Run the erasure here and print its certificate, rather than
        /// leaving it to a node's job runner.
        #[arg(long)]
        here: bool,
    },
    /// A tenant's erasure requests, newest first.
    List {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
    },
    /// One erasure: its state and, once completed, its certificate.
    Show {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
        /// The erasure's job id.
        #[arg(long)]
        job: JobId,
    },
}

#[derive(Subcommand)]
pub enum SuppressionCommand {
    /// A tenant's suppressed identifiers (hashed), newest first; with an
    /// identifier, whether it is suppressed.
    List {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
        #[arg(long, conflicts_with = "anonymous_id")]
        user_id: Option<String>,
        #[arg(long)]
        anonymous_id: Option<String>,
    },
    /// Lift a suppression: the identifier's events are processed again
    /// from now on.
    Lift {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
        #[arg(
            long,
            conflicts_with = "anonymous_id",
            required_unless_present = "anonymous_id"
        )]
        user_id: Option<String>,
        #[arg(long)]
        anonymous_id: Option<String>,
    },
}

fn instant(
    flag: &str,
    value: Option<String>,
) -> anyhow::Result<Option<chrono::DateTime<chrono::Utc>>> {
    value
        .map(|v| {
            parse_timestamp(&v)
                .map(|t| t.with_timezone(&chrono::Utc))
                .with_context(|| format!("--{flag} must be RFC 3339 with an offset, not {v:?}"))
        })
        .transpose()
}

/// What a completed erasure removed, or why it failed.
fn removed(job: &Job) -> String {
    let doc: Value = serde_json::from_str(&job.document()).unwrap_or_default();
    match job.status {
        fastack_entities::JobStatus::Completed => {
            let s = &doc["result"]["stores"];
            format!(
                "{} events, {} archives, {} lake files",
                s["tracked_events"]["events_removed"],
                s["archives"]["objects_rewritten"],
                s["lake"]["files_rewritten"].as_u64().unwrap_or(0)
            )
        }
        fastack_entities::JobStatus::Failed => doc["metadata"]["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        _ => String::new(),
    }
}

pub async fn erasure_command(
    service: &Service,
    json: bool,
    cmd: ErasureCommand,
) -> anyhow::Result<()> {
    match cmd {
        ErasureCommand::Request {
            tenant,
            user_ids,
            anonymous_ids,
            contact_ids,
            suppress,
            from,
            to,
            here,
        } => {
            let t = service.resolve_tenant(&tenant).await?;
            let req = ErasureRequest {
                people: Person {
                    user_ids,
                    anonymous_ids,
                    contact_ids,
                },
                window: Window {
                    from: instant("from", from)?,
                    to: instant("to", to)?,
                },
                suppress,
            };
            let problems = req.check();
            if !problems.is_empty() {
                let all: Vec<String> = problems.iter().map(|p| p.message.clone()).collect();
                anyhow::bail!("{}", all.join("; "));
            }
            let job = service
                .request_erasure(t.id, &req, serde_json::Map::new())
                .await?;
            if !here {
                return print(json, &serde_json::json!({"job_id": job.id}), |_| {
                    format!(
                        "erasure {} queued for tenant {}: a running node's job runner takes it \
                         (or run this with --here)\n`fastack admin erasure show --tenant {} --job {}` \
                         shows its certificate once it completes",
                        job.id, t.name, t.name, job.id
                    )
                });
            }
            run_jobs_here(service, json, JobKind::Erasure, "steps").await?;
            let ended = ended(service, t.id, job.id, "erasure").await?;
            show(json, &ended)?;
            if ended.status != fastack_entities::JobStatus::Completed {
                anyhow::bail!("the erasure failed (its holds are lifted): request it again");
            }
            Ok(())
        }
        ErasureCommand::List { tenant } => {
            let t = service.resolve_tenant(&tenant).await?;
            let jobs = service.erasure_requests(t.id, 500).await?;
            let docs: Vec<Value> = jobs
                .iter()
                .map(|j| serde_json::from_str(&j.document()).unwrap_or_default())
                .collect();
            print(json, &docs, |_| {
                let mut table = Table::new(&[
                    ("JOB", 36, Align::Left),
                    ("STATUS", 10, Align::Left),
                    ("IDS", 5, Align::Right),
                    ("REMOVED", 0, Align::Left),
                ]);
                for j in &jobs {
                    table.row(&[&j.id, &j.status, &j.params["identifiers"], &removed(j)]);
                }
                table.to_string()
            })
        }
        ErasureCommand::Show { tenant, job } => {
            let t = service.resolve_tenant(&tenant).await?;
            let j = service
                .job(t.id, job)
                .await?
                .filter(|j| j.kind == JobKind::Erasure)
                .ok_or(fastack_core::Error::NotFound { what: "erasure" })?;
            show(json, &j)
        }
    }
}

/// An erasure's job document (its certificate once completed).
fn show(json: bool, job: &Job) -> anyhow::Result<()> {
    let doc: Value = serde_json::from_str(&job.document())?;
    print(json, &doc, |d| {
        serde_json::to_string_pretty(d).unwrap_or_default()
    })
}

pub async fn suppression_command(
    service: &Service,
    json: bool,
    cmd: SuppressionCommand,
) -> anyhow::Result<()> {
    let subject = |u: Option<String>, a: Option<String>| match (u, a) {
        (Some(u), _) => Some(Subject::of(SubjectKind::UserId, &u)),
        (None, Some(a)) => Some(Subject::of(SubjectKind::AnonymousId, &a)),
        (None, None) => None,
    };
    match cmd {
        SuppressionCommand::List {
            tenant,
            user_id,
            anonymous_id,
        } => {
            let t = service.resolve_tenant(&tenant).await?;
            let only = subject(user_id, anonymous_id);
            let list = service.suppressions(t.id, only.as_ref(), 1000).await?;
            print(json, &list, |l| {
                let mut table = Table::new(&[
                    ("KIND", 12, Align::Left),
                    ("SHA-256", 64, Align::Left),
                    ("ERASURE", 36, Align::Left),
                    ("DROPPED", 0, Align::Left),
                ]);
                for s in l {
                    table.row(&[&s.kind.as_str(), &s.sha256, &s.request_id, &s.dropped]);
                }
                table.to_string()
            })
        }
        SuppressionCommand::Lift {
            tenant,
            user_id,
            anonymous_id,
        } => {
            let t = service.resolve_tenant(&tenant).await?;
            let s = subject(user_id, anonymous_id).context("give --user-id or --anonymous-id")?;
            if !service.lift_suppression(t.id, &s).await? {
                return Err(fastack_core::Error::NotFound {
                    what: "suppression",
                }
                .into());
            }
            print(json, &serde_json::json!({"lifted": s}), |_| {
                format!("suppression of {} {} lifted", s.kind.as_str(), s.sha256)
            })
        }
    }
}
