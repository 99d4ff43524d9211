//! The admin listener (`FASTACK_ADMIN_LISTEN`, bearer `FASTACK_ADMIN_TOKEN`;
//! off without a token): the operations of `fastack admin …` over HTTP.
//! Webhook endpoints are created and changed only here and in the CLI —
//! never through the tenant API, so a leaked API key cannot redirect
//! results.

use std::sync::Arc;

use fastack_core::auth::hash_key;
use fastack_entities::{ApiKeyId, EndpointId, EventId, Plan, Tenant};
use poem::{
    Endpoint, EndpointExt, IntoResponse, Request, Response, Route, get, handler,
    http::StatusCode,
    post,
    web::{Data, Json, Path, Query},
};
use serde::Deserialize;
use serde_json::json;

use crate::{
    problem::{ApiError, to_problem},
    state::SharedState,
};

type AdminResult = Result<Response, ApiError>;

fn ok<T: serde::Serialize>(status: StatusCode, value: &T) -> AdminResult {
    Ok(Response::builder()
        .status(status)
        .content_type("application/json")
        .body(serde_json::to_vec(value).expect("admin answers serialise")))
}

async fn tenant(state: &SharedState, id_or_name: &str) -> Result<Tenant, ApiError> {
    Ok(state.runtime.resolve_tenant(id_or_name).await?)
}

