//! Forgetting a person (erasure and suppression), end to end on both
//! backends: a person with events in several months, one month archived
//! and dropped, the Parquet lake on, a webhook subscription with stored
//! payloads, a quarantined event and an export; the erasure; then every
//! store is searched for the person (the database row by row, the archives
//! line by line, the lake with pyarrow, the export) and holds nothing of
//! them, the certificate's counts match and verify, a retried event is a
//! duplicate and is not stored again, and everyone else is untouched.
//! Suppression and its lifting, the window, events still in the inbox when
//! the request is answered, typed refusals.

use std::{
    collections::HashSet,
    io::Read,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use chrono::{DateTime, DurationRound, Utc};
use fastack_api::StartOptions;
use fastack_core::{
    clock::ManualClock, crypto::hmac_hex, faults::Faults, objects::Objects, retention::Manifest,
};
use fastack_entities::{JobStatus, Plan};
use serde_json::{Value, json};
use sha2::Digest;
use uuid::Uuid;

use crate::helpers::{
    Backend, S3Bucket, TestApp, TestDb, bin_path, eventually, make_tenant, services_required,
    spawn_with,
};
use crate::webhooks::{ADMIN_TOKEN, Receiver};

fn at(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

fn sha256(s: &str) -> String {
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

/// A node with a manual clock, armed faults, the admin listener, private
/// webhook receivers allowed, the lake on (flushed at every round) and,
/// where configured, object storage on S3.
async fn app(
    backend: Backend,
    now: &str,
    s3: Option<&S3Bucket>,
) -> Option<(TestApp, Arc<ManualClock>, Arc<Faults>, PathBuf)> {
    let db = Arc::new(TestDb::new(backend).await?);
    let lake = db.dir.path().join("lake");
    let clock = ManualClock::new(at(now));
    let faults = Faults::new();
    let options = StartOptions {
        clock: clock.clone(),
        faults: faults.clone(),
        ..StartOptions::default()
    };
    let url = format!("file://{}", lake.display());
    let app = spawn_with(db, options, |c| {
        crate::webhooks::tweak(c);
        crate::mirror::mirror_on(c, url, 1, std::time::Duration::from_secs(60));
        c.process_max_attempts = 2;
        if let Some(b) = s3 {
            b.apply(c);
        }
    })
    .await;
    Some((app, clock, faults, lake))
}

async fn admin(app: &TestApp, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
    let url = crate::webhooks::admin_url(app, path);
    let mut req = app.http.request(method, url).bearer_auth(ADMIN_TOKEN);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let a = crate::helpers::answer(req.send().await.unwrap()).await;
    assert!(a.status < 300, "{path}: {} {}", a.status, a.body);
    a.body
}

/// Registers an endpoint of `tenant` (by name): (id, secret).
async fn register(app: &TestApp, tenant: &str, url: &str, events: &[&str]) -> (String, String) {
    let b = admin(
        app,
        reqwest::Method::POST,
        &format!("/admin/v1/tenants/{tenant}/webhooks"),
        Some(json!({"url": url, "events": events})),
    )
    .await;
    (
        b["id"].as_str().unwrap().to_owned(),
        b["secret"].as_str().unwrap().to_owned(),
    )
}

fn track(key: &str, user: Option<&str>, anon: Option<&str>, when: DateTime<Utc>) -> Value {
    let mut t = json!({
        "type": "track",
        "event": "Order Completed",
        "properties": {"total": 42.5, "email": "secret@example.com"},
        "occurred_at": when.to_rfc3339(),
        "idempotency_key": key,
    });
    if let Some(u) = user {
        t["user_id"] = json!(u);
    }
    if let Some(a) = anon {
        t["anonymous_id"] = json!(a);
    }
    t
}

fn identify(key: &str, user: &str, anon: &str, traits: Value, when: DateTime<Utc>) -> Value {
    json!({
        "type": "identify",
        "user_id": user,
        "anonymous_id": anon,
        "traits": traits,
        "occurred_at": when.to_rfc3339(),
        "idempotency_key": key,
    })
}

/// Sends a batch; the ids in order.
async fn batch(app: &TestApp, key: &str, items: Vec<Value>) -> Vec<String> {
    let a = app
        .post("/v1/core/batch", key, &json!({ "batch": items }))
        .await;
    assert_eq!(a.status, 202, "{}", a.body);
    a.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect()
}

const EVER: (&str, &str) = ("2020-01-01T00:00:00Z", "2100-01-01T00:00:00Z");

async fn events(app: &TestApp, key: &str) -> Vec<Value> {
    app.events(key, EVER.0, EVER.1, "").await
}

async fn wait_events(app: &TestApp, key: &str, n: usize) -> Vec<Value> {
    eventually(
        &format!("{n} events readable"),
        Duration::from_secs(30),
        || async {
            let e = events(app, key).await;
            (e.len() >= n).then_some(e)
        },
    )
    .await
}

async fn wait_job(app: &TestApp, key: &str, id: &str) -> Value {
    eventually(
        &format!("job {id} to end"),
        Duration::from_secs(90),
        || async {
            let a = app.get(&format!("/v1/core/jobs/{id}"), key).await;
            assert_eq!(a.status, 200, "{}", a.body);
            matches!(a.body["status"].as_str(), Some("completed" | "failed")).then_some(a.body)
        },
    )
    .await
}

/// Requests an erasure and waits for its job: the job document.
async fn erase(app: &TestApp, key: &str, body: Value) -> Value {
    let a = app.post("/v1/core/erasures", key, &body).await;
    assert_eq!(a.status, 202, "{}", a.body);
    let id = a.body["job_id"].as_str().unwrap().to_owned();
    let job = wait_job(app, key, &id).await;
    assert_eq!(job["status"], "completed", "{job}");
    assert_eq!(job["kind"], "erasure");
    job
}

/// The tenant's external HMAC key, as `fastack keys external-hmac` prints
/// it for a consumer.
fn tenant_key(app: &TestApp, tenant: &str) -> Vec<u8> {
    let out = std::process::Command::new(bin_path())
        .args(["keys", "external-hmac", "--tenant", tenant])
        .env_clear()
        .envs(app.db.env())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    hex::decode(String::from_utf8(out.stdout).unwrap().trim()).unwrap()
}

/// Checks a certificate's HMAC as a consumer would: the certificate
/// without `hmac` and `integrity`, keys sorted, no whitespace.
fn assert_signed(app: &TestApp, tenant: &str, cert: &Value) {
    let mut unsigned = cert.clone();
    let sig = unsigned["hmac"].as_str().unwrap().to_owned();
    assert_eq!(cert["integrity"]["signature"], sig.as_str());
    assert_eq!(cert["integrity"]["algorithm"], "HMAC-SHA256");
    let m = unsigned.as_object_mut().unwrap();
    m.remove("hmac");
    m.remove("integrity");
    let text = serde_json::to_string(&unsigned).unwrap();
    assert_eq!(hmac_hex(&tenant_key(app, tenant), &[text.as_bytes()]), sig);
}

/// Every row of every table of the node's database, as text (blobs that
/// are uuids in their hyphenated form), with its table.
async fn database_rows(app: &TestApp) -> Vec<(String, String)> {
    let mut out = Vec::new();
    match app.db.backend {
        Backend::Postgres => {
            let pool = app.db.pg_pool().await;
            let tables: Vec<String> = sqlx::query_scalar(
                "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            for t in tables {
                let rows: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT r::text FROM \"{t}\" r"
                )))
                .fetch_all(&pool)
                .await
                .unwrap();
                out.extend(rows.into_iter().map(|r| (t.clone(), r)));
            }
            pool.close().await;
        }
        Backend::Sqlite => {
            use sqlx::{Column, Row, TypeInfo, ValueRef};
            for file in ["fastack.db", "fastack-inbox.db"] {
                let path = app.db.dir.path().join(file);
                let url = format!("sqlite://{}?mode=ro", path.display());
                let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
                let tables: Vec<String> = sqlx::query_scalar(
                    "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY 1",
                )
                .fetch_all(&pool)
                .await
                .unwrap();
                for t in tables {
                    let rows = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT * FROM \"{t}\"")))
                        .fetch_all(&pool)
                        .await
                        .unwrap();
                    for row in rows {
                        let mut text = Vec::new();
                        for (i, c) in row.columns().iter().enumerate() {
                            let raw = row.try_get_raw(i).unwrap();
                            if raw.is_null() {
                                continue;
                            }
                            let kind = raw.type_info().name().to_owned();
                            let v = match kind.as_str() {
                                "TEXT" => row.get::<String, _>(i),
                                "BLOB" => {
                                    let b: Vec<u8> = row.get(i);
                                    match Uuid::from_slice(&b) {
                                        Ok(u) => u.to_string(),
                                        Err(_) => String::from_utf8_lossy(&b).into_owned(),
                                    }
                                }
                                _ => String::new(),
                            };
                            text.push(format!("{}={v}", c.name()));
                        }
                        out.push((t.clone(), text.join(" ")));
                    }
                }
                pool.close().await;
            }
        }
    }
    out
}

