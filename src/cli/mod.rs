//! The command line: the clap tree of every subcommand and its dispatch.
//! Each command group is a file of this directory; every one reaches
//! storage through the runtime's service (`actors/src/service.rs`), the
//! application layer the admin listener uses too, and prints through
//! [`print`].

mod backfill;
mod backup;
mod erasures;
mod jobs;
mod keys;
mod print;
mod quarantine;
mod reference;
mod retention;
mod taxonomy;
mod tenants;
mod users;
mod webhooks;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use fastack_actors::{NodeParts, Opening, RuntimeOptions, Service};
use fastack_core::Config;

use print::out;

#[derive(Parser)]
#[command(
    name = "fastack",
    version,
    about = "Event pipeline server: fast durable 202s, per-tenant processing, signed events out"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run a node (embedded SQLite by default; FASTACK_DATABASE_URL for PostgreSQL).
    ///
    /// Every setting is a FASTACK_* environment variable (or a line of the
    /// TOML file FASTACK_CONFIG names); `fastack config` lists them all with
    /// their defaults.
    Serve,
    /// Apply database migrations and create the current partition window.
    Migrate,
    /// Print the OpenAPI spec (what `openapi/openapi.json` must equal).
    Openapi {
        /// The admin listener's (what `openapi/admin.json` must equal).
        #[arg(long)]
        admin: bool,
    },
    /// Print every setting as a Markdown table: the value in force and
    /// where it came from (default, environment, or the file FASTACK_CONFIG
    /// names; secrets shown as set), its default and meaning.
    Config {
        /// Only the defaults and meanings (the table in the README).
        #[arg(long)]
        defaults: bool,
    },
    /// Operate a deployment: tenants, API keys, webhooks, deliveries,
    /// quarantine, partitions and retention (on the storage the FASTACK_*
    /// settings name).
    Admin(AdminArgs),
    /// Derived keys consumers need to verify what fastack sends.
    #[command(subcommand)]
    Keys(keys::KeysCommand),
}

#[derive(Args)]
pub struct AdminArgs {
    /// Print JSON on stdout.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Tenants.
    #[command(subcommand)]
    Tenant(tenants::TenantCommand),
    /// API keys (the secret is shown once, at creation).
    #[command(subcommand)]
    Key(tenants::KeyCommand),
    /// Partitions of tracked_events.
    #[command(subcommand)]
    Partitions(retention::PartitionsCommand),
    /// Retention: archive, verify and drop partitions past their retention.
    #[command(subcommand)]
    Retention(retention::RetentionCommand),
    /// Write a tenant's stored events of [from, to) that a sink neither
    /// holds nor owes (events stored before it was switched on), as a
    /// `backfill` job, here, with a progress bar.
    Backfill(backfill::BackfillArgs),
    /// Webhook endpoints (only here and on the admin listener, never
    /// through the tenant API).
    #[command(subcommand)]
    Webhook(webhooks::WebhookCommand),
    /// Accepted events that failed processing repeatedly, set aside so
    /// their tenant's later events go on.
    #[command(subcommand)]
    Quarantine(quarantine::QuarantineCommand),
    /// Tracking plans: one JSON Schema per event, enforced at the front
    /// door (only here and on the admin listener, never with an API key).
    #[command(subcommand)]
    Taxonomy(taxonomy::TaxonomyCommand),
    /// People who sign in to a tenant's account console (a one-time link
    /// sets their password).
    #[command(subcommand)]
    User(users::UserCommand),
    /// Forget people: erase them from every store, with a certificate.
    #[command(subcommand)]
    Erasure(erasures::ErasureCommand),
    /// Identifiers whose events are dropped (set by an erasure with
    /// --suppress): listed by hash, lifted.
    #[command(subcommand)]
    Suppression(erasures::SuppressionCommand),
    /// A consistent copy of this embedded node while it serves: both
    /// database files, the keys and local object storage, with a manifest
    /// of checksums (PostgreSQL: see docs/operations.md).
    Backup {
        /// A new directory, or object storage (`s3://bucket/prefix`, with
        /// the FASTACK_S3_* settings; `file:///dir`).
        #[arg(long)]
        to: String,
    },
    /// Brings a backup back as the node of FASTACK_DATA_DIR, which must
    /// hold no database; every file is checked before any is put in place.
    Restore {
        /// Where `backup --to` wrote it.
        #[arg(long)]
        from: String,
    },
    /// Webhook deliveries and their attempts.
    Deliveries(webhooks::DeliveriesArgs),
}

/// Runs a command.
pub async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve => crate::serve().await,
        Command::Openapi { admin } => reference::openapi(admin),
        Command::Config { defaults } => reference::config(defaults),
        Command::Migrate => {
            let config = crate::config()?;
            crate::init_logging(&config.log);
            NodeParts::open(&config, Opening::Migrate, &RuntimeOptions::default())
                .await
                .context("migrating")?;
            out!("migrations applied")?;
            Ok(())
        }
        Command::Keys(cmd) => {
            let config = crate::config()?;
            tool_logging(&config);
            keys::command(&config, cmd).await
        }
        Command::Admin(args) => {
            let config = crate::config()?;
            tool_logging(&config);
            admin(&config, args).await
        }
    }
}

