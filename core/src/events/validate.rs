//! Validation of incoming events: from parsed JSON to a [`NewEvent`], with
//! every problem reported as a [`FieldError`] naming the field (and batch
//! index). Also the idempotency fingerprint: what "same payload" means.
//!
//! Unknown fields policy: unknown top-level fields are rejected (a typo such
//! as `occured_at` must not silently drop data); `properties` and `traits`
//! are free-form objects.

use chrono::{DateTime, Duration, FixedOffset, Months, SubsecRound, Utc};
use fastack_entities::{EventKind, NewEvent};
use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

pub const MAX_EVENT_BYTES: usize = 32 * 1024;
pub const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;
pub const MAX_BATCH_ITEMS: usize = 500;
pub const MAX_KEY_CHARS: usize = 255;
pub const MAX_EVENT_NAME_CHARS: usize = 200;
pub const MAX_ID_CHARS: usize = 255;
pub const MAX_FUTURE: Duration = Duration::hours(24);

/// One offending field. `code` is the stable machine-readable reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FieldError {
    pub field: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    pub code: &'static str,
    pub message: String,
}

/// What a validation needs to know about the moment and the tenant.
#[derive(Clone, Copy, Debug)]
pub struct ValidationContext {
    pub now: DateTime<Utc>,
    pub retention_months: u32,
}

impl ValidationContext {
    /// The oldest `occurred_at` still inside the tenant's retention.
    pub fn oldest_allowed(&self) -> DateTime<Utc> {
        self.now
            .checked_sub_months(Months::new(self.retention_months))
            .unwrap_or(DateTime::<Utc>::MIN_UTC)
    }
}

const TRACK_FIELDS: &[&str] = &[
    "type",
    "event",
    "user_id",
    "anonymous_id",
    "properties",
    "occurred_at",
    "idempotency_key",
    "sent_at",
];
const IDENTIFY_FIELDS: &[&str] = &[
    "type",
    "user_id",
    "anonymous_id",
    "traits",
    "occurred_at",
    "idempotency_key",
    "sent_at",
];

struct Collector<'a> {
    /// JSON pointer of the event in the request body (`""` or `/batch/3`).
    base: String,
    index: Option<usize>,
    errors: &'a mut Vec<FieldError>,
}

impl Collector<'_> {
    /// An error at member `field` of the event (`""`: the event itself).
    fn push(&mut self, field: &str, code: &'static str, message: impl Into<String>) {
        let field = if field.is_empty() {
            self.base.clone()
        } else {
            format!("{}/{}", self.base, crate::json::pointer_token(field))
        };
        self.errors.push(FieldError {
            field,
            index: self.index,
            code,
            message: message.into(),
        });
    }
}

/// The JSON pointer of batch item `index` in the request body, or of the
/// body itself.
pub fn item_pointer(index: Option<usize>) -> String {
    index.map_or_else(String::new, |i| format!("/batch/{i}"))
}

/// The whole edge rule for one event's JSON text (a request body, or one
/// batch item): storable text ([`crate::json::unstorable`]), strict JSON
/// (no repeated member names), then [`validate_event`]. `Err` is a syntax
/// error of the text (a 400); field errors are appended to `errors`.
pub fn event_from_json(
    text: &[u8],
    expected: Option<EventKind>,
    index: Option<usize>,
    ctx: &ValidationContext,
    errors: &mut Vec<FieldError>,
) -> Result<Option<NewEvent>, serde_json::Error> {
    let findings = crate::json::unstorable(text);
    if !findings.is_empty() {
        let base = item_pointer(index);
        errors.extend(findings.into_iter().map(|f| FieldError {
            field: format!("{base}{}", f.pointer),
            index,
            code: f.problem.code(),
            message: f.problem.message().to_owned(),
        }));
        return Ok(None);
    }
    let value = crate::json::parse_strict(text)?;
    Ok(validate_event(value, expected, index, ctx, errors))
}

