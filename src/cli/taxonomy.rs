//! `fastack admin taxonomy …`: a tenant's tracking plan, installed, shown,
//! listed and removed through the runtime's service (running nodes pick a
//! change up within `FASTACK_PLAN_REFRESH_MS`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use fastack_actors::Service;
use fastack_entities::PlanVersion;

use super::print::{Align, Table, print, time};

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

pub async fn command(service: &Service, json: bool, cmd: TaxonomyCommand) -> anyhow::Result<()> {
    match cmd {
        TaxonomyCommand::Install { tenant, file } => {
            let t = service.resolve_tenant(&tenant).await?;
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let doc: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", file.display()))?;
            let installed = service.install_plan(t.id, &doc).await?;
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
            let t = service.resolve_tenant(&tenant).await?;
            let p = service
                .plan_version(t.id, version)
                .await?
                .filter(|p| p.document.is_some() || version.is_some())
                .ok_or(fastack_core::Error::NotFound {
                    what: "tracking plan",
                })?;
            print(json, &p, |p| {
                format!(
                    "version {} installed {} ({})\n{}",
                    p.version,
                    time(&p.installed_at),
                    summary(p),
                    p.document
                        .as_ref()
                        .map(|d| serde_json::to_string_pretty(d).unwrap_or_default())
                        .unwrap_or_default()
                )
            })
        }
        TaxonomyCommand::History { tenant } => {
            let t = service.resolve_tenant(&tenant).await?;
            let list = service.plan_history(t.id).await?;
            print(json, &list, |list| {
                let mut table = Table::new(&[
                    ("VERSION", 7, Align::Right),
                    ("INSTALLED", 19, Align::Left),
                    ("PLAN", 0, Align::Left),
                ]);
                for p in list {
                    table.row(&[&p.version, &time(&p.installed_at), &summary(p)]);
                }
                table.to_string()
            })
        }
        TaxonomyCommand::Remove { tenant } => {
            let t = service.resolve_tenant(&tenant).await?;
            let removed =
                service
                    .remove_plan(t.id)
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
