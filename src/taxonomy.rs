//! `fastack admin taxonomy …`: a tenant's tracking plan, installed, shown,
//! listed and removed against the storage the configuration points at
//! (running nodes pick a change up within `FASTACK_PLAN_REFRESH_MS`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use fastack_core::{admin, store::Storage, taxonomy};
use fastack_entities::PlanVersion;

use crate::print;

#[derive(Subcommand)]
pub enum TaxonomyCommand {
    /// Install a plan document as the tenant's next version, after checking
    /// it whole (a broken schema is refused, naming its event).
    Install {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
        /// The plan: `{"events": {name: schema}, "identify": schema,
        /// "unplanned": "allow"|"reject", "mode": "enforce"|"flag"}`.
        #[arg(long)]
        file: PathBuf,
    },
    /// The plan in force, or one version of it.
    Show {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
        /// A version from `history` (default: the latest).
        #[arg(long)]
        version: Option<u32>,
    },
    /// Every version of the tenant's plan, oldest first.
    History {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
    },
    /// Stop enforcing a plan (recorded as a version without a document).
    Remove {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
    },
}

fn summary(p: &PlanVersion) -> String {
    match &p.document {
        Some(doc) => format!(
            "{} event(s), mode {}, unplanned {}",
            doc.get("events")
                .and_then(|e| e.as_object())
                .map_or(0, |e| e.len()),
            doc.get("mode")
                .and_then(|m| m.as_str())
                .unwrap_or("enforce"),
            doc.get("unplanned")
                .and_then(|m| m.as_str())
                .unwrap_or("allow"),
        ),
        None => "removed".to_owned(),
    }
}

pub async fn command(store: &Storage, json: bool, cmd: TaxonomyCommand) -> anyhow::Result<()> {
    let now = chrono::Utc::now();
    match cmd {
        TaxonomyCommand::Install { tenant, file } => {
            let t = admin::resolve_tenant(store, &tenant).await?;
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let doc: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", file.display()))?;
            let installed = taxonomy::install(store, t.id, &doc, now).await?;
            print(json, &installed, |p| {
                format!(
                    "tracking plan version {} installed for {} ({})",
                    p.version,
                    t.name,
                    summary(p)
                )
            })
        }
        TaxonomyCommand::Show { tenant, version } => {
            let t = admin::resolve_tenant(store, &tenant).await?;
            let p = store
                .plans()
                .version(t.id, version)
                .await?
                .filter(|p| p.document.is_some() || version.is_some())
                .ok_or(fastack_core::Error::NotFound {
                    what: "tracking plan",
                })?;
            print(json, &p, |p| {
                format!(
                    "version {} installed {} ({})\n{}",
                    p.version,
                    p.installed_at.format("%Y-%m-%d %H:%M:%S"),
                    summary(p),
                    p.document
                        .as_ref()
                        .map(|d| serde_json::to_string_pretty(d).unwrap_or_default())
                        .unwrap_or_default()
                )
            })
        }
        TaxonomyCommand::History { tenant } => {
            let t = admin::resolve_tenant(store, &tenant).await?;
            let list = store.plans().history(t.id).await?;
            print(json, &list, |list| {
                let mut out = format!("{:>7}  {:<19}  {}", "VERSION", "INSTALLED", "PLAN");
                for p in list {
                    out.push_str(&format!(
                        "\n{:>7}  {:<19}  {}",
                        p.version,
                        p.installed_at.format("%Y-%m-%d %H:%M:%S"),
                        summary(p)
                    ));
                }
                out
            })
        }
        TaxonomyCommand::Remove { tenant } => {
            let t = admin::resolve_tenant(store, &tenant).await?;
            let removed =
                taxonomy::remove(store, t.id, now)
                    .await?
                    .ok_or(fastack_core::Error::NotFound {
                        what: "tracking plan",
                    })?;
            print(json, &removed, |p| {
                format!(
                    "tracking plan of {} removed (version {})",
                    t.name, p.version
                )
            })
        }
    }
}
