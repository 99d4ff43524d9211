//! Embedded storage on SQLite, with an accept log: an accepted event is
//! written once, to the log under the data directory (`log/`,
//! [`super::sqlite_log`]), appended and synced by the group commit; the
//! processing transaction then stores it in the main file (`fastack.db`)
//! beside its idempotency key and its tenant's cursor in the log, and the
//! log drops whole segments once every event in them is stored. The main
//! file runs WAL with `synchronous=FULL`, a writer connection and a pool of
//! readers.
//!
//! The inbox file (`fastack-inbox.db` beside `fastack.db`, attached as
//! `inbox_db`) keeps the `inbox` table for two kinds of rows only: those an
//! earlier release accepted and had not processed, and quarantined events
//! put back (by any process). The node moves them into the log (synced,
//! then deleted from the table) and processes them from there; their
//! second fence is the stored event, looked up, since an earlier release
//! may have stored one without deleting its row.
//!
//! Timestamps are integer microseconds since the epoch, uuids 16-byte blobs.
//! `tracked_events` is one table per month and retention class
//! (`tracked_events_y2026m11_r13`), each with a CHECK on its month, so that
//! retention drops whole tables exactly as on PostgreSQL.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration as StdDuration,
};

use async_trait::async_trait;

use super::{
    accept_log::Record,
    db::Tx,
    db::{Db, Q},
    decode_payload,
    engine::Engine,
    events::EventsEngine,
    events::{EVENT_COLUMNS, event_from},
    ingest::IngestEngine,
    partitions::{KnownPartitions, drop_counted},
    partitions::{Layout, PartitionsEngine},
    processing::{self, ProcessingEngine},
    sqlite_log::{AcceptLog, LegacyRow},
    waiting::WaitingEngine,
};
use chrono::{DateTime, Utc};
use fastack_entities::{StoredEvent, TenantId};
use sea_orm::SqlxSqliteConnector;
use sqlx::{
    AssertSqlSafe, SqliteConnection, SqlitePool,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
};
use uuid::Uuid;

use super::{
    DropOutcome, EventQuery, Fence, IngestRow, KeepFn, Month, PartitionKey, ProcessOutcome,
    ProcessRequest, TRACKED_SUBSCRIBED, TimeRange, erasures::SCREEN,
};
use crate::{
    backoff::Backoff,
    error::{Error, Result},
};

#[derive(Debug)]
pub struct SqliteStore {
    /// The main file's writer (one connection).
    writer: SqlitePool,
    /// Whether the writer was left not syncing (see `open`).
    relaxed: Arc<AtomicBool>,
    reader: SqlitePool,
    partitions: KnownPartitions,
    /// The accept log, opened by the first call that needs it (a command
    /// that never accepts or processes an event leaves it to the node).
    log: tokio::sync::OnceCell<Arc<AcceptLog>>,
    main_file: PathBuf,
    log_dir: PathBuf,
    /// The inbox table may hold rows to move into the log: a quarantined
    /// event put back by this process, or the last look is a while ago
    /// (another process may have put one back).
    inbox_rows: AtomicBool,
    inbox_looked: parking_lot::Mutex<std::time::Instant>,
    /// Checkpoints both files off the commits' path (see
    /// [`spawn_checkpointer`]); stopped with the store.
    checkpointer: tokio::task::JoinHandle<()>,
    /// Set by the checkpointer while the disk has less free space than a
    /// WAL may take (see [`LOW_DISK`]).
    low_disk: Arc<AtomicBool>,
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        self.checkpointer.abort();
    }
}

/// An instant as SQLite keeps it: INTEGER microseconds.
pub(super) fn us(t: chrono::DateTime<chrono::Utc>) -> i64 {
    t.timestamp_micros()
}

/// A WAL that grew past this many bytes (a burst, a backlog) is cut back
/// to it when it next starts over.
pub(super) const WAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// Bytes of a segment of the accept log.
const LOG_SEGMENT_BYTES: u64 = 8 * 1024 * 1024;

/// Inbox-table rows moved into the log at a time.
const MOVE_ROWS: i64 = 10_000;

/// How often processing looks for inbox-table rows to move into the log
/// (besides the backlog scan's look, and at once after a put-back here).
const INBOX_LOOK_EVERY: StdDuration = StdDuration::from_secs(1);

