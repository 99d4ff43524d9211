//! What the runtime offers its front ends (the tenant API, the admin
//! listener, the console): every read and write they make of storage, each
//! with the nudge it owes the running tree — a tenant woken, the job runner
//! or the delivery dispatcher told, tracking plans re-read — made in the
//! same call, so no handler can forget one. The HTTP crate holds no store.
//!
//! Operations take the node's clock for "now"; the rules stay in core
//! (`admin`, `console`, `taxonomy`, `export`), this file only routes.

use std::{collections::HashMap, time::Duration};

use chrono::{DateTime, Utc};
use fastack_core::{
    Result,
    admin::{self, CreatedEndpoint, CreatedKey},
    auth::KeyCache,
    console::{self, Session, SignIn, Token, User},
    erasure::{self, ErasureRequest},
    export,
    store::{EventQuery, Replayed, Subject, Suppression, TakenKey},
    taxonomy,
};
use fastack_entities::{
    ApiKey, ApiKeyId, Contact, ContactId, Delivery, DeliveryId, DeliveryStatus, Endpoint,
    EndpointId, EventId, IdentityKind, Job, JobId, JobKind, JobStatus, Plan, PlanVersion,
    QuarantinedEvent, StoredEvent, Tenant, TenantId, UserId,
};

use crate::Runtime;

impl Runtime {
    fn now(&self) -> DateTime<Utc> {
        self.ctx.clock.now()
    }

    // --- health and keys ----------------------------------------------------

    /// Whether storage answers (readiness).
    pub async fn storage_ready(&self) -> Result<()> {
        self.ctx.store.ping().await
    }

    /// How each dependency is doing (`/readyz`).
    pub fn health(&self) -> &fastack_core::health::Health {
        &self.ctx.health
    }

    /// A cache of API key lookups, entries trusted for `ttl`.
    pub fn key_cache(&self, ttl: Duration) -> KeyCache {
        KeyCache::new(self.ctx.store.clone(), ttl)
    }

    // --- tenants and keys ---------------------------------------------------

    pub async fn list_tenants(&self) -> Result<Vec<Tenant>> {
        self.ctx.store.tenants().list().await
    }

    pub async fn create_tenant(
        &self,
        name: &str,
        plan: Plan,
        retention_months: Option<u32>,
    ) -> Result<Tenant> {
        admin::create_tenant(self.ctx.store.as_ref(), name, plan, retention_months).await
    }

    /// A tenant by id or name.
    pub async fn resolve_tenant(&self, id_or_name: &str) -> Result<Tenant> {
        admin::resolve_tenant(self.ctx.store.as_ref(), id_or_name).await
    }

    pub async fn create_key(
        &self,
        tenant: TenantId,
        rate_limit_rps: Option<u32>,
    ) -> Result<CreatedKey> {
        admin::create_key(self.ctx.store.as_ref(), tenant, rate_limit_rps).await
    }

    pub async fn list_keys(&self, tenant: TenantId) -> Result<Vec<ApiKey>> {
        self.ctx.store.keys().list(tenant).await
    }

    pub async fn revoke_key(&self, id: ApiKeyId) -> Result<()> {
        admin::revoke_key(self.ctx.store.as_ref(), id).await
    }

    // --- webhook endpoints and deliveries -----------------------------------

    /// Registers an endpoint (private addresses only where the deployment
    /// allows them).
    pub async fn add_webhook(
        &self,
        tenant: TenantId,
        url: &str,
        events: Option<&str>,
    ) -> Result<CreatedEndpoint> {
        admin::add_webhook(
            self.ctx.store.as_ref(),
            &self.ctx.keys,
            tenant,
            url,
            events,
            self.ctx.config.webhook_allow_private,
        )
        .await
    }

    pub async fn list_webhooks(&self, tenant: TenantId) -> Result<Vec<Endpoint>> {
        self.ctx.store.endpoints().list(Some(tenant)).await
    }

    /// One of the tenant's endpoints (not found when another tenant's).
    pub async fn webhook(&self, tenant: TenantId, id: EndpointId) -> Result<Endpoint> {
        self.ctx
            .store
            .deliveries()
            .tenant_endpoint(tenant, id)
            .await
    }

    /// An endpoint by id, whichever tenant's (operators name endpoints
    /// alone).
    pub async fn endpoint(&self, id: EndpointId) -> Result<Endpoint> {
        self.ctx
            .store
            .endpoints()
            .get(id)
            .await?
            .ok_or(fastack_core::Error::NotFound { what: "endpoint" })
    }

    pub async fn set_webhook_enabled(
        &self,
        id: EndpointId,
        enabled: bool,
        reason: Option<&str>,
    ) -> Result<Endpoint> {
        admin::set_webhook_enabled(self.ctx.store.as_ref(), id, enabled, reason).await
    }

