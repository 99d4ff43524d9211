//! The JSON shapes of the tenant API, as documented in the OpenAPI spec.
//!
//! Request types document the contract; the bytes are parsed and validated
//! by `fastack_core::validate` (one code path for single events and batch
//! items, errors naming every field). Response types are what is sent.

use std::collections::BTreeMap;

use chrono::{DateTime, FixedOffset, SecondsFormat, Utc};
use fastack_entities::{Contact, EventKind, StoredEvent};
use poem_openapi::{Enum, Object};
use serde_json::Value;
use uuid::Uuid;

/// `POST /v1/core/track`. One of `user_id` / `anonymous_id` is required.
/// Unknown fields are rejected (`unknown_field`). Ids, key and name hold no
/// control characters; no string or member name holds NUL or a lone
/// surrogate, and numbers must be storable exactly (README "Input rules").
#[derive(Debug, Object)]
pub struct TrackRequest {
    /// Event name, 1–200 characters.
    #[oai(validator(min_length = 1, max_length = 200))]
    pub event: String,
    /// Your stable user id (1–255 characters).
    #[oai(validator(min_length = 1, max_length = 255))]
    pub user_id: Option<String>,
    /// A device or session id for a not yet identified user (1–255
    /// characters).
    #[oai(validator(min_length = 1, max_length = 255))]
    pub anonymous_id: Option<String>,
    /// Free-form event properties.
    pub properties: Option<BTreeMap<String, Value>>,
    /// When it happened, RFC 3339 with offset; at most 24 h in the future and
    /// inside the tenant's retention. The offset is kept.
    pub occurred_at: DateTime<FixedOffset>,
    /// Unique per tenant across track, identify and batch (1–255
    /// characters). A retry with the same key answers the original id.
    #[oai(validator(min_length = 1, max_length = 255))]
    pub idempotency_key: String,
    /// When the client sent it (not part of the idempotency comparison).
    pub sent_at: Option<DateTime<FixedOffset>>,
}

/// `POST /v1/core/identify`. One of `user_id` / `anonymous_id` is
/// required; with both, links them (merging contacts).
/// Ids, keys and names hold no control characters; no string or member
/// name holds NUL or a lone surrogate, and numbers must be storable exactly
/// (README "Input rules").
#[derive(Debug, Object)]
pub struct IdentifyRequest {
    /// Your stable user id (1–255 characters).
    #[oai(validator(min_length = 1, max_length = 255))]
    pub user_id: Option<String>,
    /// A device or session id (1–255 characters).
    #[oai(validator(min_length = 1, max_length = 255))]
    pub anonymous_id: Option<String>,
    /// Traits merged into the contact (shallow, last write wins).
    pub traits: Option<BTreeMap<String, Value>>,
    /// When it happened, RFC 3339 with offset; at most 24 h in the future and
    /// inside the tenant's retention.
    pub occurred_at: DateTime<FixedOffset>,
    /// Unique per tenant across track, identify and batch (1–255
    /// characters).
    #[oai(validator(min_length = 1, max_length = 255))]
    pub idempotency_key: String,
    /// When the client sent it (not part of the idempotency comparison).
    pub sent_at: Option<DateTime<FixedOffset>>,
}

/// The kind of a batch item (and of a stored event).
#[derive(Clone, Copy, Debug, poem_openapi::Enum)]
#[oai(rename_all = "lowercase")]
pub enum EventType {
    Track,
    Identify,
}

/// One batch item: a `track` or an `identify`, told apart by `type`, each
/// with exactly the fields of its own endpoint.
#[derive(Debug, poem_openapi::Union)]
#[oai(one_of)]
pub enum BatchItem {
    Track(BatchTrack),
    Identify(BatchIdentify),
}

/// The `type` of a batch `track`.
#[derive(Clone, Copy, Debug, poem_openapi::Enum)]
#[oai(rename_all = "lowercase")]
pub enum TrackType {
    Track,
}

/// The `type` of a batch `identify`.
#[derive(Clone, Copy, Debug, poem_openapi::Enum)]
#[oai(rename_all = "lowercase")]
pub enum IdentifyType {
    Identify,
}

