//! The embedded store's accept log: the one durable write of an accepted
//! event. A group commit appends one frame per event to the current
//! segment and syncs it (`fdatasync`) before any of its requests is
//! answered; processing reads the frames back by position and, once every
//! frame of a segment is processed, the segment is dropped whole — no row
//! inserted at the `202` and deleted after processing.
//!
//! Files, under `<data dir>/log/`:
//!
//! - `<first seq, 20 digits>.seg`: a segment of `segment_bytes` bytes, a
//!   16-byte header (`FSTKLOG1`, the first sequence number) then frames;
//! - `spare-0.seg`: a consumed segment kept for reuse (renamed into place
//!   when the current one is full, so a busy log writes over blocks it
//!   already has instead of allocating new ones);
//! - `LOCK`: held (`flock`) by the one process that appends.
//!
//! A frame is `len u32 | crc32 u32 | body`, little-endian, the CRC over the
//! body; the body is `seq u64 | tenant 16 | event id 16 | received_at i64 µs
//! | fingerprint 32 | legacy seq i64 | key length u16 | key | payload`.
//! Sequence numbers are contiguous within a segment and increase across
//! segments. A segment is read from its header until the first frame that
//! is not whole, whose CRC fails, or whose `seq` is not the next one: the
//! tail a crash left half written, or what a reused segment held before.
//! Each writer starts a new segment, so such a tail is never followed by a
//! frame appended later (which a later read would otherwise reach past it).

use std::{
    collections::BTreeMap,
    fs::{File, OpenOptions},
    io::Read,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
};

use chrono::{DateTime, Utc};
use fastack_entities::{EventId, TenantId};
use uuid::Uuid;

use crate::error::{Error, Result};

const MAGIC: &[u8; 8] = b"FSTKLOG1";
/// Bytes before a segment's first frame.
pub(crate) const HEADER: u64 = 16;
/// `len` and `crc` before each body.
const FRAME: usize = 8;
/// The fixed part of a body, before the key.
const FIXED: usize = 8 + 16 + 16 + 8 + 32 + 8 + 2;
/// The directory under the data directory.
pub const DIR: &str = "log";
/// Spare segments kept for reuse (one: a segment's worth of disk held
/// back, so that a busy log writes over blocks it has).
const SPARES: usize = 1;

/// Where a frame's body lies: its segment (by first sequence number), the
/// body's offset and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pos {
    pub segment: u64,
    pub offset: u64,
    pub len: u32,
}

/// An accepted event as the log keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub seq: u64,
    pub tenant: TenantId,
    pub event_id: EventId,
    pub received_at: DateTime<Utc>,
    pub fingerprint: [u8; 32],
    /// The `seq` of the row of the inbox table it was imported from (an
    /// event an earlier release accepted, or a quarantined event put
    /// back), or 0.
    pub legacy_seq: i64,
    pub key: String,
    /// The validated event as JSON (`decode_payload` reads it).
    pub payload: String,
}

/// What an append is given: a record without its sequence number (the log
/// assigns it).
pub(crate) struct NewRecord<'a> {
    pub tenant: TenantId,
    pub event_id: EventId,
    pub received_at: DateTime<Utc>,
    pub fingerprint: &'a [u8; 32],
    pub legacy_seq: i64,
    pub key: &'a str,
    pub payload: &'a str,
}

fn segment_name(first_seq: u64) -> String {
    format!("{first_seq:020}.seg")
}

fn bad(path: &Path, why: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!("{}: {why}", path.display()))
}

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::io(path.display().to_string(), e)
}

/// Bytes `r` takes in a segment (its frame).
fn frame_len(r: &NewRecord<'_>) -> u64 {
    (FRAME + FIXED + r.key.len() + r.payload.len()) as u64
}

