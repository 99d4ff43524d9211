//! Exports: requested through the tenant API as jobs (`/v1/core/jobs`), their
//! state, and the decrypted result. A terminal job's document is stored once, so
//! `GET /v1/core/jobs/{id}`, the AMQP body and the webhook body are the same
//! bytes.

use std::collections::BTreeMap;

use chrono::Utc;
use fastack_core::{
    export::{self, ExportParams},
    validate::{FieldError, parse_timestamp},
};
use fastack_entities::{Job, JobId, JobKind, JobStatus};
use poem::{IntoResponse, Response, http::StatusCode, web::Data};
use poem_openapi::{
    ApiResponse, Object, OpenApi, Tags,
    param::{Path, Query},
    payload::{Json, Payload},
    registry::{MetaMediaType, MetaResponse, MetaResponses, MetaSchemaRef, Registry},
    types::Type,
};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::{
    body::JsonBody,
    dto::JobIntegrity,
    gate::ApiKeyAuth,
    problem::{ApiError, Errors, ExportErrors, GetErrors, ListErrors, ProblemCode, ResultErrors},
    state::SharedState,
};

#[derive(Tags)]
enum Tag {
    /// Long work: exports, with one terminal event each.
    Jobs,
}

/// `POST /v1/core/exports`. No string or member name in `metadata` holds
/// NUL or a lone surrogate, and numbers must be storable exactly.
#[derive(Debug, Object)]
pub struct ExportRequest {
    /// Inclusive lower bound of `occurred_at` (RFC 3339).
    pub from: chrono::DateTime<chrono::FixedOffset>,
    /// Exclusive upper bound of `occurred_at`.
    pub to: chrono::DateTime<chrono::FixedOffset>,
    /// Only events with this name (1–200 characters; omit it for every
    /// event).
    #[oai(validator(min_length = 1, max_length = 200))]
    pub event: Option<String>,
    /// Copied to the job and its terminal event (e.g. `source`,
    /// `correlationId`); `error` is reserved for failures.
    pub metadata: Option<BTreeMap<String, Value>>,
}

#[derive(Debug, Object)]
pub struct ExportAccepted {
    pub job_id: Uuid,
}

#[derive(Debug, Object)]
pub struct JobProtection {
    pub encrypted: bool,
    pub applied_by: String,
    pub mode: String,
}

/// The result of a completed export (sizes describe the plaintext).
#[derive(Debug, Object)]
pub struct JobResult {
    /// Object key: `exports/<tenant>/<job_id>.ndjson`.
    pub path: String,
    pub size_bytes: u64,
    pub row_count: u64,
    /// `ndjson`
    pub format: String,
    /// HMAC-SHA256 of the plaintext with the tenant's external HMAC key
    /// (`fastack keys external-hmac --tenant …`).
    pub hmac: String,
    pub integrity: JobIntegrity,
    pub protection: JobProtection,
}

/// A completed job's result: an export's object, or an erasure's
/// certificate.
#[derive(Debug, poem_openapi::Union)]
#[oai(one_of)]
pub enum JobResultOut {
    Export(JobResult),
    Erasure(crate::erasures::ErasureCertificate),
}

/// A job. A failed job has no `result` and no `completed_at`; its
/// `metadata.error.message` says why (addresses redacted).
#[derive(Debug, Object)]
pub struct JobOut {
    pub job_id: Uuid,
    pub kind: JobKindOut,
    pub status: JobState,
    pub metadata: BTreeMap<String, Value>,
    pub result: Option<JobResultOut>,
    pub execution_time_ms: Option<i64>,
    pub created_at: crate::dto::Timestamp,
    pub completed_at: Option<crate::dto::Timestamp>,
}

#[derive(Debug, Object)]
pub struct JobList {
    pub jobs: Vec<JobOut>,
}

/// JSON sent as stored bytes, documented with the schema of `T`.
pub struct RawJson<T> {
    body: String,
    _schema: std::marker::PhantomData<T>,
}

impl<T> RawJson<T> {
    pub fn new(body: String) -> Self {
        RawJson {
            body,
            _schema: std::marker::PhantomData,
        }
    }
}

impl<T: Type + Send> Payload for RawJson<T> {
    const CONTENT_TYPE: &'static str = "application/json";

    fn schema_ref() -> MetaSchemaRef {
        T::schema_ref()
    }

    fn register(registry: &mut Registry) {
        T::register(registry);
    }
}

impl<T: Send> IntoResponse for RawJson<T> {
    fn into_response(self) -> Response {
        Response::builder()
            .content_type("application/json")
            .body(self.body)
    }
}

impl<T: Type + Send> ApiResponse for RawJson<T> {
    fn meta() -> MetaResponses {
        MetaResponses {
            responses: vec![MetaResponse {
                description: "",
                status: Some(200),
                status_range: None,
                content: vec![MetaMediaType {
                    content_type: "application/json",
                    schema: T::schema_ref(),
                }],
                headers: vec![],
            }],
        }
    }

