//! The front door's first two steps for every `/v1/` request: authenticate
//! the bearer API key (cached lookup) and apply the tenant's and the key's
//! rate limits. Every answer to an authenticated request carries the
//! `RateLimit-Policy` and `RateLimit` headers; a refusal is a 429 problem
//! with `Retry-After`.
//!
//! Rate limiting fails open: if Redis cannot be reached the request is let
//! through (and logged), so a cache outage never stops ingestion.
//!
//! Requests without a valid key draw on their client address's budget
//! (`FASTACK_UNAUTH_RPS`); an address that spent it gets 429 without a key
//! lookup. A refused request's body is left unread here: the listener reads
//! what a handler left before the answer goes out (`listener::Tracked`), so
//! a keep-alive client keeps its connection.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use fastack_actors::TenantShared;
use fastack_core::{
    auth::Principal,
    ratelimit::{Decision, Quota},
};
use poem::{
    Endpoint, IntoResponse, Request, Response,
    http::{HeaderValue, StatusCode},
};
use poem_openapi::{SecurityScheme, auth::Bearer};

use crate::{
    problem::{ApiError, ProblemCode, to_problem},
    state::SharedState,
};

/// An authenticated request's principal and its tenant's shared state.
#[derive(Clone)]
pub struct Authed {
    pub principal: Arc<Principal>,
    pub shared: Arc<TenantShared>,
    /// Time the gate spent on the request (key lookup, tenant, rate
    /// limit): it counts against the accept path's answer budget.
    pub gate_time: Duration,
}

/// Longest wait for the answer (its head: a download streams on) of a
/// `/v1/` request other than `track`, `identify` and `batch`: a read waits
/// out a slow database, but not an outage (then `503`).
pub const OTHER_ANSWER_WAIT: Duration = Duration::from_secs(30);

/// What the answer budget keeps back for the answer itself: the accept
/// path's deadline is this much before the budget's end.
pub const ANSWER_MARGIN: Duration = Duration::from_millis(150);

/// Waits for `work` until `deadline`; past it, a `503` that says nothing
/// was done (what `work` would have read or written is dropped with it).
pub async fn within<T>(
    deadline: Instant,
    what: &'static str,
    work: impl Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    match tokio::time::timeout_at(deadline.into(), work).await {
        Ok(done) => done,
        Err(_) => Err(ApiError::from(fastack_core::Error::Deadline(what))),
    }
}

/// Bearer API key (`Authorization: Bearer fsk_…`).
#[derive(SecurityScheme)]
#[oai(ty = "bearer", checker = "authed_by_gate")]
pub struct ApiKeyAuth(pub Authed);

async fn authed_by_gate(req: &Request, _bearer: Bearer) -> Option<Authed> {
    req.extensions().get::<Authed>().cloned()
}

/// The bearer token, or what is wrong with the `Authorization` header, in
/// words a caller can act on.
fn bearer(req: &Request) -> Result<&str, &'static str> {
    let Some(value) = req.headers().get("authorization") else {
        return Err("missing `Authorization: Bearer <api key>`");
    };
    let value = value
        .to_str()
        .map_err(|_| "the `Authorization` header is not readable text")?;
    match value.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => {
            let token = token.trim();
            if token.is_empty() {
                Err("the `Authorization` header has no key after `Bearer `")
            } else {
                Ok(token)
            }
        }
        Some(_) => Err("the `Authorization` header uses another scheme: send `Bearer <api key>`"),
        None if value.starts_with(fastack_core::auth::KEY_PREFIX) => Err(
            "the `Authorization` header carries a key without its scheme: send `Bearer <api key>`",
        ),
        None => Err("the `Authorization` header is not `Bearer <api key>`"),
    }
}

fn attach(resp: &mut Response, decision: &Decision) {
    let (policy, state) = decision.header_values();
    // Taken as they are (no copy); the values are ASCII by construction.
    let policy = HeaderValue::try_from(policy).expect("ascii header");
    let state = HeaderValue::try_from(state).expect("ascii header");
    resp.headers_mut().insert("ratelimit-policy", policy);
    resp.headers_mut().insert("ratelimit", state);
}

