//! The embedded store's accept log in use (the files: [`super::accept_log`]):
//! the group commit, the index of what processing has not taken yet, and
//! the rounds processing takes from it.
//!
//! **The group commit** runs on a thread of its own that owns the log's
//! appender and a read connection to the main file. For each row it
//! decides the idempotency fence without writing anything: a key of an
//! event not processed yet is in the index (a hash of tenant and key,
//! checked against the record itself, so a collision of hashes costs a
//! read, never a wrong answer); a key of a processed event is in
//! `idempotency_keys`, which processing writes in the same transaction as
//! the event and its cursor, and only then drops the key from the index —
//! so at every moment a key accepted is found in one or the other. The
//! kept rows are appended and synced; only then are they indexed and the
//! requests answered. A group whose answer is already due is not
//! appended; a group appended is indexed even when its sync fails (its
//! requests are answered `503`, their retries find the keys), and the log
//! then takes no more groups: a sync that failed once cannot be trusted
//! again until a restart reads the log back.
//!
//! **The index** holds, per tenant, the records after its cursor in
//! sequence order: position, key hash and, while memory allows, the event
//! as the front door validated it (so processing neither reads nor decodes
//! it). Built at start by reading every live segment against the cursors
//! of `log_cursors`.
//!
//! **A round** takes a tenant's first records; the processing transaction
//! stores their events and keys and moves the tenant's cursor from where
//! the round found it to its last record (a compare-and-set: two rounds of
//! one tenant cannot both commit); after the commit the records leave the
//! index and a segment none of whose records are waiting is dropped (kept
//! as a spare).