/// A `track` in a batch: the fields of `POST /v1/core/track` and `type`.
#[derive(Debug, Object)]
pub struct BatchTrack {
    #[oai(rename = "type")]
    pub kind: TrackType,
    /// Event name, 1–200 characters.
    #[oai(validator(min_length = 1, max_length = 200))]
    pub event: String,
    /// 1–255 characters; one of `user_id` / `anonymous_id` is required.
    #[oai(validator(min_length = 1, max_length = 255))]
    pub user_id: Option<String>,
    /// 1–255 characters.
    #[oai(validator(min_length = 1, max_length = 255))]
    pub anonymous_id: Option<String>,
    /// Free-form event properties.
    pub properties: Option<BTreeMap<String, Value>>,
    /// When it happened, RFC 3339 with offset; at most 24 h in the future and
    /// inside the tenant's retention.
    pub occurred_at: DateTime<FixedOffset>,
    /// 1–255 characters, unique per tenant.
    #[oai(validator(min_length = 1, max_length = 255))]
    pub idempotency_key: String,
    pub sent_at: Option<DateTime<FixedOffset>>,
}

/// An `identify` in a batch: the fields of `POST /v1/core/identify` and
/// `type`.
#[derive(Debug, Object)]
pub struct BatchIdentify {
    #[oai(rename = "type")]
    pub kind: IdentifyType,
    /// 1–255 characters; one of `user_id` / `anonymous_id` is required.
    #[oai(validator(min_length = 1, max_length = 255))]
    pub user_id: Option<String>,
    /// 1–255 characters.
    #[oai(validator(min_length = 1, max_length = 255))]
    pub anonymous_id: Option<String>,
    /// Traits merged into the contact (shallow, last write wins).
    pub traits: Option<BTreeMap<String, Value>>,
    /// When it happened, RFC 3339 with offset; at most 24 h in the future and
    /// inside the tenant's retention.
    pub occurred_at: DateTime<FixedOffset>,
    /// 1–255 characters, unique per tenant.
    #[oai(validator(min_length = 1, max_length = 255))]
    pub idempotency_key: String,
    pub sent_at: Option<DateTime<FixedOffset>>,
}

/// `POST /v1/core/batch`: 1–500 items, all accepted or none. Each item
/// follows the rules of its endpoint; in each, one of `user_id` /
/// `anonymous_id` is required.
/// Ids, keys and names hold no control characters; no string or member
/// name holds NUL or a lone surrogate, and numbers must be storable exactly
/// (README "Input rules").
#[derive(Debug, Object)]
pub struct BatchRequest {
    #[oai(validator(min_items = 1, max_items = 500))]
    pub batch: Vec<BatchItem>,
}

/// The answer to an accepted event.
#[derive(Debug, Clone, Object)]
pub struct Ack {
    /// The event id (the original one for a duplicate).
    pub id: Uuid,
    /// True when the idempotency key was seen before with the same content.
    pub duplicate: bool,
}

#[derive(Debug, Object)]
pub struct BatchAck {
    /// One per item, in request order.
    pub items: Vec<Ack>,
}

/// A stored event. Absent fields are left out (never `null`): `event` for
/// identify, the id the event did not carry, `properties` or `traits`.
/// `core.event.tracked` bodies and export lines are the same JSON.
#[derive(Debug, Object)]
pub struct EventOut {
    pub id: Uuid,
    #[oai(rename = "type")]
    pub kind: EventType,
    #[oai(skip_serializing_if_is_none)]
    pub event: Option<String>,
    pub contact_id: Uuid,
    #[oai(skip_serializing_if_is_none)]
    pub user_id: Option<String>,
    #[oai(skip_serializing_if_is_none)]
    pub anonymous_id: Option<String>,
    /// For `track`.
    #[oai(skip_serializing_if_is_none)]
    pub properties: Option<BTreeMap<String, Value>>,
    /// For `identify`.
    #[oai(skip_serializing_if_is_none)]
    pub traits: Option<BTreeMap<String, Value>>,
    /// The instant sent, with the caller's offset (normalised: leap
    /// seconds and digits beyond microseconds are not kept).
    pub occurred_at: Timestamp,
    /// When fastack accepted it (UTC).
    pub received_at: Timestamp,
    /// The tracking plan version the event was checked against, when the
    /// tenant had a plan.
    #[oai(skip_serializing_if_is_none)]
    pub plan_version: Option<u32>,
    /// What broke the plan, for events accepted in `flag` mode.
    #[oai(skip_serializing_if_is_none)]
    pub schema_violations: Option<Vec<SchemaViolationOut>>,
}

