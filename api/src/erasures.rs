//! Erasures: erasure requests (`POST /v1/core/erasures`, a job of kind
//! `erasure` whose result is a signed certificate) and suppressions (listed
//! and lifted). The request's rules are `fastack_core::erasure`'s, the same
//! for the CLI and the console; this file parses and answers.

use std::collections::BTreeMap;

use chrono::Utc;
use fastack_core::{
    domain::{Person, Subject, SubjectKind, Suppression, Window},
    erasure::ErasureRequest,
    validate::{FieldError, parse_timestamp},
};
use fastack_entities::ContactId;
use poem::web::Data;
use poem_openapi::{ApiResponse, Enum, Object, OpenApi, Tags, param::Query, payload::Json};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::{
    body::JsonBody,
    dto::Timestamp,
    gate::ApiKeyAuth,
    problem::{ApiError, ErasureErrors, Errors, FindErrors, ListErrors, ProblemCode},
    state::SharedState,
};

#[derive(Tags)]
enum Tag {
    /// Forget a person: erasure requests and suppressions.
    Privacy,
}

/// `POST /v1/core/erasures`. Name people by any of their identifiers: 1 to
/// 5,000 identifiers in all across `user_ids`, `anonymous_ids` and
/// `contact_ids` (more is `422 invalid_payload`, code
/// `too_many_identifiers`). Each resolves to its contact (merges followed)
/// and every identifier linked to it. Ids hold no control characters. No
/// string or member name in
/// `metadata` holds NUL or a lone surrogate, and numbers must be storable
/// exactly.
#[derive(Debug, Object)]
pub struct ErasureRequestBody {
    /// User ids (each 1–255 characters).
    #[oai(validator(max_items = 5000))]
    pub user_ids: Option<Vec<Identifier>>,
    /// Anonymous ids (each 1–255 characters).
    #[oai(validator(max_items = 5000))]
    pub anonymous_ids: Option<Vec<Identifier>>,
    /// Contact ids (UUIDs).
    #[oai(validator(max_items = 5000))]
    pub contact_ids: Option<Vec<Uuid>>,
    /// Also drop the people's future events (a suppression per identifier,
    /// until lifted with `DELETE /v1/core/suppressions`). Default false.
    pub suppress: Option<bool>,
    /// Erase only events with `occurred_at` at or after this instant (RFC
    /// 3339); with `from` or `to` the contact and its identities stay.
    pub from: Option<chrono::DateTime<chrono::FixedOffset>>,
    /// Erase only events with `occurred_at` before this instant; after
    /// `from` when both are given.
    pub to: Option<chrono::DateTime<chrono::FixedOffset>>,
    /// Copied to the job and its terminal event; `error` is reserved for
    /// failures (at most 16 KiB).
    pub metadata: Option<BTreeMap<String, Value>>,
}

/// A user or anonymous id in a list: a string of 1 to 255 characters (the
/// document says so for each item; the bytes are parsed by [`parse`]).
#[derive(Debug)]
pub struct Identifier(pub String);

impl poem_openapi::types::Type for Identifier {
    const IS_REQUIRED: bool = true;
    type RawValueType = String;
    type RawElementValueType = String;

    fn name() -> std::borrow::Cow<'static, str> {
        "string(identifier)".into()
    }

    fn schema_ref() -> poem_openapi::registry::MetaSchemaRef {
        poem_openapi::registry::MetaSchemaRef::Inline(Box::new(
            poem_openapi::registry::MetaSchema {
                min_length: Some(1),
                max_length: Some(255),
                ..poem_openapi::registry::MetaSchema::new("string")
            },
        ))
    }

    fn as_raw_value(&self) -> Option<&String> {
        Some(&self.0)
    }

    fn raw_element_iter<'a>(&'a self) -> Box<dyn Iterator<Item = &'a String> + 'a> {
        Box::new(std::iter::once(&self.0))
    }
}

impl poem_openapi::types::ParseFromJSON for Identifier {
    fn parse_from_json(value: Option<Value>) -> poem_openapi::types::ParseResult<Self> {
        String::parse_from_json(value)
            .map(Identifier)
            .map_err(poem_openapi::types::ParseError::propagate)
    }
}

impl poem_openapi::types::ToJSON for Identifier {
    fn to_json(&self) -> Option<Value> {
        Some(Value::String(self.0.clone()))
    }
}