/// `$start, $start+1, …`: for the few statements that reuse a parameter.
fn numbered(start: usize, n: usize) -> String {
    (start..start + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

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
            annotations TEXT,
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

/// The main writer's page cache, in KiB (SQLite's negative form).
const WRITER_CACHE: &str = "-65536";

/// Prepared statements the main writer keeps (sqlx's default is 100): its
/// own statements, and up to ten bulk-insert sizes for each table it
/// inserts into ([`super::db::Dialect::insert`]), so that none is
/// compiled again after eviction.
const WRITER_STATEMENTS: usize = 400;

/// Rows a sqlx connection's worker may run ahead of the task reading
/// them: a whole processing round's.
const ROW_CHANNEL: usize = 16_384;

/// How long a connection waits for another's write lock.
const BUSY_TIMEOUT: StdDuration = StdDuration::from_secs(10);

/// Schema name of the attached inbox file.
const INBOX_SCHEMA: &str = "inbox_db";

/// The inbox file beside the main one: `fastack.db` → `fastack-inbox.db`.
pub fn inbox_path(main: &Path) -> PathBuf {
    let stem = main
        .file_stem()
        .map_or_else(|| "fastack".into(), |s| s.to_string_lossy().into_owned());
    let name = match main.extension() {
        Some(ext) => format!("{stem}-inbox.{}", ext.to_string_lossy()),
        None => format!("{stem}-inbox"),
    };
    main.with_file_name(name)
}

impl SqliteStore {
    pub async fn open(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            crate::private::ensure_dir(dir)?;
        }
        let inbox = inbox_path(path);
        // Owner-only from the start: SQLite gives its WAL and shared-memory
        // files the database file's permissions.
        crate::private::create_file(path)?;
        crate::private::create_file(&inbox)?;
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true)
            // A multi-row statement inside a transaction keeps a journal
            // of its own (to undo just itself); in memory, not in a
            // temporary file it writes page by page.
            .pragma("temp_store", "MEMORY")
            .pragma("journal_size_limit", WAL_SIZE_LIMIT.to_string())
            // sqlx hands rows from its worker thread to the task through a
            // bounded channel; at its default (50) a large result (a
            // round's inbox rows, its identity lookups, an insert's
            // `RETURNING`) stops the worker every 50 rows until the task
            // catches up: two thread switches per 50 rows.
            .row_buffer_size(ROW_CHANNEL);
        let inbox = inbox.to_string_lossy().into_owned();
        let inbox_file = inbox.clone();
        let pool = |max: u32| {
            let inbox = inbox.clone();
            SqlitePoolOptions::new()
                .max_connections(max)
                .min_connections(max.min(1))
                .acquire_timeout(StdDuration::from_secs(30))
                .after_connect(move |conn, _| {
                    let inbox = inbox.clone();
                    Box::pin(async move { attach_inbox(conn, &inbox).await })
                })
        };
        // A relaxed transaction (`Db::begin_relaxed`: claims, fan-out,
        // attempt records; the inbox delete after processing) leaves its
        // writer not syncing; it is set back before anyone else gets it.
        let relaxed = Arc::new(AtomicBool::new(false));
        // The writer's transactions are large (a processing round writes
        // a few thousand pages): a page cache that holds them all, so none
        // spills into the WAL before its commit and none is read back.
        let writer = resets_sync(pool(1), relaxed.clone())
            .connect_with(
                options
                    .clone()
                    .pragma("cache_size", WRITER_CACHE)
                    .statement_cache_capacity(WRITER_STATEMENTS),
            )
            .await?;
        let reader = pool(4).connect_with(options.clone()).await?;
        let low_disk = Arc::new(AtomicBool::new(false));
        let checkpointer =
            spawn_checkpointer(options, inbox_file, path.to_owned(), low_disk.clone());
        let log_dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .join(super::accept_log::DIR);
        Ok(SqliteStore {
            low_disk,
            writer,
            relaxed,
            reader,
            partitions: KnownPartitions::default(),
            log: tokio::sync::OnceCell::new(),
            main_file: path.to_owned(),
            log_dir,
            inbox_rows: AtomicBool::new(true),
            inbox_looked: parking_lot::Mutex::new(std::time::Instant::now()),
            checkpointer,
        })
    }

    /// The accept log, opened for appending on first use: read back against
    /// the tenants' cursors.
    async fn log(&self) -> Result<&Arc<AcceptLog>> {
        self.log
            .get_or_try_init(|| async {
                // On a reader: the writer may be held by the caller's
                // transaction (an erasure settling).
                let cursors: Vec<(Uuid, i64)> =
                    sqlx::query_as("SELECT tenant_id, seq FROM log_cursors")
                        .fetch_all(&self.reader)
                        .await?;
                let cursors = cursors
                    .into_iter()
                    .map(|(t, s)| (TenantId(t), s.max(0) as u64))
                    .collect();
                AcceptLog::open(
                    self.log_dir.clone(),
                    self.main_file.clone(),
                    LOG_SEGMENT_BYTES,
                    cursors,
                )
                .await
                .map(Arc::new)
            })
            .await
    }

    /// Moves the inbox table's rows (an earlier release's, or quarantined
    /// events put back) into the log, then deletes them from the table.
    async fn move_inbox_rows(&self, log: &Arc<AcceptLog>) -> Result<()> {
        loop {
            let rows: Vec<(i64, Uuid, Uuid, String, i64)> = sqlx::query_as(
                "SELECT seq, tenant_id, event_id, payload, received_at FROM inbox \
                 ORDER BY seq LIMIT $1",
            )
            .bind(MOVE_ROWS)
            .fetch_all(&self.reader)
            .await?;
            if rows.is_empty() {
                return Ok(());
            }
            let full = rows.len() as i64 == MOVE_ROWS;
            let rows: Vec<LegacyRow> = rows
                .into_iter()
                .map(|(seq, tenant, event_id, payload, received_at)| LegacyRow {
                    seq,
                    tenant: TenantId(tenant),
                    event_id: fastack_entities::EventId(event_id),
                    payload,
                    received_at: DateTime::from_timestamp_micros(received_at).unwrap_or_default(),
                })
                .collect();
            let total = rows.len();
            let moved = log.import(rows).await?;
            if !moved.is_empty() {
                let mut tx = self.writer.begin().await?;
                for chunk in moved.chunks(500) {
                    let list = vec!["?"; chunk.len()].join(", ");
                    let mut q = sqlx::query(AssertSqlSafe(format!(
                        "DELETE FROM {INBOX_SCHEMA}.inbox WHERE seq IN ({list})"
                    )));
                    for s in chunk {
                        q = q.bind(*s);
                    }
                    q.execute(&mut *tx).await?;
                }
                tx.commit().await?;
                log.forget_moved(&moved);
                tracing::info!(rows = moved.len(), "inbox rows moved into the accept log");
            }
            if !full || moved.len() < total {
                return Ok(());
            }
        }
    }

    /// The connections, for the records written once ([`super::shared`]).
    pub(crate) fn db(&self) -> super::db::Db {
        super::db::Db::Lite {
            writer: self.writer.clone(),
            reader: self.reader.clone(),
            relaxed: self.relaxed.clone(),
        }
    }

    async fn load_partitions(&self) -> Result<()> {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'tracked_events_y%'",
        )
        .fetch_all(&self.writer)
        .await?;
        self.partitions.add(
            names
                .iter()
                .filter_map(|name| PartitionKey::parse_table(name)),
        );
        Ok(())
    }

    /// Partition tables overlapping a range.
    fn tables_for(&self, range: &TimeRange) -> Vec<String> {
        let months: HashSet<Month> = range.months().into_iter().collect();
        self.partitions
            .sorted()
            .into_iter()
            .filter(|k| months.contains(&k.month))
            .map(|k| k.table_name())
            .collect()
    }
}

