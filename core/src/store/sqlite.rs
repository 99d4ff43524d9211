//! Embedded storage on SQLite: WAL with `synchronous=FULL` (a 202 survives
//! power loss), one writer connection, a pool of readers.
//!
//! Timestamps are integer microseconds since the epoch, uuids 16-byte blobs.
//! `tracked_events` is one table per month and retention class
//! (`tracked_events_y2026m11_r13`), each with a CHECK on its month, so that
//! retention drops whole tables exactly as on PostgreSQL.

use std::{
    collections::{HashMap, HashSet},
    path::Path,
    str::FromStr,
    time::Duration as StdDuration,
};

use async_trait::async_trait;
use chrono::{DateTime, Duration, FixedOffset, TimeZone, Utc};
use fastack_entities::{
    ApiKey, ApiKeyId, Attempt, Contact, ContactId, Delivery, DeliveryId, DeliveryStatus, Endpoint,
    EndpointId, EventId, EventKind, IdentityKind, Job, JobId, JobKind, JobStatus, NewEvent, NodeId,
    Plan, QuarantinedEvent, StoredEvent, Tenant, TenantId,
};
use parking_lot::Mutex;
use sea_orm::SqlxSqliteConnector;
use serde_json::{Map, Value};
use sqlx::{
    AssertSqlSafe, Row, SqliteConnection, SqlitePool,
    sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
    },
};
use uuid::Uuid;

use super::{
    ArchiveCursor, ArchiveRow, AttemptOutcome, Backend, DropOutcome, DueDelivery, Emit, EventQuery,
    Fence, IngestRow, KeepFn, KeyRecord, Month, NewDelivery, OutboxRow, OutboxSide, PartitionInfo,
    PartitionKey, ProcessOutcome, ProcessRequest, SealedSecrets, Storage, TRACKED_SUBSCRIBED,
    TimeRange, Topic, archive_row, decode_payload, job_event, map_unique, tracked_body,
};
use crate::{
    error::{Error, Result},
    identity::{self, Snapshot},
};

/// SQLite's default limit of bound parameters per statement is 32766; stay
/// well below it.
const MAX_PARAMS: usize = 30_000;

#[derive(Debug)]
pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
    partitions: Mutex<HashSet<PartitionKey>>,
}