#[derive(Debug, Object)]
pub struct ErasureAccepted {
    /// The erasure's job: `GET /v1/core/jobs/{job_id}`, `job.completed`
    /// carries its certificate.
    pub job_id: Uuid,
}

#[derive(ApiResponse)]
pub enum ErasureCreated {
    /// Queued. Events of these people accepted before this answer are
    /// erased too; until the job ends, processing drops their events.
    #[oai(status = 202)]
    Accepted(Json<ErasureAccepted>),
}

/// An identifier's kind.
#[derive(Clone, Copy, Debug, Enum)]
#[oai(rename_all = "snake_case")]
pub enum SubjectKindOut {
    UserId,
    AnonymousId,
    ContactId,
}

impl From<SubjectKind> for SubjectKindOut {
    fn from(k: SubjectKind) -> Self {
        match k {
            SubjectKind::UserId => SubjectKindOut::UserId,
            SubjectKind::AnonymousId => SubjectKindOut::AnonymousId,
            SubjectKind::ContactId => SubjectKindOut::ContactId,
        }
    }
}

/// An identifier as fastack keeps it after an erasure: its kind and the
/// lowercase hex SHA-256 of its UTF-8 value (a contact id in its
/// hyphenated lowercase form).
#[derive(Debug, Object)]
pub struct SubjectOut {
    pub kind: SubjectKindOut,
    pub sha256: String,
}

/// A suppressed identifier: processing drops its events.
#[derive(Debug, Object)]
pub struct SuppressionOut {
    pub kind: SubjectKindOut,
    pub sha256: String,
    /// The erasure that set it.
    pub request_id: Uuid,
    pub created_at: Timestamp,
    /// Events of the identifier dropped since.
    pub dropped: i64,
}

impl From<Suppression> for SuppressionOut {
    fn from(s: Suppression) -> Self {
        SuppressionOut {
            kind: s.kind.into(),
            sha256: s.sha256,
            request_id: s.request_id.0,
            created_at: Timestamp::of(&s.created_at),
            dropped: s.dropped,
        }
    }
}

#[derive(Debug, Object)]
pub struct SuppressionList {
    pub suppressions: Vec<SuppressionOut>,
}

/// The identifier whose suppression was lifted.
#[derive(Debug, Object)]
pub struct SuppressionLifted {
    pub lifted: SubjectOut,
}

/// The window of an erasure.
#[derive(Debug, Object)]
pub struct WindowOut {
    pub from: Option<String>,
    pub to: Option<String>,
}

#[derive(Debug, Object)]
pub struct EventsErased {
    pub events_removed: u64,
    /// `YYYY-MM` → events removed from that month's partition.
    pub by_month: BTreeMap<String, u64>,
}

#[derive(Debug, Object)]
pub struct InboxErased {
    /// Accepted events of the people that processing dropped before they
    /// were stored or sent.
    pub events_dropped: u64,
}

#[derive(Debug, Object)]
pub struct ContactsErased {
    pub contacts_removed: u64,
    pub identities_removed: u64,
    /// With a window (the contact stays): traits an erased `identify` had
    /// set, removed where the contact still held them.
    pub traits_removed: u64,
}

#[derive(Debug, Object)]
pub struct QuarantineErased {
    pub events_dropped: u64,
}

#[derive(Debug, Object)]
pub struct OutboxErased {
    /// Rows owed to RabbitMQ or the lake that will not be sent.
    pub rows_cancelled: u64,
    /// Grouped rows (the lake's) written again without the people.
    pub rows_rewritten: u64,
    pub events_removed: u64,
}

#[derive(Debug, Object)]
pub struct WebhooksErased {
    /// Pending deliveries of the people's events that will not be sent.
    pub deliveries_cancelled: u64,
    /// Deliveries whose stored payload was removed (the attempts stay).
    pub payloads_scrubbed: u64,
}

/// One object written again without the people.
#[derive(Debug, Object)]
pub struct ObjectErased {
    /// The archive's object key (archives).
    pub path: Option<String>,
    /// The export's job id (exports).
    pub job_id: Option<String>,
    pub events_removed: u64,
    /// Rows left in it.
    pub rows: u64,
    /// SHA-256 of the archive's new uncompressed content (as its new
    /// manifest says).
    pub sha256: Option<String>,
    /// The export result's new HMAC.
    pub hmac: Option<String>,
}

