//! Embedded storage on SQLite: WAL with `synchronous=FULL` (a 202 survives
//! power loss), a pool of readers, and two database files with a writer
//! connection each, so the 202's group commits never queue behind the work
//! that follows them:
//!
//! - the **inbox file** (`fastack-inbox.db` beside `fastack.db`) holds
//!   `idempotency_keys` and `inbox`: what the front door writes. Its writer
//!   (a thread of its own, [`super::sqlite_inbox`]) runs the group commits,
//!   and deletes inbox rows once their processing has committed
//!   ([`Engine::consume_inbox`]);
//! - the **main file** holds everything else: processing, the outbox, jobs,
//!   webhooks. Its writer runs every other transaction.
//!
//! Every sqlx connection attaches the inbox file (schema `inbox_db`), so a
//! statement names `inbox` or `idempotency_keys` as on PostgreSQL. A
//! processing transaction reads inbox rows but never writes the inbox file
//! (a write after a read could meet a newer group commit and fail); the few
//! rare transactions of the main writer that do write it (quarantine and its
//! retry, a failed attempt's count) write it first, which SQLite's busy
//! handler waits for. Each file commits atomically, the two together do not:
//! the processor's second fence (an event whose `tracked_events` row exists
//! is skipped) makes a row processed but not yet deleted harmless, and a crash between a quarantine's two files
//! leaves the row in both, processed once.
//!
//! Timestamps are integer microseconds since the epoch, uuids 16-byte blobs.
//! `tracked_events` is one table per month and retention class
//! (`tracked_events_y2026m11_r13`), each with a CHECK on its month, so that
//! retention drops whole tables exactly as on PostgreSQL.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration as StdDuration,
};

use async_trait::async_trait;

use super::{
    db::Tx,
    engine::Engine,
    events::EventsEngine,
    events::{EVENT_COLUMNS, event_from},
    ingest::IngestEngine,
    partitions::{KnownPartitions, drop_counted},
    partitions::{Layout, PartitionsEngine},
    processing::{self, ProcessingEngine},
    sqlite_handoff::Handoff,
    sqlite_inbox::{InboxWriter, WAL_SIZE_LIMIT, us},
};
use chrono::{DateTime, Utc};
use fastack_entities::{StoredEvent, TenantId};
use parking_lot::Mutex;
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
    /// The inbox file's writer (a thread with its own connection): group
    /// commits, consumes, pruning.
    inbox: InboxWriter,
    reader: SqlitePool,
    partitions: KnownPartitions,
    /// The next round's rows, being read while a round writes (see
    /// [`Engine::process_batch`]), per tenant.
    ahead: Mutex<HashMap<TenantId, ReadAhead>>,
    /// The rows of the inbox writer's commits, for processing to take
    /// without reading the file.
    handoff: Arc<Handoff>,
    /// Checkpoints both files off the commits' path (see
    /// [`spawn_checkpointer`]); stopped with the store.
    checkpointer: tokio::task::JoinHandle<()>,
    /// Set by the checkpointer while the disk has less free space than a
    /// WAL may take (see [`LOW_DISK`]).
    low_disk: Arc<AtomicBool>,
}

/// A round's rows read ahead: which round, since when, and the read.
#[derive(Debug)]
struct ReadAhead {
    after_seq: i64,
    limit: u32,
    started: std::time::Instant,
    rows: tokio::task::JoinHandle<Result<Vec<processing::Item>>>,
}

/// A read-ahead older than this is read again: rows it holds may have been
/// taken by a round of another node since (harmless, the fence skips
/// them), and a fresh read also finds rows committed since.
const READ_AHEAD_FOR: StdDuration = StdDuration::from_secs(1);

