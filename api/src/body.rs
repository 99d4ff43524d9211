//! The request body extractor of the JSON endpoints: `application/json`
//! only (415 otherwise), sent as is or compressed (`content-encoding:
//! gzip` or `zstd`; any other encoding 415), bytes under the 4 MiB request
//! limit once inflated (413 as soon as inflation passes it), read within
//! the body timeout (408 otherwise), documented in OpenAPI with the schema
//! of `T`, parsed and validated by the handler (so every problem has a
//! typed answer).

use std::marker::PhantomData;

use bytes::{Bytes, BytesMut};
use fastack_core::{
    json::{parse_strict, unstorable},
    validate::{FieldError, MAX_REQUEST_BYTES},
};
use futures::StreamExt;
use poem::{
    Body, Request, RequestBody,
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

/// Reads a JSON request's body under the edge's rules (the module's doc):
/// the extractor's work, and the front door's for the ingest routes.
pub async fn read_json(request: &Request, body: Body) -> Result<Bytes, ApiError> {
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
        ));
    }
    let encoding = Encoding::of(request)?;
    let too_large =
        || ApiError::payload_too_large(format!("request body is over {} bytes", MAX_REQUEST_BYTES));
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
        return Err(too_large());
    }
    let bytes = tokio::time::timeout(timeout, collect(body, MAX_REQUEST_BYTES, declared))
        .await
        .map_err(|_| timed_out())?
        .map_err(|e| match e {
            ReadBodyError::PayloadTooLarge => too_large(),
            other => ApiError::bad_request(
                ProblemCode::InvalidRequest,
                format!("could not read the body: {other}"),
            ),
        })?;
    let bytes = encoding.inflate(bytes)?;
    if bytes.is_empty() {
        return Err(ApiError::invalid_json("request body is empty"));
    }
    Ok(bytes)
}

/// A body's bytes, at most `limit` (`PayloadTooLarge` past it). The one
/// chunk a small body arrives in is kept as it is; a body in several chunks
/// is gathered once, into a buffer sized by its `content-length` when it
/// has one. (poem's `into_bytes_limit` copies each chunk through a 4 KiB
/// buffer that its future carries, and that future is moved whole into the
/// box of every request.)
async fn collect(
    body: Body,
    limit: usize,
    declared: Option<usize>,
) -> Result<Bytes, ReadBodyError> {
    let mut chunks = std::pin::pin!(body.into_bytes_stream());
    let mut first: Option<Bytes> = None;
    let mut gathered: Option<BytesMut> = None;
    let mut len = 0usize;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk?;
        len += chunk.len();
        if len > limit {
            return Err(ReadBodyError::PayloadTooLarge);
        }
        match (&mut gathered, first.take()) {
            (Some(buf), _) => buf.extend_from_slice(&chunk),
            (None, None) => first = Some(chunk),
            (None, Some(head)) => {
                let mut buf = BytesMut::with_capacity(declared.unwrap_or(0).clamp(len, limit));
                buf.extend_from_slice(&head);
                buf.extend_from_slice(&chunk);
                gathered = Some(buf);
            }
        }
    }
    Ok(match gathered {
        Some(buf) => buf.freeze(),
        None => first.unwrap_or_default(),
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
        Ok(JsonBody {
            bytes: read_json(request, body.take()?).await?,
            _schema: PhantomData,
        })
    }
}

/// A JSON body that may be left out (no `content-type` and no bytes):
/// `None`; otherwise read as [`JsonBody`].
pub struct MaybeJsonBody<T>(pub Option<JsonBody<T>>);

impl<'a, T: Type + Send> ApiExtractor<'a> for MaybeJsonBody<T> {
    const TYPES: &'static [ApiExtractorType] = &[ApiExtractorType::RequestObject];
    type ParamType = ();
    type ParamRawType = ();

    fn register(registry: &mut Registry) {
        T::register(registry);
    }

    fn request_meta() -> Option<MetaRequest> {
        JsonBody::<T>::request_meta().map(|m| MetaRequest {
            required: false,
            ..m
        })
    }

