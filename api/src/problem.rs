//! RFC 9457 problem documents. Every error the HTTP surface returns is one
//! of these, with a stable `code`; errors raised by poem or poem-openapi
//! themselves (bad query parameter, unknown route) are converted by
//! [`to_problem`] so that clients only ever parse one error shape.

use fastack_core::{ServiceError, validate::FieldError};
use poem::{IntoResponse, Response, error::ResponseError, http::StatusCode};
use poem_openapi::{
    ApiResponse, Enum, Object,
    registry::{MetaHeader, MetaMediaType, MetaResponse, MetaResponses, MetaSchemaRef, Registry},
    types::Type,
};
use serde::Serialize;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// Every `code` a problem answer can carry, on the tenant API and the admin
/// listener. The README's list and the OpenAPI `Problem.code` enum are
/// checked against it by a test, so the set stays complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Enum, Serialize)]
#[oai(rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum ProblemCode {
    Unauthorized,
    InvalidJson,
    InvalidPayload,
    InvalidQuery,
    InvalidRequest,
    InvalidEncoding,
    BatchTooLarge,
    PayloadTooLarge,
    UnsupportedMediaType,
    RequestTimeout,
    RateLimited,
    IdempotencyKeyConflict,
    OccurredAtInFuture,
    OccurredAtOutOfRetention,
    JobNotCompleted,
    NotFound,
    MethodNotAllowed,
    Conflict,
    InvalidEndpoint,
    InvalidPlan,
    SchemaViolation,
    UnplannedEvent,
    InvalidSignature,
    Unavailable,
    Internal,
}

impl ProblemCode {
    pub const ALL: [ProblemCode; 25] = [
        ProblemCode::Unauthorized,
        ProblemCode::InvalidJson,
        ProblemCode::InvalidPayload,
        ProblemCode::InvalidQuery,
        ProblemCode::InvalidRequest,
        ProblemCode::InvalidEncoding,
        ProblemCode::BatchTooLarge,
        ProblemCode::PayloadTooLarge,
        ProblemCode::UnsupportedMediaType,
        ProblemCode::RequestTimeout,
        ProblemCode::RateLimited,
        ProblemCode::IdempotencyKeyConflict,
        ProblemCode::OccurredAtInFuture,
        ProblemCode::OccurredAtOutOfRetention,
        ProblemCode::JobNotCompleted,
        ProblemCode::NotFound,
        ProblemCode::MethodNotAllowed,
        ProblemCode::Conflict,
        ProblemCode::InvalidEndpoint,
        ProblemCode::InvalidPlan,
        ProblemCode::SchemaViolation,
        ProblemCode::UnplannedEvent,
        ProblemCode::InvalidSignature,
        ProblemCode::Unavailable,
        ProblemCode::Internal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ProblemCode::Unauthorized => "unauthorized",
            ProblemCode::InvalidJson => "invalid_json",
            ProblemCode::InvalidPayload => "invalid_payload",
            ProblemCode::InvalidQuery => "invalid_query",
            ProblemCode::InvalidRequest => "invalid_request",
            ProblemCode::InvalidEncoding => "invalid_encoding",
            ProblemCode::BatchTooLarge => "batch_too_large",
            ProblemCode::PayloadTooLarge => "payload_too_large",
            ProblemCode::UnsupportedMediaType => "unsupported_media_type",
            ProblemCode::RequestTimeout => "request_timeout",
            ProblemCode::RateLimited => "rate_limited",
            ProblemCode::IdempotencyKeyConflict => "idempotency_key_conflict",
            ProblemCode::OccurredAtInFuture => "occurred_at_in_future",
            ProblemCode::OccurredAtOutOfRetention => "occurred_at_out_of_retention",
            ProblemCode::JobNotCompleted => "job_not_completed",
            ProblemCode::NotFound => "not_found",
            ProblemCode::MethodNotAllowed => "method_not_allowed",
            ProblemCode::Conflict => "conflict",
            ProblemCode::InvalidEndpoint => "invalid_endpoint",
            ProblemCode::InvalidPlan => "invalid_plan",
            ProblemCode::SchemaViolation => "schema_violation",
            ProblemCode::UnplannedEvent => "unplanned_event",
            ProblemCode::InvalidSignature => "invalid_signature",
            ProblemCode::Unavailable => "unavailable",
            ProblemCode::Internal => "internal",
        }
    }

    /// The code a lower layer's error names (unknown names are `internal`).
    pub fn parse(code: &str) -> ProblemCode {
        ProblemCode::ALL
            .into_iter()
            .find(|c| c.as_str() == code)
            .unwrap_or(ProblemCode::Internal)
    }
}

