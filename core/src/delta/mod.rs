//! A Delta Lake table on object storage: its transaction log read into a
//! [`Snapshot`] and new versions committed atomically.
//!
//! The table is what readers open (the Python `deltalake` package, Polars,
//! DuckDB's `delta_scan`, Spark): `<root>/_delta_log/<version>.json`, one
//! file per version, each a line per action. A version is committed by
//! creating its file only if it does not exist yet ([`Objects::put_new`]:
//! a conditional put on S3, a hard link on a local disk), so of two writers
//! racing for a version exactly one wins; the other reads what won and
//! tries the next version. No lock service is involved.
//!
//! Protocol: reader 1, writer 2 (no deletion vectors, no column mapping),
//! every common reader's floor. A commit may carry an application
//! transaction (`txn`): a name that is committed once, so a writer that
//! does not know whether its commit landed (it died, its lease was lost)
//! commits again and adds nothing. Statistics are written only for the
//! columns the caller names; the log carries no identifier of a person.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};

use crate::{
    error::{Error, Result},
    objects::Objects,
};

mod checkpoint;

/// The log's directory under a table's root.
pub const LOG_DIR: &str = "_delta_log";
/// The partition column: the UTC date an event occurred.
pub const PARTITION: &str = "date";
/// The highest writer protocol this writer keeps (2: no deletion vectors,
/// no column mapping, no feature lists).
const WRITER_VERSION: u64 = 2;

/// A data file of the table.
#[derive(Clone, Debug, PartialEq)]
pub struct DataFile {
    /// Relative to the table's root (`date=…/hour=…/….parquet`).
    pub path: String,
    /// The partition's value, `YYYY-MM-DD`.
    pub date: String,
    pub size: u64,
    /// Written with an add; not read back.
    pub stats: Option<Stats>,
}

/// A file's statistics: its row count and the range of time columns (the
/// only columns given statistics: they identify no one).
#[derive(Clone, Debug, PartialEq)]
pub struct Stats {
    pub rows: u64,
    /// (column, least, greatest).
    pub times: Vec<(&'static str, DateTime<Utc>, DateTime<Utc>)>,
}

/// What the log says at one version.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// `None`: no table yet (version 0 creates it).
    pub version: Option<u64>,
    /// The live files, by path.
    pub files: BTreeMap<String, DataFile>,
    /// Files removed by a version and not added again, with when (ms
    /// since the epoch): their objects are kept for time travel until the
    /// removed files' retention, unless whoever removed them deleted them.
    pub removed: HashMap<String, i64>,
    /// Application transactions committed, with when (ms since the epoch).
    pub transactions: HashMap<String, i64>,
    /// The live files' statistics as the log gives them (for checkpoints).
    stats: HashMap<String, String>,
    /// The table's metadata and protocol actions (for checkpoints).
    metadata: Option<Value>,
    protocol: Option<Value>,
    /// The writer protocol the table asks for.
    writer_version: u64,
}

impl Snapshot {
    /// The version the next commit creates.
    pub fn next_version(&self) -> u64 {
        self.version.map_or(0, |v| v + 1)
    }

    /// Applies one version's file of actions.
    fn apply(&mut self, version: u64, body: &[u8], at: &str) -> Result<()> {
        let corrupt = |why: String| Error::Corrupt(format!("{at}: {why}"));
        if version != self.next_version() {
            return Err(corrupt(format!(
                "version {version} follows {:?}",
                self.version
            )));
        }
        for line in body.split(|b| *b == b'\n') {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let action: Value =
                serde_json::from_slice(line).map_err(|e| corrupt(format!("an action: {e}")))?;
            self.apply_action(&action).map_err(&corrupt)?;
        }
        self.version = Some(version);
        Ok(())
    }

