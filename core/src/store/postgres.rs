//! PostgreSQL storage. Batches travel as arrays (`UNNEST`), so a group commit
//! or a processing transaction is a handful of statements whatever its size,
//! and their text never changes (prepared once per connection).
//!
//! `tracked_events` is `PARTITION BY RANGE (occurred_at)` with a DEFAULT
//! partition that must stay empty; each month is itself `PARTITION BY LIST
//! (retention_class)` so that retention drops whole tables.

use std::time::{Duration as StdDuration, Instant};

use async_trait::async_trait;

use super::{
    db::Tx,
    engine::Engine,
    events::EventsEngine,
    events::{EVENT_COLUMNS, event_from},
    ingest::IngestEngine,
    partitions::{KnownPartitions, drop_counted},
    partitions::{Layout, PartitionsEngine},
    processing::{self, LEASE_MARK, ProcessingEngine, RENEW_LEASE},
};
use chrono::{DateTime, Utc};
use fastack_entities::{StoredEvent, TenantId};
use parking_lot::Mutex;
use sea_orm::SqlxPostgresConnector;
use sqlx::{
    AssertSqlSafe, Connection, PgPool, Row,
    postgres::{PgConnectOptions, PgConnection, PgPoolOptions},
};
use uuid::Uuid;

use super::{
    DropOutcome, EventQuery, Fence, IngestRow, KeepFn, KnownContacts, PartitionKey, ProcessOutcome,
    ProcessRequest, TRACKED_SUBSCRIBED, TimeRange,
};
use crate::error::{Error, Result};

/// A pooled connection idle for longer than this is pinged before use.
const IDLE_PING_AFTER: StdDuration = StdDuration::from_secs(1);

#[derive(Debug)]
pub struct PgStore {
    pool: PgPool,
    /// Connections of the group commit, kept outside the pool.
    commit_conns: CommitConns,
    /// Partitions known to exist; a miss costs one idempotent DDL round.
    partitions: KnownPartitions,
}

impl PgStore {
    pub async fn connect(url: &str) -> Result<Self> {
        let mut options: PgConnectOptions = url.parse()?;
        // TLS over loopback protects nothing and, with this driver, costs
        // tens of milliseconds per statement under load (measured: p50 of a
        // 202 at 2,000 req/s went from 80 ms to 4 ms). Keep whatever the URL
        // asks for; only default loopback connections to plain TCP.
        let host = options.get_host();
        let loopback = host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
            || host.starts_with('/');
        if loopback && !url.contains("sslmode") {
            options = options.ssl_mode(sqlx::postgres::PgSslMode::Disable);
        }
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .min_connections(1)
            // By default sqlx pings every connection it hands out: one more
            // round trip before each processing transaction. Only a
            // connection that sat idle may have died unnoticed (a database
            // restart); a busy one fails its statement instead, the caller
            // retries, and sqlx discards it.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for > IDLE_PING_AFTER {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .acquire_timeout(StdDuration::from_secs(10))
            .connect_with(options.clone().application_name("fastack"))
            .await?;
        Ok(PgStore {
            pool,
            commit_conns: CommitConns {
                options: options.application_name("fastack-ingest"),
                idle: Mutex::new(Vec::new()),
            },
            partitions: KnownPartitions::default(),
        })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// The group commit's own connections. Through the pool, every commit paid
/// one more round trip and a spawned task when the connection went back
/// (sqlx pings each released connection); the 202 path commits hundreds of
/// times a second, so it keeps connections of its own and hands them back
/// without a ping.
#[derive(Debug)]
struct CommitConns {
    options: PgConnectOptions,
    idle: Mutex<Vec<CommitConn>>,
}

/// Idle group-commit connections kept; commits in flight are few.
const COMMIT_CONNS_KEPT: usize = 8;

/// How long a connection trusts its reading of the server's clock.
const CLOCK_READING_TTL: StdDuration = StdDuration::from_secs(60);

/// A group-commit connection and a reading of the server's clock, which
/// turns the node's deadline (a monotonic instant) into the server's time
/// for the commit's guard. The reading is taken as the answer arrives, so
/// the server's clock was read no later than `read_at` in the node's time:
/// the deadline it gives is never later than the true one. The node's wall
/// clock plays no part (a stepped node clock cannot move the guard).
#[derive(Debug)]
struct CommitConn {
    conn: PgConnection,
    server_time: DateTime<Utc>,
    read_at: Instant,
}

impl CommitConn {
    async fn connect(options: &PgConnectOptions) -> Result<Self> {
        let mut conn = PgConnection::connect_with(options).await?;
        let (server_time, read_at) = read_clock(&mut conn).await?;
        Ok(CommitConn {
            conn,
            server_time,
            read_at,
        })
    }

    /// `deadline` on the server's clock (a reading older than a minute is
    /// taken again first: the two clocks drift, and the server's may step).
    async fn server_deadline(&mut self, deadline: Instant) -> Result<DateTime<Utc>> {
        if self.read_at.elapsed() > CLOCK_READING_TTL {
            (self.server_time, self.read_at) = read_clock(&mut self.conn).await?;
        }
        let ahead = deadline.saturating_duration_since(self.read_at);
        let behind = self.read_at.saturating_duration_since(deadline);
        let to_chrono =
            |d: StdDuration| chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX);
        Ok(self.server_time + to_chrono(ahead) - to_chrono(behind))
    }
}

async fn read_clock(conn: &mut PgConnection) -> Result<(DateTime<Utc>, Instant)> {
    let at: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&mut *conn)
        .await?;
    Ok((at, Instant::now()))
}