    async fn from_request(
        request: &'a Request,
        body: &mut RequestBody,
        param_opts: ExtractParamOptions<Self::ParamType>,
    ) -> poem::Result<Self> {
        let headers = request.headers();
        let empty = headers
            .get(header::CONTENT_LENGTH)
            .is_none_or(|v| v.as_bytes() == b"0")
            && !headers.contains_key(header::TRANSFER_ENCODING);
        if empty && !headers.contains_key(header::CONTENT_TYPE) {
            return Ok(MaybeJsonBody(None));
        }
        JsonBody::from_request(request, body, param_opts)
            .await
            .map(|b| MaybeJsonBody(Some(b)))
    }
}

/// How a request body is encoded (`content-encoding`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    Identity,
    Gzip,
    Zstd,
}

/// Largest zstd window a body may ask for (8 MiB): a frame may not make the
/// decoder allocate more than twice the body limit.
const ZSTD_WINDOW_LOG_MAX: u32 = 23;

impl Encoding {
    /// The request's encoding: absent or `identity` is the JSON as is;
    /// `gzip` (`x-gzip`) and `zstd` are inflated; anything else is a `415`
    /// naming what is accepted.
    pub fn of(request: &Request) -> Result<Encoding, ApiError> {
        let Some(value) = request.headers().get(header::CONTENT_ENCODING) else {
            return Ok(Encoding::Identity);
        };
        let name = value.to_str().unwrap_or("").trim();
        match name.to_ascii_lowercase().as_str() {
            "" | "identity" => Ok(Encoding::Identity),
            "gzip" | "x-gzip" => Ok(Encoding::Gzip),
            "zstd" => Ok(Encoding::Zstd),
            _ => Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ProblemCode::UnsupportedMediaType,
                format!(
                    "`content-encoding: {name}` is not accepted; send the JSON as is, or compressed with `gzip` or `zstd`"
                ),
            )),
        }
    }

    /// The body inflated, at most [`MAX_REQUEST_BYTES`]: inflation stops at
    /// the first byte past the limit (413), so a small body that would
    /// inflate to gigabytes costs no more memory than the limit. A stream
    /// that is not what it says is a `400 invalid_encoding`.
    pub fn inflate(self, body: Bytes) -> Result<Bytes, ApiError> {
        let read = match self {
            Encoding::Identity => return Ok(body),
            Encoding::Gzip => read_capped(flate2::read::MultiGzDecoder::new(&body[..]), body.len()),
            Encoding::Zstd => {
                zstd::stream::read::Decoder::with_buffer(&body[..]).and_then(|mut d| {
                    d.window_log_max(ZSTD_WINDOW_LOG_MAX)?;
                    read_capped(d, body.len())
                })
            }
        };
        let name = self.name();
        let out = read.map_err(|e| {
            ApiError::bad_request(
                ProblemCode::InvalidEncoding,
                format!("the body is not a valid {name} stream: {e}"),
            )
        })?;
        if out.len() > MAX_REQUEST_BYTES {
            return Err(ApiError::payload_too_large(format!(
                "request body is over {MAX_REQUEST_BYTES} bytes once inflated ({name})"
            )));
        }
        Ok(Bytes::from(out))
    }

    pub fn name(self) -> &'static str {
        match self {
            Encoding::Identity => "identity",
            Encoding::Gzip => "gzip",
            Encoding::Zstd => "zstd",
        }
    }
}