    fn register(registry: &mut Registry) {
        T::register(registry);
    }
}

#[derive(ApiResponse)]
pub enum ExportCreated {
    /// Queued; follow it with `GET /v1/core/jobs/{job_id}`, a webhook or AMQP.
    #[oai(status = 202)]
    Accepted(Json<ExportAccepted>),
}

/// NDJSON bytes.
pub struct Ndjson(pub Vec<u8>);

impl Payload for Ndjson {
    const CONTENT_TYPE: &'static str = "application/x-ndjson";

    fn schema_ref() -> MetaSchemaRef {
        String::schema_ref()
    }
}

impl IntoResponse for Ndjson {
    fn into_response(self) -> Response {
        Response::builder()
            .content_type(Self::CONTENT_TYPE)
            .body(self.0)
    }
}

#[derive(ApiResponse)]
pub enum ExportResult {
    /// The decrypted export: one event per line, as `GET /v1/core/events`.
    #[oai(status = 200)]
    Ok(Ndjson),
}

const MAX_METADATA_BYTES: usize = 16 * 1024;

/// An error at body member `field` (a JSON pointer; `""`: the body).
fn field(field: &str, code: &'static str, message: impl Into<String>) -> FieldError {
    FieldError {
        field: if field.is_empty() {
            String::new()
        } else {
            format!("/{field}")
        },
        index: None,
        code,
        message: message.into(),
    }
}

/// Validates an export request the same way events are validated.
fn parse_export(bytes: &[u8]) -> Result<(ExportParams, Map<String, Value>), ApiError> {
    let value = crate::body::json_value(bytes)?;
    let Value::Object(mut obj) = value else {
        return Err(ApiError::validation(vec![field(
            "",
            "invalid_type",
            "expected an object",
        )]));
    };
    let mut errors = Vec::new();
    let time = |name: &str, obj: &mut Map<String, Value>, errors: &mut Vec<FieldError>| match obj
        .remove(name)
    {
        Some(Value::String(s)) => match parse_timestamp(&s) {
            Some(t) => Some(t.with_timezone(&Utc)),
            None => {
                errors.push(field(
                    name,
                    "invalid_timestamp",
                    format!("`{name}` must be RFC 3339 with an offset"),
                ));
                None
            }
        },
        None | Some(Value::Null) => {
            errors.push(field(name, "required", format!("`{name}` is required")));
            None
        }
        Some(_) => {
            errors.push(field(
                name,
                "invalid_type",
                format!("`{name}` must be a string"),
            ));
            None
        }
    };
    let from = time("from", &mut obj, &mut errors);
    let to = time("to", &mut obj, &mut errors);
    // `null` is refused as the document says (a string, or absent).
    let event = match obj.remove("event") {
        None => None,
        Some(Value::String(s)) if !s.is_empty() && s.chars().count() <= 200 => Some(s),
        Some(_) => {
            errors.push(field(
                "event",
                "invalid_value",
                "`event` must be a name of 1 to 200 characters",
            ));
            None
        }
    };
    let metadata = match obj.remove("metadata") {
        None => Map::new(),
        Some(Value::Object(m)) => {
            if serde_json::to_vec(&m).map_or(0, |b| b.len()) > MAX_METADATA_BYTES {
                errors.push(field(
                    "metadata",
                    "invalid_length",
                    "`metadata` may be at most 16 KiB",
                ));
            }
            m
        }
        Some(_) => {
            errors.push(field(
                "metadata",
                "invalid_type",
                "`metadata` must be an object",
            ));
            Map::new()
        }
    };
    let mut unknown: Vec<String> = obj.keys().cloned().collect();
    unknown.sort();
    for f in unknown {
        errors.push(field(&f, "unknown_field", format!("unknown field `{f}`")));
    }
    if let (Some(f), Some(t)) = (from, to)
        && f >= t
    {
        errors.push(field("to", "invalid_value", "`to` must be after `from`"));
    }
    if !errors.is_empty() {
        return Err(ApiError::validation(errors));
    }
    Ok((
        ExportParams {
            from: from.expect("checked"),
            to: to.expect("checked"),
            event,
        },
        metadata,
    ))
}

fn job_id(raw: &str) -> Result<JobId, ApiError> {
    raw.parse().map_err(|_| ApiError::not_found("job"))
}

pub struct ExportsApi;

/// What a job does: an `export` or an `erasure` requested through this
/// API, or a `retention` archive of a partition (the operator's).
#[derive(Clone, Copy, Debug, poem_openapi::Enum)]
#[oai(rename = "JobKind", rename_all = "lowercase")]
pub enum JobKindOut {
    Export,
    Erasure,
    Retention,
}

/// A job's state (and the `status` filter of the job list).
#[derive(Clone, Copy, Debug, poem_openapi::Enum)]
#[oai(rename_all = "lowercase")]
pub enum JobState {
    Queued,
    Processing,
    Completed,
    Failed,
}

