//! The admin listener (`FASTACK_ADMIN_LISTEN`, bearer `FASTACK_ADMIN_TOKEN`;
//! off without a token): the operations of `fastack admin …` over HTTP.
//! Webhook endpoints are created and changed only here and in the CLI —
//! never through the tenant API, so a leaked API key cannot redirect
//! results.

use std::sync::Arc;

use fastack_core::auth::hash_key;
use fastack_entities::{ApiKeyId, EndpointId, EventId, Plan, Tenant};
use poem::{Endpoint, EndpointExt, IntoResponse, Request, Route, web::Data};
use poem_openapi::{
    ApiResponse, Enum, Object, OpenApi, OpenApiService, SecurityScheme, Tags,
    auth::Bearer,
    param::{Path, Query},
    payload::Json,
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{
    VERSION,
    allow::AllowIndex,
    body::{JsonBody, MaybeJsonBody},
    erasures::ErasureRequestBody,
    problem::{AdminErrors, ApiError, Errors, to_problem},
    state::SharedState,
};

type AdminResult<T> = Result<T, Errors<AdminErrors>>;

/// A JSON document of the store's own shape, described by its operation.
fn doc<T: serde::Serialize>(value: &T) -> Result<Json<Value>, ApiError> {
    serde_json::to_value(value)
        .map(Json)
        .map_err(|e| internal(format!("an admin answer did not serialise: {e}")))
}

fn internal(detail: String) -> ApiError {
    tracing::error!(%detail, "admin answer");
    ApiError::new(
        poem::http::StatusCode::INTERNAL_SERVER_ERROR,
        crate::problem::ProblemCode::Internal,
        "internal error",
    )
}

/// `200` with the document.
#[derive(ApiResponse)]
enum Found {
    #[oai(status = 200)]
    Ok(Json<Value>),
}

/// `201` with what was created.
#[derive(ApiResponse)]
enum Created {
    #[oai(status = 201)]
    Created(Json<Value>),
}

/// `202`: queued, with the job's id.
#[derive(ApiResponse)]
enum Queued {
    #[oai(status = 202)]
    Accepted(Json<Value>),
}

async fn tenant(state: &SharedState, id_or_name: &str) -> Result<Tenant, ApiError> {
    Ok(state.runtime.resolve_tenant(id_or_name).await?)
}

fn parse_id<T: std::str::FromStr>(raw: &str, what: &str) -> Result<T, ApiError> {
    raw.parse().map_err(|_| ApiError::not_found(what))
}

/// A body read with serde as the document describes it (unknown members
/// refused).
fn body_of<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::invalid_json(format!("request body: {e}")))
}

/// `Authorization: Bearer <FASTACK_ADMIN_TOKEN>` on every operation.
// The scheme is here for the document: the token is checked before any
// operation runs, in constant time (`token_ok`).
#[allow(dead_code)]
#[derive(SecurityScheme)]
#[oai(ty = "bearer")]
struct AdminToken(Bearer);

#[derive(Tags)]
enum AdminTag {
    /// Tenants and their API keys
    Tenants,
    /// Webhook endpoints and their deliveries
    Webhooks,
    /// Events processing set aside
    Quarantine,
    /// Tracking plans
    Taxonomy,
    /// Erasures and suppressions
    Privacy,
}

/// A tenant's plan.
#[derive(Clone, Copy, Debug, Deserialize, Enum)]
#[serde(rename_all = "lowercase")]
#[oai(rename_all = "lowercase")]
enum PlanName {
    Free,
    Pro,
    Enterprise,
}

impl From<PlanName> for Plan {
    fn from(p: PlanName) -> Plan {
        match p {
            PlanName::Free => Plan::Free,
            PlanName::Pro => Plan::Pro,
            PlanName::Enterprise => Plan::Enterprise,
        }
    }
}

/// A new tenant.
#[derive(Debug, Deserialize, Object)]
#[serde(deny_unknown_fields)]
struct NewTenant {
    /// Unique name (what `--tenant` and paths take besides the id).
    name: String,
    /// Default `free`.
    plan: Option<PlanName>,
    /// Retention in months (default: the plan's).
    retention_months: Option<u32>,
}