use std::{
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    fs::File,
    hash::BuildHasher,
    path::{Path, PathBuf},
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use fastack_entities::{EventId, TenantId};
use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use tokio::sync::oneshot;

use super::accept_log::{self, Appender, LogLock, NewRecord, Pos, Record};
use crate::error::{Error, Result};
use crate::store::{
    Fence, IngestRow, KeepFn, decode_payload, ingest,
    processing::{Item, LogRound as Round},
};

/// Events kept decoded in the index, all tenants together, and their
/// frames' bytes (a decoded event takes a few times its JSON); beyond
/// either, a round reads its records back from the log. By count alone,
/// 50,000 events of the largest size (32 KiB) were over a gigabyte held.
/// At 16,384 (two rounds) the million events over a thousand tenants
/// peaked 15 MiB lower, but batches cost 5 % more CPU per event: under a
/// backlog, every event not held is decoded again by processing.
const HOLD_AT_MOST: usize = 50_000;
const HOLD_BYTES_AT_MOST: u64 = 16 << 20;

/// A tenant's queue or the key table this large and three quarters empty
/// is shrunk (a thousand tenants' queues each grown by a backlog held
/// 64 MiB after it was worked off).
const QUEUE_SHRINK_ABOVE: usize = 64;
const KEYS_SHRINK_ABOVE: usize = 4096;

/// A record not processed yet, in 32 bytes: a million waiting cost 32 MB
/// here (and their keys in [`Index::keys`]). Its segment is the last one
/// starting at or before `seq` (sequence numbers increase across
/// segments); whether it was moved in from the inbox table, and its event
/// while held, are kept beside it in the index, for the few that have them.
#[derive(Debug, Clone, Copy)]
struct Entry {
    seq: u64,
    key_hash: u64,
    /// `received_at`, microseconds since the epoch.
    received_us: i64,
    /// Where its frame's body lies in its segment (a segment is far
    /// smaller than 4 GiB: [`AcceptLog::open`] refuses larger ones).
    offset: u32,
    len: u32,
}

impl Entry {
    fn new(seq: u64, pos: Pos, key_hash: u64, received_at: DateTime<Utc>) -> Self {
        Entry {
            seq,
            key_hash,
            received_us: received_at.timestamp_micros(),
            // Out of range only for a segment `open` refuses; a wrong
            // offset then fails the frame's check, never reads another.
            offset: u32::try_from(pos.offset).unwrap_or(u32::MAX),
            len: pos.len,
        }
    }

    fn received_at(&self) -> DateTime<Utc> {
        DateTime::from_timestamp_micros(self.received_us).unwrap_or_default()
    }
}

/// A record entering the index, with what is kept beside its entry.
struct Added {
    tenant: TenantId,
    entry: Entry,
    /// Moved in from the inbox table (its `received_at` is older than
    /// records before it in the log).
    legacy: bool,
    /// The event as the front door validated it, held if the bounds allow
    /// (boxed only then: under a backlog most are not kept).
    held: Option<Held>,
}

/// An event the index holds decoded, with its content's fingerprint.
#[derive(Debug)]
struct Held {
    item: Item,
    fingerprint: [u8; 32],
}

#[derive(Debug, Default)]
struct TenantLog {
    /// The last record processed (0: none).
    cursor: u64,
    pending: VecDeque<Entry>,
}

#[derive(Debug)]
struct Segment {
    path: PathBuf,
    file: Arc<File>,
    /// Records of it not processed yet.
    pending: u64,
    /// Still appended to.
    open: bool,
}

#[derive(Debug, Default)]
struct Index {
    tenants: HashMap<TenantId, TenantLog>,
    /// Key hash → sequence number of the record holding it (a second record
    /// of the same hash in `collisions`).
    keys: HashMap<u64, u64>,
    collisions: HashMap<u64, Vec<u64>>,
    segments: BTreeMap<u64, Segment>,
    /// Events held decoded, by sequence number, and their frames' bytes.
    held: HashMap<u64, Box<Held>>,
    held_bytes: u64,
    /// Records waiting, all tenants together.
    waiting: usize,
    /// `received_at` of the waiting records moved in from the inbox table,
    /// which come after newer ones: the oldest of the others is at the
    /// front of its tenant's queue. Nothing is kept per record beyond its
    /// entry (a million waiting records cost their entries and their keys).
    legacy_received: BTreeMap<u64, DateTime<Utc>>,
}

impl Index {
    fn add_key(&mut self, hash: u64, seq: u64) {
        if let Some(first) = self.keys.get(&hash).copied() {
            if first != seq {
                self.collisions.entry(hash).or_default().push(seq);
            }
        } else {
            self.keys.insert(hash, seq);
        }
    }

    fn remove_key(&mut self, hash: u64, seq: u64) {
        if self.keys.get(&hash) == Some(&seq) {
            self.keys.remove(&hash);
            if let Some(mut more) = self.collisions.remove(&hash) {
                let next = more.remove(0);
                self.keys.insert(hash, next);
                if !more.is_empty() {
                    self.collisions.insert(hash, more);
                }
            }
        } else if let Some(more) = self.collisions.get_mut(&hash) {
            more.retain(|s| *s != seq);
            if more.is_empty() {
                self.collisions.remove(&hash);
            }
        }
    }

    fn candidates(&self, hash: u64) -> Vec<u64> {
        let mut out: Vec<u64> = self.keys.get(&hash).copied().into_iter().collect();
        if let Some(more) = self.collisions.get(&hash) {
            out.extend(more);
        }
        out
    }

    /// Indexes a waiting record; its event stays held only while the
    /// index holds fewer than its bounds.
    fn add(&mut self, added: Added) {
        let Added {
            tenant,
            entry,
            legacy,
            held,
        } = added;
        self.add_key(entry.key_hash, entry.seq);
        if let Some(s) = self.segment_mut(entry.seq) {
            s.pending += 1;
        }
        if let Some(held) = held {
            let bytes = u64::from(entry.len);
            if self.held.len() < HOLD_AT_MOST && self.held_bytes + bytes <= HOLD_BYTES_AT_MOST {
                self.held.insert(entry.seq, Box::new(held));
                self.held_bytes += bytes;
            }
        }
        self.waiting += 1;
        if legacy {
            self.legacy_received.insert(entry.seq, entry.received_at());
        }
        let pending = &mut self.tenants.entry(tenant).or_default().pending;
        debug_assert!(pending.back().is_none_or(|b| b.seq < entry.seq));
        pending.push_back(entry);
    }

    /// The tenant's waiting record `seq` (its queue is in sequence order).
    fn entry(&self, tenant: TenantId, seq: u64) -> Option<&Entry> {
        let pending = &self.tenants.get(&tenant)?.pending;
        let at = pending.binary_search_by_key(&seq, |e| e.seq).ok()?;
        pending.get(at)
    }

    /// The tenant's records up to `to` leave the index (their commit
    /// moved its cursor there); returns the segments drained by it.
    fn consume(&mut self, tenant: TenantId, to: u64) -> Vec<u64> {
        let mut gone = Vec::new();
        if let Some(tl) = self.tenants.get_mut(&tenant) {
            tl.cursor = tl.cursor.max(to);
            while tl.pending.front().is_some_and(|e| e.seq <= to) {
                gone.push(tl.pending.pop_front().expect("a front"));
            }
            // A backlog's queue gives its memory back once worked off.
            if tl.pending.capacity() > QUEUE_SHRINK_ABOVE
                && tl.pending.len() < tl.pending.capacity() / 4
            {
                tl.pending.shrink_to(tl.pending.len() * 2);
            }
        }
        for e in gone {
            self.remove_key(e.key_hash, e.seq);
            self.waiting -= 1;
            self.legacy_received.remove(&e.seq);
            if self.held.remove(&e.seq).is_some() {
                self.held_bytes -= u64::from(e.len);
            }
            if let Some(s) = self.segment_mut(e.seq) {
                s.pending = s.pending.saturating_sub(1);
            }
        }
        if self.held.capacity() > KEYS_SHRINK_ABOVE && self.held.len() < self.held.capacity() / 4 {
            self.held.shrink_to(self.held.len() * 2);
        }
        if self.keys.capacity() > KEYS_SHRINK_ABOVE && self.keys.len() < self.keys.capacity() / 4 {
            let keep = self.keys.len() * 2;
            self.keys.shrink_to(keep);
        }
        self.drained()
    }

    /// The oldest waiting record's `received_at`: the first of some
    /// tenant's queue, or one moved in from the inbox table.
    fn oldest(&self) -> Option<DateTime<Utc>> {
        let fronts = self
            .tenants
            .values()
            .filter_map(|tl| tl.pending.front().map(Entry::received_at));
        fronts.chain(self.legacy_received.values().copied()).min()
    }

    /// The segment holding record `seq`: the last one starting at or
    /// before it.
    fn segment_mut(&mut self, seq: u64) -> Option<&mut Segment> {
        self.segments.range_mut(..=seq).next_back().map(|(_, s)| s)
    }

    /// Where a waiting record lies: its position, and its segment's file
    /// and path.
    fn locate(&self, e: &Entry) -> Result<At> {
        let (first, s) = self.segments.range(..=e.seq).next_back().ok_or_else(|| {
            Error::Corrupt(format!("the log segment of record {} is gone", e.seq))
        })?;
        let pos = Pos {
            segment: *first,
            offset: u64::from(e.offset),
            len: e.len,
        };
        Ok(At {
            seq: e.seq,
            pos,
            file: s.file.clone(),
            path: s.path.clone(),
        })
    }

    /// Segments that are sealed and hold nothing waiting: forgotten here,
    /// returned to be released.
    fn drained(&mut self) -> Vec<u64> {
        let done: Vec<u64> = self
            .segments
            .iter()
            .filter(|(_, s)| !s.open && s.pending == 0)
            .map(|(first, _)| *first)
            .collect();
        for first in &done {
            self.segments.remove(first);
        }
        done
    }
}

/// A waiting record's place, to read it back outside the index's lock.
struct At {
    seq: u64,
    pos: Pos,
    file: Arc<File>,
    path: PathBuf,
}

impl At {
    /// The record, checked to be the one its entry names (a segment
    /// missing from the index would otherwise point into another).
    fn read(&self) -> Result<Record> {
        let r = accept_log::read_at(&self.file, &self.path, self.pos)?;
        if r.seq != self.seq {
            return Err(Error::Corrupt(format!(
                "the log holds record {} where {} was indexed",
                r.seq, self.seq
            )));
        }
        Ok(r)
    }
}

/// A row of the inbox table (an earlier release's, or a quarantined event
/// put back), to move into the log.
#[derive(Debug, Clone)]
pub(crate) struct LegacyRow {
    pub seq: i64,
    pub tenant: TenantId,
    pub event_id: EventId,
    pub payload: String,
    pub received_at: DateTime<Utc>,
}

type Job = Box<dyn FnOnce(&mut Writer) + Send>;

/// The writer thread's own state.
struct Writer {
    appender: Appender,
    keys: Connection,
    /// A sync failed: no more groups until a restart.
    broken: Option<String>,
}

/// The accept log of an embedded store (see the module doc).
#[derive(Debug)]
pub(crate) struct AcceptLog {
    jobs: mpsc::Sender<Job>,
    index: Arc<Mutex<Index>>,
    hasher: std::hash::RandomState,
    /// `seq`s of inbox-table rows already in the log (a move stopped before
    /// their delete).
    moved: Mutex<HashSet<i64>>,
}

/// Which rows a group keeps once the fence is known, asked of the caller
/// only when some key was taken.
type Decide = oneshot::Sender<(Vec<Fence>, oneshot::Sender<Vec<bool>>)>;

impl AcceptLog {
    /// Opens the log of `dir` for appending, reads it back against the
    /// tenants' `cursors`, and starts its writer thread with a read
    /// connection on the main file (`main`) for the keys of processed
    /// events.
    pub(crate) async fn open(
        dir: PathBuf,
        main: PathBuf,
        segment_bytes: u64,
        cursors: HashMap<TenantId, u64>,
    ) -> Result<Self> {
        if u32::try_from(segment_bytes).is_err() {
            return Err(Error::Storage(format!(
                "log segments of {segment_bytes} bytes: the index addresses at most 4 GiB"
            )));
        }
        let hasher = std::hash::RandomState::new();
        let (ready, opened) = oneshot::channel();
        let (jobs, queue) = mpsc::channel::<Job>();
        let h = hasher.clone();
        std::thread::Builder::new()
            .name("fastack-log".to_owned())
            .spawn(move || {
                let start = || -> Result<(Writer, Index, HashSet<i64>)> {
                    let lock = LogLock::take(&dir)?;
                    let (index, moved, next) = load(&dir, &cursors, &h)?;
                    let appender = Appender::open(lock, segment_bytes, next);
                    let keys = Connection::open_with_flags(
                        &main,
                        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                    )?;
                    keys.busy_timeout(Duration::from_secs(10))?;
                    Ok((
                        Writer {
                            appender,
                            keys,
                            broken: None,
                        },
                        index,
                        moved,
                    ))
                };
                let mut writer = match start() {
                    Ok((writer, index, moved)) => {
                        ready.send(Ok((index, moved))).ok();
                        writer
                    }
                    Err(e) => {
                        ready.send(Err(e)).ok();
                        return;
                    }
                };
                while let Ok(job) = queue.recv() {
                    let run = std::panic::AssertUnwindSafe(|| job(&mut writer));
                    if std::panic::catch_unwind(run).is_err() {
                        tracing::error!("accept log job panicked");
                    }
                }
            })
            .map_err(|e| Error::io("accept log thread", e))?;
        let (index, moved) = opened.await.map_err(|_| Error::ShuttingDown)??;
        let log = AcceptLog {
            jobs,
            index: Arc::new(Mutex::new(index)),
            hasher,
            moved: Mutex::new(moved),
        };
        // Segments whose records were all processed before the restart.
        let drained = log.index.lock().drained();
        log.release(drained);
        Ok(log)
    }

    fn key_hash(&self, tenant: TenantId, key: &str) -> u64 {
        self.hasher.hash_one((tenant.0, key))
    }

    async fn run<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Writer) -> Result<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Box::new(move |w| {
                reply.send(f(w)).ok();
            }))
            .map_err(|_| Error::ShuttingDown)?;
        answer.await.map_err(|_| Error::ShuttingDown)?
    }

    fn release(&self, segments: Vec<u64>) {
        if segments.is_empty() {
            return;
        }
        let _ = self.jobs.send(Box::new(move |w| {
            for first in segments {
                if let Err(error) = w.appender.release(first) {
                    tracing::warn!(%error, segment = first, "could not drop a processed log segment");
                }
            }
        }));
    }

    /// The group commit (see the module doc). `keep` is asked on this task
    /// before the append (every key new) and, when a key was taken, again
    /// from the writer thread with the fences.
    pub(crate) async fn commit(
        self: &Arc<Self>,
        rows: &[IngestRow],
        keep: KeepFn<'_>,
        deadline: Instant,
    ) -> Result<Vec<Fence>> {
        let kept_if_fresh = keep(&vec![Fence::Fresh; rows.len()]);
        let (decide, decision) = oneshot::channel();
        let rows = rows.to_vec();
        let log = self.clone();
        let done =
            self.run(move |w| log.commit_on_writer(w, &rows, kept_if_fresh, decide, deadline));
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

    fn commit_on_writer(
        &self,
        w: &mut Writer,
        rows: &[IngestRow],
        kept_if_fresh: Vec<bool>,
        decide: Decide,
        deadline: Instant,
    ) -> Result<Vec<Fence>> {
        if let Some(why) = &w.broken {
            return Err(Error::Storage(why.clone()));
        }
        if Instant::now() >= deadline {
            return Err(Error::Deadline("the accept log"));
        }
        let hashes: Vec<u64> = rows
            .iter()
            .map(|r| self.key_hash(r.tenant_id, &r.idempotency_key))
            .collect();
        let mut fences = Vec::with_capacity(rows.len());
        let mut fresh = true;
        for (r, hash) in rows.iter().zip(&hashes) {
            let taken = match self.waiting_key(r.tenant_id, &r.idempotency_key, *hash)? {
                Some(t) => Some(t),
                None => processed_key(&w.keys, r.tenant_id, &r.idempotency_key)?,
            };
            match taken {
                Some(t) => {
                    fresh = false;
                    fences.push(t.fence());
                }
                None => fences.push(Fence::Fresh),
            }
        }
        let kept = if fresh {
            kept_if_fresh
        } else {
            let (answer, kept) = oneshot::channel();
            decide
                .send((fences.clone(), answer))
                .map_err(|_| Error::ShuttingDown)?;
            kept.blocking_recv().map_err(|_| Error::ShuttingDown)?
        };
        let (queued, _) = ingest::split(rows, &fences, &kept);
        if queued.is_empty() {
            return Ok(fences);
        }
        if Instant::now() >= deadline {
            return Err(Error::Deadline("the accept log"));
        }
        let records: Vec<NewRecord<'_>> = queued
            .iter()
            .map(|r| NewRecord {
                tenant: r.tenant_id,
                event_id: r.event_id,
                received_at: r.received_at,
                fingerprint: &r.fingerprint,
                legacy_seq: 0,
                key: &r.idempotency_key,
                payload: &r.payload,
            })
            .collect();
        let (placed, opened) = w.appender.append(&records)?;
        let synced = w.appender.sync();
        // Appended, so indexed even if the sync failed (see the module doc).
        let hash_of: HashMap<EventId, u64> = rows
            .iter()
            .zip(&hashes)
            .map(|(r, h)| (r.event_id, *h))
            .collect();
        self.index_appended(
            w,
            opened,
            queued.iter().zip(placed).map(|(r, (seq, pos))| Added {
                tenant: r.tenant_id,
                entry: Entry::new(seq, pos, hash_of[&r.event_id], r.received_at),
                legacy: false,
                held: Some(Held {
                    item: Item {
                        seq: seq as i64,
                        id: r.event_id,
                        event: r.event.clone(),
                        received_at: r.received_at,
                    },
                    fingerprint: r.fingerprint,
                }),
            }),
        );
        if let Err(e) = synced {
            let why = format!("the accept log could not be synced ({e}); restart the node");
            tracing::error!(error = %e, "the accept log could not be synced; it takes no more events until the node restarts");
            w.broken = Some(why);
            return Err(e);
        }
        Ok(fences)
    }

    /// Adds appended records to the index (the segments they opened first).
    fn index_appended(
        &self,
        w: &Writer,
        opened: Vec<accept_log::OpenSegment>,
        records: impl Iterator<Item = Added>,
    ) {
        let mut index = self.index.lock();
        if !opened.is_empty() {
            for s in index.segments.values_mut() {
                s.open = false;
            }
            for s in opened {
                index.segments.insert(
                    s.first,
                    Segment {
                        path: s.path,
                        file: Arc::new(s.file),
                        pending: 0,
                        open: false,
                    },
                );
            }
            if let Some(current) = w.appender.current()
                && let Some(s) = index.segments.get_mut(&current)
            {
                s.open = true;
            }
        }
        for added in records {
            index.add(added);
        }
        let drained = index.drained();
        drop(index);
        // On the writer thread already: released here, not sent to it.
        for first in drained {
            let _ = self.jobs.send(Box::new(move |w| {
                if let Err(error) = w.appender.release(first) {
                    tracing::warn!(%error, segment = first, "could not drop a processed log segment");
                }
            }));
        }
    }

    /// The key's owner among records not processed yet.
    fn waiting_key(
        &self,
        tenant: TenantId,
        key: &str,
        hash: u64,
    ) -> Result<Option<crate::domain::TakenKey>> {
        let index = self.index.lock();
        for seq in index.candidates(hash) {
            // Not in the tenant's queue: another tenant's key of the same hash.
            let Some(entry) = index.entry(tenant, seq) else {
                continue;
            };
            let r = index.locate(entry)?.read()?;
            if r.key == key {
                return Ok(Some(crate::domain::TakenKey {
                    key: r.key,
                    event_id: r.event_id,
                    fingerprint: r.fingerprint,
                }));
            }
        }
        Ok(None)
    }

    /// The tenant's next round: at most `limit` records after its cursor,
    /// the events decoded (read back from the log where the index no
    /// longer holds them). `None` when nothing waits.
    pub(crate) fn round(&self, tenant: TenantId, limit: u32) -> Result<Option<Round>> {
        let (from, picked) = {
            let index = self.index.lock();
            let Some(tl) = index.tenants.get(&tenant) else {
                return Ok(None);
            };
            if tl.pending.is_empty() {
                return Ok(None);
            }
            let mut picked = Vec::with_capacity((limit as usize).min(tl.pending.len()));
            for e in tl.pending.iter().take(limit as usize) {
                let read = match index.held.get(&e.seq) {
                    Some(h) => Ok((h.item.clone(), h.fingerprint)),
                    None => Err(index.locate(e)?),
                };
                picked.push((e.seq, index.legacy_received.contains_key(&e.seq), read));
            }
            (tl.cursor, picked)
        };
        let mut round = Round {
            items: Vec::with_capacity(picked.len()),
            fingerprints: Vec::with_capacity(picked.len()),
            legacy: HashSet::new(),
            from,
            to: picked.last().map_or(from, |p| p.0),
        };
        for (seq, legacy, read) in picked {
            let (item, fingerprint) = match read {
                Ok(held) => held,
                Err(at) => {
                    let r = at.read()?;
                    let item = Item {
                        seq: r.seq as i64,
                        id: r.event_id,
                        event: Arc::new(decode_payload(&r.payload)?),
                        received_at: r.received_at,
                    };
                    (item, r.fingerprint)
                }
            };
            if legacy {
                round.legacy.insert(seq as i64);
            }
            round.items.push(item);
            round.fingerprints.push(fingerprint);
        }
        Ok(Some(round))
    }

    /// The tenant's records up to `to` were processed (their commit moved
    /// its cursor there): they leave the index, and segments none of whose
    /// records wait any more are dropped.
    pub(crate) fn consumed(&self, tenant: TenantId, to: u64) {
        let drained = self.index.lock().consume(tenant, to);
        self.release(drained);
    }

    /// Tenants with records waiting (at most `limit`).
    pub(crate) fn backlog(&self, limit: u32) -> Vec<TenantId> {
        self.index
            .lock()
            .tenants
            .iter()
            .filter(|(_, tl)| !tl.pending.is_empty())
            .map(|(t, _)| *t)
            .take(limit as usize)
            .collect()
    }

    /// Records waiting, and the oldest one's `received_at`.
    pub(crate) fn stats(&self) -> (i64, Option<DateTime<Utc>>) {
        let index = self.index.lock();
        (index.waiting as i64, index.oldest())
    }

    /// The key's owner among records not processed yet (the front door
    /// asks before a plan's refusal: a key taken is a duplicate).
    pub(crate) fn taken_key(
        &self,
        tenant: TenantId,
        key: &str,
    ) -> Result<Option<crate::domain::TakenKey>> {
        self.waiting_key(tenant, key, self.key_hash(tenant, key))
    }

    /// The tenant's first waiting record after `after` (from its cursor
    /// when `None`): its sequence number and event.
    pub(crate) fn first_waiting(&self, tenant: TenantId) -> Option<(u64, EventId)> {
        self.next_waiting(tenant, None)
    }

    /// See [`AcceptLog::first_waiting`].
    pub(crate) fn next_waiting(
        &self,
        tenant: TenantId,
        after: Option<u64>,
    ) -> Option<(u64, EventId)> {
        let index = self.index.lock();
        let e = index
            .tenants
            .get(&tenant)?
            .pending
            .iter()
            .find(|e| after.is_none_or(|a| e.seq > a))?;
        let id = match index.held.get(&e.seq) {
            Some(h) => h.item.id,
            None => index.locate(e).ok()?.read().ok()?.event_id,
        };
        Some((e.seq, id))
    }

    /// The record `seq` of `tenant`, while it waits.
    pub(crate) fn waiting_record(&self, tenant: TenantId, seq: u64) -> Result<Option<Record>> {
        let index = self.index.lock();
        let Some(e) = index.entry(tenant, seq) else {
            return Ok(None);
        };
        index.locate(e)?.read().map(Some)
    }

    /// The tenant's cursor and the records waiting after it (read back).
    pub(crate) fn waiting(&self, tenant: TenantId) -> Result<(u64, Vec<Record>)> {
        let (cursor, at) = {
            let index = self.index.lock();
            match index.tenants.get(&tenant) {
                None => return Ok((0, Vec::new())),
                Some(tl) => {
                    let mut at = Vec::with_capacity(tl.pending.len());
                    for e in &tl.pending {
                        at.push(index.locate(e)?);
                    }
                    (tl.cursor, at)
                }
            }
        };
        let mut out = Vec::with_capacity(at.len());
        for at in at {
            out.push(at.read()?);
        }
        Ok((cursor, out))
    }

    /// Moves rows of the inbox table into the log (synced), skipping those
    /// already moved; returns the `seq`s of the rows now in the log, for
    /// the caller to delete from the table.
    pub(crate) async fn import(self: &Arc<Self>, rows: Vec<LegacyRow>) -> Result<Vec<i64>> {
        let already: HashSet<i64> = self.moved.lock().clone();
        let (todo, done): (Vec<LegacyRow>, Vec<LegacyRow>) =
            rows.into_iter().partition(|r| !already.contains(&r.seq));
        let mut moved: Vec<i64> = done.iter().map(|r| r.seq).collect();
        if todo.is_empty() {
            return Ok(moved);
        }
        let mut decoded = Vec::with_capacity(todo.len());
        for r in todo {
            // A payload this build cannot read stays where it is, for
            // processing's refusal to quarantine it as before.
            match decode_payload(&r.payload) {
                Ok(event) => decoded.push((r, event)),
                Err(error) => {
                    tracing::warn!(%error, seq = r.seq, "an inbox row that cannot be read was left in the inbox");
                }
            }
        }
        let log = self.clone();
        let seqs = self
            .run(move |w| {
                if let Some(why) = &w.broken {
                    return Err(Error::Storage(why.clone()));
                }
                // The key's row keeps the fingerprint it was accepted with.
                let mut fps: Vec<[u8; 32]> = Vec::with_capacity(decoded.len());
                for (r, e) in &decoded {
                    fps.push(
                        match processed_key(&w.keys, r.tenant, &e.idempotency_key)? {
                            Some(taken) => taken.fingerprint,
                            None => crate::validate::fingerprint(e),
                        },
                    );
                }
                let records: Vec<NewRecord<'_>> = decoded
                    .iter()
                    .zip(&fps)
                    .map(|((r, e), fp)| NewRecord {
                        tenant: r.tenant,
                        event_id: r.event_id,
                        received_at: r.received_at,
                        fingerprint: fp,
                        legacy_seq: r.seq,
                        key: &e.idempotency_key,
                        payload: &r.payload,
                    })
                    .collect();
                let (placed, opened) = w.appender.append(&records)?;
                w.appender.sync()?;
                let seqs = records_seqs(&records);
                drop(records);
                log.index_appended(
                    w,
                    opened,
                    decoded
                        .iter()
                        .zip(placed)
                        .map(|((r, event), (seq, pos))| Added {
                            tenant: r.tenant,
                            entry: Entry::new(
                                seq,
                                pos,
                                log.key_hash(r.tenant, &event.idempotency_key),
                                r.received_at,
                            ),
                            legacy: true,
                            held: None,
                        }),
                );
                Ok(seqs)
            })
            .await?;
        self.moved.lock().extend(seqs.iter().copied());
        moved.extend(seqs);
        Ok(moved)
    }

    /// Inbox-table rows deleted after their move: forgotten.
    pub(crate) fn forget_moved(&self, seqs: &[i64]) {
        let mut moved = self.moved.lock();
        for s in seqs {
            moved.remove(s);
        }
    }
}

