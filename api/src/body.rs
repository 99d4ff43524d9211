//! The request body extractor of the JSON endpoints: `application/json`
//! only (415 otherwise), bytes under the 4 MiB request limit, read within
//! the body timeout (408 otherwise), documented in OpenAPI with the schema
//! of `T`, parsed and validated by the handler (so every problem has a
//! typed answer).

use std::marker::PhantomData;

use bytes::Bytes;
use fastack_core::{
    json::{parse_strict, unstorable},
    validate::{FieldError, MAX_REQUEST_BYTES},
};
use poem::{
    Request, RequestBody,
    error::ReadBodyError,
    http::{StatusCode, header},
};
use poem_openapi::{
    ApiExtractor, ApiExtractorType, ExtractParamOptions,
    registry::{MetaMediaType, MetaRequest, Registry},
    types::Type,
};
use serde_json::Value;

use crate::{
    problem::{ApiError, ProblemCode},
    state::SharedState,
};

pub struct JsonBody<T> {
    pub bytes: Bytes,
    _schema: PhantomData<T>,
}

/// A JSON body as a value, under the edge's rules: storable text (422
/// naming each place), then no repeated member names (400).
pub fn json_value(bytes: &[u8]) -> Result<Value, ApiError> {
    let findings = unstorable(bytes);
    if !findings.is_empty() {
        return Err(ApiError::validation(
            findings
                .into_iter()
                .map(|f| FieldError {
                    field: f.pointer,
                    index: None,
                    code: f.problem.code(),
                    message: f.problem.message().to_owned(),
                })
                .collect(),
        ));
    }
    parse_strict(bytes)
        .map_err(|e| ApiError::invalid_json(format!("request body is not valid JSON: {e}")))
}

/// Whether a `content-type` names JSON: `application/json`, parameters
/// such as `charset=utf-8` allowed.
pub fn is_json(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
    })
}

impl<'a, T: Type + Send> ApiExtractor<'a> for JsonBody<T> {
    const TYPES: &'static [ApiExtractorType] = &[ApiExtractorType::RequestObject];
    type ParamType = ();
    type ParamRawType = ();

    fn register(registry: &mut Registry) {
        T::register(registry);
    }

    fn request_meta() -> Option<MetaRequest> {
        Some(MetaRequest {
            description: None,
            content: vec![MetaMediaType {
                content_type: "application/json",
                schema: T::schema_ref(),
            }],
            required: true,
        })
    }

    async fn from_request(
        request: &'a Request,
        body: &mut RequestBody,
        _param_opts: ExtractParamOptions<Self::ParamType>,
    ) -> poem::Result<Self> {
        let content_type = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        if !is_json(content_type) {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ProblemCode::UnsupportedMediaType,
                format!(
                    "the body must be sent as `content-type: application/json` (got {})",
                    content_type.map_or("none".to_owned(), |c| format!("`{c}`"))
                ),
            )
            .into());
        }
        // A compressed body would read as invalid JSON: say what is wrong.
        if let Some(encoding) = request
            .headers()
            .get(header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.trim().eq_ignore_ascii_case("identity"))
        {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ProblemCode::UnsupportedMediaType,
                format!(
                    "compressed bodies are not accepted (got `content-encoding: {encoding}`); send the JSON as is"
                ),
            )
            .into());
        }
        let too_large = || {
            ApiError::payload_too_large(format!("request body is over {} bytes", MAX_REQUEST_BYTES))
        };
        let timeout = request
            .data::<SharedState>()
            .map_or(std::time::Duration::from_secs(30), |s| {
                s.config.body_timeout
            });
        let timed_out = || {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                ProblemCode::RequestTimeout,
                format!(
                    "the body was not received within {} s",
                    timeout.as_secs_f64()
                ),
            )
        };
        let declared = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|len| len > MAX_REQUEST_BYTES) {
            // Refused unread: the listener reads a moderately oversized
            // body before the 413 goes out (the client sees the answer, not
            // a reset) and closes the connection after a huge one.
            return Err(too_large().into());
        }
        let bytes = tokio::time::timeout(timeout, body.take()?.into_bytes_limit(MAX_REQUEST_BYTES))
            .await
            .map_err(|_| timed_out())?
            .map_err(|e| match e {
                ReadBodyError::PayloadTooLarge => too_large(),
                other => ApiError::bad_request(
                    ProblemCode::InvalidRequest,
                    format!("could not read the body: {other}"),
                ),
            })?;
        if bytes.is_empty() {
            return Err(ApiError::invalid_json("request body is empty").into());
        }
        Ok(JsonBody {
            bytes,
            _schema: PhantomData,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_json_media_types() {
        assert!(is_json(Some("application/json")));
        assert!(is_json(Some("Application/JSON; charset=utf-8")));
        assert!(!is_json(Some("text/plain")));
        assert!(!is_json(Some("application/x-www-form-urlencoded")));
        assert!(!is_json(Some("application/jsonx")));
        assert!(!is_json(None));
    }
}