/// A tenant's tracking plan: one JSON Schema (draft 2020-12) per event
/// name for `track` properties, one for `identify` traits.
#[derive(Debug, Object)]
pub struct TrackingPlanOut {
    pub version: u32,
    pub installed_at: Timestamp,
    /// `{"events": {name: schema}, "identify": schema, "unplanned":
    /// "allow"|"reject", "mode": "enforce"|"flag", "$defs": {...}}`
    pub document: Value,
}

/// One way an event breaks its schema in the tracking plan.
#[derive(Debug, Object)]
pub struct SchemaViolationOut {
    /// A JSON pointer into the event (`/properties/amount`).
    pub field: String,
    /// The JSON Schema keyword that failed (`type`, `required`, `enum`, …).
    pub code: String,
    pub message: String,
}

pub fn rfc3339<Tz: chrono::TimeZone>(t: &DateTime<Tz>) -> String
where
    Tz::Offset: std::fmt::Display,
{
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// An instant as RFC 3339 text, exactly as fastack formats it (the
/// caller's offset kept where it was sent, as many fractional digits as
/// the instant needs): `string`, `format: date-time` in the spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timestamp(pub String);

impl Timestamp {
    pub fn of<Tz: chrono::TimeZone>(t: &DateTime<Tz>) -> Self
    where
        Tz::Offset: std::fmt::Display,
    {
        Timestamp(rfc3339(t))
    }
}

impl poem_openapi::types::Type for Timestamp {
    const IS_REQUIRED: bool = true;
    type RawValueType = Self;
    type RawElementValueType = Self;

    fn name() -> std::borrow::Cow<'static, str> {
        "string_date-time".into()
    }

    fn schema_ref() -> poem_openapi::registry::MetaSchemaRef {
        poem_openapi::registry::MetaSchemaRef::Inline(Box::new(
            poem_openapi::registry::MetaSchema::new_with_format("string", "date-time"),
        ))
    }

    fn as_raw_value(&self) -> Option<&Self::RawValueType> {
        Some(self)
    }

    fn raw_element_iter<'a>(
        &'a self,
    ) -> Box<dyn Iterator<Item = &'a Self::RawElementValueType> + 'a> {
        Box::new(self.as_raw_value().into_iter())
    }
}

impl poem_openapi::types::ToJSON for Timestamp {
    fn to_json(&self) -> Option<Value> {
        Some(Value::String(self.0.clone()))
    }
}

impl poem_openapi::types::ParseFromJSON for Timestamp {
    fn parse_from_json(value: Option<Value>) -> poem_openapi::types::ParseResult<Self> {
        match value {
            Some(Value::String(s)) if DateTime::parse_from_rfc3339(&s).is_ok() => Ok(Timestamp(s)),
            other => Err(poem_openapi::types::ParseError::expected_type(
                other.unwrap_or_default(),
            )),
        }
    }
}

impl From<StoredEvent> for EventOut {
    fn from(e: StoredEvent) -> Self {
        let props: BTreeMap<String, Value> = e.properties.into_iter().collect();
        let (properties, traits) = match e.kind {
            EventKind::Track => (Some(props), None),
            EventKind::Identify => (None, Some(props)),
        };
        EventOut {
            id: e.id.0,
            kind: match e.kind {
                EventKind::Track => EventType::Track,
                EventKind::Identify => EventType::Identify,
            },
            event: e.event,
            contact_id: e.contact_id.0,
            user_id: e.user_id,
            anonymous_id: e.anonymous_id,
            properties,
            traits,
            occurred_at: Timestamp::of(&e.occurred_at),
            received_at: Timestamp::of(&e.received_at),
            plan_version: e.plan.as_ref().map(|p| p.plan_version),
            schema_violations: e.plan.filter(|p| !p.schema_violations.is_empty()).map(|p| {
                p.schema_violations
                    .into_iter()
                    .map(|v| SchemaViolationOut {
                        field: v.field,
                        code: v.code,
                        message: v.message,
                    })
                    .collect()
            }),
        }
    }
}

