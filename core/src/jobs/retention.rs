//! Retention: whole partitions go away, never rows one by one, and never
//! without a verified archive.
//!
//! A partition (one month × one retention class) is due when its whole
//! month is older than its class: `month end <= now - class months`. Its
//! rows are written to object storage as gzip NDJSON (every column, one row
//! per line, primary-key order) with a manifest (row count, SHA-256 and size
//! of the uncompressed and of the compressed bytes). Both objects are then
//! read back from storage, the archive decompressed, its lines counted and
//! both checksums recomputed; only if everything matches is the partition
//! dropped — and only if, under an exclusive lock, it still holds exactly
//! the archived row count (the table is append-only, so same count, same
//! rows). Any mismatch or storage error leaves the partition in place; the
//! next run tries again. A crash at any point leaves every row in the table,
//! in a verified archive, or both.

use std::io::Write;

use chrono::{DateTime, Months, Utc};
use fastack_entities::{Job, JobId, JobKind, TenantId};
use flate2::{Compression, write::GzEncoder};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::{
    config::Config,
    error::{Error, Result},
    objects::Objects,
    store::{ArchiveCursor, DropOutcome, Month, PartitionKey, Storage},
};

/// Rows read per page while archiving.
const PAGE: u32 = 5_000;

/// The tenant of system jobs (retention runs span tenants).
pub const SYSTEM_TENANT: TenantId = TenantId(Uuid::nil());

/// The first instant a class keeps data from.
pub fn cutoff(now: DateTime<Utc>, retention_months: u32) -> DateTime<Utc> {
    now.checked_sub_months(Months::new(retention_months))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// Whether a partition's whole month is past its class's retention.
pub fn is_due(key: &PartitionKey, now: DateTime<Utc>) -> bool {
    key.month.end() <= cutoff(now, key.retention_class.max(1) as u32)
}

/// Retention classes in use: every plan's, and every tenant's own.
pub async fn classes(store: &Storage, config: &Config) -> Result<Vec<(i16, Vec<TenantId>)>> {
    let mut by_class: std::collections::BTreeMap<i16, Vec<TenantId>> = fastack_entities::Plan::ALL
        .iter()
        .map(|p| (config.plans.get(*p).retention_months as i16, Vec::new()))
        .collect();
    for t in store.tenants().list().await? {
        by_class
            .entry(config.plans.retention_for(&t) as i16)
            .or_default()
            .push(t.id);
    }
    Ok(by_class.into_iter().collect())
}

/// Creates the partitions of last month through two months ahead for every
/// class in use (idempotent; backfilled months are created on demand).
pub async fn ensure_window(store: &Storage, config: &Config, now: DateTime<Utc>) -> Result<usize> {
    let this = Month::of(now);
    let months = [this.prev(), this, this.next(), this.next().next()];
    let keys: Vec<PartitionKey> = classes(store, config)
        .await?
        .into_iter()
        .flat_map(|(class, _)| {
            months.iter().map(move |m| PartitionKey {
                month: *m,
                retention_class: class,
            })
        })
        .collect();
    store.partitions().ensure(&keys).await?;
    Ok(keys.len())
}

/// How long the processing fence remembers an event: far longer than an
/// inbox row can wait for redelivery.
pub const FENCE_DAYS: i64 = 7;

/// One maintenance round: partitions ahead, retention jobs for due
/// partitions (at most one active per partition, across nodes), and the
/// idempotency keys and fence rows that retention made useless.
#[derive(Debug, Default, Serialize)]
pub struct Maintenance {
    pub scheduled: Vec<JobId>,
    pub due: Vec<String>,
    pub pruned_keys: u64,
    pub pruned_fence: u64,
}

pub async fn maintain(store: &Storage, config: &Config, now: DateTime<Utc>) -> Result<Maintenance> {
    ensure_window(store, config, now).await?;
    let mut out = Maintenance::default();
    let active = store.jobs().active_retention().await?;
    for p in store.partitions().list(false).await? {
        if !is_due(&p.key, now) {
            continue;
        }
        out.due.push(p.table.clone());
        if active.contains(&p.table) {
            continue;
        }
        let job = new_job(&p.key, now);
        match store.jobs().insert(&job).await {
            Ok(()) => out.scheduled.push(job.id),
            // Another node scheduled it first.
            Err(Error::Conflict(_)) => {}
            Err(e) => return Err(e),
        }
    }
    for (class, tenants) in classes(store, config).await? {
        if !tenants.is_empty() {
            out.pruned_keys += store
                .partitions()
                .prune_idempotency(&tenants, cutoff(now, class.max(1) as u32))
                .await?;
        }
    }
    out.pruned_fence = store
        .partitions()
        .prune_processed(now - chrono::Duration::days(FENCE_DAYS))
        .await?;
    Ok(out)
}

/// What an archive holds (also written next to it as `.manifest.json`).
/// An archive an erasure wrote again without a person's rows has a new
/// manifest naming the erasures (`erasures`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub partition: String,
    pub month: String,
    pub retention_class: i16,
    pub rows: u64,
    pub uncompressed_bytes: u64,
    pub uncompressed_sha256: String,
    pub compressed_bytes: u64,
    pub compressed_sha256: String,
    pub format: String,
    pub created_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub erasures: Vec<JobId>,
}

