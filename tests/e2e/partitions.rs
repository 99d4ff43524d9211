//! Monthly partitions and retention (seed 003, acceptance 6 and 7): a month
//! rollover and a backfill leave DEFAULT empty; partitions past retention
//! are archived as gzip NDJSON, verified from storage, then dropped; a
//! corrupted upload keeps the partition; tenants keep exactly their plan's
//! retention. Time is a manual clock: nothing here waits for a month.

use std::{
    io::Read,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use chrono::{DateTime, Utc};
use fastack_api::StartOptions;
use fastack_core::{
    clock::ManualClock,
    objects::Objects,
    retention::{Manifest, SYSTEM_TENANT},
};
use fastack_entities::{JobStatus, Plan};
use serde_json::{Value, json};

use crate::helpers::{
    Backend, S3Bucket, TestApp, TestDb, eventually, make_tenant, spawn_with, track,
};
use crate::ingest::{default_partition_rows, partition_of};

fn at(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

async fn app_at(
    backend: Backend,
    now: &str,
    objects: Option<Objects>,
) -> Option<(TestApp, Arc<ManualClock>)> {
    app_at_with(backend, now, objects, None).await
}

async fn app_at_with(
    backend: Backend,
    now: &str,
    objects: Option<Objects>,
    s3: Option<&S3Bucket>,
) -> Option<(TestApp, Arc<ManualClock>)> {
    let db = Arc::new(TestDb::new(backend).await?);
    let clock = ManualClock::new(at(now));
    let options = StartOptions {
        clock: clock.clone(),
        objects,
        ..StartOptions::default()
    };
    let app = spawn_with(db, options, |c| {
        if let Some(b) = s3 {
            b.apply(c);
        }
    })
    .await;
    Some((app, clock))
}

async fn tables(app: &TestApp) -> Vec<String> {
    app.store
        .partitions()
        .list(false)
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.table)
        .collect()
}

async fn month_rollover_and_backfill_leave_default_empty(backend: Backend) {
    let Some((app, clock)) = app_at(backend, "2027-01-31T23:50:00Z", None).await else {
        return;
    };
    // Ahead of time: the current month and the next two exist at start.
    let t = tables(&app).await;
    for m in ["y2027m01", "y2027m02", "y2027m03"] {
        assert!(
            t.contains(&format!("tracked_events_{m}_r37")),
            "{m} missing: {t:?}"
        );
    }
    assert!(!t.iter().any(|x| x.contains("y2027m04")));

    let key = app.t.key.clone();
    let before = app
        .post(
            "/v1/core/track",
            &key,
            &track("jan", "u", at("2027-01-31T23:55:00Z")),
        )
        .await;
    let after = app
        .post(
            "/v1/core/track",
            &key,
            &track("feb", "u", at("2027-02-01T00:05:00+01:00")),
        )
        .await;
    let late = app
        .post(
            "/v1/core/track",
            &key,
            &track("feb-utc", "u", at("2027-02-01T00:05:00Z")),
        )
        .await;
    // A device that was offline for months sends a backfill.
    let backfill = app
        .post(
            "/v1/core/track",
            &key,
            &track("oct", "u", at("2026-10-15T08:00:00Z")),
        )
        .await;
    for a in [&before, &after, &late, &backfill] {
        assert_eq!(a.status, 202, "{}", a.body);
    }
    let from = "2026-09-01T00:00:00Z";
    let to = "2027-03-01T00:00:00Z";
    eventually("four events processed", Duration::from_secs(20), || async {
        (app.events(&key, from, to, "").await.len() == 4).then_some(())
    })
    .await;
    let id = |a: &crate::helpers::Answer| a.body["id"].as_str().unwrap().to_owned();
    assert_eq!(
        partition_of(&app, &id(&before)).await,
        "tracked_events_y2027m01_r37"
    );
    // 00:05 at +01:00 is still January in UTC.
    assert_eq!(
        partition_of(&app, &id(&after)).await,
        "tracked_events_y2027m01_r37"
    );
    assert_eq!(
        partition_of(&app, &id(&late)).await,
        "tracked_events_y2027m02_r37"
    );
    assert_eq!(
        partition_of(&app, &id(&backfill)).await,
        "tracked_events_y2026m10_r37"
    );

    // The clock crosses into February: the manager adds the month after next.
    clock.set(at("2027-02-01T00:10:00Z"));
    app.server
        .as_ref()
        .unwrap()
        .state()
        .runtime
        .maintain_partitions();
    eventually("April created ahead", Duration::from_secs(10), || async {
        tables(&app)
            .await
            .contains(&"tracked_events_y2027m04_r37".to_owned())
            .then_some(())
    })
    .await;
    let now = app
        .post(
            "/v1/core/track",
            &key,
            &track("feb-2", "u", at("2027-02-01T00:09:00Z")),
        )
        .await;
    assert_eq!(now.status, 202);
    eventually("fifth event", Duration::from_secs(20), || async {
        (app.events(&key, from, to, "").await.len() == 5).then_some(())
    })
    .await;
    if backend == Backend::Postgres {
        assert_eq!(default_partition_rows(&app).await, 0, "DEFAULT stays empty");
    }
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_month_rollover_and_backfill_leave_default_empty() {
    month_rollover_and_backfill_leave_default_empty(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_month_rollover_and_backfill_leave_default_empty() {
    month_rollover_and_backfill_leave_default_empty(Backend::Sqlite).await;
}

async fn send(
    app: &TestApp,
    key: &str,
    prefix: &str,
    n: usize,
    when: DateTime<Utc>,
) -> Vec<String> {
    let items: Vec<Value> = (0..n)
        .map(|i| {
            let mut t = track(
                &format!("{prefix}-{i}"),
                &format!("{prefix}-user-{}", i % 4),
                when + chrono::Duration::minutes(i as i64),
            );
            t["type"] = json!("track");
            t
        })
        .collect();
    let a = app
        .post("/v1/core/batch", key, &json!({"batch": items}))
        .await;
    assert_eq!(a.status, 202, "{}", a.body);
    a.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect()
}

async fn retention_jobs(app: &TestApp) -> Vec<fastack_entities::Job> {
    app.store
        .jobs()
        .list(SYSTEM_TENANT, None, 100)
        .await
        .unwrap()
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .expect("valid gzip");
    out
}

async fn retention_archives_then_drops_per_plan(backend: Backend, s3: Option<&S3Bucket>) {
    let Some((app, clock)) = app_at_with(backend, "2025-01-10T12:00:00Z", None, s3).await else {
        return;
    };
    let free = make_tenant(&app.store, "free-co", Plan::Free, None).await;
    let pro = make_tenant(&app.store, "pro-co", Plan::Pro, None).await;
    let january = at("2025-01-10T08:00:00Z");
    let free_ids = send(&app, &free.key, "f", 30, january).await;
    let pro_ids = send(&app, &pro.key, "p", 20, january).await;
    let range = ("2025-01-01T00:00:00Z", "2025-02-01T00:00:00Z");
    eventually("events processed", Duration::from_secs(20), || async {
        let f = app.events(&free.key, range.0, range.1, "").await.len();
        let p = app.events(&pro.key, range.0, range.1, "").await.len();
        (f == 30 && p == 20).then_some(())
    })
    .await;

    // 14 months later: January 2025 is past the free plan's 13 months, not
    // past pro's 25.
    clock.set(at("2026-03-02T00:00:00Z"));
    app.server
        .as_ref()
        .unwrap()
        .state()
        .runtime
        .maintain_partitions();
    let job = eventually(
        "the retention job to finish",
        Duration::from_secs(30),
        || async {
            retention_jobs(&app).await.into_iter().find(|j| {
                j.status.is_terminal() && j.params["partition"] == "tracked_events_y2025m01_r13"
            })
        },
    )
    .await;
    assert_eq!(job.status, JobStatus::Completed, "{:?}", job.metadata);
    assert_eq!(job.params["partition"], "tracked_events_y2025m01_r13");
    let result = job.result.clone().unwrap();
    assert_eq!(result["row_count"], 30);
    assert_eq!(result["dropped"], true);

    // The archive is readable gzip NDJSON whose rows are the partition's.
    let objects = Objects::from_config(&app.server.as_ref().unwrap().state().config).unwrap();
    let gz = objects.get(result["path"].as_str().unwrap()).await.unwrap();
    let plain = gunzip(&gz);
    let rows: Vec<Value> = plain
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 30);
    let mut archived: Vec<String> = rows
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect();
    let mut expected = free_ids.clone();
    archived.sort();
    expected.sort();
    assert_eq!(archived, expected);
    assert!(
        rows.iter()
            .all(|r| r["tenant_id"] == free.tenant.id.to_string())
    );
    assert_eq!(rows[0]["retention_class"], 13);
    assert!(
        rows[0]["occurred_at"]
            .as_str()
            .unwrap()
            .starts_with("2025-01-10")
    );
    let manifest: Manifest = serde_json::from_slice(
        &objects
            .get(result["manifest"].as_str().unwrap())
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(manifest.rows, 30);
    assert_eq!(manifest.compressed_sha256, hex::encode(sha2_digest(&gz)));
    assert_eq!(
        manifest.uncompressed_sha256,
        hex::encode(sha2_digest(&plain))
    );

    // Free: gone, exactly at its retention. Pro: kept.
    let t = tables(&app).await;
    assert!(
        !t.contains(&"tracked_events_y2025m01_r13".to_owned()),
        "{t:?}"
    );
    assert!(t.contains(&"tracked_events_y2025m01_r25".to_owned()));
    assert!(app.events(&free.key, range.0, range.1, "").await.is_empty());
    let kept = app.events(&pro.key, range.0, range.1, "").await;
    assert_eq!(kept.len(), 20);
    assert!(
        kept.iter()
            .all(|e| pro_ids.contains(&e["id"].as_str().unwrap().to_owned()))
    );
    if backend == Backend::Postgres {
        assert_eq!(default_partition_rows(&app).await, 0);
    }
    // Every retention job concerned a 13-month partition (the empty months
    // created ahead in 2024/2025 went the same way).
    let jobs = retention_jobs(&app).await;
    assert!(
        jobs.iter().all(|j| j.params["retention_class"] == 13),
        "{jobs:?}"
    );
    app.cleanup().await;
}

fn sha2_digest(bytes: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_retention_archives_then_drops_per_plan() {
    retention_archives_then_drops_per_plan(Backend::Postgres, None).await;
}

/// The production storage path: archive, verify and drop against an
/// S3-compatible bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_retention_archives_to_s3() {
    let Some(bucket) = S3Bucket::create().await else {
        return;
    };
    retention_archives_then_drops_per_plan(Backend::Postgres, Some(&bucket)).await;
    // The archive and its manifest are in the bucket, under the prefix.
    let keys = bucket.keys().await;
    assert!(
        keys.iter()
            .any(|k| k.starts_with("fastack/") && k.ends_with(".ndjson.gz")),
        "{keys:?}"
    );
    assert!(
        keys.iter().any(|k| k.ends_with("manifest.json")),
        "{keys:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_retention_archives_then_drops_per_plan() {
    retention_archives_then_drops_per_plan(Backend::Sqlite, None).await;
}

async fn corrupted_upload_keeps_the_partition(backend: Backend) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let db = Arc::new(db);
    // Storage that flips one bit of every chunk while `corrupt` is set.
    let corrupt = Arc::new(AtomicBool::new(false));
    let flag = corrupt.clone();
    let objects = Objects::from_config(&db.config())
        .unwrap()
        .with_write_fault(Arc::new(move |bytes: &mut Vec<u8>| {
            if flag.load(Ordering::SeqCst) && !bytes.is_empty() {
                let mid = bytes.len() / 2;
                bytes[mid] ^= 0x01;
            }
        }));
    let clock = ManualClock::new(at("2025-01-10T12:00:00Z"));
    let app = spawn_with(
        db,
        StartOptions {
            clock: clock.clone(),
            objects: Some(objects),
            ..StartOptions::default()
        },
        |_| {},
    )
    .await;
    let free = make_tenant(&app.store, "free-co", Plan::Free, None).await;
    send(&app, &free.key, "c", 10, at("2025-01-10T08:00:00Z")).await;
    eventually("events processed", Duration::from_secs(20), || async {
        (app.events(
            &free.key,
            "2025-01-01T00:00:00Z",
            "2025-02-01T00:00:00Z",
            "",
        )
        .await
        .len()
            == 10)
            .then_some(())
    })
    .await;

    corrupt.store(true, Ordering::SeqCst);
    clock.set(at("2026-03-02T00:00:00Z"));
    let runtime = &app.server.as_ref().unwrap().state().runtime;
    runtime.maintain_partitions();
    let ours = |j: &fastack_entities::Job| j.params["partition"] == "tracked_events_y2025m01_r13";
    let failed = eventually(
        "the retention job to fail",
        Duration::from_secs(30),
        || async {
            retention_jobs(&app)
                .await
                .into_iter()
                .find(|j| ours(j) && j.status == JobStatus::Failed)
        },
    )
    .await;
    let reason = failed.metadata["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        reason.contains("corrupt")
            && (reason.contains("does not match") || reason.contains("differs")),
        "{reason}"
    );
    assert!(
        tables(&app)
            .await
            .contains(&"tracked_events_y2025m01_r13".to_owned()),
        "partition kept"
    );
    let part = app
        .store
        .partitions()
        .list(true)
        .await
        .unwrap()
        .into_iter()
        .find(|p| p.table == "tracked_events_y2025m01_r13")
        .unwrap();
    assert_eq!(part.rows, 10, "every row still there");

    // Storage healthy again: the next run archives and drops it.
    corrupt.store(false, Ordering::SeqCst);
    runtime.maintain_partitions();
    let done = eventually("a retry to complete", Duration::from_secs(30), || async {
        retention_jobs(&app)
            .await
            .into_iter()
            .find(|j| ours(j) && j.status == JobStatus::Completed)
    })
    .await;
    assert_eq!(done.result.unwrap()["row_count"], 10);
    assert!(
        !tables(&app)
            .await
            .contains(&"tracked_events_y2025m01_r13".to_owned())
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_corrupted_upload_keeps_the_partition() {
    corrupted_upload_keeps_the_partition(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_corrupted_upload_keeps_the_partition() {
    corrupted_upload_keeps_the_partition(Backend::Sqlite).await;
}

/// `fastack admin partitions list` and `admin retention run [--dry-run]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_partitions_and_retention_cli() {
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let store = db.store().await;
    let t = make_tenant(&store, "old-co", Plan::Free, None).await;
    // A partition from long ago with rows in it (written as the processor
    // would, through the store).
    let old = fastack_core::store::PartitionKey {
        month: fastack_core::store::Month {
            year: 2020,
            month: 3,
        },
        retention_class: 13,
    };
    store.partitions().ensure(&[old]).await.unwrap();
    drop(store);
    let path = db.dir.path().join("fastack.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite:{}", path.display()))
        .await
        .unwrap();
    for i in 0..5i64 {
        sqlx::query(
            "INSERT INTO tracked_events_y2020m03_r13 (tenant_id, occurred_at, id, retention_class, kind, event, \
             contact_id, user_id, anonymous_id, properties, occurred_offset_s, received_at, idempotency_key) \
             VALUES ($1, $2, $3, 13, 'track', 'Old', $4, 'u', NULL, '{}', 0, $2, $5)",
        )
        .bind(t.tenant.id.0)
        .bind(at("2020-03-10T00:00:00Z").timestamp_micros() + i)
        .bind(uuid::Uuid::now_v7())
        .bind(uuid::Uuid::now_v7())
        .bind(format!("old-{i}"))
        .execute(&pool)
        .await
        .unwrap();
    }
    pool.close().await;
    let run = |args: &[&str]| crate::helpers::fastack_cli(&db, args);
    let (ok, out, err) = run(&["admin", "partitions", "list"]);
    assert!(ok, "{err}");
    let line = out
        .lines()
        .find(|l| l.contains("tracked_events_y2020m03_r13"))
        .expect("listed");
    assert!(
        line.contains("2020-03-01")
            && line.contains("2020-04-01")
            && line.contains("13m")
            && line.contains(" 5 ")
            && line.ends_with("due"),
        "{line}"
    );
    let (ok, out, _) = run(&["admin", "--json", "partitions", "list"]);
    assert!(ok);
    let parts: Value = serde_json::from_str(&out).unwrap();
    assert!(
        parts
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["table"] == "tracked_events_y2020m03_r13" && p["rows"] == 5)
    );

    let (ok, out, err) = run(&["admin", "retention", "run", "--dry-run"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("would archive and drop tracked_events_y2020m03_r13 (5 rows"),
        "{out}"
    );
    let (ok, _, _) = run(&["admin", "partitions", "list"]);
    assert!(ok);

    let (ok, out, err) = run(&["admin", "retention", "run"]);
    assert!(ok, "{err}");
    assert!(out.contains("tracked_events_y2020m03_r13: 5 rows archived to archives/tracked_events/tracked_events_y2020m03_r13/"), "{out}");
    assert!(out.contains("verified, dropped"));
    let (_, out, _) = run(&["admin", "partitions", "list"]);
    assert!(!out.contains("tracked_events_y2020m03_r13"));
    let (ok, out, _) = run(&["admin", "retention", "run"]);
    assert!(ok);
    assert!(out.contains("nothing to do"), "{out}");
}