/// Appends one frame of `r` under `seq` to `buf`; returns the body's
/// offset within `buf` and its length.
fn encode(buf: &mut Vec<u8>, seq: u64, r: &NewRecord<'_>) -> Result<(usize, u32)> {
    let key = r.key.as_bytes();
    let key_len = u16::try_from(key.len())
        .map_err(|_| Error::Corrupt("an idempotency key longer than 65535 bytes".to_owned()))?;
    let len = FIXED + key.len() + r.payload.len();
    let len32 =
        u32::try_from(len).map_err(|_| Error::Corrupt("an event larger than 4 GiB".to_owned()))?;
    let start = buf.len();
    buf.reserve(FRAME + len);
    buf.extend_from_slice(&len32.to_le_bytes());
    buf.extend_from_slice(&[0; 4]);
    let body = buf.len();
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.extend_from_slice(r.tenant.0.as_bytes());
    buf.extend_from_slice(r.event_id.0.as_bytes());
    buf.extend_from_slice(&r.received_at.timestamp_micros().to_le_bytes());
    buf.extend_from_slice(r.fingerprint);
    buf.extend_from_slice(&r.legacy_seq.to_le_bytes());
    buf.extend_from_slice(&key_len.to_le_bytes());
    buf.extend_from_slice(key);
    buf.extend_from_slice(r.payload.as_bytes());
    let crc = crc32fast::hash(&buf[body..]);
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok((body, len32))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn uuid_at(b: &[u8], at: usize) -> Uuid {
    Uuid::from_bytes(b[at..at + 16].try_into().expect("16 bytes"))
}

/// A body whose CRC matched, read back.
fn decode(body: &[u8]) -> Option<Record> {
    if body.len() < FIXED {
        return None;
    }
    let key_len = u16::from_le_bytes([body[FIXED - 2], body[FIXED - 1]]) as usize;
    if body.len() < FIXED + key_len {
        return None;
    }
    let key = std::str::from_utf8(&body[FIXED..FIXED + key_len]).ok()?;
    let payload = std::str::from_utf8(&body[FIXED + key_len..]).ok()?;
    Some(Record {
        seq: u64_at(body, 0),
        tenant: TenantId(uuid_at(body, 8)),
        event_id: EventId(uuid_at(body, 24)),
        received_at: DateTime::from_timestamp_micros(u64_at(body, 40) as i64)?,
        fingerprint: body[48..80].try_into().ok()?,
        legacy_seq: u64_at(body, 80) as i64,
        key: key.to_owned(),
        payload: payload.to_owned(),
    })
}

/// Reads the record whose body lies at `pos` in `file`.
pub(crate) fn read_at(file: &File, path: &Path, pos: Pos) -> Result<Record> {
    let mut buf = vec![0u8; FRAME + pos.len as usize];
    file.read_exact_at(&mut buf, pos.offset - FRAME as u64)
        .map_err(|e| io(path, e))?;
    let crc = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
    if crc32fast::hash(&buf[FRAME..]) != crc {
        return Err(bad(
            path,
            format!("frame at {} fails its check", pos.offset),
        ));
    }
    decode(&buf[FRAME..]).ok_or_else(|| bad(path, format!("frame at {} is malformed", pos.offset)))
}

/// The segments of `dir` (not spares), by first sequence number.
pub(crate) fn segments(dir: &Path) -> Result<BTreeMap<u64, PathBuf>> {
    let mut out = BTreeMap::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io(dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| io(dir, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if let Some(digits) = name.strip_suffix(".seg")
            && digits.len() == 20
            && let Ok(first) = digits.parse::<u64>()
        {
            out.insert(first, entry.path());
        }
    }
    Ok(out)
}

/// Where reading a segment stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentEnd {
    /// The next sequence number after its last whole frame.
    pub next_seq: u64,
    /// The offset after its last whole frame.
    pub offset: u64,
}

/// Reads every whole frame of the segment at `path` (first sequence number
/// `first`) in order, calling `f` with each record and its position.
pub(crate) fn scan_segment(
    path: &Path,
    first: u64,
    mut f: impl FnMut(Record, Pos) -> Result<()>,
) -> Result<SegmentEnd> {
    let mut file = File::open(path).map_err(|e| io(path, e))?;
    let mut data = Vec::new();
    file.read_to_end(&mut data).map_err(|e| io(path, e))?;
    if data.len() < HEADER as usize || &data[..8] != MAGIC {
        return Err(bad(path, "not a segment of the accept log"));
    }
    if u64_at(&data, 8) != first {
        return Err(bad(path, "its header names another first sequence number"));
    }
    let mut at = HEADER as usize;
    let mut expected = first;
    while at + FRAME <= data.len() {
        let len = u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(data[at + 4..at + 8].try_into().expect("4 bytes"));
        let body = at + FRAME;
        if len < FIXED || body + len > data.len() {
            break;
        }
        let bytes = &data[body..body + len];
        if crc32fast::hash(bytes) != crc || u64_at(bytes, 0) != expected {
            break;
        }
        let Some(record) = decode(bytes) else { break };
        f(
            record,
            Pos {
                segment: first,
                offset: body as u64,
                len: len as u32,
            },
        )?;
        expected += 1;
        at = body + len;
    }
    Ok(SegmentEnd {
        next_seq: expected,
        offset: at as u64,
    })
}

/// Reads every live segment of `dir` in order; returns the next sequence
/// number after the last frame (1 for an empty log).
pub(crate) fn scan(dir: &Path, mut f: impl FnMut(Record, Pos) -> Result<()>) -> Result<u64> {
    let mut next = 1;
    for (first, path) in segments(dir)? {
        // The appending node drops a segment once nothing in it waits (or
        // renames it as its spare): one listed and gone before it is read
        // held nothing waiting.
        let end = match scan_segment(&path, first, &mut f) {
            Ok(end) => end,
            Err(_) if !path.exists() => continue,
            Err(e) => return Err(e),
        };
        next = next.max(end.next_seq).max(first);
    }
    Ok(next)
}

/// The right to append to a log directory: `LOCK` held (`flock`), taken
/// before the log is read back, so that a second process learns the log
/// is in use without reading every segment first.
#[derive(Debug)]
pub(crate) struct LogLock {
    dir: PathBuf,
    file: File,
}

impl LogLock {
    /// Fails with [`Error::Storage`] when another process holds it.
    pub(crate) fn take(dir: &Path) -> Result<Self> {
        crate::owner_only::ensure_dir(dir)?;
        let lock_path = dir.join("LOCK");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io(&lock_path, e))?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
            |_| {
                Error::Storage(format!(
                    "the accept log in {} is in use by another fastack process",
                    dir.display()
                ))
            },
        )?;
        Ok(LogLock {
            dir: dir.to_owned(),
            file,
        })
    }
}