impl CommitConns {
    async fn take(&self) -> Result<CommitConn> {
        let idle = self.idle.lock().pop();
        match idle {
            Some(conn) => Ok(conn),
            None => CommitConn::connect(&self.options).await,
        }
    }

    /// Keeps `conn` unless the commit failed below SQL (the connection, or
    /// the server, is gone): then it and every idle one are dropped, so the
    /// next commit connects afresh instead of failing on another dead one.
    fn give_back<T>(&self, conn: CommitConn, result: &Result<T>) {
        let mut idle = self.idle.lock();
        match result {
            Err(Error::Database(e)) if !matches!(e, sqlx::Error::Database(_)) => idle.clear(),
            // The guard refused the group: the connection is fine.
            _ if idle.len() < COMMIT_CONNS_KEPT => idle.push(conn),
            _ => {}
        }
    }
}

/// One `tracked_events` (rows route to their month and class); the
/// partitions are made on a connection of their own under an advisory
/// lock, before the transaction touches the table, so it cannot deadlock
/// with the DDL.
#[async_trait]
impl Layout for PgStore {
    async fn prepare(&self, _tx: &mut Tx<'_>, keys: &[PartitionKey]) -> Result<()> {
        self.ensure_partitions(keys).await
    }

    fn table(&self, _key: &PartitionKey) -> String {
        "tracked_events".to_owned()
    }

    fn forget(&self) {
        self.partitions.forget();
    }

    fn created(&self, _keys: &[PartitionKey]) {}
}

/// The inbox table, as written once ([`WaitingEngine`]'s defaults).
impl super::waiting::WaitingEngine for PgStore {}

#[async_trait]
impl Engine for PgStore {
    async fn migrate(&self) -> Result<()> {
        // Serialise migrations of several nodes starting at once.
        let mut conn = self.pool.acquire().await?;
        sqlx::query("SELECT pg_advisory_lock(hashtext('fastack.migrate'))")
            .execute(&mut *conn)
            .await?;
        let conn_db = SqlxPostgresConnector::from_sqlx_postgres_pool(self.pool.clone());
        let result = fastack_migration::up(&conn_db)
            .await
            .map(super::newer_schema)
            .map_err(Error::Migration);
        sqlx::query("SELECT pg_advisory_unlock(hashtext('fastack.migrate'))")
            .execute(&mut *conn)
            .await?;
        result
    }
}

#[async_trait]
impl IngestEngine for PgStore {
    async fn commit_ingest(
        &self,
        rows: &[IngestRow],
        keep: KeepFn<'_>,
        deadline: Instant,
    ) -> Result<Vec<Fence>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.commit_conns.take().await?;
        let result = commit_group(&mut conn, rows, keep, deadline).await;
        self.commit_conns.give_back(conn, &result);
        result
    }
}

