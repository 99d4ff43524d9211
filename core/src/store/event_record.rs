//! The event record a grouped outbox row carries ([`super::Emit::grouping`]):
//! each event's fields one after another, each written as its length in
//! bytes, `:`, and its text (`~` when absent), times as microseconds since
//! the epoch. A grouped sink reads a whole round of events back from one
//! row, so the row is written for reading: no JSON to render for it (the
//! properties are the text already rendered for the event's own row) and
//! none to parse, no timestamps to format or parse.
//!
//! Rows written before records (a body starting with `{`: the events'
//! `core.event.tracked` JSON one after another) read back the same way.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::encoding::{TrackedView, json_text};
use crate::error::{Error, Result};

/// An event as a grouped row gives it back. Borrowed from the row's body
/// (owned only where a row written before records had escapes).
#[derive(Debug, Clone, PartialEq)]
pub struct EventRecord<'a> {
    pub id: Cow<'a, str>,
    /// `track` or `identify`.
    pub kind: Cow<'a, str>,
    pub event: Option<Cow<'a, str>>,
    pub contact_id: Cow<'a, str>,
    pub user_id: Option<Cow<'a, str>>,
    pub anonymous_id: Option<Cow<'a, str>>,
    pub occurred_at: DateTime<Utc>,
    pub received_at: DateTime<Utc>,
    pub plan_version: Option<i64>,
    /// JSON text (a `track`'s).
    pub properties: Option<Cow<'a, str>>,
    /// JSON text (an `identify`'s).
    pub traits: Option<Cow<'a, str>>,
    /// JSON text, when the tracking plan found any.
    pub schema_violations: Option<Cow<'a, str>>,
}

/// Appends the record of `ev` to `out`; `properties` is `ev.properties` as
/// JSON text.
pub(crate) fn write_record(out: &mut String, ev: &TrackedView<'_>, properties: &str) {
    use fastack_entities::EventKind;
    let uuid = |out: &mut String, id: uuid::Uuid| {
        field(
            out,
            Some(
                id.hyphenated()
                    .encode_lower(&mut uuid::Uuid::encode_buffer()),
            ),
        );
    };
    let number = |out: &mut String, n: i64| field(out, Some(itoa::Buffer::new().format(n)));
    uuid(out, ev.id.0);
    field(out, Some(ev.kind.as_str()));
    field(out, ev.event);
    uuid(out, ev.contact_id.0);
    field(out, ev.user_id);
    field(out, ev.anonymous_id);
    number(out, ev.occurred_at.timestamp_micros());
    number(out, ev.received_at.timestamp_micros());
    match ev.plan {
        Some(plan) => number(out, i64::from(plan.plan_version)),
        None => field(out, None),
    }
    let (props, traits) = match ev.kind {
        EventKind::Track => (Some(properties), None),
        EventKind::Identify => (None, Some(properties)),
    };
    field(out, props);
    field(out, traits);
    // Through a JSON value, as the event JSON renders them: keys sorted.
    let violations = ev
        .plan
        .filter(|p| !p.schema_violations.is_empty())
        .map(|p| serde_json::json!(p.schema_violations).to_string());
    field(out, violations.as_deref());
}

/// Appends a record read back ([`records_in`]) to `out`, as
/// [`write_record`] wrote it: a grouped row written again without some of
/// its events.
pub(crate) fn write_event_record(out: &mut String, r: &EventRecord<'_>) {
    let number = |out: &mut String, n: i64| field(out, Some(itoa::Buffer::new().format(n)));
    field(out, Some(&r.id));
    field(out, Some(&r.kind));
    field(out, r.event.as_deref());
    field(out, Some(&r.contact_id));
    field(out, r.user_id.as_deref());
    field(out, r.anonymous_id.as_deref());
    number(out, r.occurred_at.timestamp_micros());
    number(out, r.received_at.timestamp_micros());
    match r.plan_version {
        Some(v) => number(out, v),
        None => field(out, None),
    }
    field(out, r.properties.as_deref());
    field(out, r.traits.as_deref());
    field(out, r.schema_violations.as_deref());
}

/// The record of a stored event, as [`write_record`] writes it.
pub fn record_of(ev: &fastack_entities::StoredEvent) -> String {
    let mut out = String::new();
    write_record(&mut out, &TrackedView::of(ev), &json_text(&ev.properties));
    out
}

fn field(out: &mut String, value: Option<&str>) {
    match value {
        None => out.push('~'),
        Some(text) => {
            out.push_str(itoa::Buffer::new().format(text.len()));
            out.push(':');
            out.push_str(text);
        }
    }
}