impl From<JobState> for JobStatus {
    fn from(s: JobState) -> JobStatus {
        match s {
            JobState::Queued => JobStatus::Queued,
            JobState::Processing => JobStatus::Processing,
            JobState::Completed => JobStatus::Completed,
            JobState::Failed => JobStatus::Failed,
        }
    }
}

#[OpenApi]
impl ExportsApi {
    /// Export events
    ///
    /// Queues an export of the tenant's events in `[from, to)` as encrypted
    /// NDJSON. The job ends in exactly one terminal event, `job.completed`
    /// or `job.failed`. Rules a schema cannot say: `to` must be after
    /// `from`.
    #[oai(
        path = "/v1/core/exports",
        method = "post",
        operation_id = "create_export",
        tag = "Tag::Jobs"
    )]
    async fn create_export(
        &self,
        state: Data<&SharedState>,
        auth: ApiKeyAuth,
        body: JsonBody<ExportRequest>,
    ) -> Result<ExportCreated, Errors<ExportErrors>> {
        let (params, metadata) = parse_export(&body.bytes)?;
        let job = Job::queued(
            auth.0.shared.tenant().id,
            JobKind::Export,
            serde_json::to_value(&params).expect("params serialise"),
            metadata,
            state.clock.now(),
        );
        state.runtime.queue_job(&job).await?;
        Ok(ExportCreated::Accepted(Json(ExportAccepted {
            job_id: job.id.0,
        })))
    }

    /// Get a job
    ///
    /// The same document the terminal event carries (AMQP body, webhook body).
    #[oai(
        path = "/v1/core/jobs/:id",
        method = "get",
        operation_id = "get_job",
        tag = "Tag::Jobs"
    )]
    async fn get_job(
        &self,
        state: Data<&SharedState>,
        auth: ApiKeyAuth,
        id: Path<String>,
    ) -> Result<RawJson<JobOut>, Errors<GetErrors>> {
        let id = job_id(&id.0)?;
        let job = state
            .runtime
            .job(auth.0.shared.tenant().id, id)
            .await?
            .ok_or_else(|| ApiError::not_found("job"))?;
        Ok(RawJson::new(job.document()))
    }

    /// List jobs
    ///
    /// Newest first, at most `limit` (default 50, at most 500).
    #[oai(
        path = "/v1/core/jobs",
        method = "get",
        operation_id = "list_jobs",
        tag = "Tag::Jobs"
    )]
    async fn list_jobs(
        &self,
        state: Data<&SharedState>,
        auth: ApiKeyAuth,
        /// Only jobs in this state.
        status: Query<Option<JobState>>,
        /// Page size, 1–500 (default 50).
        #[oai(validator(minimum(value = "1"), maximum(value = "500")))]
        limit: Query<Option<u32>>,
    ) -> Result<RawJson<JobList>, Errors<ListErrors>> {
        let status = status.0.map(JobStatus::from);
        let limit = limit.0.unwrap_or(50);
        let jobs = state
            .runtime
            .list_jobs(auth.0.shared.tenant().id, status, limit)
            .await?;
        let docs: Vec<String> = jobs.iter().map(Job::document).collect();
        Ok(RawJson::new(format!("{{\"jobs\":[{}]}}", docs.join(","))))
    }

    /// Download an export
    ///
    /// The decrypted NDJSON of a completed export; its HMAC is checked before
    /// it is sent. `409 job_not_completed` until then.
    #[oai(
        path = "/v1/core/jobs/:id/result",
        method = "get",
        operation_id = "get_job_result",
        tag = "Tag::Jobs"
    )]
    async fn job_result(
        &self,
        state: Data<&SharedState>,
        auth: ApiKeyAuth,
        id: Path<String>,
    ) -> Result<ExportResult, Errors<ResultErrors>> {
        let id = job_id(&id.0)?;
        let tenant = auth.0.shared.tenant().id;
        let job = state
            .runtime
            .job(tenant, id)
            .await?
            .ok_or_else(|| ApiError::not_found("job"))?;
        let result = export::downloadable(&job)
            .map_err(|m| ApiError::new(StatusCode::CONFLICT, ProblemCode::JobNotCompleted, m))?;
        let plain = state.runtime.export_result(&job, result).await?;
        Ok(ExportResult::Ok(Ndjson(plain)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_requests_are_validated() {
        let (p, m) = parse_export(
            br#"{"from":"2026-11-01T00:00:00Z","to":"2026-12-01T00:00:00+01:00","metadata":{"source":"x"}}"#,
        )
        .unwrap();
        assert_eq!(p.to.to_rfc3339(), "2026-11-30T23:00:00+00:00");
        assert_eq!(m["source"], "x");
        let e =
            parse_export(br#"{"from":"2026-12-01T00:00:00Z","to":"2026-11-01T00:00:00Z","x":1}"#)
                .unwrap_err();
        let fields: Vec<&str> = e.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, vec!["/x", "/to"]);
        assert!(parse_export(b"[]").is_err());
    }
}
