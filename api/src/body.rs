//! The request body extractor of the ingest endpoints: bytes under the 4 MiB
//! request limit, documented in OpenAPI with the schema of `T`, parsed and
//! validated by the handler (so every problem has a typed answer).

use std::marker::PhantomData;

use bytes::Bytes;
use fastack_core::validate::MAX_REQUEST_BYTES;
use poem::{Request, RequestBody, error::ReadBodyError};
use poem_openapi::{
    ApiExtractor, ApiExtractorType, ExtractParamOptions,
    registry::{MetaMediaType, MetaRequest, Registry},
    types::Type,
};
use tokio::io::AsyncReadExt;

use crate::problem::ApiError;

/// Oversized bodies up to this size are read to the end before the 413.
const DRAIN_LIMIT: usize = 4 * MAX_REQUEST_BYTES;

pub struct JsonBody<T> {
    pub bytes: Bytes,
    _schema: PhantomData<T>,
}

impl<T> JsonBody<T> {
    /// Parses the body as JSON; a syntax error is a 400 `invalid_json`.
    pub fn parse<V: serde::de::DeserializeOwned>(&self) -> Result<V, ApiError> {
        serde_json::from_slice(&self.bytes)
            .map_err(|e| ApiError::invalid_json(format!("request body is not valid JSON: {e}")))
    }
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
        let too_large = || {
            ApiError::payload_too_large(format!("request body is over {} bytes", MAX_REQUEST_BYTES))
        };
        let declared = request
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|len| len > MAX_REQUEST_BYTES) {
            // Read (and drop) a moderately oversized body so the client sees
            // the 413 instead of a connection reset; refuse huge ones at once.
            if declared.is_some_and(|len| len <= DRAIN_LIMIT) {
                let mut reader = body.take()?.into_async_read().take(DRAIN_LIMIT as u64);
                let _ = tokio::io::copy(&mut reader, &mut tokio::io::sink()).await;
            }
            return Err(too_large().into());
        }
        let bytes = body
            .take()?
            .into_bytes_limit(MAX_REQUEST_BYTES)
            .await
            .map_err(|e| match e {
                ReadBodyError::PayloadTooLarge => too_large(),
                other => ApiError::bad_request(
                    "invalid_request",
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