fn parse_id<T: std::str::FromStr>(raw: &str, what: &str) -> Result<T, ApiError> {
    raw.parse().map_err(|_| ApiError::not_found(what))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTenant {
    name: String,
    plan: Option<Plan>,
    retention_months: Option<u32>,
}

#[handler]
async fn list_tenants(state: Data<&SharedState>) -> AdminResult {
    ok(StatusCode::OK, &state.runtime.list_tenants().await?)
}

#[handler]
async fn create_tenant(state: Data<&SharedState>, body: Json<NewTenant>) -> AdminResult {
    let t = state
        .runtime
        .create_tenant(
            &body.name,
            body.plan.unwrap_or(Plan::Free),
            body.retention_months,
        )
        .await?;
    ok(StatusCode::CREATED, &t)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct NewKey {
    rate_limit: Option<u32>,
}

#[handler]
async fn create_key(
    state: Data<&SharedState>,
    Path(t): Path<String>,
    body: Option<Json<NewKey>>,
) -> AdminResult {
    let t = tenant(&state, &t).await?;
    let rate = body.map(|b| b.0).unwrap_or_default().rate_limit;
    ok(
        StatusCode::CREATED,
        &state.runtime.create_key(t.id, rate).await?,
    )
}

#[handler]
async fn list_keys(state: Data<&SharedState>, Path(t): Path<String>) -> AdminResult {
    let t = tenant(&state, &t).await?;
    ok(StatusCode::OK, &state.runtime.list_keys(t.id).await?)
}

#[handler]
async fn revoke_key(state: Data<&SharedState>, Path(id): Path<String>) -> AdminResult {
    let id: ApiKeyId = parse_id(&id, "api key")?;
    state.runtime.revoke_key(id).await?;
    ok(StatusCode::OK, &json!({"id": id, "revoked": true}))
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Events {
    List(Vec<String>),
    Csv(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewWebhook {
    url: String,
    events: Option<Events>,
}

#[handler]
async fn add_webhook(
    state: Data<&SharedState>,
    Path(t): Path<String>,
    body: Json<NewWebhook>,
) -> AdminResult {
    let t = tenant(&state, &t).await?;
    let events = body.events.as_ref().map(|e| match e {
        Events::List(l) => l.join(","),
        Events::Csv(s) => s.clone(),
    });
    let created = state
        .runtime
        .add_webhook(t.id, &body.url, events.as_deref())
        .await?;
    ok(StatusCode::CREATED, &created)
}

#[handler]
async fn list_webhooks(state: Data<&SharedState>, Path(t): Path<String>) -> AdminResult {
    let t = tenant(&state, &t).await?;
    ok(StatusCode::OK, &state.runtime.list_webhooks(t.id).await?)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Disable {
    reason: Option<String>,
}

#[handler]
async fn disable_webhook(
    state: Data<&SharedState>,
    Path(id): Path<String>,
    body: Option<Json<Disable>>,
) -> AdminResult {
    let id: EndpointId = parse_id(&id, "endpoint")?;
    let reason = body.and_then(|b| b.0.reason);
    ok(
        StatusCode::OK,
        &state
            .runtime
            .set_webhook_enabled(id, false, reason.as_deref())
            .await?,
    )
}

#[handler]
async fn enable_webhook(state: Data<&SharedState>, Path(id): Path<String>) -> AdminResult {
    let id: EndpointId = parse_id(&id, "endpoint")?;
    ok(
        StatusCode::OK,
        &state.runtime.set_webhook_enabled(id, true, None).await?,
    )
}

#[handler]
async fn rotate_webhook(state: Data<&SharedState>, Path(id): Path<String>) -> AdminResult {
    let id: EndpointId = parse_id(&id, "endpoint")?;
    ok(
        StatusCode::OK,
        &state.runtime.rotate_webhook_secret(id).await?,
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeliveriesQuery {
    endpoint: Option<String>,
    limit: Option<u32>,
}

#[handler]
async fn deliveries(
    state: Data<&SharedState>,
    Path(t): Path<String>,
    Query(q): Query<DeliveriesQuery>,
) -> AdminResult {
    let t = tenant(&state, &t).await?;
    let endpoint = q
        .endpoint
        .as_deref()
        .map(|e| parse_id::<EndpointId>(e, "endpoint"))
        .transpose()?;
    let list = state
        .runtime
        .list_deliveries(t.id, endpoint, None, q.limit.unwrap_or(100).clamp(1, 1000))
        .await?;
    ok(StatusCode::OK, &list)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuarantineQuery {
    limit: Option<u32>,
}

#[handler]
async fn list_quarantine(
    state: Data<&SharedState>,
    Path(t): Path<String>,
    Query(q): Query<QuarantineQuery>,
) -> AdminResult {
    let t = tenant(&state, &t).await?;
    let list = state
        .runtime
        .list_quarantine(t.id, q.limit.unwrap_or(100).clamp(1, 1000))
        .await?;
    ok(StatusCode::OK, &list)
}

#[handler]
async fn show_quarantined(
    state: Data<&SharedState>,
    Path((t, event)): Path<(String, String)>,
) -> AdminResult {
    let t = tenant(&state, &t).await?;
    let event: EventId = parse_id(&event, "quarantined event")?;
    match state.runtime.quarantined(t.id, event).await? {
        Some(q) => ok(StatusCode::OK, &q),
        None => Err(ApiError::not_found("quarantined event")),
    }
}

#[handler]
async fn retry_quarantined(
    state: Data<&SharedState>,
    Path((t, event)): Path<(String, String)>,
) -> AdminResult {
    let t = tenant(&state, &t).await?;
    let event: EventId = parse_id(&event, "quarantined event")?;
    state.runtime.retry_quarantined(t.id, event).await?;
    ok(StatusCode::OK, &json!({"event_id": event, "retried": true}))
}

#[handler]
async fn drop_quarantined(
    state: Data<&SharedState>,
    Path((t, event)): Path<(String, String)>,
) -> AdminResult {
    let t = tenant(&state, &t).await?;
    let event: EventId = parse_id(&event, "quarantined event")?;
    state.runtime.drop_quarantined(t.id, event).await?;
    ok(StatusCode::OK, &json!({"event_id": event, "dropped": true}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanQuery {
    version: Option<u32>,
}

#[handler]
async fn install_plan(
    state: Data<&SharedState>,
    Path(t): Path<String>,
    body: Json<serde_json::Value>,
) -> AdminResult {
    let t = tenant(&state, &t).await?;
    let installed = state.runtime.install_plan(t.id, &body.0).await?;
    ok(StatusCode::CREATED, &installed)
}

#[handler]
async fn show_plan(
    state: Data<&SharedState>,
    Path(t): Path<String>,
    Query(q): Query<PlanQuery>,
) -> AdminResult {
    let t = tenant(&state, &t).await?;
    match state.runtime.plan_version(t.id, q.version).await? {
        Some(p) if p.document.is_some() || q.version.is_some() => ok(StatusCode::OK, &p),
        _ => Err(ApiError::not_found("tracking plan")),
    }
}

#[handler]
async fn plan_history(state: Data<&SharedState>, Path(t): Path<String>) -> AdminResult {
    let t = tenant(&state, &t).await?;
    ok(StatusCode::OK, &state.runtime.plan_history(t.id).await?)
}

#[handler]
async fn remove_plan(state: Data<&SharedState>, Path(t): Path<String>) -> AdminResult {
    let t = tenant(&state, &t).await?;
    match state.runtime.remove_plan(t.id).await? {
        Some(removed) => ok(StatusCode::OK, &removed),
        None => Err(ApiError::not_found("tracking plan")),
    }
}

/// `POST /admin/v1/tenants/:tenant/erasures`: the tenant API's request,
/// made by an operator (the body is the same).
#[handler]
async fn request_erasure(
    state: Data<&SharedState>,
    Path(t): Path<String>,
    body: bytes::Bytes,
) -> AdminResult {
    let t = tenant(&state, &t).await?;
    let (req, metadata) = crate::privacy::parse(&body)?;
    let job = state.runtime.request_erasure(t.id, &req, metadata).await?;
    ok(StatusCode::ACCEPTED, &json!({"job_id": job.id}))
}

/// A tenant's erasure requests, newest first, as their job documents.
#[handler]
async fn list_erasures(state: Data<&SharedState>, Path(t): Path<String>) -> AdminResult {
    let t = tenant(&state, &t).await?;
    let docs: Vec<String> = state
        .runtime
        .erasure_requests(t.id, 500)
        .await?
        .iter()
        .map(fastack_entities::Job::document)
        .collect();
    Ok(Response::builder()
        .status(StatusCode::OK)
        .content_type("application/json")
        .body(format!("[{}]", docs.join(","))))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Identifier {
    user_id: Option<String>,
    anonymous_id: Option<String>,
}

#[handler]
async fn list_suppressions(
    state: Data<&SharedState>,
    Path(t): Path<String>,
    Query(q): Query<Identifier>,
) -> AdminResult {
    let t = tenant(&state, &t).await?;
    let only = match (q.user_id, q.anonymous_id) {
        (None, None) => None,
        (u, a) => Some(crate::privacy::named(u, a)?),
    };
    ok(
        StatusCode::OK,
        &state
            .runtime
            .suppressions(t.id, only.as_ref(), 1000)
            .await?,
    )
}

#[handler]
async fn lift_suppression(
    state: Data<&SharedState>,
    Path(t): Path<String>,
    Query(q): Query<Identifier>,
) -> AdminResult {
    let t = tenant(&state, &t).await?;
    let subject = crate::privacy::named(q.user_id, q.anonymous_id)?;
    if !state.runtime.lift_suppression(t.id, &subject).await? {
        return Err(ApiError::not_found("suppression"));
    }
    ok(StatusCode::OK, &json!({"lifted": subject}))
}

/// Constant-time check of the admin token (compares digests).
fn token_ok(req: &Request, token: &str) -> bool {
    let Some(given) = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
    else {
        return false;
    };
    let (a, b) = (hash_key(given.trim()), hash_key(token));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// The admin application.
pub fn app(state: SharedState, token: Arc<str>) -> impl Endpoint {
    Route::new()
        .at("/admin/v1/tenants", get(list_tenants).post(create_tenant))
        .at(
            "/admin/v1/tenants/:tenant/keys",
            get(list_keys).post(create_key),
        )
        .at("/admin/v1/keys/:id/revoke", post(revoke_key))
        .at(
            "/admin/v1/tenants/:tenant/webhooks",
            get(list_webhooks).post(add_webhook),
        )
        .at("/admin/v1/webhooks/:id/disable", post(disable_webhook))
        .at("/admin/v1/webhooks/:id/enable", post(enable_webhook))
        .at("/admin/v1/webhooks/:id/rotate-secret", post(rotate_webhook))
        .at("/admin/v1/tenants/:tenant/deliveries", get(deliveries))
        .at("/admin/v1/tenants/:tenant/quarantine", get(list_quarantine))
        .at(
            "/admin/v1/tenants/:tenant/quarantine/:event",
            get(show_quarantined),
        )
        .at(
            "/admin/v1/tenants/:tenant/quarantine/:event/retry",
            post(retry_quarantined),
        )
        .at(
            "/admin/v1/tenants/:tenant/quarantine/:event/drop",
            post(drop_quarantined),
        )
        .at(
            "/admin/v1/tenants/:tenant/taxonomy",
            get(show_plan).put(install_plan).delete(remove_plan),
        )
        .at(
            "/admin/v1/tenants/:tenant/taxonomy/history",
            get(plan_history),
        )
        .at(
            "/admin/v1/tenants/:tenant/erasures",
            get(list_erasures).post(request_erasure),
        )
        .at(
            "/admin/v1/tenants/:tenant/suppressions",
            get(list_suppressions).delete(lift_suppression),
        )
        .around(move |next, req| {
            let token = token.clone();
            async move {
                if !token_ok(&req, &token) {
                    return Ok(ApiError::unauthorized("admin token required").into_response());
                }
                Ok(match next.call(req).await {
                    Ok(r) => r.into_response(),
                    Err(e) => to_problem(e),
                })
            }
        })
        .data(state)
}