impl std::fmt::Display for ProblemCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One offending field of a request.
#[derive(Clone, Debug, Object, Serialize)]
pub struct ProblemField {
    /// Where: a JSON pointer into the request body (`/user_id`,
    /// `/properties/amount`, `/batch/3/occurred_at`; `""` is the body
    /// itself), or the name of a query parameter (`from`).
    pub field: String,
    /// Batch item index, for `/v1/core/batch`.
    #[oai(skip_serializing_if_is_none)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    /// Stable reason: `required`, `invalid_type`, `invalid_length`,
    /// `invalid_timestamp`, `invalid_character`, `invalid_number`,
    /// `unknown_field`, `occurred_at_in_future`, …
    pub code: String,
    pub message: String,
}

/// An RFC 9457 problem document.
#[derive(Clone, Debug, Object, Serialize)]
pub struct Problem {
    /// `urn:fastack:problem:<code>`
    #[oai(rename = "type")]
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    pub code: ProblemCode,
    /// Validation errors, one per offending field.
    #[oai(skip_serializing_if_is_none)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<Vec<ProblemField>>,
}

/// An error answer of the HTTP API (a response, not a failure of the node:
/// the crate's failures are [`crate::Error`]).
#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: ProblemCode,
    pub detail: String,
    pub errors: Vec<FieldError>,
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: ProblemCode, detail: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            detail: detail.into(),
            errors: Vec::new(),
            retry_after: None,
        }
    }

    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, ProblemCode::Unauthorized, detail)
    }

    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            ProblemCode::NotFound,
            format!("{what} not found"),
        )
    }

    pub fn invalid_json(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ProblemCode::InvalidJson, detail)
    }

    pub fn bad_request(code: ProblemCode, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, detail)
    }

    pub fn payload_too_large(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ProblemCode::PayloadTooLarge,
            detail,
        )
    }

    /// A `503`: nothing was done; retry after a second.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        let mut err = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ProblemCode::Unavailable,
            detail,
        );
        err.retry_after = Some(UNAVAILABLE_RETRY_AFTER_SECS);
        err
    }

    /// A 422 naming every offending field. When all errors share one of the
    /// time-bound codes, that code is the problem's code.
    pub fn validation(errors: Vec<FieldError>) -> Self {
        let code = match errors.first().map(|e| e.code) {
            Some(c @ ("occurred_at_in_future" | "occurred_at_out_of_retention"))
                if errors.iter().all(|e| e.code == c) =>
            {
                ProblemCode::parse(c)
            }
            _ => ProblemCode::InvalidPayload,
        };
        let detail = match errors.len() {
            1 => errors[0].message.clone(),
            n => format!("{n} problems in the request; see `errors`"),
        };
        ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code,
            detail,
            errors,
            retry_after: None,
        }
    }

    fn title(&self) -> &'static str {
        self.status.canonical_reason().unwrap_or("Error")
    }

    pub fn to_problem(&self) -> Problem {
        Problem {
            kind: format!("urn:fastack:problem:{}", self.code),
            title: self.title().to_owned(),
            status: self.status.as_u16(),
            detail: self.detail.clone(),
            code: self.code,
            errors: (!self.errors.is_empty()).then(|| {
                self.errors
                    .iter()
                    .map(|e| ProblemField {
                        field: e.field.clone(),
                        index: e.index,
                        code: e.code.to_owned(),
                        message: e.message.clone(),
                    })
                    .collect()
            }),
        }
    }

    /// Maps an error of a lower layer by what it says about itself.
    pub fn from_service<E: ServiceError + std::fmt::Display>(err: &E) -> Self {
        let status =
            StatusCode::from_u16(err.status_code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        // Internal details stay in the logs, not in the answer.
        let detail = if status.is_server_error() {
            tracing::warn!(error = %err, "request failed");
            "the service cannot complete this request right now; retry later".to_owned()
        } else {
            err.to_string()
        };
        let mut api = ApiError::new(status, ProblemCode::parse(err.error_code()), detail);
        if status == StatusCode::SERVICE_UNAVAILABLE {
            api.retry_after = Some(UNAVAILABLE_RETRY_AFTER_SECS);
        }
        api
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.detail)
    }
}