/// Reads `from` to its end or to one byte past [`MAX_REQUEST_BYTES`],
/// whichever comes first, into a buffer that never holds more than that
/// (`read_to_end` would double it to twice the limit).
fn read_capped(mut from: impl std::io::Read, wire: usize) -> std::io::Result<Vec<u8>> {
    let limit = MAX_REQUEST_BYTES + 1;
    // JSON usually inflates 5 to 20 times.
    let mut out = vec![0u8; (wire.saturating_mul(8)).clamp(16 << 10, limit)];
    let mut len = 0;
    loop {
        if len == out.len() {
            if len == limit {
                break;
            }
            out.resize((len * 2).min(limit), 0);
        }
        match from.read(&mut out[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    out.truncate(len);
    Ok(out)
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

    fn gzip(data: &[u8]) -> Bytes {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        Bytes::from(e.finish().unwrap())
    }

    #[test]
    fn inflates_what_it_is_told() {
        let json = br#"{"batch":[{"type":"track","event":"e"}]}"#;
        assert_eq!(Encoding::Gzip.inflate(gzip(json)).unwrap(), &json[..]);
        let z = Bytes::from(zstd::encode_all(&json[..], 3).unwrap());
        assert_eq!(Encoding::Zstd.inflate(z).unwrap(), &json[..]);
        // Two gzip members are one body, as `cat a.gz b.gz` is.
        let mut two = gzip(b"{\"a\":").to_vec();
        two.extend_from_slice(&gzip(b"1}"));
        assert_eq!(
            Encoding::Gzip.inflate(Bytes::from(two)).unwrap(),
            &b"{\"a\":1}"[..]
        );
    }

    #[test]
    fn stops_at_the_limit() {
        let exact = vec![b' '; MAX_REQUEST_BYTES];
        assert_eq!(
            Encoding::Gzip.inflate(gzip(&exact)).unwrap().len(),
            MAX_REQUEST_BYTES
        );
        let over = vec![b' '; MAX_REQUEST_BYTES + 1];
        let e = Encoding::Gzip.inflate(gzip(&over)).unwrap_err();
        assert_eq!(
            (e.status, e.code),
            (StatusCode::PAYLOAD_TOO_LARGE, ProblemCode::PayloadTooLarge)
        );
        let z = Bytes::from(zstd::encode_all(&over[..], 3).unwrap());
        let e = Encoding::Zstd.inflate(z).unwrap_err();
        assert_eq!(e.code, ProblemCode::PayloadTooLarge);
    }

    fn chunked(chunks: &[&'static [u8]]) -> Body {
        let items: Vec<Result<Bytes, std::io::Error>> =
            chunks.iter().map(|c| Ok(Bytes::from_static(c))).collect();
        Body::from_bytes_stream(futures::stream::iter(items))
    }

    #[tokio::test]
    async fn a_body_is_gathered_once_and_capped() {
        // One chunk: handed on as it came.
        let one = Bytes::from_static(b"{\"event\":\"a\"}");
        let got = collect(Body::from(one.clone()), 100, None).await.unwrap();
        assert_eq!(got.as_ptr(), one.as_ptr(), "a single chunk is not copied");
        // Several: in order, whatever `content-length` said.
        for declared in [None, Some(3), Some(11), Some(1 << 30)] {
            let got = collect(chunked(&[b"{\"a\"", b":", b"1}"]), 100, declared)
                .await
                .unwrap();
            assert_eq!(got, &b"{\"a\":1}"[..]);
        }
        assert_eq!(collect(Body::empty(), 100, None).await.unwrap(), &b""[..]);
        // The limit counts every chunk: exactly at it passes, one past fails.
        assert_eq!(
            collect(chunked(&[b"12345", b"67890"]), 10, None)
                .await
                .unwrap(),
            &b"1234567890"[..]
        );
        assert!(matches!(
            collect(chunked(&[b"12345", b"678901"]), 10, None).await,
            Err(ReadBodyError::PayloadTooLarge)
        ));
    }

    #[test]
    fn a_corrupt_stream_is_a_typed_400() {
        for (enc, body) in [
            (Encoding::Gzip, Bytes::from_static(b"{\"not\":\"gzip\"}")),
            (Encoding::Zstd, Bytes::from_static(b"{\"not\":\"zstd\"}")),
        ] {
            let e = enc.inflate(body).unwrap_err();
            assert_eq!(
                (e.status, e.code),
                (StatusCode::BAD_REQUEST, ProblemCode::InvalidEncoding)
            );
        }
        // Cut short: the stream ends before its trailer.
        let full = gzip(&vec![b'x'; 10_000]);
        let e = Encoding::Gzip
            .inflate(full.slice(..full.len() - 6))
            .unwrap_err();
        assert_eq!(e.code, ProblemCode::InvalidEncoding);
    }
}
