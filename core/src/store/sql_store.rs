//! [`SqlStore`]: the one implementation of [`Storage`]. The plain records —
//! tenants, API keys, jobs, webhook endpoints, deliveries and attempts,
//! quarantine — are sea-orm entities (`fastack_entities::db`) read and
//! written with sea-orm's backend-neutral queries; leases, the inbox,
//! contacts and the outbox's claims are tuned statements written once over
//! the seam of [`super::sql`]. What depends on a backend's storage layout
//! (the group commit, the processing transaction, monthly partitions,
//! pruning) is the [`Engine`] of that backend: `postgres.rs` and
//! `sqlite.rs`.

use std::{
    collections::{BTreeMap, HashMap},
    time::Instant,
};

use async_trait::async_trait;
use chrono::{DateTime, Duration, FixedOffset, Utc};
use fastack_entities::{
    ApiKey, ApiKeyId, Attempt, Contact, ContactId, Delivery, DeliveryId, DeliveryStatus, Endpoint,
    EndpointId, EventId, IdentityKind, Job, JobId, JobKind, JobStatus, NodeId, Plan, PlanVersion,
    QuarantinedEvent, StoredEvent, Tenant, TenantId,
    db::{
        Time, api_key, job, quarantine, signed, tenant, tracking_plan, unsigned, webhook_attempt,
        webhook_delivery, webhook_endpoint,
    },
};
use sea_orm::{
    ColumnTrait, EntityTrait, ExprTrait, IntoActiveModel, QueryFilter, QueryOrder, QuerySelect,
    QueryTrait,
    sea_query::{Expr, Func, LockBehavior, LockType, OnConflict},
};
use serde_json::{Map, Value};

use super::{
    ArchiveCursor, ArchiveRow, AttemptOutcome, AttemptRecord, Backend, ConsoleRecords, Deliveries,
    DropOutcome, DueDelivery, Emit, Erasures, EventQuery, Fence, IngestRow, KeepFn, KeyRecord,
    NewDelivery, OutboxBatch, OutboxRow, Owed, PartitionInfo, PartitionKey, ProcessOutcome,
    ProcessRequest, SealedSecrets, SinkName, Storage, TakenKey, TimeRange, Topic, ingest,
    job_event, outbox,
    sql::{Db, Dialect, ListKind, Q, Row, Tx},
};
use crate::error::{Error, Result};

/// What a backend does its own way: the storage layout of events (monthly
/// partitions), the hot path's bulk statements, schema migrations.
#[async_trait]
pub(crate) trait Engine: Send + Sync + std::fmt::Debug + 'static {
    async fn migrate(&self) -> Result<()>;
    async fn commit_ingest(
        &self,
        rows: &[IngestRow],
        keep: KeepFn<'_>,
        deadline: Instant,
    ) -> Result<Vec<Fence>>;
    async fn backlog_tenants(&self, limit: u32) -> Result<Vec<TenantId>>;
    async fn process_batch(&self, req: &ProcessRequest) -> Result<ProcessOutcome>;
    /// Deletes inbox rows a processing transaction left (see
    /// [`ProcessOutcome::to_consume`]); nothing where it deletes them itself.
    async fn consume_inbox(&self, _tenant: TenantId, _seqs: &[i64]) -> Result<()> {
        Ok(())
    }
    /// A tenant's inbox rows were deleted or added outside the group
    /// commit (quarantine, a quarantined event put back).
    fn inbox_rewritten(&self, _tenant: TenantId) {}
    async fn ensure_partitions(&self, keys: &[PartitionKey]) -> Result<()>;
    async fn query_events(&self, q: &EventQuery) -> Result<Vec<StoredEvent>>;
    async fn count_events(&self, tenant: TenantId, range: TimeRange) -> Result<i64>;
    /// The partitions that exist, sorted.
    async fn partition_keys(&self) -> Result<Vec<PartitionKey>>;
    /// Where a partition's rows are (`tracked_events`, or the month's own
    /// table).
    fn layout(&self) -> &dyn super::processing::Layout;
    async fn partition_rows(&self, key: PartitionKey) -> Result<Option<i64>>;
    async fn drop_partition(&self, key: PartitionKey, expected_rows: i64) -> Result<DropOutcome>;
    async fn prune_idempotency(&self, tenants: &[TenantId], before: DateTime<Utc>) -> Result<u64>;
    async fn prune_processed(&self, before: DateTime<Utc>) -> Result<u64>;
}

/// A store: the records written once, and a backend's engine.
#[derive(Debug)]
pub struct SqlStore {
    db: Db,
    engine: Box<dyn Engine>,
}

impl SqlStore {
    pub(crate) fn new(db: Db, engine: Box<dyn Engine>) -> Self {
        SqlStore { db, engine }
    }

    fn d(&self) -> Dialect {
        self.db.dialect()
    }
}

/// Stored models as domain values.
fn domain<M, T>(models: Vec<M>) -> Result<Vec<T>>
where
    T: TryFrom<M>,
    Error: From<T::Error>,
{
    models
        .into_iter()
        .map(|m| T::try_from(m).map_err(Error::from))
        .collect()
}

fn domain_opt<M, T>(model: Option<M>) -> Result<Option<T>>
where
    T: TryFrom<M>,
    Error: From<T::Error>,
{
    model
        .map(|m| T::try_from(m).map_err(Error::from))
        .transpose()
}

/// Rows per multi-row insert (SQLite binds at most 32,766 values to one
/// statement).
const ROWS_PER_INSERT: usize = 1_000;

impl SqlStore {
    /// The contact `id` resolves to (merges followed to the survivor),
    /// with its identities and the contacts merged into it.
    async fn load_contact(&self, tenant: TenantId, id: ContactId) -> Result<Option<Contact>> {
        let mut current = id.0;
        // Chains are kept flat on merge; the bound protects against a cycle.
        for _ in 0..8 {
            let row = self
                .db
                .read_opt(
                    Q::new(
                        "SELECT id, merged_into, traits, created_at, updated_at FROM contacts \
                         WHERE tenant_id = $1 AND id = $2",
                    )
                    .bind(tenant.0)
                    .bind(current),
                )
                .await?;
            let Some(row) = row else { return Ok(None) };
            if let Some(next) = row.opt_uuid("merged_into")? {
                current = next;
                continue;
            }
            let identities = self
                .db
                .read(
                    Q::new(
                        "SELECT kind, value FROM contact_identities \
                         WHERE tenant_id = $1 AND contact_id = $2 ORDER BY kind, value",
                    )
                    .bind(tenant.0)
                    .bind(current),
                )
                .await?;
            let merged = self
                .db
                .read(
                    Q::new(
                        "SELECT id FROM contacts WHERE tenant_id = $1 AND merged_into = $2 ORDER BY id",
                    )
                    .bind(tenant.0)
                    .bind(current),
                )
                .await?;
            let mut user_ids = Vec::new();
            let mut anonymous_ids = Vec::new();
            for r in identities {
                let kind = r.int("kind")?;
                let value = r.text("value")?;
                match IdentityKind::from_i16(kind as i16) {
                    Some(IdentityKind::User) => user_ids.push(value),
                    Some(IdentityKind::Anonymous) => anonymous_ids.push(value),
                    None => return Err(Error::Corrupt(format!("identity kind {kind}"))),
                }
            }
            return Ok(Some(Contact {
                id: ContactId(current),
                user_ids,
                anonymous_ids,
                traits: object(row.json("traits")?),
                merged_ids: merged
                    .iter()
                    .map(|r| r.uuid("id").map(ContactId))
                    .collect::<Result<_>>()?,
                created_at: row.time("created_at")?,
                updated_at: row.time("updated_at")?,
            }));
        }
        Err(Error::Corrupt(format!(
            "merge chain of contact {id} too long"
        )))
    }