/// Attaches the inbox file to a new connection, with the main file's
/// durability (a 202's rows are in it). A commit checkpoints by itself only
/// past [`AUTOCHECKPOINT_BACKSTOP`] WAL pages: [`spawn_checkpointer`] does it.
async fn attach_inbox(conn: &mut SqliteConnection, file: &str) -> sqlx::Result<()> {
    sqlx::query(AssertSqlSafe(format!(
        "ATTACH DATABASE $1 AS {INBOX_SCHEMA}"
    )))
    .bind(file)
    .execute(&mut *conn)
    .await?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "PRAGMA {INBOX_SCHEMA}.journal_mode = WAL; PRAGMA {INBOX_SCHEMA}.synchronous = FULL; \
         PRAGMA wal_autocheckpoint = {AUTOCHECKPOINT_BACKSTOP}"
    )))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// How often the checkpointer copies committed WAL pages into the files.
const CHECKPOINT_EVERY: StdDuration = StdDuration::from_millis(200);

/// Free space on the database's disk under which the store keeps its WALs
/// small: the checkpointer truncates both WALs at every round and a
/// processing round takes at most [`LOW_DISK_ROUND`] rows. Above it a WAL
/// may grow to [`WAL_SIZE_LIMIT`] while a backlog drains; below it that
/// growth could fill the disk again right after space came back (a full
/// disk's backlog drained in large rounds grew the inbox WAL by 50 MB in
/// two seconds and the disk was full again), and recovery would need more
/// free space than the disk had.
const LOW_DISK: u64 = 2 * WAL_SIZE_LIMIT as u64;

