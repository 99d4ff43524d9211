//! The front door: `POST /v1/core/track`, `identify` and `batch` answered
//! before the router. The gate (key, tenant, rate limit) and `observe`
//! (metrics) still wrap them; what is skipped is the generic route layers
//! the profile showed on every accepted event: the nested routes' radix
//! tree, poem-openapi's extractors (the bearer header parsed a second time,
//! the data lookups) and the answer built as a `serde_json::Value` then
//! serialised. The body is read by the same [`read_json`] as every JSON
//! endpoint, the events accepted by the same [`Operation::accept`], and the
//! OpenAPI document still describes these operations from `routes.rs`.

use bytes::{BufMut, Bytes, BytesMut};
use poem::{
    Endpoint, IntoResponse, Request, Response,
    http::{HeaderValue, Method, StatusCode, header},
};

use crate::{
    body::read_json,
    dto::Ack,
    gate::Authed,
    ingest::Operation,
    problem::{ApiError, ProblemCode},
    state::SharedState,
};

/// Serves the ingest operations itself and hands every other request to
/// `rest` (the router).
pub struct FrontDoor<E> {
    pub rest: E,
}

impl<E: Endpoint> Endpoint for FrontDoor<E> {
    type Output = Response;

    async fn call(&self, mut req: Request) -> poem::Result<Response> {
        if req.method() == Method::POST
            && let Some(operation) = Operation::of(req.uri().path())
        {
            return Ok(match answer(operation, &mut req).await {
                Ok(resp) => resp,
                Err(err) => err.into_response(),
            });
        }
        // Boxed: the router's future is twice the ingest answer's, and
        // every request's future (moved whole into its box) would carry it.
        Box::pin(self.rest.call(req))
            .await
            .map(IntoResponse::into_response)
    }
}

async fn answer(operation: Operation, req: &mut Request) -> Result<Response, ApiError> {
    // The gate put both there: an ingest request reaches this only
    // authenticated and within its limits.
    let auth = req
        .extensions_mut()
        .remove::<Authed>()
        .ok_or_else(|| ApiError::unauthorized("missing `Authorization: Bearer <api key>`"))?;
    let state = req.data::<SharedState>().cloned().ok_or_else(|| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ProblemCode::Internal,
            "the node's state is not installed",
        )
    })?;
    let body = req.take_body();
    let bytes = read_json(req, body).await?;
    let acks = operation.accept(&state, &auth, &bytes).await?;
    Ok(accepted(operation, &acks))
}

/// The `202`: `{"duplicate":…,"id":"…"}` for one event, `{"items":[…]}`
/// for a batch — the bytes the document's `Ack` / `BatchAck` serialise to
/// (members in name order), written into one buffer.
fn accepted(operation: Operation, acks: &[Ack]) -> Response {
    const ACK_LEN: usize =
        r#"{"duplicate":false,"id":"00000000-0000-0000-0000-000000000000"}"#.len();
    let mut out = BytesMut::with_capacity(16 + acks.len() * (ACK_LEN + 1));
    let batch = operation == Operation::Batch;
    if batch {
        out.put_slice(b"{\"items\":[");
    }
    for (i, ack) in acks.iter().enumerate() {
        if i > 0 {
            out.put_u8(b',');
        }
        out.put_slice(if ack.duplicate {
            b"{\"duplicate\":true,\"id\":\""
        } else {
            b"{\"duplicate\":false,\"id\":\""
        });
        let mut id = uuid::Uuid::encode_buffer();
        out.put_slice(ack.id.hyphenated().encode_lower(&mut id).as_bytes());
        out.put_slice(b"\"}");
    }
    if batch {
        out.put_slice(b"]}");
    }
    Response::builder()
        .status(StatusCode::ACCEPTED)
        .header(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        )
        .body(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use poem_openapi::types::ToJSON;

    use super::*;
    use crate::dto::BatchAck;

    fn ack(duplicate: bool) -> Ack {
        Ack {
            id: uuid::Uuid::now_v7(),
            duplicate,
        }
    }

    /// The hand-written answer is the bytes the document's types give.
    #[tokio::test]
    async fn the_answer_is_what_the_documented_types_serialise_to() {
        let one = ack(false);
        let resp = accepted(Operation::Track, std::slice::from_ref(&one));
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        assert_eq!(
            resp.headers()[header::CONTENT_TYPE],
            "application/json; charset=utf-8"
        );
        let body = resp.into_body().into_bytes().await.unwrap();
        assert_eq!(body, serde_json::to_vec(&one.to_json()).unwrap());

        let items = vec![ack(true), ack(false), ack(true)];
        let resp = accepted(Operation::Batch, &items);
        let body = resp.into_body().into_bytes().await.unwrap();
        let documented = BatchAck { items }.to_json().unwrap();
        assert_eq!(body, serde_json::to_vec(&documented).unwrap());
    }
}