fn records_seqs(records: &[NewRecord<'_>]) -> Vec<i64> {
    records.iter().map(|r| r.legacy_seq).collect()
}

/// The key's owner among processed events (`idempotency_keys`).
fn processed_key(
    conn: &Connection,
    tenant: TenantId,
    key: &str,
) -> Result<Option<crate::domain::TakenKey>> {
    let mut q = conn.prepare_cached(
        "SELECT event_id, fingerprint FROM idempotency_keys \
         WHERE tenant_id = ?1 AND idempotency_key = ?2",
    )?;
    let found = q
        .query_row(params![tenant.0.as_bytes(), key], |row| {
            Ok((row.get::<_, Vec<u8>>(0)?, row.get::<_, Vec<u8>>(1)?))
        })
        .optional()?;
    match found {
        None => Ok(None),
        Some((event_id, fingerprint)) => {
            let event_id = uuid::Uuid::from_slice(&event_id)
                .map_err(|e| Error::Corrupt(format!("event id: {e}")))?;
            ingest::taken(key.to_owned(), event_id, &fingerprint).map(Some)
        }
    }
}

/// Reads the log of `dir` back: the index of what waits after each
/// tenant's cursor, the `seq`s of inbox-table rows it holds, and the next
/// sequence number.
fn load(
    dir: &Path,
    cursors: &HashMap<TenantId, u64>,
    hasher: &std::hash::RandomState,
) -> Result<(Index, HashSet<i64>, u64)> {
    let mut index = Index::default();
    let mut moved = HashSet::new();
    let mut next = 1;
    for segment in accept_log::open_segments(dir)? {
        index.segments.insert(
            segment.first,
            Segment {
                path: segment.path.clone(),
                file: Arc::new(segment.file),
                pending: 0,
                open: false,
            },
        );
        let end = accept_log::scan_segment(&segment.path, segment.first, |r, pos| {
            if r.legacy_seq != 0 {
                moved.insert(r.legacy_seq);
            }
            if r.seq <= cursors.get(&r.tenant).copied().unwrap_or(0) {
                return Ok(());
            }
            let key_hash = hasher.hash_one((r.tenant.0, r.key.as_str()));
            index.add(Added {
                tenant: r.tenant,
                entry: Entry::new(r.seq, pos, key_hash, r.received_at),
                legacy: r.legacy_seq != 0,
                held: None,
            });
            Ok(())
        })?;
        next = next.max(end.next_seq).max(segment.first);
    }
    // Sequence numbers never go back, even past a log restored from a
    // backup older than the cursors.
    let highest_cursor = cursors.values().copied().max().unwrap_or(0);
    for (tenant, cursor) in cursors {
        index.tenants.entry(*tenant).or_default().cursor = *cursor;
    }
    Ok((index, moved, next.max(highest_cursor + 1)))
}

#[cfg(test)]
mod tests {
    use fastack_entities::{EventKind, NewEvent};

    use super::*;

    fn entry(tenant: TenantId, seq: u64, len: u32) -> Added {
        let event = NewEvent {
            kind: EventKind::Track,
            event: Some("e".into()),
            user_id: Some("u".into()),
            anonymous_id: None,
            properties: Default::default(),
            occurred_at: Utc::now().fixed_offset(),
            idempotency_key: format!("k{seq}"),
            plan: None,
        };
        let pos = Pos {
            segment: 1,
            offset: 0,
            len,
        };
        Added {
            tenant,
            entry: Entry::new(seq, pos, seq, Utc::now()),
            legacy: false,
            held: Some(Held {
                item: Item {
                    seq: seq as i64,
                    id: EventId(uuid::Uuid::now_v7()),
                    event: Arc::new(event),
                    received_at: Utc::now(),
                },
                fingerprint: [0; 32],
            }),
        }
    }

    fn held(index: &Index, tenant: TenantId) -> Vec<bool> {
        index.tenants[&tenant]
            .pending
            .iter()
            .map(|e| index.held.contains_key(&e.seq))
            .collect()
    }

    #[test]
    fn an_entry_is_32_bytes() {
        assert_eq!(std::mem::size_of::<Entry>(), 32);
    }

    #[test]
    fn held_events_are_bounded_by_bytes_and_freed_when_consumed() {
        let tenant = TenantId(uuid::Uuid::now_v7());
        let mut index = Index::default();
        let big = 32 * 1024;
        let fit = HOLD_BYTES_AT_MOST / u64::from(big);
        for seq in 1..=fit + 2 {
            index.add(entry(tenant, seq, big));
        }
        let flags = held(&index, tenant);
        assert!(flags[..fit as usize].iter().all(|h| *h));
        assert!(
            !flags[fit as usize..].iter().any(|h| *h),
            "past the bytes bound, read back from the log"
        );
        assert_eq!(
            (index.held.len(), index.held_bytes),
            (fit as usize, fit * u64::from(big))
        );
        index.add(entry(tenant, fit + 3, 100));
        assert_eq!(held(&index, tenant).last(), Some(&false));

        // Consumed records give their bytes back.
        index.consume(tenant, 1);
        assert_eq!(index.held_bytes, (fit - 1) * u64::from(big));
        index.add(entry(tenant, fit + 4, 100));
        assert_eq!(held(&index, tenant).last(), Some(&true), "room again");
        index.consume(tenant, fit + 4);
        assert_eq!(
            (index.held.len(), index.held_bytes, index.waiting),
            (0, 0, 0)
        );
    }

    #[test]
    fn the_oldest_waiting_is_a_queue_front_or_a_moved_in_row() {
        let (a, b) = (
            TenantId(uuid::Uuid::now_v7()),
            TenantId(uuid::Uuid::now_v7()),
        );
        let mut index = Index::default();
        let t0 = DateTime::from_timestamp_micros(Utc::now().timestamp_micros()).expect("now");
        let at = |tenant: TenantId, seq: u64, secs: i64, legacy: bool| {
            let added = entry(tenant, seq, 10);
            Added {
                entry: Entry {
                    received_us: (t0 + chrono::Duration::seconds(secs)).timestamp_micros(),
                    ..added.entry
                },
                legacy,
                ..added
            }
        };
        index.add(at(a, 1, 10, false));
        index.add(at(b, 2, 5, false));
        index.add(at(a, 3, 20, false));
        assert_eq!(index.waiting, 3);
        assert_eq!(index.oldest(), Some(t0 + chrono::Duration::seconds(5)));
        // A quarantined event put back: behind newer ones, and the oldest.
        index.add(at(a, 4, -60, true));
        assert_eq!(index.oldest(), Some(t0 - chrono::Duration::seconds(60)));
        index.consume(b, 2);
        index.consume(a, 4);
        assert_eq!(index.oldest(), None);
        assert!(index.legacy_received.is_empty());
    }
}