#[derive(Debug, Object)]
pub struct ArchivesErased {
    pub objects_rewritten: u64,
    pub events_removed: u64,
    pub objects: Vec<ObjectErased>,
}

#[derive(Debug, Object)]
pub struct ExportsErased {
    pub results_rewritten: u64,
    pub events_removed: u64,
    pub jobs: Vec<ObjectErased>,
}

#[derive(Debug, Object)]
pub struct LakeErased {
    pub files_rewritten: u64,
    pub files_removed: u64,
    pub events_removed: u64,
    /// The version of the tenant's Delta table whose commit replaced the
    /// files: no readable version from it on holds the person, and the
    /// versions before it name files that are deleted. Absent when no file
    /// of the table held the person.
    pub table_version: Option<u64>,
}

/// What was removed, store by store: `archives` are retention archives
/// rewritten (their new manifest verified before the old object was
/// replaced), `exports` stored export results rewritten (their job's result
/// names the erasure in `erasures`), `lake` the Parquet lake (absent when
/// the mirror is off).
#[derive(Debug, Object)]
pub struct ErasureStores {
    pub tracked_events: EventsErased,
    pub inbox: InboxErased,
    pub contacts: ContactsErased,
    pub quarantine: QuarantineErased,
    pub outbox: OutboxErased,
    pub webhooks: WebhooksErased,
    pub archives: ArchivesErased,
    pub exports: ExportsErased,
    pub lake: Option<LakeErased>,
}

/// The verification pass: every store looked at again after the work.
#[derive(Debug, Object)]
pub struct ErasureVerification {
    pub checked_at: String,
    /// Records of the people found (always 0 in a certificate: an erasure
    /// that still finds some fails).
    pub found: u64,
    pub stores: Vec<String>,
}

/// The result of a completed erasure: a certificate of what was removed and
/// of the verification pass, signed with HMAC-SHA256 under the tenant's
/// external HMAC key (`fastack keys external-hmac --tenant …`) over the
/// certificate's JSON without `hmac` and `integrity`, keys sorted, no
/// whitespace.
#[derive(Debug, Object)]
pub struct ErasureCertificate {
    pub request_id: Uuid,
    pub tenant_id: Uuid,
    /// Every identifier erased, hashed.
    pub subjects: Vec<SubjectOut>,
    pub window: Option<WindowOut>,
    pub suppressed: bool,
    pub stores: ErasureStores,
    pub verification: ErasureVerification,
    pub hmac: String,
    pub integrity: crate::dto::JobIntegrity,
}

const MAX_METADATA_BYTES: usize = 16 * 1024;

fn field(field: String, code: &'static str, message: impl Into<String>) -> FieldError {
    FieldError {
        field,
        index: None,
        code,
        message: message.into(),
    }
}