#[async_trait]
impl ProcessingEngine for PgStore {
    async fn backlog_tenants(&self, limit: u32) -> Result<Vec<TenantId>> {
        // A skip scan over the primary key's index, one descent per tenant:
        // `DISTINCT` would read the whole heap, dead rows included, which
        // for a queue table between vacuums is most of it.
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "WITH RECURSIVE t(id) AS ( \
                 (SELECT tenant_id FROM inbox ORDER BY tenant_id LIMIT 1) \
                 UNION ALL \
                 SELECT (SELECT i.tenant_id FROM inbox i WHERE i.tenant_id > t.id ORDER BY i.tenant_id LIMIT 1) \
                 FROM t WHERE t.id IS NOT NULL) \
             SELECT id FROM t WHERE id IS NOT NULL LIMIT $1",
        )
        .bind(limit as i64)
            .fetch_all(&self.pool)
            .await?;
        Ok(ids.into_iter().map(TenantId).collect())
    }

    async fn process_batch(
        &self,
        req: &ProcessRequest,
        known: &KnownContacts,
    ) -> Result<ProcessOutcome> {
        let mut tx = self.pool.begin().await?;
        // Fencing: renew the lease inside the transaction; the row lock
        // makes a concurrent takeover wait for this commit. The same
        // statement reads whether the tenant's endpoints take
        // `core.event.tracked` now, and sets how this commit is flushed:
        // with outbox rows, events may be out as soon as it commits, so it
        // waits for the WAL flush; without, it need not (the inbox rows it
        // consumes are durable, and a lost transaction is simply done
        // again).
        let held = sqlx::query(AssertSqlSafe(format!(
            "WITH s AS (SELECT {TRACKED_SUBSCRIBED} AS fanout) \
             {} \
             RETURNING s.fanout, set_config('synchronous_commit', \
                 CASE WHEN s.fanout OR $5 THEN 'on' ELSE 'off' END, true) AS sync, {LEASE_MARK}",
            RENEW_LEASE.replacen(" WHERE", " FROM s WHERE", 1)
        )))
        .bind(req.tenant_id.0)
        .bind(req.node_id.0)
        .bind(req.now + req.lease_ttl)
        .bind(req.now)
        .bind(req.tracked.any())
        .fetch_optional(&mut *tx)
        .await?;
        let Some(held) = held else {
            return Err(Error::LeaseLost);
        };
        let emit = req.emit_tracked(held.try_get("fanout")?);
        let lease = processing::lease_mark(&super::db::Row::Pg(held))?;
        processing::run(
            self,
            Tx::Pg(tx),
            emit,
            req,
            processing::Consume::InTransaction,
            (known, lease),
        )
        .await
    }
}

#[async_trait]
impl EventsEngine for PgStore {
    async fn query_events(&self, q: &EventQuery) -> Result<Vec<StoredEvent>> {
        let contacts: Option<Vec<Uuid>> = q
            .contact_ids
            .as_ref()
            .map(|ids| ids.iter().map(|c| c.0).collect());
        let (after_at, after_id) = match q.after {
            Some((at, id)) => (Some(at), Some(id.0)),
            None => (None, None),
        };
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {EVENT_COLUMNS} FROM tracked_events \
             WHERE tenant_id = $1 AND occurred_at >= $2 AND occurred_at < $3 \
               AND ($4::uuid[] IS NULL OR contact_id = ANY($4)) \
               AND ($5::text IS NULL OR event = $5) \
               AND ($6::timestamptz IS NULL OR (occurred_at, id) > ($6, $7::uuid)) \
             ORDER BY occurred_at, id LIMIT $8"
        )))
        .bind(q.tenant_id.0)
        .bind(q.range.from)
        .bind(q.range.to)
        .bind(contacts)
        .bind(q.event.as_deref())
        .bind(after_at)
        .bind(after_id)
        .bind(q.limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| event_from(&super::db::Row::Pg(r)))
            .collect()
    }

    async fn count_events(&self, tenant: TenantId, range: TimeRange) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM tracked_events WHERE tenant_id = $1 AND occurred_at >= $2 AND occurred_at < $3",
        )
        .bind(tenant.0)
        .bind(range.from)
        .bind(range.to)
        .fetch_one(&self.pool)
        .await?)
    }
}

#[async_trait]
impl PartitionsEngine for PgStore {
    fn layout(&self) -> &dyn Layout {
        self
    }

    fn known(&self) -> &KnownPartitions {
        &self.partitions
    }