/// Rows per processing round while the disk is low.
const LOW_DISK_ROUND: u32 = 100;
/// A commit runs a checkpoint itself only past this many WAL pages (about
/// 400 MiB): the backstop should the checkpointer stop or fall behind.
const AUTOCHECKPOINT_BACKSTOP: u32 = 100_000;

/// Copies committed pages from both files' WALs into the files every
/// [`CHECKPOINT_EVERY`], so that no commit has to. With SQLite's default
/// the commit that takes a WAL past 1,000 pages runs one, fsyncs included:
/// 13 % of the server's CPU while processing drained a backlog, and a stall
/// for whichever delivery or processing round was in that commit.
///
/// The main file's writer pauses between processing rounds, which lets its
/// WAL start over (19–35 MB under load); one that grew meanwhile (a
/// backlog keeps the writer busy) is cut back to [`WAL_SIZE_LIMIT`] when it
/// next starts over. The inbox file is written only when rows move into the
/// log. PASSIVE: a reader in the middle of a read keeps the pages it may
/// still need, copied next time; TRUNCATE while the disk is low. A failure
/// (logged) does not stop the task: it reconnects after a capped backoff
/// (100 ms doubling, at most 1 s), and the writers' own checkpoints past
/// the backstop cover the gap.
fn spawn_checkpointer(
    options: SqliteConnectOptions,
    inbox_file: String,
    main_file: PathBuf,
    low_disk: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    use sqlx::Connection;
    tokio::spawn(async move {
        // Capped low: after a full disk the next checkpoint is what gives
        // the WALs' space back.
        let mut backoff = Backoff::new(StdDuration::from_millis(100), StdDuration::from_secs(1));
        let mut tick = tokio::time::interval(CHECKPOINT_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut own: Option<SqliteConnection> = None;
        let dir = main_file
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_owned();
        loop {
            tick.tick().await;
            let low = crate::health::free_bytes(&dir).is_ok_and(|free| free < LOW_DISK);
            if low_disk.swap(low, Ordering::AcqRel) != low {
                if low {
                    tracing::warn!(
                        dir = %dir.display(),
                        "little free space on the database's disk: WALs truncated at every \
                         checkpoint, processing in small rounds"
                    );
                } else {
                    tracing::info!(dir = %dir.display(), "free space back on the database's disk");
                }
            }
            let mode = if low { "TRUNCATE" } else { "PASSIVE" };
            let round = async {
                let conn = match &mut own {
                    Some(conn) => conn,
                    None => {
                        let mut conn = SqliteConnection::connect_with(&options).await?;
                        attach_inbox(&mut conn, &inbox_file).await?;
                        own.insert(conn)
                    }
                };
                for schema in ["main", INBOX_SCHEMA] {
                    sqlx::query(AssertSqlSafe(format!(
                        "PRAGMA {schema}.wal_checkpoint({mode})"
                    )))
                    .execute(&mut *conn)
                    .await?;
                }
                Ok::<(), Error>(())
            };
            match round.await {
                Ok(()) => backoff.started(),
                Err(error) => {
                    own = None;
                    let wait = backoff.next_delay();
                    tracing::warn!(
                        %error,
                        failures = backoff.attempts(),
                        retry_in_ms = wait.as_millis() as u64,
                        "wal checkpointer failed; reconnecting"
                    );
                    tokio::time::sleep(wait).await;
                }
            }
        }
    })
}

/// A writer pool that sets `synchronous = FULL` back before handing out a
/// connection `Db::begin_relaxed` relaxed. A connection that cannot take it
/// (one a failed commit left inside its transaction: SQLite keeps a
/// transaction open when `COMMIT` fails with `SQLITE_FULL`) is closed
/// rather than handed out, and the pool opens a fresh one.
fn resets_sync(options: SqlitePoolOptions, relaxed: Arc<AtomicBool>) -> SqlitePoolOptions {
    options.before_acquire(move |conn, _| {
        let relaxed = relaxed.clone();
        Box::pin(async move {
            if relaxed.swap(false, Ordering::AcqRel)
                && let Err(error) = sqlx::query("PRAGMA main.synchronous = FULL")
                    .execute(&mut *conn)
                    .await
            {
                tracing::debug!(%error, "writer connection left unusable; replacing it");
                return Ok(false);
            }
            Ok(true)
        })
    })
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

/// A table per month and class; SQLite's DDL is transactional, so a new
/// month's table commits with the rows it receives, or not at all.
#[async_trait]
impl Layout for SqliteStore {
    async fn prepare(&self, tx: &mut Tx<'_>, keys: &[PartitionKey]) -> Result<()> {
        let Tx::Lite(tx) = tx else {
            return Err(Error::Corrupt(
                "a SQLite layout in another backend's transaction".to_owned(),
            ));
        };
        for key in self.partitions.missing(keys) {
            create_partition(tx, &key).await?;
        }
        Ok(())
    }

    fn table(&self, key: &PartitionKey) -> String {
        key.table_name()
    }

    fn forget(&self) {
        self.partitions.forget();
    }

    fn created(&self, keys: &[PartitionKey]) {
        self.partitions.add(keys.iter().copied());
    }
}

#[async_trait]
impl Engine for SqliteStore {
    async fn migrate(&self) -> Result<()> {
        let conn = SqlxSqliteConnector::from_sqlx_sqlite_pool(self.writer.clone());
        super::newer_schema(
            fastack_migration::up(&conn)
                .await
                .map_err(Error::Migration)?,
        );
        self.load_partitions().await
    }
}

#[async_trait]
impl IngestEngine for SqliteStore {
    async fn taken_keys(
        &self,
        db: &Db,
        tenant: TenantId,
        keys: &[String],
    ) -> Result<Vec<crate::domain::TakenKey>> {
        // Processed events' keys in the table, waiting events' in the log.
        let mut taken = db
            .read(super::ingest::taken_query(
                db.dialect(),
                tenant.0,
                keys.to_vec(),
            ))
            .await?
            .iter()
            .map(super::ingest::taken_from)
            .collect::<Result<Vec<_>>>()?;
        let log = self.log().await?;
        for key in keys {
            if taken.iter().all(|t| &t.key != key)
                && let Some(t) = log.taken_key(tenant, key)?
            {
                taken.push(t);
            }
        }
        Ok(taken)
    }

    async fn commit_ingest(
        &self,
        rows: &[IngestRow],
        keep: KeepFn<'_>,
        deadline: std::time::Instant,
    ) -> Result<Vec<Fence>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        self.log().await?.commit(rows, keep, deadline).await
    }
}

#[async_trait]
impl ProcessingEngine for SqliteStore {
    async fn backlog_tenants(&self, limit: u32) -> Result<Vec<TenantId>> {
        let log = self.log().await?;
        // Rows of the inbox table (an earlier release's, quarantined events
        // put back by any process) join the log first.
        self.move_inbox_rows(log).await?;
        Ok(log.backlog(limit))
    }

    async fn process_batch(&self, req: &ProcessRequest) -> Result<ProcessOutcome> {
        let limit = if self.low_disk.load(Ordering::Acquire) {
            req.limit.min(LOW_DISK_ROUND)
        } else {
            req.limit
        };
        let log = self.log().await?;
        if self.inbox_rows.swap(false, Ordering::AcqRel)
            || self.inbox_looked.lock().elapsed() > INBOX_LOOK_EVERY
        {
            *self.inbox_looked.lock() = std::time::Instant::now();
            self.move_inbox_rows(log).await?;
        }
        let Some(round) = log.round(req.tenant_id, limit)? else {
            return Ok(ProcessOutcome::default());
        };
        let to = round.to;
        let mut conn = self.writer.acquire().await?;
        // Whether the tenant's endpoints take `core.event.tracked` now, and
        // whether its events must be screened (a running erasure, a
        // suppression). On the one writer connection nothing can change
        // either between this read and the transaction below.
        let (fanout, screen): (bool, bool) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {TRACKED_SUBSCRIBED}, {SCREEN}"
        )))
        .bind(req.tenant_id.0)
        .fetch_one(&mut *conn)
        .await?;
        let emit = req.emit_tracked(fanout);
        // The commit syncs even without outbox rows: the log segments of
        // the events it stored are dropped right after, and that must
        // never outlive a processing commit lost to power loss.
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        let held = sqlx::query(
            "UPDATE tenant_leases SET expires_at = $3 \
             WHERE tenant_id = $1 AND node_id = $2 AND expires_at > $4",
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
        let from = round.from;
        let outcome = processing::run(
            self,
            Tx::Lite(tx),
            emit,
            req,
            processing::Consume::Log { round, screen },
        )
        .await;
        match outcome {
            Ok(outcome) => {
                // Committed: the records leave the log's index.
                log.consumed(req.tenant_id, to);
                Ok(outcome)
            }
            Err(Error::LeaseLost) => {
                // A cursor found ahead of the index (a round whose commit
                // this process did not see end): the index catches up, and
                // the next round starts there.
                let stored: Option<i64> =
                    sqlx::query_scalar("SELECT seq FROM log_cursors WHERE tenant_id = $1")
                        .bind(req.tenant_id.0)
                        .fetch_optional(&mut *conn)
                        .await?;
                if let Some(at) = stored.filter(|at| *at > from as i64) {
                    log.consumed(req.tenant_id, at as u64);
                }
                Err(Error::LeaseLost)
            }
            Err(e) => Err(e),
        }
    }
}

