//! [`SqlStore`]: the one implementation of [`Storage`]. Every transaction
//! that reads and writes plain records — tenants, API keys, leases, jobs,
//! the outbox and its claims, webhook endpoints, deliveries and attempts,
//! contacts, quarantine — is written here once, over the seam of
//! [`super::sql`]. What depends on a backend's storage layout (the group
//! commit, the processing transaction, monthly partitions, pruning) is the
//! [`Engine`] of that backend: `postgres.rs` and `sqlite.rs`.

use async_trait::async_trait;
use chrono::{DateTime, Duration, Utc};
use fastack_entities::{
    ApiKey, ApiKeyId, Attempt, Contact, ContactId, Delivery, DeliveryId, DeliveryStatus, Endpoint,
    EndpointId, EventId, IdentityKind, Job, JobId, JobKind, JobStatus, NodeId, Plan,
    QuarantinedEvent, StoredEvent, Tenant, TenantId,
};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::{
    ArchiveCursor, ArchiveRow, AttemptOutcome, Backend, DropOutcome, DueDelivery, Emit, EventQuery,
    Fence, IngestRow, KeepFn, KeyRecord, NewDelivery, OutboxRow, PartitionInfo, PartitionKey,
    ProcessOutcome, ProcessRequest, SealedSecrets, SinkName, Storage, TimeRange, Topic, job_event,
    outbox,
    sql::{Db, Dialect, ListKind, Q, Row, Tx},
};
use crate::error::{Error, Result};