impl Drop for SqliteStore {
    fn drop(&mut self) {
        self.checkpointer.abort();
        for (_, ahead) in self.ahead.lock().drain() {
            ahead.rows.abort();
        }
    }
}

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
    /// A round's rows from the inbox file, for a round the hand-off cannot
    /// serve (a restart's backlog, rows below its floor, a full read).
    async fn read_round(&self, req: &ProcessRequest) -> Result<Vec<processing::Item>> {
        // The rows are read on the readers, outside the transaction (the
        // stored-event fence makes that safe), and a full round starts
        // reading the next one before it writes: the single writer then
        // never waits for a read and its decoding, nor holds the
        // connection while one runs.
        // A read ahead of other rows, or too old, is dropped; one that found
        // nothing is read again (rows may have come since), as is one that
        // did not finish (its task panicked): a round that reports no rows
        // has looked now.
        let ahead = self.ahead.lock().remove(&req.tenant_id);
        let read_ahead = match ahead {
            Some(a)
                if a.started.elapsed() < READ_AHEAD_FOR
                    && Some(a.after_seq) == req.after_seq
                    && a.limit == req.limit =>
            {
                a.rows.await.ok().transpose()?
            }
            Some(a) => {
                a.rows.abort();
                None
            }
            None => None,
        };
        let items = match read_ahead.filter(|items| !items.is_empty()) {
            Some(items) => items,
            None => processing::read(&self.db(), req.tenant_id, req.after_seq, req.limit).await?,
        };
        if items.len() == req.limit as usize
            && let Some(last) = processing::last_seq(&items)
        {
            let (db, tenant, limit) = (self.db(), req.tenant_id, req.limit);
            let rows =
                tokio::spawn(async move { processing::read(&db, tenant, Some(last), limit).await });
            let next = ReadAhead {
                after_seq: last,
                limit,
                started: std::time::Instant::now(),
                rows,
            };
            if let Some(old) = self.ahead.lock().insert(tenant, next) {
                old.rows.abort();
            }
        }
        Ok(items)
    }

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
        let handoff = Handoff::new();
        let inbox = InboxWriter::open(
            PathBuf::from(&inbox_file),
            BUSY_TIMEOUT,
            AUTOCHECKPOINT_BACKSTOP,
            handoff.clone(),
        )
        .await?;
        let reader = pool(4).connect_with(options.clone()).await?;
        let low_disk = Arc::new(AtomicBool::new(false));
        let checkpointer = spawn_checkpointer(
            options,
            inbox_file,
            inbox.clone(),
            path.to_owned(),
            low_disk.clone(),
        );
        Ok(SqliteStore {
            low_disk,
            writer,
            relaxed,
            inbox,
            reader,
            partitions: KnownPartitions::default(),
            ahead: Mutex::new(HashMap::new()),
            handoff,
            checkpointer,
        })
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
/// for whichever 202 or delivery was in that commit.
///
/// In two steps for the inbox file. The bulk of the copy runs on a
/// connection of its own, beside the writers. That alone never lets a WAL
/// start over under a steady load: SQLite writes a WAL from its beginning
/// again only when a write begins with every frame copied, and group
/// commits land while it copies (the inbox WAL grew to 412 MB in 15 s of
/// `track`). So the inbox's writer thread then copies the frames committed
/// meanwhile, between two of its jobs ([`InboxWriter::checkpoint`]):
/// nothing lands during that, and the next group commit starts over at the
/// head of the WAL, rewriting blocks already written instead of allocating
/// new ones at every sync. The main file keeps the first step only: its
/// writer pauses between processing rounds, which lets its WAL start over
/// (19–35 MB under the same load), and finishing on the writer's
/// connection slowed processing under a batch load by a tenth (a round's
/// thousands of pages to copy while processing waits). A WAL that grew
/// meanwhile (a backlog keeps the main writer busy) is cut back to
/// [`WAL_SIZE_LIMIT`] when it next starts over.
///
/// PASSIVE: a reader in the middle of a read keeps the pages it may still
/// need, copied next time. A failure (logged) does not stop the task: it
/// reconnects after a capped backoff (100 ms doubling, at most 10 s), and
/// the writers' own checkpoints past the backstop cover the gap.
fn spawn_checkpointer(
    options: SqliteConnectOptions,
    inbox_file: String,
    inbox: InboxWriter,
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
                // The inbox's truncation runs on its writer (between two of
                // its commits), the main file's here.
                let schemas: &[&str] = if low {
                    &["main"]
                } else {
                    &["main", INBOX_SCHEMA]
                };
                for schema in schemas {
                    sqlx::query(AssertSqlSafe(format!(
                        "PRAGMA {schema}.wal_checkpoint({mode})"
                    )))
                    .execute(&mut *conn)
                    .await?;
                }
                inbox.checkpoint(low).await?;
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
        self.inbox.start_handoff().await?;
        self.load_partitions().await
    }
}

#[async_trait]
impl IngestEngine for SqliteStore {
    async fn commit_ingest(
        &self,
        rows: &[IngestRow],
        keep: KeepFn<'_>,
        deadline: std::time::Instant,
    ) -> Result<Vec<Fence>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        self.inbox.commit(rows, keep, deadline).await
    }
}

#[async_trait]
impl ProcessingEngine for SqliteStore {
    async fn backlog_tenants(&self, limit: u32) -> Result<Vec<TenantId>> {
        let ids: Vec<Uuid> = sqlx::query_scalar("SELECT DISTINCT tenant_id FROM inbox LIMIT $1")
            .bind(limit as i64)
            .fetch_all(&self.reader)
            .await?;
        Ok(ids.into_iter().map(TenantId).collect())
    }

    async fn process_batch(&self, req: &ProcessRequest) -> Result<ProcessOutcome> {
        let small;
        let req = if self.low_disk.load(Ordering::Acquire) && req.limit > LOW_DISK_ROUND {
            small = ProcessRequest {
                limit: LOW_DISK_ROUND,
                ..req.clone()
            };
            &small
        } else {
            req
        };
        let items = match self.handoff.read(req.tenant_id, req.after_seq, req.limit) {
            Some(items) => items,
            None => self.read_round(req).await?,
        };
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
        // The commit syncs even without outbox rows: the inbox rows it
        // processed are deleted right after, in the other file, and that
        // delete must never outlive a processing commit lost to power loss.
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
        processing::run(
            self,
            Tx::Lite(tx),
            emit,
            req,
            processing::Consume::Afterwards { items, screen },
        )
        .await
    }

    async fn consume_inbox(&self, tenant: TenantId, seqs: &[i64]) -> Result<()> {
        self.handoff.consumed(tenant, seqs);
        self.inbox.consume(tenant.0, seqs.to_vec()).await
    }

    fn inbox_rewritten(&self, tenant: TenantId) {
        // Neither the hand-off nor a read ahead may give a round the rows
        // as they were: a quarantined row would be processed after all.
        self.handoff.disarm(tenant);
        if let Some(ahead) = self.ahead.lock().remove(&tenant) {
            ahead.rows.abort();
        }
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
        self.inbox.prune(tenants.to_vec(), us(before)).await
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