impl SqliteStore {
    /// The tenant's cursor and its events waiting in the log: from this
    /// process's index, or, where another process appends to the log (a
    /// command beside a running node), read from the files.
    async fn waiting_records(&self, tenant: TenantId) -> Result<(u64, Vec<Record>)> {
        match self.log().await {
            Ok(log) => log.waiting(tenant),
            Err(Error::Storage(_)) => {
                let cursor: Option<i64> =
                    sqlx::query_scalar("SELECT seq FROM log_cursors WHERE tenant_id = $1")
                        .bind(tenant.0)
                        .fetch_optional(&self.reader)
                        .await?;
                let cursor = cursor.unwrap_or(0).max(0) as u64;
                let mut out = Vec::new();
                super::accept_log::scan(&self.log_dir, |r, _| {
                    if r.tenant == tenant && r.seq > cursor {
                        out.push(r);
                    }
                    Ok(())
                })?;
                Ok((cursor, out))
            }
            Err(e) => Err(e),
        }
    }
}

/// Accepted events waiting: the accept log's, and rows of the inbox table
/// not moved into it yet (counted and searched like the inbox rows they
/// are, by the trait's defaults).
#[async_trait]
impl WaitingEngine for SqliteStore {
    async fn waiting_stats(&self, db: &Db) -> Result<(i64, Option<DateTime<Utc>>)> {
        let (n, oldest) = self.log().await?.stats();
        let (rows, row_oldest) = db
            .read_one(Q::new(
                "SELECT count(*) AS n, min(received_at) AS oldest FROM inbox",
            ))
            .await
            .and_then(|r| Ok((r.int("n")?, r.opt_time("oldest")?)))?;
        let oldest = match (oldest, row_oldest) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Ok((n + rows, oldest))
    }

