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
    tracked_body_of(&TrackedView::of(ev))
}

/// An event as [`tracked_body`] renders it, borrowed: processing renders
/// the events it appends without copying them into a [`StoredEvent`].
pub(crate) struct TrackedView<'a> {
    pub id: EventId,
    pub kind: fastack_entities::EventKind,
    pub event: Option<&'a str>,
    pub contact_id: ContactId,
    pub user_id: Option<&'a str>,
    pub anonymous_id: Option<&'a str>,
    pub properties: &'a serde_json::Map<String, serde_json::Value>,
    pub occurred_at: DateTime<chrono::FixedOffset>,
    pub received_at: DateTime<Utc>,
    pub plan: Option<&'a fastack_entities::PlanCheck>,
}

impl<'a> TrackedView<'a> {
    pub fn of(ev: &'a StoredEvent) -> Self {
        TrackedView {
            id: ev.id,
            kind: ev.kind,
            event: ev.event.as_deref(),
            contact_id: ev.contact_id,
            user_id: ev.user_id.as_deref(),
            anonymous_id: ev.anonymous_id.as_deref(),
            properties: &ev.properties,
            occurred_at: ev.occurred_at,
            received_at: ev.received_at,
            plan: ev.plan.as_ref(),
        }
    }
}

/// Renders the body straight from borrowed fields. The keys are written in
/// sorted order, as a JSON object of this build (`serde_json::Map` without
/// `preserve_order`) always wrote them: bodies stay byte for byte what
/// earlier releases sent.
pub(crate) fn tracked_body_of(ev: &TrackedView<'_>) -> String {
    use fastack_entities::EventKind;
    use serde::Serialize;
    #[derive(Serialize)]
    struct Body<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        anonymous_id: Option<&'a str>,
        contact_id: ContactId,
        #[serde(skip_serializing_if = "Option::is_none")]
        event: Option<&'a str>,
        id: EventId,
        occurred_at: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        plan_version: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        properties: Option<&'a serde_json::Map<String, serde_json::Value>>,
        received_at: String,
        // As a JSON value: its objects' keys sorted, as they always were.
        #[serde(skip_serializing_if = "Option::is_none")]
        schema_violations: Option<serde_json::Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        traits: Option<&'a serde_json::Map<String, serde_json::Value>>,
        #[serde(rename = "type")]
        kind: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        user_id: Option<&'a str>,
    }
    let (properties, traits) = match ev.kind {
        EventKind::Track => (Some(ev.properties), None),
        EventKind::Identify => (None, Some(ev.properties)),
    };
    let body = Body {
        anonymous_id: ev.anonymous_id,
        contact_id: ev.contact_id,
        event: ev.event,
        id: ev.id,
        occurred_at: ev
            .occurred_at
            .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
        plan_version: ev.plan.map(|p| p.plan_version),
        properties,
        received_at: ev
            .received_at
            .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
        schema_violations: ev
            .plan
            .filter(|p| !p.schema_violations.is_empty())
            .map(|p| serde_json::json!(p.schema_violations)),
        traits,
        kind: ev.kind.as_str(),
        user_id: ev.user_id,
    };
    serde_json::to_string(&body).expect("an event body serialises")
}

