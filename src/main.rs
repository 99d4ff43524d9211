//! `fastack`: the one binary. `serve` runs a node; the other subcommands
//! administer the same storage the configuration points at.

/// `println!` that returns the write's error instead of panicking, so
/// `fastack openapi | head` ends quietly when the reader goes away.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

mod privacy;
mod taxonomy;
mod users;

/// glibc's allocator spent a quarter of the node's CPU under load (many
/// small, short-lived allocations across threads); mimalloc does not.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use fastack_actors::{NodeParts, Opening, RuntimeOptions};
use fastack_core::{Config, admin, store::Storage};
use fastack_entities::{ApiKeyId, DeliveryId, EndpointId, EventId, Plan, TenantId};
use serde::Serialize;

#[derive(Parser)]
#[command(
    name = "fastack",
    version,
    about = "Event pipeline server: fast durable 202s, per-tenant processing, signed events out"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
    Keys(KeysCommand),
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Print an external HMAC key (hex): the tenant's (verifies export
    /// result HMACs) or, without --tenant, the deployment's (verifies AMQP
    /// message signatures).
    ExternalHmac {
        /// Tenant id or name.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Rotate the master key: the store's root key is wrapped again under a
    /// new master key, after which the store opens with the new key only.
    /// Every key derived from it stays the same (external HMAC keys,
    /// webhook secrets, exports). Embedded without FASTACK_ENC_KEY: a new
    /// key replaces the master-key file. Otherwise: --new-key-file, then
    /// start every node with FASTACK_ENC_KEY set to the new key (running
    /// nodes go on).
    Rotate {
        /// A file holding the new master key (base64, at least 32 bytes:
        /// `head -c 32 /dev/urandom | base64`).
        #[arg(long)]
        new_key_file: Option<std::path::PathBuf>,
    },
}

