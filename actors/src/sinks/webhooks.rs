//! The webhook sink (fan-out): each outbox row becomes one delivery per
//! enabled endpoint of its tenant subscribed to its type. Deliveries are
//! unique per endpoint and event (`ce-id`), so a fan-out repeated after a
//! crash creates nothing twice. The dispatcher is signalled at once: a new
//! delivery's first attempt does not wait for a tick.

use std::{collections::HashMap, time::Duration};

use async_trait::async_trait;
use fastack_core::store::{NewDelivery, OutboxRow, SinkName};
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
            for ep in &endpoints[&row.tenant_id] {
                if ep.wants(&row.routing_key) {
                    deliveries.push(NewDelivery::new(
                        ep.id,
                        row.tenant_id,
                        &row.routing_key,
                        &row.ce_id,
                        row.body.clone(),
                        row.created_at,
                    ));
                }
            }
        }
        Ok(deliveries)
    }
}

#[async_trait]
impl Sink for WebhookSink {
    const NAME: SinkName = SinkName("webhooks");

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