/// The one appender of a log directory (it holds `LOCK`).
#[derive(Debug)]
pub(crate) struct Appender {
    dir: PathBuf,
    segment_bytes: u64,
    _lock: File,
    current: Option<Current>,
    next_seq: u64,
    /// Segments written since the last sync.
    dirty: Vec<File>,
    buf: Vec<u8>,
    /// Why appending stopped: an append failed after it wrote frames, whose
    /// numbers the next one would give again (a restart reads them back).
    torn: Option<String>,
}

#[derive(Debug)]
struct Current {
    first: u64,
    file: File,
    offset: u64,
}

/// A segment opened for reading by position.
#[derive(Debug)]
pub(crate) struct OpenSegment {
    pub first: u64,
    pub path: PathBuf,
    pub file: File,
}

impl Appender {
    /// Appends to the log directory whose lock is `lock`, the next record
    /// numbered `next_seq` (after the last one read, or higher).
    pub(crate) fn open(lock: LogLock, segment_bytes: u64, next_seq: u64) -> Self {
        let LogLock { dir, file: lock } = lock;
        Appender {
            dir,
            segment_bytes: segment_bytes.max(64 * 1024),
            _lock: lock,
            current: None,
            next_seq: next_seq.max(1),
            dirty: Vec::new(),
            buf: Vec::with_capacity(1 << 20),
            torn: None,
        }
    }