    pub async fn rotate_webhook_secret(&self, id: EndpointId) -> Result<CreatedEndpoint> {
        admin::rotate_webhook_secret(self.ctx.store.as_ref(), &self.ctx.keys, id).await
    }

    pub async fn delete_webhook(&self, tenant: TenantId, id: EndpointId) -> Result<()> {
        self.ctx
            .store
            .deliveries()
            .delete_endpoint(tenant, id)
            .await
    }

    /// The status of each endpoint's latest delivery.
    pub async fn latest_delivery_status(
        &self,
        tenant: TenantId,
    ) -> Result<HashMap<EndpointId, DeliveryStatus>> {
        self.ctx.store.deliveries().latest_status(tenant).await
    }

    pub async fn list_deliveries(
        &self,
        tenant: TenantId,
        endpoint: Option<EndpointId>,
        status: Option<DeliveryStatus>,
        limit: u32,
    ) -> Result<Vec<Delivery>> {
        self.ctx
            .store
            .deliveries()
            .list(tenant, endpoint, status, limit)
            .await
    }

    /// Sends a delivery again; the dispatcher looks at once.
    pub async fn replay_delivery(
        &self,
        tenant: TenantId,
        id: DeliveryId,
    ) -> Result<(Replayed, EndpointId)> {
        let replayed = self
            .ctx
            .store
            .deliveries()
            .replay(tenant, id, self.now())
            .await?;
        if replayed.0 == Replayed::Queued {
            self.deliveries_queued();
        }
        Ok(replayed)
    }

    /// Queues a test message (`webhook.test`) to one of the tenant's
    /// enabled endpoints; the dispatcher looks at once. Returns the
    /// delivery's id.
    pub async fn send_test_webhook(
        &self,
        tenant: TenantId,
        endpoint: EndpointId,
    ) -> Result<DeliveryId> {
        let delivery = self
            .ctx
            .store
            .deliveries()
            .send_test(tenant, endpoint, self.now())
            .await?;
        self.deliveries_queued();
        Ok(delivery.id)
    }

    /// The tenant a delivery belongs to.
    pub async fn delivery_tenant(&self, id: DeliveryId) -> Result<TenantId> {
        self.ctx.store.deliveries().tenant_of(id).await
    }

    /// Sends again every failed delivery of an endpoint since `since`;
    /// how many.
    pub async fn replay_failed_since(
        &self,
        tenant: TenantId,
        endpoint: EndpointId,
        since: DateTime<Utc>,
    ) -> Result<u64> {
        let n = self
            .ctx
            .store
            .deliveries()
            .replay_failed_since(tenant, endpoint, since, self.now())
            .await?;
        if n > 0 {
            self.deliveries_queued();
        }
        Ok(n)
    }

    // --- quarantine -----------------------------------------------------------

    pub async fn list_quarantine(
        &self,
        tenant: TenantId,
        limit: u32,
    ) -> Result<Vec<QuarantinedEvent>> {
        self.ctx.store.quarantine().list(tenant, limit).await
    }

    pub async fn quarantined(
        &self,
        tenant: TenantId,
        event: EventId,
    ) -> Result<Option<QuarantinedEvent>> {
        self.ctx.store.quarantine().get(tenant, event).await
    }

    /// Puts a quarantined event back in the inbox; the tenant's processor
    /// takes it at once.
    pub async fn retry_quarantined(&self, tenant: TenantId, event: EventId) -> Result<()> {
        admin::retry_quarantined(self.ctx.store.as_ref(), tenant, event).await?;
        self.wake(tenant);
        Ok(())
    }

    pub async fn drop_quarantined(&self, tenant: TenantId, event: EventId) -> Result<()> {
        admin::drop_quarantined(self.ctx.store.as_ref(), tenant, event).await
    }

    // --- tracking plans -------------------------------------------------------

    /// Installs the tenant's next plan version: in force on this node at
    /// once, on the others within a refresh.
    pub async fn install_plan(
        &self,
        tenant: TenantId,
        document: &serde_json::Value,
    ) -> Result<PlanVersion> {
        let installed =
            taxonomy::install(self.ctx.store.as_ref(), tenant, document, self.now()).await?;
        self.plans_changed().await?;
        Ok(installed)
    }

    /// Removes the tenant's plan (`None` when it had none in force).
    pub async fn remove_plan(&self, tenant: TenantId) -> Result<Option<PlanVersion>> {
        let removed = taxonomy::remove(self.ctx.store.as_ref(), tenant, self.now()).await?;
        if removed.is_some() {
            self.plans_changed().await?;
        }
        Ok(removed)
    }

    /// A version of the tenant's plan, the latest when `version` is `None`.
    pub async fn plan_version(
        &self,
        tenant: TenantId,
        version: Option<u32>,
    ) -> Result<Option<PlanVersion>> {
        self.ctx.store.plans().version(tenant, version).await
    }

    pub async fn plan_history(&self, tenant: TenantId) -> Result<Vec<PlanVersion>> {
        self.ctx.store.plans().history(tenant).await
    }