    /// One action, from a version's file or a checkpoint.
    fn apply_action(&mut self, action: &Value) -> std::result::Result<(), String> {
        if let Some(add) = action.get("add") {
            let path = decode(text(add, "path")?);
            let date = add
                .get("partitionValues")
                .and_then(|p| p.get(PARTITION))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let size = add.get("size").and_then(Value::as_u64).unwrap_or_default();
            self.removed.remove(&path);
            match add.get("stats").and_then(Value::as_str) {
                Some(stats) => self.stats.insert(path.clone(), stats.to_owned()),
                None => self.stats.remove(&path),
            };
            self.files.insert(
                path.clone(),
                DataFile {
                    path,
                    date,
                    size,
                    stats: None,
                },
            );
        } else if let Some(remove) = action.get("remove") {
            let path = decode(text(remove, "path")?);
            let at = remove
                .get("deletionTimestamp")
                .and_then(Value::as_i64)
                .unwrap_or_default();
            self.files.remove(&path);
            self.stats.remove(&path);
            self.removed.insert(path, at);
        } else if let Some(txn) = action.get("txn") {
            let at = txn
                .get("lastUpdated")
                .and_then(Value::as_i64)
                .unwrap_or_default();
            self.transactions.insert(text(txn, "appId")?.to_owned(), at);
        } else if let Some(protocol) = action.get("protocol") {
            self.writer_version = protocol
                .get("minWriterVersion")
                .and_then(Value::as_u64)
                .unwrap_or(WRITER_VERSION);
            self.protocol = Some(protocol.clone());
        } else if let Some(metadata) = action.get("metaData") {
            self.metadata = Some(metadata.clone());
        }
        Ok(())
    }

    /// The actions that make this version, for a checkpoint: removed files
    /// removed after `removed_since` (older ones are no longer kept) and
    /// transactions since `transactions_since` (ms since the epoch).
    fn actions(&self, removed_since: i64, transactions_since: i64) -> Vec<Value> {
        let mut out = Vec::with_capacity(self.files.len() + 2);
        out.extend(self.protocol.iter().map(|p| json!({ "protocol": p })));
        out.extend(self.metadata.iter().map(|m| json!({ "metaData": m })));
        for (app, at) in &self.transactions {
            if *at >= transactions_since {
                out.push(json!({ "txn": { "appId": app, "version": 0, "lastUpdated": at } }));
            }
        }
        for file in self.files.values() {
            let mut add = json!({
                "path": encode(&file.path),
                "partitionValues": { PARTITION: file.date },
                "size": file.size,
                "modificationTime": 0,
                "dataChange": false,
            });
            if let Some(stats) = self.stats.get(&file.path) {
                add["stats"] = Value::String(stats.clone());
            }
            out.push(json!({ "add": add }));
        }
        for (path, at) in &self.removed {
            if *at >= removed_since {
                out.push(json!({ "remove": {
                    "path": encode(path),
                    "deletionTimestamp": at,
                    "dataChange": false,
                    "extendedFileMetadata": false,
                }}));
            }
        }
        out
    }
}

fn text<'v>(action: &'v Value, field: &str) -> std::result::Result<&'v str, String> {
    action
        .get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("an action without `{field}`"))
}

/// One commit's actions.
#[derive(Clone, Debug, Default)]
pub struct Commit {
    /// `commitInfo.operation`: `WRITE`, `DELETE`, …
    pub operation: &'static str,
    pub add: Vec<DataFile>,
    /// Paths of live files to remove.
    pub remove: Vec<String>,
    /// An application transaction committed with it, once.
    pub transaction: Option<String>,
    /// Files added only if this commit creates the table (what was there
    /// before it had a log); dropped when another writer created it first.
    pub imports: Vec<DataFile>,
    /// The same rows in other files (a compaction): readers of changes
    /// skip it (`dataChange: false`).
    pub rearranged: bool,
}

impl Commit {
    fn is_empty(&self) -> bool {
        self.add.is_empty() && self.remove.is_empty() && self.transaction.is_none()
    }
}

/// How a commit ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It created this version.
    Committed(u64),
    /// Its transaction was committed before (by this writer or another).
    AlreadyCommitted,
}

/// A table: its root under an object store.
pub struct Table<'a> {
    objects: &'a Objects,
    root: String,
    checkpoints: Option<Checkpoints>,
}