    async fn waiting_empty(&self, db: &Db) -> Result<bool> {
        if self.log().await?.stats().0 > 0 {
            return Ok(false);
        }
        Ok(db
            .read_opt(Q::new("SELECT seq FROM inbox LIMIT 1"))
            .await?
            .is_none())
    }

    async fn next_waiting(
        &self,
        _db: &Db,
        tenant: TenantId,
        after: Option<i64>,
    ) -> Result<Option<(i64, fastack_entities::EventId)>> {
        Ok(self
            .log()
            .await?
            .next_waiting(tenant, after.map(|a| a.max(0) as u64))
            .map(|(seq, id)| (seq as i64, id)))
    }

    fn put_back(&self) {
        self.inbox_rows.store(true, Ordering::Release);
    }

    async fn record_failure(
        &self,
        _db: &Db,
        tenant: TenantId,
        seq: i64,
        error: &str,
    ) -> Result<u32> {
        if self
            .log()
            .await?
            .waiting_record(tenant, seq.max(0) as u64)?
            .is_none()
        {
            return Ok(0);
        }
        let attempts: i64 = sqlx::query_scalar(
            "INSERT INTO log_failures (tenant_id, seq, attempts, last_error) VALUES ($1, $2, 1, $3) \
             ON CONFLICT (tenant_id, seq) DO UPDATE SET attempts = attempts + 1, \
                 last_error = excluded.last_error \
             RETURNING attempts",
        )
        .bind(tenant.0)
        .bind(seq)
        .bind(error)
        .fetch_all(&self.writer)
        .await?
        .into_iter()
        .next()
        .unwrap_or(0);
        Ok(u32::try_from(attempts).unwrap_or(u32::MAX))
    }