/// Every retention archive, decompressed, with its path.
async fn archives(objects: &Objects) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (path, _) in fastack_core::retention::archives(objects).await.unwrap() {
        let gz = objects.get(&path).await.unwrap();
        let mut plain = String::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_string(&mut plain)
            .unwrap();
        out.push((path, plain));
    }
    out
}

/// What pyarrow reads in the lake: (rows, distinct ids, rows of `tenant`,
/// rows of `tenant` carrying one of `ids`); `None` without a configured
/// Python with pyarrow (an error where services are required).
fn lake_check(root: &Path, tenant: &str, ids: &[&str]) -> Option<Value> {
    let Ok(python) = std::env::var("FASTACK_TEST_PYTHON") else {
        assert!(
            !services_required(),
            "FASTACK_TEST_PYTHON (a Python with pyarrow) is required with the services"
        );
        eprintln!("pyarrow check skipped: FASTACK_TEST_PYTHON is not set");
        return None;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/privacy/lake.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .arg(root)
        .arg(tenant)
        .args(ids)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

/// No version of the table that can still be read holds the people, nor
/// does its log or any Parquet object under its root; the latest version
/// is readable.
fn assert_no_version_holds_them(seen: &Value) {
    assert_eq!(seen["versions_with_them"], 0, "{seen}");
    assert!(seen["versions_readable"].as_u64() >= Some(1), "{seen}");
    assert_eq!(seen["log_mentions"], 0, "{seen}");
    assert_eq!(seen["files_with_them"], 0, "{seen}");
}

/// The lake's event ids, read with the parquet crate from every data file
/// under it (in a table or not).
fn lake_ids(root: &Path) -> Vec<String> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::RowAccessor;
    let mut ids = Vec::new();
    for file in crate::mirror::files_under(root) {
        let bytes = bytes::Bytes::from(std::fs::read(root.join(file)).unwrap());
        let reader = SerializedFileReader::new(bytes).unwrap();
        for row in reader.get_row_iter(None).unwrap() {
            ids.push(row.unwrap().get_string(0).unwrap().clone());
        }
    }
    ids
}

async fn wait_lake(root: &Path, ids: &HashSet<String>) {
    eventually(
        "the lake to hold every event",
        Duration::from_secs(30),
        || async {
            let have: HashSet<String> = lake_ids(root).into_iter().collect();
            ids.is_subset(&have).then_some(())
        },
    )
    .await
}

/// The person, their neighbour and everyone else, through every store.
async fn erasure_reaches_every_store(backend: Backend, s3: Option<&S3Bucket>) {
    let Some((app, clock, faults, lake)) = app(backend, "2025-01-10T12:00:00Z", s3).await else {
        return;
    };
    let shop = make_tenant(&app.store, "shop", Plan::Free, None).await;
    let other = app.t.clone();
    let hooks = Receiver::start(&[]).await;
    let (_, secret) = register(
        &app,
        "shop",
        &hooks.url(),
        &["core.event.tracked", "core.contact.erased", "job.completed"],
    )
    .await;
    let anon = format!("a-erase-{}", Uuid::new_v4().simple());
    let user = "u-erase";
    let mut all_ids: HashSet<String> = HashSet::new();
    let mut theirs: HashSet<String> = HashSet::new();
    let mut keep: HashSet<String> = HashSet::new();

    // January 2025, archived and dropped below: the person (their anonymous
    // id linked to their user id by an identify), a neighbour.
    let jan = at("2025-01-10T08:00:00Z");
    let ids = batch(
        &app,
        &shop.key,
        vec![
            track("jan-1", None, Some(&anon), jan),
            identify("jan-2", user, &anon, json!({"email": "p@example.com"}), jan),
            track("jan-3", Some(user), None, jan + chrono::Duration::hours(1)),
            track("jan-4", Some("u-keep"), None, jan),
            track(
                "jan-5",
                Some("u-keep"),
                None,
                jan + chrono::Duration::hours(2),
            ),
        ],
    )
    .await;
    theirs.extend(ids[..3].iter().cloned());
    keep.extend(ids[3..].iter().cloned());
    all_ids.extend(ids);
    // The same user id in another tenant is another person.
    let ids = batch(
        &app,
        &other.key,
        vec![
            track("o-1", Some(user), None, jan),
            track("o-2", Some(user), None, jan + chrono::Duration::days(1)),
        ],
    )
    .await;
    let others: HashSet<String> = ids.iter().cloned().collect();
    all_ids.extend(ids);
    wait_events(&app, &shop.key, 5).await;
    wait_lake(&lake, &all_ids).await;

    // Fourteen months later January is past the free plan's retention.
    clock.set(at("2026-03-02T12:00:00Z"));
    app.server
        .as_ref()
        .unwrap()
        .state()
        .runtime
        .maintain_partitions();
    eventually(
        "January archived and dropped",
        Duration::from_secs(60),
        || async {
            let jobs = app
                .store
                .jobs()
                .list(fastack_core::retention::SYSTEM_TENANT, None, 500)
                .await
                .unwrap();
            jobs.iter()
                .find(|j| {
                    j.params["partition"] == "tracked_events_y2025m01_r13"
                        && j.status == JobStatus::Completed
                })
                .map(|_| ())
        },
    )
    .await;

    // Three later months, each with the person and the neighbour.
    let mut stored_theirs = 0;
    for (n, month) in [
        "2025-06-15T10:00:00Z",
        "2025-12-15T10:00:00Z",
        "2026-02-15T10:00:00Z",
    ]
    .iter()
    .enumerate()
    {
        let t = at(month);
        let ids = batch(
            &app,
            &shop.key,
            vec![
                track(&format!("p-{n}-1"), Some(user), None, t),
                track(
                    &format!("p-{n}-2"),
                    None,
                    Some(&anon),
                    t + chrono::Duration::minutes(5),
                ),
                track(&format!("q-{n}-1"), Some("u-keep"), None, t),
            ],
        )
        .await;
        theirs.extend(ids[..2].iter().cloned());
        keep.insert(ids[2].clone());
        all_ids.extend(ids);
        stored_theirs += 2;
    }
    // One of the person's events refused by processing until quarantined.
    faults.fail_processing_of("p-poison");
    batch(
        &app,
        &shop.key,
        vec![track(
            "p-poison",
            Some(user),
            None,
            at("2026-02-20T10:00:00Z"),
        )],
    )
    .await;
    eventually(
        "the poison event quarantined",
        Duration::from_secs(30),
        || async {
            (app.store
                .quarantine()
                .list(shop.tenant.id, 10)
                .await
                .unwrap()
                .len()
                == 1)
                .then_some(())
        },
    )
    .await;
    faults.clear();
    let before = wait_events(&app, &shop.key, 3 + stored_theirs).await;
    assert_eq!(before.len(), 3 + stored_theirs, "{before:?}");
    wait_lake(&lake, &all_ids).await;
    // Every delivery of the person's events reached the receiver (their
    // payloads are stored).
    hooks
        .wait_hits(3 + stored_theirs + 5, Duration::from_secs(30))
        .await;
    // An export holding the person's events.
    let a = app
        .post(
            "/v1/core/exports",
            &shop.key,
            &json!({"from": "2025-02-01T00:00:00Z", "to": "2026-03-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(a.status, 202, "{}", a.body);
    let export = a.body["job_id"].as_str().unwrap().to_owned();
    let done = wait_job(&app, &shop.key, &export).await;
    assert_eq!(done["result"]["row_count"], 9, "{done}");
    let other_before = events(&app, &other.key).await;
    let contact = app
        .get(&format!("/v1/core/contacts?user_id={user}"), &shop.key)
        .await;
    assert_eq!(contact.status, 200, "{}", contact.body);
    let contact_id = contact.body["id"].as_str().unwrap().to_owned();

    // The erasure, named by the user id alone.
    let job = erase(
        &app,
        &shop.key,
        json!({"user_ids": [user], "metadata": {"ticket": "GDPR-1"}}),
    )
    .await;
    assert_eq!(job["metadata"]["ticket"], "GDPR-1");
    let cert = &job["result"];
    assert_signed(&app, &shop.tenant.id.to_string(), cert);
    assert_eq!(cert["request_id"], job["job_id"]);
    assert_eq!(cert["verification"]["found"], 0, "{cert}");
    let stores = &cert["stores"];
    assert_eq!(
        stores["tracked_events"]["events_removed"], stored_theirs,
        "{cert}"
    );
    assert_eq!(
        stores["tracked_events"]["by_month"],
        json!({"2025-06": 2, "2025-12": 2, "2026-02": 2}),
        "{cert}"
    );
    assert_eq!(stores["contacts"]["identities_removed"], 2, "{cert}");
    assert!(
        stores["contacts"]["contacts_removed"].as_u64().unwrap() >= 1,
        "{cert}"
    );
    assert_eq!(stores["quarantine"]["events_dropped"], 1, "{cert}");
    assert_eq!(stores["archives"]["events_removed"], 3, "{cert}");
    assert_eq!(stores["archives"]["objects_rewritten"], 1, "{cert}");
    assert_eq!(stores["exports"]["events_removed"], 6, "{cert}");
    assert_eq!(
        stores["lake"]["events_removed"],
        3 + stored_theirs,
        "{cert}"
    );
    assert_eq!(
        stores["webhooks"]["payloads_scrubbed"],
        3 + stored_theirs,
        "{cert}"
    );
    let mut subjects: Vec<(String, String)> = cert["subjects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["kind"].as_str().unwrap().to_owned(),
                s["sha256"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    subjects.sort();
    assert!(
        subjects.contains(&("user_id".into(), sha256(user))),
        "{subjects:?}"
    );
    assert!(subjects.contains(&("anonymous_id".into(), sha256(&anon))));
    assert!(subjects.contains(&("contact_id".into(), sha256(&contact_id))));

    // Every store searched for the person: the database row by row...
    let rows = database_rows(&app).await;
    for needle in [anon.as_str(), contact_id.as_str(), "p@example.com"] {
        let hits: Vec<&(String, String)> =
            rows.iter().filter(|(_, r)| r.contains(needle)).collect();
        assert!(hits.is_empty(), "{needle} still in the database: {hits:?}");
    }
    // (the user id only in the other tenant's rows)
    let other_id = other.tenant.id.to_string();
    for (table, row) in rows.iter().filter(|(_, r)| r.contains(user)) {
        assert!(row.contains(&other_id), "{user} in {table}: {row}");
    }
    // ... the archives line by line, their new manifest verified ...
    let objects = Objects::from_config(&app.server.as_ref().unwrap().state().config).unwrap();
    let shop_id = shop.tenant.id.to_string();
    let mut neighbours = 0;
    for (path, plain) in archives(&objects).await {
        for line in plain.lines() {
            let row: Value = serde_json::from_str(line).unwrap();
            if row["tenant_id"] == shop_id.as_str() {
                assert_ne!(row["user_id"], user, "{path}: {line}");
                assert_ne!(row["anonymous_id"], anon.as_str(), "{path}: {line}");
                neighbours += 1;
            }
        }
        let manifest_path = path.replace(".ndjson.gz", ".manifest.json");
        let manifest: Manifest =
            serde_json::from_slice(&objects.get(&manifest_path).await.unwrap()).unwrap();
        fastack_core::retention::verify(&objects, &path, &manifest_path, &manifest)
            .await
            .unwrap();
        if path.contains("y2025m01_r13") && manifest.rows > 0 {
            assert_eq!(manifest.erasures.len(), 1, "{manifest:?}");
        }
    }
    assert_eq!(neighbours, 2, "the neighbour's archived rows stay");
    // ... the export ...
    let result = app
        .get(&format!("/v1/core/jobs/{export}/result"), &shop.key)
        .await;
    assert_eq!(result.status, 200, "{}", result.body);
    let text = result.body.as_str().unwrap().to_owned();
    assert!(!text.contains(user) && !text.contains(&anon), "{text}");
    assert_eq!(text.lines().count(), 3);
    let export_job = wait_job(&app, &shop.key, &export).await;
    assert_eq!(export_job["result"]["row_count"], 3);
    assert_eq!(export_job["result"]["erasures"], json!([job["job_id"]]));
    // ... and the lake, with pyarrow.
    let expected_rows = all_ids.len() - theirs.len();
    if let Some(seen) = lake_check(&lake, &shop_id, &[user, &anon, &contact_id]) {
        assert_eq!(seen["theirs"], 0, "{seen}");
        assert_eq!(seen["rows"], expected_rows, "{seen}");
        assert_eq!(seen["distinct_ids"], expected_rows, "{seen}");
        assert_no_version_holds_them(&seen);
    }
    assert!(
        stores["lake"]["table_version"].as_u64() >= Some(1),
        "the commit that replaced the files: {cert}"
    );
    let lake_now: HashSet<String> = lake_ids(&lake).into_iter().collect();
    assert!(lake_now.is_disjoint(&theirs));
    assert!(keep.is_subset(&lake_now) && others.is_subset(&lake_now));

    // Nothing of the person is readable; everyone else is.
    let after = events(&app, &shop.key).await;
    let after_ids: HashSet<String> = after
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(after_ids.is_disjoint(&theirs));
    assert_eq!(after.len(), 3, "{after:?}");
    assert_eq!(events(&app, &other.key).await, other_before);
    let gone = app
        .get(&format!("/v1/core/contacts?user_id={user}"), &shop.key)
        .await;
    assert_eq!(gone.status, 404, "{}", gone.body);

    // Downstream was told: hashes and the request id, signed.
    let told = eventually(
        "core.contact.erased delivered",
        Duration::from_secs(30),
        || async {
            hooks
                .hits()
                .into_iter()
                .find(|h| h.header("webhook-event") == "core.contact.erased")
        },
    )
    .await;
    // Signed at the node's (manual) time: the signature is checked with
    // the Standard Webhooks library at that time, not against the wall
    // clock.
    let wh = standardwebhooks::Webhook::new(&secret).unwrap();
    let expected = wh
        .sign(
            &told.header("webhook-id"),
            told.header("webhook-timestamp").parse().unwrap(),
            &told.body,
        )
        .unwrap();
    assert!(
        told.header("webhook-signature")
            .split(' ')
            .any(|s| s == expected),
        "signature"
    );
    let body: Value = serde_json::from_slice(&told.body).unwrap();
    assert_eq!(body["request_id"], job["job_id"]);
    let text = String::from_utf8_lossy(&told.body).into_owned();
    assert!(!text.contains(user) && !text.contains(&anon), "{text}");
    assert!(text.contains(&sha256(user)));

    // A retry of an erased event is the duplicate it is, and stays erased.
    let again = batch(
        &app,
        &shop.key,
        vec![
            track("p-2-1", Some(user), None, at("2026-02-15T10:00:00Z")),
            track("q-late", Some("u-keep"), None, at("2026-02-16T10:00:00Z")),
        ],
    )
    .await;
    assert!(theirs.contains(&again[0]), "the original id answers");
    wait_events(&app, &shop.key, 4).await;
    let now: Vec<Value> = events(&app, &shop.key).await;
    assert_eq!(now.len(), 4, "{now:?}");
    assert!(
        now.iter()
            .all(|e| !theirs.contains(e["id"].as_str().unwrap()))
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_erasure_reaches_every_store() {
    erasure_reaches_every_store(Backend::Sqlite, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_erasure_reaches_every_store() {
    erasure_reaches_every_store(Backend::Postgres, None).await;
}

/// The production object storage path: archives and exports on S3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_erasure_rewrites_s3_archives() {
    let Some(bucket) = S3Bucket::create().await else {
        return;
    };
    erasure_reaches_every_store(Backend::Postgres, Some(&bucket)).await;
    let keys = bucket.keys().await;
    assert!(
        keys.iter()
            .any(|k| k.contains("archives/tracked_events/tracked_events_y2025m01_r13")),
        "{keys:?}"
    );
    assert!(
        keys.iter().all(|k| !k.contains("/erasures/")),
        "staged objects left behind: {keys:?}"
    );
}

async fn metric(app: &TestApp, name: &str, label: &str) -> f64 {
    app.metrics()
        .await
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn delete(app: &TestApp, path: &str, key: &str) -> crate::helpers::Answer {
    let resp = app
        .http
        .delete(app.url(path))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    crate::helpers::answer(resp).await
}

/// With `suppress`, the person's later events are answered 202 as any and
/// dropped by processing (counted per tenant) until the suppression is
/// lifted; suppressions are listed by hash, never by value.
async fn suppression_drops_until_lifted(app: TestApp) {
    let key = app.t.key.clone();
    let now = Utc::now() - chrono::Duration::hours(1);
    batch(
        &app,
        &key,
        vec![
            track("s-1", Some("u-sup"), None, now),
            track("n-1", Some("u-n"), None, now),
        ],
    )
    .await;
    wait_events(&app, &key, 2).await;
    let erased = app.get("/v1/core/contacts?user_id=u-sup", &key).await;
    assert_eq!(erased.status, 200, "{}", erased.body);
    let job = erase(&app, &key, json!({"user_ids": ["u-sup"], "suppress": true})).await;
    assert_eq!(job["result"]["suppressed"], true);
    assert_eq!(
        job["result"]["stores"]["tracked_events"]["events_removed"],
        1
    );
    let later = batch(
        &app,
        &key,
        vec![
            track(
                "s-2",
                Some("u-sup"),
                None,
                now + chrono::Duration::minutes(1),
            ),
            track(
                "s-3",
                Some("u-sup"),
                Some("a-new"),
                now + chrono::Duration::minutes(2),
            ),
            track("n-2", Some("u-n"), None, now + chrono::Duration::minutes(3)),
        ],
    )
    .await;
    // The neighbour's event after theirs is readable: processing has
    // passed the person's, and dropped them.
    let seen = wait_events(&app, &key, 2).await;
    let seen: HashSet<&str> = seen.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert!(seen.contains(later[2].as_str()));
    assert!(!seen.contains(later[0].as_str()) && !seen.contains(later[1].as_str()));
    let tenant = app.t.tenant.id.to_string();
    let label = format!("tenant=\"{tenant}\"");
    eventually("the drops counted", Duration::from_secs(10), || async {
        (metric(&app, "fastack_privacy_dropped_events_total", &label).await >= 2.0).then_some(())
    })
    .await;
    // Listed by hash, found by value.
    let list = app.get("/v1/core/suppressions", &key).await;
    assert_eq!(list.status, 200, "{}", list.body);
    let entries = list.body["suppressions"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{}", list.body);
    assert_eq!(entries[0]["kind"], "user_id");
    assert_eq!(entries[0]["sha256"], sha256("u-sup"));
    assert_eq!(entries[0]["request_id"], job["job_id"]);
    assert!(entries[0]["dropped"].as_i64().unwrap() >= 2);
    assert!(!list.body.to_string().contains("u-sup"));
    let one = app.get("/v1/core/suppressions?user_id=u-sup", &key).await;
    assert_eq!(one.body["suppressions"].as_array().unwrap().len(), 1);
    let none = app.get("/v1/core/suppressions?user_id=u-n", &key).await;
    assert_eq!(none.body["suppressions"].as_array().unwrap().len(), 0);
    let both = app
        .get("/v1/core/suppressions?user_id=a&anonymous_id=b", &key)
        .await;
    assert_eq!(both.status, 400);
    assert_eq!(both.body["code"], "invalid_query");
    // Lifted: their events are processed again.
    let lifted = delete(&app, "/v1/core/suppressions?user_id=u-sup", &key).await;
    assert_eq!(lifted.status, 200, "{}", lifted.body);
    assert_eq!(lifted.body["lifted"]["sha256"], sha256("u-sup"));
    let again = delete(&app, "/v1/core/suppressions?user_id=u-sup", &key).await;
    assert_eq!(again.status, 404, "{}", again.body);
    assert_eq!(again.body["code"], "not_found");
    let back = batch(
        &app,
        &key,
        vec![track(
            "s-4",
            Some("u-sup"),
            None,
            now + chrono::Duration::minutes(4),
        )],
    )
    .await;
    let seen = wait_events(&app, &key, 3).await;
    let event = seen.iter().find(|e| e["id"] == back[0].as_str()).unwrap();
    // They come back as someone new: a contact of their own, not the erased
    // one (which processing had met before the erasure).
    let contact = app.get("/v1/core/contacts?user_id=u-sup", &key).await;
    assert_eq!(contact.status, 200, "{}", contact.body);
    assert_ne!(contact.body["id"], erased.body["id"]);
    assert_eq!(event["contact_id"], contact.body["id"], "{event}");
    app.cleanup().await;
}

/// With a window, only what occurred in it goes — and the traits an erased
/// `identify` set; the contact and everything else stay.
async fn a_window_erases_only_what_was_sent_then(app: TestApp) {
    let key = app.t.key.clone();
    let t0 = (Utc::now() - chrono::Duration::hours(2))
        .duration_trunc(chrono::Duration::seconds(1))
        .unwrap();
    let ids = batch(
        &app,
        &key,
        vec![
            identify(
                "w-0",
                "u-w",
                "a-w",
                json!({"plan": "pro"}),
                t0 - chrono::Duration::hours(1),
            ),
            track("w-1", Some("u-w"), None, t0),
            identify(
                "w-2",
                "u-w",
                "a-w",
                json!({"ssn": "078-05-1120"}),
                t0 + chrono::Duration::minutes(1),
            ),
            track("w-3", None, Some("a-w"), t0 + chrono::Duration::minutes(30)),
        ],
    )
    .await;
    wait_events(&app, &key, 4).await;
    let contact = app.get("/v1/core/contacts?user_id=u-w", &key).await;
    assert_eq!(
        contact.body["traits"]["ssn"], "078-05-1120",
        "{}",
        contact.body
    );
    let from = t0.to_rfc3339();
    let to = (t0 + chrono::Duration::minutes(10)).to_rfc3339();
    let job = erase(
        &app,
        &key,
        json!({"anonymous_ids": ["a-w"], "from": from, "to": to}),
    )
    .await;
    let cert = &job["result"];
    assert_eq!(
        cert["stores"]["tracked_events"]["events_removed"], 2,
        "{cert}"
    );
    assert_eq!(cert["stores"]["contacts"]["contacts_removed"], 0, "{cert}");
    assert_eq!(cert["stores"]["contacts"]["traits_removed"], 1, "{cert}");
    assert!(cert["window"]["from"].is_string(), "{cert}");
    let left: Vec<String> = events(&app, &key)
        .await
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(left, vec![ids[0].clone(), ids[3].clone()]);
    let contact = app.get("/v1/core/contacts?user_id=u-w", &key).await;
    assert_eq!(contact.status, 200, "the contact stays: {}", contact.body);
    assert_eq!(contact.body["traits"], json!({"plan": "pro"}));
    app.cleanup().await;
}

/// A malformed request is a typed 4xx; a person fastack does not know
/// completes with zero counts; 5,000 identifiers are one request.
async fn requests_are_checked_and_strangers_complete_empty(app: TestApp) {
    let key = app.t.key.clone();
    let post = |body: Value| {
        let app = &app;
        let key = key.clone();
        async move { app.post("/v1/core/erasures", &key, &body).await }
    };
    let a = post(json!({})).await;
    assert_eq!(
        (a.status, a.body["code"].as_str()),
        (422, Some("invalid_payload"))
    );
    assert_eq!(a.body["errors"][0]["code"], "required");
    let a = post(json!({"user_ids": "u-1"})).await;
    assert_eq!(a.body["errors"][0]["field"], "/user_ids");
    let a = post(json!({"user_ids": ["u-1"], "contact_ids": ["nope"], "x": 1})).await;
    let fields: Vec<&str> = a.body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["/contact_ids/0", "/x"], "{}", a.body);
    let many: Vec<String> = (0..5_001).map(|i| format!("u-{i}")).collect();
    let a = post(json!({"user_ids": many})).await;
    assert_eq!(a.status, 422, "{}", a.body);
    assert_eq!(a.body["errors"][0]["code"], "too_many_identifiers");
    let a = post(
        json!({"user_ids": ["u-1"], "from": "2026-02-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}),
    )
    .await;
    assert_eq!(a.body["errors"][0]["field"], "/to");
    let raw = app
        .post_raw("/v1/core/erasures", &key, b"{\"user_ids\": [".to_vec())
        .await;
    assert_eq!(
        (raw.status, raw.body["code"].as_str()),
        (400, Some("invalid_json"))
    );
    let a = app
        .post("/v1/core/erasures", "nope", &json!({"user_ids": ["u"]}))
        .await;
    assert_eq!(a.status, 401);

    let job = erase(
        &app,
        &key,
        json!({"user_ids": ["nobody"], "contact_ids": [Uuid::now_v7()]}),
    )
    .await;
    let stores = &job["result"]["stores"];
    assert_eq!(stores["tracked_events"]["events_removed"], 0);
    assert_eq!(stores["contacts"]["contacts_removed"], 0);
    assert_eq!(job["result"]["verification"]["found"], 0);
    // 5,000 people in one request: 4,990 strangers and ten who exist.
    let now = Utc::now() - chrono::Duration::minutes(30);
    let ten: Vec<Value> = (0..10)
        .map(|i| track(&format!("m-{i}"), Some(&format!("many-{i}")), None, now))
        .collect();
    batch(&app, &key, ten).await;
    wait_events(&app, &key, 10).await;
    let people: Vec<String> = (0..5_000).map(|i| format!("many-{i}")).collect();
    let job = erase(&app, &key, json!({"user_ids": people})).await;
    assert_eq!(
        job["result"]["stores"]["tracked_events"]["events_removed"],
        10
    );
    assert_eq!(job["result"]["subjects"].as_array().unwrap().len(), 5_010);
    assert!(events(&app, &key).await.is_empty());
    app.cleanup().await;
}

/// Events of the person accepted before the request and still waiting in
/// the inbox when it is answered are erased too: processing drops them,
/// and the erasure waits until it has.
async fn events_still_in_the_inbox_are_erased_too(app: TestApp) {
    let key = app.t.key.clone();
    let now = Utc::now() - chrono::Duration::minutes(30);
    batch(&app, &key, vec![track("i-0", Some("u-n"), None, now)]).await;
    wait_events(&app, &key, 1).await;
    crate::helpers::lease(&app, true).await;
    let waiting = batch(
        &app,
        &key,
        vec![
            track("i-1", Some("u-in"), None, now),
            track("i-2", None, Some("a-in"), now),
            identify("i-3", "u-in", "a-in", json!({}), now),
            track("i-4", Some("u-n"), None, now),
        ],
    )
    .await;
    let a = app
        .post("/v1/core/erasures", &key, &json!({"user_ids": ["u-in"]}))
        .await;
    assert_eq!(a.status, 202, "{}", a.body);
    let id = a.body["job_id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let job = app.get(&format!("/v1/core/jobs/{id}"), &key).await;
    assert!(
        matches!(job.body["status"].as_str(), Some("queued" | "processing")),
        "the erasure waits for processing: {}",
        job.body
    );
    crate::helpers::lease(&app, false).await;
    let job = wait_job(&app, &key, &id).await;
    assert_eq!(job["status"], "completed", "{job}");
    // `a-in` was linked to `u-in` only by an identify still waiting: its
    // lone event is the person's too.
    let cert = &job["result"];
    assert_eq!(cert["stores"]["inbox"]["events_dropped"], 3, "{cert}");
    assert_eq!(
        cert["stores"]["tracked_events"]["events_removed"], 0,
        "{cert}"
    );
    let left: HashSet<String> = wait_events(&app, &key, 2)
        .await
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.contains(&waiting[3]));
    app.cleanup().await;
}

crate::on_both_backends!(
    suppression_drops_until_lifted,
    a_window_erases_only_what_was_sent_then,
    requests_are_checked_and_strangers_complete_empty,
    events_still_in_the_inbox_are_erased_too,
);

/// The objects an erasure recorded, with their state (the test looks at
/// the table: the API shows only a finished erasure's certificate).
async fn recorded_objects(db: &TestDb) -> Vec<(String, String)> {
    let sql = "SELECT store, entry FROM erasure_objects";
    match db.backend {
        Backend::Postgres => {
            let pool = db.pg_pool().await;
            let rows: Vec<(String, Value)> = sqlx::query_as(sql).fetch_all(&pool).await.unwrap();
            pool.close().await;
            rows.into_iter()
                .map(|(s, e)| (s, e["state"].as_str().unwrap_or_default().to_owned()))
                .collect()
        }
        Backend::Sqlite => {
            let path = db.dir.path().join("fastack.db");
            let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=ro", path.display()))
                .await
                .unwrap();
            let rows: Vec<(String, String)> = sqlx::query_as(sql).fetch_all(&pool).await.unwrap();
            pool.close().await;
            rows.into_iter()
                .map(|(s, e)| {
                    let e: Value = serde_json::from_str(&e).unwrap();
                    (s, e["state"].as_str().unwrap_or_default().to_owned())
                })
                .collect()
        }
    }
}

/// A node's tenant API, from outside.
struct Remote {
    base: String,
    key: String,
    http: reqwest::Client,
}

impl Remote {
    fn of(node: &crate::helpers::Node, key: &str) -> Remote {
        Remote {
            base: format!("http://{}", node.addr),
            key: key.to_owned(),
            http: reqwest::Client::new(),
        }
    }

    async fn post(&self, path: &str, body: &Value) -> crate::helpers::Answer {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.key)
            .json(body)
            .send()
            .await
            .unwrap();
        crate::helpers::answer(resp).await
    }

    async fn get(&self, path: &str) -> crate::helpers::Answer {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.key)
            .send()
            .await
            .unwrap();
        crate::helpers::answer(resp).await
    }

    /// The job once it ended, which must be completed.
    async fn completed(&self, id: &str, within: Duration) -> Value {
        let job = eventually("the job to end", within, || async {
            let a = self.get(&format!("/v1/core/jobs/{id}")).await;
            matches!(a.body["status"].as_str(), Some("completed" | "failed")).then_some(a.body)
        })
        .await;
        assert_eq!(job["status"], "completed", "{job}");
        job
    }

    async fn count(&self) -> usize {
        let mut n = 0;
        let mut cursor = String::new();
        loop {
            let a = self
                .get(&format!(
                    "/v1/core/events?from={}&to={}&limit=1000{cursor}",
                    crate::helpers::urlenc(EVER.0),
                    crate::helpers::urlenc(EVER.1)
                ))
                .await;
            assert_eq!(a.status, 200, "{}", a.body);
            n += a.body["events"].as_array().unwrap().len();
            match a.body["next_cursor"].as_str() {
                Some(c) => cursor = format!("&cursor={c}"),
                None => return n,
            }
        }
    }
}

/// `kill -9` of the node while its erasure is rewriting the lake (part of
/// the files staged, none yet put in place by the table's commit): the job is
/// claimed again after its claim expires and completes; every count of
/// the certificate is whole, none doubled, and nothing of the person is
/// left anywhere.
async fn an_erasure_killed_midway_completes(backend: Backend) {
    use crate::helpers::Node;
    const HOURS: usize = 400;
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let store = db.store().await;
    let t = make_tenant(&store, "shop", Plan::Enterprise, None).await;
    drop(store);
    let lake = db.dir.path().join("lake");
    let url = format!("file://{}", lake.display());
    let env = [
        ("FASTACK_LEASE_TTL_MS", "2000"),
        ("FASTACK_MIRROR_URL", url.as_str()),
        ("FASTACK_MIRROR_FLUSH_ROWS", "1000"),
        ("FASTACK_MIRROR_FLUSH_SECS", "1"),
    ];
    let mut node = Node::start(&db, &env).await;
    let api = Remote::of(&node, &t.key);
    // The person and a neighbour, an event each an hour: a lake file an
    // hour, each to be written again without the person.
    let start = (Utc::now() - chrono::Duration::hours(HOURS as i64 + 1))
        .duration_trunc(chrono::Duration::hours(1))
        .unwrap();
    let mut all = HashSet::new();
    for chunk in (0..HOURS).collect::<Vec<_>>().chunks(200) {
        let items: Vec<Value> = chunk
            .iter()
            .flat_map(|h| {
                let at = start + chrono::Duration::hours(*h as i64) + chrono::Duration::minutes(7);
                [
                    track(&format!("p-{h}"), Some("u-kill"), None, at),
                    track(&format!("n-{h}"), Some("u-stay"), None, at),
                ]
            })
            .collect();
        let a = api.post("/v1/core/batch", &json!({ "batch": items })).await;
        assert_eq!(a.status, 202, "{}", a.body);
        all.extend(
            a.body["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["id"].as_str().unwrap().to_owned()),
        );
    }
    wait_lake(&lake, &all).await;
    let a = api
        .post("/v1/core/erasures", &json!({"user_ids": ["u-kill"]}))
        .await;
    assert_eq!(a.status, 202, "{}", a.body);
    let id = a.body["job_id"].as_str().unwrap().to_owned();
    let at_kill = eventually(
        "the lake rewrite part way",
        Duration::from_secs(60),
        || async {
            let objects = recorded_objects(&db).await;
            // Files staged without the person, not yet put in place by
            // the table's one commit.
            let staged = objects.iter().filter(|(s, _)| s == "lake").count();
            (staged >= 5).then_some(objects)
        },
    )
    .await;
    node.child.start_kill().expect("SIGKILL");
    let _ = node.child.wait().await;
    let done = at_kill.iter().filter(|(_, st)| st == "done").count();
    assert!(
        done < HOURS,
        "the erasure finished before the kill: raise HOURS ({done} files done)"
    );
    let staged = at_kill.iter().filter(|(s, _)| s == "lake").count();
    println!(
        "erasure kill -9 ({backend:?}): {staged} of {HOURS} lake files staged, {done} in place at the kill"
    );
    node = Node::start(&db, &env).await;
    let api = Remote::of(&node, &t.key);
    // The dead node's claim expires after 30 s; the job is run again.
    let job = api.completed(&id, Duration::from_secs(120)).await;
    let stores = &job["result"]["stores"];
    assert_eq!(
        stores["tracked_events"]["events_removed"], HOURS,
        "{stores}"
    );
    assert_eq!(stores["lake"]["events_removed"], HOURS, "{stores}");
    assert_eq!(stores["lake"]["files_rewritten"], HOURS, "{stores}");
    assert_eq!(job["result"]["verification"]["found"], 0);
    assert_eq!(api.count().await, HOURS);
    let left = lake_ids(&lake);
    assert_eq!(left.len(), HOURS, "each other event once");
    assert_eq!(left.iter().collect::<HashSet<_>>().len(), HOURS);
    if let Some(seen) = lake_check(&lake, &t.tenant.id.to_string(), &["u-kill"]) {
        assert_eq!(seen["theirs"], 0, "{seen}");
        assert_eq!(seen["rows"], HOURS, "{seen}");
        assert_no_version_holds_them(&seen);
    }
    node.terminate().await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_an_erasure_killed_midway_completes() {
    an_erasure_killed_midway_completes(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_erasure_killed_midway_completes() {
    an_erasure_killed_midway_completes(Backend::Postgres).await;
}

/// An erasure while the lake is compacted every second over many small
/// files of the person and a neighbour: whichever commits first (a
/// compaction that lost a file is dropped; an erasure that lost one lists
/// again), no readable version, log entry or object holds the person
/// after it, and the neighbour's events are in the table once each.
async fn an_erasure_racing_a_compaction_leaves_nothing(backend: Backend) {
    use crate::helpers::Node;
    const EVENTS: usize = 600;
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let store = db.store().await;
    let t = make_tenant(&store, "shop", Plan::Enterprise, None).await;
    drop(store);
    let lake = db.dir.path().join("lake");
    let url = format!("file://{}", lake.display());
    let env = [
        ("FASTACK_MIRROR_URL", url.as_str()),
        ("FASTACK_MIRROR_FLUSH_ROWS", "20"),
        ("FASTACK_MIRROR_FLUSH_SECS", "1"),
        ("FASTACK_MIRROR_MAINTAIN_SECS", "1"),
    ];
    let node = Node::start(&db, &env).await;
    let api = Remote::of(&node, &t.key);
    let start = (Utc::now() - chrono::Duration::hours(6))
        .duration_trunc(chrono::Duration::hours(1))
        .unwrap();
    let mut all = HashSet::new();
    let mut others = HashSet::new();
    // Small requests, one after another: many small files to compact.
    for chunk in (0..EVENTS).collect::<Vec<_>>().chunks(20) {
        let items: Vec<Value> = chunk
            .iter()
            .map(|i| {
                let at = start + chrono::Duration::minutes(*i as i64);
                let user = if i % 3 == 0 { "u-race" } else { "u-stay" };
                track(&format!("r-{i}"), Some(user), None, at)
            })
            .collect();
        let a = api.post("/v1/core/batch", &json!({ "batch": items })).await;
        assert_eq!(a.status, 202, "{}", a.body);
        for (i, item) in chunk.iter().zip(a.body["items"].as_array().unwrap()) {
            let id = item["id"].as_str().unwrap().to_owned();
            if i % 3 != 0 {
                others.insert(id.clone());
            }
            all.insert(id);
        }
    }
    wait_lake(&lake, &all).await;
    let a = api
        .post("/v1/core/erasures", &json!({"user_ids": ["u-race"]}))
        .await;
    assert_eq!(a.status, 202, "{}", a.body);
    let id = a.body["job_id"].as_str().unwrap().to_owned();
    let job = api.completed(&id, Duration::from_secs(120)).await;
    assert_eq!(job["result"]["verification"]["found"], 0, "{job}");
    // A round or two more of compaction after the erasure.
    tokio::time::sleep(Duration::from_secs(2)).await;
    if let Some(seen) = lake_check(&lake, &t.tenant.id.to_string(), &["u-race"]) {
        assert_eq!(seen["theirs"], 0, "{seen}");
        assert_eq!(seen["rows"], others.len(), "{seen}");
        assert_eq!(seen["distinct_ids"], others.len(), "{seen}");
        assert_no_version_holds_them(&seen);
    }
    let compacted = node
        .log
        .lock()
        .iter()
        .filter(|l| l.contains("lake table kept"))
        .count();
    println!(
        "erasure racing compaction ({backend:?}): {compacted} maintenance rounds changed the table"
    );
    node.terminate().await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_an_erasure_racing_a_compaction_leaves_nothing() {
    an_erasure_racing_a_compaction_leaves_nothing(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_erasure_racing_a_compaction_leaves_nothing() {
    an_erasure_racing_a_compaction_leaves_nothing(Backend::Postgres).await;
}

/// Two nodes take the person's and a neighbour's events without pause
/// while one of them runs a suppressing erasure: whichever node processes
/// the tenant and whichever runs the job, not one of the person's events
/// is stored — those accepted before the answer are erased, those after
/// suppressed — and every one of the neighbour's is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_let_nothing_slip_past_an_erasure() {
    use crate::helpers::Node;
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let store = db.store().await;
    let t = make_tenant(&store, "shop", Plan::Enterprise, None).await;
    drop(store);
    let env = [("FASTACK_LEASE_TTL_MS", "2000")];
    let (a, b) = tokio::join!(Node::start(&db, &env), Node::start(&db, &env));
    let nodes = [Remote::of(&a, &t.key), Remote::of(&b, &t.key)];
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender = |n: usize| {
        let api = Remote::of(if n == 0 { &a } else { &b }, &t.key);
        let stop = stop.clone();
        async move {
            let mut ours = Vec::new();
            let mut round = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let at = Utc::now() - chrono::Duration::minutes(5);
                let items = vec![
                    track(&format!("p-{n}-{round}"), Some("u-slip"), None, at),
                    identify(
                        &format!("i-{n}-{round}"),
                        "u-slip",
                        &format!("a-slip-{n}-{round}"),
                        json!({}),
                        at,
                    ),
                    track(&format!("q-{n}-{round}"), Some("u-stay"), None, at),
                ];
                let r = api.post("/v1/core/batch", &json!({ "batch": items })).await;
                if r.status == 202 {
                    ours.push(r.body["items"][2]["id"].as_str().unwrap().to_owned());
                }
                round += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            ours
        }
    };
    let senders = tokio::spawn({
        let (s0, s1) = (sender(0), sender(1));
        async move {
            let (x, y) = tokio::join!(s0, s1);
            x.into_iter().chain(y).collect::<Vec<String>>()
        }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = nodes[1]
        .post(
            "/v1/core/erasures",
            &json!({"user_ids": ["u-slip"], "suppress": true}),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    let id = r.body["job_id"].as_str().unwrap().to_owned();
    let job = nodes[0].completed(&id, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let kept = senders.await.unwrap();
    // Everything accepted is processed: every neighbour's event readable.
    eventually(
        "every neighbour's event stored",
        Duration::from_secs(60),
        || async { (nodes[0].count().await >= kept.len()).then_some(()) },
    )
    .await;
    let pool = db.pg_pool().await;
    let theirs: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM tracked_events WHERE occurred_at > now() - interval '1 day' \
         AND (user_id = 'u-slip' OR anonymous_id LIKE 'a-slip-%')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(theirs, 0, "events of the person slipped past the erasure");
    assert_eq!(nodes[0].count().await, kept.len());
    let dropped = job["result"]["stores"]["inbox"]["events_dropped"]
        .as_u64()
        .unwrap();
    let removed = job["result"]["stores"]["tracked_events"]["events_removed"]
        .as_u64()
        .unwrap();
    println!(
        "two nodes: {} neighbour events kept; the erasure removed {removed} stored events and processing dropped {dropped} while it ran",
        kept.len()
    );
    assert!(
        removed > 0,
        "some of the person's events were stored before the request"
    );
    pool.close().await;
    let (_, _) = tokio::join!(a.terminate(), b.terminate());
    db.drop_db().await;
}

/// Downstream over RabbitMQ: the person's events still owed to the broker
/// (it was away) are never sent; `core.contact.erased` is, a signed
/// CloudEvent on the core exchange carrying hashes and the request id; the
/// job's `job.completed` carries the certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owed_events_are_not_sent_and_the_broker_is_told() {
    use crate::amqp::{consumer, delete_exchanges, rabbit_reachable, streaming_app};
    if !rabbit_reachable().await {
        return;
    }
    let proxy = crate::netfault::Proxy::start("127.0.0.1:5672".parse().unwrap()).await;
    let Some((app, names)) = streaming_app(Backend::Postgres, Some(proxy.amqp_url()), |_| {}).await
    else {
        return;
    };
    let key = app.t.key.clone();
    let mut core = consumer(&names.core, &["core.event.tracked", "core.contact.erased"]).await;
    let mut jobs = consumer(&names.job, &["job.completed"]).await;
    let now = Utc::now() - chrono::Duration::minutes(10);
    batch(&app, &key, vec![track("b-0", Some("u-amqp"), None, now)]).await;
    let first = core
        .next(Duration::from_secs(15))
        .await
        .expect("the link works");
    assert_eq!(first.routing_key, "core.event.tracked");
    // The consumer can see the message before the relay has recorded the
    // broker's confirm: cut only once nothing is owed.
    crate::helpers::eventually(
        "the first event's outbox row settled",
        Duration::from_secs(15),
        || async {
            let owed = app
                .store
                .outbox()
                .depth(fastack_core::store::SinkName("amqp"))
                .await
                .unwrap();
            (owed == 0).then_some(())
        },
    )
    .await;
    // The broker away: these stay owed.
    proxy.cut();
    let owed = batch(
        &app,
        &key,
        vec![
            track("b-1", Some("u-amqp"), None, now),
            track("b-2", Some("u-amqp"), Some("a-amqp"), now),
            track("b-3", Some("u-other"), None, now),
        ],
    )
    .await;
    wait_events(&app, &key, 4).await;
    let job = erase(&app, &key, json!({"user_ids": ["u-amqp"]})).await;
    let cert = &job["result"];
    assert_eq!(cert["stores"]["outbox"]["rows_cancelled"], 2, "{cert}");
    assert_eq!(
        cert["stores"]["tracked_events"]["events_removed"], 3,
        "{cert}"
    );
    proxy.restore();
    let mut got = Vec::new();
    while !got
        .iter()
        .any(|m: &crate::amqp::Received| m.routing_key == "core.contact.erased")
    {
        let more = core.next(Duration::from_secs(30)).await;
        got.push(more.expect("core.contact.erased after the broker came back"));
    }
    // Whatever else was owed comes with it.
    got.extend(core.drain(Duration::from_secs(2)).await);
    let sent: HashSet<String> = got
        .iter()
        .filter(|m| m.routing_key == "core.event.tracked")
        .map(|m| m.header("ce-subject"))
        .collect();
    assert!(
        sent.contains(&owed[2]),
        "the neighbour's owed event is sent"
    );
    assert!(
        !sent.contains(&owed[0]) && !sent.contains(&owed[1]),
        "{sent:?}"
    );
    let told = got
        .iter()
        .find(|m| m.routing_key == "core.contact.erased")
        .unwrap();
    let request = job["job_id"].as_str().unwrap();
    assert_eq!(told.header("ce-type"), "io.fastack.contact.erased");
    assert_eq!(
        told.header("ce-id"),
        format!("fastack.contact.erased.{request}")
    );
    assert_eq!(told.header("ce-subject"), request);
    assert_eq!(told.header("ce-resourcetype"), "contact");
    assert_eq!(told.header("ce-eventtype"), "erased");
    let deployment_key = deployment_hmac(&app);
    fastack_core::amqp::verify(
        &deployment_key,
        &told.headers,
        &told.exchange,
        &told.routing_key,
        &told.body,
        Utc::now(),
    )
    .expect("signature verifies");
    let body = told.json();
    assert_eq!(body["request_id"], request);
    let text = String::from_utf8_lossy(&told.body).into_owned();
    assert!(
        !text.contains("u-amqp") && !text.contains("a-amqp"),
        "{text}"
    );
    assert!(text.contains(&sha256("u-amqp")) && text.contains(&sha256("a-amqp")));
    let done = loop {
        let m = jobs
            .next(Duration::from_secs(20))
            .await
            .expect("job.completed");
        if m.header("ce-subject") == request {
            break m;
        }
    };
    assert_eq!(done.json()["result"]["hmac"], cert["hmac"]);
    delete_exchanges(&names).await;
    app.cleanup().await;
}

/// The deployment's external HMAC key (verifies AMQP signatures).
fn deployment_hmac(app: &TestApp) -> Vec<u8> {
    let out = std::process::Command::new(bin_path())
        .args(["keys", "external-hmac"])
        .env_clear()
        .envs(app.db.env())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    hex::decode(String::from_utf8(out.stdout).unwrap().trim()).unwrap()
}

/// The operator's way: `fastack admin erasure request … --here` runs the
/// erasure in the command and prints the certificate; `erasure list`,
/// `erasure show`, `suppression list` and `suppression lift` the rest.
async fn the_cli_erases_and_lifts(app: TestApp) {
    use crate::helpers::fastack_cli;
    let key = app.t.key.clone();
    let now = Utc::now() - chrono::Duration::minutes(5);
    batch(
        &app,
        &key,
        vec![
            track("c-1", Some("u-cli"), None, now),
            track("c-2", Some("u-other"), None, now),
        ],
    )
    .await;
    wait_events(&app, &key, 2).await;
    let db = app.stop().await;
    let (ok, out, err) = fastack_cli(
        &db,
        &[
            "admin",
            "--json",
            "erasure",
            "request",
            "--tenant",
            "acme",
            "--user-id",
            "u-cli",
            "--suppress",
            "--here",
        ],
    );
    assert!(ok, "{err}");
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["status"], "completed", "{doc}");
    assert_eq!(
        doc["result"]["stores"]["tracked_events"]["events_removed"],
        1
    );
    assert!(
        !err.contains("u-cli"),
        "the identifier is never logged: {err}"
    );
    let id = doc["job_id"].as_str().unwrap();
    let (ok, out, err) = fastack_cli(&db, &["admin", "erasure", "list", "--tenant", "acme"]);
    assert!(ok, "{err}");
    assert!(out.contains(id) && out.contains("completed"), "{out}");
    let (ok, out, _) = fastack_cli(
        &db,
        &[
            "admin", "--json", "erasure", "show", "--tenant", "acme", "--job", id,
        ],
    );
    assert!(ok);
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["job_id"], id);
    let (ok, out, _) = fastack_cli(
        &db,
        &[
            "admin",
            "suppression",
            "list",
            "--tenant",
            "acme",
            "--user-id",
            "u-cli",
        ],
    );
    assert!(ok);
    assert!(out.contains(&sha256("u-cli")), "{out}");
    let (ok, _, err) = fastack_cli(
        &db,
        &[
            "admin",
            "suppression",
            "lift",
            "--tenant",
            "acme",
            "--user-id",
            "u-cli",
        ],
    );
    assert!(ok, "{err}");
    let (ok, _, err) = fastack_cli(
        &db,
        &[
            "admin",
            "suppression",
            "lift",
            "--tenant",
            "acme",
            "--user-id",
            "u-cli",
        ],
    );
    assert!(!ok && err.contains("not found"), "{err}");
    // A request the rules refuse names why.
    let (ok, _, err) = fastack_cli(&db, &["admin", "erasure", "request", "--tenant", "acme"]);
    assert!(!ok && err.contains("name at least one person"), "{err}");
    db.drop_db().await;
}

crate::on_both_backends!(the_cli_erases_and_lifts);

/// The admin listener offers the same: an operator's erasure request (the
/// tenant API's body), the tenant's requests, its suppressions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_erases_and_lifts() {
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let app = crate::helpers::spawn_on(Arc::new(db), crate::webhooks::tweak).await;
    let key = app.t.key.clone();
    batch(
        &app,
        &key,
        vec![track("ad-1", Some("u-adm"), None, Utc::now())],
    )
    .await;
    wait_events(&app, &key, 1).await;
    let queued = admin(
        &app,
        reqwest::Method::POST,
        "/admin/v1/tenants/acme/erasures",
        Some(json!({"user_ids": ["u-adm"], "suppress": true})),
    )
    .await;
    let id = queued["job_id"].as_str().unwrap().to_owned();
    let job = wait_job(&app, &key, &id).await;
    assert_eq!(job["status"], "completed", "{job}");
    let list = admin(
        &app,
        reqwest::Method::GET,
        "/admin/v1/tenants/acme/erasures",
        None,
    )
    .await;
    assert_eq!(list[0]["job_id"], id.as_str());
    let s = admin(
        &app,
        reqwest::Method::GET,
        "/admin/v1/tenants/acme/suppressions?user_id=u-adm",
        None,
    )
    .await;
    assert_eq!(s[0]["sha256"], sha256("u-adm"));
    admin(
        &app,
        reqwest::Method::DELETE,
        "/admin/v1/tenants/acme/suppressions?user_id=u-adm",
        None,
    )
    .await;
    let s = admin(
        &app,
        reqwest::Method::GET,
        "/admin/v1/tenants/acme/suppressions",
        None,
    )
    .await;
    assert_eq!(s, json!([]));
    let refused = app
        .http
        .post(crate::webhooks::admin_url(
            &app,
            "/admin/v1/tenants/acme/erasures",
        ))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"user_ids": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 422);
    app.cleanup().await;
}