    #[cfg(test)]
    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Appends `records` (not yet durable: see [`Appender::sync`]); returns
    /// each one's sequence number and position, and the segments it
    /// started (to open for reading). A failed append wrote nothing (a
    /// full disk fails it when it starts a segment), or, failing part way,
    /// stops the appender: what it wrote counts once the node restarts.
    pub(crate) fn append(
        &mut self,
        records: &[NewRecord<'_>],
    ) -> Result<(Vec<(u64, Pos)>, Vec<OpenSegment>)> {
        // Refused before anything is written: a segment started by a failed
        // append would not reach the caller's index.
        let room = self.segment_bytes - HEADER;
        if let Some(r) = records
            .iter()
            .find(|r| r.key.len() > usize::from(u16::MAX) || frame_len(r) > room)
        {
            return Err(Error::Storage(format!(
                "an event of {} bytes does not fit a segment of the accept log ({} bytes)",
                frame_len(r),
                self.segment_bytes
            )));
        }
        if let Some(why) = &self.torn {
            return Err(Error::Storage(why.clone()));
        }
        let mut opened = Vec::new();
        // An append that fits a segment goes to one: started before any
        // frame is written, so a full disk fails it with nothing written.
        let total: u64 = records.iter().map(frame_len).sum();
        let left = self
            .current
            .as_ref()
            .map_or(0, |c| self.segment_bytes.saturating_sub(c.offset));
        if total > left && (self.current.is_none() || total <= room) {
            self.current = None;
            opened.push(self.start_segment()?);
        }
        let started = self.next_seq;
        match self.append_frames(records, &mut opened) {
            Ok(placed) => Ok((placed, opened)),
            Err(e) if self.next_seq != started || !opened.is_empty() => {
                let why =
                    format!("the accept log failed an append part way ({e}); restart the node");
                self.torn = Some(why.clone());
                Err(Error::Storage(why))
            }
            Err(e) => Err(e),
        }
    }

    /// Writes the frames, starting segments as they fill (only an append
    /// larger than a segment fills one part way).
    fn append_frames(
        &mut self,
        records: &[NewRecord<'_>],
        opened: &mut Vec<OpenSegment>,
    ) -> Result<Vec<(u64, Pos)>> {
        let mut placed = Vec::with_capacity(records.len());
        let mut i = 0;
        while i < records.len() {
            if self.current.is_none() {
                opened.push(self.start_segment()?);
            }
            let cur = self.current.as_mut().expect("a current segment");
            self.buf.clear();
            let base = cur.offset;
            let mut seq = self.next_seq;
            let mut batch = Vec::new();
            while i < records.len() {
                let before = self.buf.len();
                let (body, len) = encode(&mut self.buf, seq, &records[i])?;
                if base + self.buf.len() as u64 > self.segment_bytes {
                    // The frame goes to the next segment (this one is full,
                    // whether or not a frame of this append fit in it).
                    debug_assert!(base > HEADER || before > 0, "checked to fit a segment");
                    self.buf.truncate(before);
                    break;
                }
                batch.push((
                    seq,
                    Pos {
                        segment: cur.first,
                        offset: base + body as u64,
                        len,
                    },
                ));
                seq += 1;
                i += 1;
            }
            if !self.buf.is_empty() {
                let path = self.dir.join(segment_name(cur.first));
                cur.file
                    .write_all_at(&self.buf, base)
                    .map_err(|e| io(&path, e))?;
                cur.offset = base + self.buf.len() as u64;
                self.next_seq = seq;
                placed.extend(batch);
                if !self.dirty.iter().any(|f| same_file(f, &cur.file)) {
                    self.dirty
                        .push(cur.file.try_clone().map_err(|e| io(&path, e))?);
                }
            }
            if i < records.len() {
                // The current segment is full.
                self.current = None;
            }
        }
        Ok(placed)
    }

    /// Makes every append so far durable.
    pub(crate) fn sync(&mut self) -> Result<()> {
        for file in &self.dirty {
            file.sync_data().map_err(|e| io(&self.dir, e))?;
        }
        self.dirty.clear();
        Ok(())
    }

    /// The segment being appended to, if any.
    pub(crate) fn current(&self) -> Option<u64> {
        self.current.as_ref().map(|c| c.first)
    }

    /// Starts a segment numbered from the next record: a spare renamed
    /// into place, or a new file. Its name and header are durable before
    /// any frame in it is.
    fn start_segment(&mut self) -> Result<OpenSegment> {
        let first = self.next_seq;
        let path = self.dir.join(segment_name(first));
        let spare = self.spare()?;
        let file = match spare {
            Some(spare) => {
                std::fs::rename(&spare, &path).map_err(|e| io(&path, e))?;
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .map_err(|e| io(&path, e))?
            }
            None => {
                let file = crate::owner_only::create_file_rw(&path)?;
                // Its blocks allocated now: a full disk fails this, before
                // any frame, rather than a sync later.
                let allocated = rustix::fs::fallocate(
                    &file,
                    rustix::fs::FallocateFlags::empty(),
                    0,
                    self.segment_bytes,
                );
                match allocated {
                    Ok(()) => {}
                    Err(rustix::io::Errno::OPNOTSUPP) => {
                        file.set_len(self.segment_bytes).map_err(|e| io(&path, e))?
                    }
                    Err(e) => {
                        let _ = std::fs::remove_file(&path);
                        return Err(io(&path, e.into()));
                    }
                }
                file
            }
        };
        let mut header = [0u8; HEADER as usize];
        header[..8].copy_from_slice(MAGIC);
        header[8..].copy_from_slice(&first.to_le_bytes());
        file.write_all_at(&header, 0).map_err(|e| io(&path, e))?;
        // A reused segment's first frame slot is cleared: the frames it held
        // are older than `first` and would stop a read anyway, but a clear
        // slot stops it before it decodes them.
        file.write_all_at(&[0u8; FRAME], HEADER)
            .map_err(|e| io(&path, e))?;
        file.sync_data().map_err(|e| io(&path, e))?;
        sync_dir(&self.dir)?;
        let reader = File::open(&path).map_err(|e| io(&path, e))?;
        self.current = Some(Current {
            first,
            file,
            offset: HEADER,
        });
        Ok(OpenSegment {
            first,
            path,
            file: reader,
        })
    }

    fn spare(&self) -> Result<Option<PathBuf>> {
        for n in 0..SPARES {
            let p = self.dir.join(format!("spare-{n}.seg"));
            if p.exists() {
                return Ok(Some(p));
            }
        }
        Ok(None)
    }

    /// A segment whose every record was processed: kept as the spare, or
    /// deleted. Never the current one.
    pub(crate) fn release(&mut self, first: u64) -> Result<()> {
        if self.current() == Some(first) {
            return Ok(());
        }
        let path = self.dir.join(segment_name(first));
        for n in 0..SPARES {
            let p = self.dir.join(format!("spare-{n}.seg"));
            if !p.exists() {
                return std::fs::rename(&path, &p).map_err(|e| io(&path, e));
            }
        }
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(&path, e)),
        }
    }
}