impl std::error::Error for ApiError {}

impl From<fastack_core::Error> for ApiError {
    fn from(err: fastack_core::Error) -> Self {
        ApiError::from_service(&err)
    }
}

impl From<fastack_actors::Error> for ApiError {
    fn from(err: fastack_actors::Error) -> Self {
        ApiError::from_service(&err)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.as_response()
    }
}

impl ResponseError for ApiError {
    fn status(&self) -> StatusCode {
        self.status
    }

    fn as_response(&self) -> Response {
        let body = serde_json::to_vec(&self.to_problem()).expect("problem serialises");
        let mut resp = Response::builder()
            .status(self.status)
            .content_type(PROBLEM_JSON)
            .body(body);
        if let Some(secs) = self.retry_after {
            resp.headers_mut().insert(
                "retry-after",
                secs.to_string().parse().expect("digits are a valid header"),
            );
        }
        resp
    }
}

/// One documented error answer of an operation.
type Answer = (u16, &'static str);

const BAD_JSON: Answer = (
    400,
    "Malformed JSON or a repeated member name (`invalid_json`), a batch over 500 items (`batch_too_large`), or a compressed body that does not inflate (`invalid_encoding`)",
);
const BAD_BODY: Answer = (
    400,
    "Malformed JSON or a repeated member name (`invalid_json`), or a compressed body that does not inflate (`invalid_encoding`)",
);
const BAD_QUERY: Answer = (
    400,
    "A query parameter is missing or invalid (`invalid_query`), each named in `errors`",
);
const UNAUTHORIZED: Answer = (401, "Missing, unknown or revoked API key (`unauthorized`)");
const NOT_FOUND: Answer = (404, "Not found, or not this tenant's (`not_found`)");
const TIMEOUT: Answer = (
    408,
    "The body did not arrive within the body timeout (`request_timeout`)",
);
const KEY_CONFLICT: Answer = (
    409,
    "Idempotency key reused with a different payload (`idempotency_key_conflict`)",
);
const NOT_COMPLETED: Answer = (
    409,
    "The job has not completed: no result to download (`job_not_completed`)",
);
const TOO_LARGE: Answer = (
    413,
    "Event over 32 KiB or request over 4 MiB, counted once inflated when compressed (`payload_too_large`)",
);
const MEDIA: Answer = (
    415,
    "The body is not `application/json`, or its `content-encoding` is not `identity`, `gzip` or `zstd` (`unsupported_media_type`)",
);
const INVALID: Answer = (
    422,
    "Invalid fields, each named in `errors` by a JSON pointer (`invalid_payload`, `occurred_at_in_future`, `occurred_at_out_of_retention`); NUL, lone surrogates (`invalid_character`) and numbers storage cannot keep exactly (`invalid_number`) included",
);
const INVALID_EVENT: Answer = (
    422,
    "Invalid fields, each named in `errors` by a JSON pointer (`invalid_payload`, `occurred_at_in_future`, `occurred_at_out_of_retention`; NUL, lone surrogates (`invalid_character`) and numbers storage cannot keep exactly (`invalid_number`) included), or the tenant's tracking plan refuses the request: properties or traits break their schema (`schema_violation`, each failed keyword in `errors`) or the event is not in the plan (`unplanned_event`)",
);
const RATE_LIMITED: Answer = (
    429,
    "Rate limited (`rate_limited`): the tenant's or key's rate, or too many requests without a valid key from one address; retry after `Retry-After` seconds",
);
const INTERNAL: Answer = (
    500,
    "An unexpected failure (`internal`); nothing of the request was accepted",
);
const UNAVAILABLE: Answer = (
    503,
    "Temporarily unavailable (`unavailable`): a dependency did not answer within the answer budget; nothing was accepted, retry after `Retry-After` seconds with the same idempotency keys",
);

const ADMIN_UNAUTHORIZED: Answer = (401, "Missing or wrong admin token (`unauthorized`)");
const ADMIN_CONFLICT: Answer = (409, "The name is taken (`conflict`)");
const ADMIN_INVALID: Answer = (
    422,
    "Refused: a field named in `errors` (`invalid_payload`), a webhook URL or event type (`invalid_endpoint`), or a tracking plan with the event and the schema error (`invalid_plan`)",
);

/// The answers of the admin listener's operations.
pub struct AdminErrors;
impl ErrorSet for AdminErrors {
    const ANSWERS: &'static [Answer] = &[
        BAD_BODY,
        ADMIN_UNAUTHORIZED,
        NOT_FOUND,
        ADMIN_CONFLICT,
        TOO_LARGE,
        MEDIA,
        ADMIN_INVALID,
        INTERNAL,
        UNAVAILABLE,
    ];
}

