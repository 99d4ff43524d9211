//! How events are written as text: the event JSON every sink carries
//! (`core.event.tracked`), an archived row, the plan annotations, and the
//! inbox payload read back.

use super::*;

pub fn archive_row(
    tenant_id: TenantId,
    id: EventId,
    kind: String,
    event: Option<String>,
    contact_id: ContactId,
    user_id: Option<String>,
    anonymous_id: Option<String>,
    properties: serde_json::Value,
    occurred_at: DateTime<Utc>,
    offset_s: i32,
    received_at: DateTime<Utc>,
    idempotency_key: String,
    retention_class: i16,
) -> Result<ArchiveRow> {
    let offset = chrono::FixedOffset::east_opt(offset_s)
        .ok_or_else(|| Error::Corrupt(format!("offset {offset_s}")))?;
    Ok(ArchiveRow {
        tenant_id,
        id,
        kind,
        event,
        contact_id,
        user_id,
        anonymous_id,
        properties,
        occurred_at: occurred_at
            .with_timezone(&offset)
            .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
        received_at: received_at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
        idempotency_key,
        retention_class,
    })
}

/// The JSON body of a `core.event.tracked` event (same fields as
/// `GET /v1/core/events`).
pub fn tracked_body(ev: &StoredEvent) -> String {
    use serde_json::{Map, Value, json};
    let mut m = Map::new();
    m.insert("id".into(), json!(ev.id));
    m.insert("type".into(), json!(ev.kind.as_str()));
    if let Some(name) = &ev.event {
        m.insert("event".into(), json!(name));
    }
    m.insert("contact_id".into(), json!(ev.contact_id));
    // Absent ids are left out, as `GET /v1/core/events` leaves them out.
    if let Some(u) = &ev.user_id {
        m.insert("user_id".into(), json!(u));
    }
    if let Some(a) = &ev.anonymous_id {
        m.insert("anonymous_id".into(), json!(a));
    }
    let key = match ev.kind {
        fastack_entities::EventKind::Track => "properties",
        fastack_entities::EventKind::Identify => "traits",
    };
    m.insert(key.into(), Value::Object(ev.properties.clone()));
    m.insert(
        "occurred_at".into(),
        json!(
            ev.occurred_at
                .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
        ),
    );
    m.insert(
        "received_at".into(),
        json!(
            ev.received_at
                .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
        ),
    );
    if let Some(plan) = &ev.plan {
        m.insert("plan_version".into(), json!(plan.plan_version));
        if !plan.schema_violations.is_empty() {
            m.insert("schema_violations".into(), json!(plan.schema_violations));
        }
    }
    Value::Object(m).to_string()
}

/// An event's `annotations` column: what its tracking plan said.
pub(crate) fn annotations(plan: &fastack_entities::PlanCheck) -> String {
    serde_json::to_string(plan).expect("a plan check serialises")
}

/// Reads an event's `annotations` column.
pub(crate) fn plan_of(
    annotations: Option<serde_json::Value>,
) -> Result<Option<fastack_entities::PlanCheck>> {
    annotations
        .map(serde_json::from_value)
        .transpose()
        .map_err(|e| crate::Error::Corrupt(format!("annotations: {e}")))
}

/// The smallest UUIDv7 of the millisecond `at`: every v7 id generated
/// before `at` sorts below it.
pub fn v7_floor(at: DateTime<Utc>) -> uuid::Uuid {
    let ms = at.timestamp_millis().max(0) as u64;
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    bytes[6] = 0x70;
    bytes[8] = 0x80;
    uuid::Uuid::from_bytes(bytes)
}

/// Decodes an inbox payload. The instant is normalised again, so rows
/// queued by a release that kept leap seconds are stored like new ones.
pub(crate) fn decode_payload(payload: &str) -> Result<NewEvent> {
    let mut event: NewEvent =
        serde_json::from_str(payload).map_err(|e| Error::Corrupt(format!("inbox payload: {e}")))?;
    event.occurred_at = crate::validate::normalize(event.occurred_at);
    Ok(event)
}
