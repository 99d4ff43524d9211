//! `fastack admin quarantine …`: accepted events that failed processing
//! repeatedly, listed, shown, put back into processing or dropped.

use clap::Subcommand;
use fastack_actors::Service;
use fastack_entities::EventId;
use serde::Serialize;

use super::print::{Align, Table, print, time};

#[derive(Subcommand)]
pub enum QuarantineCommand {
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

pub async fn command(service: &Service, json: bool, cmd: QuarantineCommand) -> anyhow::Result<()> {
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
            let t = service.resolve_tenant(&tenant).await?;
            let list = service.list_quarantine(t.id, limit).await?;
            print(json, &list, |qs| {
                let mut table = Table::new(&[
                    ("EVENT", 36, Align::Left),
                    ("QUARANTINED", 20, Align::Left),
                    ("ATTEMPTS", 8, Align::Right),
                    ("ERROR", 0, Align::Left),
                ]);
                for q in qs {
                    table.row(&[&q.event_id, &time(&q.quarantined_at), &q.attempts, &q.error]);
                }
                table.to_string()
            })
        }
        QuarantineCommand::Show { tenant, event } => {
            let t = service.resolve_tenant(&tenant).await?;
            let q =
                service
                    .quarantined(t.id, event)
                    .await?
                    .ok_or(fastack_core::Error::NotFound {
                        what: "quarantined event",
                    })?;
            print(json, &q, |q| {
                format!(
                    "event {}\nreceived {}\nquarantined {} after {} attempts\nerror: {}\npayload: {}",
                    q.event_id, q.received_at, q.quarantined_at, q.attempts, q.error, q.payload
                )
            })
        }
        QuarantineCommand::Retry { tenant, event } => {
            let t = service.resolve_tenant(&tenant).await?;
            service.retry_quarantined(t.id, event).await?;
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
            let t = service.resolve_tenant(&tenant).await?;
            service.drop_quarantined(t.id, event).await?;
            let done = Done {
                event_id: event,
                retried: None,
                dropped: Some(true),
            };
            print(json, &done, |d| format!("event {} dropped", d.event_id))
        }
    }
}