    /// Fails an endpoint's pending deliveries (it was disabled).
    /// Disables an enabled endpoint, fails what it still owes and tells the
    /// tenant's `endpoint.disabled` subscribers (once: an endpoint already
    /// disabled is left as it is).
    async fn disable_endpoint(
        tx: &mut Tx<'_>,
        id: EndpointId,
        reason: &str,
        at: DateTime<Utc>,
    ) -> Result<bool> {
        use webhook_endpoint::Column as E;
        let changed = tx
            .run(
                &webhook_endpoint::Entity::update_many()
                    .col_expr(E::Enabled, Expr::value(false))
                    .col_expr(E::DisabledReason, Expr::value(reason))
                    .col_expr(E::UpdatedAt, Expr::value(Time(at)))
                    .filter(E::Id.eq(id))
                    .filter(E::Enabled.eq(true)),
            )
            .await?;
        if changed == 1 {
            Self::fail_pending(tx, id).await?;
            super::deliveries::notify_disabled(tx, id, reason, at).await?;
        }
        Ok(changed == 1)
    }

    async fn fail_pending(tx: &mut Tx<'_>, endpoint: EndpointId) -> Result<()> {
        use webhook_delivery::Column as C;
        tx.run(
            &webhook_delivery::Entity::update_many()
                .col_expr(C::Status, Expr::value(DeliveryStatus::Failed.as_str()))
                .col_expr(C::NextAttemptAt, Expr::value(Option::<Time>::None))
                .col_expr(C::ClaimedUntil, Expr::value(Option::<Time>::None))
                .filter(C::EndpointId.eq(endpoint))
                .filter(C::Status.eq(DeliveryStatus::Pending.as_str())),
        )
        .await?;
        Ok(())
    }
}

#[async_trait]
impl Storage for SqlStore {
    fn connection_for_tests(&self) -> &Db {
        &self.db
    }