    async fn create_partitions(&self, keys: &[PartitionKey]) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        // One creator at a time across nodes: CREATE ... IF NOT EXISTS is not
        // race-free on its own.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('fastack.partitions'))")
            .execute(&mut *tx)
            .await?;
        for key in keys {
            let month = key.month;
            let parent = format!("tracked_events_{}", month.suffix());
            let from = month.start().format("%Y-%m-%d %H:%M:%S+00");
            let to = month.end().format("%Y-%m-%d %H:%M:%S+00");
            sqlx::query(AssertSqlSafe(format!(
                "CREATE TABLE IF NOT EXISTS {parent} PARTITION OF tracked_events \
                 FOR VALUES FROM ('{from}') TO ('{to}') PARTITION BY LIST (retention_class)"
            )))
            .execute(&mut *tx)
            .await?;
            sqlx::query(AssertSqlSafe(format!(
                "CREATE TABLE IF NOT EXISTS {} PARTITION OF {parent} FOR VALUES IN ({})",
                key.table_name(),
                key.retention_class
            )))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn partition_keys(&self) -> Result<Vec<PartitionKey>> {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT c.relname::text FROM pg_inherits i \
             JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent \
             WHERE p.relname::text LIKE 'tracked\\_events\\_y%'",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut keys: Vec<PartitionKey> = names
            .iter()
            .filter_map(|name| PartitionKey::parse_table(name))
            .collect();
        keys.sort();
        Ok(keys)
    }

    async fn partition_rows(&self, key: PartitionKey) -> Result<Option<i64>> {
        let counted = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {}",
            key.table_name()
        )))
        .fetch_one(&self.pool)
        .await;
        match counted {
            Ok(rows) => Ok(Some(rows)),
            // undefined_table: gone, or never there.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn drop_partition(&self, key: PartitionKey, expected_rows: i64) -> Result<DropOutcome> {
        let table = key.table_name();
        let parent = format!("tracked_events_{}", key.month.suffix());
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('fastack.partitions'))")
            .execute(&mut *tx)
            .await?;
        let exists: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
            .bind(&table)
            .fetch_one(&mut *tx)
            .await?;
        let rows = match exists {
            Some(_) => {
                // Parent first, then the partition: the order inserts lock
                // them in. The month's parent stays (empty and cheap): a
                // late row of this month is refused there instead of
                // reaching DEFAULT.
                sqlx::query(AssertSqlSafe(format!(
                    "LOCK TABLE {parent}, {table} IN ACCESS EXCLUSIVE MODE"
                )))
                .execute(&mut *tx)
                .await?;
                Some(
                    sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
                        .fetch_one(&mut *tx)
                        .await?,
                )
            }
            None => None,
        };
        drop_counted(Tx::Pg(tx), key, rows, expected_rows, &self.partitions).await
    }

    async fn prune_idempotency(&self, tenants: &[TenantId], before: DateTime<Utc>) -> Result<u64> {
        let ids: Vec<Uuid> = tenants.iter().map(|t| t.0).collect();
        let mut total = 0;
        loop {
            let done = sqlx::query(
                "DELETE FROM idempotency_keys WHERE ctid = ANY(ARRAY(SELECT ctid FROM idempotency_keys \
                 WHERE tenant_id = ANY($1) AND occurred_at < $2 LIMIT 10000))",
            )
            .bind(&ids)
            .bind(before)
            .execute(&self.pool)
            .await?;
            total += done.rows_affected();
            if done.rows_affected() < 10_000 {
                return Ok(total);
            }
        }
    }

    async fn prune_processed(&self, before: DateTime<Utc>) -> Result<u64> {
        let mut total = 0;
        loop {
            let done = sqlx::query(
                "DELETE FROM processed_jobs WHERE event_id = ANY(ARRAY(SELECT event_id FROM processed_jobs \
                 WHERE event_id < $1 ORDER BY event_id LIMIT 10000))",
            )
            .bind(super::v7_floor(before))
            .execute(&self.pool)
            .await?;
            total += done.rows_affected();
            if done.rows_affected() < 10_000 {
                return Ok(total);
            }
        }
    }
}