/// Validates one event. `expected` is the endpoint's kind (`None` for batch
/// items, which must carry `type`). Errors are appended to `errors`; the
/// event is returned only when it had none.
pub fn validate_event(
    value: Value,
    expected: Option<EventKind>,
    index: Option<usize>,
    ctx: &ValidationContext,
    errors: &mut Vec<FieldError>,
) -> Option<NewEvent> {
    let before = errors.len();
    let mut c = Collector {
        base: item_pointer(index),
        index,
        errors,
    };
    let Value::Object(mut obj) = value else {
        c.push("", "invalid_type", "an event must be a JSON object");
        return None;
    };

    let kind = match (obj.remove("type"), expected) {
        (None, Some(kind)) => Some(kind),
        (None, None) => {
            c.push(
                "type",
                "required",
                "`type` is required: \"track\" or \"identify\"",
            );
            None
        }
        (Some(Value::String(s)), expected) => match s.parse::<EventKind>() {
            Ok(kind) if expected.is_none_or(|e| e == kind) => Some(kind),
            Ok(kind) => {
                c.push(
                    "type",
                    "invalid_value",
                    format!(
                        "`type` is \"{}\" but this endpoint takes \"{}\"",
                        kind.as_str(),
                        expected.map_or("", |e| e.as_str())
                    ),
                );
                None
            }
            Err(_) => {
                c.push(
                    "type",
                    "invalid_value",
                    "`type` must be \"track\" or \"identify\"",
                );
                None
            }
        },
        (Some(_), _) => {
            c.push("type", "invalid_type", "`type` must be a string");
            None
        }
    };
    let kind = kind?;

    let allowed = match kind {
        EventKind::Track => TRACK_FIELDS,
        EventKind::Identify => IDENTIFY_FIELDS,
    };
    let mut unknown: Vec<&String> = obj
        .keys()
        .filter(|k| !allowed.contains(&k.as_str()))
        .collect();
    unknown.sort();
    for field in unknown {
        let hint = did_you_mean(field, allowed.iter().copied());
        c.push(
            field,
            "unknown_field",
            format!("unknown field `{field}`{hint}"),
        );
    }

    let event = match kind {
        EventKind::Track => string_field(&mut obj, "event", true, MAX_EVENT_NAME_CHARS, &mut c),
        EventKind::Identify => None,
    };
    let ids_before = c.errors.len();
    let user_id = string_field(&mut obj, "user_id", false, MAX_ID_CHARS, &mut c);
    let anonymous_id = string_field(&mut obj, "anonymous_id", false, MAX_ID_CHARS, &mut c);
    let ids_ok = c.errors.len() == ids_before;
    if ids_ok && user_id.is_none() && anonymous_id.is_none() {
        c.push(
            "user_id",
            "required",
            "one of `user_id` or `anonymous_id` is required",
        );
    }
    let idempotency_key = string_field(&mut obj, "idempotency_key", true, MAX_KEY_CHARS, &mut c);

    let props_field = match kind {
        EventKind::Track => "properties",
        EventKind::Identify => "traits",
    };
    let properties = match obj.remove(props_field) {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map,
        Some(_) => {
            c.push(
                props_field,
                "invalid_type",
                format!("`{props_field}` must be an object"),
            );
            Map::new()
        }
    };

    let occurred_at = match obj.remove("occurred_at") {
        None | Some(Value::Null) => {
            c.push(
                "occurred_at",
                "required",
                "`occurred_at` is required (RFC 3339 with offset)",
            );
            None
        }
        Some(Value::String(s)) => match parse_timestamp(&s) {
            Some(ts) => {
                let utc = ts.with_timezone(&Utc);
                if utc > ctx.now + MAX_FUTURE {
                    c.push(
                        "occurred_at",
                        "occurred_at_in_future",
                        "`occurred_at` is more than 24 hours in the future",
                    );
                    None
                } else if utc < ctx.oldest_allowed() {
                    c.push(
                        "occurred_at",
                        "occurred_at_out_of_retention",
                        format!(
                            "`occurred_at` is older than the tenant's retention of {} months",
                            ctx.retention_months
                        ),
                    );
                    None
                } else {
                    Some(ts)
                }
            }
            None => {
                c.push(
                    "occurred_at",
                    "invalid_timestamp",
                    "`occurred_at` must be an RFC 3339 timestamp with an offset, e.g. 2026-11-30T09:15:00+01:00",
                );
                None
            }
        },
        Some(_) => {
            c.push(
                "occurred_at",
                "invalid_type",
                "`occurred_at` must be a string",
            );
            None
        }
    };
    match obj.remove("sent_at") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if parse_timestamp(&s).is_some() => {}
        Some(_) => c.push(
            "sent_at",
            "invalid_timestamp",
            "`sent_at` must be an RFC 3339 timestamp with an offset",
        ),
    }

    if c.errors.len() > before {
        return None;
    }
    Some(NewEvent {
        kind,
        event,
        user_id,
        anonymous_id,
        properties,
        occurred_at: occurred_at?,
        idempotency_key: idempotency_key?,
        plan: None,
    })
}

