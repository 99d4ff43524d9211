//! Domain records shared by storage, actors and the HTTP surface.

use std::{fmt, str::FromStr};

use chrono::{DateTime, FixedOffset, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::ids::{ApiKeyId, ContactId, EventId, TenantId};

/// A tenant's commercial plan: it sets the default rate limit and retention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Plan {
    Free,
    Pro,
    Enterprise,
}

impl Plan {
    pub const ALL: [Plan; 3] = [Plan::Free, Plan::Pro, Plan::Enterprise];

    pub fn as_str(&self) -> &'static str {
        match self {
            Plan::Free => "free",
            Plan::Pro => "pro",
            Plan::Enterprise => "enterprise",
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, not `write_str`: tables align with `{:<10}`.
        f.pad(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown plan `{0}` (expected free, pro or enterprise)")]
pub struct UnknownPlan(pub String);

impl FromStr for Plan {
    type Err = UnknownPlan;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "free" => Ok(Plan::Free),
            "pro" => Ok(Plan::Pro),
            "enterprise" => Ok(Plan::Enterprise),
            other => Err(UnknownPlan(other.to_owned())),
        }
    }
}

/// What a plan grants. Operators may override the defaults in configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanLimits {
    /// Sustained requests per second per tenant.
    pub rate_per_sec: u32,
    /// Requests that may arrive at once on an idle tenant.
    pub burst: u32,
    /// Months an event is kept (measured on `occurred_at`).
    pub retention_months: u32,
}

impl PlanLimits {
    /// The published default plan table (README "Plans").
    pub fn default_for(plan: Plan) -> Self {
        match plan {
            Plan::Free => PlanLimits {
                rate_per_sec: 100,
                burst: 200,
                retention_months: 13,
            },
            Plan::Pro => PlanLimits {
                rate_per_sec: 2_000,
                burst: 4_000,
                retention_months: 25,
            },
            Plan::Enterprise => PlanLimits {
                rate_per_sec: 50_000,
                burst: 100_000,
                retention_months: 37,
            },
        }
    }
}

/// A tenant as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenant {
    pub id: TenantId,
    pub name: String,
    pub plan: Plan,
    /// Enterprise tenants may keep data longer than their plan's default.
    pub retention_months: Option<u32>,
    pub created_at: DateTime<Utc>,
}

/// An API key as stored: never the secret, only its hash and a display prefix.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKey {
    pub id: ApiKeyId,
    pub tenant_id: TenantId,
    pub prefix: String,
    pub rate_limit_rps: Option<u32>,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// When a request last authenticated with it (to within the key
    /// cache's lifetime, `FASTACK_KEY_CACHE_TTL_MS`).
    #[serde(default)]
    pub last_used_at: Option<DateTime<Utc>>,
}

/// `track` or `identify`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    Track,
    Identify,
}

impl EventKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            EventKind::Track => "track",
            EventKind::Identify => "identify",
        }
    }
}

impl FromStr for EventKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "track" => Ok(EventKind::Track),
            "identify" => Ok(EventKind::Identify),
            other => Err(format!("unknown event type `{other}`")),
        }
    }
}

/// A validated event as accepted by the front door and queued in the inbox.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewEvent {
    pub kind: EventKind,
    /// Event name; `None` for identify.
    pub event: Option<String>,
    pub user_id: Option<String>,
    pub anonymous_id: Option<String>,
    /// `properties` of a track, `traits` of an identify.
    pub properties: Map<String, Value>,
    /// As the caller sent it, offset preserved.
    pub occurred_at: DateTime<FixedOffset>,
    pub idempotency_key: String,
    /// Set when the tenant had a tracking plan at acceptance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanCheck>,
}

/// What the tenant's tracking plan said of an event at acceptance: the
/// version it was checked against and, in `flag` mode, what did not
/// conform. Not part of the event's fingerprint: a duplicate stays a
/// duplicate across plan changes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanCheck {
    pub plan_version: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schema_violations: Vec<SchemaViolation>,
}

/// One way an event's properties or traits break its schema.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaViolation {
    /// A JSON pointer into the event (`/properties/amount`).
    pub field: String,
    /// The JSON Schema keyword that failed (`type`, `required`, `enum`, …).
    pub code: String,
    pub message: String,
}

/// One stored event, as `GET /v1/core/events` returns it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredEvent {
    pub id: EventId,
    pub kind: EventKind,
    pub event: Option<String>,
    pub contact_id: ContactId,
    pub user_id: Option<String>,
    pub anonymous_id: Option<String>,
    pub properties: Map<String, Value>,
    pub occurred_at: DateTime<FixedOffset>,
    pub received_at: DateTime<Utc>,
    /// What the tracking plan said at acceptance, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanCheck>,
}

/// A resolved contact.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Contact {
    pub id: ContactId,
    pub user_ids: Vec<String>,
    pub anonymous_ids: Vec<String>,
    pub traits: Map<String, Value>,
    /// Contacts that were merged into this one by an identify.
    pub merged_ids: Vec<ContactId>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Which identifier a contact identity row holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IdentityKind {
    User,
    Anonymous,
}

impl IdentityKind {
    pub fn as_i16(&self) -> i16 {
        match self {
            IdentityKind::User => 1,
            IdentityKind::Anonymous => 2,
        }
    }

    pub fn from_i16(v: i16) -> Option<Self> {
        match v {
            1 => Some(IdentityKind::User),
            2 => Some(IdentityKind::Anonymous),
            _ => None,
        }
    }
}

/// An accepted event that processing refused again and again, set aside
/// with why so its tenant's later events go on (`fastack admin quarantine`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuarantinedEvent {
    pub tenant_id: TenantId,
    /// The id its `202` answered; kept on retry, so duplicates stay exact.
    pub event_id: EventId,
    /// The accepted event as queued: JSON of a [`NewEvent`], or the raw text
    /// when it is not JSON.
    pub payload: Value,
    pub received_at: DateTime<Utc>,
    /// The last processing error (redacted like job errors).
    pub error: String,
    pub attempts: u32,
    pub quarantined_at: DateTime<Utc>,
}

impl QuarantinedEvent {
    /// Reads a stored payload: JSON when it parses, else the text itself.
    pub fn payload_value(text: &str) -> Value {
        serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
    }
}