fn client_ip(req: &Request) -> Option<std::net::IpAddr> {
    req.remote_addr().as_socket_addr().map(|a| a.ip())
}

/// A 429 for an address over its unauthenticated budget.
fn too_many_unauthenticated(retry_after: u64) -> ApiError {
    let mut err = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        ProblemCode::RateLimited,
        format!(
            "too many requests without a valid API key from this address; retry after {retry_after} s"
        ),
    );
    err.retry_after = Some(retry_after);
    err
}

/// The answer to a request without a valid key: 401, or 429 once its
/// address has spent its budget.
fn refuse_unauthenticated(state: &SharedState, req: &Request, detail: &str) -> Response {
    let err = match client_ip(req).and_then(|ip| state.unauthenticated.charge(ip)) {
        Some(retry) => {
            state.metrics.refused("unauthenticated_limit");
            too_many_unauthenticated(retry)
        }
        None => ApiError::unauthorized(detail),
    };
    err.into_response()
}

/// Authentication and rate limiting in front of the `/v1/` routes.
pub async fn gate<E: Endpoint>(next: E, mut req: Request) -> poem::Result<Response> {
    if !req.uri().path().starts_with("/v1/") {
        // `GET /`: a browser (or a newcomer's curl) is sent to the docs; the
        // API's own router would answer 404 there.
        if req.uri().path() == "/"
            && matches!(
                *req.method(),
                poem::http::Method::GET | poem::http::Method::HEAD
            )
        {
            return Ok(poem::web::Redirect::see_other("/docs").into_response());
        }
        return next.call(req).await.map(IntoResponse::into_response);
    }
    let arrived = Instant::now();
    let state = req
        .data::<SharedState>()
        .cloned()
        .expect("app state is installed before the gate");
    // A lookup that waits on the database is bounded like an accept: a
    // request never waits out a database outage in the gate.
    let deadline = arrived + state.config.ingest_budget - ANSWER_MARGIN;
    let secret = match bearer(&req) {
        Ok(secret) => secret,
        Err(detail) => return Ok(refuse_unauthenticated(&state, &req, detail)),
    };
    let principal = match state.keys.cached(secret) {
        Some(Some(principal)) => Some(principal),
        known => {
            // Not known to be valid: an address that spent its budget on
            // bad keys gets no lookup.
            if let Some(retry) = client_ip(&req).and_then(|ip| state.unauthenticated.exhausted(ip))
            {
                state.metrics.refused("unauthenticated_limit");
                return Ok(too_many_unauthenticated(retry).into_response());
            }
            match known {
                Some(_) => None,
                // Boxed: a lookup is the rare case, and the gate's future
                // (copied whole into the box of every request) stays small.
                None => {
                    Box::pin(within(deadline, "the API key lookup", async {
                        state
                            .keys
                            .authenticate(secret)
                            .await
                            .map_err(ApiError::from)
                    }))
                    .await?
                }
            }
        }
    };
    let Some(principal) = principal else {
        return Ok(refuse_unauthenticated(
            &state,
            &req,
            "unknown or revoked API key",
        ));
    };
    let shared = match state.runtime.running_tenant(principal.tenant.id) {
        Some(shared) => shared,
        None => {
            Box::pin(within(deadline, "the tenant's start", async {
                state
                    .runtime
                    .tenant(&principal.tenant)
                    .await
                    .map_err(ApiError::from)
            }))
            .await?
        }
    };
    let tenant = shared.tenant();
    let limits = state.config.plans.get(tenant.plan);
    let tenant_q = Quota {
        rate_per_sec: limits.rate_per_sec,
        burst: limits.burst,
    };
    let key_q = principal.key_rate_limit.map(|rps| {
        (
            principal.key_id,
            Quota {
                rate_per_sec: rps,
                burst: rps,
            },
        )
    });
    let decision = state.runtime.rate_limit(&shared, tenant_q, key_q).await;
    if !decision.allowed {
        let mut err = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            ProblemCode::RateLimited,
            format!(
                "rate limit exceeded; retry after {} s",
                decision.retry_after_secs
            ),
        );
        err.retry_after = Some(decision.retry_after_secs);
        let mut resp = err.into_response();
        attach(&mut resp, &decision);
        return Ok(resp);
    }
    // A query parameter the operation does not name is refused, as an
    // unknown body field is: `limt=1` must not answer the default page.
    if let Some(query) = req.uri().query()
        && let Some(err) = state
            .allow
            .unknown_query(req.method(), req.uri().path(), query)
    {
        let mut resp = err.into_response();
        attach(&mut resp, &decision);
        return Ok(resp);
    }
    let ingest = matches!(
        req.uri().path(),
        "/v1/core/track" | "/v1/core/identify" | "/v1/core/batch"
    );
    req.extensions_mut().insert(Authed {
        principal,
        shared,
        gate_time: arrived.elapsed(),
    });
    let answered = if ingest {
        // Bounded inside, where the budget can keep the store from
        // committing late (`ingest::accept`).
        next.call(req).await
    } else {
        tokio::time::timeout(OTHER_ANSWER_WAIT, next.call(req))
            .await
            .unwrap_or_else(|_| {
                Err(ApiError::from(fastack_core::Error::Deadline("the database")).into())
            })
    };
    let mut resp = match answered {
        Ok(r) => r.into_response(),
        Err(e) => to_problem(e),
    };
    attach(&mut resp, &decision);
    Ok(resp)
}