    async fn quarantine(
        &self,
        _db: &Db,
        tenant: TenantId,
        seq: i64,
        now: DateTime<Utc>,
    ) -> Result<Option<fastack_entities::QuarantinedEvent>> {
        let log = self.log().await?;
        let seq = seq.max(0) as u64;
        // Only the tenant's first waiting event moves: the cursor moves to
        // it, past nothing else.
        if log.first_waiting(tenant).map(|(s, _)| s) != Some(seq) {
            return Ok(None);
        }
        let Some(record) = log.waiting_record(tenant, seq)? else {
            return Ok(None);
        };
        let (cursor, _) = log.waiting(tenant)?;
        let mut tx = Tx::Lite(self.writer.begin().await?);
        let failure = tx
            .fetch_opt(
                Q::new(
                    "DELETE FROM log_failures WHERE tenant_id = $1 AND seq = $2 \
                     RETURNING attempts, last_error",
                )
                .bind(tenant.0)
                .bind(seq as i64),
            )
            .await?;
        let (attempts, error) = match failure {
            Some(r) => (r.int("attempts")?, r.opt_text("last_error")?),
            None => (0, None),
        };
        let row = fastack_entities::db::quarantine::Model {
            tenant_id: tenant,
            event_id: record.event_id,
            payload: record.payload.clone(),
            received_at: record.received_at.into(),
            error: error.unwrap_or_else(|| "unknown error".to_owned()),
            attempts: i32::try_from(attempts).unwrap_or(i32::MAX),
            quarantined_at: now.into(),
        };
        super::waiting::put_in_quarantine(&mut tx, &row).await?;
        // Its key stays taken: a retry of the event is a duplicate (the
        // event, if put back, keeps its key).
        let occurred_at = decode_payload(&record.payload)
            .map(|e| e.occurred_at.with_timezone(&Utc))
            .unwrap_or(record.received_at);
        tx.execute(
            Q::new(
                "INSERT INTO idempotency_keys \
                 (tenant_id, idempotency_key, event_id, fingerprint, occurred_at, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
            )
            .bind(tenant.0)
            .bind(record.key.clone())
            .bind(record.event_id.0)
            .bind(record.fingerprint.to_vec())
            .bind(occurred_at)
            .bind(record.received_at),
        )
        .await?;
        processing::advance_cursor(&mut tx, tenant, cursor, seq).await?;
        tx.commit().await?;
        log.consumed(tenant, seq);
        Ok(Some(row.into()))
    }

