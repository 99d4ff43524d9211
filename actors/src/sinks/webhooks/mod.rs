//! The webhook sink (fan-out): each event becomes one delivery per enabled
//! endpoint of its tenant subscribed to its type. The transaction that
//! writes an event does the fan-out itself ([`FAN_OUT`]); this relay only
//! drains outbox rows an earlier release left owed to it. Deliveries are
//! unique per endpoint and event (`ce-id`), so a fan-out repeated after a
//! crash creates nothing twice. The dispatcher is signalled at once.
//!
//! Delivery is here too: the dispatcher ([`dispatcher`]) claims due
//! deliveries and hands each to its endpoint's worker ([`endpoint_worker`]),
//! which signs, sends, and records the attempt. Everything about webhooks
//! in a node is declared in this folder: its settings ([`WebhookSettings`])
//! and the actors it runs. The wire format (signatures, retry schedule) is
//! `fastack_core::webhooks`; the endpoints and deliveries tables are the
//! store's `endpoints` and `deliveries` handles.

pub mod dispatcher;
pub mod endpoint_worker;

use std::{sync::LazyLock, time::Duration};

use async_trait::async_trait;
use fastack_core::{
    Config,
    settings::{Extension, parse},
    store::{FAN_OUT, OutboxRow, SinkName},
};
use tracing::warn;

use super::{Sent, Sink, Tracked};
use crate::{child::ChildSpec, context::Ctx};
use dispatcher::{WebhookDispatcherActor, WebhookDispatcherArgs};

fastack_core::settings! {
    /// Webhook delivery's settings.
    pub struct WebhookSettings {
        /// how long a node holds a webhook delivery it is attempting (a node that dies releases it after this)
        pub claim: Duration = "FASTACK_WEBHOOK_CLAIM_MS" {
            default: "60000",
            parse: parse::millis,
        },
        /// most requests in flight to one webhook endpoint (the limit adapts below it)
        pub max_concurrency: usize = "FASTACK_WEBHOOK_MAX_CONCURRENCY" {
            default: "64",
            parse: parse::from_str,
        },
        /// allow webhook endpoints on private/loopback addresses
        pub allow_private: bool = "FASTACK_WEBHOOK_ALLOW_PRIVATE" {
            default: "false",
            parse: parse::boolean,
        },
        /// egress proxy for webhook deliveries; the proxy then enforces which addresses are reachable (environment proxies are ignored)
        pub proxy: Option<String> = "FASTACK_WEBHOOK_PROXY" {
            default: "",
            shown: "(none: direct)",
            parse: parse::optional_text,
            show: url,
        },
    }
}

impl WebhookSettings {
    /// The settings in force (the declared defaults for a configuration
    /// loaded without the sinks' sections).
    pub fn of(config: &Config) -> &WebhookSettings {
        static DEFAULT: LazyLock<WebhookSettings> = LazyLock::new(WebhookSettings::default);
        config.sections.get::<WebhookSettings>().unwrap_or(&DEFAULT)
    }
}

pub struct WebhookSink;

#[async_trait]
impl Sink for WebhookSink {
    const NAME: SinkName = FAN_OUT;
    const JOBS: bool = true;
    const TRACKED: Tracked = Tracked::WhenSubscribed;
    const SETTINGS: Option<Extension> = Some(Extension::of::<WebhookSettings>());

    /// Every node: endpoints are the tenants'.
    fn on(_config: &Config) -> bool {
        true
    }

    fn open(_ctx: &Ctx) -> Option<Self> {
        Some(WebhookSink)
    }

    /// The dispatcher, which delivers what the fan-out created.
    fn workers() -> Vec<ChildSpec> {
        vec![ChildSpec::new("webhook_dispatcher", |ctx| {
            Some((WebhookDispatcherActor, WebhookDispatcherArgs { ctx }))
        })]
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