/// `Retry-After` of a `503`: a dependency is away, and a client that comes
/// back after a second finds it again or gets the next `503` just as fast.
pub const UNAVAILABLE_RETRY_AFTER_SECS: u64 = 1;

/// The error answers a group of operations can give, for the spec. What is
/// sent is always an [`ApiError`]'s problem document.
pub trait ErrorSet: Send + Sync + 'static {
    const ANSWERS: &'static [Answer];
}

/// The answers of every authenticated operation.
macro_rules! error_sets {
    ($($(#[$doc:meta])* $name:ident: [$($answer:ident),* $(,)?];)*) => {
        $(
            $(#[$doc])*
            pub struct $name;
            impl ErrorSet for $name {
                const ANSWERS: &'static [Answer] =
                    &[$($answer,)* UNAUTHORIZED, RATE_LIMITED, INTERNAL, UNAVAILABLE];
            }
        )*
    };
}

error_sets! {
    /// `track`, `identify`, `batch`.
    IngestErrors: [BAD_JSON, TIMEOUT, KEY_CONFLICT, TOO_LARGE, MEDIA, INVALID_EVENT];
    /// `POST /v1/core/exports`.
    ExportErrors: [BAD_BODY, TIMEOUT, TOO_LARGE, MEDIA, INVALID];
    ErasureErrors: [BAD_BODY, TIMEOUT, TOO_LARGE, MEDIA, INVALID];
    /// Lists read with query parameters.
    ListErrors: [BAD_QUERY];
    /// A contact found by one of its ids.
    FindErrors: [BAD_QUERY, NOT_FOUND];
    /// One record by its id.
    GetErrors: [NOT_FOUND];
    /// An export's file.
    ResultErrors: [NOT_FOUND, NOT_COMPLETED];
}

/// An [`ApiError`] documented as one of the answers of `S`.
pub struct Errors<S>(pub ApiError, std::marker::PhantomData<S>);

impl<S> From<ApiError> for Errors<S> {
    fn from(err: ApiError) -> Self {
        Errors(err, std::marker::PhantomData)
    }
}

impl<S> From<fastack_core::Error> for Errors<S> {
    fn from(err: fastack_core::Error) -> Self {
        ApiError::from(err).into()
    }
}

impl<S> From<Errors<S>> for poem::Error {
    fn from(err: Errors<S>) -> Self {
        err.0.into()
    }
}

fn header(name: &str, description: &str) -> MetaHeader {
    MetaHeader {
        name: name.to_owned(),
        description: Some(description.to_owned()),
        required: true,
        deprecated: false,
        schema: String::schema_ref(),
    }
}

fn retry_after_header() -> MetaHeader {
    header("Retry-After", "Seconds to wait before retrying.")
}

/// `Retry-After`, `RateLimit-Policy` and `RateLimit` on a 429.
fn rate_limit_headers() -> Vec<MetaHeader> {
    vec![
        retry_after_header(),
        header(
            "RateLimit-Policy",
            "The quota that refused the request: `q` requests (the burst) per `w` seconds.",
        ),
        header(
            "RateLimit",
            "What is left of the quota (`r`, here 0) and when it refills (`t`, seconds).",
        ),
    ]
}

impl<S: ErrorSet> ApiResponse for Errors<S> {
    fn meta() -> MetaResponses {
        MetaResponses {
            responses: S::ANSWERS
                .iter()
                .map(|&(status, description)| MetaResponse {
                    description,
                    status: Some(status),
                    status_range: None,
                    content: vec![MetaMediaType {
                        content_type: PROBLEM_JSON,
                        schema: MetaSchemaRef::Reference(Problem::name().into_owned()),
                    }],
                    headers: match status {
                        429 => rate_limit_headers(),
                        503 => vec![retry_after_header()],
                        _ => vec![],
                    },
                })
                .collect(),
        }
    }

    fn register(registry: &mut Registry) {
        Problem::register(registry);
    }
}

/// What a query parameter must be, in our words.
fn param_expects(name: &str) -> &'static str {
    match name {
        "from" | "to" => "an RFC 3339 instant with an offset, e.g. 2026-11-01T00:00:00Z",
        "limit" => "an integer within the page size range",
        "contact_id" => "a contact id (a UUID)",
        "cursor" => "the `next_cursor` of the previous page",
        "status" => "queued, processing, completed or failed",
        _ => "a valid value",
    }
}

/// The field code and message of a query parameter poem-openapi could not
/// read (missing, or not of its type), without the framework's wording.
fn param_problem(name: &str, reason: &str) -> (&'static str, String) {
    if reason.contains("expects an input value") {
        (
            "required",
            format!("`{name}` is required: {}", param_expects(name)),
        )
    } else if let Some(rule) = reason.strip_prefix("verification failed. ") {
        // A schema rule of the parameter: `maximum(1000, exclusive: false)`,
        // `minLength(1)`, …, said in words.
        let bound = rule
            .split(['(', ',', ')'])
            .nth(1)
            .unwrap_or_default()
            .trim();
        let what = match rule.split('(').next().unwrap_or_default() {
            "maximum" => format!("at most {bound}"),
            "minimum" => format!("at least {bound}"),
            "maxLength" => format!("at most {bound} characters"),
            "minLength" => format!("at least {bound} characters"),
            _ => rule.to_owned(),
        };
        ("invalid_value", format!("`{name}` must be {what}"))
    } else {
        (
            "invalid_value",
            format!("`{name}` is not valid: expected {}", param_expects(name)),
        )
    }
}

/// Converts any error that reached the top of the stack into a problem
/// response: ours keep their code; poem's get one from their status.
pub fn to_problem(err: poem::Error) -> Response {
    if let Some(api) = err.downcast_ref::<ApiError>() {
        return api.as_response();
    }
    if let Some(p) = err.downcast_ref::<poem_openapi::error::ParseParamError>() {
        let (code, message) = param_problem(p.name, &p.reason);
        let mut api = ApiError::bad_request(ProblemCode::InvalidQuery, message.clone());
        api.errors.push(FieldError {
            field: p.name.to_owned(),
            index: None,
            code,
            message,
        });
        return api.as_response();
    }
    let status = err.status();
    let code = match status {
        StatusCode::NOT_FOUND => ProblemCode::NotFound,
        StatusCode::METHOD_NOT_ALLOWED => ProblemCode::MethodNotAllowed,
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ProblemCode::UnsupportedMediaType,
        StatusCode::REQUEST_TIMEOUT => ProblemCode::RequestTimeout,
        StatusCode::PAYLOAD_TOO_LARGE => ProblemCode::PayloadTooLarge,
        StatusCode::UNAUTHORIZED => ProblemCode::Unauthorized,
        s if s.is_client_error() => ProblemCode::InvalidRequest,
        _ => ProblemCode::Internal,
    };
    let detail = if status.is_server_error() {
        tracing::error!(error = %err, "unhandled error");
        "internal error".to_owned()
    } else {
        err.to_string()
    };
    ApiError::new(status, code, detail).as_response()
}
