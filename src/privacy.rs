//! `fastack admin erasure …` and `fastack admin suppression …`: a tenant's
//! erasure requests (the tenant API's, made by an operator: the same rules
//! and the same job) and its suppressions, against the storage the
//! configuration points at.

use anyhow::Context;
use clap::Subcommand;
use fastack_core::{
    admin,
    erasure::{self, ErasureRequest},
    store::{Person, Store, Subject, SubjectKind, Window},
    validate::parse_timestamp,
};
use fastack_entities::{ContactId, Job, JobId, JobKind};
use serde_json::Value;

use fastack_actors::NodeParts;

use crate::{print, run_jobs_here};

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

/// One line of an erasure's state.
fn line(job: &Job) -> String {
    let doc: Value = serde_json::from_str(&job.document()).unwrap_or_default();
    let what = match job.status {
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
    };
    format!(
        "{:<36}  {:<10}  {:>5}  {}",
        job.id, job.status, job.params["identifiers"], what
    )
}

pub async fn erasure_command(
    node: &NodeParts,
    json: bool,
    cmd: ErasureCommand,
) -> anyhow::Result<()> {
    let store = &node.store;
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
            let t = admin::resolve_tenant(store.as_ref(), &tenant).await?;
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
            let job = erasure::request(
                store.as_ref(),
                t.id,
                &req,
                serde_json::Map::new(),
                chrono::Utc::now(),
            )
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
            run_jobs_here(node, json, JobKind::Erasure, "steps").await?;
            // A node's runner may have taken it first: wait for its end.
            let ended = loop {
                match store.jobs().get(t.id, job.id).await? {
                    Some(j) if j.status.is_terminal() => break j,
                    Some(_) => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
                    None => anyhow::bail!("erasure {} vanished", job.id),
                }
            };
            show(json, &ended)?;
            if ended.status != fastack_entities::JobStatus::Completed {
                anyhow::bail!("the erasure failed (its holds are lifted): request it again");
            }
            Ok(())
        }
        ErasureCommand::List { tenant } => {
            let t = admin::resolve_tenant(store.as_ref(), &tenant).await?;
            let jobs = store
                .erasures()
                .jobs(t.id, JobKind::Erasure, None, 500)
                .await?;
            let docs: Vec<Value> = jobs
                .iter()
                .map(|j| serde_json::from_str(&j.document()).unwrap_or_default())
                .collect();
            print(json, &docs, |_| {
                let mut out = format!(
                    "{:<36}  {:<10}  {:>5}  {}",
                    "JOB", "STATUS", "IDS", "REMOVED"
                );
                for j in &jobs {
                    out.push('\n');
                    out.push_str(&line(j));
                }
                out
            })
        }
        ErasureCommand::Show { tenant, job } => {
            let t = admin::resolve_tenant(store.as_ref(), &tenant).await?;
            let j = store
                .jobs()
                .get(t.id, job)
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
    store: &Store,
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
            let t = admin::resolve_tenant(store.as_ref(), &tenant).await?;
            let only = subject(user_id, anonymous_id);
            let list = store
                .erasures()
                .suppressions(t.id, only.as_ref(), 1000)
                .await?;
            print(json, &list, |l| {
                let mut out = format!(
                    "{:<12}  {:<64}  {:<36}  {}",
                    "KIND", "SHA-256", "ERASURE", "DROPPED"
                );
                for s in l {
                    out.push_str(&format!(
                        "\n{:<12}  {:<64}  {:<36}  {}",
                        s.kind.as_str(),
                        s.sha256,
                        s.request_id,
                        s.dropped
                    ));
                }
                out
            })
        }
        SuppressionCommand::Lift {
            tenant,
            user_id,
            anonymous_id,
        } => {
            let t = admin::resolve_tenant(store.as_ref(), &tenant).await?;
            let s = subject(user_id, anonymous_id).context("give --user-id or --anonymous-id")?;
            if !store.erasures().lift(t.id, &s).await? {
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
