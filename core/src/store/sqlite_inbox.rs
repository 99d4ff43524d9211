//! The embedded inbox file's writer: a thread of its own that owns one
//! SQLite connection to `fastack-inbox.db` and its prepared statements, and
//! runs every write to that file (group commits, the deletes after
//! processing, idempotency pruning) one after another.
//!
//! Why not a sqlx pool like the other connections: a group commit there is
//! five hand-offs between the tokio task and sqlx's connection thread (pool
//! acquire, `BEGIN`, the key insert, the inbox insert, `COMMIT`), each a
//! wake-up on a busy two-core box, and a group commit took 1.45 ms of which
//! the disk's sync was a fraction (benches/HISTORY.md, "The embedded group
//! commit on a thread of its own"). Here a group commit is one hand-off
//! each way, its statements are prepared once (constant text, one row per
//! execution) and nothing else queues for the connection's pool.
//!
//! Durability is the same as before: WAL with `synchronous = FULL` for every
//! group commit; only the deletes after processing skip the sync (a delete
//! lost to power loss makes the row come back, to be skipped by the
//! processor's second fence).
//!
//! The thread also finishes each checkpoint of the file (see
//! [`InboxWriter::checkpoint`]): between two of its jobs no commit can land,
//! so the next one starts the WAL over at its head.
//!
//! The fence decisions (which rows are fresh, which keys to release, which
//! rows to queue) are [`super::ingest`]'s, shared with the sqlx path.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use fastack_entities::TenantId;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use tokio::sync::oneshot;
use uuid::Uuid;

use super::{Fence, IngestRow, KeepFn, ingest, processing::Item, sqlite_handoff::Handoff};
use crate::error::{Error, Result};

/// An instant as SQLite keeps it: INTEGER microseconds.
pub(super) fn us(t: chrono::DateTime<chrono::Utc>) -> i64 {
    t.timestamp_micros()
}

/// A WAL that grew past this many bytes (a burst, a backlog) is cut back
/// to it when it next starts over (both files, both connections).
pub(super) const WAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// A unit of work for the writer thread.
type Job = Box<dyn FnOnce(&mut Conn) + Send>;

/// The thread's connection, and whether a delete after processing left it
/// not syncing (set back before anything that must be synced, as the sqlx
/// writer's pool does).
struct Conn {
    conn: Connection,
    relaxed: bool,
}

impl Conn {
    /// The connection with `synchronous = FULL`: a 202's commit.
    fn synced(&mut self) -> Result<&mut Connection> {
        if self.relaxed {
            self.conn.pragma_update(None, "synchronous", "FULL")?;
            self.relaxed = false;
        }
        Ok(&mut self.conn)
    }

    /// The connection with `synchronous = NORMAL`: a write a crash can only
    /// undo harmlessly.
    fn relaxed(&mut self) -> Result<&mut Connection> {
        if !self.relaxed {
            // Counted as relaxed first: should the statement fail halfway,
            // the next synced write sets the level again.
            self.relaxed = true;
            self.conn.pragma_update(None, "synchronous", "NORMAL")?;
        }
        Ok(&mut self.conn)
    }
}

/// Handle to the inbox file's writer thread; the thread ends when the last
/// handle is dropped (after the work already sent to it).
#[derive(Clone, Debug)]
pub(crate) struct InboxWriter {
    jobs: mpsc::Sender<Job>,
    /// Where each commit's queued rows go for processing.
    handoff: Arc<Handoff>,
}

/// Which rows a group keeps once the fence is known, asked of the caller
/// only when some key was taken (the transaction waits for the answer).
type Decide = oneshot::Sender<(Vec<Fence>, oneshot::Sender<Vec<bool>>)>;

