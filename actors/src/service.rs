//! The application layer: what the runtime offers every front end (the
//! tenant API, the admin listener, the console, the command line). Every
//! read and write they make of storage is a method of [`Service`], each
//! with the nudge it owes the running tree — a tenant woken, the job runner
//! or the delivery dispatcher told, tracking plans re-read — made in the
//! same call, so no handler can forget one. Neither the HTTP crate nor the
//! CLI holds a store.
//!
//! Operations take the node's clock for "now"; the rules stay in core
//! (`admin`, `console`, `taxonomy`, `export`, `retention`, `keyring`), this
//! file only routes.

use std::{collections::HashMap, sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use fastack_core::{
    Config, Result,
    admin::{self, CreatedEndpoint, CreatedKey},
    auth::KeyCache,
    console::{self, Role, Session, SignIn, Token, User},
    crypto::{Keys, MasterKey},
    erasure::{self, ErasureRequest},
    export, keyring,
    retention::{self, Maintenance},
    store::{EventQuery, PartitionInfo, Replayed, Subject, Suppression, TakenKey},
    taxonomy,
};
use fastack_entities::{
    ApiKey, ApiKeyId, Contact, ContactId, Delivery, DeliveryId, DeliveryStatus, Endpoint,
    EndpointId, EventId, IdentityKind, Job, JobId, JobKind, JobStatus, NodeId, Plan, PlanVersion,
    QuarantinedEvent, StoredEvent, Tenant, TenantId, UserId,
};

use crate::{Ctx, NodeParts, job_runner::JobEnv};

/// The application layer over a node's parts (see the module doc).
pub struct Service {
    parts: NodeParts,
    /// The serving node's tree, owed the nudges; none for a command typed
    /// at a shell (a running node's runner, dispatcher and plan refresher
    /// find what it wrote within their poll).
    tree: Option<Arc<Ctx>>,
}

impl Service {
    /// For a command-line tool: an existing node's parts, no tree.
    pub fn for_tool(parts: NodeParts) -> Self {
        Service { parts, tree: None }
    }

    /// For a serving node whose tree runs over `tree`.
    pub(crate) fn serving(parts: NodeParts, tree: Arc<Ctx>) -> Self {
        Service {
            parts,
            tree: Some(tree),
        }
    }

    fn now(&self) -> DateTime<Utc> {
        self.parts.clock.now()
    }

    /// The configuration the node's parts were opened with.
    pub fn config(&self) -> &Config {
        &self.parts.config
    }

    /// The deployment's keys (webhook secrets, export encryption, external
    /// HMAC keys).
    pub fn keys(&self) -> &Keys {
        &self.parts.keys
    }

    /// What a job needs to run here, claimed by `node` (the commands that
    /// run jobs in the foreground).
    pub fn job_env(&self, node: NodeId) -> JobEnv<'_> {
        self.parts.job_env(node)
    }

    // --- nudges owed to the running tree (none without one) -----------------

    /// A job was queued: the runner looks at once.
    fn job_queued(&self) {
        if let Some(tree) = &self.tree {
            tree.signals.jobs.raise();
        }
    }

    /// Deliveries were put back to pending (a replay): the dispatcher
    /// looks at once.
    fn deliveries_queued(&self) {
        if let Some(tree) = &self.tree {
            tree.signals.deliveries.raise();
        }
    }

    /// New inbox rows for the tenant (a quarantined event put back).
    fn wake(&self, tenant: TenantId) {
        if let Some(tree) = &self.tree {
            tree.wake(tenant);
        }
    }

    /// Reads the latest tracking plans now (after an install or removal on
    /// this node; the others read them within a refresh).
    async fn plans_changed(&self) -> Result<()> {
        match &self.tree {
            Some(tree) => tree.plans.refresh(self.parts.store.as_ref()).await,
            None => Ok(()),
        }
    }

    // --- health and keys ----------------------------------------------------

    /// Whether storage answers (readiness).
    pub async fn storage_ready(&self) -> Result<()> {
        self.parts.store.ping().await
    }

    /// A cache of API key lookups, entries trusted for `ttl`.
    pub fn key_cache(&self, ttl: Duration) -> KeyCache {
        KeyCache::new(self.parts.store.clone(), ttl)
    }

    // --- tenants and keys ---------------------------------------------------

    pub async fn list_tenants(&self) -> Result<Vec<Tenant>> {
        self.parts.store.tenants().list().await
    }

    pub async fn create_tenant(
        &self,
        name: &str,
        plan: Plan,
        retention_months: Option<u32>,
    ) -> Result<Tenant> {
        admin::create_tenant(self.parts.store.as_ref(), name, plan, retention_months).await
    }

    /// A tenant by id or name.
    pub async fn resolve_tenant(&self, id_or_name: &str) -> Result<Tenant> {
        admin::resolve_tenant(self.parts.store.as_ref(), id_or_name).await
    }

    pub async fn create_key(
        &self,
        tenant: TenantId,
        rate_limit_rps: Option<u32>,
    ) -> Result<CreatedKey> {
        admin::create_key(self.parts.store.as_ref(), tenant, rate_limit_rps).await
    }

    pub async fn list_keys(&self, tenant: TenantId) -> Result<Vec<ApiKey>> {
        self.parts.store.keys().list(tenant).await
    }

    /// Sets a tenant's plan (its rate limit applies at once); the tenant as
    /// it now is.
    pub async fn set_plan(
        &self,
        tenant: TenantId,
        plan: Plan,
        retention_months: Option<u32>,
    ) -> Result<Tenant> {
        admin::set_plan(self.parts.store.as_ref(), tenant, plan, retention_months).await
    }

    /// A key named by its id or its display prefix, never its secret.
    pub async fn key_named(&self, given: &str) -> Result<ApiKeyId> {
        admin::key_named(self.parts.store.as_ref(), given).await
    }

    pub async fn revoke_key(&self, id: ApiKeyId) -> Result<()> {
        admin::revoke_key(self.parts.store.as_ref(), id).await
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
            self.parts.store.as_ref(),
            &self.parts.keys,
            tenant,
            url,
            events,
            crate::sinks::webhooks::WebhookSettings::of(&self.parts.config).allow_private,
        )
        .await
    }

    pub async fn list_webhooks(&self, tenant: TenantId) -> Result<Vec<Endpoint>> {
        self.webhooks(Some(tenant)).await
    }

    /// Endpoints of one tenant or, with `None`, of every tenant.
    pub async fn webhooks(&self, tenant: Option<TenantId>) -> Result<Vec<Endpoint>> {
        self.parts.store.endpoints().list(tenant).await
    }

    /// One of the tenant's endpoints (not found when another tenant's).
    pub async fn webhook(&self, tenant: TenantId, id: EndpointId) -> Result<Endpoint> {
        self.parts
            .store
            .deliveries()
            .tenant_endpoint(tenant, id)
            .await
    }

    /// An endpoint by id, whichever tenant's (operators name endpoints
    /// alone).
    pub async fn endpoint(&self, id: EndpointId) -> Result<Endpoint> {
        self.parts
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
        admin::set_webhook_enabled(self.parts.store.as_ref(), id, enabled, reason).await
    }

    pub async fn rotate_webhook_secret(&self, id: EndpointId) -> Result<CreatedEndpoint> {
        admin::rotate_webhook_secret(self.parts.store.as_ref(), &self.parts.keys, id).await
    }

    pub async fn delete_webhook(&self, tenant: TenantId, id: EndpointId) -> Result<()> {
        self.parts
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
        self.parts.store.deliveries().latest_status(tenant).await
    }

    pub async fn list_deliveries(
        &self,
        tenant: TenantId,
        endpoint: Option<EndpointId>,
        status: Option<DeliveryStatus>,
        limit: u32,
    ) -> Result<Vec<Delivery>> {
        self.parts
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
            .parts
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
            .parts
            .store
            .deliveries()
            .send_test(tenant, endpoint, self.now())
            .await?;
        self.deliveries_queued();
        Ok(delivery.id)
    }

    /// The tenant a delivery belongs to.
    pub async fn delivery_tenant(&self, id: DeliveryId) -> Result<TenantId> {
        self.parts.store.deliveries().tenant_of(id).await
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
            .parts
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
        self.parts.store.quarantine().list(tenant, limit).await
    }

    pub async fn quarantined(
        &self,
        tenant: TenantId,
        event: EventId,
    ) -> Result<Option<QuarantinedEvent>> {
        self.parts.store.quarantine().get(tenant, event).await
    }

    /// Puts a quarantined event back in the inbox; the tenant's processor
    /// takes it at once.
    pub async fn retry_quarantined(&self, tenant: TenantId, event: EventId) -> Result<()> {
        admin::retry_quarantined(self.parts.store.as_ref(), tenant, event).await?;
        self.wake(tenant);
        Ok(())
    }

    pub async fn drop_quarantined(&self, tenant: TenantId, event: EventId) -> Result<()> {
        admin::drop_quarantined(self.parts.store.as_ref(), tenant, event).await
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
            taxonomy::install(self.parts.store.as_ref(), tenant, document, self.now()).await?;
        self.plans_changed().await?;
        Ok(installed)
    }

    /// Removes the tenant's plan (`None` when it had none in force).
    pub async fn remove_plan(&self, tenant: TenantId) -> Result<Option<PlanVersion>> {
        let removed = taxonomy::remove(self.parts.store.as_ref(), tenant, self.now()).await?;
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
        self.parts.store.plans().version(tenant, version).await
    }

    pub async fn plan_history(&self, tenant: TenantId) -> Result<Vec<PlanVersion>> {
        self.parts.store.plans().history(tenant).await
    }

    // --- partitions, retention and keys at rest --------------------------------

    /// Every partition of tracked_events, with its rows.
    pub async fn partitions(&self) -> Result<Vec<PartitionInfo>> {
        self.parts.store.partitions().list(true).await
    }

    /// Partition maintenance now: the window made, a retention job queued
    /// for each partition past its retention, old idempotency keys pruned.
    pub async fn maintain_retention(&self) -> Result<Maintenance> {
        let maintenance =
            retention::maintain(self.parts.store.as_ref(), &self.parts.config, self.now()).await?;
        if !maintenance.scheduled.is_empty() {
            self.job_queued();
        }
        Ok(maintenance)
    }

    /// Wraps the store's root key again under `new` (checked against
    /// `current` first).
    pub async fn rotate_master_key(&self, current: &MasterKey, new: &MasterKey) -> Result<()> {
        keyring::rotate(self.parts.store.as_ref(), current, new, self.now()).await
    }

    /// Embedded without `FASTACK_ENC_KEY`: a new key replaces the
    /// master-key file; the new key.
    pub async fn rotate_master_key_file(&self, current: &MasterKey) -> Result<MasterKey> {
        keyring::rotate_key_file(self.parts.store.as_ref(), current, self.now()).await
    }

    // --- jobs -----------------------------------------------------------------

    /// Stores a queued job; the runner looks at once.
    pub async fn queue_job(&self, job: &Job) -> Result<()> {
        self.parts.store.jobs().insert(job).await?;
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
            erasure::request(self.parts.store.as_ref(), tenant, req, metadata, self.now()).await?;
        self.job_queued();
        Ok(job)
    }

    /// The tenant's erasure requests, newest first.
    pub async fn erasure_requests(&self, tenant: TenantId, limit: u32) -> Result<Vec<Job>> {
        self.parts
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
        self.parts
            .store
            .erasures()
            .suppressions(tenant, only, limit)
            .await
    }

    /// Lifts a suppression: the identifier's events are processed again
    /// from now on. Whether there was one.
    pub async fn lift_suppression(&self, tenant: TenantId, subject: &Subject) -> Result<bool> {
        self.parts.store.erasures().lift(tenant, subject).await
    }

    pub async fn job(&self, tenant: TenantId, id: JobId) -> Result<Option<Job>> {
        self.parts.store.jobs().get(tenant, id).await
    }

    pub async fn list_jobs(
        &self,
        tenant: TenantId,
        status: Option<JobStatus>,
        limit: u32,
    ) -> Result<Vec<Job>> {
        self.parts.store.jobs().list(tenant, status, limit).await
    }

    /// A completed export's NDJSON, checked against its HMAC.
    pub async fn export_result(&self, job: &Job, result: &serde_json::Value) -> Result<Vec<u8>> {
        export::read_result(&self.parts.objects, &self.parts.keys, job, result).await
    }

    // --- events and contacts --------------------------------------------------

    pub async fn query_events(&self, query: &EventQuery) -> Result<Vec<StoredEvent>> {
        self.parts.store.events().query(query).await
    }

    pub async fn contact(&self, tenant: TenantId, id: ContactId) -> Result<Option<Contact>> {
        self.parts.store.contacts().get(tenant, id).await
    }

    pub async fn find_contact(
        &self,
        tenant: TenantId,
        kind: IdentityKind,
        value: &str,
    ) -> Result<Option<Contact>> {
        self.parts.store.contacts().find(tenant, kind, value).await
    }

    /// The contact's canonical id and every contact merged into it.
    pub async fn contact_family(&self, tenant: TenantId, id: ContactId) -> Result<Vec<ContactId>> {
        self.parts.store.contacts().family(tenant, id).await
    }

    /// Which of `keys` the tenant already used (the storage fence behind
    /// [`crate::Runtime::recent_key`]).
    pub async fn taken_keys(&self, tenant: TenantId, keys: &[String]) -> Result<Vec<TakenKey>> {
        self.parts.store.ingest().taken_keys(tenant, keys).await
    }

    // --- console accounts -----------------------------------------------------

    pub async fn console_sign_in(&self, email: &str, password: &str) -> Result<SignIn> {
        console::sign_in(self.parts.store.as_ref(), email, password, self.now()).await
    }

    pub async fn open_console_session(&self, user: User) -> Result<Session> {
        console::open_session(self.parts.store.as_ref(), user, self.now()).await
    }

    /// The live session a cookie names.
    pub async fn console_session(&self, token: &Token) -> Result<Option<Session>> {
        console::session(self.parts.store.as_ref(), token, self.now()).await
    }

    /// The user a set-up link names, while it is valid.
    pub async fn console_link_user(&self, token: &Token) -> Result<Option<User>> {
        console::link_user(self.parts.store.as_ref(), token, self.now()).await
    }

    pub async fn redeem_console_link(&self, token: &Token, password: &str) -> Result<User> {
        console::redeem_link(self.parts.store.as_ref(), token, password, self.now()).await
    }

    pub async fn console_sign_out(&self, token: &Token) -> Result<()> {
        console::sign_out(self.parts.store.as_ref(), token).await
    }

    /// Ends every session of the user; how many.
    pub async fn console_sign_out_everywhere(&self, user: UserId) -> Result<u64> {
        console::sign_out_everywhere(self.parts.store.as_ref(), user).await
    }

    // --- console users (operators') ---------------------------------------------

    /// A console user and their one-time sign-in link.
    pub async fn create_console_user(
        &self,
        tenant: TenantId,
        email: &str,
        role: Role,
    ) -> Result<(User, Token)> {
        console::create_user(self.parts.store.as_ref(), tenant, email, role, self.now()).await
    }

    /// A new one-time link for a user (their sessions end).
    pub async fn reset_console_user(&self, email: &str) -> Result<(User, Token)> {
        console::reset_user(self.parts.store.as_ref(), email, self.now()).await
    }

    /// Console users, of one tenant or all.
    pub async fn console_users(&self, tenant: Option<TenantId>) -> Result<Vec<User>> {
        console::list_users(self.parts.store.as_ref(), tenant).await
    }

    /// Deletes a user, signing them out everywhere.
    pub async fn remove_console_user(&self, email: &str) -> Result<User> {
        console::remove_user(self.parts.store.as_ref(), email).await
    }
}