/// When a committing writer checkpoints the log, and what a checkpoint
/// keeps.
#[derive(Clone, Copy, Debug)]
pub struct Checkpoints {
    /// A checkpoint at every version divisible by this.
    pub every: u64,
    /// Removed files are named (for a reader's vacuum) this long.
    pub keep_removed: std::time::Duration,
    /// Application transactions are kept this long: far longer than a
    /// writer can be unsure whether its commit landed.
    pub keep_transactions: std::time::Duration,
}

/// Where a snapshot starts reading the log.
enum Start {
    /// No log: no table.
    Empty,
    /// Version 0 on.
    First,
    /// A checkpoint of this version, then the versions after it.
    Checkpoint(u64),
}

impl<'a> Table<'a> {
    /// The table at `root` (a directory, without its trailing slash).
    pub fn new(objects: &'a Objects, root: impl Into<String>) -> Self {
        Table {
            objects,
            root: root.into(),
            checkpoints: None,
        }
    }

    /// The same table, its commits checkpointing the log.
    pub fn with_checkpoints(mut self, checkpoints: Checkpoints) -> Self {
        self.checkpoints = Some(checkpoints);
        self
    }

    /// The table's root.
    pub fn root(&self) -> &str {
        &self.root
    }

    fn log_path(&self, version: u64) -> String {
        format!("{}/{LOG_DIR}/{version:020}.json", self.root)
    }

    fn checkpoint_path(&self, version: u64) -> String {
        format!("{}/{LOG_DIR}/{version:020}.checkpoint.parquet", self.root)
    }

    fn last_checkpoint_path(&self) -> String {
        format!("{}/{LOG_DIR}/_last_checkpoint", self.root)
    }

    /// The table as its log says now: from the latest checkpoint, then
    /// every version after it.
    pub async fn snapshot(&self) -> Result<Snapshot> {
        let mut snapshot = Snapshot::default();
        let start = match self.last_checkpoint().await? {
            Some(version) => Start::Checkpoint(version),
            None => self.listed_start().await?,
        };
        match start {
            Start::Empty => return Ok(snapshot),
            Start::First => {}
            Start::Checkpoint(version) => {
                let at = self.checkpoint_path(version);
                let body = self.objects.get(&at).await?;
                for action in checkpoint::read(body)? {
                    snapshot
                        .apply_action(&action)
                        .map_err(|why| Error::Corrupt(format!("{at}: {why}")))?;
                }
                snapshot.version = Some(version);
            }
        }
        self.update(&mut snapshot).await?;
        Ok(snapshot)
    }

    /// The version `_last_checkpoint` names.
    pub async fn last_checkpoint(&self) -> Result<Option<u64>> {
        let Some(body) = self.objects.get_opt(&self.last_checkpoint_path()).await? else {
            return Ok(None);
        };
        let named: Value = serde_json::from_slice(&body)
            .map_err(|e| Error::Corrupt(format!("{}: {e}", self.last_checkpoint_path())))?;
        Ok(named.get("version").and_then(Value::as_u64))
    }

    /// Where to start without `_last_checkpoint`: the log's latest
    /// checkpoint, else its first version, which must be 0 (a log that
    /// starts later without a checkpoint cannot be read, and must never be
    /// taken for no table: a writer would create version 0 again).
    async fn listed_start(&self) -> Result<Start> {
        let (mut first, mut checkpoint) = (None::<u64>, None::<u64>);
        for path in self
            .objects
            .list(&format!("{}/{LOG_DIR}", self.root))
            .await?
        {
            let name = path.rsplit('/').next().unwrap_or_default();
            if let Some(v) = name.strip_suffix(".json").and_then(|v| v.parse().ok()) {
                first = Some(first.map_or(v, |f: u64| f.min(v)));
            } else if let Some(v) = name
                .strip_suffix(".checkpoint.parquet")
                .and_then(|v| v.parse().ok())
            {
                checkpoint = Some(checkpoint.map_or(v, |c: u64| c.max(v)));
            }
        }
        match (checkpoint, first) {
            (Some(v), _) => Ok(Start::Checkpoint(v)),
            (None, None) => Ok(Start::Empty),
            (None, Some(0)) => Ok(Start::First),
            (None, Some(v)) => Err(Error::Corrupt(format!(
                "{}: the log starts at version {v} and has no checkpoint",
                self.root
            ))),
        }
    }