/// A new API key's options.
#[derive(Debug, Default, Deserialize, Object)]
#[serde(deny_unknown_fields)]
struct NewKey {
    /// Requests per second for this key alone (default: only the tenant's
    /// plan limits it).
    rate_limit: Option<u32>,
}

/// A new webhook endpoint.
#[derive(Debug, Deserialize, Object)]
#[serde(deny_unknown_fields)]
struct NewWebhook {
    /// Where deliveries are POSTed: an http(s) URL on a globally routable
    /// address (`FASTACK_WEBHOOK_ALLOW_PRIVATE=true` allows private ones).
    url: String,
    /// The event types to deliver: a list, or one comma-separated string,
    /// of `job.completed`, `job.failed`, `core.event.tracked`,
    /// `core.contact.erased`, `endpoint.disabled`, `delivery.exhausted`
    /// (default: the two job events).
    events: Option<Value>,
}

/// Which failed deliveries to replay: those created at or after `since`
/// (RFC 3339).
#[derive(Debug, Deserialize, Object)]
#[serde(deny_unknown_fields)]
struct ReplaySince {
    since: chrono::DateTime<chrono::Utc>,
}

/// Why an endpoint is disabled.
#[derive(Debug, Default, Deserialize, Object)]
#[serde(deny_unknown_fields)]
struct Disable {
    reason: Option<String>,
}

/// `events` as the store takes them: comma-separated.
fn event_list(events: &Option<Value>) -> Result<Option<String>, ApiError> {
    match events {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .map(|l| Some(l.join(",")))
            .ok_or_else(|| {
                ApiError::invalid_json("`events` must be a list of strings or a string")
            }),
        Some(_) => Err(ApiError::invalid_json(
            "`events` must be a list of strings or a string",
        )),
    }
}

/// The operations of `fastack admin …`, over HTTP.
pub struct AdminApi;