/// The outcome of one partition's run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    pub partition: String,
    pub path: String,
    pub manifest_path: String,
    pub manifest: Manifest,
    pub dropped: bool,
}

impl Report {
    /// The `result` of the retention job.
    pub fn result_json(&self) -> Value {
        json!({
            "path": self.path,
            "manifest": self.manifest_path,
            "partition": self.partition,
            "row_count": self.manifest.rows,
            "size_bytes": self.manifest.uncompressed_bytes,
            "compressed_bytes": self.manifest.compressed_bytes,
            "format": "ndjson.gz",
            "sha256": self.manifest.uncompressed_sha256,
            "sha256_compressed": self.manifest.compressed_sha256,
            "dropped": self.dropped,
        })
    }
}

/// A queued retention job for a partition.
pub fn new_job(key: &PartitionKey, now: DateTime<Utc>) -> Job {
    Job::queued(
        SYSTEM_TENANT,
        JobKind::Retention,
        json!({
            "partition": key.table_name(),
            "month": format!("{:04}-{:02}", key.month.year, key.month.month),
            "retention_class": key.retention_class,
        }),
        serde_json::Map::new(),
        now,
    )
}

pub fn job_partition(job: &Job) -> Result<PartitionKey> {
    job.params["partition"]
        .as_str()
        .and_then(PartitionKey::parse_table)
        .ok_or_else(|| Error::Corrupt(format!("retention job {} has no partition", job.id)))
}

fn sha_hex(h: Sha256) -> String {
    hex::encode(h.finalize())
}

/// Progress: rows archived so far, of the total.
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Sync);

