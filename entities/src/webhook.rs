//! Webhook endpoints, deliveries and attempts.

use std::{fmt, str::FromStr};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{DeliveryId, EndpointId, TenantId};

/// The event types an endpoint can subscribe to.
pub const EVENT_TYPES: [&str; 6] = [
    "job.completed",
    "job.failed",
    "core.event.tracked",
    CONTACT_ERASED,
    ENDPOINT_DISABLED,
    DELIVERY_EXHAUSTED,
];
/// A person was erased (`POST /v1/core/erasures`): the request and the
/// SHA-256 of the identifiers erased, so the tenant's own systems can
/// mirror the deletion.
pub const CONTACT_ERASED: &str = "core.contact.erased";
/// Operational: an endpoint of the tenant was disabled (it answered 404 or
/// 410, or an operator disabled it).
pub const ENDPOINT_DISABLED: &str = "endpoint.disabled";
/// Operational: a delivery failed after its last attempt. Never sent about
/// an operational delivery itself (no loops).
pub const DELIVERY_EXHAUSTED: &str = "delivery.exhausted";

/// A test message an operator or a tenant's owner sent to one endpoint
/// (admin listener, `fastack admin webhook test`, the console): delivered,
/// signed and retried like any event, whatever the endpoint subscribes to;
/// not an event type to subscribe to.
pub const TEST_MESSAGE: &str = "webhook.test";

/// Whether an event type is one of the operational notifications (or a
/// test message): a failed one never announces itself.
pub fn is_operational(event_type: &str) -> bool {
    event_type == ENDPOINT_DISABLED
        || event_type == DELIVERY_EXHAUSTED
        || event_type == TEST_MESSAGE
}
/// Subscribed when `--events` is not given.
pub const DEFAULT_EVENTS: [&str; 2] = ["job.completed", "job.failed"];

/// A registered endpoint (never its secret).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub id: EndpointId,
    pub tenant_id: TenantId,
    pub url: String,
    pub events: Vec<String>,
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    /// While set, deliveries are signed with the previous secret too.
    pub previous_secret_until: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Endpoint {
    pub fn wants(&self, event_type: &str) -> bool {
        self.enabled && self.events.iter().any(|e| e == event_type)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryStatus {
    Pending,
    Delivered,
    Failed,
}

impl DeliveryStatus {
    pub fn as_str(&self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::Delivered => "delivered",
            DeliveryStatus::Failed => "failed",
        }
    }
}

impl fmt::Display for DeliveryStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for DeliveryStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pending" => Ok(DeliveryStatus::Pending),
            "delivered" => Ok(DeliveryStatus::Delivered),
            "failed" => Ok(DeliveryStatus::Failed),
            other => Err(format!("unknown delivery status `{other}`")),
        }
    }
}

/// One attempt to deliver (bodies are never kept).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    pub attempt: u32,
    pub attempted_at: DateTime<Utc>,
    pub status_code: Option<u16>,
    /// `timeout`, `connect`, `refused_address`, `http` (non-2xx), …
    pub error_kind: Option<String>,
    pub latency_ms: u32,
}

/// A delivery with its attempts, as the admin surface lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub id: DeliveryId,
    pub webhook_id: String,
    pub endpoint_id: EndpointId,
    pub tenant_id: TenantId,
    pub event_type: String,
    pub ce_id: String,
    pub status: DeliveryStatus,
    pub attempts: Vec<Attempt>,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}