fn same_file(a: &File, b: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (a.metadata(), b.metadata()) {
        (Ok(x), Ok(y)) => x.ino() == y.ino() && x.dev() == y.dev(),
        _ => false,
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io(dir, e))
}

/// The segment files of `dir` opened for reading.
pub(crate) fn open_segments(dir: &Path) -> Result<Vec<OpenSegment>> {
    segments(dir)?
        .into_iter()
        .map(|(first, path)| {
            let file = File::open(&path).map_err(|e| io(&path, e))?;
            Ok(OpenSegment { first, path, file })
        })
        .collect()
}

/// A file's bytes written whole (for tests of torn tails).
#[cfg(test)]
fn write_whole(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let mut f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all(bytes).unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(n: u32) -> (TenantId, EventId, String, String) {
        (
            TenantId(Uuid::from_u128(u128::from(n % 3))),
            EventId(Uuid::from_u128(u128::from(n) + 1000)),
            format!("key-{n}"),
            format!(
                "{{\"n\":{n},\"pad\":\"{}\"}}",
                "x".repeat((n % 50) as usize)
            ),
        )
    }

    fn append_n(a: &mut Appender, from: u32, n: u32) -> Vec<(u64, Pos)> {
        let fp = [7u8; 32];
        let owned: Vec<_> = (from..from + n).map(rec).collect();
        let records: Vec<NewRecord<'_>> = owned
            .iter()
            .map(|(t, e, k, p)| NewRecord {
                tenant: *t,
                event_id: *e,
                received_at: DateTime::from_timestamp_micros(1_700_000_000_000_000).unwrap(),
                fingerprint: &fp,
                legacy_seq: 0,
                key: k,
                payload: p,
            })
            .collect();
        let (placed, _) = a.append(&records).unwrap();
        a.sync().unwrap();
        placed
    }

    fn all(dir: &Path) -> (Vec<Record>, u64) {
        let mut out = Vec::new();
        let next = scan(dir, |r, _| {
            out.push(r);
            Ok(())
        })
        .unwrap();
        (out, next)
    }

    #[test]
    fn records_read_back_in_order_across_segments_and_by_position() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Appender::open(LogLock::take(dir.path()).unwrap(), 64 * 1024, 1);
        let placed = append_n(&mut a, 0, 2000);
        assert!(segments(dir.path()).unwrap().len() > 2, "several segments");
        let (read, next) = all(dir.path());
        assert_eq!(read.len(), 2000);
        assert_eq!(next, 2001);
        assert!(read.iter().enumerate().all(|(i, r)| r.seq == i as u64 + 1));
        assert_eq!(read[5].key, "key-5");
        let open = open_segments(dir.path()).unwrap();
        for (seq, pos) in placed.iter().step_by(97) {
            let seg = open.iter().find(|s| s.first == pos.segment).unwrap();
            let r = read_at(&seg.file, &seg.path, *pos).unwrap();
            assert_eq!(r.seq, *seq);
            assert_eq!(r, read[(*seq - 1) as usize]);
        }
        // Another appender is refused while this one lives, before it
        // reads anything.
        assert!(matches!(
            LogLock::take(dir.path()),
            Err(crate::error::Error::Storage(_))
        ));
    }

    #[test]
    fn an_append_whose_first_frame_does_not_fit_starts_the_next_segment() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Appender::open(LogLock::take(dir.path()).unwrap(), 64 * 1024, 1);
        // One record an append, as a `track` at a time: each segment's last
        // frame leaves less room than the next one needs.
        let mut placed = Vec::new();
        for n in 0..2000 {
            placed.extend(append_n(&mut a, n, 1));
        }
        assert!(segments(dir.path()).unwrap().len() > 2, "several segments");
        let (read, next) = all(dir.path());
        assert_eq!(read.len(), 2000);
        assert_eq!(next, 2001);
        assert_eq!(placed.len(), 2000);
        // Larger than a whole segment: refused, and the log goes on.
        let fp = [7u8; 32];
        let big = "x".repeat(70 * 1024);
        let too_large = NewRecord {
            tenant: TenantId(Uuid::nil()),
            event_id: EventId(Uuid::from_u128(9)),
            received_at: DateTime::from_timestamp_micros(1_700_000_000_000_000).unwrap(),
            fingerprint: &fp,
            legacy_seq: 0,
            key: "big",
            payload: &big,
        };
        assert!(a.append(&[too_large]).is_err());
        append_n(&mut a, 2000, 1);
        assert_eq!(all(dir.path()).0.len(), 2001);
    }

    #[test]
    fn a_torn_tail_ends_the_segment_and_the_next_writer_starts_a_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Appender::open(LogLock::take(dir.path()).unwrap(), 1 << 20, 1);
        let placed = append_n(&mut a, 0, 10);
        drop(a);
        // The last frame half written: its body cut after 5 bytes.
        let (seg, path) = segments(dir.path()).unwrap().into_iter().next().unwrap();
        let last = placed.last().unwrap().1;
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0xAB; 64], last.offset + 5).unwrap();
        let (read, next) = all(dir.path());
        assert_eq!(read.len(), 9);
        assert_eq!(next, 10);
        let mut a = Appender::open(LogLock::take(dir.path()).unwrap(), 1 << 20, next);
        append_n(&mut a, 100, 3);
        let (read, next) = all(dir.path());
        assert_eq!(read.len(), 12);
        assert_eq!(next, 13);
        assert_eq!(read[9].key, "key-100");
        assert_eq!(segments(dir.path()).unwrap().len(), 2);
        assert!(segments(dir.path()).unwrap().contains_key(&seg));
    }

    #[test]
    fn a_reused_segment_shows_none_of_its_old_frames() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Appender::open(LogLock::take(dir.path()).unwrap(), 64 * 1024, 1);
        append_n(&mut a, 0, 2000);
        let segs: Vec<u64> = segments(dir.path()).unwrap().into_keys().collect();
        assert!(segs.len() >= 3);
        // Every segment but the current one is consumed: one becomes the
        // spare, the rest are deleted.
        for first in &segs {
            a.release(*first).unwrap();
        }
        assert_eq!(segments(dir.path()).unwrap().len(), 1);
        assert!(dir.path().join("spare-0.seg").exists());
        // A new writer reuses a spare; the old frames in it never show.
        let next = a.next_seq();
        drop(a);
        let mut a = Appender::open(LogLock::take(dir.path()).unwrap(), 64 * 1024, next);
        append_n(&mut a, 1000, 2);
        let (read, _) = all(dir.path());
        let seqs: Vec<u64> = read.iter().map(|r| r.seq).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
        assert_eq!(
            read.iter().filter(|r| r.key.starts_with("key-10")).count(),
            2
        );
        assert_eq!(read.last().unwrap().seq, next + 1);
    }

    #[test]
    fn a_file_that_is_not_a_segment_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(segment_name(1));
        std::fs::write(&path, b"nonsense, not a log").unwrap();
        write_whole(&path, b"NOTALOG!");
        assert!(scan(dir.path(), |_, _| Ok(())).is_err());
    }
}
