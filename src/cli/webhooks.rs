//! `fastack admin webhook …` and `fastack admin deliveries`: webhook
//! endpoints (created and changed only here and on the admin listener) and
//! their deliveries.

use clap::Subcommand;
use fastack_actors::Service;
use fastack_core::{admin, domain::Replayed};
use fastack_entities::{DeliveryId, EndpointId};
use serde::Serialize;

use super::print::{Align, Table, print};

#[derive(Subcommand)]
pub enum WebhookCommand {
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

#[derive(clap::Args)]
pub struct DeliveriesArgs {
    /// Tenant id or name.
    #[arg(long)]
    tenant: String,
    /// Only this endpoint's deliveries (its id).
    #[arg(long)]
    endpoint: Option<EndpointId>,
    /// Most deliveries listed, newest first.
    #[arg(long, default_value_t = 50)]
    limit: u32,
}

/// An endpoint with its secret, as shown once.
fn show_secret(e: &admin::CreatedEndpoint) -> String {
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
}

pub async fn webhook_command(
    service: &Service,
    json: bool,
    cmd: WebhookCommand,
) -> anyhow::Result<()> {
    match cmd {
        WebhookCommand::Add {
            tenant,
            url,
            events,
        } => {
            let t = service.resolve_tenant(&tenant).await?;
            let created = service.add_webhook(t.id, &url, events.as_deref()).await?;
            print(json, &created, show_secret)
        }
        WebhookCommand::List { tenant } => {
            let t = match tenant {
                Some(t) => Some(service.resolve_tenant(&t).await?.id),
                None => None,
            };
            let list = service.webhooks(t).await?;
            print(json, &list, |es| {
                let mut table = Table::new(&[
                    ("ID", 36, Align::Left),
                    ("STATE", 9, Align::Left),
                    ("URL", 40, Align::Left),
                    ("EVENTS", 0, Align::Left),
                ]);
                for e in es {
                    let state = if e.enabled { "enabled" } else { "disabled" };
                    let events = format!(
                        "{}{}",
                        e.events.join(","),
                        e.disabled_reason
                            .as_ref()
                            .map_or(String::new(), |r| format!("  ({r})"))
                    );
                    table.row(&[&e.id, &state, &e.url, &events]);
                }
                table.to_string()
            })
        }
        WebhookCommand::Disable { endpoint, reason } => {
            let e = service
                .set_webhook_enabled(endpoint, false, reason.as_deref())
                .await?;
            print(json, &e, |e| format!("endpoint {} disabled", e.id))
        }
        WebhookCommand::Enable { endpoint } => {
            let e = service.set_webhook_enabled(endpoint, true, None).await?;
            print(json, &e, |e| format!("endpoint {} enabled", e.id))
        }
        WebhookCommand::RotateSecret { endpoint } => {
            let created = service.rotate_webhook_secret(endpoint).await?;
            print(json, &created, show_secret)
        }
        WebhookCommand::Test { endpoint } => {
            let tenant = service.endpoint(endpoint).await?.tenant_id;
            let delivery_id = service.send_test_webhook(tenant, endpoint).await?;
            #[derive(Serialize)]
            struct Sent {
                delivery_id: DeliveryId,
                webhook_id: String,
            }
            let sent = Sent {
                webhook_id: delivery_id.webhook_id(),
                delivery_id,
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
            #[derive(Serialize)]
            struct Count {
                replayed: u64,
            }
            let replayed = match (delivery, endpoint, since) {
                (Some(id), _, _) => {
                    let tenant = service.delivery_tenant(id).await?;
                    let (done, _) = service.replay_delivery(tenant, id).await?;
                    u64::from(done == Replayed::Queued)
                }
                (None, Some(endpoint), Some(since)) => {
                    let since = admin::parse_time(&since)?;
                    let tenant = service.endpoint(endpoint).await?.tenant_id;
                    service.replay_failed_since(tenant, endpoint, since).await?
                }
                _ => anyhow::bail!("name a --delivery, or an --endpoint and --since"),
            };
            print(json, &Count { replayed }, |r| {
                match (delivery, r.replayed) {
                    (Some(id), 0) => format!("delivery {id} is already pending; left as it is"),
                    (Some(id), _) => format!("delivery {id} queued again (same webhook-id)"),
                    (None, n) => format!("{n} failed deliveries queued again"),
                }
            })
        }
    }
}

/// A tenant's deliveries, newest first, each with its attempts.
pub async fn deliveries(service: &Service, json: bool, args: DeliveriesArgs) -> anyhow::Result<()> {
    let t = service.resolve_tenant(&args.tenant).await?;
    let list = service
        .list_deliveries(t.id, args.endpoint, None, args.limit)
        .await?;
    print(json, &list, |ds| {
        let mut table = Table::new(&[
            ("WEBHOOK-ID", 38, Align::Left),
            ("EVENT", 20, Align::Left),
            ("STATUS", 10, Align::Left),
            ("ATTEMPTS (status/error, latency)", 0, Align::Left),
        ]);
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
            table.row(&[
                &d.webhook_id,
                &d.event_type,
                &d.status,
                &attempts.join(", "),
            ]);
        }
        table.to_string()
    })
}