/// Archives a partition, verifies the archive from storage, then drops the
/// partition (unless `drop` is false).
pub async fn archive_and_drop(
    store: &Storage,
    objects: &Objects,
    key: PartitionKey,
    run: JobId,
    drop: bool,
    progress: Progress<'_>,
) -> Result<Report> {
    let table = key.table_name();
    // Only for progress: this partition's count, not every partition's.
    let total = store
        .partitions()
        .rows(key)
        .await?
        .map_or(0, |n| n.max(0) as u64);
    let base = format!("archives/tracked_events/{table}/{run}");
    let path = format!("{base}.ndjson.gz");
    let manifest_path = format!("{base}.manifest.json");

    // 1. Write: rows → NDJSON → gzip → storage, hashing both sides.
    let mut writer = objects.writer(&path);
    let mut gz = GzEncoder::new(Vec::with_capacity(1 << 20), Compression::default());
    let mut plain_hash = Sha256::new();
    let mut gz_hash = Sha256::new();
    let (mut rows, mut plain_bytes, mut gz_bytes) = (0u64, 0u64, 0u64);
    let mut after: Option<ArchiveCursor> = None;
    let written: Result<()> = async {
        loop {
            let page = store.partitions().read(key, after, PAGE).await?;
            let mut chunk = Vec::with_capacity(page.len() * 320);
            for (_, row) in &page {
                serde_json::to_writer(&mut chunk, row).expect("archive rows serialise");
                chunk.push(b'\n');
            }
            plain_hash.update(&chunk);
            plain_bytes += chunk.len() as u64;
            rows += page.len() as u64;
            gz.write_all(&chunk).map_err(|e| Error::io("gzip", e))?;
            let out = std::mem::take(gz.get_mut());
            gz_hash.update(&out);
            gz_bytes += out.len() as u64;
            writer.write(&out).await?;
            progress(rows, total);
            match page.last() {
                Some((cursor, _)) if page.len() == PAGE as usize => after = Some(*cursor),
                _ => break,
            }
        }
        let tail = gz.finish().map_err(|e| Error::io("gzip", e))?;
        gz_hash.update(&tail);
        gz_bytes += tail.len() as u64;
        writer.write(&tail).await?;
        Ok(())
    }
    .await;
    if let Err(e) = written {
        writer.abort().await;
        return Err(e);
    }
    writer.finish().await?;
    let manifest = Manifest {
        partition: table.clone(),
        month: format!("{:04}-{:02}", key.month.year, key.month.month),
        retention_class: key.retention_class,
        rows,
        uncompressed_bytes: plain_bytes,
        uncompressed_sha256: sha_hex(plain_hash),
        compressed_bytes: gz_bytes,
        compressed_sha256: sha_hex(gz_hash),
        format: "ndjson.gz".to_owned(),
        created_at: Utc::now(),
        erasures: Vec::new(),
    };
    objects
        .put(
            &manifest_path,
            serde_json::to_vec_pretty(&manifest).expect("manifest serialises"),
        )
        .await?;

    // 2. Verify what storage gives back, not what we meant to write.
    verify(objects, &path, &manifest_path, &manifest).await?;

    // 3. Drop, if the partition still is what was archived.
    let dropped = if drop {
        match store.partitions().drop(key, rows as i64).await? {
            DropOutcome::Dropped => true,
            DropOutcome::RowsChanged { rows: now } => {
                return Err(Error::Conflict(format!(
                    "{table} changed while it was archived ({rows} archived, {now} now); kept, archived again next run"
                )));
            }
        }
    } else {
        false
    };
    Ok(Report {
        partition: table,
        path,
        manifest_path,
        manifest,
        dropped,
    })
}

/// Where archives are kept in object storage.
const ARCHIVES: &str = "archives/tracked_events";

/// Every archive in object storage with its manifest: `(archive,
/// manifest)` paths, sorted.
pub async fn archives(objects: &Objects) -> Result<Vec<(String, String)>> {
    let paths = objects.list(ARCHIVES).await?;
    let all: std::collections::HashSet<&str> = paths.iter().map(String::as_str).collect();
    Ok(paths
        .iter()
        .filter_map(|p| {
            let manifest = format!("{}.manifest.json", p.strip_suffix(".ndjson.gz")?);
            all.contains(manifest.as_str())
                .then(|| (p.clone(), manifest))
        })
        .collect())
}

/// A manifest as stored.
pub async fn read_manifest(objects: &Objects, path: &str) -> Result<Manifest> {
    serde_json::from_slice(&objects.get(path).await?)
        .map_err(|e| Error::Corrupt(format!("manifest {path}: {e}")))
}

/// An archive decompressed chunk by chunk into whole lines.
struct Lines {
    gz: flate2::write::GzDecoder<Vec<u8>>,
    rest: Vec<u8>,
    path: String,
}

impl Lines {
    fn new(path: &str) -> Self {
        Lines {
            gz: flate2::write::GzDecoder::new(Vec::new()),
            rest: Vec::new(),
            path: path.to_owned(),
        }
    }

    fn not_gzip(&self, e: std::io::Error) -> Error {
        Error::Corrupt(format!("archive {} is not valid gzip: {e}", self.path))
    }

    /// The whole lines completed by `chunk` (each with its `\n`).
    fn push(&mut self, chunk: &[u8]) -> Result<Vec<u8>> {
        if let Err(e) = self.gz.write_all(chunk) {
            return Err(self.not_gzip(e));
        }
        self.rest.append(self.gz.get_mut());
        let whole = self
            .rest
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |i| i + 1);
        let tail = self.rest.split_off(whole);
        Ok(std::mem::replace(&mut self.rest, tail))
    }

    /// What is left at the end (a last line without `\n`).
    fn finish(mut self) -> Result<Vec<u8>> {
        let last = match self.gz.try_finish() {
            Ok(()) => std::mem::take(self.gz.get_mut()),
            Err(e) => return Err(self.not_gzip(e)),
        };
        self.rest.extend(last);
        Ok(self.rest)
    }
}