/// What a backend does its own way: the storage layout of events (monthly
/// partitions), the hot path's bulk statements, schema migrations.
#[async_trait]
pub trait Engine: Send + Sync + std::fmt::Debug + 'static {
    async fn migrate(&self) -> Result<()>;
    async fn commit_ingest(&self, rows: &[IngestRow], keep: KeepFn<'_>) -> Result<Vec<Fence>>;
    async fn backlog_tenants(&self, limit: u32) -> Result<Vec<TenantId>>;
    async fn process_batch(&self, req: &ProcessRequest) -> Result<ProcessOutcome>;
    async fn ensure_partitions(&self, keys: &[PartitionKey]) -> Result<()>;
    async fn query_events(&self, q: &EventQuery) -> Result<Vec<StoredEvent>>;
    async fn count_events(&self, tenant: TenantId, range: TimeRange) -> Result<i64>;
    async fn list_partitions(&self, with_rows: bool) -> Result<Vec<PartitionInfo>>;
    async fn partition_rows(&self, key: PartitionKey) -> Result<Option<i64>>;
    async fn read_partition(
        &self,
        key: PartitionKey,
        after: Option<ArchiveCursor>,
        limit: u32,
    ) -> Result<Vec<(ArchiveCursor, ArchiveRow)>>;
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

const TENANT_COLUMNS: &str = "id, name, plan, retention_months, created_at";
const KEY_COLUMNS: &str = "id, tenant_id, prefix, rate_limit_rps, created_at, revoked_at";
const JOB_COLUMNS: &str = "id, tenant_id, kind, status, params, metadata, result, execution_time_ms, \
                           created_at, finished_at, event_body, event_pending, attempts";
const ENDPOINT_COLUMNS: &str = "id, tenant_id, url, events, enabled, disabled_reason, previous_until, \
                                created_at, updated_at";
const QUARANTINE_COLUMNS: &str =
    "tenant_id, event_id, payload, received_at, error, attempts, quarantined_at";
const DELIVERY_COLUMNS: &str =
    "id, endpoint_id, tenant_id, event_type, ce_id, status, next_attempt_at, created_at";

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

fn tenant_from(r: &Row) -> Result<Tenant> {
    Ok(Tenant {
        id: TenantId(r.uuid("id")?),
        name: r.text("name")?,
        plan: r.text("plan")?.parse::<Plan>().map_err(corrupt)?,
        retention_months: r.opt_int("retention_months")?.map(u32_of),
        created_at: r.time("created_at")?,
    })
}

fn key_from(r: &Row) -> Result<ApiKey> {
    Ok(ApiKey {
        id: ApiKeyId(r.uuid("id")?),
        tenant_id: TenantId(r.uuid("tenant_id")?),
        prefix: r.text("prefix")?,
        rate_limit_rps: r.opt_int("rate_limit_rps")?.map(u32_of),
        created_at: r.time("created_at")?,
        revoked_at: r.opt_time("revoked_at")?,
    })
}

fn job_from(r: &Row) -> Result<Job> {
    Ok(Job {
        id: JobId(r.uuid("id")?),
        tenant_id: TenantId(r.uuid("tenant_id")?),
        kind: r.text("kind")?.parse::<JobKind>().map_err(Error::Corrupt)?,
        status: r
            .text("status")?
            .parse::<JobStatus>()
            .map_err(Error::Corrupt)?,
        params: r.json("params")?,
        metadata: object(r.json("metadata")?),
        result: r.opt_json("result")?,
        execution_time_ms: r.opt_int("execution_time_ms")?,
        created_at: r.time("created_at")?,
        finished_at: r.opt_time("finished_at")?,
        event_body: r.opt_text("event_body")?,
        event_pending: r.bool("event_pending")?,
        attempts: u32_of(r.int("attempts")?),
    })
}

fn endpoint_from(r: &Row) -> Result<Endpoint> {
    Ok(Endpoint {
        id: EndpointId(r.uuid("id")?),
        tenant_id: TenantId(r.uuid("tenant_id")?),
        url: r.text("url")?,
        events: r
            .text("events")?
            .split(',')
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect(),
        enabled: r.bool("enabled")?,
        disabled_reason: r.opt_text("disabled_reason")?,
        previous_secret_until: r.opt_time("previous_until")?,
        created_at: r.time("created_at")?,
        updated_at: r.time("updated_at")?,
    })
}

fn quarantined_from(r: &Row) -> Result<QuarantinedEvent> {
    Ok(QuarantinedEvent {
        tenant_id: TenantId(r.uuid("tenant_id")?),
        event_id: EventId(r.uuid("event_id")?),
        payload: QuarantinedEvent::payload_value(&r.text("payload")?),
        received_at: r.time("received_at")?,
        error: r.text("error")?,
        attempts: u32_of(r.int("attempts")?),
        quarantined_at: r.time("quarantined_at")?,
    })
}

fn attempt_from(r: &Row) -> Result<Attempt> {
    Ok(Attempt {
        attempt: u32_of(r.int("attempt")?),
        attempted_at: r.time("attempted_at")?,
        status_code: r.opt_int("status_code")?.map(|c| c.clamp(0, 999) as u16),
        error_kind: r.opt_text("error_kind")?,
        latency_ms: u32_of(r.int("latency_ms")?),
    })
}

/// Rows per statement of a multi-row `VALUES` insert (SQLite binds at most
/// 32,766 values to one statement).
const ROWS_PER_INSERT: usize = 1_000;

/// `($k+1, …, $k+cols), (…)`: `rows` tuples numbered from `$k+1`.
fn values(rows: usize, cols: usize) -> String {
    let mut out = String::with_capacity(rows * cols * 5);
    for r in 0..rows {
        out.push_str(if r == 0 { "(" } else { ", (" });
        for c in 0..cols {
            if c > 0 {
                out.push_str(", ");
            }
            out.push('$');
            out.push_str(&(r * cols + c + 1).to_string());
        }
        out.push(')');
    }
    out
}

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
    async fn fail_pending(tx: &mut Tx<'_>, endpoint: EndpointId) -> Result<()> {
        tx.execute(
            Q::new(
                "UPDATE webhook_deliveries SET status = 'failed', next_attempt_at = NULL, claimed_until = NULL \
                 WHERE endpoint_id = $1 AND status = 'pending'",
            )
            .bind(endpoint.0),
        )
        .await?;
        Ok(())
    }
}

#[async_trait]
impl Storage for SqlStore {
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
        self.db
            .execute(
                Q::new(
                    "INSERT INTO tenants (id, name, plan, retention_months, created_at) \
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(t.id.0)
                .bind(t.name.as_str())
                .bind(t.plan.as_str())
                .bind(t.retention_months)
                .bind(t.created_at),
            )
            .await
            .map_err(|e| unique_as_conflict(e, &format!("tenant named {}", t.name)))?;
        Ok(())
    }