    async fn waiting_range(
        &self,
        _tx: &mut Tx<'_>,
        tenant: TenantId,
    ) -> Result<Option<(i64, i64)>> {
        // (Rows of the inbox table not moved into the log yet are not in the
        // range; `first_waiting` waits for them while they are there.)
        let (_, records) = self.waiting_records(tenant).await?;
        Ok(match (records.first(), records.last()) {
            (Some(a), Some(b)) => Some((a.seq as i64, b.seq as i64)),
            _ => None,
        })
    }

    async fn waiting_payloads(
        &self,
        db: &Db,
        _tx: Option<&mut Tx<'_>>,
        tenant: TenantId,
        (from, to): (i64, i64),
        identifies: bool,
    ) -> Result<Vec<String>> {
        let (_, records) = self.waiting_records(tenant).await?;
        let mut out: Vec<String> = records
            .into_iter()
            .filter(|r| (from..=to).contains(&(r.seq as i64)))
            .map(|r| r.payload)
            .filter(|p| !identifies || p.contains("\"identify\""))
            .collect();
        // Rows of the inbox table not moved yet: every one of the tenant's.
        let rows = db
            .read(Q::new("SELECT payload FROM inbox WHERE tenant_id = $1").bind(tenant.0))
            .await?;
        for r in rows {
            out.push(r.text("payload")?);
        }
        Ok(out)
    }

    async fn first_waiting(
        &self,
        db: &Db,
        tenant: TenantId,
        (from, to): (i64, i64),
    ) -> Result<Option<i64>> {
        let (_, records) = self.waiting_records(tenant).await?;
        if let Some(r) = records
            .iter()
            .find(|r| (from..=to).contains(&(r.seq as i64)))
        {
            return Ok(Some(r.seq as i64));
        }
        // A row of the inbox table not moved yet waits too.
        Ok(db
            .read_opt(Q::new("SELECT seq FROM inbox WHERE tenant_id = $1 LIMIT 1").bind(tenant.0))
            .await?
            .map(|_| to))
    }
}

#[async_trait]
impl EventsEngine for SqliteStore {
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
        rows.into_iter()
            .map(|r| event_from(&super::db::Row::Lite(r)))
            .collect()
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
}

#[async_trait]
impl PartitionsEngine for SqliteStore {
    fn layout(&self) -> &dyn Layout {
        self
    }

    fn known(&self) -> &KnownPartitions {
        &self.partitions
    }

    async fn create_partitions(&self, keys: &[PartitionKey]) -> Result<()> {
        let mut tx = self.writer.begin().await?;
        for key in keys {
            create_partition(&mut tx, key).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn partition_keys(&self) -> Result<Vec<PartitionKey>> {
        Ok(self.partitions.sorted())
    }

    async fn partition_rows(&self, key: PartitionKey) -> Result<Option<i64>> {
        // One read transaction: the existence check and the count see the
        // same snapshot, so a concurrent drop cannot fall between them.
        let mut tx = self.reader.begin().await?;
        let rows = count_partition(&mut tx, &key.table_name()).await?;
        tx.commit().await?;
        Ok(rows)
    }

    async fn drop_partition(&self, key: PartitionKey, expected_rows: i64) -> Result<DropOutcome> {
        let table = key.table_name();
        // The single writer connection: nothing inserts while this runs.
        let mut tx = self.writer.begin().await?;
        let rows = count_partition(&mut tx, &table).await?;
        drop_counted(Tx::Lite(tx), key, rows, expected_rows, &self.partitions).await
    }

    async fn prune_idempotency(&self, tenants: &[TenantId], before: DateTime<Utc>) -> Result<u64> {
        let mut total = 0;
        for t in tenants {
            total += sqlx::query(
                "DELETE FROM idempotency_keys WHERE tenant_id = $1 AND occurred_at < $2",
            )
            .bind(t.0)
            .bind(us(before))
            .execute(&self.writer)
            .await?
            .rows_affected();
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders() {
        assert_eq!(numbered(3, 2), "$3, $4");
        assert_eq!(
            PartitionKey::parse_table("tracked_events_y2026m11_r13"),
            Some(PartitionKey {
                month: Month {
                    year: 2026,
                    month: 11
                },
                retention_class: 13
            })
        );
        assert_eq!(
            PartitionKey::parse_table("tracked_events_y2026m11_r13_contact"),
            None
        );
    }
}