/// The events a grouped row's body carries, in the order they were written.
pub fn records_in(body: &str) -> impl Iterator<Item = Result<EventRecord<'_>>> + '_ {
    let mut json = body
        .starts_with('{')
        .then(|| serde_json::Deserializer::from_str(body).into_iter::<Tracked<'_>>());
    let mut fields = Fields { rest: body };
    std::iter::from_fn(move || match &mut json {
        Some(stream) => stream.next().map(|r| {
            r.map_err(|e| corrupt(e.to_string()))
                .and_then(Tracked::record)
        }),
        None => (!fields.rest.is_empty()).then(|| {
            let record = fields.record();
            if record.is_err() {
                // Nothing after a broken field can be trusted.
                fields.rest = "";
            }
            record
        }),
    })
}

fn corrupt(why: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!("event record: {why}"))
}

/// A cursor over a body of records.
struct Fields<'a> {
    rest: &'a str,
}

impl<'a> Fields<'a> {
    fn record(&mut self) -> Result<EventRecord<'a>> {
        let record = EventRecord {
            id: self.required("id")?,
            kind: self.required("type")?,
            event: self.next()?.map(Cow::Borrowed),
            contact_id: self.required("contact_id")?,
            user_id: self.next()?.map(Cow::Borrowed),
            anonymous_id: self.next()?.map(Cow::Borrowed),
            occurred_at: self.time("occurred_at")?,
            received_at: self.time("received_at")?,
            plan_version: match self.next()? {
                Some(n) => Some(n.parse().map_err(|_| corrupt("plan_version"))?),
                None => None,
            },
            properties: self.next()?.map(Cow::Borrowed),
            traits: self.next()?.map(Cow::Borrowed),
            schema_violations: self.next()?.map(Cow::Borrowed),
        };
        if record.id.is_empty() {
            // A garbled body must not read as events: an empty id is none.
            return Err(corrupt("empty id"));
        }
        Ok(record)
    }

    fn next(&mut self) -> Result<Option<&'a str>> {
        let bytes = self.rest.as_bytes();
        if bytes.first() == Some(&b'~') {
            self.rest = &self.rest[1..];
            return Ok(None);
        }
        // The length's digits up to `:`; a row is far shorter than 20 of
        // them, so no overflow check is needed past that.
        let mut len = 0usize;
        let mut at = 0;
        loop {
            match bytes.get(at) {
                Some(b':') if at > 0 => break,
                Some(d @ b'0'..=b'9') if at < 19 => len = len * 10 + usize::from(d - b'0'),
                _ => return Err(corrupt("a field without its length")),
            }
            at += 1;
        }
        let rest = &self.rest[at + 1..];
        let value = rest
            .get(..len)
            .ok_or_else(|| corrupt("a field past the end of the row"))?;
        self.rest = &rest[len..];
        Ok(Some(value))
    }

    fn required(&mut self, name: &str) -> Result<Cow<'a, str>> {
        self.next()?
            .map(Cow::Borrowed)
            .ok_or_else(|| corrupt(format!("no {name}")))
    }

    fn time(&mut self, name: &str) -> Result<DateTime<Utc>> {
        self.required(name)?
            .parse::<i64>()
            .ok()
            .and_then(DateTime::from_timestamp_micros)
            .ok_or_else(|| corrupt(format!("{name} is not a time")))
    }
}

/// An event of a row written before records: its `core.event.tracked`
/// JSON.
#[derive(Deserialize)]
struct Tracked<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    event: Option<Cow<'a, str>>,
    #[serde(borrow)]
    contact_id: Cow<'a, str>,
    #[serde(borrow)]
    user_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    anonymous_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    properties: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow)]
    traits: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow)]
    occurred_at: Cow<'a, str>,
    #[serde(borrow)]
    received_at: Cow<'a, str>,
    plan_version: Option<i64>,
    #[serde(borrow)]
    schema_violations: Option<&'a serde_json::value::RawValue>,
}

