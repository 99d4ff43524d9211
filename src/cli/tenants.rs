//! `fastack admin tenant …` and `fastack admin key …`: tenants, their plans
//! and their API keys (a key's secret is shown once, at creation).

use clap::Subcommand;
use fastack_actors::Service;
use fastack_entities::{ApiKeyId, Plan};
use serde::Serialize;

use super::print::{Align, Table, print};

#[derive(Subcommand)]
pub enum TenantCommand {
    /// Create a tenant.
    Create {
        /// A unique name (1 to 100 characters); commands take it or the id.
        #[arg(long)]
        name: String,
        /// Rate limit and retention (README "Plans").
        #[arg(long, value_enum, default_value = "free")]
        plan: PlanArg,
        /// Keep events longer than the plan's default (enterprise).
        #[arg(long)]
        retention_months: Option<u32>,
    },
    /// List tenants.
    List,
    /// Change a tenant's plan.
    SetPlan {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
        /// The new plan (its rate limit applies at once).
        #[arg(long, value_enum)]
        plan: PlanArg,
        /// Keep events longer than the plan's default (enterprise).
        #[arg(long)]
        retention_months: Option<u32>,
    },
}

/// A plan on the command line (clap lists the values in `--help`).
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum PlanArg {
    Free,
    Pro,
    Enterprise,
}

impl From<PlanArg> for Plan {
    fn from(p: PlanArg) -> Plan {
        match p {
            PlanArg::Free => Plan::Free,
            PlanArg::Pro => Plan::Pro,
            PlanArg::Enterprise => Plan::Enterprise,
        }
    }
}

#[derive(Subcommand)]
pub enum KeyCommand {
    /// Create an API key for a tenant.
    Create {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
        /// Requests per second for this key (besides the tenant's plan).
        #[arg(long)]
        rate_limit: Option<u32>,
    },
    /// List a tenant's keys (never the secrets).
    List {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
    },
    /// Revoke a key: it stops working within a few seconds.
    Revoke {
        /// The key's id or its prefix (`fsk_…`), as `key list` prints them;
        /// never its secret.
        #[arg(long)]
        key: String,
    },
}

pub async fn tenant_command(
    service: &Service,
    json: bool,
    cmd: TenantCommand,
) -> anyhow::Result<()> {
    match cmd {
        TenantCommand::Create {
            name,
            plan,
            retention_months,
        } => {
            let t = service
                .create_tenant(&name, plan.into(), retention_months)
                .await?;
            print(json, &t, |t| {
                format!("created tenant {} ({}, plan {})", t.name, t.id, t.plan)
            })
        }
        TenantCommand::List => {
            let tenants = service.list_tenants().await?;
            let plans = &service.config().plans;
            print(json, &tenants, |ts| {
                let mut table = Table::new(&[
                    ("ID", 36, Align::Left),
                    ("NAME", 20, Align::Left),
                    ("PLAN", 10, Align::Left),
                    ("RETENTION", 0, Align::Left),
                ]);
                for t in ts {
                    let retention = format!("{} months", plans.retention_for(t));
                    table.row(&[&t.id, &t.name, &t.plan, &retention]);
                }
                table.to_string()
            })
        }
        TenantCommand::SetPlan {
            tenant,
            plan,
            retention_months,
        } => {
            let t = service.resolve_tenant(&tenant).await?;
            let t = service
                .set_plan(t.id, plan.into(), retention_months)
                .await?;
            print(json, &t, |t| {
                format!("tenant {} is now on plan {}", t.name, t.plan)
            })
        }
    }
}

pub async fn key_command(service: &Service, json: bool, cmd: KeyCommand) -> anyhow::Result<()> {
    match cmd {
        KeyCommand::Create { tenant, rate_limit } => {
            let t = service.resolve_tenant(&tenant).await?;
            let key = service.create_key(t.id, rate_limit).await?;
            print(json, &key, |k| {
                format!(
                    "created key {} for tenant {}\n\n    {}\n\nThis secret is shown once: store it now.",
                    k.key.id, t.name, k.secret
                )
            })
        }
        KeyCommand::List { tenant } => {
            let t = service.resolve_tenant(&tenant).await?;
            let keys = service.list_keys(t.id).await?;
            print(json, &keys, |ks| {
                let mut table = Table::new(&[
                    ("ID", 36, Align::Left),
                    ("PREFIX", 12, Align::Left),
                    ("RATE", 10, Align::Left),
                    ("STATUS", 0, Align::Left),
                ]);
                for k in ks {
                    let rate = k
                        .rate_limit_rps
                        .map_or("plan".to_owned(), |r| format!("{r}/s"));
                    let status = if k.revoked_at.is_some() {
                        "revoked"
                    } else {
                        "active"
                    };
                    table.row(&[&k.id, &k.prefix, &rate, &status]);
                }
                table.to_string()
            })
        }
        KeyCommand::Revoke { key } => {
            // The admin listener's rule too: the key's id or its prefix.
            let key = service.key_named(&key).await?;
            service.revoke_key(key).await?;
            #[derive(Serialize)]
            struct Revoked {
                id: ApiKeyId,
                revoked: bool,
            }
            print(
                json,
                &Revoked {
                    id: key,
                    revoked: true,
                },
                |r| format!("revoked key {}", r.id),
            )
        }
    }
}