impl InboxWriter {
    /// Opens the inbox file on a new thread, with the durability of the
    /// sqlx connections (`journal_mode = WAL`, `synchronous = FULL`), the
    /// same busy timeout and checkpoint backstop. Returns once it is open.
    pub(crate) async fn open(
        path: PathBuf,
        busy_timeout: Duration,
        autocheckpoint: u32,
        handoff: Arc<Handoff>,
    ) -> Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let (ready, opened) = oneshot::channel();
        std::thread::Builder::new()
            .name("fastack-inbox".to_owned())
            .spawn(move || {
                let mut conn = match connect(&path, busy_timeout, autocheckpoint) {
                    Ok(conn) => Conn {
                        conn,
                        relaxed: false,
                    },
                    Err(e) => {
                        ready.send(Err(e)).ok();
                        return;
                    }
                };
                ready.send(Ok(())).ok();
                while let Ok(job) = queue.recv() {
                    // A job that panics loses its own answer (its caller
                    // sees the writer as unavailable and retries); its
                    // transaction rolls back as it unwinds, and the thread
                    // stays for the next group.
                    let run = std::panic::AssertUnwindSafe(|| job(&mut conn));
                    if std::panic::catch_unwind(run).is_err() {
                        tracing::error!("inbox writer job panicked; its transaction rolled back");
                    }
                }
            })
            .map_err(|e| Error::io("inbox writer thread", e))?;
        opened.await.map_err(|_| Error::ShuttingDown)??;
        Ok(InboxWriter { jobs, handoff })
    }

    /// Runs `f` on the writer's connection and returns what it returns.
    async fn run<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Conn) -> Result<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Box::new(move |conn| {
                reply.send(f(conn)).ok();
            }))
            .map_err(|_| Error::ShuttingDown)?;
        answer.await.map_err(|_| Error::ShuttingDown)?
    }

    /// The group commit: records the keys, settles the fence, queues the
    /// kept rows, one synced transaction. `keep` is asked on this task
    /// before the transaction (for the common case where every key is new)
    /// and again, inside it, only if some key was taken.
    ///
    /// A group whose `deadline` passed while it waited for the thread (a
    /// checkpoint or a stalled disk ahead of it) is not started: its
    /// requests were already answered `503`.
    pub(crate) async fn commit(
        &self,
        rows: &[IngestRow],
        keep: KeepFn<'_>,
        deadline: Instant,
    ) -> Result<Vec<Fence>> {
        let kept_if_fresh = keep(&vec![Fence::Fresh; rows.len()]);
        let (decide, decision) = oneshot::channel();
        let rows = rows.to_vec();
        let handoff = self.handoff.clone();
        let done = self.run(move |conn| {
            if Instant::now() >= deadline {
                return Err(Error::Deadline("the embedded inbox writer"));
            }
            commit(
                conn.synced()?,
                &rows,
                kept_if_fresh,
                decide,
                &handoff,
                deadline,
            )
        });
        tokio::pin!(done);
        tokio::select! {
            biased;
            result = &mut done => result,
            Ok((fences, kept)) = decision => {
                kept.send(keep(&fences)).ok();
                done.await
            }
        }
    }

    /// Deletes processed inbox rows, without waiting for the disk (the
    /// next group commit's sync makes the delete durable with it).
    pub(crate) async fn consume(&self, tenant: Uuid, seqs: Vec<i64>) -> Result<()> {
        self.run(move |conn| delete_seqs(conn.relaxed()?, tenant, &seqs))
            .await
    }

    /// Copies what is left of the WAL into the file, between two jobs
    /// (PASSIVE: a reader in the middle of a read keeps the pages it may
    /// still need). SQLite writes a WAL from its beginning again only when
    /// a write begins with every frame copied; a checkpoint beside a busy
    /// writer never sees that (commits land while it copies) and the WAL
    /// grew for as long as a load lasted. Run right after the bulk of the
    /// copy was done beside the writer, this copies the few frames
    /// committed meanwhile, and the next commit starts over at the head of
    /// the WAL.
    ///
    /// `truncate` (the disk is low): the WAL is copied whole, waited for
    /// readers, and cut to zero bytes, so it never holds more than the
    /// commits since the last round.
    pub(crate) async fn checkpoint(&self, truncate: bool) -> Result<()> {
        self.run(move |conn| {
            let sql = if truncate {
                "PRAGMA wal_checkpoint(TRUNCATE)"
            } else {
                "PRAGMA wal_checkpoint(PASSIVE)"
            };
            conn.conn.query_row(sql, [], |_| Ok(()))?;
            Ok(())
        })
        .await
    }

    /// Starts the hand-off of committed rows to processing (see
    /// [`Handoff::start`]), between two commits.
    pub(crate) async fn start_handoff(&self) -> Result<()> {
        let handoff = self.handoff.clone();
        self.run(move |conn| {
            let mut backlog = HashSet::new();
            let mut tenants = conn.conn.prepare("SELECT DISTINCT tenant_id FROM inbox")?;
            let mut rows = tenants.query([])?;
            while let Some(row) = rows.next()? {
                let id: Vec<u8> = row.get(0)?;
                let id = Uuid::from_slice(&id)
                    .map_err(|e| Error::Corrupt(format!("inbox tenant id: {e}")))?;
                backlog.insert(TenantId(id));
            }
            handoff.start(backlog);
            Ok(())
        })
        .await
    }

    /// Forgets the tenants' idempotency keys of events that occurred
    /// before `before` (microseconds); returns how many.
    pub(crate) async fn prune(&self, tenants: Vec<TenantId>, before: i64) -> Result<u64> {
        self.run(move |conn| {
            let conn = conn.synced()?;
            let mut prune = conn.prepare_cached(
                "DELETE FROM idempotency_keys WHERE tenant_id = ?1 AND occurred_at < ?2",
            )?;
            let mut total = 0;
            for t in &tenants {
                total += prune.execute(params![t.0.as_bytes(), before])? as u64;
            }
            Ok(total)
        })
        .await
    }
}