#[OpenApi(prefix_path = "/admin/v1")]
impl AdminApi {
    /// List tenants
    ///
    /// Every tenant: `id`, `name`, `plan`, `retention_months`, `created_at`.
    #[oai(
        path = "/tenants",
        method = "get",
        operation_id = "list_tenants",
        tag = "AdminTag::Tenants"
    )]
    async fn list_tenants(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
    ) -> AdminResult<Found> {
        Ok(Found::Ok(doc(&state.runtime.list_tenants().await?)?))
    }

    /// Create a tenant
    ///
    /// Answers the tenant (`id`, `name`, `plan`, …); `409 conflict` when the
    /// name is taken.
    #[oai(
        path = "/tenants",
        method = "post",
        operation_id = "create_tenant",
        tag = "AdminTag::Tenants"
    )]
    async fn create_tenant(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        body: JsonBody<NewTenant>,
    ) -> AdminResult<Created> {
        let body: NewTenant = body_of(&body.bytes)?;
        let t = state
            .runtime
            .create_tenant(
                &body.name,
                body.plan.map_or(Plan::Free, Plan::from),
                body.retention_months,
            )
            .await?;
        Ok(Created::Created(doc(&t)?))
    }

    /// List a tenant's API keys
    ///
    /// Each key's `id`, display `prefix`, `rate_limit`, `created_at` and
    /// `revoked_at`; never the secret.
    #[oai(
        path = "/tenants/:tenant/keys",
        method = "get",
        operation_id = "list_keys",
        tag = "AdminTag::Tenants"
    )]
    async fn list_keys(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        /// Tenant id or name.
        tenant: Path<String>,
    ) -> AdminResult<Found> {
        let t = self::tenant(&state, &tenant.0).await?;
        Ok(Found::Ok(doc(&state.runtime.list_keys(t.id).await?)?))
    }

    /// Create an API key
    ///
    /// Answers the key with its `secret`, shown this once (only its hash
    /// is stored). The body may be left out.
    #[oai(
        path = "/tenants/:tenant/keys",
        method = "post",
        operation_id = "create_key",
        tag = "AdminTag::Tenants"
    )]
    async fn create_key(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        /// Tenant id or name.
        tenant: Path<String>,
        body: MaybeJsonBody<NewKey>,
    ) -> AdminResult<Created> {
        let t = self::tenant(&state, &tenant.0).await?;
        let options: NewKey = match body.0 {
            Some(b) => body_of(&b.bytes)?,
            None => NewKey::default(),
        };
        Ok(Created::Created(doc(&state
            .runtime
            .create_key(t.id, options.rate_limit)
            .await?)?))
    }

    /// Revoke an API key
    ///
    /// The key is named by its id or by its display prefix (`fsk_…`, as
    /// listed). Refused by every node within about two seconds. Answers
    /// `{"id", "revoked": true}`.
    #[oai(
        path = "/keys/:id/revoke",
        method = "post",
        operation_id = "revoke_key",
        tag = "AdminTag::Tenants"
    )]
    async fn revoke_key(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        id: Path<String>,
    ) -> AdminResult<Found> {
        // The CLI's rule (`key revoke --key`): its id, or its prefix.
        let id: ApiKeyId = if id.0.starts_with(fastack_core::auth::KEY_PREFIX) {
            state.runtime.key_named(&id.0).await?
        } else {
            parse_id(&id.0, "api key")?
        };
        state.runtime.revoke_key(id).await?;
        Ok(Found::Ok(Json(json!({"id": id, "revoked": true}))))
    }

    /// List a tenant's webhook endpoints
    #[oai(
        path = "/tenants/:tenant/webhooks",
        method = "get",
        operation_id = "list_webhooks",
        tag = "AdminTag::Webhooks"
    )]
    async fn list_webhooks(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        /// Tenant id or name.
        tenant: Path<String>,
    ) -> AdminResult<Found> {
        let t = self::tenant(&state, &tenant.0).await?;
        Ok(Found::Ok(doc(&state.runtime.list_webhooks(t.id).await?)?))
    }

    /// Register a webhook endpoint
    ///
    /// Answers the endpoint with its signing `secret`, shown this once;
    /// `422 invalid_endpoint` for a URL or event type refused.
    #[oai(
        path = "/tenants/:tenant/webhooks",
        method = "post",
        operation_id = "add_webhook",
        tag = "AdminTag::Webhooks"
    )]
    async fn add_webhook(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        /// Tenant id or name.
        tenant: Path<String>,
        body: JsonBody<NewWebhook>,
    ) -> AdminResult<Created> {
        let t = self::tenant(&state, &tenant.0).await?;
        let body: NewWebhook = body_of(&body.bytes)?;
        let events = event_list(&body.events)?;
        let created = state
            .runtime
            .add_webhook(t.id, &body.url, events.as_deref())
            .await?;
        Ok(Created::Created(doc(&created)?))
    }

    /// Disable a webhook endpoint
    ///
    /// Nothing more is delivered to it until it is enabled; the body (a
    /// `reason`) may be left out.
    #[oai(
        path = "/webhooks/:id/disable",
        method = "post",
        operation_id = "disable_webhook",
        tag = "AdminTag::Webhooks"
    )]
    async fn disable_webhook(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        id: Path<String>,
        body: MaybeJsonBody<Disable>,
    ) -> AdminResult<Found> {
        let id: EndpointId = parse_id(&id.0, "endpoint")?;
        let reason = match body.0 {
            Some(b) => body_of::<Disable>(&b.bytes)?.reason,
            None => None,
        };
        Ok(Found::Ok(doc(&state
            .runtime
            .set_webhook_enabled(id, false, reason.as_deref())
            .await?)?))
    }

    /// Enable a webhook endpoint
    #[oai(
        path = "/webhooks/:id/enable",
        method = "post",
        operation_id = "enable_webhook",
        tag = "AdminTag::Webhooks"
    )]
    async fn enable_webhook(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        id: Path<String>,
    ) -> AdminResult<Found> {
        let id: EndpointId = parse_id(&id.0, "endpoint")?;
        Ok(Found::Ok(doc(&state
            .runtime
            .set_webhook_enabled(id, true, None)
            .await?)?))
    }

    /// Rotate a webhook endpoint's secret
    ///
    /// Answers the new secret, shown this once; deliveries are signed with
    /// both for a while, so receivers can switch.
    #[oai(
        path = "/webhooks/:id/rotate-secret",
        method = "post",
        operation_id = "rotate_webhook_secret",
        tag = "AdminTag::Webhooks"
    )]
    async fn rotate_webhook(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        id: Path<String>,
    ) -> AdminResult<Found> {
        let id: EndpointId = parse_id(&id.0, "endpoint")?;
        Ok(Found::Ok(doc(&state
            .runtime
            .rotate_webhook_secret(id)
            .await?)?))
    }

    /// Send a test message to a webhook endpoint
    ///
    /// Queues one `webhook.test` delivery to the endpoint, whatever event
    /// types it subscribes to: signed, retried and logged like any other
    /// delivery (`GET /admin/v1/tenants/{tenant}/deliveries`). Answers its
    /// `delivery_id` and the `webhook_id` the receiver sees;
    /// `409 conflict` when the endpoint is disabled.
    #[oai(
        path = "/webhooks/:id/test",
        method = "post",
        operation_id = "test_webhook",
        tag = "AdminTag::Webhooks"
    )]
    async fn test_webhook(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        id: Path<String>,
    ) -> AdminResult<Queued> {
        let id: EndpointId = parse_id(&id.0, "endpoint")?;
        let tenant = state.runtime.endpoint(id).await?.tenant_id;
        let delivery = state.runtime.send_test_webhook(tenant, id).await?;
        Ok(Queued::Accepted(Json(json!({
            "delivery_id": delivery,
            "webhook_id": delivery.webhook_id(),
        }))))
    }

    /// Replay a webhook endpoint's failed deliveries
    ///
    /// Puts back in line every delivery to the endpoint that failed and
    /// was created at or after `since`; each keeps its `webhook-id`, so
    /// receivers deduplicate it. Answers how many were `replayed`;
    /// `409 conflict` when the endpoint is disabled.
    #[oai(
        path = "/webhooks/:id/replay",
        method = "post",
        operation_id = "replay_failed_deliveries",
        tag = "AdminTag::Webhooks"
    )]
    async fn replay_failed(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        id: Path<String>,
        body: JsonBody<ReplaySince>,
    ) -> AdminResult<Found> {
        let id: EndpointId = parse_id(&id.0, "endpoint")?;
        let body: ReplaySince = body_of(&body.bytes)?;
        let tenant = state.runtime.endpoint(id).await?.tenant_id;
        let n = state
            .runtime
            .replay_failed_since(tenant, id, body.since)
            .await?;
        Ok(Found::Ok(Json(json!({"endpoint_id": id, "replayed": n}))))
    }

    /// Replay one webhook delivery
    ///
    /// Puts the delivery back in line, due now, with its `webhook-id`; one
    /// already pending (a retry or an earlier replay in flight) is left
    /// alone (`"replayed": false`). A replay is one more attempt. `409
    /// conflict` when its endpoint is disabled.
    #[oai(
        path = "/deliveries/:id/replay",
        method = "post",
        operation_id = "replay_delivery",
        tag = "AdminTag::Webhooks"
    )]
    async fn replay_delivery(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        id: Path<String>,
    ) -> AdminResult<Found> {
        let id: fastack_entities::DeliveryId = parse_id(&id.0, "delivery")?;
        let tenant = state.runtime.delivery_tenant(id).await?;
        let (done, endpoint) = state.runtime.replay_delivery(tenant, id).await?;
        Ok(Found::Ok(Json(json!({
            "delivery_id": id,
            "endpoint_id": endpoint,
            "replayed": done == fastack_core::domain::Replayed::Queued,
        }))))
    }

    /// A tenant's webhook deliveries
    ///
    /// Newest first, each with its attempts.
    #[oai(
        path = "/tenants/:tenant/deliveries",
        method = "get",
        operation_id = "list_deliveries",
        tag = "AdminTag::Webhooks"
    )]
    async fn deliveries(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        /// Tenant id or name.
        tenant: Path<String>,
        /// Only this endpoint's.
        endpoint: Query<Option<String>>,
        /// Page size, 1–1000 (default 100).
        #[oai(validator(minimum(value = "1"), maximum(value = "1000")))]
        limit: Query<Option<u32>>,
    ) -> AdminResult<Found> {
        let t = self::tenant(&state, &tenant.0).await?;
        let endpoint = endpoint
            .0
            .as_deref()
            .map(|e| parse_id::<EndpointId>(e, "endpoint"))
            .transpose()?;
        let list = state
            .runtime
            .list_deliveries(t.id, endpoint, None, limit.0.unwrap_or(100))
            .await?;
        Ok(Found::Ok(doc(&list)?))
    }

    /// A tenant's quarantined events
    #[oai(
        path = "/tenants/:tenant/quarantine",
        method = "get",
        operation_id = "list_quarantine",
        tag = "AdminTag::Quarantine"
    )]
    async fn list_quarantine(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        /// Tenant id or name.
        tenant: Path<String>,
        /// Page size, 1–1000 (default 100).
        #[oai(validator(minimum(value = "1"), maximum(value = "1000")))]
        limit: Query<Option<u32>>,
    ) -> AdminResult<Found> {
        let t = self::tenant(&state, &tenant.0).await?;
        let list = state
            .runtime
            .list_quarantine(t.id, limit.0.unwrap_or(100))
            .await?;
        Ok(Found::Ok(doc(&list)?))
    }

    /// One quarantined event
    #[oai(
        path = "/tenants/:tenant/quarantine/:event",
        method = "get",
        operation_id = "show_quarantined",
        tag = "AdminTag::Quarantine"
    )]
    async fn show_quarantined(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        /// Tenant id or name.
        tenant: Path<String>,
        event: Path<String>,
    ) -> AdminResult<Found> {
        let t = self::tenant(&state, &tenant.0).await?;
        let event: EventId = parse_id(&event.0, "quarantined event")?;
        match state.runtime.quarantined(t.id, event).await? {
            Some(q) => Ok(Found::Ok(doc(&q)?)),
            None => Err(ApiError::not_found("quarantined event").into()),
        }
    }

    /// Retry a quarantined event
    ///
    /// Back to processing. Answers `{"event_id", "retried": true}`.
    #[oai(
        path = "/tenants/:tenant/quarantine/:event/retry",
        method = "post",
        operation_id = "retry_quarantined",
        tag = "AdminTag::Quarantine"
    )]
    async fn retry_quarantined(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        /// Tenant id or name.
        tenant: Path<String>,
        event: Path<String>,
    ) -> AdminResult<Found> {
        let t = self::tenant(&state, &tenant.0).await?;
        let event: EventId = parse_id(&event.0, "quarantined event")?;
        state.runtime.retry_quarantined(t.id, event).await?;
        Ok(Found::Ok(Json(json!({"event_id": event, "retried": true}))))
    }

    /// Drop a quarantined event
    ///
    /// Answers `{"event_id", "dropped": true}`.
    #[oai(
        path = "/tenants/:tenant/quarantine/:event/drop",
        method = "post",
        operation_id = "drop_quarantined",
        tag = "AdminTag::Quarantine"
    )]
    async fn drop_quarantined(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        /// Tenant id or name.
        tenant: Path<String>,
        event: Path<String>,
    ) -> AdminResult<Found> {
        let t = self::tenant(&state, &tenant.0).await?;
        let event: EventId = parse_id(&event.0, "quarantined event")?;
        state.runtime.drop_quarantined(t.id, event).await?;
        Ok(Found::Ok(Json(json!({"event_id": event, "dropped": true}))))
    }

    /// The tracking plan in force (or a version of it)
    #[oai(
        path = "/tenants/:tenant/taxonomy",
        method = "get",
        operation_id = "show_plan",
        tag = "AdminTag::Taxonomy"
    )]
    async fn show_plan(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        /// Tenant id or name.
        tenant: Path<String>,
        /// A version from the history (default: the one in force).
        version: Query<Option<u32>>,
    ) -> AdminResult<Found> {
        let t = self::tenant(&state, &tenant.0).await?;
        match state.runtime.plan_version(t.id, version.0).await? {
            Some(p) if p.document.is_some() || version.0.is_some() => Ok(Found::Ok(doc(&p)?)),
            _ => Err(ApiError::not_found("tracking plan").into()),
        }
    }

    /// Install a tracking plan
    ///
    /// The body is the plan: `{"events": {name: JSON Schema}, "identify":
    /// schema, "unplanned": "allow"|"reject", "mode": "enforce"|"flag"}`;
    /// `422 invalid_plan` names the event and the schema error.
    #[oai(
        path = "/tenants/:tenant/taxonomy",
        method = "put",
        operation_id = "install_plan",
        tag = "AdminTag::Taxonomy"
    )]
    async fn install_plan(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        /// Tenant id or name.
        tenant: Path<String>,
        body: JsonBody<Value>,
    ) -> AdminResult<Created> {
        let t = self::tenant(&state, &tenant.0).await?;
        let plan: Value = body_of(&body.bytes)?;
        Ok(Created::Created(doc(&state
            .runtime
            .install_plan(t.id, &plan)
            .await?)?))
    }

    /// Remove the tracking plan
    #[oai(
        path = "/tenants/:tenant/taxonomy",
        method = "delete",
        operation_id = "remove_plan",
        tag = "AdminTag::Taxonomy"
    )]
    async fn remove_plan(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        /// Tenant id or name.
        tenant: Path<String>,
    ) -> AdminResult<Found> {
        let t = self::tenant(&state, &tenant.0).await?;
        match state.runtime.remove_plan(t.id).await? {
            Some(removed) => Ok(Found::Ok(doc(&removed)?)),
            None => Err(ApiError::not_found("tracking plan").into()),
        }
    }

    /// The tracking plan's versions
    #[oai(
        path = "/tenants/:tenant/taxonomy/history",
        method = "get",
        operation_id = "plan_history",
        tag = "AdminTag::Taxonomy"
    )]
    async fn plan_history(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        /// Tenant id or name.
        tenant: Path<String>,
    ) -> AdminResult<Found> {
        let t = self::tenant(&state, &tenant.0).await?;
        Ok(Found::Ok(doc(&state.runtime.plan_history(t.id).await?)?))
    }

    /// Erase people
    ///
    /// The tenant API's `POST /v1/core/erasures`, made by an operator (the
    /// same body and rules). Answers `{"job_id"}`.
    #[oai(
        path = "/tenants/:tenant/erasures",
        method = "post",
        operation_id = "request_erasure",
        tag = "AdminTag::Privacy"
    )]
    async fn request_erasure(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        /// Tenant id or name.
        tenant: Path<String>,
        body: JsonBody<ErasureRequestBody>,
    ) -> AdminResult<Queued> {
        let t = self::tenant(&state, &tenant.0).await?;
        let (req, metadata) = crate::erasures::parse(&body.bytes)?;
        let job = state.runtime.request_erasure(t.id, &req, metadata).await?;
        Ok(Queued::Accepted(Json(json!({"job_id": job.id}))))
    }

    /// A tenant's erasure requests
    ///
    /// Newest first (at most 500), as their job documents.
    #[oai(
        path = "/tenants/:tenant/erasures",
        method = "get",
        operation_id = "list_erasures",
        tag = "AdminTag::Privacy"
    )]
    async fn list_erasures(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        /// Tenant id or name.
        tenant: Path<String>,
    ) -> AdminResult<Found> {
        let t = self::tenant(&state, &tenant.0).await?;
        let docs: Vec<Value> = state
            .runtime
            .erasure_requests(t.id, 500)
            .await?
            .iter()
            .map(|job| serde_json::from_str(&job.document()))
            .collect::<Result<_, _>>()
            .map_err(|e| internal(format!("a job document did not parse: {e}")))?;
        Ok(Found::Ok(Json(Value::Array(docs))))
    }

    /// A tenant's suppressions
    ///
    /// Hashed identifiers, newest first; with `user_id` or `anonymous_id`
    /// (exactly one of `user_id` or `anonymous_id`), whether that one is
    /// suppressed.
    #[oai(
        path = "/tenants/:tenant/suppressions",
        method = "get",
        operation_id = "list_suppressions",
        tag = "AdminTag::Privacy"
    )]
    async fn list_suppressions(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        /// Tenant id or name.
        tenant: Path<String>,
        user_id: Query<Option<String>>,
        anonymous_id: Query<Option<String>>,
    ) -> AdminResult<Found> {
        let t = self::tenant(&state, &tenant.0).await?;
        let only = match (user_id.0, anonymous_id.0) {
            (None, None) => None,
            (u, a) => Some(crate::erasures::named(u, a)?),
        };
        Ok(Found::Ok(doc(&state
            .runtime
            .suppressions(t.id, only.as_ref(), 1000)
            .await?)?))
    }

    /// Lift a suppression
    ///
    /// Give exactly one of `user_id` or `anonymous_id`; 404 when it is not
    /// suppressed. Answers `{"lifted": …}`.
    #[oai(
        path = "/tenants/:tenant/suppressions",
        method = "delete",
        operation_id = "lift_suppression",
        tag = "AdminTag::Privacy"
    )]
    async fn lift_suppression(
        &self,
        state: Data<&SharedState>,
        _token: AdminToken,
        /// Tenant id or name.
        tenant: Path<String>,
        user_id: Query<Option<String>>,
        anonymous_id: Query<Option<String>>,
    ) -> AdminResult<Found> {
        let t = self::tenant(&state, &tenant.0).await?;
        let subject = crate::erasures::named(user_id.0, anonymous_id.0)?;
        if !state.runtime.lift_suppression(t.id, &subject).await? {
            return Err(ApiError::not_found("suppression").into());
        }
        Ok(Found::Ok(Json(json!({"lifted": subject}))))
    }
}

