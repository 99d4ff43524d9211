//! The Parquet mirror as an analyst meets it: files under
//! `tenant=/date=/hour=` read back (by the parquet crate here, and by
//! pyarrow's dataset API through `tests/mirror/check.py` when
//! `FASTACK_TEST_PYTHON` names a Python with pyarrow: CI always does), on
//! both backends, on a directory and on S3 (moto); every event exactly once
//! after a `kill -9` in the middle of a 100k-event load and with two nodes
//! writing at once (one of them killed mid-load, on a disk and on S3); a
//! mirror that cannot write holds its rows and shows its lag while the rest
//! of the node goes on.

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use chrono::{DateTime, Timelike, Utc};
use fastack_entities::Plan;
use futures::future::join_all;
use parquet::{
    file::reader::{FileReader, SerializedFileReader},
    record::RowAccessor,
};
use serde_json::{Value, json};

use crate::helpers::{
    Backend, Node, S3Bucket, TestDb, answer, eventually, make_tenant, services_required, spawn_on,
};

/// Turns the mirror on in a node's configuration.
pub fn mirror_on(c: &mut fastack_core::Config, url: String, flush_rows: u32, flush: Duration) {
    c.sections
        .set(fastack_actors::sinks::mirror::MirrorSettings {
            url: Some(url),
            flush_rows,
            flush,
            ..Default::default()
        });
}

/// A row of the mirror as read back, with the file it lies in.
#[derive(Clone, Debug)]
pub(crate) struct LakeRow {
    id: String,
    tenant_id: String,
    kind: String,
    occurred_at: DateTime<Utc>,
    properties: Option<String>,
    traits: Option<String>,
    /// The file's path under the mirror's root.
    file: String,
}

fn opt_string(row: &parquet::record::Row, i: usize) -> Option<String> {
    row.get_string(i).ok().cloned()
}