/// The rows (lines) of an archive `pick` wants.
pub async fn count_in_archive(
    objects: &Objects,
    path: &str,
    pick: &(dyn Fn(&[u8]) -> bool + Sync),
) -> Result<u64> {
    let mut stream = std::pin::pin!(objects.get_stream(path).await?);
    let mut lines = Lines::new(path);
    let mut n = 0;
    let mut count = |block: &[u8]| {
        n += block
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty() && pick(l))
            .count() as u64;
    };
    while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
        count(&lines.push(&chunk?)?);
    }
    count(&lines.finish()?);
    Ok(n)
}

/// Writes archive `path` again without the rows `pick` wants, as `to`
/// with its manifest `to_manifest` (recording erasure `by`), and verifies
/// both from storage. `None` (nothing written) when it holds none of them.
/// Streams: memory stays bounded whatever the archive's size.
pub async fn rewrite_archive(
    objects: &Objects,
    path: &str,
    to: &str,
    to_manifest: &str,
    by: JobId,
    pick: &(dyn Fn(&[u8]) -> bool + Sync),
) -> Result<Option<(u64, Manifest)>> {
    let old_manifest_path = format!(
        "{}.manifest.json",
        path.strip_suffix(".ndjson.gz").unwrap_or(path)
    );
    let old = read_manifest(objects, &old_manifest_path).await?;
    let mut stream = std::pin::pin!(objects.get_stream(path).await?);
    let mut lines = Lines::new(path);
    let mut writer = objects.writer(to);
    // The fastest level: an erasure rewrites a whole month to remove a few
    // rows, and the archive only waits in storage (on a month of a million
    // rows a sixth larger than at the default level, in less than half the
    // time: benches/HISTORY.md).
    let mut gz = GzEncoder::new(Vec::with_capacity(1 << 20), Compression::fast());
    let (mut plain_hash, mut gz_hash) = (Sha256::new(), Sha256::new());
    let (mut rows, mut removed, mut plain_bytes, mut gz_bytes) = (0u64, 0u64, 0u64, 0u64);
    let written: Result<()> = async {
        let mut end = false;
        while !end {
            let block = match futures::StreamExt::next(&mut stream).await {
                Some(chunk) => lines.push(&chunk?)?,
                None => {
                    end = true;
                    std::mem::replace(&mut lines, Lines::new(path)).finish()?
                }
            };
            let mut kept = Vec::with_capacity(block.len());
            for line in block.split_inclusive(|b| *b == b'\n') {
                let text = line.strip_suffix(b"\n").unwrap_or(line);
                if text.is_empty() {
                    continue;
                }
                if pick(text) {
                    removed += 1;
                } else {
                    kept.extend_from_slice(text);
                    kept.push(b'\n');
                    rows += 1;
                }
            }
            plain_hash.update(&kept);
            plain_bytes += kept.len() as u64;
            gz.write_all(&kept).map_err(|e| Error::io("gzip", e))?;
            let out = std::mem::take(gz.get_mut());
            gz_hash.update(&out);
            gz_bytes += out.len() as u64;
            writer.write(&out).await?;
        }
        let tail = std::mem::replace(&mut gz, GzEncoder::new(Vec::new(), Compression::fast()))
            .finish()
            .map_err(|e| Error::io("gzip", e))?;
        gz_hash.update(&tail);
        gz_bytes += tail.len() as u64;
        writer.write(&tail).await?;
        Ok(())
    }
    .await;
    if let Err(e) = written {
        writer.abort().await;
        return Err(e);
    }
    if removed == 0 {
        writer.abort().await;
        return Ok(None);
    }
    writer.finish().await?;
    let mut erasures = old.erasures.clone();
    erasures.push(by);
    let manifest = Manifest {
        rows,
        uncompressed_bytes: plain_bytes,
        uncompressed_sha256: sha_hex(plain_hash),
        compressed_bytes: gz_bytes,
        compressed_sha256: sha_hex(gz_hash),
        erasures,
        ..old
    };
    objects
        .put(
            to_manifest,
            serde_json::to_vec_pretty(&manifest).expect("manifest serialises"),
        )
        .await?;
    verify(objects, to, to_manifest, &manifest).await?;
    Ok(Some((removed, manifest)))
}