    async fn list_tenants(&self) -> Result<Vec<Tenant>> {
        self.db
            .read(Q::new(format!(
                "SELECT {TENANT_COLUMNS} FROM tenants ORDER BY created_at, id"
            )))
            .await?
            .iter()
            .map(tenant_from)
            .collect()
    }

    async fn get_tenant(&self, id: TenantId) -> Result<Option<Tenant>> {
        self.db
            .read_opt(
                Q::new(format!(
                    "SELECT {TENANT_COLUMNS} FROM tenants WHERE id = $1"
                ))
                .bind(id.0),
            )
            .await?
            .as_ref()
            .map(tenant_from)
            .transpose()
    }

    async fn find_tenant_by_name(&self, name: &str) -> Result<Option<Tenant>> {
        self.db
            .read_opt(
                Q::new(format!(
                    "SELECT {TENANT_COLUMNS} FROM tenants WHERE name = $1"
                ))
                .bind(name),
            )
            .await?
            .as_ref()
            .map(tenant_from)
            .transpose()
    }

    async fn update_tenant_plan(
        &self,
        id: TenantId,
        plan: Plan,
        retention_months: Option<u32>,
    ) -> Result<bool> {
        let n = self
            .db
            .execute(
                Q::new("UPDATE tenants SET plan = $2, retention_months = $3 WHERE id = $1")
                    .bind(id.0)
                    .bind(plan.as_str())
                    .bind(retention_months),
            )
            .await?;
        Ok(n == 1)
    }

    async fn insert_api_key(&self, key: &ApiKey, hash: &[u8; 32]) -> Result<()> {
        self.db
            .execute(
                Q::new(
                    "INSERT INTO api_keys (id, tenant_id, key_hash, prefix, rate_limit_rps, created_at, revoked_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7)",
                )
                .bind(key.id.0)
                .bind(key.tenant_id.0)
                .bind(&hash[..])
                .bind(key.prefix.as_str())
                .bind(key.rate_limit_rps)
                .bind(key.created_at)
                .bind(key.revoked_at),
            )
            .await
            .map_err(|e| unique_as_conflict(e, "api key"))?;
        Ok(())
    }

    async fn list_api_keys(&self, tenant: TenantId) -> Result<Vec<ApiKey>> {
        self.db
            .read(
                Q::new(format!(
                    "SELECT {KEY_COLUMNS} FROM api_keys WHERE tenant_id = $1 ORDER BY created_at, id"
                ))
                .bind(tenant.0),
            )
            .await?
            .iter()
            .map(key_from)
            .collect()
    }

    async fn revoke_api_key(&self, id: ApiKeyId, at: DateTime<Utc>) -> Result<bool> {
        let n = self
            .db
            .execute(
                Q::new("UPDATE api_keys SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL")
                    .bind(id.0)
                    .bind(at),
            )
            .await?;
        Ok(n == 1)
    }