/// Counts and times every request by route template, method and status;
/// a 405 gets its `Allow` header here.
pub async fn observe<E: Endpoint>(next: E, req: Request) -> poem::Result<Response> {
    let started = std::time::Instant::now();
    let route = route_label(req.uri().path());
    let method = method_label(req.method());
    let metrics = req.data::<SharedState>().map(|s| s.metrics.clone());
    let allow = req.data::<SharedState>().map(|s| s.allow.clone());
    // A clone of the URI shares its bytes: no copy of the path per request.
    let uri = req.uri().clone();
    let mut resp = match next.call(req).await {
        Ok(r) => r.into_response(),
        Err(e) => to_problem(e),
    };
    if resp.status() == StatusCode::METHOD_NOT_ALLOWED
        && let Some(methods) = allow.as_ref().and_then(|a| a.methods(uri.path()))
    {
        // RFC 9110: a 405 says which methods the resource takes.
        if let Ok(v) = HeaderValue::from_str(methods) {
            resp.headers_mut().insert(poem::http::header::ALLOW, v);
        }
    }
    if let Some(metrics) = metrics {
        let labels = fastack_core::metrics::HttpLabels {
            route,
            method,
            status: resp.status().as_u16(),
        };
        metrics.http_requests.get_or_create(&labels).inc();
        metrics
            .http_duration
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
    }
    Ok(resp)
}

fn route_label(path: &str) -> &'static str {
    match path {
        "/v1/core/track" => "/v1/core/track",
        "/v1/core/identify" => "/v1/core/identify",
        "/v1/core/batch" => "/v1/core/batch",
        "/v1/core/events" => "/v1/core/events",
        "/v1/core/contacts" => "/v1/core/contacts",
        p if p.starts_with("/v1/core/contacts/") => "/v1/core/contacts/{id}",
        "/v1/core/exports" => "/v1/core/exports",
        "/v1/core/erasures" => "/v1/core/erasures",
        "/v1/core/suppressions" => "/v1/core/suppressions",
        "/v1/core/jobs" => "/v1/core/jobs",
        p if p.starts_with("/v1/core/jobs/") && p.ends_with("/result") => {
            "/v1/core/jobs/{id}/result"
        }
        p if p.starts_with("/v1/core/jobs/") => "/v1/core/jobs/{id}",
        "/healthz" => "/healthz",
        "/readyz" => "/readyz",
        "/metrics" => "/metrics",
        "/openapi.json" => "/openapi.json",
        p if p.starts_with("/docs") => "/docs",
        _ => "other",
    }
}

fn method_label(m: &poem::http::Method) -> &'static str {
    match *m {
        poem::http::Method::GET => "GET",
        poem::http::Method::POST => "POST",
        poem::http::Method::PUT => "PUT",
        poem::http::Method::DELETE => "DELETE",
        poem::http::Method::PATCH => "PATCH",
        poem::http::Method::HEAD => "HEAD",
        _ => "OTHER",
    }
}