/// Every row of one Parquet file.
fn read_file(file: &str, bytes: bytes::Bytes) -> Vec<LakeRow> {
    let reader = SerializedFileReader::new(bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
    let columns: Vec<String> = reader
        .metadata()
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .map(|c| c.name().to_owned())
        .collect();
    let at = |name: &str| columns.iter().position(|c| c == name).unwrap();
    reader
        .get_row_iter(None)
        .unwrap()
        .map(|row| {
            let row = row.unwrap();
            LakeRow {
                id: row.get_string(at("id")).unwrap().clone(),
                tenant_id: row.get_string(at("tenant_id")).unwrap().clone(),
                kind: row.get_string(at("type")).unwrap().clone(),
                occurred_at: DateTime::from_timestamp_micros(
                    row.get_timestamp_micros(at("occurred_at")).unwrap(),
                )
                .unwrap(),
                properties: opt_string(&row, at("properties")),
                traits: opt_string(&row, at("traits")),
                file: file.to_owned(),
            }
        })
        .collect()
}

/// Every data file under `root` (`.parquet`, outside the tables' logs),
/// relative paths.
pub(crate) fn files_under(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            // Not a table's log (its checkpoints are Parquet too).
            if name.to_string_lossy().starts_with(['_', '.']) {
                continue;
            }
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "parquet") {
                out.push(
                    path.strip_prefix(root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    out.sort();
    out
}

pub(crate) fn read_dir(root: &Path) -> Vec<LakeRow> {
    files_under(root)
        .iter()
        .flat_map(|f| read_file(f, std::fs::read(root.join(f)).unwrap().into()))
        .collect()
}

/// Checks the rows against the file each lies in: the partition is the
/// row's tenant and the UTC hour it occurred.
fn assert_partitioned(rows: &[LakeRow]) {
    for r in rows {
        let dir = format!(
            "tenant={}/date={}/hour={:02}/",
            r.tenant_id,
            r.occurred_at.format("%Y-%m-%d"),
            r.occurred_at.hour()
        );
        assert!(
            r.file.starts_with(&dir),
            "{} lies in {}, not under {dir}",
            r.id,
            r.file
        );
    }
}

/// Asserts every accepted id is in the mirror exactly once (and nothing
/// else is).
pub(crate) fn assert_exactly_once(rows: &[LakeRow], accepted: &HashSet<String>) {
    let mut seen: HashMap<&str, &str> = HashMap::new();
    for r in rows {
        if let Some(first) = seen.insert(&r.id, &r.file) {
            panic!("{} is in the mirror twice: {first} and {}", r.id, r.file);
        }
    }
    let missing: Vec<&String> = accepted
        .iter()
        .filter(|id| !seen.contains_key(id.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "{} accepted events are missing from the mirror, e.g. {:?}",
        missing.len(),
        missing.iter().take(3).collect::<Vec<_>>()
    );
    assert_eq!(rows.len(), accepted.len(), "rows nobody sent");
}

/// The mirror as pyarrow reads it (`tests/mirror/check.py`), or `None` when
/// no Python with pyarrow is configured (an error where services are
/// required).
fn pyarrow(root: &Path) -> Option<Value> {
    check_py(&[root.as_os_str()])
}

/// `tests/mirror/check.py` with `args`: what it prints, or `None` when no
/// Python with pyarrow and deltalake is configured (an error where services
/// are required).
fn check_py(args: &[&std::ffi::OsStr]) -> Option<Value> {
    let Ok(python) = std::env::var("FASTACK_TEST_PYTHON") else {
        assert!(
            !services_required(),
            "FASTACK_TEST_PYTHON (a Python with pyarrow) is required with the services"
        );
        eprintln!("pyarrow check skipped: FASTACK_TEST_PYTHON is not set");
        return None;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mirror/check.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .args(args)
        .output()
        .expect("run check.py");
    assert!(
        out.status.success(),
        "check.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).expect("check.py prints JSON"))
}

/// What pyarrow must see: the rows, each once, typed, in their partitions;
/// and `deltalake` reading the tables the same rows.
fn assert_pyarrow(root: &Path, rows: usize) {
    let Some(seen) = pyarrow(root) else { return };
    assert_eq!(seen["rows"], rows, "{seen}");
    assert_eq!(seen["distinct_ids"], rows, "{seen}");
    assert_eq!(seen["partition_mismatches"], 0, "{seen}");
    assert_eq!(seen["bad_json"], 0, "{seen}");
    // The same events through each tenant's Delta table (its log, not a
    // listing): once each.
    let table = &seen["delta"];
    assert!(table["tables"].as_u64() >= Some(1), "{seen}");
    assert_eq!(table["rows"], rows, "{seen}");
    assert_eq!(table["distinct_ids"], rows, "{seen}");
    assert_eq!(table["partition_mismatches"], 0, "{seen}");
    let schema = &seen["schema"];
    for (column, ty) in [
        ("id", "string"),
        ("tenant_id", "string"),
        ("type", "string"),
        ("event", "string"),
        ("user_id", "string"),
        ("anonymous_id", "string"),
        ("contact_id", "string"),
        ("occurred_at", "timestamp[us, tz=UTC]"),
        ("received_at", "timestamp[us, tz=UTC]"),
        ("plan_version", "int64"),
        ("properties", "string"),
        ("traits", "string"),
        ("schema_violations", "string"),
    ] {
        assert_eq!(schema[column], ty, "column {column}: {seen}");
    }
}

fn track_item(key: &str, at: DateTime<Utc>) -> Value {
    json!({
        "type": "track",
        "event": "Order Completed",
        "user_id": format!("user-{}", key.len() % 7),
        "properties": {"total": 42.5, "key": key},
        "occurred_at": at.to_rfc3339(),
        "idempotency_key": key,
    })
}

fn identify_item(key: &str, at: DateTime<Utc>) -> Value {
    json!({
        "type": "identify",
        "anonymous_id": format!("anon-{key}"),
        "traits": {"plan": "pro"},
        "occurred_at": at.to_rfc3339(),
        "idempotency_key": key,
    })
}

/// Sends `requests` batches of `per` events (spread over the last three
/// hours, every tenth an identify) from 4 clients; returns the accepted ids.
async fn send(
    addrs: &[SocketAddr],
    key: &str,
    prefix: &str,
    requests: usize,
    per: usize,
) -> HashSet<String> {
    let http = reqwest::Client::new();
    let now = Utc::now();
    let accepted = Arc::new(parking_lot::Mutex::new(HashSet::new()));
    let clients = 4;
    join_all((0..clients).map(|c| {
        let http = http.clone();
        let accepted = accepted.clone();
        let key = key.to_owned();
        let prefix = prefix.to_owned();
        let addrs = addrs.to_vec();
        async move {
            for r in (c..requests).step_by(clients) {
                let items: Vec<Value> = (0..per)
                    .map(|i| {
                        let k = format!("{prefix}-{r}-{i}");
                        let at =
                            now - chrono::Duration::seconds(((r * per + i) * 10 % 10_800) as i64);
                        if i % 10 == 9 {
                            identify_item(&k, at)
                        } else {
                            track_item(&k, at)
                        }
                    })
                    .collect();
                let body = json!({ "batch": items });
                // A 503 (the answer budget, on a loaded machine) is sent
                // again with the same keys, as the SDKs do; so is a request
                // whose node went away, to the next node.
                let mut tries = 0;
                let a = loop {
                    let addr = addrs[(r + tries) % addrs.len()];
                    tries += 1;
                    let resp = match http
                        .post(format!("http://{addr}/v1/core/batch"))
                        .bearer_auth(&key)
                        .json(&body)
                        .send()
                        .await
                    {
                        Ok(resp) => resp,
                        Err(e) if addrs.len() > 1 && tries < 10 => {
                            eprintln!("{addr} did not answer ({e}): sent to the next node");
                            continue;
                        }
                        Err(e) => panic!("send to {addr}: {e}"),
                    };
                    let a = answer(resp).await;
                    if a.status != 503 || tries == 10 {
                        break a;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                };
                assert_eq!(a.status, 202, "{}", a.body);
                let mut acc = accepted.lock();
                for it in a.body["items"].as_array().unwrap() {
                    acc.insert(it["id"].as_str().unwrap().to_owned());
                }
            }
        }
    }))
    .await;
    Arc::try_unwrap(accepted).unwrap().into_inner()
}

/// Waits until the mirror under `root` holds at least `n` rows, every
/// file committed to its tenant's table.
async fn mirrored(root: &Path, n: usize, within: Duration) -> Vec<LakeRow> {
    eventually("the mirror to hold every event", within, || async {
        let rows = read_dir(root);
        (rows.len() >= n && all_committed(root).await).then_some(rows)
    })
    .await
}

/// Whether every Parquet file under `root` is a live file of its tenant's
/// Delta table.
pub(crate) async fn all_committed(root: &Path) -> bool {
    let objects = fastack_core::objects::Objects::at(
        &fastack_core::Config::default(),
        &format!("file://{}", root.display()),
    )
    .unwrap();
    for file in files_under(root) {
        let (table, rel) = file.split_once('/').unwrap();
        let snapshot = fastack_core::delta::Table::new(&objects, table)
            .snapshot()
            .await
            .unwrap();
        if !snapshot.files.contains_key(rel) {
            return false;
        }
    }
    true
}

fn lake(db: &TestDb) -> PathBuf {
    db.dir.path().join("lake")
}

async fn writes_typed_partitioned_parquet(backend: Backend) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let root = lake(&db);
    let url = format!("file://{}", root.display());
    let app = spawn_on(Arc::new(db), |c| {
        mirror_on(c, url, 500, Duration::from_secs(1));
    })
    .await;
    let addr: SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();
    let accepted = send(&[addr], &app.t.key, "lake", 12, 100).await;
    let rows = mirrored(&root, accepted.len(), Duration::from_secs(30)).await;
    assert_exactly_once(&rows, &accepted);
    assert_partitioned(&rows);
    let tenant = app.t.tenant.id.to_string();
    for r in &rows {
        assert_eq!(r.tenant_id, tenant);
        match r.kind.as_str() {
            "track" => assert!(r.properties.is_some() && r.traits.is_none(), "{r:?}"),
            "identify" => assert!(r.traits.is_some() && r.properties.is_none(), "{r:?}"),
            other => panic!("type {other}"),
        }
    }
    // Three hours of events: several partitions, each file named by batch.
    let hours: HashSet<&str> = rows
        .iter()
        .map(|r| r.file.rsplit_once('/').unwrap().0)
        .collect();
    assert!(hours.len() >= 3, "{hours:?}");
    assert_pyarrow(&root, accepted.len());
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_mirror_writes_typed_partitioned_parquet() {
    writes_typed_partitioned_parquet(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_mirror_writes_typed_partitioned_parquet() {
    writes_typed_partitioned_parquet(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mirror_to_s3() {
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let Some(lake) = TestLake::new(&db, true).await else {
        return;
    };
    let bucket = lake.bucket.as_ref().expect("a bucket");
    let app = spawn_on(Arc::new(db), |c| {
        lake.apply(c);
        mirror_on(c, lake.url.clone(), 400, Duration::from_secs(1));
    })
    .await;
    let addr: SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();
    let accepted = send(&[addr], &app.t.key, "s3", 8, 100).await;
    // Read signed, as any S3 client reads the objects.
    let root = format!("tenant={}", app.t.tenant.id);
    let rows = eventually(
        "the bucket to hold every event",
        Duration::from_secs(30),
        || async {
            let (_, rows) = table_rows(&lake.objects, &root).await;
            (rows.len() >= accepted.len()).then_some(rows)
        },
    )
    .await;
    assert_exactly_once(&rows, &accepted);
    assert_partitioned(&rows);
    assert_pyarrow(lake.dir().await, accepted.len());
    // Nothing but the tables: no probe of the conditional put left behind.
    assert!(
        bucket
            .keys()
            .await
            .iter()
            .all(|k| k.starts_with("lake/tenant=")),
        "{:?}",
        bucket.keys().await
    );
    app.cleanup().await;
}

/// A lake written by the release before tables (its files, no log) becomes
/// the table when the mirror first commits to it: its files imported once,
/// beside the new batches.
async fn a_lake_from_before_tables_becomes_the_table(backend: Backend) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let db = Arc::new(db);
    let root = lake(&db);
    let url = format!("file://{}", root.display());
    let before = spawn_on(db.clone(), |c| {
        mirror_on(c, url.clone(), 300, Duration::from_secs(1));
    })
    .await;
    let addr: SocketAddr = before.base.trim_start_matches("http://").parse().unwrap();
    let mut accepted = send(&[addr], &before.t.key, "old", 6, 100).await;
    mirrored(&root, accepted.len(), Duration::from_secs(30)).await;
    before.stop().await;
    // What the release before left: the same files, no log.
    let mut logs = 0;
    for entry in std::fs::read_dir(&root).unwrap().flatten() {
        let log = entry.path().join("_delta_log");
        if log.is_dir() {
            std::fs::remove_dir_all(log).unwrap();
            logs += 1;
        }
    }
    assert_eq!(logs, 1, "one tenant, one table");
    let old_files = files_under(&root).len();

    let app = spawn_on(db.clone(), |c| {
        mirror_on(c, url, 300, Duration::from_secs(1));
    })
    .await;
    let addr: SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();
    accepted.extend(send(&[addr], &app.t.key, "new", 4, 100).await);
    let rows = mirrored(&root, accepted.len(), Duration::from_secs(30)).await;
    assert_exactly_once(&rows, &accepted);
    assert!(files_under(&root).len() > old_files);
    assert_pyarrow(&root, accepted.len());
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_a_lake_from_before_tables_becomes_the_table() {
    a_lake_from_before_tables_becomes_the_table(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_lake_from_before_tables_becomes_the_table() {
    a_lake_from_before_tables_becomes_the_table(Backend::Postgres).await;
}

/// The ids one version of a table holds, read by `deltalake` (time travel).
fn ids_at_version(table: &Path, version: u64) -> Option<HashSet<String>> {
    let version = version.to_string();
    let seen = check_py(&[table.as_os_str(), version.as_ref()])?;
    Some(
        seen["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_str().unwrap().to_owned())
            .collect(),
    )
}

/// Many small files (a batch of 100 every second, over three hours), then a
/// node that compacts, on a disk or on S3: one file a date, the same rows,
/// and the version before the compaction still reads the same rows.
async fn compaction_leaves_a_file_a_date(backend: Backend, s3: bool) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let Some(lake) = TestLake::new(&db, s3).await else {
        return;
    };
    let db = Arc::new(db);
    let writer = spawn_on(db.clone(), |c| {
        lake.apply(c);
        mirror_on(c, lake.url.clone(), 100, Duration::from_secs(1));
    })
    .await;
    let addr: SocketAddr = writer.base.trim_start_matches("http://").parse().unwrap();
    let accepted = send(&[addr], &writer.t.key, "small", 8, 100).await;
    let root = format!("tenant={}", writer.t.tenant.id);
    let (before, _) = eventually(
        "every event in the table",
        Duration::from_secs(30),
        || async {
            let (snapshot, rows) = table_rows(&lake.objects, &root).await;
            (rows.len() >= accepted.len()).then_some((snapshot, rows))
        },
    )
    .await;
    writer.stop().await;
    let small_files = before.files.len();
    let dates: HashSet<&String> = before.files.values().map(|f| &f.date).collect();
    assert!(
        small_files > dates.len(),
        "{small_files} files over {} dates: nothing to compact",
        dates.len()
    );

    let compactor = spawn_on(db.clone(), |c| {
        lake.apply(c);
        c.sections
            .set(fastack_actors::sinks::mirror::MirrorSettings {
                url: Some(lake.url.clone()),
                maintain_every: Duration::from_millis(500),
                ..Default::default()
            });
    })
    .await;
    let table = fastack_core::delta::Table::new(&lake.objects, root.clone());
    let after = eventually("one file a date", Duration::from_secs(30), || async {
        let now = table.snapshot().await.unwrap();
        (now.files.len() == dates.len()).then_some(now)
    })
    .await;
    println!(
        "compaction ({backend:?}, {}): {small_files} files over {} dates -> {} files, version {:?} -> {:?}",
        lake.name(),
        dates.len(),
        after.files.len(),
        before.version,
        after.version
    );
    let (_, rows) = table_rows(&lake.objects, &root).await;
    assert_exactly_once(&rows, &accepted);
    let dir = lake.dir().await;
    assert_pyarrow(dir, accepted.len());
    if let Some(ids) = ids_at_version(&dir.join(&root), before.version.unwrap()) {
        assert_eq!(ids, accepted, "the version before the compaction");
    }
    // The files it replaced are kept for that version, outside the table.
    assert!(files_under(dir).len() > after.files.len());
    compactor.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_compaction_leaves_a_file_a_date() {
    compaction_leaves_a_file_a_date(Backend::Sqlite, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_compaction_leaves_a_file_a_date() {
    compaction_leaves_a_file_a_date(Backend::Postgres, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_compaction_leaves_a_file_a_date() {
    compaction_leaves_a_file_a_date(Backend::Sqlite, true).await;
}

/// Checkpoints every two versions and no log kept past the last one:
/// `deltalake` opens the table from the checkpoint, with the same rows.
async fn a_checkpointed_log_reads_the_same(backend: Backend) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let db = Arc::new(db);
    let root = lake(&db);
    let url = format!("file://{}", root.display());
    let app = spawn_on(db.clone(), |c| {
        c.sections
            .set(fastack_actors::sinks::mirror::MirrorSettings {
                url: Some(url.clone()),
                flush_rows: 100,
                flush: Duration::from_millis(200),
                maintain_every: Duration::from_millis(300),
                checkpoint_every: 2,
                log_retention: Duration::ZERO,
                ..Default::default()
            });
    })
    .await;
    let addr: SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();
    let tenant = app.t.tenant.id.to_string();
    let accepted = send(&[addr], &app.t.key, "cp", 8, 100).await;
    // Through the table: a compaction may already have replaced files.
    let objects = fastack_core::objects::Objects::at(&db.config(), &url).unwrap();
    let table = format!("tenant={tenant}");
    eventually(
        "every event in the table",
        Duration::from_secs(30),
        || async {
            let (_, rows) = table_rows(&objects, &table).await;
            (rows.len() >= accepted.len()).then_some(())
        },
    )
    .await;
    let log = root.join(format!("tenant={tenant}/_delta_log"));
    eventually(
        "the log before the checkpoint deleted",
        Duration::from_secs(30),
        || async { (!log.join(format!("{:020}.json", 0)).exists()).then_some(()) },
    )
    .await;
    let names: Vec<String> = std::fs::read_dir(&log)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().any(|n| n.ends_with(".checkpoint.parquet")),
        "{names:?}"
    );
    assert!(names.contains(&"_last_checkpoint".to_owned()), "{names:?}");
    assert_pyarrow(&root, accepted.len());
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_a_checkpointed_log_reads_the_same() {
    a_checkpointed_log_reads_the_same(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_checkpointed_log_reads_the_same() {
    a_checkpointed_log_reads_the_same(Backend::Postgres).await;
}

/// A table's snapshot and the rows of its files, read as its log lists
/// them (not a listing).
async fn table_rows(
    objects: &fastack_core::objects::Objects,
    root: &str,
) -> (fastack_core::delta::Snapshot, Vec<LakeRow>) {
    let snapshot = fastack_core::delta::Table::new(objects, root)
        .snapshot()
        .await
        .unwrap();
    let mut rows = Vec::new();
    for path in snapshot.files.keys() {
        let file = format!("{root}/{path}");
        rows.extend(read_file(&file, objects.get(&file).await.unwrap()));
    }
    (snapshot, rows)
}

/// A test's lake: a directory, or a prefix of a fresh bucket on the S3
/// test endpoint; read back through the store's own object client.
struct TestLake {
    bucket: Option<S3Bucket>,
    url: String,
    objects: fastack_core::objects::Objects,
    /// The directory (or the bucket's copy) the Python readers open.
    local: PathBuf,
    _copy: Option<tempfile::TempDir>,
}

impl TestLake {
    /// `None` when S3 is asked for and no endpoint is configured.
    async fn new(db: &TestDb, s3: bool) -> Option<TestLake> {
        let bucket = match s3 {
            true => Some(S3Bucket::create().await?),
            false => None,
        };
        let mut config = db.config();
        let (url, copy) = match &bucket {
            Some(bucket) => {
                bucket.apply(&mut config);
                let url = format!("s3://{}/lake", bucket.bucket);
                (url, Some(tempfile::tempdir().unwrap()))
            }
            None => (format!("file://{}", lake(db).display()), None),
        };
        Some(TestLake {
            objects: fastack_core::objects::Objects::at(&config, &url).unwrap(),
            local: copy
                .as_ref()
                .map_or_else(|| lake(db), |c| c.path().to_owned()),
            bucket,
            url,
            _copy: copy,
        })
    }

    fn name(&self) -> &'static str {
        if self.bucket.is_some() {
            "S3"
        } else {
            "file://"
        }
    }

    /// An in-process node's configuration: the bucket's credentials.
    fn apply(&self, c: &mut fastack_core::Config) {
        if let Some(bucket) = &self.bucket {
            bucket.apply(c);
            c.storage_url = None;
        }
    }

    /// A node process's environment: the mirror's URL and the bucket's
    /// credentials.
    fn env(&self) -> Vec<(&str, &str)> {
        let mut env = vec![("FASTACK_MIRROR_URL", self.url.as_str())];
        if let Some(bucket) = &self.bucket {
            env.extend([
                ("FASTACK_S3_ENDPOINT", bucket.endpoint.as_str()),
                ("FASTACK_S3_REGION", "us-east-1"),
                ("FASTACK_S3_ACCESS_KEY_ID", "test"),
                ("FASTACK_S3_SECRET_ACCESS_KEY", "test"),
            ]);
        }
        env
    }

    /// A directory holding the lake as it is now (for S3, every object
    /// under the prefix, downloaded).
    async fn dir(&self) -> &Path {
        if let Some(bucket) = &self.bucket {
            let _ = std::fs::remove_dir_all(&self.local);
            for key in bucket.keys().await {
                let file = key.strip_prefix("lake/").expect("under the prefix");
                let path = self.local.join(file);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, self.objects.get(file).await.unwrap()).unwrap();
            }
        }
        &self.local
    }
}

/// Another writer commits to the tenant's table between two of the
/// mirror's commits, on a local disk or on S3 (moto: a conditional put
/// answered `412`): the mirror's next commit loses the race for its
/// version, reads what won and commits on top. The lost race is counted;
/// every event is in the table once.
async fn a_lost_commit_race_is_retried(backend: Backend, s3: bool) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let Some(lake) = TestLake::new(&db, s3).await else {
        return;
    };
    let objects = &lake.objects;
    let app = spawn_on(Arc::new(db), |c| {
        lake.apply(c);
        mirror_on(c, lake.url.clone(), 100, Duration::from_millis(200));
    })
    .await;
    let addr: SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();
    let root = format!("tenant={}", app.t.tenant.id);
    let table = fastack_core::delta::Table::new(objects, root.clone());
    let in_table = |n: usize| {
        let root = &root;
        async move {
            let (snapshot, rows) = table_rows(objects, root).await;
            (rows.len() >= n).then_some((snapshot, rows))
        }
    };
    let mut accepted = send(&[addr], &app.t.key, "first", 2, 100).await;
    let (mut snapshot, _) = eventually(
        "the first events in the table",
        Duration::from_secs(30),
        || in_table(accepted.len()),
    )
    .await;
    // The other writer: a version of its own (a transaction, no files).
    let other = fastack_core::delta::Commit {
        operation: "WRITE",
        transaction: Some("another-writer".to_owned()),
        ..Default::default()
    };
    let won = table
        .commit(&mut snapshot, &other, "{}", Utc::now(), &|| {})
        .await
        .unwrap();
    assert!(matches!(won, fastack_core::delta::Outcome::Committed(_)));
    accepted.extend(send(&[addr], &app.t.key, "second", 2, 100).await);
    let (snapshot, rows) = eventually("every event in the table", Duration::from_secs(30), || {
        in_table(accepted.len())
    })
    .await;
    assert_exactly_once(&rows, &accepted);
    assert!(snapshot.transactions.contains_key("another-writer"));
    let races = app
        .metrics()
        .await
        .lines()
        .find_map(|l| {
            l.strip_prefix("fastack_mirror_commit_races_total ")?
                .parse::<f64>()
                .ok()
        })
        .unwrap_or_default();
    assert!(races >= 1.0, "lost races counted: {races}");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_a_lost_commit_race_is_retried() {
    a_lost_commit_race_is_retried(Backend::Sqlite, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_lost_commit_race_is_retried() {
    a_lost_commit_race_is_retried(Backend::Postgres, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_a_lost_commit_race_is_retried() {
    a_lost_commit_race_is_retried(Backend::Sqlite, true).await;
}

/// A store that does not refuse a second create of one object (here S3
/// with conditional puts turned off in the client) would let two nodes
/// both commit one version: the mirror says so, naming the setting, and
/// writes nothing there; its events stay owed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_without_conditional_puts_is_refused() {
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let Some(lake) = TestLake::new(&db, true).await else {
        return;
    };
    let bucket = lake.bucket.as_ref().expect("a bucket");
    let store = db.store().await;
    let t = make_tenant(&store, "lake", Plan::Enterprise, None).await;
    drop(store);
    let mut env = lake.env();
    env.extend([
        ("FASTACK_MIRROR_FLUSH_SECS", "1"),
        ("AWS_CONDITIONAL_PUT", "disabled"),
    ]);
    let node = Node::start(&db, &env).await;
    let accepted = send(&[node.addr], &t.key, "refused", 1, 10).await;
    assert_eq!(accepted.len(), 10);
    let said = eventually(
        "the refusal in the log",
        Duration::from_secs(30),
        || async {
            node.log
                .lock()
                .iter()
                .find(|l| l.contains("If-None-Match") && l.contains("FASTACK_MIRROR_URL"))
                .cloned()
        },
    )
    .await;
    assert!(said.contains("sink link down"), "{said}");
    // Two flushes' time: nothing under the lake's prefix.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let keys = bucket.keys().await;
    assert!(!keys.iter().any(|k| k.starts_with("lake/")), "{keys:?}");
    node.terminate().await;
    db.drop_db().await;
}

/// A node process mirroring to `root`.
async fn mirror_node(db: &TestDb, root: &Path) -> Node {
    let url = format!("file://{}", root.display());
    Node::start(
        db,
        &[
            ("FASTACK_LEASE_TTL_MS", "2000"),
            ("FASTACK_MIRROR_URL", &url),
            ("FASTACK_MIRROR_FLUSH_ROWS", "5000"),
            ("FASTACK_MIRROR_FLUSH_SECS", "1"),
        ],
    )
    .await
}

/// Batches claimed and not completed (a batch in flight).
/// (The store has no reader for this: the test looks at the table.)
async fn batches_in_flight(db: &TestDb) -> i64 {
    count(
        db,
        "SELECT count(DISTINCT batch) FROM outbox_sinks \
         WHERE sink = 'mirror' AND batch IS NOT NULL",
    )
    .await
}

/// Outbox rows still owed to the mirror.
async fn owed_to_mirror(db: &TestDb) -> i64 {
    count(
        db,
        "SELECT count(*) FROM outbox_sinks WHERE sink = 'mirror'",
    )
    .await
}

async fn count(db: &TestDb, sql: &'static str) -> i64 {
    match db.backend {
        Backend::Postgres => sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(&db.pg_pool().await)
            .await
            .unwrap(),
        Backend::Sqlite => {
            let path = db.dir.path().join("fastack.db");
            let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display()))
                .await
                .unwrap();
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    }
}

/// `kill -9` as a batch's first file lands, with a backlog to flush: its
/// other files and its record are missing. After the restart the batch is
/// written again whole, under its name: 100,000 events, each in the mirror
/// once.
async fn exactly_once_across_kill_9(backend: Backend) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let store = db.store().await;
    let t = make_tenant(&store, "lake", Plan::Enterprise, None).await;
    drop(store);
    let root = lake(&db);
    // The first half is stored while the mirror cannot write (its directory
    // lies under a file once the node has started: the start checks the
    // lake): 50,000 events owed, so the kills below land while batches are
    // being written, not after the mirror caught up.
    let blocker = db.dir.path().join("not-a-directory");
    let blocked = mirror_node(&db, &blocker.join("lake")).await;
    // The node may still be writing its check's objects there: removed
    // again until the directory is gone.
    eventually(
        "the lake's directory removed",
        Duration::from_secs(10),
        || async { std::fs::remove_dir_all(&blocker).ok() },
    )
    .await;
    std::fs::write(&blocker, b"").unwrap();
    let mut accepted = send(&[blocked.addr], &t.key, "before", 250, 200).await;
    blocked.terminate().await;
    let mut node = mirror_node(&db, &root).await;
    // Kill the node the moment a new file appears: up to four times, until
    // a kill lands while a batch is written and not yet recorded (or the
    // mirror has caught up: nothing left to kill it in the middle of).
    let mut kills = Vec::new();
    for _ in 0..4 {
        let files_before = files_under(&root).len();
        let landed = eventually(
            "a file of a batch to land, or nothing left owed",
            Duration::from_secs(60),
            || async {
                if files_under(&root).len() > files_before {
                    Some(true)
                } else {
                    (owed_to_mirror(&db).await == 0).then_some(false)
                }
            },
        )
        .await;
        if !landed {
            break;
        }
        node.child.start_kill().expect("SIGKILL");
        let _ = node.child.wait().await;
        let in_flight = batches_in_flight(&db).await;
        kills.push((in_flight, files_under(&root).len()));
        if in_flight > 0 {
            break;
        }
        node = mirror_node(&db, &root).await;
    }
    let node = mirror_node(&db, &root).await;
    accepted.extend(send(&[node.addr], &t.key, "after", 250, 200).await);
    assert_eq!(accepted.len(), 100_000);
    // A batch whose claim the dead node held is taken again after 30 s.
    let rows = mirrored(&root, accepted.len(), Duration::from_secs(150)).await;
    // Let a late writer (there must be none) show itself.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rows = if read_dir(&root).len() == rows.len() {
        rows
    } else {
        read_dir(&root)
    };
    println!(
        "mirror kill -9 ({backend:?}): (batches in flight, files) at each kill {kills:?}, \
         files now {}, rows {}",
        files_under(&root).len(),
        rows.len()
    );
    assert_exactly_once(&rows, &accepted);
    assert_partitioned(&rows);
    assert_pyarrow(&root, accepted.len());
    node.terminate().await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_mirror_exactly_once_across_kill_9() {
    exactly_once_across_kill_9(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_mirror_exactly_once_across_kill_9() {
    exactly_once_across_kill_9(Backend::Postgres).await;
}

/// Two nodes run the mirror at once on one database: each batch is written
/// by one of them, each event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_two_nodes_mirror_each_event_once() {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let store = db.store().await;
    let t = make_tenant(&store, "lake", Plan::Enterprise, None).await;
    drop(store);
    let root = lake(&db);
    let a = mirror_node(&db, &root).await;
    let b = mirror_node(&db, &root).await;
    let accepted = send(&[a.addr, b.addr], &t.key, "two", 100, 200).await;
    let rows = mirrored(&root, accepted.len(), Duration::from_secs(60)).await;
    assert_exactly_once(&rows, &accepted);
    assert_pyarrow(&root, accepted.len());
    a.terminate().await;
    b.terminate().await;
    db.drop_db().await;
}

/// Two nodes commit to one tenant's table, on a local disk or on S3, and
/// one of them is killed (`kill -9`) in the middle of the load, its batch
/// and its lease with it. The clients send again to the node left; the
/// survivor takes the dead node's batches over. The table, read through
/// its log here and through the `deltalake` package, holds every accepted
/// event once, and plain pyarrow over the table's file list agrees.
async fn two_nodes_one_killed_mid_load(s3: bool) {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let Some(lake) = TestLake::new(&db, s3).await else {
        return;
    };
    let store = db.store().await;
    let t = make_tenant(&store, "lake", Plan::Enterprise, None).await;
    drop(store);
    let objects = &lake.objects;
    let mut env = lake.env();
    env.extend([
        ("FASTACK_LEASE_TTL_MS", "2000"),
        ("FASTACK_MIRROR_FLUSH_ROWS", "2000"),
        ("FASTACK_MIRROR_FLUSH_SECS", "1"),
    ]);
    let mut a = Node::start(&db, &env).await;
    let b = Node::start(&db, &env).await;
    let addrs = [a.addr, b.addr];
    let key = t.key.clone();
    let load = tokio::spawn(async move { send(&addrs, &key, "kill", 300, 100).await });
    // Killed once the table has taken a few commits, with the load going on,
    // at a moment a batch is claimed (on a loaded machine, a moment both
    // nodes hold one may not come).
    let root = format!("tenant={}", t.tenant.id);
    let table = fastack_core::delta::Table::new(objects, root.clone());
    let versions = eventually(
        "a few commits, and a batch claimed",
        Duration::from_secs(60),
        || async {
            let version = table.snapshot().await.ok()?.version?;
            (version >= 2 && batches_in_flight(&db).await >= 1).then_some(version)
        },
    )
    .await;
    a.child.start_kill().expect("SIGKILL");
    let _ = a.child.wait().await;
    assert!(!load.is_finished(), "the load ended before the kill");
    let claimed: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT batch FROM outbox_sinks WHERE sink = 'mirror' AND batch IS NOT NULL",
    )
    .fetch_all(&db.pg_pool().await)
    .await
    .unwrap();
    let accepted = load.await.unwrap();
    assert_eq!(accepted.len(), 30_000);
    // A batch the dead node had claimed is taken over once its claim runs out.
    let (snapshot, rows) = eventually(
        "every accepted event in the table",
        Duration::from_secs(150),
        || async {
            let (snapshot, rows) = table_rows(objects, &root).await;
            (rows.len() >= accepted.len()).then_some((snapshot, rows))
        },
    )
    .await;
    println!(
        "two nodes, one killed ({}): killed at version {versions} with batches {claimed:?} \
         claimed, now version {:?} with {} files",
        lake.name(),
        snapshot.version,
        snapshot.files.len()
    );
    assert_exactly_once(&rows, &accepted);
    // The batches claimed at the kill (the dead node's, unless it finished
    // its batch between the check and the kill) were committed under their
    // names, by the node left.
    for batch in &claimed {
        assert!(
            snapshot
                .transactions
                .contains_key(&format!("fastack-mirror-{batch}")),
            "batch {batch}, claimed at the kill, is not in the table"
        );
    }
    // What the Python readers see, on a copy of the bucket for S3.
    assert_pyarrow(lake.dir().await, accepted.len());
    b.terminate().await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_two_nodes_one_killed_mid_load() {
    two_nodes_one_killed_mid_load(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_two_nodes_one_killed_mid_load() {
    two_nodes_one_killed_mid_load(true).await;
}

/// A mirror whose storage does not answer keeps its rows owed, shows how
/// far behind it is, and the node goes on accepting and storing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mirror_that_cannot_write_holds_its_rows_and_shows_its_lag() {
    // The lake's storage is there at start (the node checks it) and gone
    // right after, behind a proxy that cuts it.
    let Some(bucket) = crate::helpers::S3Bucket::create().await else {
        return;
    };
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let proxy = crate::netfault::Proxy::start(bucket.addr()).await;
    let via = format!("http://{}", proxy.addr);
    let app = spawn_on(Arc::new(db), |c| {
        bucket.apply(c);
        c.storage_url = None;
        c.s3.endpoint = Some(via);
        mirror_on(
            c,
            format!("s3://{}/lake", bucket.bucket),
            10,
            Duration::from_secs(1),
        );
        c.dependency_check = Duration::from_millis(200);
    })
    .await;
    proxy.cut();
    let addr: SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();
    let accepted = send(&[addr], &app.t.key, "held", 2, 50).await;
    let from = (Utc::now() - chrono::Duration::hours(4)).to_rfc3339();
    let to = (Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let stored = app.events(&app.t.key, &from, &to, "").await;
    assert!(stored.len() <= accepted.len());
    eventually(
        "every event stored while the mirror cannot write",
        Duration::from_secs(20),
        || async {
            (app.events(&app.t.key, &from, &to, "").await.len() == accepted.len()).then_some(())
        },
    )
    .await;
    let metrics = eventually(
        "the mirror's lag to show",
        Duration::from_secs(30),
        || async {
            let text = app.metrics().await;
            let lag = text
                .lines()
                .find(|l| l.starts_with("fastack_sink_lag_seconds{sink=\"mirror\"}"))
                .and_then(|l| l.rsplit(' ').next()?.parse::<i64>().ok())?;
            (lag >= 3).then_some(text)
        },
    )
    .await;
    assert!(
        metrics.contains(&format!(
            "fastack_outbox_depth{{sink=\"mirror\"}} {}",
            accepted.len()
        )),
        "every event still owed to the mirror:\n{}",
        metrics
            .lines()
            .filter(|l| l.contains("mirror"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // And `/readyz` says why, while the node stays ready.
    let (status, doc) = crate::operator::until_dependency(&app.base, "lake", "down").await;
    assert_eq!(status, 200, "{doc}");
    assert_eq!(doc["dependencies"]["database"]["state"], "up", "{doc}");
    app.cleanup().await;
}

/// `fastack admin backfill mirror` on `db` mirroring to `root`:
/// (succeeded, stdout, stderr).
fn backfill_cli(
    db: &TestDb,
    root: &Path,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    more: &[&str],
) -> (bool, String, String) {
    let mut env = db.env();
    env.push((
        "FASTACK_MIRROR_URL".to_owned(),
        format!("file://{}", root.display()),
    ));
    let (from, to) = (from.to_rfc3339(), to.to_rfc3339());
    crate::helpers::run_cli(
        &crate::helpers::bin_path(),
        env,
        &[
            &[
                "admin", "backfill", "mirror", "--tenant", "acme", "--from", &from, "--to", &to,
            ],
            more,
        ]
        .concat(),
    )
}

/// Events stored before the mirror was switched on are written by a
/// backfill, beside what the live mirror wrote since, each once; a second
/// backfill of the same range writes nothing. A rewrite mends a damaged
/// mirror (a file copied, another lost) and refuses an hour holding events
/// storage no longer has.
async fn backfill_writes_what_the_mirror_lacks(backend: Backend) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let db = Arc::new(db);
    let root = lake(&db);
    let before = spawn_on(db.clone(), |_| {}).await;
    let addr: SocketAddr = before.base.trim_start_matches("http://").parse().unwrap();
    let mut accepted = send(&[addr], &before.t.key, "old", 10, 100).await;
    let from = Utc::now() - chrono::Duration::hours(4);
    eventually("the old events stored", Duration::from_secs(30), || async {
        let to = (Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
        (before
            .events(&before.t.key, &from.to_rfc3339(), &to, "")
            .await
            .len()
            == 1_000)
            .then_some(())
    })
    .await;
    before.stop().await;

    let url = format!("file://{}", root.display());
    let app = spawn_on(db.clone(), |c| {
        mirror_on(c, url, 200, Duration::from_secs(1));
    })
    .await;
    let addr: SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();
    let live = send(&[addr], &app.t.key, "new", 5, 100).await;
    mirrored(&root, live.len(), Duration::from_secs(30)).await;
    accepted.extend(live);

    let to = Utc::now() + chrono::Duration::hours(1);
    // Only a sink with a backfill, and only with its settings.
    let (from_text, to_text) = (from.to_rfc3339(), to.to_rfc3339());
    let args = |sink: &'static str| {
        ["admin", "backfill", sink, "--tenant", "acme", "--from"]
            .map(str::to_owned)
            .into_iter()
            .chain([from_text.clone(), "--to".to_owned(), to_text.clone()])
            .collect::<Vec<_>>()
    };
    let run = |env: Vec<(String, String)>, args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        crate::helpers::run_cli(&crate::helpers::bin_path(), env, &args)
    };
    let (ok, stdout, stderr) = run(db.env(), args("amqp"));
    assert!(!ok, "{stdout}{stderr}");
    assert!(
        stderr.contains("invalid value 'amqp'") && stderr.contains("[possible values: mirror]"),
        "{stderr}"
    );
    let (ok, stdout, stderr) = run(db.env(), args("mirror"));
    assert!(!ok, "{stdout}{stderr}");
    assert!(stderr.contains("the mirror sink is off"), "{stderr}");

    let (ok, stdout, stderr) = backfill_cli(&db, &root, from, to, &[]);
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stdout.contains("1000 events written") && stdout.contains("500 already in the mirror"),
        "{stdout}"
    );
    let rows = read_dir(&root);
    assert_exactly_once(&rows, &accepted);
    assert_partitioned(&rows);
    assert_pyarrow(&root, accepted.len());

    let (ok, stdout, stderr) = backfill_cli(&db, &root, from, to, &[]);
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stdout.contains("0 events written") && stdout.contains("1500 already in the mirror"),
        "{stdout}"
    );
    assert_eq!(read_dir(&root).len(), accepted.len());

    let files = files_under(&root);
    assert!(files.len() >= 2, "{files:?}");
    let copied = root
        .join(&files[0])
        .with_file_name("copied-by-hand.parquet");
    std::fs::copy(root.join(&files[0]), &copied).unwrap();
    std::fs::remove_file(root.join(&files[1])).unwrap();
    assert_ne!(read_dir(&root).len(), accepted.len());
    let (ok, stdout, stderr) = backfill_cli(&db, &root, from, to, &["--rewrite"]);
    assert!(ok, "{stdout}{stderr}");
    assert!(!stdout.contains(" 0 files replaced"), "{stdout}");
    let rows = read_dir(&root);
    assert_exactly_once(&rows, &accepted);
    assert_partitioned(&rows);
    assert_pyarrow(&root, accepted.len());

    // A file in an hour storage holds nothing of (as after retention
    // dropped its partition): the rewrite refuses that hour and deletes
    // nothing there.
    let stray = root.join(format!(
        "tenant={}/date={}/hour={:02}/kept.parquet",
        rows[0].tenant_id,
        from.format("%Y-%m-%d"),
        from.hour()
    ));
    std::fs::create_dir_all(stray.parent().unwrap()).unwrap();
    std::fs::copy(root.join(&files_under(&root)[0]), &stray).unwrap();
    let (ok, stdout, stderr) = backfill_cli(&db, &root, from, to, &["--rewrite"]);
    assert!(!ok, "{stdout}{stderr}");
    assert!(stdout.contains("storage no longer has"), "{stdout}{stderr}");
    assert!(stray.exists());
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_mirror_backfill_writes_what_the_mirror_lacks() {
    backfill_writes_what_the_mirror_lacks(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_mirror_backfill_writes_what_the_mirror_lacks() {
    backfill_writes_what_the_mirror_lacks(Backend::Postgres).await;
}