    async fn lookup_api_key(&self, hash: &[u8; 32]) -> Result<Option<KeyRecord>> {
        let row = self
            .db
            .read_opt(
                Q::new(
                    "SELECT k.id, k.tenant_id, k.prefix, k.rate_limit_rps, k.created_at, k.revoked_at, \
                            t.name, t.plan, t.retention_months, t.created_at AS tenant_created_at \
                     FROM api_keys k JOIN tenants t ON t.id = k.tenant_id WHERE k.key_hash = $1",
                )
                .bind(&hash[..]),
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        let key = key_from(&row)?;
        let tenant = Tenant {
            id: key.tenant_id,
            name: row.text("name")?,
            plan: row.text("plan")?.parse::<Plan>().map_err(corrupt)?,
            retention_months: row.opt_int("retention_months")?.map(u32_of),
            created_at: row.time("tenant_created_at")?,
        };
        Ok(Some(KeyRecord { key, tenant }))
    }

    // --- the accept path --------------------------------------------------

    async fn commit_ingest(&self, rows: &[IngestRow], keep: KeepFn<'_>) -> Result<Vec<Fence>> {
        self.engine.commit_ingest(rows, keep).await
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

    async fn process_batch(&self, req: &ProcessRequest) -> Result<ProcessOutcome> {
        self.engine.process_batch(req).await
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

    async fn insert_job(&self, job: &Job) -> Result<()> {
        self.db
            .execute(
                Q::new(
                    "INSERT INTO jobs (id, tenant_id, kind, status, params, metadata, created_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7)",
                )
                .bind(job.id.0)
                .bind(job.tenant_id.0)
                .bind(job.kind.as_str())
                .bind(job.status.as_str())
                .bind(job.params.clone())
                .bind(Value::Object(job.metadata.clone()))
                .bind(job.created_at),
            )
            .await
            .map_err(|e| unique_as_conflict(e, "an active job for this partition"))?;
        Ok(())
    }

    async fn get_job(&self, tenant: TenantId, id: JobId) -> Result<Option<Job>> {
        self.db
            .read_opt(
                Q::new(format!(
                    "SELECT {JOB_COLUMNS} FROM jobs WHERE tenant_id = $1 AND id = $2"
                ))
                .bind(tenant.0)
                .bind(id.0),
            )
            .await?
            .as_ref()
            .map(job_from)
            .transpose()
    }

    async fn list_jobs(
        &self,
        tenant: TenantId,
        status: Option<JobStatus>,
        limit: u32,
    ) -> Result<Vec<Job>> {
        self.db
            .read(
                Q::new(format!(
                    "SELECT {JOB_COLUMNS} FROM jobs WHERE tenant_id = $1 AND ($2 IS NULL OR status = $2) \
                     ORDER BY created_at DESC, id DESC LIMIT $3"
                ))
                .bind(tenant.0)
                .bind(status.map(|s| s.as_str()))
                .bind(i64::from(limit)),
            )
            .await?
            .iter()
            .map(job_from)
            .collect()
    }

    async fn claim_job(
        &self,
        node: NodeId,
        now: DateTime<Utc>,
        claim_for: Duration,
        kind: Option<JobKind>,
    ) -> Result<Option<Job>> {
        self.db
            .write_opt(
                Q::new(format!(
                    "UPDATE jobs SET status = 'processing', claimed_by = $1, claim_expires_at = $3, \
                            started_at = COALESCE(started_at, $2), attempts = attempts + 1 \
                     WHERE id = (SELECT id FROM jobs WHERE ($4 IS NULL OR kind = $4) \
                                 AND (status = 'queued' OR (status = 'processing' AND claim_expires_at < $2)) \
                                 ORDER BY created_at LIMIT 1{}) \
                     RETURNING {JOB_COLUMNS}",
                    self.d().skip_locked("jobs")
                ))
                .bind(node.0)
                .bind(now)
                .bind(now + claim_for)
                .bind(kind.map(|k| k.as_str())),
            )
            .await?
            .as_ref()
            .map(job_from)
            .transpose()
    }

    async fn renew_job_claim(&self, id: JobId, node: NodeId, until: DateTime<Utc>) -> Result<bool> {
        let n = self
            .db
            .execute(
                Q::new(
                    "UPDATE jobs SET claim_expires_at = $3 \
                     WHERE id = $1 AND claimed_by = $2 AND status = 'processing'",
                )
                .bind(id.0)
                .bind(node.0)
                .bind(until),
            )
            .await?;
        Ok(n == 1)
    }

    async fn finish_job(&self, job: &Job, node: NodeId, emit: &Emit) -> Result<bool> {
        let body = job.render();
        let mut tx = self.db.begin().await?;
        let n = tx
            .execute(
                Q::new(
                    "UPDATE jobs SET status = $3, metadata = $4, result = $5, execution_time_ms = $6, \
                            finished_at = $7, event_body = $8, event_pending = $9, claimed_by = NULL, \
                            claim_expires_at = NULL \
                     WHERE id = $1 AND claimed_by = $2 AND status = 'processing'",
                )
                .bind(job.id.0)
                .bind(node.0)
                .bind(job.status.as_str())
                .bind(Value::Object(job.metadata.clone()))
                .bind(job.result.clone())
                .bind(job.execution_time_ms)
                .bind(job.finished_at)
                .bind(body.as_str())
                .bind(emit.any()),
            )
            .await?;
        if n != 1 {
            return Ok(false);
        }
        let (routing_key, ce_id) = job_event(job.id, job.status);
        outbox::write(
            &mut tx,
            vec![outbox::Entry {
                tenant_id: job.tenant_id,
                topic: Topic::Job,
                routing_key,
                ce_id,
                subject: job.id.0.to_string(),
                body,
                job_id: Some(job.id),
                created_at: job.finished_at.unwrap_or_else(Utc::now),
            }],
            emit,
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    // --- outbox -----------------------------------------------------------

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
                job_id: Some(id),
                created_at: now,
            });
            repaired.push(id);
        }
        outbox::write(&mut tx, entries, emit).await?;
        tx.commit().await?;
        Ok(repaired)
    }

    async fn outbox_depth(&self, sink: SinkName) -> Result<i64> {
        outbox::depth(&self.db, sink).await
    }

    // --- partitions and retention -----------------------------------------

    async fn list_partitions(&self, with_rows: bool) -> Result<Vec<PartitionInfo>> {
        self.engine.list_partitions(with_rows).await
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
        self.engine.read_partition(key, after, limit).await
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
        let partition = match self.d() {
            Dialect::Postgres => "params->>'partition'",
            Dialect::Sqlite => "json_extract(params, '$.partition')",
        };
        self.db
            .read(Q::new(format!(
                "SELECT {partition} AS partition FROM jobs \
                 WHERE kind = 'retention' AND status IN ('queued', 'processing') \
                   AND {partition} IS NOT NULL"
            )))
            .await?
            .iter()
            .map(|r| r.text("partition"))
            .collect()
    }

    // --- webhooks -----------------------------------------------------------

    async fn insert_endpoint(&self, ep: &Endpoint, secret: &[u8]) -> Result<()> {
        self.db
            .execute(
                Q::new(
                    "INSERT INTO webhook_endpoints (id, tenant_id, url, events, secret_enc, enabled, \
                        created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $7)",
                )
                .bind(ep.id.0)
                .bind(ep.tenant_id.0)
                .bind(ep.url.as_str())
                .bind(ep.events.join(","))
                .bind(secret)
                .bind(ep.enabled)
                .bind(ep.created_at),
            )
            .await?;
        Ok(())
    }

    async fn list_endpoints(&self, tenant: Option<TenantId>) -> Result<Vec<Endpoint>> {
        self.db
            .read(
                Q::new(format!(
                    "SELECT {ENDPOINT_COLUMNS} FROM webhook_endpoints \
                     WHERE $1 IS NULL OR tenant_id = $1 ORDER BY created_at, id"
                ))
                .bind(tenant.map(|t| t.0)),
            )
            .await?
            .iter()
            .map(endpoint_from)
            .collect()
    }

    async fn get_endpoint(&self, id: EndpointId) -> Result<Option<Endpoint>> {
        self.db
            .read_opt(
                Q::new(format!(
                    "SELECT {ENDPOINT_COLUMNS} FROM webhook_endpoints WHERE id = $1"
                ))
                .bind(id.0),
            )
            .await?
            .as_ref()
            .map(endpoint_from)
            .transpose()
    }

    async fn set_endpoint_enabled(
        &self,
        id: EndpointId,
        enabled: bool,
        reason: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let mut tx = self.db.begin().await?;
        let n = tx
            .execute(
                Q::new(
                    "UPDATE webhook_endpoints SET enabled = $2, disabled_reason = $3, updated_at = $4 \
                     WHERE id = $1",
                )
                .bind(id.0)
                .bind(enabled)
                .bind(if enabled { None } else { reason })
                .bind(now),
            )
            .await?;
        if !enabled {
            Self::fail_pending(&mut tx, id).await?;
        }
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
        let n = self
            .db
            .execute(
                Q::new(
                    "UPDATE webhook_endpoints SET previous_secret_enc = secret_enc, previous_until = $3, \
                            secret_enc = $2, updated_at = $4 WHERE id = $1",
                )
                .bind(id.0)
                .bind(secret)
                .bind(previous_until)
                .bind(now),
            )
            .await?;
        Ok(n == 1)
    }

    async fn tenant_subscribes(&self, tenant: TenantId, event_type: &str) -> Result<bool> {
        self.db
            .read_one(
                Q::new(
                    "SELECT EXISTS (SELECT 1 FROM webhook_endpoints WHERE tenant_id = $1 AND enabled \
                     AND (',' || events || ',') LIKE ('%,' || $2 || ',%')) AS yes",
                )
                .bind(tenant.0)
                .bind(event_type),
            )
            .await?
            .bool("yes")
    }

    async fn insert_deliveries(&self, deliveries: &[NewDelivery]) -> Result<()> {
        if deliveries.is_empty() {
            return Ok(());
        }
        let now = Utc::now();
        let mut tx = self.db.begin().await?;
        for chunk in deliveries.chunks(ROWS_PER_INSERT) {
            let mut q = Q::new(format!(
                "INSERT INTO webhook_deliveries (id, endpoint_id, tenant_id, event_type, ce_id, body, \
                    status, attempts, next_attempt_at, created_at, emitted_at) VALUES {} \
                 ON CONFLICT (endpoint_id, ce_id) DO NOTHING",
                values(chunk.len(), 11)
            ));
            for d in chunk {
                q = q
                    .bind(d.id.0)
                    .bind(d.endpoint_id.0)
                    .bind(d.tenant_id.0)
                    .bind(d.event_type.as_str())
                    .bind(d.ce_id.as_str())
                    .bind(d.body.as_str())
                    .bind("pending")
                    .bind(0i64)
                    .bind(now)
                    .bind(now)
                    .bind(d.emitted_at);
            }
            tx.execute(q).await?;
        }
        tx.commit().await
    }

    async fn claim_deliveries(
        &self,
        now: DateTime<Utc>,
        claim_for: Duration,
        limit: u32,
    ) -> Result<Vec<DueDelivery>> {
        let d = self.d();
        let mut tx = self.db.begin().await?;
        let ids: Vec<Uuid> = tx
            .fetch(
                Q::new(format!(
                    "SELECT d.id FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id \
                     WHERE d.status = 'pending' AND d.next_attempt_at <= $1 AND e.enabled \
                       AND (d.claimed_until IS NULL OR d.claimed_until < $1) \
                     ORDER BY d.next_attempt_at LIMIT $2{}",
                    d.skip_locked("d")
                ))
                .bind(now)
                .bind(i64::from(limit)),
            )
            .await?
            .iter()
            .map(|r| r.uuid("id"))
            .collect::<Result<_>>()?;
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        tx.execute(
            Q::new(format!(
                "UPDATE webhook_deliveries SET claimed_until = $2 WHERE {}",
                d.in_list("id", 1, ListKind::Uuid)
            ))
            .bind(ids.clone())
            .bind(now + claim_for),
        )
        .await?;
        let rows = tx
            .fetch(
                Q::new(format!(
                    "SELECT d.id AS d_id, d.event_type, d.body, d.attempts, d.emitted_at, e.id, e.tenant_id, \
                            e.url, e.events, e.enabled, e.disabled_reason, e.previous_until, e.created_at, \
                            e.updated_at, e.secret_enc, e.previous_secret_enc \
                     FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id \
                     WHERE {} ORDER BY d.next_attempt_at",
                    d.in_list("d.id", 1, ListKind::Uuid)
                ))
                .bind(ids),
            )
            .await?;
        tx.commit().await?;
        rows.iter()
            .map(|r| {
                let endpoint = endpoint_from(r)?;
                Ok(DueDelivery {
                    id: DeliveryId(r.uuid("d_id")?),
                    secrets: SealedSecrets {
                        current: r.bytes("secret_enc")?,
                        previous: r
                            .opt_bytes("previous_secret_enc")?
                            .zip(endpoint.previous_secret_until),
                    },
                    endpoint,
                    event_type: r.text("event_type")?,
                    body: r.text("body")?,
                    attempts: u32_of(r.int("attempts")?),
                    emitted_at: r.time("emitted_at")?,
                })
            })
            .collect()
    }

    async fn release_deliveries(&self, ids: &[DeliveryId]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        self.db
            .execute(
                Q::new(format!(
                    "UPDATE webhook_deliveries SET claimed_until = NULL WHERE {}",
                    self.d().in_list("id", 1, ListKind::Uuid)
                ))
                .bind(ids.iter().map(|d| d.0).collect::<Vec<Uuid>>()),
            )
            .await?;
        Ok(())
    }

    async fn record_attempt(
        &self,
        delivery: DeliveryId,
        endpoint: EndpointId,
        attempt: &Attempt,
        outcome: &AttemptOutcome,
    ) -> Result<()> {
        let mut tx = self.db.begin().await?;
        if self.d() == Dialect::Postgres {
            // Not worth an fsync per attempt: a crash loses at most the last
            // moments of the log, and their deliveries are simply attempted
            // again (same webhook-id, which receivers deduplicate).
            tx.execute(Q::new("SET LOCAL synchronous_commit = off"))
                .await?;
        }
        tx.execute(
            Q::new(
                "INSERT INTO webhook_attempts (delivery_id, attempt, attempted_at, status_code, error_kind, \
                    latency_ms) VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(delivery.0)
            .bind(attempt.attempt)
            .bind(attempt.attempted_at)
            .bind(attempt.status_code.map(u32::from))
            .bind(attempt.error_kind.as_deref())
            .bind(attempt.latency_ms),
        )
        .await?;
        let (status, next) = match outcome {
            AttemptOutcome::Delivered => (DeliveryStatus::Delivered, None),
            AttemptOutcome::Retry { at } => (DeliveryStatus::Pending, Some(*at)),
            AttemptOutcome::Failed { .. } => (DeliveryStatus::Failed, None),
        };
        tx.execute(
            Q::new(
                "UPDATE webhook_deliveries SET attempts = $2, last_attempt_at = $3, status = $4, \
                        next_attempt_at = $5, claimed_until = NULL WHERE id = $1",
            )
            .bind(delivery.0)
            .bind(attempt.attempt)
            .bind(attempt.attempted_at)
            .bind(status.as_str())
            .bind(next),
        )
        .await?;
        if let AttemptOutcome::Failed {
            disable: Some(reason),
        } = outcome
        {
            tx.execute(
                Q::new(
                    "UPDATE webhook_endpoints SET enabled = false, disabled_reason = $2, updated_at = $3 \
                     WHERE id = $1",
                )
                .bind(endpoint.0)
                .bind(reason.as_str())
                .bind(attempt.attempted_at),
            )
            .await?;
            Self::fail_pending(&mut tx, endpoint).await?;
        }
        tx.commit().await
    }

    async fn list_deliveries(
        &self,
        tenant: TenantId,
        endpoint: Option<EndpointId>,
        limit: u32,
    ) -> Result<Vec<Delivery>> {
        let rows = self
            .db
            .read(
                Q::new(format!(
                    "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries \
                     WHERE tenant_id = $1 AND ($2 IS NULL OR endpoint_id = $2) \
                     ORDER BY created_at DESC, id DESC LIMIT $3"
                ))
                .bind(tenant.0)
                .bind(endpoint.map(|e| e.0))
                .bind(i64::from(limit)),
            )
            .await?;
        let ids: Vec<Uuid> = rows.iter().map(|r| r.uuid("id")).collect::<Result<_>>()?;
        let mut attempts: std::collections::HashMap<Uuid, Vec<Attempt>> = Default::default();
        if !ids.is_empty() {
            for a in self
                .db
                .read(
                    Q::new(format!(
                        "SELECT delivery_id, attempt, attempted_at, status_code, error_kind, latency_ms \
                         FROM webhook_attempts WHERE {} ORDER BY delivery_id, attempt",
                        self.d().in_list("delivery_id", 1, ListKind::Uuid)
                    ))
                    .bind(ids),
                )
                .await?
            {
                attempts
                    .entry(a.uuid("delivery_id")?)
                    .or_default()
                    .push(attempt_from(&a)?);
            }
        }
        rows.iter()
            .map(|r| {
                let id = DeliveryId(r.uuid("id")?);
                Ok(Delivery {
                    webhook_id: id.webhook_id(),
                    id,
                    endpoint_id: EndpointId(r.uuid("endpoint_id")?),
                    tenant_id: TenantId(r.uuid("tenant_id")?),
                    event_type: r.text("event_type")?,
                    ce_id: r.text("ce_id")?,
                    status: r.text("status")?.parse().map_err(Error::Corrupt)?,
                    attempts: attempts.remove(&id.0).unwrap_or_default(),
                    next_attempt_at: r.opt_time("next_attempt_at")?,
                    created_at: r.time("created_at")?,
                })
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
        let row = tx
            .fetch_opt(
                Q::new(format!(
                    "INSERT INTO quarantine ({QUARANTINE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7) \
                     ON CONFLICT (tenant_id, event_id) DO UPDATE SET payload = excluded.payload, \
                         received_at = excluded.received_at, error = excluded.error, \
                         attempts = excluded.attempts, quarantined_at = excluded.quarantined_at \
                     RETURNING {QUARANTINE_COLUMNS}"
                ))
                .bind(tenant.0)
                .bind(moved.uuid("event_id")?)
                .bind(moved.text("payload")?)
                .bind(moved.time("received_at")?)
                .bind(moved.text("error")?)
                .bind(moved.int("attempts")?)
                .bind(now),
            )
            .await?
            .ok_or_else(|| Error::Corrupt("quarantine insert returned nothing".to_owned()))?;
        let out = quarantined_from(&row)?;
        tx.commit().await?;
        Ok(Some(out))
    }

    async fn list_quarantine(&self, tenant: TenantId, limit: u32) -> Result<Vec<QuarantinedEvent>> {
        self.db
            .read(
                Q::new(format!(
                    "SELECT {QUARANTINE_COLUMNS} FROM quarantine WHERE tenant_id = $1 \
                     ORDER BY quarantined_at, event_id LIMIT $2"
                ))
                .bind(tenant.0)
                .bind(i64::from(limit)),
            )
            .await?
            .iter()
            .map(quarantined_from)
            .collect()
    }

    async fn get_quarantined(
        &self,
        tenant: TenantId,
        event: EventId,
    ) -> Result<Option<QuarantinedEvent>> {
        self.db
            .read_opt(
                Q::new(format!(
                    "SELECT {QUARANTINE_COLUMNS} FROM quarantine WHERE tenant_id = $1 AND event_id = $2"
                ))
                .bind(tenant.0)
                .bind(event.0),
            )
            .await?
            .as_ref()
            .map(quarantined_from)
            .transpose()
    }

    async fn retry_quarantined(&self, tenant: TenantId, event: EventId) -> Result<bool> {
        let mut tx = self.db.begin().await?;
        let Some(moved) = tx
            .fetch_opt(
                Q::new(
                    "DELETE FROM quarantine WHERE tenant_id = $1 AND event_id = $2 \
                     RETURNING payload, received_at",
                )
                .bind(tenant.0)
                .bind(event.0),
            )
            .await?
        else {
            return Ok(false);
        };
        tx.execute(
            Q::new(
                "INSERT INTO inbox (tenant_id, event_id, payload, received_at) VALUES ($1, $2, $3, $4)",
            )
            .bind(tenant.0)
            .bind(event.0)
            .bind(moved.text("payload")?)
            .bind(moved.time("received_at")?),
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn drop_quarantined(&self, tenant: TenantId, event: EventId) -> Result<bool> {
        let n = self
            .db
            .execute(
                Q::new("DELETE FROM quarantine WHERE tenant_id = $1 AND event_id = $2")
                    .bind(tenant.0)
                    .bind(event.0),
            )
            .await?;
        Ok(n == 1)
    }
}

/// A unique violation is a conflict with a readable message.
fn unique_as_conflict(err: Error, what: &str) -> Error {
    match &err {
        Error::Database(sqlx::Error::Database(db)) if db.is_unique_violation() => {
            Error::Conflict(format!("{what} already exists"))
        }
        _ => err,
    }
}