    /// Writes a checkpoint of `snapshot`'s version and names it in
    /// `_last_checkpoint`.
    pub async fn checkpoint(&self, snapshot: &Snapshot, now: DateTime<Utc>) -> Result<()> {
        let (Some(version), Some(policy)) = (snapshot.version, self.checkpoints) else {
            return Ok(());
        };
        let since = |keep: std::time::Duration| {
            now.timestamp_millis()
                .saturating_sub(i64::try_from(keep.as_millis()).unwrap_or(i64::MAX))
        };
        let actions = snapshot.actions(since(policy.keep_removed), since(policy.keep_transactions));
        let bytes = checkpoint::write(&actions)?;
        self.objects
            .put(&self.checkpoint_path(version), bytes)
            .await?;
        let named = json!({ "version": version, "size": actions.len() });
        self.objects
            .put(&self.last_checkpoint_path(), named.to_string().into_bytes())
            .await
    }

    /// Deletes the versions and checkpoints before the last checkpoint
    /// that were written before `before` (time travel reaches back to what
    /// is left): how many.
    pub async fn clean_log(&self, before: DateTime<Utc>) -> Result<usize> {
        let Some(last) = self.last_checkpoint().await? else {
            return Ok(0);
        };
        let mut deleted = 0;
        for object in self
            .objects
            .list_meta(&format!("{}/{LOG_DIR}", self.root))
            .await?
        {
            let name = object.path.rsplit('/').next().unwrap_or_default();
            let version = name.split('.').next().and_then(|v| v.parse::<u64>().ok());
            if version.is_some_and(|v| v < last) && object.modified < before {
                self.objects.delete(&object.path).await?;
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// Reads the versions committed after `snapshot`'s.
    pub async fn update(&self, snapshot: &mut Snapshot) -> Result<()> {
        loop {
            let version = snapshot.next_version();
            let at = self.log_path(version);
            match self.objects.get_opt(&at).await? {
                Some(body) => snapshot.apply(version, &body, &at)?,
                None => return Ok(()),
            }
        }
    }

    /// Commits `commit` as the version after `snapshot`'s, and `snapshot`
    /// moves to it. A version another writer created first is read, and
    /// the commit tried again on top of it (`on_race` counts these); a
    /// transaction found committed ends it. A file to remove that is no
    /// longer live is a conflict: the caller decides again from the new
    /// snapshot. `schema` is the table's schema (Delta's JSON), written
    /// when the commit creates the table.
    pub async fn commit(
        &self,
        snapshot: &mut Snapshot,
        commit: &Commit,
        schema: &str,
        now: DateTime<Utc>,
        on_race: &(dyn Fn() + Sync),
    ) -> Result<Outcome> {
        loop {
            if let Some(txn) = &commit.transaction
                && snapshot.transactions.contains_key(txn)
            {
                return Ok(Outcome::AlreadyCommitted);
            }
            if snapshot.version.is_some() && commit.is_empty() {
                return Ok(Outcome::AlreadyCommitted);
            }
            if snapshot.writer_version > WRITER_VERSION {
                return Err(Error::Storage(format!(
                    "{}: the table asks for writer protocol {}; this writer keeps {WRITER_VERSION}",
                    self.root, snapshot.writer_version
                )));
            }
            if let Some(gone) = commit
                .remove
                .iter()
                .find(|p| !snapshot.files.contains_key(*p))
            {
                return Err(Error::Conflict(format!(
                    "{}: {gone} is no longer in the table",
                    self.root
                )));
            }
            let version = snapshot.next_version();
            let body = render(snapshot, commit, schema, now);
            let at = self.log_path(version);
            if self.objects.put_new(&at, body.clone()).await? {
                snapshot.apply(version, &body, &at)?;
                if let Some(policy) = self.checkpoints
                    && version > 0
                    && version.is_multiple_of(policy.every.max(1))
                    && let Err(error) = self.checkpoint(snapshot, now).await
                {
                    // The commit stands; readers read more of the log.
                    tracing::warn!(table = %self.root, version, %error, "checkpoint failed");
                }
                return Ok(Outcome::Committed(version));
            }
            on_race();
            self.update(snapshot).await?;
        }
    }
}

/// Checks that `objects` honours a create-only put: a second create of one
/// path must be refused. Without it two writers could both create a
/// version and one's commit would be lost.
pub async fn check_conditional_put(objects: &Objects) -> Result<()> {
    let probe = format!("_fastack/put-check-{}", uuid::Uuid::new_v4().simple());
    let first = objects.put_new(&probe, b"1".to_vec()).await;
    let second = match &first {
        Ok(true) => objects.put_new(&probe, b"2".to_vec()).await,
        _ => Ok(true),
    };
    let _ = objects.delete(&probe).await;
    match (first, second) {
        (Ok(true), Ok(false)) => Ok(()),
        (Err(e), _) | (_, Err(e)) => Err(Error::Storage(format!(
            "{}: a create-only put failed ({e}); the store must honour If-None-Match: * \
             (AWS S3, MinIO, Cloudflare R2, moto 5.2.1 or later)",
            objects.location
        ))),
        _ => Err(Error::Storage(format!(
            "{}: a create-only put replaced an existing object; the store must honour \
             If-None-Match: * (AWS S3, MinIO, Cloudflare R2, moto 5.2.1 or later)",
            objects.location
        ))),
    }
}

/// A version's file: commit info, the protocol and table metadata when it
/// creates the table, removes, adds, the transaction.
fn render(snapshot: &Snapshot, commit: &Commit, schema: &str, now: DateTime<Utc>) -> Vec<u8> {
    let ms = now.timestamp_millis();
    let mut lines: Vec<Value> = vec![json!({ "commitInfo": {
        "timestamp": ms,
        "operation": commit.operation,
        "operationParameters": {},
        "clientVersion": concat!("fastack-", env!("CARGO_PKG_VERSION")),
    }})];
    if snapshot.version.is_none() {
        lines.push(
            json!({ "protocol": { "minReaderVersion": 1, "minWriterVersion": WRITER_VERSION } }),
        );
        lines.push(json!({ "metaData": {
            "id": uuid::Uuid::new_v4().to_string(),
            "format": { "provider": "parquet", "options": {} },
            "schemaString": schema,
            "partitionColumns": [PARTITION],
            "configuration": {},
            "createdTime": ms,
        }}));
    }
    for path in &commit.remove {
        let file = snapshot.files.get(path);
        lines.push(json!({ "remove": {
            "path": encode(path),
            "deletionTimestamp": ms,
            "dataChange": !commit.rearranged,
            "extendedFileMetadata": true,
            "partitionValues": { PARTITION: file.map(|f| f.date.as_str()) },
            "size": file.map_or(0, |f| f.size),
        }}));
    }
    let imports = match snapshot.version {
        None => &commit.imports[..],
        Some(_) => &[],
    };
    for file in commit.add.iter().chain(imports) {
        let mut add = json!({
            "path": encode(&file.path),
            "partitionValues": { PARTITION: file.date },
            "size": file.size,
            "modificationTime": ms,
            "dataChange": !commit.rearranged,
        });
        if let Some(stats) = &file.stats {
            add["stats"] = Value::String(stats_json(stats).to_string());
        }
        lines.push(json!({ "add": add }));
    }
    if let Some(txn) = &commit.transaction {
        lines.push(json!({ "txn": { "appId": txn, "version": 0, "lastUpdated": ms } }));
    }
    let mut out = Vec::new();
    for line in lines {
        out.extend_from_slice(line.to_string().as_bytes());
        out.push(b'\n');
    }
    out
}

/// Statistics as Delta writes them: times to the millisecond, the least
/// rounded down and the greatest up, so both still bound the column.
fn stats_json(stats: &Stats) -> Value {
    let (mut min, mut max, mut nulls) = (json!({}), json!({}), json!({}));
    for (column, least, greatest) in &stats.times {
        let floor = DateTime::from_timestamp_millis(least.timestamp_millis()).unwrap_or(*least);
        let ceil = if floor == *greatest || greatest.timestamp_subsec_micros() % 1000 == 0 {
            *greatest
        } else {
            DateTime::from_timestamp_millis(greatest.timestamp_millis() + 1).unwrap_or(*greatest)
        };
        min[*column] = json!(floor.to_rfc3339_opts(SecondsFormat::Millis, true));
        max[*column] = json!(ceil.to_rfc3339_opts(SecondsFormat::Millis, true));
        nulls[*column] = json!(0);
    }
    json!({
        "numRecords": stats.rows,
        "minValues": min,
        "maxValues": max,
        "nullCount": nulls,
    })
}

/// A relative path as the log's URI: every byte but the unreserved ones
/// and `/` and `=` percent-encoded.
fn encode(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/=".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode(uri: &str) -> String {
    let bytes = uri.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |at: usize| {
            bytes
                .get(at..at + 2)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        };
        match (bytes[i], hex(i + 1)) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> DataFile {
        DataFile {
            path: path.to_owned(),
            date: "2026-12-07".to_owned(),
            size: 10,
            stats: None,
        }
    }

    fn objects(dir: &std::path::Path) -> Objects {
        Objects::at(
            &crate::Config::default(),
            &format!("file://{}", dir.display()),
        )
        .unwrap()
    }

    #[test]
    fn a_path_round_trips_through_its_uri() {
        for path in ["date=2026-12-07/hour=05/a.parquet", "odd name/ü%.parquet"] {
            assert_eq!(decode(&encode(path)), path);
        }
        assert_eq!(encode("a b"), "a%20b");
    }

    #[test]
    fn the_greatest_time_is_rounded_up_to_the_millisecond() {
        let t = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
        let stats = Stats {
            rows: 2,
            times: vec![(
                "occurred_at",
                t("2026-12-07T05:00:00.123456Z"),
                t("2026-12-07T05:00:00.123456Z"),
            )],
        };
        let v = stats_json(&stats);
        assert_eq!(v["minValues"]["occurred_at"], "2026-12-07T05:00:00.123Z");
        assert_eq!(v["maxValues"]["occurred_at"], "2026-12-07T05:00:00.124Z");
        assert_eq!(v["numRecords"], 2);
    }

    #[tokio::test]
    async fn a_transaction_commits_once_and_a_lost_race_is_retried() {
        let dir = tempfile::tempdir().unwrap();
        let objects = objects(dir.path());
        let table = Table::new(&objects, "tenant=t");
        let races = std::sync::atomic::AtomicU64::new(0);
        let race = || {
            races.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        };
        let now = Utc::now();
        let write = |path: &str, txn: &str| Commit {
            operation: "WRITE",
            add: vec![file(path)],
            transaction: Some(txn.to_owned()),
            ..Commit::default()
        };
        // Two writers that both read the empty table.
        let (mut a, mut b) = (
            table.snapshot().await.unwrap(),
            table.snapshot().await.unwrap(),
        );
        let first = table
            .commit(&mut a, &write("x.parquet", "batch-1"), "{}", now, &race)
            .await
            .unwrap();
        assert_eq!(first, Outcome::Committed(0));
        let second = table
            .commit(&mut b, &write("y.parquet", "batch-2"), "{}", now, &race)
            .await
            .unwrap();
        assert_eq!(second, Outcome::Committed(1), "retried on top of version 0");
        assert_eq!(races.load(std::sync::atomic::Ordering::Relaxed), 1);
        // The first batch again, from a stale snapshot: nothing is added.
        let mut stale = Snapshot::default();
        let again = table
            .commit(
                &mut stale,
                &write("x2.parquet", "batch-1"),
                "{}",
                now,
                &race,
            )
            .await
            .unwrap();
        assert_eq!(again, Outcome::AlreadyCommitted);
        let read = table.snapshot().await.unwrap();
        assert_eq!(read.version, Some(1));
        assert_eq!(
            read.files.keys().collect::<Vec<_>>(),
            ["x.parquet", "y.parquet"]
        );
        // A remove of a file another commit already removed is a conflict.
        let mut c = read.clone();
        let replace = Commit {
            operation: "DELETE",
            add: vec![file("x.1.parquet")],
            remove: vec!["x.parquet".to_owned()],
            ..Commit::default()
        };
        table
            .commit(&mut c, &replace, "{}", now, &race)
            .await
            .unwrap();
        let mut d = read;
        let err = table
            .commit(&mut d, &replace, "{}", now, &race)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Conflict(_)), "{err}");
        assert!(d.removed.contains_key("x.parquet"));
    }

    #[tokio::test]
    async fn files_from_before_the_log_are_imported_by_the_commit_creating_it() {
        let dir = tempfile::tempdir().unwrap();
        let objects = objects(dir.path());
        let table = Table::new(&objects, "tenant=t");
        let create = |path: &str| Commit {
            operation: "CREATE TABLE",
            imports: vec![file(path)],
            ..Commit::default()
        };
        let (mut a, mut b) = (Snapshot::default(), Snapshot::default());
        let none = || {};
        let (old, other) = (create("old.parquet"), create("other.parquet"));
        let made = table.commit(&mut a, &old, "{}", Utc::now(), &none);
        assert_eq!(made.await.unwrap(), Outcome::Committed(0));
        // A second writer that saw no table: it finds one, adds nothing.
        let late = table.commit(&mut b, &other, "{}", Utc::now(), &none);
        assert_eq!(late.await.unwrap(), Outcome::AlreadyCommitted);
        let read = table.snapshot().await.unwrap();
        assert_eq!(read.version, Some(0));
        assert_eq!(read.files.keys().collect::<Vec<_>>(), ["old.parquet"]);
    }

    #[tokio::test]
    async fn a_checkpoint_reads_as_the_log_it_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let objects = objects(dir.path());
        let hour = std::time::Duration::from_secs(3600);
        let table = Table::new(&objects, "tenant=t").with_checkpoints(Checkpoints {
            every: 2,
            keep_removed: hour,
            keep_transactions: hour,
        });
        let now = Utc::now();
        let none = || {};
        let mut snapshot = Snapshot::default();
        let commits = [
            (vec![file("a.parquet")], vec![], Some("t0")),
            (vec![file("b.parquet")], vec![], Some("t1")),
            (vec![file("c.parquet")], vec!["a.parquet".to_owned()], None),
            (vec![file("d.parquet")], vec![], None),
        ];
        for (add, remove, txn) in commits {
            let commit = Commit {
                operation: "WRITE",
                add,
                remove,
                transaction: txn.map(str::to_owned),
                ..Commit::default()
            };
            table
                .commit(&mut snapshot, &commit, "{}", now, &none)
                .await
                .unwrap();
        }
        assert_eq!(table.last_checkpoint().await.unwrap(), Some(2));
        let same = |read: &Snapshot| {
            assert_eq!(read.version, Some(3));
            assert_eq!(read.files, snapshot.files);
            assert!(read.transactions.contains_key("t0") && read.transactions.contains_key("t1"));
            assert!(read.removed.contains_key("a.parquet"));
            assert_eq!(read.writer_version, 2);
            assert!(read.metadata.is_some());
        };
        // Versions 0 and 1 go; the checkpoint stands for them.
        let later = now + chrono::Duration::days(1);
        assert_eq!(table.clean_log(later).await.unwrap(), 2);
        same(&table.snapshot().await.unwrap());
        // Without `_last_checkpoint` the listing finds it.
        objects.delete(&table.last_checkpoint_path()).await.unwrap();
        same(&table.snapshot().await.unwrap());
        // Without the checkpoint either, a log that no longer starts at 0
        // is an error, never an empty table.
        objects.delete(&table.checkpoint_path(2)).await.unwrap();
        assert!(matches!(table.snapshot().await, Err(Error::Corrupt(_))));
    }

    #[tokio::test]
    async fn a_local_disk_honours_a_create_only_put() {
        let dir = tempfile::tempdir().unwrap();
        check_conditional_put(&objects(dir.path())).await.unwrap();
    }
}