fn string_field(
    obj: &mut Map<String, Value>,
    field: &str,
    required: bool,
    max_chars: usize,
    c: &mut Collector<'_>,
) -> Option<String> {
    match obj.remove(field) {
        None | Some(Value::Null) => {
            if required {
                c.push(field, "required", format!("`{field}` is required"));
            }
            None
        }
        Some(Value::String(s)) => {
            let n = s.chars().count();
            if n == 0 || n > max_chars {
                c.push(
                    field,
                    "invalid_length",
                    format!("`{field}` must be 1 to {max_chars} characters"),
                );
                None
            } else if s.chars().any(is_control) {
                c.push(
                    field,
                    "invalid_character",
                    format!("`{field}` must not contain control characters (U+0000–U+001F, U+007F–U+009F)"),
                );
                None
            } else {
                Some(s)
            }
        }
        Some(_) => {
            c.push(field, "invalid_type", format!("`{field}` must be a string"));
            None
        }
    }
}

/// Why a batch body is not `{"batch": [ … ]}`.
#[derive(Debug)]
pub enum EnvelopeError {
    /// Not JSON (a 400 `invalid_json`).
    Json(String),
    /// JSON of the wrong shape (a 422 naming the place).
    Shape(FieldError),
}

/// The items of a batch body, still as raw JSON text: each is checked by
/// [`event_from_json`] like a single event.
pub fn batch_items(body: &[u8]) -> Result<Vec<&serde_json::value::RawValue>, EnvelopeError> {
    // One pass in the common case; a body that fails it is read again to
    // say in our words what is wrong.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Envelope<'a> {
        #[serde(borrow)]
        batch: Vec<&'a serde_json::value::RawValue>,
    }
    match serde_json::from_slice::<Envelope<'_>>(body) {
        Ok(envelope) => Ok(envelope.batch),
        Err(err) => Err(diagnose_envelope(body).unwrap_or(EnvelopeError::Json(err.to_string()))),
    }
}

/// Why a batch body is not `{"batch": [ … ]}`, when it is JSON of another
/// shape (`None`: it is the parser's error to report).
fn diagnose_envelope(body: &[u8]) -> Option<EnvelopeError> {
    use serde_json::value::RawValue;
    let shape = |field: &str, code: &'static str, message: &str| {
        Some(EnvelopeError::Shape(FieldError {
            field: field.to_owned(),
            index: None,
            code,
            message: message.to_owned(),
        }))
    };
    let whole: &RawValue = serde_json::from_slice(body).ok()?;
    if !whole.get().trim_start().starts_with('{') {
        return shape(
            "",
            "invalid_type",
            "the body must be a JSON object {\"batch\": [ … ]} holding 1 to 500 events",
        );
    }
    let members = serde_json::from_str::<Members<'_>>(whole.get()).ok()?.0;
    let mut batch = None;
    for (name, value) in members {
        if name != "batch" {
            return shape(
                &format!("/{}", crate::json::pointer_token(&name)),
                "unknown_field",
                &format!("unknown field `{name}`: the body is {{\"batch\": [ … ]}}"),
            );
        }
        if batch.replace(value).is_some() {
            return Some(EnvelopeError::Json(
                "duplicate member name `batch`".to_owned(),
            ));
        }
    }
    let Some(batch) = batch else {
        return shape(
            "/batch",
            "required",
            "`batch` is required: an array of 1 to 500 events",
        );
    };
    if !batch.get().starts_with('[') {
        return shape(
            "/batch",
            "invalid_type",
            "`batch` must be an array of 1 to 500 events",
        );
    }
    None
}