    fn console(&self) -> ConsoleRecords<'_> {
        ConsoleRecords { db: &self.db }
    }

    fn deliveries(&self) -> Deliveries<'_> {
        Deliveries {
            store: self,
            db: &self.db,
        }
    }

    fn erasures(&self) -> Erasures<'_> {
        Erasures {
            db: &self.db,
            engine: self.engine.as_ref(),
        }
    }

    fn backend(&self) -> Backend {
        match self.d() {
            Dialect::Postgres => Backend::Postgres,
            Dialect::Sqlite => Backend::Sqlite,
        }
    }

    async fn ping(&self) -> Result<()> {
        self.db.read_one(Q::new("SELECT 1")).await.map(drop)
    }

    async fn migrate(&self) -> Result<()> {
        self.engine.migrate().await
    }

    // --- tenants and keys -------------------------------------------------

    async fn insert_tenant(&self, t: &Tenant) -> Result<()> {
        tenant::Entity::insert(tenant::Model::from(t).into_active_model())
            .exec_without_returning(&self.db)
            .await
            .map_err(|e| unique_as_conflict(e.into(), &format!("tenant named {}", t.name)))?;
        Ok(())
    }

    async fn list_tenants(&self) -> Result<Vec<Tenant>> {
        use tenant::Column as C;
        domain(
            tenant::Entity::find()
                .order_by_asc(C::CreatedAt)
                .order_by_asc(C::Id)
                .all(&self.db)
                .await?,
        )
    }

    async fn get_tenant(&self, id: TenantId) -> Result<Option<Tenant>> {
        domain_opt(tenant::Entity::find_by_id(id).one(&self.db).await?)
    }

    async fn find_tenant_by_name(&self, name: &str) -> Result<Option<Tenant>> {
        domain_opt(
            tenant::Entity::find()
                .filter(tenant::Column::Name.eq(name))
                .one(&self.db)
                .await?,
        )
    }

    async fn update_tenant_plan(
        &self,
        id: TenantId,
        plan: Plan,
        retention_months: Option<u32>,
    ) -> Result<bool> {
        use tenant::Column as C;
        let r = tenant::Entity::update_many()
            .col_expr(C::Plan, Expr::value(plan.as_str()))
            .col_expr(
                C::RetentionMonths,
                Expr::value(retention_months.map(signed)),
            )
            .filter(C::Id.eq(id))
            .exec(&self.db)
            .await?;
        Ok(r.rows_affected == 1)
    }

    async fn insert_api_key(&self, key: &ApiKey, hash: &[u8; 32]) -> Result<()> {
        api_key::Entity::insert(api_key::Model::new(key, hash).into_active_model())
            .exec_without_returning(&self.db)
            .await
            .map_err(|e| unique_as_conflict(e.into(), "api key"))?;
        Ok(())
    }

    async fn list_api_keys(&self, tenant: TenantId) -> Result<Vec<ApiKey>> {
        use api_key::Column as C;
        domain(
            api_key::Entity::find()
                .filter(C::TenantId.eq(tenant))
                .order_by_asc(C::CreatedAt)
                .order_by_asc(C::Id)
                .all(&self.db)
                .await?,
        )
    }

    async fn revoke_api_key(&self, id: ApiKeyId, at: DateTime<Utc>) -> Result<bool> {
        use api_key::Column as C;
        let r = api_key::Entity::update_many()
            .col_expr(C::RevokedAt, Expr::value(Time(at)))
            .filter(C::Id.eq(id))
            .filter(C::RevokedAt.is_null())
            .exec(&self.db)
            .await?;
        Ok(r.rows_affected == 1)
    }

    async fn touch_api_key(&self, id: ApiKeyId, at: DateTime<Utc>) -> Result<()> {
        api_key::Entity::update_many()
            .col_expr(api_key::Column::LastUsedAt, Expr::value(Time(at)))
            .filter(api_key::Column::Id.eq(id))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    async fn lookup_api_key(&self, hash: &[u8; 32]) -> Result<Option<KeyRecord>> {
        let found = api_key::Entity::find()
            .filter(api_key::Column::KeyHash.eq(hash.to_vec()))
            .find_also_related(tenant::Entity)
            .one(&self.db)
            .await?;
        let Some((key, Some(tenant))) = found else {
            return Ok(None);
        };
        Ok(Some(KeyRecord {
            key: key.into(),
            tenant: tenant.try_into()?,
        }))
    }

    // --- the accept path --------------------------------------------------

    async fn commit_ingest(
        &self,
        rows: &[IngestRow],
        keep: KeepFn<'_>,
        deadline: Instant,
    ) -> Result<Vec<Fence>> {
        self.engine.commit_ingest(rows, keep, deadline).await
    }

    // --- processing -------------------------------------------------------

    async fn try_lease(
        &self,
        tenant: TenantId,
        node: NodeId,
        now: DateTime<Utc>,
        ttl: Duration,
    ) -> Result<bool> {
        let holder = self
            .db
            .write_opt(
                Q::new(
                    "INSERT INTO tenant_leases (tenant_id, node_id, expires_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (tenant_id) DO UPDATE SET node_id = excluded.node_id, \
                         expires_at = excluded.expires_at \
                     WHERE tenant_leases.node_id = excluded.node_id OR tenant_leases.expires_at < $4 \
                     RETURNING node_id",
                )
                .bind(tenant.0)
                .bind(node.0)
                .bind(now + ttl)
                .bind(now),
            )
            .await?;
        Ok(holder.map(|r| r.uuid("node_id")).transpose()? == Some(node.0))
    }

    async fn release_lease(&self, tenant: TenantId, node: NodeId) -> Result<()> {
        self.db
            .execute(
                Q::new("DELETE FROM tenant_leases WHERE tenant_id = $1 AND node_id = $2")
                    .bind(tenant.0)
                    .bind(node.0),
            )
            .await?;
        Ok(())
    }

    async fn backlog_tenants(&self, limit: u32) -> Result<Vec<TenantId>> {
        self.engine.backlog_tenants(limit).await
    }

    async fn inbox_stats(&self) -> Result<(i64, Option<DateTime<Utc>>)> {
        let row = self
            .db
            .read_one(Q::new(
                "SELECT count(*) AS n, min(received_at) AS oldest FROM inbox",
            ))
            .await?;
        Ok((row.int("n")?, row.opt_time("oldest")?))
    }

    async fn inbox_empty(&self) -> Result<bool> {
        let newest = self
            .db
            .read_opt(Q::new(
                "SELECT seq FROM inbox ORDER BY tenant_id DESC, seq DESC LIMIT 1",
            ))
            .await?;
        Ok(newest.is_none())
    }

    async fn process_batch(&self, req: &ProcessRequest) -> Result<ProcessOutcome> {
        self.engine.process_batch(req).await
    }

    async fn consume_inbox(&self, tenant: TenantId, seqs: &[i64]) -> Result<()> {
        if seqs.is_empty() {
            return Ok(());
        }
        self.engine.consume_inbox(tenant, seqs).await
    }

    async fn ensure_partitions(&self, keys: &[PartitionKey]) -> Result<()> {
        self.engine.ensure_partitions(keys).await
    }

    // --- reads ------------------------------------------------------------

    async fn query_events(&self, q: &EventQuery) -> Result<Vec<StoredEvent>> {
        self.engine.query_events(q).await
    }

    async fn get_contact(&self, tenant: TenantId, id: ContactId) -> Result<Option<Contact>> {
        self.load_contact(tenant, id).await
    }

    async fn find_contact(
        &self,
        tenant: TenantId,
        kind: IdentityKind,
        value: &str,
    ) -> Result<Option<Contact>> {
        let row = self
            .db
            .read_opt(
                Q::new(
                    "SELECT contact_id FROM contact_identities \
                     WHERE tenant_id = $1 AND kind = $2 AND value = $3",
                )
                .bind(tenant.0)
                .bind(i64::from(kind.as_i16()))
                .bind(value),
            )
            .await?;
        match row {
            Some(r) => {
                self.load_contact(tenant, ContactId(r.uuid("contact_id")?))
                    .await
            }
            None => Ok(None),
        }
    }

    async fn contact_family(&self, tenant: TenantId, id: ContactId) -> Result<Vec<ContactId>> {
        let Some(contact) = self.load_contact(tenant, id).await? else {
            return Ok(Vec::new());
        };
        let mut ids = vec![contact.id];
        ids.extend(contact.merged_ids);
        Ok(ids)
    }

    async fn count_events(&self, tenant: TenantId, range: TimeRange) -> Result<i64> {
        self.engine.count_events(tenant, range).await
    }

    // --- jobs -------------------------------------------------------------
    async fn insert_job(&self, j: &Job) -> Result<()> {
        job::Entity::insert(job_model(j))
            .exec_without_returning(&self.db)
            .await
            .map_err(|e| unique_as_conflict(e.into(), "an active job for this partition"))?;
        Ok(())
    }

    async fn get_job(&self, tenant: TenantId, id: JobId) -> Result<Option<Job>> {
        domain_opt(
            job::Entity::find_by_id(id)
                .filter(job::Column::TenantId.eq(tenant))
                .one(&self.db)
                .await?,
        )
    }

    async fn list_jobs(
        &self,
        tenant: TenantId,
        status: Option<JobStatus>,
        limit: u32,
    ) -> Result<Vec<Job>> {
        use job::Column as C;
        domain(
            job::Entity::find()
                .filter(C::TenantId.eq(tenant))
                .apply_if(status, |q, s| q.filter(C::Status.eq(s.as_str())))
                .order_by_desc(C::CreatedAt)
                .order_by_desc(C::Id)
                .limit(u64::from(limit))
                .all(&self.db)
                .await?,
        )
    }

    async fn claim_job(
        &self,
        node: NodeId,
        now: DateTime<Utc>,
        claim_for: Duration,
        kind: Option<JobKind>,
    ) -> Result<Option<Job>> {
        use job::Column as C;
        // The oldest runnable job, locked so two nodes claim different ones
        // (SQLite has one writer: no lock there).
        let next = job::Entity::find()
            .select_only()
            .column(C::Id)
            .apply_if(kind, |q, k| q.filter(C::Kind.eq(k.as_str())))
            .filter(
                C::Status.eq(JobStatus::Queued.as_str()).or(C::Status
                    .eq(JobStatus::Processing.as_str())
                    .and(C::ClaimExpiresAt.lt(Time(now)))),
            )
            .order_by_asc(C::CreatedAt)
            .limit(1)
            .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked)
            .into_query();
        let claimed = job::Entity::update_many()
            .col_expr(C::Status, Expr::value(JobStatus::Processing.as_str()))
            .col_expr(C::ClaimedBy, Expr::value(node))
            .col_expr(C::ClaimExpiresAt, Expr::value(Time(now + claim_for)))
            .col_expr(
                C::StartedAt,
                Func::coalesce([Expr::col(C::StartedAt), Expr::value(Time(now))]).into(),
            )
            .col_expr(C::Attempts, Expr::col(C::Attempts).add(1))
            .filter(C::Id.in_subquery(next))
            .exec_with_returning(&self.db)
            .await?;
        domain_opt(claimed.into_iter().next())
    }

    async fn renew_job_claim(&self, id: JobId, node: NodeId, until: DateTime<Utc>) -> Result<bool> {
        use job::Column as C;
        let r = job::Entity::update_many()
            .col_expr(C::ClaimExpiresAt, Expr::value(Time(until)))
            .filter(C::Id.eq(id))
            .filter(C::ClaimedBy.eq(node))
            .filter(C::Status.eq(JobStatus::Processing.as_str()))
            .exec(&self.db)
            .await?;
        Ok(r.rows_affected == 1)
    }

    async fn finish_job(&self, j: &Job, node: NodeId, emit: &Emit) -> Result<bool> {
        let mut tx = self.db.begin().await?;
        if !end_job(&mut tx, j, node, emit).await? {
            return Ok(false);
        }
        tx.commit().await?;
        Ok(true)
    }

    // --- outbox -----------------------------------------------------------

    async fn outbox_notifications(&self) -> Result<Option<tokio::sync::mpsc::Receiver<()>>> {
        outbox::notifications(&self.db).await
    }

    async fn claim_outbox(
        &self,
        sink: SinkName,
        now: DateTime<Utc>,
        claim_for: Duration,
        limit: u32,
    ) -> Result<Vec<OutboxRow>> {
        outbox::claim(&self.db, sink, now, claim_for, limit).await
    }

    async fn complete_outbox(&self, sink: SinkName, ids: &[i64]) -> Result<()> {
        outbox::complete(&self.db, sink, ids).await
    }

    async fn release_outbox(&self, sink: SinkName, ids: &[i64]) -> Result<()> {
        outbox::release(&self.db, sink, ids).await
    }

    async fn claim_outbox_batch(
        &self,
        sink: SinkName,
        now: DateTime<Utc>,
        claim_for: Duration,
        new_up_to: Option<u32>,
    ) -> Result<Option<OutboxBatch>> {
        outbox::claim_batch(&self.db, sink, now, claim_for, new_up_to).await
    }

    async fn outbox_owed(&self, sink: SinkName, up_to: u32) -> Result<Owed> {
        outbox::owed(&self.db, sink, up_to).await
    }

    async fn outbox_oldest(&self, sink: SinkName) -> Result<Option<DateTime<Utc>>> {
        outbox::oldest(&self.db, sink).await
    }

    async fn outbox_owed_rows(&self, sink: SinkName, tenant: TenantId) -> Result<Vec<OutboxRow>> {
        outbox::owed_rows(&self.db, sink, tenant).await
    }

    async fn repair_pending_events(
        &self,
        now: DateTime<Utc>,
        claim_for: Duration,
        emit: &Emit,
        limit: u32,
    ) -> Result<Vec<JobId>> {
        let mut tx = self.db.begin().await?;
        let rows = tx
            .fetch(
                Q::new(format!(
                    "UPDATE jobs SET repair_claimed_until = $2 \
                     WHERE id IN (SELECT id FROM jobs \
                                  WHERE event_pending AND status IN ('completed', 'failed') \
                                    AND event_body IS NOT NULL \
                                    AND (repair_claimed_until IS NULL OR repair_claimed_until < $1) \
                                    AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.job_id = jobs.id) \
                                  ORDER BY finished_at LIMIT $3{}) \
                     RETURNING id, tenant_id, status, event_body",
                    self.d().skip_locked("jobs")
                ))
                .bind(now)
                .bind(now + claim_for)
                .bind(i64::from(limit)),
            )
            .await?;
        let mut repaired = Vec::with_capacity(rows.len());
        let mut entries = Vec::with_capacity(rows.len());
        for row in &rows {
            let id = JobId(row.uuid("id")?);
            let status: JobStatus = row.text("status")?.parse().map_err(corrupt)?;
            let (routing_key, ce_id) = job_event(id, status);
            entries.push(outbox::Entry {
                tenant_id: TenantId(row.uuid("tenant_id")?),
                topic: Topic::Job,
                routing_key,
                ce_id,
                subject: id.to_string(),
                body: row.text("event_body")?,
                record: None,
                job_id: Some(id),
                created_at: now,
            });
            repaired.push(id);
        }
        outbox::write(&mut tx, entries, emit).await?;
        if !emit.relays() && !repaired.is_empty() {
            // No relayed sink takes them (any more): the fan-out's
            // deliveries, written above, were all that was owed.
            tx.run(
                &job::Entity::update_many()
                    .col_expr(job::Column::EventPending, Expr::value(false))
                    .filter(job::Column::Id.is_in(repaired.clone())),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(repaired)
    }

    async fn outbox_depth(&self, sink: SinkName) -> Result<i64> {
        outbox::depth(&self.db, sink).await
    }

    // --- partitions and retention -----------------------------------------

    async fn list_partitions(&self, with_rows: bool) -> Result<Vec<PartitionInfo>> {
        let mut out = Vec::new();
        for key in self.engine.partition_keys().await? {
            let rows = if with_rows {
                match self.engine.partition_rows(key).await? {
                    Some(rows) => rows,
                    // Dropped since it was listed.
                    None => continue,
                }
            } else {
                -1
            };
            out.push(PartitionInfo {
                key,
                table: key.table_name(),
                from: key.month.start(),
                to: key.month.end(),
                retention_class: key.retention_class,
                rows,
            });
        }
        Ok(out)
    }

    async fn partition_rows(&self, key: PartitionKey) -> Result<Option<i64>> {
        self.engine.partition_rows(key).await
    }

    async fn read_partition(
        &self,
        key: PartitionKey,
        after: Option<ArchiveCursor>,
        limit: u32,
    ) -> Result<Vec<(ArchiveCursor, ArchiveRow)>> {
        let q = match after {
            None => Q::new(format!(
                "SELECT {ARCHIVE_COLUMNS} FROM {} ORDER BY tenant_id, occurred_at, id LIMIT $1",
                key.table_name()
            ))
            .bind(i64::from(limit)),
            Some((tenant, occurred, id)) => Q::new(format!(
                "SELECT {ARCHIVE_COLUMNS} FROM {} \
                 WHERE (tenant_id, occurred_at, id) > ($1, $2, $3) \
                 ORDER BY tenant_id, occurred_at, id LIMIT $4",
                key.table_name()
            ))
            .bind(tenant.0)
            .bind(occurred)
            .bind(id.0)
            .bind(i64::from(limit)),
        };
        self.db.read(q).await?.iter().map(archive_from).collect()
    }

    async fn drop_partition(&self, key: PartitionKey, expected_rows: i64) -> Result<DropOutcome> {
        self.engine.drop_partition(key, expected_rows).await
    }

    async fn prune_idempotency(&self, tenants: &[TenantId], before: DateTime<Utc>) -> Result<u64> {
        self.engine.prune_idempotency(tenants, before).await
    }

    async fn prune_processed(&self, before: DateTime<Utc>) -> Result<u64> {
        self.engine.prune_processed(before).await
    }

    async fn active_retention_jobs(&self) -> Result<Vec<String>> {
        use job::Column as C;
        let jobs = job::Entity::find()
            .filter(C::Kind.eq(JobKind::Retention.as_str()))
            .filter(C::Status.is_in([JobStatus::Queued.as_str(), JobStatus::Processing.as_str()]))
            .all(&self.db)
            .await?;
        Ok(jobs
            .into_iter()
            .filter_map(|j| Some(j.params.get("partition")?.as_str()?.to_owned()))
            .collect())
    }

    // --- webhooks -----------------------------------------------------------

    async fn insert_endpoint(&self, ep: &Endpoint, secret: &[u8]) -> Result<()> {
        webhook_endpoint::Entity::insert(
            webhook_endpoint::Model::new(ep, secret).into_active_model(),
        )
        .exec_without_returning(&self.db)
        .await?;
        Ok(())
    }

    async fn list_endpoints(&self, tenant: Option<TenantId>) -> Result<Vec<Endpoint>> {
        use webhook_endpoint::Column as C;
        let rows = webhook_endpoint::Entity::find()
            .apply_if(tenant, |q, t| q.filter(C::TenantId.eq(t)))
            .order_by_asc(C::CreatedAt)
            .order_by_asc(C::Id)
            .all(&self.db)
            .await?;
        Ok(rows.iter().map(Endpoint::from).collect())
    }

    async fn get_endpoint(&self, id: EndpointId) -> Result<Option<Endpoint>> {
        let row = webhook_endpoint::Entity::find_by_id(id)
            .one(&self.db)
            .await?;
        Ok(row.as_ref().map(Endpoint::from))
    }

    async fn set_endpoint_enabled(
        &self,
        id: EndpointId,
        enabled: bool,
        reason: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        use webhook_endpoint::Column as C;
        let mut tx = self.db.begin().await?;
        if !enabled
            && Self::disable_endpoint(&mut tx, id, reason.unwrap_or("disabled"), now).await?
        {
            tx.commit().await?;
            return Ok(true);
        }
        // Enabling, or disabling one already disabled (its reason changes).
        let n = tx
            .run(
                &webhook_endpoint::Entity::update_many()
                    .col_expr(C::Enabled, Expr::value(enabled))
                    .col_expr(
                        C::DisabledReason,
                        Expr::value(reason.filter(|_| !enabled).map(str::to_owned)),
                    )
                    .col_expr(C::UpdatedAt, Expr::value(Time(now)))
                    .filter(C::Id.eq(id)),
            )
            .await?;
        tx.commit().await?;
        Ok(n == 1)
    }

    async fn rotate_endpoint_secret(
        &self,
        id: EndpointId,
        secret: &[u8],
        previous_until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        use webhook_endpoint::Column as C;
        let r = webhook_endpoint::Entity::update_many()
            .col_expr(C::PreviousSecretEnc, Expr::col(C::SecretEnc))
            .col_expr(C::PreviousUntil, Expr::value(Time(previous_until)))
            .col_expr(C::SecretEnc, Expr::value(secret.to_vec()))
            .col_expr(C::UpdatedAt, Expr::value(Time(now)))
            .filter(C::Id.eq(id))
            .exec(&self.db)
            .await?;
        Ok(r.rows_affected == 1)
    }

    async fn tenant_subscribes(&self, tenant: TenantId, event_type: &str) -> Result<bool> {
        Ok(self
            .list_endpoints(Some(tenant))
            .await?
            .iter()
            .any(|e| e.wants(event_type)))
    }

    async fn claim_deliveries(
        &self,
        now: DateTime<Utc>,
        claim_for: Duration,
        limit: u32,
        skip: &[EndpointId],
    ) -> Result<Vec<DueDelivery>> {
        use webhook_delivery::Column as C;
        let d = self.d();
        // Relaxed: a claim lost to a crash only lets the delivery be
        // claimed again.
        let mut tx = self.db.begin_relaxed().await?;
        let ids: Vec<DeliveryId> = tx
            .fetch(
                Q::new(format!(
                    "SELECT d.id FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id \
                     WHERE d.status = 'pending' AND d.next_attempt_at <= $1 AND e.enabled \
                       AND (d.claimed_until IS NULL OR d.claimed_until < $1) AND NOT ({}) \
                     ORDER BY d.next_attempt_at LIMIT $2{}",
                    d.in_list("d.endpoint_id", 3, ListKind::Uuid),
                    d.skip_locked("d")
                ))
                .bind(now)
                .bind(i64::from(limit))
                .bind(skip.iter().map(|e| e.0).collect::<Vec<_>>()),
            )
            .await?
            .iter()
            .map(|r| r.uuid("id").map(DeliveryId))
            .collect::<Result<_>>()?;
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        tx.run(
            &webhook_delivery::Entity::update_many()
                .col_expr(C::ClaimedUntil, Expr::value(Time(now + claim_for)))
                .filter(C::Id.is_in(ids.clone())),
        )
        .await?;
        let due: Vec<webhook_delivery::Model> = tx
            .models(
                &webhook_delivery::Entity::find()
                    .filter(C::Id.is_in(ids))
                    .order_by_asc(C::NextAttemptAt),
            )
            .await?;
        let endpoints: HashMap<EndpointId, webhook_endpoint::Model> = tx
            .models::<webhook_endpoint::Model>(
                &webhook_endpoint::Entity::find()
                    .filter(webhook_endpoint::Column::Id.is_in(due.iter().map(|d| d.endpoint_id))),
            )
            .await?
            .into_iter()
            .map(|e| (e.id, e))
            .collect();
        tx.commit().await?;
        Ok(due
            .into_iter()
            .filter_map(|d| {
                let e = endpoints.get(&d.endpoint_id)?;
                let endpoint = Endpoint::from(e);
                Some(DueDelivery {
                    id: d.id,
                    secrets: SealedSecrets {
                        current: e.secret_enc.clone(),
                        previous: e
                            .previous_secret_enc
                            .clone()
                            .zip(endpoint.previous_secret_until),
                    },
                    endpoint,
                    event_type: d.event_type,
                    body: d.body,
                    attempts: unsigned(d.attempts),
                    emitted_at: d.emitted_at.0,
                })
            })
            .collect())
    }

    async fn release_deliveries(&self, ids: &[DeliveryId]) -> Result<()> {
        use webhook_delivery::Column as C;
        if ids.is_empty() {
            return Ok(());
        }
        webhook_delivery::Entity::update_many()
            .col_expr(C::ClaimedUntil, Expr::value(Option::<Time>::None))
            .filter(C::Id.is_in(ids.iter().copied()))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    async fn record_attempts(&self, records: &[AttemptRecord]) -> Result<()> {
        use webhook_delivery::Column as C;
        if records.is_empty() {
            return Ok(());
        }
        // Not worth an fsync per attempt: a crash loses at most the last
        // moments of the log, and their deliveries are simply attempted
        // again (same webhook-id, which receivers deduplicate).
        let mut tx = self.db.begin_relaxed().await?;
        for chunk in records.chunks(ROWS_PER_INSERT) {
            tx.run(&webhook_attempt::Entity::insert_many(chunk.iter().map(
                |r| webhook_attempt::ActiveModel::new(r.delivery, &r.attempt),
            )))
            .await?;
        }
        // Deliveries that end the same way are updated together (a flat-out
        // endpoint's batch is one statement); `last_attempt_at` is the
        // group's latest attempt.
        let mut groups: BTreeMap<(&str, u32, Option<Time>), (Time, Vec<DeliveryId>)> =
            BTreeMap::new();
        for r in records {
            let (status, next) = match &r.outcome {
                AttemptOutcome::Delivered => (DeliveryStatus::Delivered, None),
                AttemptOutcome::Retry { at } => (DeliveryStatus::Pending, Some(Time(*at))),
                AttemptOutcome::Failed { .. } => (DeliveryStatus::Failed, None),
            };
            let at = Time(r.attempt.attempted_at);
            let g = groups
                .entry((status.as_str(), r.attempt.attempt, next))
                .or_insert((at, Vec::new()));
            g.0 = Ord::max(g.0, at);
            g.1.push(r.delivery);
        }
        for ((status, attempts, next), (last, ids)) in groups {
            tx.run(
                &webhook_delivery::Entity::update_many()
                    .col_expr(C::Attempts, Expr::value(signed(attempts)))
                    .col_expr(C::LastAttemptAt, Expr::value(last))
                    .col_expr(C::Status, Expr::value(status))
                    .col_expr(C::NextAttemptAt, Expr::value(next))
                    .col_expr(C::ClaimedUntil, Expr::value(Option::<Time>::None))
                    .filter(C::Id.is_in(ids)),
            )
            .await?;
        }
        let mut exhausted = Vec::new();
        for r in records {
            match &r.outcome {
                AttemptOutcome::Failed {
                    disable: Some(reason),
                } => {
                    Self::disable_endpoint(&mut tx, r.endpoint, reason, r.attempt.attempted_at)
                        .await?;
                }
                AttemptOutcome::Failed { disable: None } => exhausted.push(r),
                _ => {}
            }
        }
        super::deliveries::notify_exhausted(&mut tx, &exhausted).await?;
        tx.commit().await
    }

    async fn list_deliveries(
        &self,
        tenant: TenantId,
        endpoint: Option<EndpointId>,
        status: Option<DeliveryStatus>,
        limit: u32,
    ) -> Result<Vec<Delivery>> {
        use webhook_delivery::Column as C;
        let rows = webhook_delivery::Entity::find()
            .filter(C::TenantId.eq(tenant))
            .apply_if(endpoint, |q, e| q.filter(C::EndpointId.eq(e)))
            .apply_if(status, |q, s| q.filter(C::Status.eq(s.as_str())))
            .order_by_desc(C::CreatedAt)
            .order_by_desc(C::Id)
            .limit(u64::from(limit))
            .all(&self.db)
            .await?;
        let mut attempts: HashMap<DeliveryId, Vec<Attempt>> = HashMap::new();
        if !rows.is_empty() {
            use webhook_attempt::Column as A;
            for a in webhook_attempt::Entity::find()
                .filter(A::DeliveryId.is_in(rows.iter().map(|r| r.id)))
                .order_by_asc(A::DeliveryId)
                .order_by_asc(A::Attempt)
                .all(&self.db)
                .await?
            {
                attempts.entry(a.delivery_id).or_default().push(a.into());
            }
        }
        rows.into_iter()
            .map(|r| {
                let tried = attempts.remove(&r.id).unwrap_or_default();
                Ok(r.into_delivery(tried)?)
            })
            .collect()
    }

    // --- quarantine ---------------------------------------------------------

    async fn next_inbox_row(
        &self,
        tenant: TenantId,
        after_seq: Option<i64>,
    ) -> Result<Option<(i64, EventId)>> {
        let row = self
            .db
            .write_opt(
                Q::new(
                    "SELECT seq, event_id FROM inbox WHERE tenant_id = $1 AND seq > $2 \
                     ORDER BY seq LIMIT 1",
                )
                .bind(tenant.0)
                .bind(after_seq.unwrap_or(i64::MIN)),
            )
            .await?;
        row.map(|r| Ok((r.int("seq")?, EventId(r.uuid("event_id")?))))
            .transpose()
    }

    async fn record_process_failure(&self, tenant: TenantId, seq: i64, error: &str) -> Result<u32> {
        let row = self
            .db
            .write_opt(
                Q::new(
                    "UPDATE inbox SET attempts = attempts + 1, last_error = $3 \
                     WHERE tenant_id = $1 AND seq = $2 RETURNING attempts",
                )
                .bind(tenant.0)
                .bind(seq)
                .bind(error),
            )
            .await?;
        Ok(row
            .map(|r| r.int("attempts"))
            .transpose()?
            .map_or(0, u32_of))
    }

    async fn quarantine(
        &self,
        tenant: TenantId,
        seq: i64,
        now: DateTime<Utc>,
    ) -> Result<Option<QuarantinedEvent>> {
        use quarantine::Column as C;
        // The row leaves the inbox and enters quarantine together.
        let mut tx = self.db.begin().await?;
        let Some(moved) = tx
            .fetch_opt(
                Q::new(
                    "DELETE FROM inbox WHERE tenant_id = $1 AND seq = $2 \
                     RETURNING event_id, payload, received_at, \
                               coalesce(last_error, 'unknown error') AS error, attempts",
                )
                .bind(tenant.0)
                .bind(seq),
            )
            .await?
        else {
            return Ok(None);
        };
        let row = quarantine::Model {
            tenant_id: tenant,
            event_id: EventId(moved.uuid("event_id")?),
            payload: moved.text("payload")?,
            received_at: moved.time("received_at")?.into(),
            error: moved.text("error")?,
            attempts: i32::try_from(moved.int("attempts")?).unwrap_or(i32::MAX),
            quarantined_at: now.into(),
        };
        tx.run(
            &quarantine::Entity::insert(row.clone().into_active_model()).on_conflict(
                OnConflict::columns([C::TenantId, C::EventId])
                    .update_columns([
                        C::Payload,
                        C::ReceivedAt,
                        C::Error,
                        C::Attempts,
                        C::QuarantinedAt,
                    ])
                    .to_owned(),
            ),
        )
        .await?;
        tx.commit().await?;
        self.engine.inbox_rewritten(tenant);
        Ok(Some(row.into()))
    }

    async fn list_quarantine(&self, tenant: TenantId, limit: u32) -> Result<Vec<QuarantinedEvent>> {
        use quarantine::Column as C;
        domain(
            quarantine::Entity::find()
                .filter(C::TenantId.eq(tenant))
                .order_by_asc(C::QuarantinedAt)
                .order_by_asc(C::EventId)
                .limit(u64::from(limit))
                .all(&self.db)
                .await?,
        )
    }

    async fn get_quarantined(
        &self,
        tenant: TenantId,
        event: EventId,
    ) -> Result<Option<QuarantinedEvent>> {
        domain_opt(
            quarantine::Entity::find_by_id((tenant, event))
                .one(&self.db)
                .await?,
        )
    }

    async fn retry_quarantined(&self, tenant: TenantId, event: EventId) -> Result<bool> {
        self.engine.inbox_rewritten(tenant);
        let mut tx = self.db.begin().await?;
        let found: Vec<quarantine::Model> = tx
            .models(&quarantine::Entity::find_by_id((tenant, event)))
            .await?;
        let Some(row) = found.into_iter().next() else {
            return Ok(false);
        };
        // Two retries at once: the one whose delete counts moves the event.
        if tx
            .run(&quarantine::Entity::delete_by_id((tenant, event)))
            .await?
            != 1
        {
            return Ok(false);
        }
        tx.execute(
            Q::new(
                "INSERT INTO inbox (tenant_id, event_id, payload, received_at) VALUES ($1, $2, $3, $4)",
            )
            .bind(tenant.0)
            .bind(event.0)
            .bind(row.payload)
            .bind(row.received_at.0),
        )
        .await?;
        tx.commit().await?;
        self.engine.inbox_rewritten(tenant);
        Ok(true)
    }

    async fn drop_quarantined(&self, tenant: TenantId, event: EventId) -> Result<bool> {
        let r = quarantine::Entity::delete_by_id((tenant, event))
            .exec(&self.db)
            .await?;
        Ok(r.rows_affected == 1)
    }

    // --- tracking plans -----------------------------------------------------

    async fn install_plan(
        &self,
        tenant: TenantId,
        document: Option<&Value>,
        at: DateTime<Utc>,
    ) -> Result<u32> {
        use tracking_plan::Column as C;
        // Two installs at once choose the same next version: the primary
        // key refuses the second, which reads the latest again.
        for _ in 0..5 {
            let latest = self
                .plan_version(tenant, None)
                .await?
                .map_or(0, |p| p.version);
            let row = tracking_plan::Model {
                tenant_id: tenant,
                version: signed(latest + 1),
                document: document.map(Value::to_string),
                installed_at: at.into(),
            };
            let inserted = tracking_plan::Entity::insert(row.into_active_model())
                .on_conflict(
                    OnConflict::columns([C::TenantId, C::Version])
                        .do_nothing()
                        .to_owned(),
                )
                .exec_without_returning(&self.db)
                .await?;
            if inserted == 1 {
                return Ok(latest + 1);
            }
        }
        Err(Error::Conflict(
            "the tracking plan is being changed concurrently; try again".to_owned(),
        ))
    }

    async fn plan_version(
        &self,
        tenant: TenantId,
        version: Option<u32>,
    ) -> Result<Option<PlanVersion>> {
        use tracking_plan::Column as C;
        domain_opt(
            tracking_plan::Entity::find()
                .filter(C::TenantId.eq(tenant))
                .apply_if(version, |q, v| q.filter(C::Version.eq(signed(v))))
                .order_by_desc(C::Version)
                .one(&self.db)
                .await?,
        )
    }

    async fn plan_history(&self, tenant: TenantId) -> Result<Vec<PlanVersion>> {
        use tracking_plan::Column as C;
        domain(
            tracking_plan::Entity::find()
                .filter(C::TenantId.eq(tenant))
                .order_by_asc(C::Version)
                .all(&self.db)
                .await?,
        )
    }

    async fn latest_plan_versions(&self) -> Result<Vec<(TenantId, u32)>> {
        use tracking_plan::Column as C;
        let rows: Vec<(TenantId, i32)> = tracking_plan::Entity::find()
            .select_only()
            .column(C::TenantId)
            .column_as(C::Version.max(), "version")
            .group_by(C::TenantId)
            .into_tuple()
            .all(&self.db)
            .await?;
        Ok(rows.into_iter().map(|(t, v)| (t, unsigned(v))).collect())
    }

    async fn taken_keys(&self, tenant: TenantId, keys: &[String]) -> Result<Vec<TakenKey>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.db
            .read(ingest::taken_query(self.d(), tenant.0, keys.to_vec()))
            .await?
            .iter()
            .map(ingest::taken_from)
            .collect()
    }
}

/// New deliveries, due at once; one already made for the same endpoint and
/// event (`ce_id`) is left as it is.
pub(crate) async fn insert_delivery_rows(
    tx: &mut Tx<'_>,
    deliveries: &[NewDelivery],
    now: Time,
) -> Result<()> {
    use sea_orm::ActiveValue::Set;
    use webhook_delivery::Column as C;
    for chunk in deliveries.chunks(ROWS_PER_INSERT) {
        let rows = chunk.iter().map(|d| webhook_delivery::ActiveModel {
            id: Set(d.id),
            endpoint_id: Set(d.endpoint_id),
            tenant_id: Set(d.tenant_id),
            event_type: Set(d.event_type.clone()),
            ce_id: Set(d.ce_id.clone()),
            body: Set(d.body.clone()),
            status: Set(DeliveryStatus::Pending.as_str().to_owned()),
            attempts: Set(0),
            next_attempt_at: Set(Some(now)),
            created_at: Set(now),
            emitted_at: Set(d.emitted_at.into()),
            ..Default::default()
        });
        tx.run(
            &webhook_delivery::Entity::insert_many(rows).on_conflict(
                OnConflict::columns([C::EndpointId, C::CeId])
                    .do_nothing()
                    .to_owned(),
            ),
        )
        .await?;
    }
    Ok(())
}

/// The columns [`event_from`] reads.
pub(crate) const EVENT_COLUMNS: &str = "id, kind, event, contact_id, user_id, anonymous_id, \
     properties, occurred_at, occurred_offset_s, received_at, annotations";

/// A `tracked_events` row read with [`EVENT_COLUMNS`].
pub(crate) fn event_from(r: &Row) -> Result<StoredEvent> {
    Ok(StoredEvent {
        id: EventId(r.uuid("id")?),
        kind: r.text("kind")?.parse().map_err(Error::Corrupt)?,
        event: r.opt_text("event")?,
        contact_id: ContactId(r.uuid("contact_id")?),
        user_id: r.opt_text("user_id")?,
        anonymous_id: r.opt_text("anonymous_id")?,
        properties: object(r.json("properties")?),
        occurred_at: r
            .time("occurred_at")?
            .with_timezone(&offset(r.int("occurred_offset_s")?)?),
        received_at: r.time("received_at")?,
        plan: super::plan_of(r.opt_json("annotations")?)?,
    })
}

/// The columns [`archive_from`] reads.
const ARCHIVE_COLUMNS: &str = "tenant_id, id, kind, event, contact_id, user_id, anonymous_id, \
     properties, occurred_at, occurred_offset_s, received_at, idempotency_key, retention_class";

/// A partition's row read with [`ARCHIVE_COLUMNS`], and its cursor.
fn archive_from(r: &Row) -> Result<(ArchiveCursor, ArchiveRow)> {
    let tenant = TenantId(r.uuid("tenant_id")?);
    let id = EventId(r.uuid("id")?);
    let occurred = r.time("occurred_at")?;
    let row = super::archive_row(
        tenant,
        id,
        r.text("kind")?,
        r.opt_text("event")?,
        ContactId(r.uuid("contact_id")?),
        r.opt_text("user_id")?,
        r.opt_text("anonymous_id")?,
        r.json("properties")?,
        occurred,
        i32::try_from(r.int("occurred_offset_s")?)
            .map_err(|_| Error::Corrupt("offset out of range".to_owned()))?,
        r.time("received_at")?,
        r.text("idempotency_key")?,
        i16::try_from(r.int("retention_class")?)
            .map_err(|_| Error::Corrupt("retention class out of range".to_owned()))?,
    )?;
    Ok(((tenant, occurred, id), row))
}

/// An event's UTC offset, stored in seconds.
fn offset(seconds: i64) -> Result<FixedOffset> {
    i32::try_from(seconds)
        .ok()
        .and_then(FixedOffset::east_opt)
        .ok_or_else(|| Error::Corrupt(format!("offset {seconds}")))
}

/// The partitions a backend knows exist: a cache in front of its catalog
/// (creating one that exists is harmless, so a stale "missing" costs a
/// statement, never a wrong answer).
#[derive(Debug, Default)]
pub(crate) struct KnownPartitions(parking_lot::Mutex<std::collections::HashSet<PartitionKey>>);

impl KnownPartitions {
    /// Those of `keys` not known to exist, in their order.
    pub(crate) fn missing(&self, keys: &[PartitionKey]) -> Vec<PartitionKey> {
        let known = self.0.lock();
        keys.iter()
            .filter(|k| !known.contains(k))
            .copied()
            .collect()
    }

    pub(crate) fn add(&self, keys: impl IntoIterator<Item = PartitionKey>) {
        self.0.lock().extend(keys);
    }

    /// Every known partition, sorted.
    pub(crate) fn sorted(&self) -> Vec<PartitionKey> {
        let mut keys: Vec<PartitionKey> = self.0.lock().iter().copied().collect();
        keys.sort();
        keys
    }

    pub(crate) fn forget(&self) {
        self.0.lock().clear();
    }

    fn remove(&self, key: &PartitionKey) {
        self.0.lock().remove(key);
    }
}

/// The end of a partition drop, once `tx` holds what keeps rows out of
/// `key`'s table (`rows`: its row count then, `None` when it is gone
/// already): it is dropped only if it still has the `expected` rows its
/// archive holds, and `known` forgets it once it is gone.
pub(crate) async fn drop_counted(
    mut tx: Tx<'_>,
    key: PartitionKey,
    rows: Option<i64>,
    expected: i64,
    known: &KnownPartitions,
) -> Result<DropOutcome> {
    let outcome = match rows {
        None if expected == 0 => DropOutcome::Dropped,
        None => DropOutcome::RowsChanged { rows: 0 },
        Some(rows) if rows != expected => DropOutcome::RowsChanged { rows },
        Some(_) => {
            tx.execute(Q::new(format!("DROP TABLE {}", key.table_name())))
                .await?;
            DropOutcome::Dropped
        }
    };
    tx.commit().await?;
    if rows.is_none() || outcome == DropOutcome::Dropped {
        known.remove(&key);
    }
    Ok(outcome)
}

/// A unique violation is a conflict with a readable message.
/// A new job row.
pub(crate) fn job_model(j: &Job) -> job::ActiveModel {
    use sea_orm::ActiveValue::Set;
    job::ActiveModel {
        id: Set(j.id),
        tenant_id: Set(j.tenant_id),
        kind: Set(j.kind.as_str().to_owned()),
        status: Set(j.status.as_str().to_owned()),
        params: Set(j.params.clone()),
        metadata: Set(Value::Object(j.metadata.clone())),
        created_at: Set(j.created_at.into()),
        ..Default::default()
    }
}

/// Writes a job's terminal state, its pending-event marker and its outbox
/// row in `tx` — only if `node` still holds the job, so a job ends exactly
/// once. Returns whether it did (the caller commits).
pub(crate) async fn end_job(tx: &mut Tx<'_>, j: &Job, node: NodeId, emit: &Emit) -> Result<bool> {
    use job::Column as C;
    let body = j.render();
    let n = tx
        .run(
            &job::Entity::update_many()
                .col_expr(C::Status, Expr::value(j.status.as_str()))
                .col_expr(C::Metadata, Expr::value(Value::Object(j.metadata.clone())))
                .col_expr(C::Result, Expr::value(j.result.clone()))
                .col_expr(C::ExecutionTimeMs, Expr::value(j.execution_time_ms))
                .col_expr(C::FinishedAt, Expr::value(j.finished_at.map(Time)))
                .col_expr(C::EventBody, Expr::value(body.as_str()))
                // Pending while a relayed sink owes its outbox row; the
                // fan-out's deliveries commit with this transaction.
                .col_expr(C::EventPending, Expr::value(emit.relays()))
                .col_expr(C::ClaimedBy, Expr::value(Option::<NodeId>::None))
                .col_expr(C::ClaimExpiresAt, Expr::value(Option::<Time>::None))
                .filter(C::Id.eq(j.id))
                .filter(C::ClaimedBy.eq(node))
                .filter(C::Status.eq(JobStatus::Processing.as_str())),
        )
        .await?;
    if n != 1 {
        return Ok(false);
    }
    let (routing_key, ce_id) = job_event(j.id, j.status);
    outbox::write(
        tx,
        vec![outbox::Entry {
            tenant_id: j.tenant_id,
            topic: Topic::Job,
            routing_key,
            ce_id,
            subject: j.id.0.to_string(),
            body,
            record: None,
            job_id: Some(j.id),
            created_at: j.finished_at.unwrap_or_else(Utc::now),
        }],
        emit,
    )
    .await?;
    Ok(true)
}

pub(crate) fn unique_as_conflict(err: Error, what: &str) -> Error {
    match &err {
        Error::Database(sqlx::Error::Database(db)) if db.is_unique_violation() => {
            Error::Conflict(format!("{what} already exists"))
        }
        _ => err,
    }
}

fn corrupt(e: impl std::fmt::Display) -> Error {
    Error::Corrupt(e.to_string())
}

fn u32_of(v: i64) -> u32 {
    v.clamp(0, i64::from(u32::MAX)) as u32
}

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}