/// A page of events ordered by `occurred_at`, then id.
#[derive(Debug, Object)]
pub struct EventsPage {
    pub events: Vec<EventOut>,
    /// Pass as `cursor` to get the next page; absent on the last page.
    #[oai(skip_serializing_if_is_none)]
    pub next_cursor: Option<String>,
}

/// A contact: everything known to be one person.
#[derive(Debug, Object)]
pub struct ContactOut {
    pub id: Uuid,
    pub user_ids: Vec<String>,
    pub anonymous_ids: Vec<String>,
    pub traits: BTreeMap<String, Value>,
    /// Contacts merged into this one by an identify.
    pub merged_ids: Vec<Uuid>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl From<Contact> for ContactOut {
    fn from(c: Contact) -> Self {
        ContactOut {
            id: c.id.0,
            user_ids: c.user_ids,
            anonymous_ids: c.anonymous_ids,
            traits: c.traits.into_iter().collect(),
            merged_ids: c.merged_ids.into_iter().map(|m| m.0).collect(),
            created_at: Timestamp::of(&c.created_at),
            updated_at: Timestamp::of(&c.updated_at),
        }
    }
}

#[derive(Debug, Object)]
pub struct Health {
    pub status: String,
}

/// A dependency's state: `warning` works with something to know (nothing
/// bound to an exchange, a disk running low).
#[derive(Debug, Clone, Copy, Enum)]
#[oai(rename_all = "snake_case")]
pub enum DependencyState {
    Up,
    Warning,
    Down,
}

/// One dependency of the node, as last checked.
#[derive(Debug, Object)]
pub struct DependencyOut {
    pub state: DependencyState,
    /// When it entered this state.
    pub since: DateTime<Utc>,
    pub checked_at: DateTime<Utc>,
    /// What it is: where (no credentials), free bytes.
    #[oai(skip_serializing_if_is_none)]
    pub detail: Option<String>,
    /// The last failure or warning, kept after it recovers.
    #[oai(skip_serializing_if_is_none)]
    pub last_error: Option<String>,
}

/// Readiness: `ready`, `degraded` (a dependency other than the database is
/// down: events are still accepted and kept until it is back) or
/// `database unavailable`.
#[derive(Debug, Object)]
pub struct Readiness {
    pub status: String,
    /// By name: `database`, `object_storage`, `lake` (with the mirror),
    /// `amqp` (with streaming), `redis` (with Redis), `disk`.
    pub dependencies: std::collections::BTreeMap<String, DependencyOut>,
}

impl From<fastack_core::health::Status> for DependencyOut {
    fn from(s: fastack_core::health::Status) -> Self {
        use fastack_core::health::State;
        DependencyOut {
            state: match s.state {
                State::Up => DependencyState::Up,
                State::Warning => DependencyState::Warning,
                State::Down => DependencyState::Down,
            },
            since: s.since,
            checked_at: s.checked_at,
            detail: s.detail,
            last_error: s.last_error,
        }
    }
}

/// Decoded pagination cursor: resume after (occurred_at, id).
pub fn encode_cursor(at: DateTime<Utc>, id: Uuid) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!(
        "{}:{}",
        at.timestamp_micros(),
        id
    ))
}

pub fn decode_cursor(s: &str) -> Option<(DateTime<Utc>, Uuid)> {
    use base64::Engine;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .ok()?;
    let text = std::str::from_utf8(&raw).ok()?;
    let (at, id) = text.split_once(':')?;
    let at = DateTime::<Utc>::from_timestamp_micros(at.parse().ok()?)?;
    Some((at, id.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trip() {
        let at: DateTime<Utc> = "2026-11-30T10:00:00.123456Z".parse().unwrap();
        let id = Uuid::now_v7();
        assert_eq!(decode_cursor(&encode_cursor(at, id)), Some((at, id)));
        assert_eq!(decode_cursor("garbage!"), None);
    }
}

// The HMAC of a job's file (an export, an erasure certificate).
#[derive(Debug, Object)]
pub struct JobIntegrity {
    /// `HMAC-SHA256`
    pub algorithm: String,
    pub signature: String,
}