/// A JSON object as text (properties, traits): keys sorted.
pub(crate) fn json_text(map: &serde_json::Map<String, serde_json::Value>) -> String {
    serde_json::to_string(map).expect("a JSON map serialises")
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

#[cfg(test)]
mod tests {
    use fastack_entities::{EventKind, PlanCheck, SchemaViolation};
    use serde_json::{Map, Value, json};

    use super::*;

    /// AMQP and webhook consumers see what the tracking plan said, in the
    /// same fields as `GET /v1/core/events`.
    #[test]
    fn tracked_body_carries_the_plan_check() {
        let mut ev = StoredEvent {
            id: EventId::new(),
            kind: fastack_entities::EventKind::Track,
            event: Some("Order Completed".into()),
            contact_id: fastack_entities::ContactId::new(),
            user_id: Some("u1".into()),
            anonymous_id: None,
            properties: serde_json::Map::new(),
            occurred_at: Utc::now().fixed_offset(),
            received_at: Utc::now(),
            plan: None,
        };
        let plain: serde_json::Value = serde_json::from_str(&tracked_body(&ev)).unwrap();
        assert!(plain.get("plan_version").is_none());
        ev.plan = Some(fastack_entities::PlanCheck {
            plan_version: 7,
            schema_violations: vec![fastack_entities::SchemaViolation {
                field: "/properties/amount".into(),
                code: "required".into(),
                message: "\"amount\" is a required property".into(),
            }],
        });
        let body: serde_json::Value = serde_json::from_str(&tracked_body(&ev)).unwrap();
        assert_eq!(body["plan_version"], 7);
        assert_eq!(body["schema_violations"][0]["field"], "/properties/amount");
        assert_eq!(body["schema_violations"][0]["code"], "required");
    }

    #[test]
    fn v7_floor_orders_ids_by_time() {
        let t: DateTime<Utc> = "2026-11-30T10:00:00Z".parse().unwrap();
        let floor = v7_floor(t);
        let before = uuid::Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            (t.timestamp() - 1) as u64,
            0,
        ));
        let after = uuid::Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            (t.timestamp() + 1) as u64,
            0,
        ));
        assert!(before < floor && floor < after);
        assert_eq!(floor.get_version_num(), 7);
    }

    /// The body as releases before the borrowed renderer wrote it: a JSON
    /// object built key by key.
    fn reference(ev: &StoredEvent) -> String {
        let mut m = Map::new();
        m.insert("id".into(), json!(ev.id));
        m.insert("type".into(), json!(ev.kind.as_str()));
        if let Some(name) = &ev.event {
            m.insert("event".into(), json!(name));
        }
        m.insert("contact_id".into(), json!(ev.contact_id));
        if let Some(u) = &ev.user_id {
            m.insert("user_id".into(), json!(u));
        }
        if let Some(a) = &ev.anonymous_id {
            m.insert("anonymous_id".into(), json!(a));
        }
        let key = match ev.kind {
            EventKind::Track => "properties",
            EventKind::Identify => "traits",
        };
        m.insert(key.into(), Value::Object(ev.properties.clone()));
        let at = |t: String| json!(t);
        m.insert(
            "occurred_at".into(),
            at(ev
                .occurred_at
                .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)),
        );
        m.insert(
            "received_at".into(),
            at(ev
                .received_at
                .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)),
        );
        if let Some(plan) = &ev.plan {
            m.insert("plan_version".into(), json!(plan.plan_version));
            if !plan.schema_violations.is_empty() {
                m.insert("schema_violations".into(), json!(plan.schema_violations));
            }
        }
        Value::Object(m).to_string()
    }

    fn event(kind: EventKind, plan: Option<PlanCheck>, anonymous: Option<&str>) -> StoredEvent {
        let properties = json!({
            "total": 42.5, "z": [1, "two", null, {"b": 1, "a": 2}],
            "quote\"d": "line\nbreak \u{1F600} \\ tab\t", "ünï": -0.0, "big": 1e300
        });
        StoredEvent {
            id: EventId::new(),
            kind,
            event: (kind == EventKind::Track).then(|| "Order \"Completed\"".to_owned()),
            contact_id: ContactId::new(),
            user_id: Some("u-1".into()),
            anonymous_id: anonymous.map(str::to_owned),
            properties: properties.as_object().unwrap().clone(),
            occurred_at: "2026-12-05T09:59:00.123456+02:00".parse().unwrap(),
            received_at: "2026-12-05T08:00:00Z".parse().unwrap(),
            plan,
        }
    }

    #[test]
    fn the_body_is_byte_for_byte_what_releases_wrote() {
        let plan = |violations: bool| PlanCheck {
            plan_version: 7,
            schema_violations: if violations {
                vec![SchemaViolation {
                    field: "/properties/total".into(),
                    code: "type".into(),
                    message: "42.5 is not of type \"integer\"".into(),
                }]
            } else {
                Vec::new()
            },
        };
        for ev in [
            event(EventKind::Track, None, None),
            event(EventKind::Track, Some(plan(true)), Some("a-1")),
            event(EventKind::Track, Some(plan(false)), None),
            event(EventKind::Identify, None, Some("a-2")),
            event(EventKind::Identify, Some(plan(true)), None),
        ] {
            assert_eq!(tracked_body(&ev), reference(&ev));
        }
    }
}