/// A tool logs warnings only, whatever `FASTACK_LOG` says of info.
fn tool_logging(config: &Config) {
    crate::init_logging(&format!("warn,{}", config.log.replace("info", "warn")));
}

/// The application layer over an existing node's parts (never a new
/// database, never a new master key), with no tree to nudge.
async fn open(config: &Config) -> anyhow::Result<Service> {
    let parts = NodeParts::open(config, Opening::Tool, &RuntimeOptions::default()).await?;
    Ok(Service::for_tool(parts))
}

async fn admin(config: &Config, args: AdminArgs) -> anyhow::Result<()> {
    let json = args.json;
    // A backup reads the files of a serving node (no migration, no pool);
    // a restore writes where no database is yet.
    match args.command {
        AdminCommand::Backup { to } => return backup::backup(config, json, &to).await,
        AdminCommand::Restore { from } => return backup::restore(config, json, &from).await,
        _ => {}
    }
    let service = open(config).await?;
    let service = &service;
    match args.command {
        AdminCommand::Tenant(cmd) => tenants::tenant_command(service, json, cmd).await,
        AdminCommand::Key(cmd) => tenants::key_command(service, json, cmd).await,
        AdminCommand::Partitions(cmd) => retention::partitions_command(service, json, cmd).await,
        AdminCommand::Retention(cmd) => retention::retention_command(service, json, cmd).await,
        AdminCommand::Backfill(args) => backfill::backfill(service, json, args).await,
        AdminCommand::Webhook(cmd) => webhooks::webhook_command(service, json, cmd).await,
        AdminCommand::Deliveries(args) => webhooks::deliveries(service, json, args).await,
        AdminCommand::Quarantine(cmd) => quarantine::command(service, json, cmd).await,
        AdminCommand::Taxonomy(cmd) => taxonomy::command(service, json, cmd).await,
        AdminCommand::User(cmd) => users::command(service, json, cmd).await,
        AdminCommand::Erasure(cmd) => erasures::erasure_command(service, json, cmd).await,
        AdminCommand::Suppression(cmd) => erasures::suppression_command(service, json, cmd).await,
        // Answered before storage is opened.
        AdminCommand::Backup { .. } | AdminCommand::Restore { .. } => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    /// Every file of the command line, and `main.rs`.
    const FILES: [(&str, &str); 15] = [
        ("main.rs", include_str!("../main.rs")),
        ("cli/mod.rs", include_str!("mod.rs")),
        ("cli/backfill.rs", include_str!("backfill.rs")),
        ("cli/backup.rs", include_str!("backup.rs")),
        ("cli/jobs.rs", include_str!("jobs.rs")),
        ("cli/keys.rs", include_str!("keys.rs")),
        ("cli/print.rs", include_str!("print.rs")),
        ("cli/erasures.rs", include_str!("erasures.rs")),
        ("cli/quarantine.rs", include_str!("quarantine.rs")),
        ("cli/reference.rs", include_str!("reference.rs")),
        ("cli/retention.rs", include_str!("retention.rs")),
        ("cli/taxonomy.rs", include_str!("taxonomy.rs")),
        ("cli/tenants.rs", include_str!("tenants.rs")),
        ("cli/users.rs", include_str!("users.rs")),
        ("cli/webhooks.rs", include_str!("webhooks.rs")),
    ];

    /// The commands get a node's parts from `NodeParts::open`
    /// (`actors/src/node.rs`), the code that builds a serving node: no file
    /// of the CLI opens storage, loads keys, makes object storage or routes
    /// sinks by itself. (The needles are split so this file does not match
    /// itself.)
    #[test]
    fn commands_get_a_nodes_parts_from_the_composition_root() {
        let wiring = [
            concat!("store::", "open("),
            concat!("Keys::", "load("),
            concat!("Objects::", "from_config("),
            concat!("Routing::", "for_config("),
            concat!("JobEnv", " {"),
        ];
        for (file, text) in FILES {
            for w in wiring {
                assert!(
                    !text.contains(w),
                    "src/{file} builds a node's part itself ({w}): take it from NodeParts::open"
                );
            }
        }
    }

    /// The commands reach storage only through the runtime's service, as
    /// the admin listener does: no file of the CLI holds a store or calls
    /// one of its handles.
    #[test]
    fn commands_reach_storage_through_the_service() {
        let handles = [
            concat!(".sto", "re"),
            concat!("Stor", "age"),
            concat!("store::", "Store"),
            concat!("Store", ","),
            concat!("Store", "}"),
            concat!("fn ", "run_claimed"),
            concat!(".jobs()", ".claim("),
        ];
        for (file, text) in FILES {
            for h in handles {
                assert!(
                    !text.contains(h),
                    "src/{file} reaches storage itself ({h}): call the service \
                     (actors/src/service.rs) or the job runner's run_here"
                );
            }
        }
    }
}