/// One group commit on `conn`: the fast path (every key new, one statement
/// in its own implicit transaction), else a transaction that sorts out the
/// keys that already existed.
///
/// Nothing commits after `deadline`, however late the statements reach the
/// server (a link that held them back for the length of an outage delivers
/// them when it returns): the fast path's statement inserts only while the
/// server's statement clock is before the deadline, and the transaction of
/// the other path is ended by the server if the node stays silent past it
/// (`idle_in_transaction_session_timeout`, so a `COMMIT` that arrives late
/// finds the transaction gone).
async fn commit_group(
    conn: &mut CommitConn,
    rows: &[IngestRow],
    keep: KeepFn<'_>,
    deadline: Instant,
) -> Result<Vec<Fence>> {
    let server_deadline = conn.server_deadline(deadline).await?;
    let conn = &mut conn.conn;
    // Insert in a stable order so concurrent group commits lock keys in
    // the same order and cannot deadlock.
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by(|&a, &b| {
        (rows[a].tenant_id, &rows[a].idempotency_key)
            .cmp(&(rows[b].tenant_id, &rows[b].idempotency_key))
    });
    let tenants: Vec<Uuid> = order.iter().map(|&i| rows[i].tenant_id.0).collect();
    let keys: Vec<&str> = order
        .iter()
        .map(|&i| rows[i].idempotency_key.as_str())
        .collect();
    let event_ids: Vec<Uuid> = order.iter().map(|&i| rows[i].event_id.0).collect();
    let fingerprints: Vec<&[u8]> = order.iter().map(|&i| &rows[i].fingerprint[..]).collect();
    let occurred: Vec<DateTime<Utc>> = order.iter().map(|&i| rows[i].occurred_at).collect();
    let received: Vec<DateTime<Utc>> = order.iter().map(|&i| rows[i].received_at).collect();
    let payloads: Vec<&str> = order.iter().map(|&i| rows[i].payload.as_str()).collect();
    // The inbox numbers rows in the order they were sent (processing
    // follows it: an identify before a track in one batch stays before it).
    let positions: Vec<i32> = order.iter().map(|&i| i as i32).collect();

    // Fast path, the common case of a group whose keys are all new and all
    // kept (the caller drops rows only when some key is taken): one
    // plain insert in its own implicit transaction, one round trip instead
    // of three. A key that already exists fails it with a unique violation
    // (nothing of it commits) and the group takes the transaction below.
    // Cheaper than `ON CONFLICT`, which pays a speculative insertion per
    // row, and than a statement that checks its own count.
    let all_fresh = vec![Fence::Fresh; rows.len()];
    if !keep(&all_fresh).iter().all(|k| *k) {
        return guarded_commit(conn, rows, keep, deadline).await;
    }
    let fast = sqlx::query(
        "WITH input AS (SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::uuid[], $4::bytea[], \
                                             $5::timestamptz[], $6::timestamptz[], $7::text[], \
                                             $8::int4[]) \
                        AS x(t, k, e, f, o, r, p, pos) \
                        WHERE statement_timestamp() < $9), \
              ins AS (INSERT INTO idempotency_keys (tenant_id, idempotency_key, event_id, fingerprint, \
                                                    occurred_at, created_at) \
                      SELECT t, k, e, f, o, r FROM input) \
         INSERT INTO inbox (tenant_id, event_id, payload, received_at) \
         SELECT t, e, p, r FROM input ORDER BY pos",
    )
    .bind(&tenants)
    .bind(&keys)
    .bind(&event_ids)
    .bind(&fingerprints)
    .bind(&occurred)
    .bind(&received)
    .bind(&payloads)
    .bind(&positions)
    .bind(server_deadline)
    .execute(&mut *conn)
    .await;
    match fast {
        Ok(done) if done.rows_affected() == rows.len() as u64 => {
            return Ok(all_fresh);
        }
        Ok(done) if done.rows_affected() == 0 => {
            return Err(Error::Deadline("PostgreSQL's group commit"));
        }
        Ok(done) => {
            return Err(Error::Corrupt(format!(
                "fast group commit stored {} of {} rows",
                done.rows_affected(),
                rows.len()
            )));
        }
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {}
        Err(e) => return Err(e.into()),
    }

    // Some key exists: the transaction that sorts out taken keys.
    guarded_commit(conn, rows, keep, deadline).await
}

/// The group commit's transaction, ended by the server should the node go
/// silent until `deadline` (its `COMMIT` held back by the network arrives
/// to find the transaction rolled back).
async fn guarded_commit(
    conn: &mut PgConnection,
    rows: &[IngestRow],
    keep: KeepFn<'_>,
    deadline: Instant,
) -> Result<Vec<Fence>> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Error::Deadline("PostgreSQL's group commit"));
    }
    let mut tx = conn.begin().await?;
    sqlx::query("SELECT set_config('idle_in_transaction_session_timeout', $1, true)")
        .bind(format!("{}ms", left.as_millis().max(1)))
        .execute(&mut *tx)
        .await?;
    super::ingest::commit(Tx::Pg(tx), rows, keep).await
}