fn connect(path: &Path, busy_timeout: Duration, autocheckpoint: u32) -> Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(busy_timeout)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "wal_autocheckpoint", autocheckpoint)?;
    // Statement journals of multi-row deletes stay in memory.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
    Ok(conn)
}

fn delete_seqs(conn: &mut Connection, tenant: Uuid, seqs: &[i64]) -> Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut delete =
            tx.prepare_cached("DELETE FROM inbox WHERE tenant_id = ?1 AND seq = ?2")?;
        for seq in seqs {
            delete.execute(params![tenant.as_bytes(), seq])?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// [`InboxWriter::commit`] on the writer thread.
fn commit(
    conn: &mut Connection,
    rows: &[IngestRow],
    kept_if_fresh: Vec<bool>,
    decide: Decide,
    handoff: &Handoff,
    deadline: Instant,
) -> Result<Vec<Fence>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut inserted: HashSet<Uuid> = HashSet::with_capacity(rows.len());
    {
        let mut record = tx.prepare_cached(
            "INSERT INTO idempotency_keys \
             (tenant_id, idempotency_key, event_id, fingerprint, occurred_at, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
        )?;
        for r in ingest::lock_order(rows) {
            let changed = record.execute(params![
                r.tenant_id.0.as_bytes(),
                r.idempotency_key,
                r.event_id.0.as_bytes(),
                r.fingerprint,
                us(r.occurred_at),
                us(r.received_at),
            ])?;
            if changed == 1 {
                inserted.insert(r.event_id.0);
            }
        }
    }
    let (fences, kept) = if inserted.len() == rows.len() {
        (vec![Fence::Fresh; rows.len()], kept_if_fresh)
    } else {
        let fences = ingest::fences(rows, &inserted, &owners(&tx, rows, &inserted)?)?;
        let (answer, kept) = oneshot::channel();
        decide
            .send((fences.clone(), answer))
            .map_err(|_| Error::ShuttingDown)?;
        let kept = kept.blocking_recv().map_err(|_| Error::ShuttingDown)?;
        (fences, kept)
    };
    let (queued, dropped) = ingest::split(rows, &fences, &kept);
    let mut handed = Vec::with_capacity(rows.len());
    {
        let mut release = tx.prepare_cached(
            "DELETE FROM idempotency_keys WHERE tenant_id = ?1 AND idempotency_key = ?2",
        )?;
        for (tenant, keys) in dropped {
            for key in keys {
                release.execute(params![tenant.as_bytes(), key])?;
            }
        }
        let mut queue = tx.prepare_cached(
            "INSERT INTO inbox (tenant_id, event_id, payload, received_at) \
             VALUES (?1, ?2, ?3, ?4)",
        )?;
        for r in queued {
            queue.execute(params![
                r.tenant_id.0.as_bytes(),
                r.event_id.0.as_bytes(),
                r.payload,
                us(r.received_at),
            ])?;
            handed.push((
                r.tenant_id,
                Item {
                    seq: tx.last_insert_rowid(),
                    id: r.event_id,
                    event: r.event.clone(),
                    received_at: r.received_at,
                },
            ));
        }
    }
    // Its requests are answered 503 at the deadline: past it, roll back
    // (only a sync that stalls after this point can outlive the answer).
    if Instant::now() >= deadline {
        return Err(Error::Deadline("the embedded inbox writer"));
    }
    tx.commit()?;
    // Durable now: processing may take the rows.
    handoff.committed(handed);
    Ok(fences)
}

/// Who owns the keys this group did not record: by which event, with
/// which content.
fn owners(
    tx: &rusqlite::Transaction<'_>,
    rows: &[IngestRow],
    inserted: &HashSet<Uuid>,
) -> Result<HashMap<(Uuid, String), Fence>> {
    let mut owners = HashMap::new();
    let mut owner = tx.prepare_cached(
        "SELECT event_id, fingerprint FROM idempotency_keys \
         WHERE tenant_id = ?1 AND idempotency_key = ?2",
    )?;
    for (tenant, keys) in ingest::taken_keys(rows, inserted) {
        for key in keys {
            let found = owner
                .query_row(params![tenant.as_bytes(), key], |row| {
                    Ok((row.get::<_, Vec<u8>>(0)?, row.get::<_, Vec<u8>>(1)?))
                })
                .optional()?;
            if let Some((event_id, fingerprint)) = found {
                let event_id = Uuid::from_slice(&event_id)
                    .map_err(|e| Error::Corrupt(format!("event id: {e}")))?;
                let taken = ingest::taken(key, event_id, &fingerprint)?;
                owners.insert((tenant, taken.key.clone()), taken.fence());
            }
        }
    }
    Ok(owners)
}