#[derive(Args)]
struct AdminArgs {
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
    Tenant(TenantCommand),
    /// API keys (the secret is shown once, at creation).
    #[command(subcommand)]
    Key(KeyCommand),
    /// Partitions of tracked_events.
    #[command(subcommand)]
    Partitions(PartitionsCommand),
    /// Retention: archive, verify and drop partitions past their retention.
    #[command(subcommand)]
    Retention(RetentionCommand),
    /// Write a tenant's stored events of [from, to) that a sink neither
    /// holds nor owes (events stored before it was switched on), as a
    /// `backfill` job, here, with a progress bar.
    Backfill(BackfillArgs),
    /// Webhook endpoints (only here and on the admin listener, never
    /// through the tenant API).
    #[command(subcommand)]
    Webhook(WebhookCommand),
    /// Accepted events that failed processing repeatedly, set aside so
    /// their tenant's later events go on.
    #[command(subcommand)]
    Quarantine(QuarantineCommand),
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
    Erasure(privacy::ErasureCommand),
    /// Identifiers whose events are dropped (set by an erasure with
    /// --suppress): listed by hash, lifted.
    #[command(subcommand)]
    Suppression(privacy::SuppressionCommand),
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
    Deliveries {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
        /// Only this endpoint's deliveries (its id).
        #[arg(long)]
        endpoint: Option<EndpointId>,
        /// Most deliveries listed, newest first.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
}

#[derive(Subcommand)]
enum WebhookCommand {
    /// Register an endpoint; its signing secret is shown once.
    Add {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
        /// Where deliveries are POSTed: an http(s) URL on a globally
        /// routable address (FASTACK_WEBHOOK_ALLOW_PRIVATE=true allows
        /// private ones).
        #[arg(long)]
        url: String,
        /// Comma-separated: job.completed, job.failed, core.event.tracked,
        /// core.contact.erased, endpoint.disabled, delivery.exhausted
        /// (default: the two job events).
        #[arg(long)]
        events: Option<String>,
    },
    /// List endpoints (all, or one tenant's).
    List {
        /// Tenant id or name (default: every tenant).
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Stop deliveries to an endpoint (its pending deliveries fail).
    Disable {
        /// The endpoint's id.
        #[arg(long)]
        endpoint: EndpointId,
        /// Why, shown in `webhook list`.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resume deliveries to a disabled endpoint (events from now on).
    Enable {
        /// The endpoint's id.
        #[arg(long)]
        endpoint: EndpointId,
    },
    /// A new secret; the old one keeps signing alongside for 24 hours.
    RotateSecret {
        /// The endpoint's id.
        #[arg(long)]
        endpoint: EndpointId,
    },
    /// Send a test message (event type webhook.test) to an enabled
    /// endpoint, whatever it subscribes to; a running server delivers it.
    Test {
        /// The endpoint's id.
        #[arg(long)]
        endpoint: EndpointId,
    },
    /// Deliver again: one delivery (--delivery), or every failed delivery
    /// of an endpoint since a time (--endpoint and --since). Each keeps its
    /// webhook-id; a delivery already pending is left alone.
    #[command(group(clap::ArgGroup::new("what").required(true).args(["delivery", "endpoint"])))]
    Replay {
        /// The delivery's id (`fastack admin deliveries --json` lists them).
        #[arg(long, conflicts_with_all = ["endpoint", "since"])]
        delivery: Option<DeliveryId>,
        /// The endpoint's id.
        #[arg(long, requires = "since")]
        endpoint: Option<EndpointId>,
        /// Failed deliveries created at or after this time: RFC 3339, or
        /// `YYYY-MM-DD HH:MM[:SS]` in UTC.
        #[arg(long)]
        since: Option<String>,
    },
}

#[derive(Subcommand)]
enum QuarantineCommand {
    /// A tenant's quarantined events, oldest first.
    List {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
        /// Most events listed.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// One quarantined event: its payload, error and attempts.
    Show {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
        /// The event id its 202 answered.
        #[arg(long)]
        event: EventId,
    },
    /// Put an event back into processing (same event id; its idempotency
    /// key keeps answering it).
    Retry {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
        /// The event id its 202 answered.
        #[arg(long)]
        event: EventId,
    },
    /// Discard an event for good (its idempotency key stays taken).
    Drop {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
        /// The event id its 202 answered.
        #[arg(long)]
        event: EventId,
    },
}

#[derive(Subcommand)]
enum PartitionsCommand {
    /// Name, range, rows and retention class of every partition.
    List,
}

#[derive(Subcommand)]
enum RetentionCommand {
    /// Archive and drop every partition past its retention now.
    Run {
        /// Only say what would be archived and dropped.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(clap::Args)]
struct BackfillArgs {
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

#[derive(Subcommand)]
enum TenantCommand {
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
enum PlanArg {
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
enum KeyCommand {
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

fn init_logging(filter: &str) {
    use std::io::IsTerminal;
    fastack_core::logging::init(filter, std::io::stderr().is_terminal());
}

fn print<T: Serialize>(
    json: bool,
    value: &T,
    human: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    if json {
        out!("{}", serde_json::to_string_pretty(value)?)?;
    } else {
        out!("{}", human(value))?;
    }
    Ok(())
}

async fn admin_command(config: &Config, args: AdminArgs) -> anyhow::Result<()> {
    // A backup reads the files of a serving node (no migration, no pool);
    // a restore writes where no database is yet.
    match &args.command {
        AdminCommand::Backup { to } => {
            let started = std::time::Instant::now();
            let m = fastack_core::backup::backup(config, to).await?;
            return print(args.json, &m, |m| {
                let mut out = format!(
                    "backed up to {to}: {} files, {} bytes, in {:.1} s",
                    m.files.len(),
                    m.total_bytes(),
                    started.elapsed().as_secs_f64()
                );
                if m.master_key == "FASTACK_ENC_KEY" {
                    out.push_str("\nthe master key is FASTACK_ENC_KEY, not in the backup: keep it with the backup");
                }
                if let Some(elsewhere) = &m.objects_elsewhere {
                    out.push_str(&format!(
                        "\nobject storage at {elsewhere} is not in the backup: back it up by its own means"
                    ));
                }
                out
            });
        }
        AdminCommand::Restore { from } => {
            let m = fastack_core::backup::restore(config, from).await?;
            return print(args.json, &m, |m| {
                format!(
                    "restored the backup of {} ({} files, {} bytes) into {}; start the node with `fastack serve`",
                    m.created_at.to_rfc3339(),
                    m.files.len(),
                    m.total_bytes(),
                    config.data_dir.display()
                )
            });
        }
        _ => {}
    }
    let node = NodeParts::open(config, Opening::Tool, &RuntimeOptions::default()).await?;
    let store = node.store.as_ref();
    let json = args.json;
    match args.command {
        AdminCommand::Tenant(TenantCommand::Create {
            name,
            plan,
            retention_months,
        }) => {
            let t = admin::create_tenant(store, &name, plan.into(), retention_months).await?;
            print(json, &t, |t| {
                format!("created tenant {} ({}, plan {})", t.name, t.id, t.plan)
            })
        }
        AdminCommand::Tenant(TenantCommand::List) => {
            let tenants = store.tenants().list().await?;
            print(json, &tenants, |ts| {
                let mut out = format!(
                    "{:<36}  {:<20}  {:<10}  {}",
                    "ID", "NAME", "PLAN", "RETENTION"
                );
                for t in ts {
                    out.push_str(&format!(
                        "\n{:<36}  {:<20}  {:<10}  {} months",
                        t.id,
                        t.name,
                        t.plan,
                        config.plans.retention_for(t)
                    ));
                }
                out
            })
        }
        AdminCommand::Tenant(TenantCommand::SetPlan {
            tenant,
            plan,
            retention_months,
        }) => {
            let t = admin::resolve_tenant(store, &tenant).await?;
            store
                .tenants()
                .update_plan(t.id, plan.into(), retention_months)
                .await?;
            let t = admin::resolve_tenant(store, &t.id.to_string()).await?;
            print(json, &t, |t| {
                format!("tenant {} is now on plan {}", t.name, t.plan)
            })
        }
        AdminCommand::Key(KeyCommand::Create { tenant, rate_limit }) => {
            let t = admin::resolve_tenant(store, &tenant).await?;
            let key = admin::create_key(store, t.id, rate_limit).await?;
            print(json, &key, |k| {
                format!(
                    "created key {} for tenant {}\n\n    {}\n\nThis secret is shown once: store it now.",
                    k.key.id, t.name, k.secret
                )
            })
        }
        AdminCommand::Key(KeyCommand::List { tenant }) => {
            let t = admin::resolve_tenant(store, &tenant).await?;
            let keys = store.keys().list(t.id).await?;
            print(json, &keys, |ks| {
                let mut out = format!(
                    "{:<36}  {:<12}  {:<10}  {}",
                    "ID", "PREFIX", "RATE", "STATUS"
                );
                for k in ks {
                    out.push_str(&format!(
                        "\n{:<36}  {:<12}  {:<10}  {}",
                        k.id,
                        k.prefix,
                        k.rate_limit_rps
                            .map_or("plan".to_owned(), |r| format!("{r}/s")),
                        if k.revoked_at.is_some() {
                            "revoked"
                        } else {
                            "active"
                        }
                    ));
                }
                out
            })
        }
        AdminCommand::Partitions(PartitionsCommand::List) => {
            let parts = store.partitions().list(true).await?;
            let now = chrono::Utc::now();
            print(json, &parts, |ps| {
                let mut out = format!(
                    "{:<32}  {:<10}  {:<10}  {:>6}  {:>12}  {}",
                    "NAME", "FROM", "TO", "CLASS", "ROWS", "RETENTION"
                );
                for p in ps {
                    out.push_str(&format!(
                        "\n{:<32}  {:<10}  {:<10}  {:>6}  {:>12}  {}",
                        p.table,
                        p.from.format("%Y-%m-%d"),
                        p.to.format("%Y-%m-%d"),
                        format!("{}m", p.retention_class),
                        p.rows,
                        if fastack_core::retention::is_due(&p.key, now) {
                            "due"
                        } else {
                            "kept"
                        }
                    ));
                }
                out
            })
        }
        AdminCommand::Webhook(cmd) => webhook_command(&node, json, cmd).await,
        AdminCommand::Quarantine(cmd) => quarantine_command(store, json, cmd).await,
        AdminCommand::Taxonomy(cmd) => taxonomy::command(store, json, cmd).await,
        AdminCommand::User(cmd) => users::command(config, store, json, cmd).await,
        AdminCommand::Erasure(cmd) => privacy::erasure_command(&node, json, cmd).await,
        AdminCommand::Suppression(cmd) => {
            privacy::suppression_command(&node.store, json, cmd).await
        }
        // Answered before storage is opened.
        AdminCommand::Backup { .. } | AdminCommand::Restore { .. } => Ok(()),
        AdminCommand::Deliveries {
            tenant,
            endpoint,
            limit,
        } => {
            let t = admin::resolve_tenant(store, &tenant).await?;
            let list = store.deliveries().list(t.id, endpoint, None, limit).await?;
            print(json, &list, |ds| {
                let mut out = format!(
                    "{:<38}  {:<20}  {:<10}  {}",
                    "WEBHOOK-ID", "EVENT", "STATUS", "ATTEMPTS (status/error, latency)"
                );
                for d in ds {
                    let attempts: Vec<String> = d
                        .attempts
                        .iter()
                        .map(|a| {
                            format!(
                                "#{} {} {}ms",
                                a.attempt,
                                a.status_code.map_or_else(
                                    || a.error_kind.clone().unwrap_or_default(),
                                    |c| c.to_string()
                                ),
                                a.latency_ms
                            )
                        })
                        .collect();
                    out.push_str(&format!(
                        "\n{:<38}  {:<20}  {:<10}  {}",
                        d.webhook_id,
                        d.event_type,
                        d.status,
                        attempts.join(", ")
                    ));
                }
                out
            })
        }
        AdminCommand::Retention(RetentionCommand::Run { dry_run }) => {
            retention_run(&node, json, dry_run).await
        }
        AdminCommand::Backfill(args) => backfill(&node, json, args).await,
        AdminCommand::Key(KeyCommand::Revoke { key }) => {
            let key = key_to_revoke(store, &key).await?;
            admin::revoke_key(store, key).await?;
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

/// A key named on the command line by its id or by its display prefix.
async fn key_to_revoke(
    store: &fastack_core::store::Storage,
    given: &str,
) -> anyhow::Result<ApiKeyId> {
    use fastack_core::auth::{DISPLAY_CHARS, KEY_PREFIX};
    if let Ok(id) = given.parse::<ApiKeyId>() {
        return Ok(id);
    }
    let prefix_len = KEY_PREFIX.len() + DISPLAY_CHARS;
    if !given.starts_with(KEY_PREFIX) {
        anyhow::bail!(
            "`{given}` is neither a key id (a UUID, the ID column of `fastack admin key list`) \
             nor a key prefix (`{KEY_PREFIX}` and {DISPLAY_CHARS} characters, its PREFIX column)"
        );
    }
    if given.len() > prefix_len {
        // Never echo what may be a whole secret.
        anyhow::bail!(
            "that is longer than a key prefix (it may be the secret itself): pass the key's id \
             or its prefix, as `fastack admin key list` prints them"
        );
    }
    let keys = admin::keys_with_prefix(store, given).await?;
    match keys.as_slice() {
        [key] => Ok(key.id),
        [] => anyhow::bail!(
            "no key has the prefix {given} (`fastack admin key list --tenant …` lists them)"
        ),
        _ => anyhow::bail!(
            "{} keys have the prefix {given}; pass the key's id (the ID column of `key list`)",
            keys.len()
        ),
    }
}

async fn quarantine_command(
    store: &fastack_core::store::Storage,
    json: bool,
    cmd: QuarantineCommand,
) -> anyhow::Result<()> {
    #[derive(Serialize)]
    struct Done {
        event_id: EventId,
        #[serde(skip_serializing_if = "Option::is_none")]
        retried: Option<bool>,
        #[serde(skip_serializing_if = "Option::is_none")]
        dropped: Option<bool>,
    }
    match cmd {
        QuarantineCommand::List { tenant, limit } => {
            let t = admin::resolve_tenant(store, &tenant).await?;
            let list = store.quarantine().list(t.id, limit).await?;
            print(json, &list, |qs| {
                let mut out = format!(
                    "{:<36}  {:<20}  {:>8}  {}",
                    "EVENT", "QUARANTINED", "ATTEMPTS", "ERROR"
                );
                for q in qs {
                    out.push_str(&format!(
                        "\n{:<36}  {:<20}  {:>8}  {}",
                        q.event_id,
                        q.quarantined_at.format("%Y-%m-%d %H:%M:%S"),
                        q.attempts,
                        q.error
                    ));
                }
                out
            })
        }
        QuarantineCommand::Show { tenant, event } => {
            let t = admin::resolve_tenant(store, &tenant).await?;
            let q = store.quarantine().get(t.id, event).await?.ok_or(
                fastack_core::Error::NotFound {
                    what: "quarantined event",
                },
            )?;
            print(json, &q, |q| {
                format!(
                    "event {}\nreceived {}\nquarantined {} after {} attempts\nerror: {}\npayload: {}",
                    q.event_id, q.received_at, q.quarantined_at, q.attempts, q.error, q.payload
                )
            })
        }
        QuarantineCommand::Retry { tenant, event } => {
            let t = admin::resolve_tenant(store, &tenant).await?;
            admin::retry_quarantined(store, t.id, event).await?;
            let done = Done {
                event_id: event,
                retried: Some(true),
                dropped: None,
            };
            print(json, &done, |d| {
                format!("event {} is back in processing", d.event_id)
            })
        }
        QuarantineCommand::Drop { tenant, event } => {
            let t = admin::resolve_tenant(store, &tenant).await?;
            admin::drop_quarantined(store, t.id, event).await?;
            let done = Done {
                event_id: event,
                retried: None,
                dropped: Some(true),
            };
            print(json, &done, |d| format!("event {} dropped", d.event_id))
        }
    }
}

async fn webhook_command(node: &NodeParts, json: bool, cmd: WebhookCommand) -> anyhow::Result<()> {
    let (config, store, keys) = (&node.config, node.store.as_ref(), &node.keys);
    let show_secret = |e: &admin::CreatedEndpoint| {
        format!(
            "endpoint {} ({}) for {}\n\n    {}\n\nThis signing secret is shown once: store it now.{}",
            e.endpoint.id,
            e.endpoint.url,
            e.endpoint.events.join(","),
            e.secret,
            e.warning
                .as_ref()
                .map_or(String::new(), |w| format!("\nNote: {w}."))
        )
    };
    match cmd {
        WebhookCommand::Add {
            tenant,
            url,
            events,
        } => {
            let t = admin::resolve_tenant(store, &tenant).await?;
            let created = admin::add_webhook(
                store,
                keys,
                t.id,
                &url,
                events.as_deref(),
                config.webhook_allow_private,
            )
            .await?;
            print(json, &created, show_secret)
        }
        WebhookCommand::List { tenant } => {
            let t = match tenant {
                Some(t) => Some(admin::resolve_tenant(store, &t).await?.id),
                None => None,
            };
            let list = store.endpoints().list(t).await?;
            print(json, &list, |es| {
                let mut out = format!("{:<36}  {:<9}  {:<40}  {}", "ID", "STATE", "URL", "EVENTS");
                for e in es {
                    out.push_str(&format!(
                        "\n{:<36}  {:<9}  {:<40}  {}{}",
                        e.id,
                        if e.enabled { "enabled" } else { "disabled" },
                        e.url,
                        e.events.join(","),
                        e.disabled_reason
                            .as_ref()
                            .map_or(String::new(), |r| format!("  ({r})"))
                    ));
                }
                out
            })
        }
        WebhookCommand::Disable { endpoint, reason } => {
            let e = admin::set_webhook_enabled(store, endpoint, false, reason.as_deref()).await?;
            print(json, &e, |e| format!("endpoint {} disabled", e.id))
        }
        WebhookCommand::Enable { endpoint } => {
            let e = admin::set_webhook_enabled(store, endpoint, true, None).await?;
            print(json, &e, |e| format!("endpoint {} enabled", e.id))
        }
        WebhookCommand::RotateSecret { endpoint } => {
            let created = admin::rotate_webhook_secret(store, keys, endpoint).await?;
            print(json, &created, show_secret)
        }
        WebhookCommand::Test { endpoint } => {
            let tenant = endpoint_tenant(store, endpoint).await?;
            let d = store
                .deliveries()
                .send_test(tenant, endpoint, chrono::Utc::now())
                .await?;
            #[derive(Serialize)]
            struct Sent {
                delivery_id: DeliveryId,
                webhook_id: String,
            }
            let sent = Sent {
                webhook_id: d.id.webhook_id(),
                delivery_id: d.id,
            };
            print(json, &sent, |s| {
                format!(
                    "test message queued to endpoint {endpoint}: delivery {} (webhook-id {})",
                    s.delivery_id, s.webhook_id
                )
            })
        }
        WebhookCommand::Replay {
            delivery,
            endpoint,
            since,
        } => {
            let now = chrono::Utc::now();
            #[derive(Serialize)]
            struct Replayed {
                replayed: u64,
            }
            let replayed = match (delivery, endpoint, since) {
                (Some(id), _, _) => {
                    let tenant = store.deliveries().tenant_of(id).await?;
                    let (done, _) = store.deliveries().replay(tenant, id, now).await?;
                    u64::from(done == fastack_core::domain::Replayed::Queued)
                }
                (None, Some(endpoint), Some(since)) => {
                    let since = admin::parse_time(&since)?;
                    let tenant = endpoint_tenant(store, endpoint).await?;
                    store
                        .deliveries()
                        .replay_failed_since(tenant, endpoint, since, now)
                        .await?
                }
                _ => anyhow::bail!("name a --delivery, or an --endpoint and --since"),
            };
            print(json, &Replayed { replayed }, |r| {
                match (delivery, r.replayed) {
                    (Some(id), 0) => format!("delivery {id} is already pending; left as it is"),
                    (Some(id), _) => format!("delivery {id} queued again (same webhook-id)"),
                    (None, n) => format!("{n} failed deliveries queued again"),
                }
            })
        }
    }
}

/// The tenant of an endpoint an operator names by id.
async fn endpoint_tenant(store: &Storage, id: EndpointId) -> anyhow::Result<TenantId> {
    Ok(store
        .endpoints()
        .get(id)
        .await?
        .ok_or(fastack_core::Error::NotFound { what: "endpoint" })?
        .tenant_id)
}

/// `admin retention run`: schedules retention jobs for due partitions and
/// runs them here, with a progress bar on a terminal and plain lines
/// otherwise.
async fn retention_run(node: &NodeParts, json: bool, dry_run: bool) -> anyhow::Result<()> {
    let (config, store) = (&node.config, &node.store);
    use fastack_core::retention;
    use fastack_entities::{JobKind, JobStatus};

    let now = chrono::Utc::now();
    if dry_run {
        let due: Vec<_> = store
            .partitions()
            .list(true)
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
    let maintenance = retention::maintain(store.as_ref(), config, now).await?;
    let mut reports = Vec::new();
    let mut failures = 0;
    for job in run_jobs_here(node, json, JobKind::Retention, "rows").await? {
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

/// Claims the jobs of `kind` and runs them here, one after the other, the
/// way a node's job runner does (claim renewed, attempts counted, the end
/// recorded with its event), with a progress bar on a terminal (`unit`:
/// what it counts). Returns the jobs as they ended.
pub(crate) async fn run_jobs_here(
    node: &NodeParts,
    json: bool,
    kind: fastack_entities::JobKind,
    unit: &str,
) -> anyhow::Result<Vec<fastack_entities::Job>> {
    use std::io::IsTerminal;

    use fastack_actors::job_runner::run_claimed;

    let env = node.job_env(fastack_entities::NodeId::new());
    let (store, clock) = (&node.store, &node.clock);
    let terminal = std::io::stderr().is_terminal() && !json;
    let mut ended = Vec::new();
    while let Some(job) = store
        .jobs()
        .claim(
            env.node,
            clock.now(),
            chrono::Duration::seconds(30),
            Some(kind),
        )
        .await?
    {
        let what = match kind {
            fastack_entities::JobKind::Retention => job.params["partition"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            _ => format!("{kind} {}", job.id),
        };
        if !terminal && !json {
            out!("running {what}")?;
        }
        let bar = terminal.then(|| {
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template(&format!(
                    "{{msg:32}} [{{bar:40}}] {{pos}}/{{len}} {unit} ({{eta}})"
                ))
                .expect("a valid template")
                .progress_chars("=> "),
            );
            bar.set_message(what);
            bar
        });
        let (job, _) = run_claimed(&env, job, &|done, total| {
            if let Some(bar) = &bar {
                bar.set_length(total);
                bar.set_position(done);
            }
        })
        .await;
        if let Some(bar) = &bar {
            bar.finish_and_clear();
        }
        ended.push(job);
    }
    Ok(ended)
}

/// Queues a sink's backfill job and runs it here (with every other queued
/// backfill: a node's job runner takes any this command leaves), then
/// prints its result.
async fn backfill(node: &NodeParts, json: bool, args: BackfillArgs) -> anyhow::Result<()> {
    use fastack_actors::sinks::{self, BackfillRequest};
    use fastack_core::store::TimeRange;
    use fastack_entities::JobKind;

    let (config, store) = (&node.config, &node.store);
    let (sink, work) = sinks::backfill_of(config, &args.sink).map_err(anyhow::Error::msg)?;
    let Some(range) = TimeRange::new(args.from, args.to) else {
        anyhow::bail!("--to must be after --from");
    };
    let tenant = admin::resolve_tenant(store.as_ref(), &args.tenant).await?;
    let request = BackfillRequest {
        tenant: tenant.id,
        range,
        rewrite: args.rewrite,
    };
    let queued = sinks::backfill_job(sink, &request, chrono::Utc::now());
    store.jobs().insert(&queued).await?;
    run_jobs_here(node, json, JobKind::Backfill, work.unit()).await?;
    // A node's runner may have taken it first: wait for its end.
    let job = loop {
        match store.jobs().get(queued.tenant_id, queued.id).await? {
            Some(job) if job.status.is_terminal() => break job,
            Some(_) => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
            None => anyhow::bail!("backfill job {} vanished", queued.id),
        }
    };
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
    if job.status != fastack_entities::JobStatus::Completed {
        anyhow::bail!("the backfill failed");
    }
    Ok(())
}

/// The configuration of this process: the product's settings and every
/// sink's, from the environment (and the file `FASTACK_CONFIG` names).
fn config() -> anyhow::Result<Config> {
    Config::load(std::env::vars(), &fastack_actors::sinks::settings())
        .context("reading configuration")
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Openapi { admin: false } => {
            out!("{}", fastack_api::openapi_json())?;
            Ok(())
        }
        Command::Openapi { admin: true } => {
            out!("{}", fastack_api::admin::admin_openapi_json())?;
            Ok(())
        }
        Command::Config { defaults: true } => {
            out!("| variable | default | meaning |\n|---|---|---|")?;
            for doc in Config::docs(&fastack_actors::sinks::settings()) {
                out!("| `{}` | {} | {} |", doc.name, doc.default, doc.meaning)?;
            }
            Ok(())
        }
        Command::Config { defaults: false } => {
            let rows = Config::in_force(std::env::vars(), &fastack_actors::sinks::settings())
                .context("reading configuration")?;
            out!("| variable | in force | default | meaning |\n|---|---|---|---|")?;
            for row in rows {
                let in_force = if row.set.is_empty() {
                    "default".to_owned()
                } else {
                    row.set
                        .iter()
                        .map(|v| format!("`{}={}` ({})", v.name, v.shown, v.source))
                        .collect::<Vec<_>>()
                        .join("<br>")
                };
                out!(
                    "| `{}` | {in_force} | {} | {} |",
                    row.doc.name,
                    row.doc.default,
                    row.doc.meaning
                )?;
            }
            Ok(())
        }
        Command::Serve => {
            let config = config()?;
            init_logging(&config.log);
            let server = fastack_api::start(config, fastack_api::StartOptions::default())
                .await
                .context("starting the server")?;
            server.wait_for_stop_signal().await;
            Ok(())
        }
        Command::Migrate => {
            let config = config()?;
            init_logging(&config.log);
            NodeParts::open(&config, Opening::Migrate, &RuntimeOptions::default())
                .await
                .context("migrating")?;
            out!("migrations applied")?;
            Ok(())
        }
        Command::Keys(KeysCommand::ExternalHmac { tenant }) => {
            let config = config()?;
            init_logging(&format!("warn,{}", config.log.replace("info", "warn")));
            // The keys of an existing node only: never a new master key.
            let node = NodeParts::open(&config, Opening::Tool, &RuntimeOptions::default()).await?;
            let key = match tenant {
                None => node.keys.deployment_hmac(),
                Some(t) => {
                    let tenant = admin::resolve_tenant(node.store.as_ref(), &t).await?;
                    node.keys.tenant_hmac(tenant.id)
                }
            };
            out!("{}", hex_encode(&key))?;
            Ok(())
        }
        Command::Keys(KeysCommand::Rotate { new_key_file }) => {
            use fastack_core::{
                crypto::{KeySource, MasterKey},
                keyring,
            };
            let config = config()?;
            init_logging(&format!("warn,{}", config.log.replace("info", "warn")));
            // Checks the current key against the store first.
            let node = NodeParts::open(&config, Opening::Tool, &RuntimeOptions::default()).await?;
            let current = MasterKey::load(&config)?;
            let now = chrono::Utc::now();
            match new_key_file {
                Some(file) => {
                    let text = std::fs::read_to_string(&file)
                        .with_context(|| format!("reading {}", file.display()))?;
                    let new = MasterKey::from_base64(&text, KeySource::File(file.clone()))?;
                    keyring::rotate(node.store.as_ref(), &current, &new, now).await?;
                    out!(
                        "master key rotated: the store opens with the key in {} only; start every \
                         node with FASTACK_ENC_KEY set to it (nodes running now go on)",
                        file.display()
                    )?;
                }
                None => {
                    let new = keyring::rotate_key_file(node.store.as_ref(), &current, now).await?;
                    out!(
                        "master key rotated: {} holds the new key (back it up; the old one no \
                         longer opens this store)",
                        new.names()
                    )?;
                }
            }
            Ok(())
        }
        Command::Admin(args) => {
            let config = config()?;
            init_logging(&format!("warn,{}", config.log.replace("info", "warn")));
            admin_command(&config, args).await
        }
    }
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // SAFETY: first thing, on the only thread: no SQLite connection exists.
    #[allow(unsafe_code)]
    let _ = unsafe { fastack_core::store::sqlite::alloc::install() };
    // SAFETY: as above; still before any SQLite connection.
    #[allow(unsafe_code)]
    let _ = unsafe { fastack_core::store::sqlite::pcache::install() };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The reader of our standard output went away (`| head`): not an error.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    /// The commands get a node's parts from `NodeParts::open`
    /// (`actors/src/node.rs`), the code that builds a serving node: no file
    /// of the CLI opens storage, loads keys, makes object storage or routes
    /// sinks by itself. (The needles are split so this file does not match
    /// itself.)
    #[test]
    fn commands_get_a_nodes_parts_from_the_composition_root() {
        let files = [
            ("main.rs", include_str!("main.rs")),
            ("privacy.rs", include_str!("privacy.rs")),
            ("taxonomy.rs", include_str!("taxonomy.rs")),
            ("users.rs", include_str!("users.rs")),
        ];
        let wiring = [
            concat!("store::", "open("),
            concat!("Keys::", "load("),
            concat!("Objects::", "from_config("),
            concat!("Routing::", "for_config("),
            concat!("JobEnv", " {"),
        ];
        for (file, text) in files {
            for w in wiring {
                assert!(
                    !text.contains(w),
                    "src/{file} builds a node's part itself ({w}): take it from NodeParts::open"
                );
            }
        }
    }
}