/// An object's members in order, values left as raw text.
struct Members<'a>(Vec<(String, &'a serde_json::value::RawValue)>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for Members<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = Members<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    out.push(entry);
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// C0 and C1 control characters and DEL: refused in ids, keys and event
/// names (they are identifiers, shown in logs and consoles); property and
/// trait values may hold them (JSON escapes them).
pub(crate) fn is_control(c: char) -> bool {
    c.is_control()
}

/// RFC 3339 with an explicit offset, normalised once so that one value
/// decides both the partition and the stored instant (see [`normalize`]).
pub fn parse_timestamp(s: &str) -> Option<DateTime<FixedOffset>> {
    DateTime::parse_from_rfc3339(s).ok().map(normalize)
}

/// What storage keeps of an instant: microseconds (finer digits are
/// truncated), and a leap second (`23:59:60.5`) read as the last
/// microsecond of the second before it (`23:59:59.999999`), so it stays in
/// the day and month it was written in and sorts after that second. The
/// caller's offset is kept.
pub fn normalize(t: DateTime<FixedOffset>) -> DateTime<FixedOffset> {
    use chrono::Timelike;
    let t = t.trunc_subsecs(6);
    if t.nanosecond() >= 1_000_000_000 {
        t.with_nanosecond(999_999_000).unwrap_or(t)
    } else {
        t
    }
}

/// SHA-256 over the event's content: type, name, ids, properties/traits and
/// the instant of `occurred_at`. `sent_at` is excluded (a retry may restamp
/// it), and the result does not depend on JSON key order or on whether the
/// event came alone or inside a batch.
pub fn fingerprint(ev: &NewEvent) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(ev.kind.as_str().as_bytes());
    for part in [&ev.event, &ev.user_id, &ev.anonymous_id] {
        match part {
            Some(s) => {
                h.update([1u8]);
                h.update((s.len() as u64).to_be_bytes());
                h.update(s.as_bytes());
            }
            None => h.update([0u8]),
        }
    }
    let mut buf = Vec::with_capacity(256);
    write_canonical_map(&mut buf, &ev.properties);
    h.update((buf.len() as u64).to_be_bytes());
    h.update(&buf);
    h.update(ev.occurred_at.timestamp_micros().to_be_bytes());
    h.finalize().into()
}

fn write_canonical_map(out: &mut Vec<u8>, map: &Map<String, Value>) {
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort_unstable();
    out.push(b'{');
    for (i, key) in keys.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, key).expect("writing to a Vec cannot fail");
        out.push(b':');
        write_canonical(out, &map[key]);
    }
    out.push(b'}');
}

/// JSON with object keys sorted, no whitespace: one byte string per value.
pub fn write_canonical(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Object(map) => write_canonical_map(out, map),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(out, item);
            }
            out.push(b']');
        }
        scalar => serde_json::to_writer(&mut *out, scalar).expect("writing to a Vec cannot fail"),
    }
}

/// The candidate closest to `name`, when it is close enough to be a typo
/// (`occured_at` for `occurred_at`, `limt` for `limit`).
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|known| (strsim::damerau_levenshtein(name, known), known))
        .filter(|(d, known)| *d > 0 && *d <= (known.len() / 5).max(2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, known)| known)
}

