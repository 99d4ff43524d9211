//! The webhook sink (fan-out): each event becomes one delivery per enabled
//! endpoint of its tenant subscribed to its type. The transaction that
//! writes an event does the fan-out itself ([`FAN_OUT`]); this relay only
//! drains outbox rows an earlier release left owed to it. Deliveries are
//! unique per endpoint and event (`ce-id`), so a fan-out repeated after a
//! crash creates nothing twice. The dispatcher is signalled at once.

use std::{collections::HashMap, time::Duration};

use async_trait::async_trait;
use fastack_core::{
    deliveries::{Outgoing, deliveries_of},
    store::{FAN_OUT, NewDelivery, OutboxRow, SinkName},
};
use fastack_entities::{Endpoint, TenantId};
use tracing::warn;

use super::{Sent, Sink};
use crate::context::Ctx;

pub struct WebhookSink;

impl WebhookSink {
    pub fn new(_ctx: &Ctx) -> Option<Self> {
        Some(WebhookSink)
    }

    async fn deliveries(ctx: &Ctx, rows: &[OutboxRow]) -> fastack_core::Result<Vec<NewDelivery>> {
        let mut endpoints: HashMap<TenantId, Vec<Endpoint>> = HashMap::new();
        let mut deliveries = Vec::new();
        for row in rows {
            if let std::collections::hash_map::Entry::Vacant(slot) = endpoints.entry(row.tenant_id)
            {
                slot.insert(ctx.store.list_endpoints(Some(row.tenant_id)).await?);
            }
            let event = Outgoing {
                tenant: row.tenant_id,
                event_type: &row.routing_key,
                ce_id: &row.ce_id,
                body: &row.body,
                emitted_at: row.created_at,
            };
            deliveries.extend(deliveries_of(&endpoints[&row.tenant_id], event));
        }
        Ok(deliveries)
    }
}

#[async_trait]
impl Sink for WebhookSink {
    const NAME: SinkName = FAN_OUT;

    fn interval(&self) -> Duration {
        Duration::from_millis(100)
    }

    async fn send(&mut self, ctx: &Ctx, rows: &[OutboxRow]) -> Sent {
        let ids = rows.iter().map(|r| r.id).collect();
        let written = match Self::deliveries(ctx, rows).await {
            Ok(deliveries) => ctx.store.insert_deliveries(&deliveries).await,
            Err(e) => Err(e),
        };
        match written {
            Ok(()) => {
                ctx.signals.deliveries.raise();
                Sent {
                    done: ids,
                    ..Sent::default()
                }
            }
            Err(error) => {
                warn!(%error, rows = rows.len(), "webhook fan-out failed; rows offered again");
                Sent {
                    retry: ids,
                    ..Sent::default()
                }
            }
        }
    }
}
