//! Embedded storage on SQLite, with an accept log: an accepted event is
//! written once, to the log under the data directory (`log/`,
//! [`log`]), appended and synced by the group commit; the
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

pub(crate) mod accept_log;
#[allow(unsafe_code)]
pub mod alloc;
mod files;
mod log;
mod partitions;
#[allow(unsafe_code)]
pub mod pcache;
mod waiting;

use self::{
    files::{LOW_DISK_ROUND, attach_inbox, resets_sync, spawn_checkpointer},
    log::AcceptLog,
    waiting::INBOX_LOOK_EVERY,
};
use super::{
    db::{Db, Row, Tx},
    engine::Engine,
    ingest::IngestEngine,
    partitions::KnownPartitions,
    processing::{self, LEASE_MARK, ProcessingEngine, RENEW_LEASE},
};
use fastack_entities::TenantId;
use sea_orm::SqlxSqliteConnector;
use sqlx::{
    AssertSqlSafe, SqlitePool,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
};
use uuid::Uuid;

use super::{
    Fence, IngestRow, KeepFn, KnownContacts, Month, PartitionKey, ProcessOutcome, ProcessRequest,
    TRACKED_SUBSCRIBED, TimeRange, erasures::SCREEN,
};
use crate::error::{Error, Result};

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
    /// Rounds holding their events, from their read of the log to their
    /// commit (see [`ROUNDS_AT_ONCE`]).
    rounds: tokio::sync::Semaphore,
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

/// Prepared statements the main writer keeps (sqlx's default is 100): its
/// own statements, and up to ten bulk-insert sizes for each table it
/// inserts into ([`super::db::Dialect::insert`]), so that none is
/// compiled again after eviction.
const WRITER_STATEMENTS: usize = 400;

/// Rows a sqlx connection's worker may run ahead of the task reading
/// them: a whole processing round's.
const ROW_CHANNEL: usize = 16_384;

/// Processing rounds that may hold their events at once. They commit one
/// at a time on the one writer; without a bound, every tenant's processor
/// read and decoded its next round and then queued for the writer, so a
/// backlog over many tenants was held in memory all at once (the million
/// events over a thousand tenants: most of the node's RSS). Two keep the
/// next round ready while one commits.
const ROUNDS_AT_ONCE: usize = 2;

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
    /// Opens (creating) the embedded database at `path`, the writer's page
    /// cache `writer_cache_mib` MiB (`FASTACK_SQLITE_CACHE_MIB`).
    pub async fn open(path: &Path, writer_cache_mib: u32) -> Result<Self> {
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            crate::owner_only::ensure_dir(dir)?;
        }
        let inbox = inbox_path(path);
        // Owner-only from the start: SQLite gives its WAL and shared-memory
        // files the database file's permissions.
        crate::owner_only::create_file(path)?;
        crate::owner_only::create_file(&inbox)?;
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
                    // SQLite's negative form: KiB.
                    .pragma(
                        "cache_size",
                        format!("-{}", u64::from(writer_cache_mib) * 1024),
                    )
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
            .join(accept_log::DIR);
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
            rounds: tokio::sync::Semaphore::new(ROUNDS_AT_ONCE),
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

    async fn process_batch(
        &self,
        req: &ProcessRequest,
        known: &KnownContacts,
    ) -> Result<ProcessOutcome> {
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
        let _holding = self
            .rounds
            .acquire()
            .await
            .map_err(|_| Error::ShuttingDown)?;
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
        let held = sqlx::query(AssertSqlSafe(format!(
            "{RENEW_LEASE} RETURNING {LEASE_MARK}"
        )))
        .bind(req.tenant_id.0)
        .bind(req.node_id.0)
        .bind(us(req.now + req.lease_ttl))
        .bind(us(req.now))
        .fetch_optional(&mut *tx)
        .await?;
        let Some(held) = held else {
            return Err(Error::LeaseLost);
        };
        let lease = processing::lease_mark(&Row::Lite(held))?;
        let from = round.from;
        let outcome = processing::run(
            self,
            Tx::Lite(tx),
            emit,
            req,
            processing::Consume::Log { round, screen },
            (known, lease),
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