/// ` (did you mean `x`?)` when a candidate is close to `name`, else empty.
pub fn did_you_mean<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    closest(name, candidates)
        .map(|known| format!(" (did you mean `{known}`?)"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ctx() -> ValidationContext {
        ValidationContext {
            now: "2026-11-30T12:00:00Z".parse().unwrap(),
            retention_months: 13,
        }
    }

    fn track() -> Value {
        json!({
            "event": "Order Completed",
            "user_id": "u1",
            "properties": {"total": 12.5, "items": [1, 2]},
            "occurred_at": "2026-11-30T10:00:00.123456789+02:00",
            "idempotency_key": "k1"
        })
    }

    fn run(v: Value, kind: Option<EventKind>) -> (Option<NewEvent>, Vec<FieldError>) {
        let mut errors = Vec::new();
        let ev = validate_event(v, kind, None, &ctx(), &mut errors);
        (ev, errors)
    }

    #[test]
    fn a_good_track_keeps_offset_and_truncates_to_micros() {
        let (ev, errors) = run(track(), Some(EventKind::Track));
        assert!(errors.is_empty(), "{errors:?}");
        let ev = ev.unwrap();
        assert_eq!(ev.occurred_at.offset().local_minus_utc(), 7200);
        assert_eq!(ev.occurred_at.timestamp_subsec_nanos(), 123_456_000);
        assert_eq!(ev.event.as_deref(), Some("Order Completed"));
    }

    #[test]
    fn every_problem_is_named() {
        let (ev, errors) = run(
            json!({"event": "", "user_id": 5, "occured_at": "x", "idempotency_key": "k", "properties": []}),
            Some(EventKind::Track),
        );
        assert!(ev.is_none());
        let fields: Vec<(&str, &str)> = errors.iter().map(|e| (e.field.as_str(), e.code)).collect();
        assert!(fields.contains(&("/occured_at", "unknown_field")));
        assert!(fields.contains(&("/event", "invalid_length")));
        assert!(fields.contains(&("/user_id", "invalid_type")));
        assert!(fields.contains(&("/properties", "invalid_type")));
        assert!(fields.contains(&("/occurred_at", "required")));
    }

    #[test]
    fn one_id_is_required() {
        let mut v = track();
        v.as_object_mut().unwrap().remove("user_id");
        let (_, errors) = run(v, Some(EventKind::Track));
        assert_eq!(errors[0].field, "/user_id");
        assert_eq!(errors[0].code, "required");
    }

    #[test]
    fn time_bounds() {
        let mut v = track();
        v["occurred_at"] = json!("2026-12-01T12:00:01Z");
        let (_, errors) = run(v, Some(EventKind::Track));
        assert_eq!(errors[0].code, "occurred_at_in_future");

        let mut v = track();
        v["occurred_at"] = json!("2026-12-01T11:59:59Z");
        assert!(run(v, Some(EventKind::Track)).1.is_empty());

        let mut v = track();
        v["occurred_at"] = json!("2025-10-30T11:59:59Z");
        let (_, errors) = run(v, Some(EventKind::Track));
        assert_eq!(errors[0].code, "occurred_at_out_of_retention");

        let mut v = track();
        v["occurred_at"] = json!("2026-11-30T10:00:00");
        let (_, errors) = run(v, Some(EventKind::Track));
        assert_eq!(errors[0].code, "invalid_timestamp");
    }

    #[test]
    fn batch_items_need_a_type_and_endpoints_check_it() {
        let (_, errors) = run(track(), None);
        assert_eq!(errors[0].field, "/type");
        let mut v = track();
        v["type"] = json!("identify");
        let (_, errors) = run(v, Some(EventKind::Track));
        assert_eq!(errors[0].code, "invalid_value");
        let mut v = track();
        v["type"] = json!("track");
        assert!(run(v, None).1.is_empty());
    }

    #[test]
    fn identify_takes_traits_not_event() {
        let (ev, errors) = run(
            json!({"user_id": "u", "anonymous_id": "a", "traits": {"plan": "pro"},
                   "occurred_at": "2026-11-30T10:00:00Z", "idempotency_key": "k"}),
            Some(EventKind::Identify),
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(ev.unwrap().properties["plan"], "pro");
        let (_, errors) = run(
            json!({"user_id": "u", "event": "x", "occurred_at": "2026-11-30T10:00:00Z", "idempotency_key": "k"}),
            Some(EventKind::Identify),
        );
        assert_eq!(errors[0].field, "/event");
    }

    #[test]
    fn fingerprint_ignores_key_order_and_sent_at_but_not_content() {
        let (a, _) = run(track(), Some(EventKind::Track));
        let mut reordered = json!({
            "idempotency_key": "k1",
            "occurred_at": "2026-11-30T08:00:00.123456Z",
            "properties": {"items": [1, 2], "total": 12.5},
            "user_id": "u1",
            "event": "Order Completed",
            "sent_at": "2026-11-30T12:00:00Z"
        });
        let (b, errors) = run(reordered.clone(), Some(EventKind::Track));
        assert!(errors.is_empty());
        assert_eq!(fingerprint(&a.unwrap()), fingerprint(&b.unwrap()));
        reordered["properties"]["total"] = json!(13);
        let (c, _) = run(reordered, Some(EventKind::Track));
        let (a, _) = run(track(), Some(EventKind::Track));
        assert_ne!(fingerprint(&a.unwrap()), fingerprint(&c.unwrap()));
    }

    #[test]
    fn control_characters_are_refused_in_identifiers_only() {
        for (field, value) in [
            ("user_id", "u\u{1}"),
            ("idempotency_key", "k\n2"),
            ("event", "Order\u{7f}"),
            ("anonymous_id", "a\u{85}"),
        ] {
            let mut v = track();
            v[field] = json!(value);
            let (ev, errors) = run(v, Some(EventKind::Track));
            assert!(ev.is_none(), "{field}");
            assert_eq!(errors[0].field, format!("/{field}"));
            assert_eq!(errors[0].code, "invalid_character");
        }
        let mut v = track();
        v["properties"] = json!({"note": "line 1\nline 2\u{1}", "tab\tname": 1});
        let (ev, errors) = run(v, Some(EventKind::Track));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(ev.unwrap().properties["note"], "line 1\nline 2\u{1}");
    }

    fn from_json(text: &str, index: Option<usize>) -> (Option<NewEvent>, Vec<FieldError>) {
        let mut errors = Vec::new();
        let ev = event_from_json(text.as_bytes(), None, index, &ctx(), &mut errors)
            .expect("well-formed JSON");
        (ev, errors)
    }

    #[test]
    fn the_edge_rule_names_places_by_pointer_in_batches() {
        let (ev, errors) = from_json(
            r#"{"type":"track","event":"E","user_id":"u","occurred_at":"2026-11-30T10:00:00Z",
                "idempotency_key":"k","properties":{"a":{"b\u0000":1},"n":123456789012345678901234567890}}"#,
            Some(3),
        );
        assert!(ev.is_none());
        let got: Vec<(&str, &str, Option<usize>)> = errors
            .iter()
            .map(|e| (e.field.as_str(), e.code, e.index))
            .collect();
        assert_eq!(
            got,
            vec![
                ("/batch/3/properties/a/b\u{0}", "invalid_character", Some(3)),
                ("/batch/3/properties/n", "invalid_number", Some(3)),
            ]
        );
        let mut errors = Vec::new();
        let dup = event_from_json(
            br#"{"type":"track","type":"identify"}"#,
            None,
            None,
            &ctx(),
            &mut errors,
        );
        assert!(
            dup.unwrap_err()
                .to_string()
                .contains("duplicate member name `type`")
        );
    }

    #[test]
    fn batch_envelopes_say_what_is_expected() {
        let shape = |body: &str| match batch_items(body.as_bytes()) {
            Err(EnvelopeError::Shape(f)) => (f.field, f.code),
            other => panic!("{body}: {other:?}"),
        };
        assert_eq!(shape("[]"), (String::new(), "invalid_type"));
        assert_eq!(shape("{}"), ("/batch".to_owned(), "required"));
        assert_eq!(
            shape(r#"{"batch":{}}"#),
            ("/batch".to_owned(), "invalid_type")
        );
        assert_eq!(
            shape(r#"{"batch":[],"x":1}"#),
            ("/x".to_owned(), "unknown_field")
        );
        assert!(matches!(
            batch_items(br#"{"batch":[],"batch":[]}"#),
            Err(EnvelopeError::Json(m)) if m.contains("duplicate")
        ));
        assert!(matches!(batch_items(b"{"), Err(EnvelopeError::Json(_))));
        let items = batch_items(br#"{"batch":[{"a":1}, 2]}"#).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[1].get(), "2");
    }

    #[test]
    fn leap_seconds_stay_in_their_second_and_month() {
        let t = parse_timestamp("2026-11-30T23:59:60Z").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-11-30T23:59:59.999999+00:00");
        let t = parse_timestamp("2026-12-01T00:59:60.5+01:00").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-12-01T00:59:59.999999+01:00");
        assert_eq!(
            t.with_timezone(&Utc).to_rfc3339(),
            "2026-11-30T23:59:59.999999+00:00"
        );
        let t = parse_timestamp("2026-11-30T23:59:59.123456789Z").unwrap();
        assert_eq!(t.timestamp_subsec_nanos(), 123_456_000);
    }

    mod boundaries {
        use super::super::*;
        use chrono::{Datelike, Timelike};
        use proptest::prelude::*;

        /// The stored instant (microseconds) and the partition month come
        /// from the same value: the month of the stored instant.
        fn consistent(t: DateTime<FixedOffset>) {
            use chrono::TimeZone;
            let utc = t.with_timezone(&Utc);
            let micros = utc.timestamp_micros();
            let stored = Utc.timestamp_micros(micros).single().unwrap();
            assert_eq!(stored, utc, "{t}");
            assert_eq!(
                (stored.year(), stored.month()),
                (utc.year(), utc.month()),
                "{t}"
            );
            assert!(t.nanosecond() < 1_000_000_000, "{t}");
            assert_eq!(t.nanosecond() % 1_000, 0, "{t}");
        }

        proptest! {
            #[test]
            fn every_month_boundary_with_leap_seconds_and_extreme_offsets(
                year in 2000i32..2040,
                month in 1u32..=12,
                offset_min in prop::sample::select(vec![-14 * 60, -12 * 60, -570, 0, 345, 14 * 60, 23 * 60 + 59, -(23 * 60 + 59)]),
                second in prop::sample::select(vec!["59", "60"]),
                frac in prop::sample::select(vec!["", ".5", ".999999", ".999999999", ".000000001"]),
                side in 0u8..3,
            ) {
                // The last second of the month in UTC, seen from `offset_min`.
                let month_end = Utc.with_ymd_and_hms(year, month, 1, 0, 0, 0).unwrap()
                    .checked_add_months(chrono::Months::new(1)).unwrap();
                let base = month_end - Duration::seconds(1) + Duration::seconds(i64::from(side) - 1);
                let offset = FixedOffset::east_opt(offset_min * 60).unwrap();
                let local = base.with_timezone(&offset);
                let text = format!(
                    "{}:{second}{frac}{}",
                    local.format("%Y-%m-%dT%H:%M"),
                    if offset_min == 0 { "Z".to_owned() } else { local.format("%:z").to_string() }
                );
                let t = parse_timestamp(&text).unwrap();
                consistent(t);
                // A leap second reads as the end of the second before it.
                if second == "60" {
                    prop_assert_eq!(t.second(), 59);
                    prop_assert_eq!(t.nanosecond(), 999_999_000);
                }
                prop_assert_eq!(t.offset().local_minus_utc(), offset_min * 60);
            }
        }
        use chrono::TimeZone;
    }
}