/// A request body as a request, every problem named.
pub(crate) fn parse(bytes: &[u8]) -> Result<(ErasureRequest, Map<String, Value>), ApiError> {
    let value = crate::body::json_value(bytes)?;
    let Value::Object(mut obj) = value else {
        return Err(ApiError::validation(vec![field(
            String::new(),
            "invalid_type",
            "expected an object",
        )]));
    };
    let mut errors = Vec::new();
    let list = |name: &str, obj: &mut Map<String, Value>, errors: &mut Vec<FieldError>| match obj
        .remove(name)
    {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .filter_map(|(i, v)| match v {
                Value::String(s) => Some(s),
                _ => {
                    errors.push(field(
                        format!("/{name}/{i}"),
                        "invalid_type",
                        format!("each of `{name}` must be a string"),
                    ));
                    None
                }
            })
            .collect(),
        Some(_) => {
            errors.push(field(
                format!("/{name}"),
                "invalid_type",
                format!("`{name}` must be an array of strings"),
            ));
            Vec::new()
        }
    };
    let user_ids = list("user_ids", &mut obj, &mut errors);
    let anonymous_ids = list("anonymous_ids", &mut obj, &mut errors);
    let contacts = list("contact_ids", &mut obj, &mut errors);
    let mut contact_ids = Vec::with_capacity(contacts.len());
    for (i, c) in contacts.iter().enumerate() {
        match c.parse::<Uuid>() {
            Ok(id) => contact_ids.push(ContactId(id)),
            Err(_) => errors.push(field(
                format!("/contact_ids/{i}"),
                "invalid_value",
                "each of `contact_ids` must be a contact id (a UUID)",
            )),
        }
    }
    let suppress = match obj.remove("suppress") {
        None => false,
        Some(Value::Bool(b)) => b,
        Some(_) => {
            errors.push(field(
                "/suppress".to_owned(),
                "invalid_type",
                "`suppress` must be true or false",
            ));
            false
        }
    };
    // `null` is refused as the document says (the type, or absent).
    let mut time = |name: &str, errors: &mut Vec<FieldError>| match obj.remove(name) {
        None => None,
        Some(Value::String(s)) => match parse_timestamp(&s) {
            Some(t) => Some(t.with_timezone(&Utc)),
            None => {
                errors.push(field(
                    format!("/{name}"),
                    "invalid_timestamp",
                    format!("`{name}` must be RFC 3339 with an offset"),
                ));
                None
            }
        },
        Some(_) => {
            errors.push(field(
                format!("/{name}"),
                "invalid_type",
                format!("`{name}` must be a string"),
            ));
            None
        }
    };
    let window = Window {
        from: time("from", &mut errors),
        to: time("to", &mut errors),
    };
    let metadata = match obj.remove("metadata") {
        None => Map::new(),
        Some(Value::Object(m)) => {
            if serde_json::to_vec(&m).map_or(0, |b| b.len()) > MAX_METADATA_BYTES {
                errors.push(field(
                    "/metadata".to_owned(),
                    "invalid_length",
                    "`metadata` may be at most 16 KiB",
                ));
            }
            m
        }
        Some(_) => {
            errors.push(field(
                "/metadata".to_owned(),
                "invalid_type",
                "`metadata` must be an object",
            ));
            Map::new()
        }
    };
    let mut unknown: Vec<String> = obj.keys().cloned().collect();
    unknown.sort();
    for f in unknown {
        errors.push(field(
            format!("/{f}"),
            "unknown_field",
            format!("unknown field `{f}`"),
        ));
    }
    let req = ErasureRequest {
        people: Person {
            user_ids,
            anonymous_ids,
            contact_ids,
        },
        window,
        suppress,
    };
    if errors.is_empty() {
        errors = req.check();
    }
    if !errors.is_empty() {
        return Err(ApiError::validation(errors));
    }
    Ok((req, metadata))
}

/// The one identifier a suppression query names.
pub(crate) fn named(
    user_id: Option<String>,
    anonymous_id: Option<String>,
) -> Result<Subject, ApiError> {
    match (user_id, anonymous_id) {
        (Some(u), None) => Ok(Subject::of(SubjectKind::UserId, &u)),
        (None, Some(a)) => Ok(Subject::of(SubjectKind::AnonymousId, &a)),
        _ => Err(ApiError::bad_request(
            ProblemCode::InvalidQuery,
            "give exactly one of `user_id` or `anonymous_id`",
        )),
    }
}

pub struct ErasuresApi;

