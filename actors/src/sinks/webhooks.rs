//! The webhook sink (fan-out): each event becomes one delivery per enabled
//! endpoint of its tenant subscribed to its type. The transaction that
//! writes an event does the fan-out itself ([`FAN_OUT`]); this relay only
//! drains outbox rows an earlier release left owed to it. Deliveries are
//! unique per endpoint and event (`ce-id`), so a fan-out repeated after a
//! crash creates nothing twice. The dispatcher is signalled at once.

use std::time::Duration;

use async_trait::async_trait;
use fastack_core::{
    Config,
    store::{FAN_OUT, OutboxRow, SinkName},
};
use tracing::warn;

use super::{Sent, Sink, Tracked};
use crate::context::Ctx;

pub struct WebhookSink;

#[async_trait]
impl Sink for WebhookSink {
    const NAME: SinkName = FAN_OUT;
    const JOBS: bool = true;
    const TRACKED: Tracked = Tracked::WhenSubscribed;

    /// Every node: endpoints are the tenants'.
    fn on(_config: &Config) -> bool {
        true
    }

    fn open(_ctx: &Ctx) -> Option<Self> {
        Some(WebhookSink)
    }

    fn interval(&self) -> Duration {
        Duration::from_millis(100)
    }

    async fn send(&mut self, ctx: &Ctx, rows: &[OutboxRow]) -> Sent {
        let ids = rows.iter().map(|r| r.id).collect();
        match ctx.store.deliveries().fan_out_rows(rows, ctx.now()).await {
            Ok(_) => {
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