fn us(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

fn from_us(v: i64) -> Result<DateTime<Utc>> {
    Utc.timestamp_micros(v)
        .single()
        .ok_or_else(|| Error::Corrupt(format!("timestamp {v}")))
}

/// `?, ?, …` (n anonymous placeholders). Large statements use anonymous
/// placeholders only: SQLite looks a numbered one up by name, which makes
/// binding thousands of `$N` quadratic (measured: 73 % of a batch's time).
fn ph(n: usize) -> String {
    let mut s = String::with_capacity(n * 3);
    for i in 0..n {
        if i > 0 {
            s.push_str(", ");
        }
        s.push('?');
    }
    s
}

/// `(?, ?, …), (…)`: `rows` tuples of `cols` placeholders.
fn tuples(rows: usize, cols: usize) -> String {
    let one = format!("({})", ph(cols));
    let mut s = String::with_capacity(rows * (one.len() + 2));
    for r in 0..rows {
        if r > 0 {
            s.push_str(", ");
        }
        s.push_str(&one);
    }
    s
}

/// `$start, $start+1, …`: for the few statements that reuse a parameter.
fn numbered(start: usize, n: usize) -> String {
    (start..start + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn tenant_from_row(row: &SqliteRow) -> Result<Tenant> {
    let plan: String = row.try_get("plan")?;
    Ok(Tenant {
        id: TenantId(row.try_get("id")?),
        name: row.try_get("name")?,
        plan: Plan::from_str(&plan).map_err(|e| Error::Corrupt(e.to_string()))?,
        retention_months: row
            .try_get::<Option<i64>, _>("retention_months")?
            .map(|v| v as u32),
        created_at: from_us(row.try_get("created_at")?)?,
    })
}

fn key_from_row(row: &SqliteRow) -> Result<ApiKey> {
    Ok(ApiKey {
        id: ApiKeyId(row.try_get("id")?),
        tenant_id: TenantId(row.try_get("tenant_id")?),
        prefix: row.try_get("prefix")?,
        rate_limit_rps: row
            .try_get::<Option<i64>, _>("rate_limit_rps")?
            .map(|v| v as u32),
        created_at: from_us(row.try_get("created_at")?)?,
        revoked_at: row
            .try_get::<Option<i64>, _>("revoked_at")?
            .map(from_us)
            .transpose()?,
    })
}

fn event_from_row(row: &SqliteRow) -> Result<StoredEvent> {
    let kind: String = row.try_get("kind")?;
    let occurred = from_us(row.try_get("occurred_at")?)?;
    let offset: i64 = row.try_get("occurred_offset_s")?;
    let offset = FixedOffset::east_opt(offset as i32)
        .ok_or_else(|| Error::Corrupt(format!("offset {offset}")))?;
    let properties: String = row.try_get("properties")?;
    Ok(StoredEvent {
        id: EventId(row.try_get("id")?),
        kind: kind.parse().map_err(Error::Corrupt)?,
        event: row.try_get("event")?,
        contact_id: ContactId(row.try_get("contact_id")?),
        user_id: row.try_get("user_id")?,
        anonymous_id: row.try_get("anonymous_id")?,
        properties: serde_json::from_str(&properties)
            .map_err(|e| Error::Corrupt(format!("properties: {e}")))?,
        occurred_at: occurred.with_timezone(&offset),
        received_at: from_us(row.try_get("received_at")?)?,
    })
}

fn json_map(text: &str) -> Result<Map<String, Value>> {
    match serde_json::from_str(text).map_err(|e| Error::Corrupt(format!("json: {e}")))? {
        Value::Object(m) => Ok(m),
        _ => Ok(Map::new()),
    }
}

const TENANT_COLUMNS: &str = "id, name, plan, retention_months, created_at";
const JOB_COLUMNS: &str = "id, tenant_id, kind, status, params, metadata, result, execution_time_ms, \
                           created_at, finished_at, event_body, event_pending, attempts";
const OUTBOX_COLUMNS: &str =
    "id, tenant_id, topic, routing_key, ce_id, subject, body, job_id, created_at";

fn job_from_row(row: &SqliteRow) -> Result<Job> {
    let kind: String = row.try_get("kind")?;
    let status: String = row.try_get("status")?;
    let params: String = row.try_get("params")?;
    let metadata: String = row.try_get("metadata")?;
    let result: Option<String> = row.try_get("result")?;
    Ok(Job {
        id: JobId(row.try_get("id")?),
        tenant_id: TenantId(row.try_get("tenant_id")?),
        kind: kind.parse::<JobKind>().map_err(Error::Corrupt)?,
        status: status.parse::<JobStatus>().map_err(Error::Corrupt)?,
        params: serde_json::from_str(&params)
            .map_err(|e| Error::Corrupt(format!("params: {e}")))?,
        metadata: json_map(&metadata)?,
        result: result
            .map(|r| serde_json::from_str(&r))
            .transpose()
            .map_err(|e| Error::Corrupt(format!("result: {e}")))?,
        execution_time_ms: row.try_get("execution_time_ms")?,
        created_at: from_us(row.try_get("created_at")?)?,
        finished_at: row
            .try_get::<Option<i64>, _>("finished_at")?
            .map(from_us)
            .transpose()?,
        event_body: row.try_get("event_body")?,
        event_pending: row.try_get("event_pending")?,
        attempts: row.try_get::<i64, _>("attempts")?.max(0) as u32,
    })
}

const ENDPOINT_COLUMNS: &str = "id, tenant_id, url, events, enabled, disabled_reason, previous_until, \
                                created_at, updated_at";

fn endpoint_from_row(row: &SqliteRow) -> Result<Endpoint> {
    let events: String = row.try_get("events")?;
    Ok(Endpoint {
        id: EndpointId(row.try_get("id")?),
        tenant_id: TenantId(row.try_get("tenant_id")?),
        url: row.try_get("url")?,
        events: events
            .split(',')
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect(),
        enabled: row.try_get("enabled")?,
        disabled_reason: row.try_get("disabled_reason")?,
        previous_secret_until: row
            .try_get::<Option<i64>, _>("previous_until")?
            .map(from_us)
            .transpose()?,
        created_at: from_us(row.try_get("created_at")?)?,
        updated_at: from_us(row.try_get("updated_at")?)?,
    })
}

fn outbox_from_row(row: &SqliteRow) -> Result<OutboxRow> {
    let topic: String = row.try_get("topic")?;
    Ok(OutboxRow {
        id: row.try_get("id")?,
        tenant_id: TenantId(row.try_get("tenant_id")?),
        topic: Topic::parse(&topic)?,
        routing_key: row.try_get("routing_key")?,
        ce_id: row.try_get("ce_id")?,
        subject: row.try_get("subject")?,
        body: row.try_get("body")?,
        job_id: row.try_get::<Option<Uuid>, _>("job_id")?.map(JobId),
        created_at: from_us(row.try_get("created_at")?)?,
    })
}
const EVENT_COLUMNS: &str = "id, kind, event, contact_id, user_id, anonymous_id, properties, \
                             occurred_at, occurred_offset_s, received_at";

async fn create_partition(conn: &mut SqliteConnection, key: &PartitionKey) -> Result<()> {
    let table = key.table_name();
    let (from, to) = (us(key.month.start()), us(key.month.end()));
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {table} (
            tenant_id BLOB NOT NULL,
            occurred_at INTEGER NOT NULL CHECK (occurred_at >= {from} AND occurred_at < {to}),
            id BLOB NOT NULL,
            retention_class INTEGER NOT NULL CHECK (retention_class = {class}),
            kind TEXT NOT NULL,
            event TEXT,
            contact_id BLOB NOT NULL,
            user_id TEXT,
            anonymous_id TEXT,
            properties TEXT NOT NULL,
            occurred_offset_s INTEGER NOT NULL,
            received_at INTEGER NOT NULL,
            idempotency_key TEXT NOT NULL,
            PRIMARY KEY (tenant_id, occurred_at, id)
        ) WITHOUT ROWID",
        class = key.retention_class
    )))
    .execute(&mut *conn)
    .await?;
    sqlx::query(AssertSqlSafe(format!(
        "CREATE INDEX IF NOT EXISTS {table}_contact ON {table} (tenant_id, contact_id, occurred_at)"
    )))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

impl SqliteStore {
    pub async fn open(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            crate::private::ensure_dir(dir)?;
        }
        // Owner-only from the start: SQLite gives its WAL and shared-memory
        // files the database file's permissions.
        if path != Path::new(":memory:") {
            crate::private::create_file(path)?;
        }
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(StdDuration::from_secs(10))
            .foreign_keys(true);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .acquire_timeout(StdDuration::from_secs(30))
            .connect_with(options.clone())
            .await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(StdDuration::from_secs(30))
            .connect_with(options)
            .await?;
        Ok(SqliteStore {
            writer,
            reader,
            partitions: Mutex::new(HashSet::new()),
        })
    }

    async fn load_partitions(&self) -> Result<()> {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'tracked_events_y%'",
        )
        .fetch_all(&self.writer)
        .await?;
        let mut known = self.partitions.lock();
        for name in names {
            if let Some(key) = parse_table_name(&name) {
                known.insert(key);
            }
        }
        Ok(())
    }

    /// Partition tables overlapping a range.
    fn tables_for(&self, range: &TimeRange) -> Vec<String> {
        let months: HashSet<Month> = range.months().into_iter().collect();
        let known = self.partitions.lock();
        let mut keys: Vec<&PartitionKey> =
            known.iter().filter(|k| months.contains(&k.month)).collect();
        keys.sort();
        keys.into_iter().map(PartitionKey::table_name).collect()
    }

    async fn load_contact(&self, tenant: TenantId, id: ContactId) -> Result<Option<Contact>> {
        let mut current = id.0;
        for _ in 0..8 {
            let row = sqlx::query(
                "SELECT id, merged_into, traits, created_at, updated_at FROM contacts \
                 WHERE tenant_id = $1 AND id = $2",
            )
            .bind(tenant.0)
            .bind(current)
            .fetch_optional(&self.reader)
            .await?;
            let Some(row) = row else { return Ok(None) };
            if let Some(next) = row.try_get::<Option<Uuid>, _>("merged_into")? {
                current = next;
                continue;
            }
            let identities = sqlx::query(
                "SELECT kind, value FROM contact_identities WHERE tenant_id = $1 AND contact_id = $2 \
                 ORDER BY kind, value",
            )
            .bind(tenant.0)
            .bind(current)
            .fetch_all(&self.reader)
            .await?;
            let merged: Vec<Uuid> = sqlx::query_scalar(
                "SELECT id FROM contacts WHERE tenant_id = $1 AND merged_into = $2 ORDER BY id",
            )
            .bind(tenant.0)
            .bind(current)
            .fetch_all(&self.reader)
            .await?;
            let mut user_ids = Vec::new();
            let mut anonymous_ids = Vec::new();
            for r in identities {
                let kind: i64 = r.try_get("kind")?;
                let value: String = r.try_get("value")?;
                match IdentityKind::from_i16(kind as i16) {
                    Some(IdentityKind::User) => user_ids.push(value),
                    Some(IdentityKind::Anonymous) => anonymous_ids.push(value),
                    None => return Err(Error::Corrupt(format!("identity kind {kind}"))),
                }
            }
            let traits: String = row.try_get("traits")?;
            return Ok(Some(Contact {
                id: ContactId(current),
                user_ids,
                anonymous_ids,
                traits: json_map(&traits)?,
                merged_ids: merged.into_iter().map(ContactId).collect(),
                created_at: from_us(row.try_get("created_at")?)?,
                updated_at: from_us(row.try_get("updated_at")?)?,
            }));
        }
        Err(Error::Corrupt(format!(
            "merge chain of contact {id} too long"
        )))
    }

    async fn snapshot(
        conn: &mut SqliteConnection,
        tenant: TenantId,
        events: &[&NewEvent],
    ) -> Result<Snapshot> {
        let mut users: Vec<&str> = events.iter().filter_map(|e| e.user_id.as_deref()).collect();
        let mut anons: Vec<&str> = events
            .iter()
            .filter_map(|e| e.anonymous_id.as_deref())
            .collect();
        users.sort_unstable();
        users.dedup();
        anons.sort_unstable();
        anons.dedup();
        let mut snapshot = Snapshot::default();
        for (kind, values) in [
            (IdentityKind::User, &users),
            (IdentityKind::Anonymous, &anons),
        ] {
            for chunk in values.chunks(MAX_PARAMS) {
                let sql = format!(
                    "SELECT value, contact_id FROM contact_identities \
                     WHERE tenant_id = ? AND kind = ? AND value IN ({})",
                    ph(chunk.len())
                );
                let mut q = sqlx::query(AssertSqlSafe(sql))
                    .bind(tenant.0)
                    .bind(kind.as_i16());
                for v in chunk {
                    q = q.bind(*v);
                }
                for row in q.fetch_all(&mut *conn).await? {
                    snapshot.identities.insert(
                        (kind, row.try_get("value")?),
                        ContactId(row.try_get("contact_id")?),
                    );
                }
            }
        }
        let merging = events.iter().any(|e| {
            e.kind == EventKind::Identify && e.user_id.is_some() && e.anonymous_id.is_some()
        });
        let mut contacts: Vec<Uuid> = snapshot.identities.values().map(|c| c.0).collect();
        contacts.sort_unstable();
        contacts.dedup();
        if merging {
            for chunk in contacts.chunks(MAX_PARAMS) {
                let sql = format!(
                    "SELECT DISTINCT contact_id FROM contact_identities \
                     WHERE tenant_id = ? AND kind = 1 AND contact_id IN ({})",
                    ph(chunk.len())
                );
                let mut q = sqlx::query_scalar::<_, Uuid>(AssertSqlSafe(sql)).bind(tenant.0);
                for c in chunk {
                    q = q.bind(*c);
                }
                snapshot
                    .contacts_with_user
                    .extend(q.fetch_all(&mut *conn).await?.into_iter().map(ContactId));
            }
        }
        let need: Vec<Uuid> = if merging {
            contacts
        } else {
            identity::Plan::needs_traits(events, &snapshot)
                .into_iter()
                .map(|c| c.0)
                .collect()
        };
        for chunk in need.chunks(MAX_PARAMS) {
            let sql = format!(
                "SELECT id, traits FROM contacts WHERE tenant_id = ? AND id IN ({})",
                ph(chunk.len())
            );
            let mut q = sqlx::query(AssertSqlSafe(sql)).bind(tenant.0);
            for c in chunk {
                q = q.bind(*c);
            }
            for row in q.fetch_all(&mut *conn).await? {
                let traits: String = row.try_get("traits")?;
                snapshot
                    .traits
                    .insert(ContactId(row.try_get("id")?), json_map(&traits)?);
            }
        }
        Ok(snapshot)
    }

    async fn apply_plan(
        conn: &mut SqliteConnection,
        tenant: TenantId,
        plan: &identity::Plan,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let now = us(now);
        for chunk in plan.new_contacts.chunks(MAX_PARAMS / 6) {
            let sql = format!(
                "INSERT INTO contacts (id, tenant_id, merged_into, traits, created_at, updated_at) VALUES {}",
                tuples(chunk.len(), 6)
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for (c, traits) in chunk {
                q = q
                    .bind(c.0)
                    .bind(tenant.0)
                    .bind(None::<Uuid>)
                    .bind(serde_json::to_string(traits).expect("json map serialises"))
                    .bind(now)
                    .bind(now);
            }
            q.execute(&mut *conn).await?;
        }
        for chunk in plan.identities.chunks(MAX_PARAMS / 4) {
            let sql = format!(
                "INSERT INTO contact_identities (tenant_id, kind, value, contact_id) VALUES {} \
                 ON CONFLICT (tenant_id, kind, value) DO UPDATE SET contact_id = excluded.contact_id",
                tuples(chunk.len(), 4)
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for (kind, value, c) in chunk {
                q = q
                    .bind(tenant.0)
                    .bind(kind.as_i16())
                    .bind(value.as_str())
                    .bind(c.0);
            }
            q.execute(&mut *conn).await?;
        }
        for (merged, survivor) in &plan.merges {
            sqlx::query(
                "UPDATE contact_identities SET contact_id = $3 WHERE tenant_id = $1 AND contact_id = $2",
            )
            .bind(tenant.0)
            .bind(merged.0)
            .bind(survivor.0)
            .execute(&mut *conn)
            .await?;
            sqlx::query(
                "UPDATE contacts SET merged_into = $3, updated_at = $4 \
                 WHERE tenant_id = $1 AND (id = $2 OR merged_into = $2)",
            )
            .bind(tenant.0)
            .bind(merged.0)
            .bind(survivor.0)
            .bind(now)
            .execute(&mut *conn)
            .await?;
        }
        for (c, traits) in &plan.traits {
            sqlx::query(
                "UPDATE contacts SET traits = $3, updated_at = $4 WHERE tenant_id = $1 AND id = $2",
            )
            .bind(tenant.0)
            .bind(c.0)
            .bind(serde_json::to_string(traits).expect("json map serialises"))
            .bind(now)
            .execute(&mut *conn)
            .await?;
        }
        Ok(())
    }
}

/// A consumer is done with these outbox rows; jobs with nothing left to
/// send lose their pending-event marker (same transaction).
async fn release_rows(conn: &mut SqliteConnection, ids: &[i64], side: OutboxSide) -> Result<()> {
    let (clear, delete) = match side {
        OutboxSide::Publish => (
            "UPDATE outbox SET publish_pending = 0, claimed_until = NULL WHERE id IN",
            "DELETE FROM outbox WHERE NOT fanout_pending AND id IN",
        ),
        OutboxSide::Fanout => (
            "UPDATE outbox SET fanout_pending = 0, fanout_claimed_until = NULL WHERE id IN",
            "DELETE FROM outbox WHERE NOT publish_pending AND id IN",
        ),
    };
    for chunk in ids.chunks(MAX_PARAMS) {
        let list = ph(chunk.len());
        let mut q = sqlx::query_scalar::<_, Option<Uuid>>(AssertSqlSafe(format!(
            "{clear} ({list}) RETURNING job_id"
        )));
        for id in chunk {
            q = q.bind(*id);
        }
        let jobs: Vec<Uuid> = q
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .flatten()
            .collect();
        let mut d = sqlx::query(AssertSqlSafe(format!("{delete} ({list})")));
        for id in chunk {
            d = d.bind(*id);
        }
        d.execute(&mut *conn).await?;
        for job in jobs {
            sqlx::query(
                "UPDATE jobs SET event_pending = 0 WHERE id = $1 AND NOT EXISTS \
                 (SELECT 1 FROM outbox o WHERE o.job_id = $1 AND (o.publish_pending OR o.fanout_pending))",
            )
            .bind(job)
            .execute(&mut *conn)
            .await?;
        }
    }
    Ok(())
}

/// Rows of one month table, or `None` when it does not exist; callers run
/// it inside a transaction so existence and count agree.
async fn count_partition(conn: &mut SqliteConnection, table: &str) -> Result<Option<i64>> {
    let exists: Option<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' AND name = $1")
            .bind(table)
            .fetch_optional(&mut *conn)
            .await?;
    if exists.is_none() {
        return Ok(None);
    }
    let rows = sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(&mut *conn)
        .await?;
    Ok(Some(rows))
}

fn parse_table_name(name: &str) -> Option<PartitionKey> {
    PartitionKey::parse_table(name)
}

impl SqliteStore {
    async fn process_batch_on(
        &self,
        conn: &mut SqliteConnection,
        req: &ProcessRequest,
        emit: Emit,
    ) -> Result<ProcessOutcome> {
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        let held = sqlx::query(
            "UPDATE tenant_leases SET expires_at = $3 WHERE tenant_id = $1 AND node_id = $2 AND expires_at > $4",
        )
        .bind(req.tenant_id.0)
        .bind(req.node_id.0)
        .bind(us(req.now + req.lease_ttl))
        .bind(us(req.now))
        .execute(&mut *tx)
        .await?;
        if held.rows_affected() != 1 {
            return Err(Error::LeaseLost);
        }
        let rows = sqlx::query(
            "SELECT seq, event_id, payload, received_at FROM inbox WHERE tenant_id = $1 AND seq > $3 \
             ORDER BY seq LIMIT $2",
        )
        .bind(req.tenant_id.0)
        .bind(req.limit as i64)
        .bind(req.after_seq.unwrap_or(i64::MIN))
        .fetch_all(&mut *tx)
        .await?;
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(ProcessOutcome::default());
        }
        let mut seqs = Vec::with_capacity(rows.len());
        let mut items: Vec<(EventId, NewEvent, DateTime<Utc>)> = Vec::with_capacity(rows.len());
        for row in &rows {
            seqs.push(row.try_get::<i64, _>("seq")?);
            let payload: String = row.try_get("payload")?;
            items.push((
                EventId(row.try_get("event_id")?),
                decode_payload(&payload)?,
                from_us(row.try_get("received_at")?)?,
            ));
        }
        req.check_faults(&items)?;
        let mut fresh: HashSet<Uuid> = HashSet::with_capacity(items.len());
        for chunk in items.chunks(MAX_PARAMS / 3) {
            let sql = format!(
                "INSERT INTO processed_jobs (event_id, tenant_id, processed_at) VALUES {} \
                 ON CONFLICT DO NOTHING RETURNING event_id",
                tuples(chunk.len(), 3)
            );
            let mut q = sqlx::query_scalar::<_, Uuid>(AssertSqlSafe(sql));
            for (id, _, _) in chunk {
                q = q.bind(id.0).bind(req.tenant_id.0).bind(us(req.now));
            }
            fresh.extend(q.fetch_all(&mut *tx).await?);
        }
        let todo: Vec<&(EventId, NewEvent, DateTime<Utc>)> = items
            .iter()
            .filter(|(id, _, _)| fresh.contains(&id.0))
            .collect();
        let mut outcome = ProcessOutcome {
            consumed: items.len(),
            // Read in `seq` order.
            last_seq: seqs.last().copied(),
            already_processed: items.len() - todo.len(),
            received: items.iter().map(|(_, _, r)| *r).collect(),
            ..Default::default()
        };
        let mut created: Vec<PartitionKey> = Vec::new();
        if !todo.is_empty() {
            let events: Vec<&NewEvent> = todo.iter().map(|(_, e, _)| e).collect();
            let mut by_table: HashMap<PartitionKey, Vec<usize>> = HashMap::new();
            for (i, ev) in events.iter().enumerate() {
                let key = PartitionKey {
                    month: Month::of(ev.occurred_at.with_timezone(&Utc)),
                    retention_class: req.retention_class,
                };
                by_table.entry(key).or_default().push(i);
            }
            // SQLite DDL is transactional: new month tables commit with the
            // rows they receive, or not at all.
            for key in by_table.keys() {
                if !self.partitions.lock().contains(key) {
                    create_partition(&mut tx, key).await?;
                    created.push(*key);
                }
            }
            let snapshot = Self::snapshot(&mut tx, req.tenant_id, &events).await?;
            let plan = identity::resolve(&events, &snapshot);
            Self::apply_plan(&mut tx, req.tenant_id, &plan, req.now).await?;

            for (key, idxs) in &by_table {
                for chunk in idxs.chunks(MAX_PARAMS / 13) {
                    let sql = format!(
                        "INSERT INTO {} (tenant_id, occurred_at, id, retention_class, kind, event, contact_id, \
                            user_id, anonymous_id, properties, occurred_offset_s, received_at, idempotency_key) VALUES {}",
                        key.table_name(),
                        tuples(chunk.len(), 13)
                    );
                    let mut q = sqlx::query(AssertSqlSafe(sql));
                    for &i in chunk {
                        let (id, ev, rec) = todo[i];
                        q = q
                            .bind(req.tenant_id.0)
                            .bind(ev.occurred_at.timestamp_micros())
                            .bind(id.0)
                            .bind(req.retention_class)
                            .bind(ev.kind.as_str())
                            .bind(ev.event.as_deref())
                            .bind(plan.contact_of[i].0)
                            .bind(ev.user_id.as_deref())
                            .bind(ev.anonymous_id.as_deref())
                            .bind(
                                serde_json::to_string(&ev.properties).expect("json map serialises"),
                            )
                            .bind(ev.occurred_at.offset().local_minus_utc())
                            .bind(us(*rec))
                            .bind(ev.idempotency_key.as_str());
                        outcome
                            .appended
                            .push((*id, ev.occurred_at.with_timezone(&Utc)));
                    }
                    q.execute(&mut *tx).await?;
                }
            }
            if emit.any() {
                const COLS: usize = 10;
                for (chunk_no, chunk) in todo.chunks(MAX_PARAMS / COLS).enumerate() {
                    let base = chunk_no * (MAX_PARAMS / COLS);
                    let sql = format!(
                        "INSERT INTO outbox (tenant_id, topic, routing_key, ce_id, subject, body, job_id, created_at, \
                            publish_pending, fanout_pending) VALUES {}",
                        tuples(chunk.len(), COLS)
                    );
                    let mut q = sqlx::query(AssertSqlSafe(sql));
                    for (j, (id, ev, rec)) in chunk.iter().enumerate() {
                        let body = tracked_body(&StoredEvent {
                            id: *id,
                            kind: ev.kind,
                            event: ev.event.clone(),
                            contact_id: plan.contact_of[base + j],
                            user_id: ev.user_id.clone(),
                            anonymous_id: ev.anonymous_id.clone(),
                            properties: ev.properties.clone(),
                            occurred_at: ev.occurred_at,
                            received_at: *rec,
                        });
                        q = q
                            .bind(req.tenant_id.0)
                            .bind("core")
                            .bind("core.event.tracked")
                            .bind(format!("fastack.event.tracked.{id}"))
                            .bind(id.to_string())
                            .bind(body)
                            .bind(None::<Uuid>)
                            .bind(us(req.now))
                            .bind(emit.publish)
                            .bind(emit.fanout);
                    }
                    q.execute(&mut *tx).await?;
                }
            }
        }
        for chunk in seqs.chunks(MAX_PARAMS) {
            let sql = format!("DELETE FROM inbox WHERE seq IN ({})", ph(chunk.len()));
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for s in chunk {
                q = q.bind(*s);
            }
            q.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        self.partitions.lock().extend(created);
        Ok(outcome)
    }
}

#[async_trait]
impl Storage for SqliteStore {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.reader).await?;
        Ok(())
    }

    async fn migrate(&self) -> Result<()> {
        use fastack_migration::MigratorTrait;
        let conn = SqlxSqliteConnector::from_sqlx_sqlite_pool(self.writer.clone());
        fastack_migration::Migrator::up(&conn, None).await?;
        self.load_partitions().await
    }

    async fn insert_tenant(&self, t: &Tenant) -> Result<()> {
        sqlx::query(
            "INSERT INTO tenants (id, name, plan, retention_months, created_at) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(t.id.0)
        .bind(&t.name)
        .bind(t.plan.as_str())
        .bind(t.retention_months.map(i64::from))
        .bind(us(t.created_at))
        .execute(&self.writer)
        .await
        .map_err(|e| map_unique(e, &format!("tenant named {}", t.name)))?;
        Ok(())
    }

    async fn list_tenants(&self) -> Result<Vec<Tenant>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {TENANT_COLUMNS} FROM tenants ORDER BY created_at, id"
        )))
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(tenant_from_row).collect()
    }

    async fn get_tenant(&self, id: TenantId) -> Result<Option<Tenant>> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {TENANT_COLUMNS} FROM tenants WHERE id = $1"
        )))
        .bind(id.0)
        .fetch_optional(&self.reader)
        .await?;
        row.as_ref().map(tenant_from_row).transpose()
    }

    async fn find_tenant_by_name(&self, name: &str) -> Result<Option<Tenant>> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {TENANT_COLUMNS} FROM tenants WHERE name = $1"
        )))
        .bind(name)
        .fetch_optional(&self.reader)
        .await?;
        row.as_ref().map(tenant_from_row).transpose()
    }

    async fn update_tenant_plan(
        &self,
        id: TenantId,
        plan: Plan,
        retention_months: Option<u32>,
    ) -> Result<bool> {
        let done = sqlx::query("UPDATE tenants SET plan = $2, retention_months = $3 WHERE id = $1")
            .bind(id.0)
            .bind(plan.as_str())
            .bind(retention_months.map(i64::from))
            .execute(&self.writer)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn insert_api_key(&self, key: &ApiKey, hash: &[u8; 32]) -> Result<()> {
        sqlx::query(
            "INSERT INTO api_keys (id, tenant_id, key_hash, prefix, rate_limit_rps, created_at, revoked_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(key.id.0)
        .bind(key.tenant_id.0)
        .bind(&hash[..])
        .bind(&key.prefix)
        .bind(key.rate_limit_rps.map(i64::from))
        .bind(us(key.created_at))
        .bind(key.revoked_at.map(us))
        .execute(&self.writer)
        .await
        .map_err(|e| map_unique(e, "api key"))?;
        Ok(())
    }

    async fn list_api_keys(&self, tenant: TenantId) -> Result<Vec<ApiKey>> {
        let rows = sqlx::query(
            "SELECT id, tenant_id, prefix, rate_limit_rps, created_at, revoked_at FROM api_keys \
             WHERE tenant_id = $1 ORDER BY created_at, id",
        )
        .bind(tenant.0)
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(key_from_row).collect()
    }

    async fn revoke_api_key(&self, id: ApiKeyId, at: DateTime<Utc>) -> Result<bool> {
        let done =
            sqlx::query("UPDATE api_keys SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL")
                .bind(id.0)
                .bind(us(at))
                .execute(&self.writer)
                .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn lookup_api_key(&self, hash: &[u8; 32]) -> Result<Option<KeyRecord>> {
        let row = sqlx::query(
            "SELECT k.id, k.tenant_id, k.prefix, k.rate_limit_rps, k.created_at, k.revoked_at, \
                    t.name, t.plan, t.retention_months, t.created_at AS tenant_created_at \
             FROM api_keys k JOIN tenants t ON t.id = k.tenant_id WHERE k.key_hash = $1",
        )
        .bind(&hash[..])
        .fetch_optional(&self.reader)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let key = key_from_row(&row)?;
        let plan: String = row.try_get("plan")?;
        let tenant = Tenant {
            id: key.tenant_id,
            name: row.try_get("name")?,
            plan: Plan::from_str(&plan).map_err(|e| Error::Corrupt(e.to_string()))?,
            retention_months: row
                .try_get::<Option<i64>, _>("retention_months")?
                .map(|v| v as u32),
            created_at: from_us(row.try_get("tenant_created_at")?)?,
        };
        Ok(Some(KeyRecord { key, tenant }))
    }

    async fn commit_ingest(&self, rows: &[IngestRow], keep: KeepFn<'_>) -> Result<Vec<Fence>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.writer.begin().await?;
        let mut inserted: HashSet<Uuid> = HashSet::with_capacity(rows.len());
        for chunk in rows.chunks(MAX_PARAMS / 6) {
            let sql = format!(
                "INSERT INTO idempotency_keys (tenant_id, idempotency_key, event_id, fingerprint, occurred_at, created_at) \
                 VALUES {} ON CONFLICT DO NOTHING RETURNING event_id",
                tuples(chunk.len(), 6)
            );
            let mut q = sqlx::query_scalar::<_, Uuid>(AssertSqlSafe(sql));
            for r in chunk {
                q = q
                    .bind(r.tenant_id.0)
                    .bind(r.idempotency_key.as_str())
                    .bind(r.event_id.0)
                    .bind(&r.fingerprint[..])
                    .bind(us(r.occurred_at))
                    .bind(us(r.received_at));
            }
            inserted.extend(q.fetch_all(&mut *tx).await?);
        }
        let mut fences = Vec::with_capacity(rows.len());
        let mut lookups: HashMap<(Uuid, &str), usize> = HashMap::new();
        for (i, r) in rows.iter().enumerate() {
            if inserted.contains(&r.event_id.0) {
                fences.push(Fence::Fresh);
            } else {
                lookups.insert((r.tenant_id.0, r.idempotency_key.as_str()), i);
                fences.push(Fence::Taken {
                    event_id: r.event_id,
                    fingerprint: [0; 32],
                });
            }
        }
        if !lookups.is_empty() {
            let wanted: Vec<(Uuid, &str)> = lookups.keys().copied().collect();
            for chunk in wanted.chunks(MAX_PARAMS / 2) {
                let conds = (0..chunk.len())
                    .map(|i| {
                        format!(
                            "(tenant_id = ${} AND idempotency_key = ${})",
                            2 * i + 1,
                            2 * i + 2
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(" OR ");
                let sql = format!(
                    "SELECT tenant_id, idempotency_key, event_id, fingerprint FROM idempotency_keys WHERE {conds}"
                );
                let mut q = sqlx::query(AssertSqlSafe(sql));
                for (t, k) in chunk {
                    q = q.bind(*t).bind(*k);
                }
                for row in q.fetch_all(&mut *tx).await? {
                    let t: Uuid = row.try_get("tenant_id")?;
                    let k: String = row.try_get("idempotency_key")?;
                    let fp: Vec<u8> = row.try_get("fingerprint")?;
                    if let Some(&i) = lookups.get(&(t, k.as_str())) {
                        fences[i] = Fence::Taken {
                            event_id: EventId(row.try_get("event_id")?),
                            fingerprint: fp
                                .as_slice()
                                .try_into()
                                .map_err(|_| Error::Corrupt("fingerprint length".to_owned()))?,
                        };
                    }
                }
            }
        }
        let kept = keep(&fences);
        for ((r, f), k) in rows.iter().zip(&fences).zip(&kept) {
            if matches!(f, Fence::Fresh) && !*k {
                sqlx::query(
                    "DELETE FROM idempotency_keys WHERE tenant_id = $1 AND idempotency_key = $2",
                )
                .bind(r.tenant_id.0)
                .bind(r.idempotency_key.as_str())
                .execute(&mut *tx)
                .await?;
            }
        }
        let accepted: Vec<&IngestRow> = rows
            .iter()
            .zip(&fences)
            .zip(&kept)
            .filter(|((_, f), k)| matches!(f, Fence::Fresh) && **k)
            .map(|((r, _), _)| r)
            .collect();
        for chunk in accepted.chunks(MAX_PARAMS / 4) {
            let sql = format!(
                "INSERT INTO inbox (tenant_id, event_id, payload, received_at) VALUES {}",
                tuples(chunk.len(), 4)
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for r in chunk {
                q = q
                    .bind(r.tenant_id.0)
                    .bind(r.event_id.0)
                    .bind(r.payload.as_str())
                    .bind(us(r.received_at));
            }
            q.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(fences)
    }

    async fn try_lease(
        &self,
        tenant: TenantId,
        node: NodeId,
        now: DateTime<Utc>,
        ttl: Duration,
    ) -> Result<bool> {
        let holder: Option<Uuid> = sqlx::query_scalar(
            "INSERT INTO tenant_leases (tenant_id, node_id, expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (tenant_id) DO UPDATE SET node_id = excluded.node_id, expires_at = excluded.expires_at \
             WHERE tenant_leases.node_id = excluded.node_id OR tenant_leases.expires_at < $4 \
             RETURNING node_id",
        )
        .bind(tenant.0)
        .bind(node.0)
        .bind(us(now + ttl))
        .bind(us(now))
        .fetch_optional(&self.writer)
        .await?;
        Ok(holder == Some(node.0))
    }

    async fn release_lease(&self, tenant: TenantId, node: NodeId) -> Result<()> {
        sqlx::query("DELETE FROM tenant_leases WHERE tenant_id = $1 AND node_id = $2")
            .bind(tenant.0)
            .bind(node.0)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    async fn backlog_tenants(&self, limit: u32) -> Result<Vec<TenantId>> {
        let ids: Vec<Uuid> = sqlx::query_scalar("SELECT DISTINCT tenant_id FROM inbox LIMIT $1")
            .bind(limit as i64)
            .fetch_all(&self.reader)
            .await?;
        Ok(ids.into_iter().map(TenantId).collect())
    }

    async fn inbox_stats(&self) -> Result<(i64, Option<DateTime<Utc>>)> {
        let row = sqlx::query("SELECT count(*) AS n, min(received_at) AS oldest FROM inbox")
            .fetch_one(&self.reader)
            .await?;
        let oldest: Option<i64> = row.try_get("oldest")?;
        Ok((row.try_get("n")?, oldest.map(from_us).transpose()?))
    }

    async fn process_batch(&self, req: &ProcessRequest) -> Result<ProcessOutcome> {
        let mut conn = self.writer.acquire().await?;
        // Whether the tenant's endpoints take `core.event.tracked` now. On
        // the one writer connection nothing can change the endpoints
        // between this read and the transaction below.
        let fanout: bool =
            sqlx::query_scalar(AssertSqlSafe(format!("SELECT {TRACKED_SUBSCRIBED}")))
                .bind(req.tenant_id.0)
                .fetch_one(&mut *conn)
                .await?;
        let emit = Emit {
            publish: req.publish_tracked,
            fanout,
        };
        // Processing may skip the fsync at commit: the inbox rows it consumes
        // are durable, and WAL with synchronous=NORMAL loses nothing on a
        // process crash (only the last transactions on power loss, which
        // are then processed again). With outbox rows the commit stays full.
        let relaxed = !emit.any();
        if relaxed {
            sqlx::query("PRAGMA synchronous = NORMAL")
                .execute(&mut *conn)
                .await?;
        }
        let result = self.process_batch_on(&mut conn, req, emit).await;
        if relaxed
            && let Err(e) = sqlx::query("PRAGMA synchronous = FULL")
                .execute(&mut *conn)
                .await
        {
            // Never hand a relaxed connection back to the pool.
            let _ = conn.detach();
            return Err(e.into());
        }
        result
    }

    async fn ensure_partitions(&self, keys: &[PartitionKey]) -> Result<()> {
        let missing: Vec<PartitionKey> = {
            let known = self.partitions.lock();
            keys.iter()
                .filter(|k| !known.contains(k))
                .copied()
                .collect()
        };
        if missing.is_empty() {
            return Ok(());
        }
        let mut tx = self.writer.begin().await?;
        for key in &missing {
            create_partition(&mut tx, key).await?;
        }
        tx.commit().await?;
        self.partitions.lock().extend(missing);
        Ok(())
    }

    async fn query_events(&self, q: &EventQuery) -> Result<Vec<StoredEvent>> {
        let tables = self.tables_for(&q.range);
        if tables.is_empty() {
            return Ok(Vec::new());
        }
        // $1 tenant, $2 from, $3 to, $4 limit, then optional filters.
        let mut filter = String::new();
        let mut next = 5;
        if q.event.is_some() {
            filter.push_str(&format!(" AND event = ${next}"));
            next += 1;
        }
        if q.after.is_some() {
            filter.push_str(&format!(
                " AND (occurred_at, id) > (${}, ${})",
                next,
                next + 1
            ));
            next += 2;
        }
        if let Some(ids) = &q.contact_ids {
            filter.push_str(&format!(
                " AND contact_id IN ({})",
                numbered(next, ids.len().max(1))
            ));
        }
        let parts: Vec<String> = tables
            .iter()
            .map(|t| {
                format!(
                    "SELECT {EVENT_COLUMNS} FROM {t} \
                     WHERE tenant_id = $1 AND occurred_at >= $2 AND occurred_at < $3{filter}"
                )
            })
            .collect();
        let sql = format!(
            "SELECT * FROM ({}) ORDER BY occurred_at, id LIMIT $4",
            parts.join(" UNION ALL ")
        );
        let mut query = sqlx::query(AssertSqlSafe(sql))
            .bind(q.tenant_id.0)
            .bind(us(q.range.from))
            .bind(us(q.range.to))
            .bind(q.limit as i64);
        if let Some(event) = &q.event {
            query = query.bind(event.as_str());
        }
        if let Some((at, id)) = q.after {
            query = query.bind(us(at)).bind(id.0);
        }
        if let Some(ids) = &q.contact_ids {
            if ids.is_empty() {
                query = query.bind(Uuid::nil());
            }
            for c in ids {
                query = query.bind(c.0);
            }
        }
        let rows = query.fetch_all(&self.reader).await?;
        rows.iter().map(event_from_row).collect()
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
        let id: Option<Uuid> = sqlx::query_scalar(
            "SELECT contact_id FROM contact_identities WHERE tenant_id = $1 AND kind = $2 AND value = $3",
        )
        .bind(tenant.0)
        .bind(kind.as_i16())
        .bind(value)
        .fetch_optional(&self.reader)
        .await?;
        match id {
            Some(id) => self.load_contact(tenant, ContactId(id)).await,
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
        let mut total = 0;
        for table in self.tables_for(&range) {
            let n: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT count(*) FROM {table} WHERE tenant_id = $1 AND occurred_at >= $2 AND occurred_at < $3"
            )))
            .bind(tenant.0)
            .bind(us(range.from))
            .bind(us(range.to))
            .fetch_one(&self.reader)
            .await?;
            total += n;
        }
        Ok(total)
    }

    async fn insert_job(&self, job: &Job) -> Result<()> {
        sqlx::query(
            "INSERT INTO jobs (id, tenant_id, kind, status, params, metadata, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(job.id.0)
        .bind(job.tenant_id.0)
        .bind(job.kind.as_str())
        .bind(job.status.as_str())
        .bind(job.params.to_string())
        .bind(Value::Object(job.metadata.clone()).to_string())
        .bind(us(job.created_at))
        .execute(&self.writer)
        .await
        .map_err(|e| map_unique(e, "an active job for this partition"))?;
        Ok(())
    }

    async fn get_job(&self, tenant: TenantId, id: JobId) -> Result<Option<Job>> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE tenant_id = $1 AND id = $2"
        )))
        .bind(tenant.0)
        .bind(id.0)
        .fetch_optional(&self.reader)
        .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    async fn list_jobs(
        &self,
        tenant: TenantId,
        status: Option<JobStatus>,
        limit: u32,
    ) -> Result<Vec<Job>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE tenant_id = $1 AND ($2 IS NULL OR status = $2) \
             ORDER BY created_at DESC, id DESC LIMIT $3"
        )))
        .bind(tenant.0)
        .bind(status.map(|s| s.as_str()))
        .bind(limit as i64)
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(job_from_row).collect()
    }

    async fn claim_job(
        &self,
        node: NodeId,
        now: DateTime<Utc>,
        claim_for: Duration,
        kind: Option<JobKind>,
    ) -> Result<Option<Job>> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "UPDATE jobs SET status = 'processing', claimed_by = $1, claim_expires_at = $3, \
                    started_at = COALESCE(started_at, $2), attempts = attempts + 1 \
             WHERE id = (SELECT id FROM jobs WHERE ($4 IS NULL OR kind = $4) \
                         AND (status = 'queued' OR (status = 'processing' AND claim_expires_at < $2)) \
                         ORDER BY created_at LIMIT 1) \
             RETURNING {JOB_COLUMNS}"
        )))
        .bind(node.0)
        .bind(us(now))
        .bind(us(now + claim_for))
        .bind(kind.map(|k| k.as_str()))
        .fetch_optional(&self.writer)
        .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    async fn renew_job_claim(&self, id: JobId, node: NodeId, until: DateTime<Utc>) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE jobs SET claim_expires_at = $3 WHERE id = $1 AND claimed_by = $2 AND status = 'processing'",
        )
        .bind(id.0)
        .bind(node.0)
        .bind(us(until))
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn finish_job(&self, job: &Job, node: NodeId, emit: Emit) -> Result<bool> {
        let body = job.render();
        let mut tx = self.writer.begin().await?;
        let done = sqlx::query(
            "UPDATE jobs SET status = $3, metadata = $4, result = $5, execution_time_ms = $6, finished_at = $7, \
                    event_body = $8, event_pending = $9, claimed_by = NULL, claim_expires_at = NULL \
             WHERE id = $1 AND claimed_by = $2 AND status = 'processing'",
        )
        .bind(job.id.0)
        .bind(node.0)
        .bind(job.status.as_str())
        .bind(Value::Object(job.metadata.clone()).to_string())
        .bind(job.result.as_ref().map(|r| r.to_string()))
        .bind(job.execution_time_ms)
        .bind(job.finished_at.map(us))
        .bind(&body)
        .bind(emit.any())
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() != 1 {
            return Ok(false);
        }
        if emit.any() {
            let (routing_key, ce_id) = job_event(job);
            sqlx::query(
                "INSERT INTO outbox (tenant_id, topic, routing_key, ce_id, subject, body, job_id, created_at, \
                    publish_pending, fanout_pending) VALUES ($1, 'job', $2, $3, $4, $5, $6, $7, $8, $9)",
            )
            .bind(job.tenant_id.0)
            .bind(routing_key)
            .bind(ce_id)
            .bind(job.id.0.to_string())
            .bind(&body)
            .bind(job.id.0)
            .bind(us(job.finished_at.unwrap_or_else(Utc::now)))
            .bind(emit.publish)
            .bind(emit.fanout)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn claim_outbox(
        &self,
        now: DateTime<Utc>,
        claim_for: Duration,
        limit: u32,
    ) -> Result<Vec<OutboxRow>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "UPDATE outbox SET claimed_until = $2, attempts = attempts + 1 \
             WHERE id IN (SELECT id FROM outbox WHERE publish_pending \
                            AND (claimed_until IS NULL OR claimed_until < $1) ORDER BY id LIMIT $3) \
             RETURNING {OUTBOX_COLUMNS}"
        )))
        .bind(us(now))
        .bind(us(now + claim_for))
        .bind(limit as i64)
        .fetch_all(&self.writer)
        .await?;
        let mut out: Vec<OutboxRow> = rows.iter().map(outbox_from_row).collect::<Result<_>>()?;
        out.sort_by_key(|r| r.id);
        Ok(out)
    }

    async fn complete_publish(&self, ids: &[i64]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut tx = self.writer.begin().await?;
        release_rows(&mut tx, ids, OutboxSide::Publish).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn release_outbox(&self, ids: &[i64]) -> Result<()> {
        for chunk in ids.chunks(MAX_PARAMS) {
            let mut q = sqlx::query(AssertSqlSafe(format!(
                "UPDATE outbox SET claimed_until = NULL WHERE id IN ({})",
                ph(chunk.len())
            )));
            for id in chunk {
                q = q.bind(*id);
            }
            q.execute(&self.writer).await?;
        }
        Ok(())
    }

    async fn repair_pending_events(
        &self,
        now: DateTime<Utc>,
        claim_for: Duration,
        emit: Emit,
        limit: u32,
    ) -> Result<Vec<JobId>> {
        let mut tx = self.writer.begin().await?;
        let rows = sqlx::query(
            "UPDATE jobs SET repair_claimed_until = $2 \
             WHERE id IN (SELECT id FROM jobs \
                          WHERE event_pending AND status IN ('completed', 'failed') AND event_body IS NOT NULL \
                            AND (repair_claimed_until IS NULL OR repair_claimed_until < $1) \
                            AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.job_id = jobs.id) \
                          ORDER BY finished_at LIMIT $3) \
             RETURNING id, tenant_id, status, event_body",
        )
        .bind(us(now))
        .bind(us(now + claim_for))
        .bind(limit as i64)
        .fetch_all(&mut *tx)
        .await?;
        let mut repaired = Vec::with_capacity(rows.len());
        for row in &rows {
            let id: Uuid = row.try_get("id")?;
            let status: String = row.try_get("status")?;
            sqlx::query(
                "INSERT INTO outbox (tenant_id, topic, routing_key, ce_id, subject, body, job_id, created_at, \
                    publish_pending, fanout_pending) VALUES ($1, 'job', $2, $3, $4, $5, $6, $7, $8, $9)",
            )
            .bind(row.try_get::<Uuid, _>("tenant_id")?)
            .bind(format!("job.{status}"))
            .bind(format!("fastack.job.{status}.{id}"))
            .bind(id.to_string())
            .bind(row.try_get::<String, _>("event_body")?)
            .bind(id)
            .bind(us(now))
            .bind(emit.publish)
            .bind(emit.fanout)
            .execute(&mut *tx)
            .await?;
            repaired.push(JobId(id));
        }
        tx.commit().await?;
        Ok(repaired)
    }

    async fn outbox_depth(&self) -> Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT count(*) FROM outbox WHERE publish_pending")
                .fetch_one(&self.reader)
                .await?,
        )
    }

    async fn list_partitions(&self, with_rows: bool) -> Result<Vec<PartitionInfo>> {
        let mut keys: Vec<PartitionKey> = self.partitions.lock().iter().copied().collect();
        keys.sort();
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let table = key.table_name();
            let rows = if with_rows {
                match self.partition_rows(key).await? {
                    Some(rows) => rows,
                    None => continue,
                }
            } else {
                -1
            };
            out.push(PartitionInfo {
                key,
                table,
                from: key.month.start(),
                to: key.month.end(),
                retention_class: key.retention_class,
                rows,
            });
        }
        Ok(out)
    }

    async fn partition_rows(&self, key: PartitionKey) -> Result<Option<i64>> {
        // One read transaction: the existence check and the count see the
        // same snapshot, so a concurrent drop cannot fall between them.
        let mut tx = self.reader.begin().await?;
        let rows = count_partition(&mut tx, &key.table_name()).await?;
        tx.commit().await?;
        Ok(rows)
    }

    async fn read_partition(
        &self,
        key: PartitionKey,
        after: Option<ArchiveCursor>,
        limit: u32,
    ) -> Result<Vec<(ArchiveCursor, ArchiveRow)>> {
        let cols = "tenant_id, id, kind, event, contact_id, user_id, anonymous_id, properties, occurred_at, \
                    occurred_offset_s, received_at, idempotency_key, retention_class";
        let table = key.table_name();
        let rows =
            match after {
                None => {
                    sqlx::query(AssertSqlSafe(format!(
                        "SELECT {cols} FROM {table} ORDER BY tenant_id, occurred_at, id LIMIT $1"
                    )))
                    .bind(limit as i64)
                    .fetch_all(&self.reader)
                    .await?
                }
                Some((t, o, i)) => sqlx::query(AssertSqlSafe(format!(
                    "SELECT {cols} FROM {table} WHERE (tenant_id, occurred_at, id) > ($1, $2, $3) \
                     ORDER BY tenant_id, occurred_at, id LIMIT $4"
                )))
                .bind(t.0)
                .bind(us(o))
                .bind(i.0)
                .bind(limit as i64)
                .fetch_all(&self.reader)
                .await?,
            };
        rows.iter()
            .map(|r| {
                let tenant = TenantId(r.try_get("tenant_id")?);
                let id = EventId(r.try_get("id")?);
                let occurred = from_us(r.try_get("occurred_at")?)?;
                let props: String = r.try_get("properties")?;
                let row = archive_row(
                    tenant,
                    id,
                    r.try_get("kind")?,
                    r.try_get("event")?,
                    ContactId(r.try_get("contact_id")?),
                    r.try_get("user_id")?,
                    r.try_get("anonymous_id")?,
                    serde_json::from_str(&props)
                        .map_err(|e| Error::Corrupt(format!("properties: {e}")))?,
                    occurred,
                    r.try_get::<i64, _>("occurred_offset_s")? as i32,
                    from_us(r.try_get("received_at")?)?,
                    r.try_get("idempotency_key")?,
                    r.try_get::<i64, _>("retention_class")? as i16,
                )?;
                Ok(((tenant, occurred, id), row))
            })
            .collect()
    }

    async fn drop_partition(&self, key: PartitionKey, expected_rows: i64) -> Result<DropOutcome> {
        let table = key.table_name();
        // The single writer connection: nothing inserts while this runs.
        let mut tx = self.writer.begin().await?;
        let Some(rows) = count_partition(&mut tx, &table).await? else {
            self.partitions.lock().remove(&key);
            return Ok(if expected_rows == 0 {
                DropOutcome::Dropped
            } else {
                DropOutcome::RowsChanged { rows: 0 }
            });
        };
        if rows != expected_rows {
            return Ok(DropOutcome::RowsChanged { rows });
        }
        sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}")))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.partitions.lock().remove(&key);
        Ok(DropOutcome::Dropped)
    }

    async fn prune_idempotency(&self, tenants: &[TenantId], before: DateTime<Utc>) -> Result<u64> {
        let mut total = 0;
        for t in tenants {
            let done = sqlx::query(
                "DELETE FROM idempotency_keys WHERE tenant_id = $1 AND occurred_at < $2",
            )
            .bind(t.0)
            .bind(us(before))
            .execute(&self.writer)
            .await?;
            total += done.rows_affected();
        }
        Ok(total)
    }

    async fn prune_processed(&self, before: DateTime<Utc>) -> Result<u64> {
        let done = sqlx::query("DELETE FROM processed_jobs WHERE event_id < $1")
            .bind(super::v7_floor(before))
            .execute(&self.writer)
            .await?;
        Ok(done.rows_affected())
    }

    async fn active_retention_jobs(&self) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT json_extract(params, '$.partition') FROM jobs \
             WHERE kind = 'retention' AND status IN ('queued', 'processing')",
        )
        .fetch_all(&self.reader)
        .await?)
    }

    async fn insert_endpoint(&self, ep: &Endpoint, secret: &[u8]) -> Result<()> {
        sqlx::query(
            "INSERT INTO webhook_endpoints (id, tenant_id, url, events, secret_enc, enabled, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $7)",
        )
        .bind(ep.id.0)
        .bind(ep.tenant_id.0)
        .bind(&ep.url)
        .bind(ep.events.join(","))
        .bind(secret)
        .bind(ep.enabled)
        .bind(us(ep.created_at))
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    async fn list_endpoints(&self, tenant: Option<TenantId>) -> Result<Vec<Endpoint>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {ENDPOINT_COLUMNS} FROM webhook_endpoints WHERE $1 IS NULL OR tenant_id = $1 \
             ORDER BY created_at, id"
        )))
        .bind(tenant.map(|t| t.0))
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(endpoint_from_row).collect()
    }

    async fn get_endpoint(&self, id: EndpointId) -> Result<Option<Endpoint>> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {ENDPOINT_COLUMNS} FROM webhook_endpoints WHERE id = $1"
        )))
        .bind(id.0)
        .fetch_optional(&self.reader)
        .await?;
        row.as_ref().map(endpoint_from_row).transpose()
    }

    async fn set_endpoint_enabled(
        &self,
        id: EndpointId,
        enabled: bool,
        reason: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let mut tx = self.writer.begin().await?;
        let done = sqlx::query(
            "UPDATE webhook_endpoints SET enabled = $2, disabled_reason = $3, updated_at = $4 WHERE id = $1",
        )
        .bind(id.0)
        .bind(enabled)
        .bind(if enabled { None } else { reason })
        .bind(us(now))
        .execute(&mut *tx)
        .await?;
        if !enabled {
            sqlx::query(
                "UPDATE webhook_deliveries SET status = 'failed', next_attempt_at = NULL, claimed_until = NULL \
                 WHERE endpoint_id = $1 AND status = 'pending'",
            )
            .bind(id.0)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    async fn rotate_endpoint_secret(
        &self,
        id: EndpointId,
        secret: &[u8],
        previous_until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE webhook_endpoints SET previous_secret_enc = secret_enc, previous_until = $3, \
                    secret_enc = $2, updated_at = $4 WHERE id = $1",
        )
        .bind(id.0)
        .bind(secret)
        .bind(us(previous_until))
        .bind(us(now))
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn tenant_subscribes(&self, tenant: TenantId, event_type: &str) -> Result<bool> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM webhook_endpoints WHERE tenant_id = $1 AND enabled \
             AND (',' || events || ',') LIKE ('%,' || $2 || ',%'))",
        )
        .bind(tenant.0)
        .bind(event_type)
        .fetch_one(&self.reader)
        .await?)
    }

    async fn claim_fanout(
        &self,
        now: DateTime<Utc>,
        claim_for: Duration,
        limit: u32,
    ) -> Result<Vec<OutboxRow>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "UPDATE outbox SET fanout_claimed_until = $2 \
             WHERE id IN (SELECT id FROM outbox WHERE fanout_pending \
                            AND (fanout_claimed_until IS NULL OR fanout_claimed_until < $1) ORDER BY id LIMIT $3) \
             RETURNING {OUTBOX_COLUMNS}"
        )))
        .bind(us(now))
        .bind(us(now + claim_for))
        .bind(limit as i64)
        .fetch_all(&self.writer)
        .await?;
        let mut out: Vec<OutboxRow> = rows.iter().map(outbox_from_row).collect::<Result<_>>()?;
        out.sort_by_key(|r| r.id);
        Ok(out)
    }

    async fn complete_fanout(&self, done: &[i64], deliveries: &[NewDelivery]) -> Result<()> {
        if done.is_empty() {
            return Ok(());
        }
        let now = us(Utc::now());
        let mut tx = self.writer.begin().await?;
        for chunk in deliveries.chunks(MAX_PARAMS / 11) {
            let sql = format!(
                "INSERT INTO webhook_deliveries (id, endpoint_id, tenant_id, event_type, ce_id, body, status, \
                    attempts, next_attempt_at, created_at, emitted_at) VALUES {} \
                 ON CONFLICT (endpoint_id, ce_id) DO NOTHING",
                tuples(chunk.len(), 11)
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
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
                    .bind(us(d.emitted_at));
            }
            q.execute(&mut *tx).await?;
        }
        release_rows(&mut tx, done, OutboxSide::Fanout).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn claim_deliveries(
        &self,
        now: DateTime<Utc>,
        claim_for: Duration,
        limit: u32,
    ) -> Result<Vec<DueDelivery>> {
        let mut tx = self.writer.begin().await?;
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "SELECT d.id FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id \
             WHERE d.status = 'pending' AND d.next_attempt_at <= $1 AND e.enabled \
               AND (d.claimed_until IS NULL OR d.claimed_until < $1) \
             ORDER BY d.next_attempt_at LIMIT $2",
        )
        .bind(us(now))
        .bind(limit as i64)
        .fetch_all(&mut *tx)
        .await?;
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let list = ph(ids.len());
        let mut q = sqlx::query(AssertSqlSafe(format!(
            "UPDATE webhook_deliveries SET claimed_until = ? WHERE id IN ({list})"
        )))
        .bind(us(now + claim_for));
        for id in &ids {
            q = q.bind(*id);
        }
        q.execute(&mut *tx).await?;
        let mut q = sqlx::query(AssertSqlSafe(format!(
            "SELECT d.id AS d_id, d.event_type, d.body, d.attempts, d.emitted_at, e.id, e.tenant_id, e.url, e.events, \
                    e.enabled, e.disabled_reason, e.previous_until, e.created_at, e.updated_at, \
                    e.secret_enc, e.previous_secret_enc \
             FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id \
             WHERE d.id IN ({}) ORDER BY d.next_attempt_at",
            ph(ids.len())
        )));
        for id in &ids {
            q = q.bind(*id);
        }
        let rows = q.fetch_all(&mut *tx).await?;
        tx.commit().await?;
        rows.iter()
            .map(|r| {
                let endpoint = endpoint_from_row(r)?;
                let previous: Option<Vec<u8>> = r.try_get("previous_secret_enc")?;
                Ok(DueDelivery {
                    id: DeliveryId(r.try_get("d_id")?),
                    secrets: SealedSecrets {
                        current: r.try_get("secret_enc")?,
                        previous: previous.zip(endpoint.previous_secret_until),
                    },
                    endpoint,
                    event_type: r.try_get("event_type")?,
                    body: r.try_get("body")?,
                    attempts: r.try_get::<i64, _>("attempts")?.max(0) as u32,
                    emitted_at: from_us(r.try_get("emitted_at")?)?,
                })
            })
            .collect()
    }

    async fn release_deliveries(&self, ids: &[DeliveryId]) -> Result<()> {
        for chunk in ids.chunks(MAX_PARAMS) {
            let mut q = sqlx::query(AssertSqlSafe(format!(
                "UPDATE webhook_deliveries SET claimed_until = NULL WHERE id IN ({})",
                ph(chunk.len())
            )));
            for id in chunk {
                q = q.bind(id.0);
            }
            q.execute(&self.writer).await?;
        }
        Ok(())
    }

    async fn record_attempt(
        &self,
        delivery: DeliveryId,
        endpoint: EndpointId,
        attempt: &Attempt,
        outcome: &AttemptOutcome,
    ) -> Result<()> {
        let mut tx = self.writer.begin().await?;
        sqlx::query(
            "INSERT INTO webhook_attempts (delivery_id, attempt, attempted_at, status_code, error_kind, latency_ms) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(delivery.0)
        .bind(attempt.attempt as i64)
        .bind(us(attempt.attempted_at))
        .bind(attempt.status_code.map(i64::from))
        .bind(attempt.error_kind.as_deref())
        .bind(attempt.latency_ms as i64)
        .execute(&mut *tx)
        .await?;
        let (status, next) = match outcome {
            AttemptOutcome::Delivered => (DeliveryStatus::Delivered, None),
            AttemptOutcome::Retry { at } => (DeliveryStatus::Pending, Some(us(*at))),
            AttemptOutcome::Failed { .. } => (DeliveryStatus::Failed, None),
        };
        sqlx::query(
            "UPDATE webhook_deliveries SET attempts = $2, last_attempt_at = $3, status = $4, next_attempt_at = $5, \
                    claimed_until = NULL WHERE id = $1",
        )
        .bind(delivery.0)
        .bind(attempt.attempt as i64)
        .bind(us(attempt.attempted_at))
        .bind(status.as_str())
        .bind(next)
        .execute(&mut *tx)
        .await?;
        if let AttemptOutcome::Failed {
            disable: Some(reason),
        } = outcome
        {
            sqlx::query(
                "UPDATE webhook_endpoints SET enabled = 0, disabled_reason = $2, updated_at = $3 WHERE id = $1",
            )
            .bind(endpoint.0)
            .bind(reason)
            .bind(us(attempt.attempted_at))
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "UPDATE webhook_deliveries SET status = 'failed', next_attempt_at = NULL, claimed_until = NULL \
                 WHERE endpoint_id = $1 AND status = 'pending'",
            )
            .bind(endpoint.0)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn list_deliveries(
        &self,
        tenant: TenantId,
        endpoint: Option<EndpointId>,
        limit: u32,
    ) -> Result<Vec<Delivery>> {
        let rows = sqlx::query(
            "SELECT id, endpoint_id, tenant_id, event_type, ce_id, status, next_attempt_at, created_at \
             FROM webhook_deliveries WHERE tenant_id = $1 AND ($2 IS NULL OR endpoint_id = $2) \
             ORDER BY created_at DESC, id DESC LIMIT $3",
        )
        .bind(tenant.0)
        .bind(endpoint.map(|e| e.0))
        .bind(limit as i64)
        .fetch_all(&self.reader)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let id = DeliveryId(r.try_get("id")?);
            let attempts = sqlx::query(
                "SELECT attempt, attempted_at, status_code, error_kind, latency_ms FROM webhook_attempts \
                 WHERE delivery_id = $1 ORDER BY attempt",
            )
            .bind(id.0)
            .fetch_all(&self.reader)
            .await?
            .iter()
            .map(|a| {
                Ok(Attempt {
                    attempt: a.try_get::<i64, _>("attempt")? as u32,
                    attempted_at: from_us(a.try_get("attempted_at")?)?,
                    status_code: a.try_get::<Option<i64>, _>("status_code")?.map(|c| c as u16),
                    error_kind: a.try_get("error_kind")?,
                    latency_ms: a.try_get::<i64, _>("latency_ms")?.max(0) as u32,
                })
            })
            .collect::<Result<Vec<_>>>()?;
            let status: String = r.try_get("status")?;
            out.push(Delivery {
                webhook_id: id.webhook_id(),
                id,
                endpoint_id: EndpointId(r.try_get("endpoint_id")?),
                tenant_id: TenantId(r.try_get("tenant_id")?),
                event_type: r.try_get("event_type")?,
                ce_id: r.try_get("ce_id")?,
                status: status.parse().map_err(Error::Corrupt)?,
                attempts,
                next_attempt_at: r
                    .try_get::<Option<i64>, _>("next_attempt_at")?
                    .map(from_us)
                    .transpose()?,
                created_at: from_us(r.try_get("created_at")?)?,
            });
        }
        Ok(out)
    }
    async fn next_inbox_row(
        &self,
        tenant: TenantId,
        after_seq: Option<i64>,
    ) -> Result<Option<(i64, EventId)>> {
        let row = sqlx::query(
            "SELECT seq, event_id FROM inbox WHERE tenant_id = $1 AND seq > $2 ORDER BY seq LIMIT 1",
        )
        .bind(tenant.0)
        .bind(after_seq.unwrap_or(i64::MIN))
        .fetch_optional(&self.writer)
        .await?;
        row.map(|r| Ok((r.try_get("seq")?, EventId(r.try_get("event_id")?))))
            .transpose()
    }

    async fn record_process_failure(&self, tenant: TenantId, seq: i64, error: &str) -> Result<u32> {
        let attempts: Option<i64> = sqlx::query_scalar(
            "UPDATE inbox SET attempts = attempts + 1, last_error = $3 \
             WHERE tenant_id = $1 AND seq = $2 RETURNING attempts",
        )
        .bind(tenant.0)
        .bind(seq)
        .bind(error)
        .fetch_optional(&self.writer)
        .await?;
        Ok(attempts.unwrap_or(0).max(0) as u32)
    }

    async fn quarantine(
        &self,
        tenant: TenantId,
        seq: i64,
        now: DateTime<Utc>,
    ) -> Result<Option<QuarantinedEvent>> {
        let mut tx = self.writer.begin().await?;
        let moved = sqlx::query(
            "DELETE FROM inbox WHERE tenant_id = $1 AND seq = $2 \
             RETURNING tenant_id, event_id, payload, received_at, \
                       coalesce(last_error, 'unknown error') AS error, attempts",
        )
        .bind(tenant.0)
        .bind(seq)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(moved) = moved else {
            return Ok(None);
        };
        let row = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO quarantine ({QUARANTINE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (tenant_id, event_id) DO UPDATE SET payload = excluded.payload, \
                 received_at = excluded.received_at, error = excluded.error, \
                 attempts = excluded.attempts, quarantined_at = excluded.quarantined_at \
             RETURNING {QUARANTINE_COLUMNS}"
        )))
        .bind(moved.try_get::<Uuid, _>("tenant_id")?)
        .bind(moved.try_get::<Uuid, _>("event_id")?)
        .bind(moved.try_get::<String, _>("payload")?)
        .bind(moved.try_get::<i64, _>("received_at")?)
        .bind(moved.try_get::<String, _>("error")?)
        .bind(moved.try_get::<i64, _>("attempts")?)
        .bind(us(now))
        .fetch_one(&mut *tx)
        .await?;
        let out = quarantined_from_row(&row)?;
        tx.commit().await?;
        Ok(Some(out))
    }

    async fn list_quarantine(&self, tenant: TenantId, limit: u32) -> Result<Vec<QuarantinedEvent>> {
        sqlx::query(AssertSqlSafe(format!(
            "SELECT {QUARANTINE_COLUMNS} FROM quarantine WHERE tenant_id = $1 \
             ORDER BY quarantined_at, event_id LIMIT $2"
        )))
        .bind(tenant.0)
        .bind(limit as i64)
        .fetch_all(&self.reader)
        .await?
        .iter()
        .map(quarantined_from_row)
        .collect()
    }

    async fn get_quarantined(
        &self,
        tenant: TenantId,
        event: EventId,
    ) -> Result<Option<QuarantinedEvent>> {
        sqlx::query(AssertSqlSafe(format!(
            "SELECT {QUARANTINE_COLUMNS} FROM quarantine WHERE tenant_id = $1 AND event_id = $2"
        )))
        .bind(tenant.0)
        .bind(event.0)
        .fetch_optional(&self.reader)
        .await?
        .as_ref()
        .map(quarantined_from_row)
        .transpose()
    }

    async fn retry_quarantined(&self, tenant: TenantId, event: EventId) -> Result<bool> {
        let mut tx = self.writer.begin().await?;
        let moved = sqlx::query(
            "DELETE FROM quarantine WHERE tenant_id = $1 AND event_id = $2 \
             RETURNING payload, received_at",
        )
        .bind(tenant.0)
        .bind(event.0)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(moved) = moved else {
            return Ok(false);
        };
        sqlx::query(
            "INSERT INTO inbox (tenant_id, event_id, payload, received_at) VALUES ($1, $2, $3, $4)",
        )
        .bind(tenant.0)
        .bind(event.0)
        .bind(moved.try_get::<String, _>("payload")?)
        .bind(moved.try_get::<i64, _>("received_at")?)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn drop_quarantined(&self, tenant: TenantId, event: EventId) -> Result<bool> {
        let done = sqlx::query("DELETE FROM quarantine WHERE tenant_id = $1 AND event_id = $2")
            .bind(tenant.0)
            .bind(event.0)
            .execute(&self.writer)
            .await?;
        Ok(done.rows_affected() == 1)
    }
}