#[OpenApi]
impl ErasuresApi {
    /// Erase people
    ///
    /// Queues an erasure: the people named, every identifier linked to
    /// them, and their data in every store fastack keeps (events in every
    /// monthly partition, contacts and identities, retention archives and
    /// stored export results, the Parquet lake, events still owed to
    /// RabbitMQ or webhooks, stored webhook payloads, quarantine) are
    /// removed. With `from`/`to` only events that occurred in the window
    /// go and the contact stays. Events accepted before this answer are
    /// covered; a retry of an erased event with its idempotency key is
    /// answered as the duplicate it is and not stored again. A person
    /// fastack does not know completes with zero counts. The job ends in
    /// `job.completed` (its result is the certificate) or `job.failed`, and
    /// `core.contact.erased` tells downstream consumers (hashes only).
    /// Rules a schema cannot say: name at least one person, with 1 to
    /// 5,000 identifiers in all; `to` must be after `from`.
    #[oai(
        path = "/v1/core/erasures",
        method = "post",
        operation_id = "create_erasure",
        tag = "Tag::Privacy"
    )]
    async fn create_erasure(
        &self,
        state: Data<&SharedState>,
        auth: ApiKeyAuth,
        body: JsonBody<ErasureRequestBody>,
    ) -> Result<ErasureCreated, Errors<ErasureErrors>> {
        let (req, metadata) = parse(&body.bytes)?;
        let job = state
            .runtime
            .request_erasure(auth.0.shared.tenant().id, &req, metadata)
            .await?;
        Ok(ErasureCreated::Accepted(Json(ErasureAccepted {
            job_id: job.id.0,
        })))
    }

    /// List suppressions
    ///
    /// The tenant's suppressed identifiers (hashed), newest first; with
    /// `user_id` or `anonymous_id`, whether that one is suppressed. Rules a
    /// schema cannot say: to ask about one identifier, give exactly one of
    /// `user_id` or `anonymous_id`.
    #[oai(
        path = "/v1/core/suppressions",
        method = "get",
        operation_id = "list_suppressions",
        tag = "Tag::Privacy"
    )]
    async fn list_suppressions(
        &self,
        state: Data<&SharedState>,
        auth: ApiKeyAuth,
        /// Only this user id's suppression (not with `anonymous_id`).
        #[oai(validator(min_length = 1, max_length = 255))]
        user_id: Query<Option<String>>,
        /// Only this anonymous id's suppression (not with `user_id`).
        #[oai(validator(min_length = 1, max_length = 255))]
        anonymous_id: Query<Option<String>>,
        /// Page size, 1–1000 (default 100).
        #[oai(validator(minimum(value = "1"), maximum(value = "1000")))]
        limit: Query<Option<u32>>,
    ) -> Result<Json<SuppressionList>, Errors<ListErrors>> {
        let only = match (user_id.0, anonymous_id.0) {
            (None, None) => None,
            (u, a) => Some(named(u, a)?),
        };
        let list = state
            .runtime
            .suppressions(
                auth.0.shared.tenant().id,
                only.as_ref(),
                limit.0.unwrap_or(100),
            )
            .await?;
        Ok(Json(SuppressionList {
            suppressions: list.into_iter().map(SuppressionOut::from).collect(),
        }))
    }

    /// Lift a suppression
    ///
    /// The identifier's events are processed again from now on (those
    /// dropped meanwhile stay dropped). Give exactly one of `user_id` or
    /// `anonymous_id`; 404 when it is not suppressed.
    #[oai(
        path = "/v1/core/suppressions",
        method = "delete",
        operation_id = "lift_suppression",
        tag = "Tag::Privacy"
    )]
    async fn lift_suppression(
        &self,
        state: Data<&SharedState>,
        auth: ApiKeyAuth,
        /// The user id to lift (not with `anonymous_id`).
        #[oai(validator(min_length = 1, max_length = 255))]
        user_id: Query<Option<String>>,
        /// The anonymous id to lift (not with `user_id`).
        #[oai(validator(min_length = 1, max_length = 255))]
        anonymous_id: Query<Option<String>>,
    ) -> Result<Json<SuppressionLifted>, Errors<FindErrors>> {
        let subject = named(user_id.0, anonymous_id.0)?;
        if !state
            .runtime
            .lift_suppression(auth.0.shared.tenant().id, &subject)
            .await?
        {
            return Err(ApiError::not_found("suppression").into());
        }
        Ok(Json(SuppressionLifted {
            lifted: SubjectOut {
                kind: subject.kind.into(),
                sha256: subject.sha256,
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erasure_requests_are_validated() {
        let (r, m) = parse(
            br#"{"user_ids":["u-1"],"contact_ids":["0190d6f4-8b1e-7000-8000-000000000001"],
                "suppress":true,"from":"2026-11-01T10:00:00+01:00","metadata":{"ticket":"T-1"}}"#,
        )
        .unwrap();
        assert_eq!(r.people.user_ids, ["u-1"]);
        assert_eq!(r.people.contact_ids.len(), 1);
        assert!(r.suppress);
        assert_eq!(
            r.window.from.unwrap().to_rfc3339(),
            "2026-11-01T09:00:00+00:00"
        );
        assert_eq!(m["ticket"], "T-1");
        let e = parse(br#"{"user_ids":["u",2],"contact_ids":["x"],"x":1}"#).unwrap_err();
        let fields: Vec<&str> = e.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["/user_ids/1", "/contact_ids/0", "/x"]);
        let e = parse(b"{}").unwrap_err();
        assert_eq!(e.errors[0].code, "required");
        assert!(parse(b"[]").is_err());
    }
}
