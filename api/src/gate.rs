//! The front door's first two steps for every `/v1/` request: authenticate
//! the bearer API key (cached lookup) and apply the tenant's and the key's
//! rate limits. Every answer to an authenticated request carries the
//! `RateLimit-Policy` and `RateLimit` headers; a refusal is a 429 problem
//! with `Retry-After`.
//!
//! Rate limiting fails open: if Redis cannot be reached the request is let
//! through (and logged), so a cache outage never stops ingestion.

use std::sync::Arc;

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
use tracing::warn;

use crate::{
    problem::{ApiError, to_problem},
    state::SharedState,
};

/// An authenticated request's principal and its tenant's shared state.
#[derive(Clone)]
pub struct Authed {
    pub principal: Arc<Principal>,
    pub shared: Arc<TenantShared>,
}

/// Bearer API key (`Authorization: Bearer fsk_…`).
#[derive(SecurityScheme)]
#[oai(ty = "bearer", checker = "authed_by_gate")]
pub struct ApiKeyAuth(pub Authed);

async fn authed_by_gate(req: &Request, _bearer: Bearer) -> Option<Authed> {
    req.extensions().get::<Authed>().cloned()
}

fn bearer(req: &Request) -> Option<&str> {
    let value = req.headers().get("authorization")?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

fn headers(decision: &Decision) -> (HeaderValue, HeaderValue) {
    let policy = decision
        .policies
        .iter()
        .map(|p| format!("\"{}\";q={};w=1", p.name, p.quota.rate_per_sec))
        .collect::<Vec<_>>()
        .join(", ");
    let state = decision
        .policies
        .iter()
        .map(|p| format!("\"{}\";r={};t={}", p.name, p.remaining, p.reset_secs))
        .collect::<Vec<_>>()
        .join(", ");
    (
        HeaderValue::from_str(&policy).expect("ascii header"),
        HeaderValue::from_str(&state).expect("ascii header"),
    )
}

fn attach(resp: &mut Response, decision: &Decision) {
    let (policy, state) = headers(decision);
    resp.headers_mut().insert("ratelimit-policy", policy);
    resp.headers_mut().insert("ratelimit", state);
}

/// Authentication and rate limiting in front of the `/v1/` routes.
pub async fn gate<E: Endpoint>(next: E, mut req: Request) -> poem::Result<Response> {
    if !req.uri().path().starts_with("/v1/") {
        return next.call(req).await.map(IntoResponse::into_response);
    }
    let state = req
        .data::<SharedState>()
        .cloned()
        .expect("app state is installed before the gate");
    let Some(secret) = bearer(&req) else {
        return Err(ApiError::unauthorized("missing `Authorization: Bearer <api key>`").into());
    };
    let principal = state
        .keys
        .authenticate(secret)
        .await
        .map_err(ApiError::from)?
        .ok_or_else(|| ApiError::unauthorized("unknown or revoked API key"))?;
    let shared = state
        .runtime
        .tenant(&principal.tenant)
        .await
        .map_err(ApiError::from)?;
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
    let decision = match &state.runtime.ctx().redis_limiter {
        Some(redis) => match redis.check(tenant.id, tenant_q, key_q).await {
            Ok(d) => d,
            Err(error) => {
                warn!(%error, tenant = %tenant.id, "rate limiter unavailable, letting the request through");
                shared.limits.check(tenant_q, key_q)
            }
        },
        None => shared.limits.check(tenant_q, key_q),
    };
    if !decision.allowed {
        let mut err = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
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
    req.extensions_mut().insert(Authed { principal, shared });
    let mut resp = match next.call(req).await {
        Ok(r) => r.into_response(),
        Err(e) => to_problem(e),
    };
    attach(&mut resp, &decision);
    Ok(resp)
}

/// Counts and times every request by route template, method and status.
pub async fn observe<E: Endpoint>(next: E, req: Request) -> poem::Result<Response> {
    let started = std::time::Instant::now();
    let route = route_label(req.uri().path());
    let method = method_label(req.method());
    let metrics = req.data::<SharedState>().map(|s| s.metrics.clone());
    let resp = match next.call(req).await {
        Ok(r) => r.into_response(),
        Err(e) => to_problem(e),
    };
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