/// The admin listener's OpenAPI service.
pub fn admin_service() -> OpenApiService<AdminApi, ()> {
    OpenApiService::new(AdminApi, "fastack admin", VERSION)
        .description(
            "The admin listener (FASTACK_ADMIN_LISTEN, on when FASTACK_ADMIN_TOKEN is set): \
             the operations of `fastack admin …` over HTTP. Every operation takes \
             `Authorization: Bearer <FASTACK_ADMIN_TOKEN>`. Answers are the store's documents, \
             as `fastack admin … --json` prints them; errors are RFC 9457 problem documents.",
        )
        .server("/")
}

/// The admin document as served and committed in `openapi/admin.json`.
pub fn admin_openapi_json() -> String {
    crate::spec::close_request_schemas(&admin_service().spec())
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

/// The admin application: the operations behind the token, their document
/// (`/openapi.json`) and `/docs` open (the listener is private).
pub fn app(state: SharedState, token: Arc<str>) -> impl Endpoint {
    let api = admin_service();
    let (served, spec, docs) = crate::spec::documents(&api);
    let allow = AllowIndex::from_spec(&served);
    let guarded = Route::new().nest("/", api).around(move |next, req| {
        let token = token.clone();
        let allow = allow.clone();
        async move {
            if !token_ok(&req, &token) {
                return Ok(ApiError::unauthorized("admin token required").into_response());
            }
            if let Some(query) = req.uri().query()
                && let Some(err) = allow.unknown_query(req.method(), req.uri().path(), query)
            {
                return Ok(err.into_response());
            }
            Ok(match next.call(req).await {
                Ok(r) => r.into_response(),
                Err(e) => to_problem(e),
            })
        }
    });
    Route::new()
        .at("/openapi.json", spec)
        .nest("/docs", docs)
        .nest("/", guarded)
        .data(state)
}