/// Whether an archive copied into place is the one its manifest (copied
/// with it) describes: the manifest reads back and the archive has its
/// compressed size. The staged pair was verified whole before the copy.
pub async fn check_copied(objects: &Objects, path: &str, manifest_path: &str) -> Result<()> {
    let manifest = read_manifest(objects, manifest_path).await?;
    let size = objects.size(path).await?;
    if size != manifest.compressed_bytes {
        return Err(Error::Corrupt(format!(
            "archive {path} is {size} bytes after the copy; its manifest says {}",
            manifest.compressed_bytes
        )));
    }
    Ok(())
}

/// Hashes, counts bytes and counts lines of what is written to it.
#[derive(Default)]
struct Counter {
    hash: Sha256,
    bytes: u64,
    lines: u64,
}

impl Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.hash.update(buf);
        self.bytes += buf.len() as u64;
        self.lines += buf.iter().filter(|b| **b == b'\n').count() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Reads archive and manifest back from storage and checks them.
pub async fn verify(
    objects: &Objects,
    path: &str,
    manifest_path: &str,
    expected: &Manifest,
) -> Result<()> {
    let stored: Manifest = serde_json::from_slice(&objects.get(manifest_path).await?)
        .map_err(|e| Error::Corrupt(format!("manifest {manifest_path}: {e}")))?;
    if &stored != expected {
        return Err(Error::Corrupt(format!(
            "manifest {manifest_path} differs from what was written"
        )));
    }
    // Streamed: the compressed bytes are hashed and decompressed chunk by
    // chunk, so verifying a large archive needs no memory of its size.
    let mismatch = |what: &str| {
        Error::Corrupt(format!(
            "archive {path}: {what} does not match the manifest"
        ))
    };
    let mut stream = std::pin::pin!(objects.get_stream(path).await?);
    let mut gz_hash = Sha256::new();
    let mut gz_len = 0u64;
    let mut decoder = flate2::write::GzDecoder::new(Counter::default());
    let not_gzip =
        |e: std::io::Error| Error::Corrupt(format!("archive {path} is not valid gzip: {e}"));
    let mut gz_error = None;
    while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
        let chunk = chunk?;
        gz_hash.update(&chunk);
        gz_len += chunk.len() as u64;
        if gz_error.is_none()
            && let Err(e) = decoder.write_all(&chunk)
        {
            gz_error = Some(e);
        }
    }
    // The plainest mismatch first: the bytes are not the ones written.
    if gz_len != stored.compressed_bytes {
        return Err(mismatch("compressed size"));
    }
    if hex::encode(gz_hash.finalize()) != stored.compressed_sha256 {
        return Err(mismatch("compressed SHA-256"));
    }
    if let Some(e) = gz_error {
        return Err(not_gzip(e));
    }
    let counted = decoder.finish().map_err(not_gzip)?;
    let (hash, bytes, lines) = (counted.hash, counted.bytes, counted.lines);
    if bytes != stored.uncompressed_bytes {
        return Err(mismatch("uncompressed size"));
    }
    if hex::encode(hash.finalize()) != stored.uncompressed_sha256 {
        return Err(mismatch("uncompressed SHA-256"));
    }
    if lines != stored.rows {
        return Err(mismatch("row count"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Month;

    #[test]
    fn due_when_the_whole_month_is_past_retention() {
        let key = |y, m, c| PartitionKey {
            month: Month { year: y, month: m },
            retention_class: c,
        };
        let now: DateTime<Utc> = "2026-11-30T12:00:00Z".parse().unwrap();
        // 13 months before now is 2025-10-30: September 2025 is wholly older.
        assert!(is_due(&key(2025, 9, 13), now));
        assert!(!is_due(&key(2025, 10, 13), now));
        assert!(!is_due(&key(2025, 9, 25), now));
        assert!(is_due(&key(2023, 9, 37), now));
        let first: DateTime<Utc> = "2026-12-01T00:00:00Z".parse().unwrap();
        assert!(is_due(&key(2025, 10, 13), first));
    }
}