impl<'a> Tracked<'a> {
    fn record(self) -> Result<EventRecord<'a>> {
        let time = |name: &str, text: &str| {
            DateTime::parse_from_rfc3339(text)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|e| corrupt(format!("{name} `{text}`: {e}")))
        };
        let raw = |v: Option<&'a serde_json::value::RawValue>| v.map(|v| Cow::Borrowed(v.get()));
        Ok(EventRecord {
            occurred_at: time("occurred_at", &self.occurred_at)?,
            received_at: time("received_at", &self.received_at)?,
            id: self.id,
            kind: self.kind,
            event: self.event,
            contact_id: self.contact_id,
            user_id: self.user_id,
            anonymous_id: self.anonymous_id,
            plan_version: self.plan_version,
            properties: raw(self.properties),
            traits: raw(self.traits),
            schema_violations: raw(self.schema_violations),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tracked_body;
    use chrono::TimeZone;
    use fastack_entities::{
        ContactId, EventId, EventKind, PlanCheck, SchemaViolation, StoredEvent,
    };

    fn event(kind: EventKind, user: Option<&str>) -> StoredEvent {
        let mut properties = serde_json::Map::new();
        properties.insert("note".into(), "tab\there, colon: and ~ and \u{e9}".into());
        properties.insert("n".into(), 3.into());
        StoredEvent {
            id: EventId::new(),
            kind,
            event: (kind == EventKind::Track).then(|| "Order: Completed ~".to_owned()),
            contact_id: ContactId::new(),
            user_id: user.map(str::to_owned),
            anonymous_id: Some("12:~".to_owned()),
            properties,
            occurred_at: chrono::FixedOffset::east_opt(3600)
                .unwrap()
                .with_ymd_and_hms(2026, 12, 5, 13, 0, 1)
                .unwrap()
                + chrono::Duration::microseconds(123_456),
            received_at: Utc.with_ymd_and_hms(2026, 12, 5, 12, 0, 2).unwrap(),
            plan: None,
        }
    }

    fn with_plan(mut ev: StoredEvent) -> StoredEvent {
        ev.plan = Some(PlanCheck {
            plan_version: 7,
            schema_violations: vec![SchemaViolation {
                field: "/properties/n".into(),
                code: "maximum".into(),
                message: "too big".into(),
            }],
        });
        ev
    }

    /// The oracle: what a row written before records gives back.
    fn from_json(ev: &StoredEvent) -> EventRecord<'static> {
        let body = tracked_body(ev);
        let record = records_in(&body).next().unwrap().unwrap();
        owned(record)
    }

    fn owned(r: EventRecord<'_>) -> EventRecord<'static> {
        let o = |c: Cow<'_, str>| Cow::Owned(c.into_owned());
        EventRecord {
            id: o(r.id),
            kind: o(r.kind),
            event: r.event.map(o),
            contact_id: o(r.contact_id),
            user_id: r.user_id.map(o),
            anonymous_id: r.anonymous_id.map(o),
            occurred_at: r.occurred_at,
            received_at: r.received_at,
            plan_version: r.plan_version,
            properties: r.properties.map(o),
            traits: r.traits.map(o),
            schema_violations: r.schema_violations.map(o),
        }
    }

    #[test]
    fn a_record_reads_back_as_the_event_json_does() {
        let events = [
            event(EventKind::Track, Some("u:1")),
            with_plan(event(EventKind::Track, None)),
            event(EventKind::Identify, Some("")),
        ];
        let body: String = events.iter().map(record_of).collect();
        let read: Vec<EventRecord<'_>> = records_in(&body).map(Result::unwrap).collect();
        let expected: Vec<EventRecord<'_>> = events.iter().map(from_json).collect();
        assert_eq!(read, expected);
        assert_eq!(
            read[0].occurred_at,
            events[0].occurred_at.with_timezone(&Utc)
        );
        assert_eq!(read[1].plan_version, Some(7));
        assert!(read[2].traits.is_some() && read[2].properties.is_none());
    }

    /// A grouped row written again without some events keeps the others
    /// byte for byte.
    #[test]
    fn a_record_read_back_is_written_as_it_was() {
        let events = [
            event(EventKind::Track, Some("u:1")),
            with_plan(event(EventKind::Track, None)),
            event(EventKind::Identify, Some("")),
        ];
        let body: String = events.iter().map(record_of).collect();
        let mut again = String::new();
        for r in records_in(&body) {
            write_event_record(&mut again, &r.unwrap());
        }
        assert_eq!(again, body);
        // From a row written before records: the same record as now.
        let old = tracked_body(&events[1]);
        let mut from_old = String::new();
        write_event_record(&mut from_old, &records_in(&old).next().unwrap().unwrap());
        assert_eq!(from_old, record_of(&events[1]));
    }

    #[test]
    fn rows_written_before_records_read_back() {
        let events = [
            event(EventKind::Track, Some("u")),
            event(EventKind::Track, None),
        ];
        let body = events
            .iter()
            .map(tracked_body)
            .collect::<Vec<_>>()
            .join("\n");
        let ids: Vec<String> = records_in(&body)
            .map(|r| r.unwrap().id.into_owned())
            .collect();
        assert_eq!(ids, events.map(|e| e.id.to_string()));
    }

    #[test]
    fn a_cut_or_garbled_row_is_an_error_not_events() {
        let body = record_of(&event(EventKind::Track, Some("u")));
        let boundary = |at: usize| (at..).find(|c| body.is_char_boundary(*c)).unwrap();
        for cut in [1, boundary(body.len() / 2), body.len() - 1] {
            let read: Vec<_> = records_in(&body[..cut]).collect();
            assert!(
                read.iter().any(Result::is_err),
                "cut at {cut} read as {read:?}"
            );
        }
        assert!(records_in("x").next().unwrap().is_err());
        assert!(records_in("").next().is_none());
    }
}