const QUARANTINE_COLUMNS: &str =
    "tenant_id, event_id, payload, received_at, error, attempts, quarantined_at";

fn quarantined_from_row(row: &SqliteRow) -> Result<QuarantinedEvent> {
    let payload: String = row.try_get("payload")?;
    Ok(QuarantinedEvent {
        tenant_id: TenantId(row.try_get("tenant_id")?),
        event_id: EventId(row.try_get("event_id")?),
        payload: QuarantinedEvent::payload_value(&payload),
        received_at: from_us(row.try_get("received_at")?)?,
        error: row.try_get("error")?,
        attempts: row.try_get::<i64, _>("attempts")?.max(0) as u32,
        quarantined_at: from_us(row.try_get("quarantined_at")?)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders() {
        assert_eq!(ph(2), "?, ?");
        assert_eq!(tuples(2, 2), "(?, ?), (?, ?)");
        assert_eq!(numbered(3, 2), "$3, $4");
        assert_eq!(
            parse_table_name("tracked_events_y2026m11_r13"),
            Some(PartitionKey {
                month: Month {
                    year: 2026,
                    month: 11
                },
                retention_class: 13
            })
        );
        assert_eq!(
            parse_table_name("tracked_events_y2026m11_r13_contact"),
            None
        );
    }
}