    // --- jobs -----------------------------------------------------------------

    /// Stores a queued job; the runner looks at once.
    pub async fn queue_job(&self, job: &Job) -> Result<()> {
        self.ctx.store.jobs().insert(job).await?;
        self.job_queued();
        Ok(())
    }

    // --- privacy ---------------------------------------------------------------

    /// Queues an erasure (its job, its record, the hold on its people); the
    /// runner looks at once.
    pub async fn request_erasure(
        &self,
        tenant: TenantId,
        req: &ErasureRequest,
        metadata: serde_json::Map<String, serde_json::Value>,
    ) -> Result<Job> {
        let job =
            erasure::request(self.ctx.store.as_ref(), tenant, req, metadata, self.now()).await?;
        self.job_queued();
        Ok(job)
    }

    /// The tenant's erasure requests, newest first.
    pub async fn erasure_requests(&self, tenant: TenantId, limit: u32) -> Result<Vec<Job>> {
        self.ctx
            .store
            .erasures()
            .jobs(tenant, JobKind::Erasure, None, limit)
            .await
    }

    /// The tenant's suppressions, newest first (of one identifier when
    /// given).
    pub async fn suppressions(
        &self,
        tenant: TenantId,
        only: Option<&Subject>,
        limit: u32,
    ) -> Result<Vec<Suppression>> {
        self.ctx
            .store
            .erasures()
            .suppressions(tenant, only, limit)
            .await
    }

    /// Lifts a suppression: the identifier's events are processed again
    /// from now on. Whether there was one.
    pub async fn lift_suppression(&self, tenant: TenantId, subject: &Subject) -> Result<bool> {
        self.ctx.store.erasures().lift(tenant, subject).await
    }

    pub async fn job(&self, tenant: TenantId, id: JobId) -> Result<Option<Job>> {
        self.ctx.store.jobs().get(tenant, id).await
    }

    pub async fn list_jobs(
        &self,
        tenant: TenantId,
        status: Option<JobStatus>,
        limit: u32,
    ) -> Result<Vec<Job>> {
        self.ctx.store.jobs().list(tenant, status, limit).await
    }

    /// A completed export's NDJSON, checked against its HMAC.
    pub async fn export_result(&self, job: &Job, result: &serde_json::Value) -> Result<Vec<u8>> {
        export::read_result(&self.ctx.objects, &self.ctx.keys, job, result).await
    }

    // --- events and contacts --------------------------------------------------

    pub async fn query_events(&self, query: &EventQuery) -> Result<Vec<StoredEvent>> {
        self.ctx.store.events().query(query).await
    }

    pub async fn contact(&self, tenant: TenantId, id: ContactId) -> Result<Option<Contact>> {
        self.ctx.store.contacts().get(tenant, id).await
    }

    pub async fn find_contact(
        &self,
        tenant: TenantId,
        kind: IdentityKind,
        value: &str,
    ) -> Result<Option<Contact>> {
        self.ctx.store.contacts().find(tenant, kind, value).await
    }

    /// The contact's canonical id and every contact merged into it.
    pub async fn contact_family(&self, tenant: TenantId, id: ContactId) -> Result<Vec<ContactId>> {
        self.ctx.store.contacts().family(tenant, id).await
    }

    /// Which of `keys` the tenant already used (the storage fence behind
    /// [`Runtime::recent_key`]).
    pub async fn taken_keys(&self, tenant: TenantId, keys: &[String]) -> Result<Vec<TakenKey>> {
        self.ctx.store.ingest().taken_keys(tenant, keys).await
    }

    // --- console accounts -----------------------------------------------------

    pub async fn console_sign_in(&self, email: &str, password: &str) -> Result<SignIn> {
        console::sign_in(self.ctx.store.as_ref(), email, password, self.now()).await
    }

    pub async fn open_console_session(&self, user: User) -> Result<Session> {
        console::open_session(self.ctx.store.as_ref(), user, self.now()).await
    }

    /// The live session a cookie names.
    pub async fn console_session(&self, token: &Token) -> Result<Option<Session>> {
        console::session(self.ctx.store.as_ref(), token, self.now()).await
    }

    /// The user a set-up link names, while it is valid.
    pub async fn console_link_user(&self, token: &Token) -> Result<Option<User>> {
        console::link_user(self.ctx.store.as_ref(), token, self.now()).await
    }

    pub async fn redeem_console_link(&self, token: &Token, password: &str) -> Result<User> {
        console::redeem_link(self.ctx.store.as_ref(), token, password, self.now()).await
    }

    pub async fn console_sign_out(&self, token: &Token) -> Result<()> {
        console::sign_out(self.ctx.store.as_ref(), token).await
    }

    /// Ends every session of the user; how many.
    pub async fn console_sign_out_everywhere(&self, user: UserId) -> Result<u64> {
        console::sign_out_everywhere(self.ctx.store.as_ref(), user).await
    }
}
