//! Upgrades: a database written by a released build, opened by this one.
//! The fixtures under `tests/fixtures/release/<release>/` were made by that
//! release's binary (`tests/fixtures/release/make.py`): its SQLite file, a
//! `pg_dump` of its PostgreSQL database, and what it answered about them.
//! This build migrates them on start and must answer the same: events,
//! contacts, jobs and webhook endpoints, with the tenant's old API key; and
//! it must go on accepting events into them.

use std::{path::PathBuf, sync::Arc, time::Duration};

use chrono::Utc;
use serde_json::{Value, json};

use crate::helpers::{Backend, TestApp, TestDb, eventually, spawn_on, urlenc};

/// The release whose data the current build must read.
const RELEASE: &str = "4a2c129";

fn fixture(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/release")
        .join(RELEASE)
        .join(file)
}

fn expected(backend: Backend) -> Value {
    let all: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("expected.json")).unwrap()).unwrap();
    all[match backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
    }]
    .clone()
}

/// Since that release, an event's absent `user_id`/`anonymous_id` is left
/// out instead of `null` (the documented schema); the rest is byte-equal.
fn without_null_fields(mut v: Value) -> Value {
    if let Some(map) = v.as_object_mut() {
        map.retain(|_, v| !v.is_null());
    }
    v
}

/// When the event owed at the upgrade happened: before the release's
/// events (its range starts 2026-09-01), long before those sent after it.
fn owed_at() -> chrono::DateTime<Utc> {
    "2026-08-15T12:00:00Z".parse().unwrap()
}

async fn upgraded(backend: Backend) -> Option<TestApp> {
    let db = TestDb::new(backend).await?;
    match backend {
        Backend::Sqlite => {
            let path = db.config().sqlite_path();
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::copy(fixture("sqlite.db"), &path).unwrap();
        }
        Backend::Postgres => {
            let dump = std::fs::read_to_string(fixture("postgres.sql")).unwrap();
            let pool = db.pg_pool().await;
            sqlx::raw_sql(sqlx::AssertSqlSafe(dump))
                .execute(&pool)
                .await
                .expect("restoring the release's dump");
            pool.close().await;
        }
    }
    owe_rows_in_the_old_schema(&db, backend).await;
    Some(spawn_on(Arc::new(db), |_| {}).await)
}

/// Two outbox rows still owed when the release stopped, in its schema (a
/// flag and a claim column per consumer): one to the AMQP relay, one to the
/// webhook fan-out. After the upgrade each is owed to its sink by name.
async fn owe_rows_in_the_old_schema(db: &TestDb, backend: Backend) {
    let want = expected(backend);
    let tenant = want["tenant"]["id"].as_str().unwrap().to_owned();
    let job = want["job"]["job_id"].as_str().unwrap().to_owned();
    let row = |ce: &str, publish: bool| match backend {
        Backend::Postgres => format!(
            "INSERT INTO outbox (tenant_id, topic, routing_key, ce_id, subject, body, job_id, \
               created_at, publish_pending, fanout_pending) \
             VALUES ('{tenant}', 'job', 'job.completed', '{ce}', '{job}', '{{}}', '{job}', now(), {publish}, {})",
            !publish
        ),
        Backend::Sqlite => format!(
            "INSERT INTO outbox (tenant_id, topic, routing_key, ce_id, subject, body, job_id, \
               created_at, publish_pending, fanout_pending) \
             VALUES (x'{}', 'job', 'job.completed', '{ce}', '{job}', '{{}}', x'{}', 0, {}, {})",
            tenant.replace('-', ""),
            job.replace('-', ""),
            publish as i32,
            !publish as i32
        ),
    };
    // And an event the release accepted but had not processed yet.
    let owed = json!({
        "kind": "track", "event": "Owed At Upgrade", "user_id": "user-owed",
        "anonymous_id": null, "properties": {"n": 1},
        "occurred_at": owed_at().to_rfc3339(), "idempotency_key": "owed-at-upgrade"
    })
    .to_string();
    let event_id = uuid::Uuid::now_v7();
    let inbox = match backend {
        Backend::Postgres => format!(
            "INSERT INTO inbox (tenant_id, event_id, payload, received_at) \
             VALUES ('{tenant}', '{event_id}', '{owed}', now())"
        ),
        Backend::Sqlite => format!(
            "INSERT INTO inbox (tenant_id, event_id, payload, received_at) \
             VALUES (x'{}', x'{}', '{owed}', {})",
            tenant.replace('-', ""),
            event_id.simple(),
            Utc::now().timestamp_micros()
        ),
    };
    let statements = [
        row("upgrade-amqp", true),
        row("upgrade-webhooks", false),
        inbox,
    ];
    match backend {
        Backend::Postgres => {
            let pool = db.pg_pool().await;
            for sql in statements {
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(&pool)
                    .await
                    .unwrap();
            }
            pool.close().await;
        }
        Backend::Sqlite => {
            let url = format!("sqlite://{}", db.config().sqlite_path().display());
            let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
            for sql in statements {
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(&pool)
                    .await
                    .unwrap();
            }
            pool.close().await;
        }
    }
}

async fn reads_what_the_release_wrote(backend: Backend) {
    let Some(app) = upgraded(backend).await else {
        return;
    };
    let want = expected(backend);
    let key = want["key"].as_str().unwrap();
    let (from, to) = (
        want["range"][0].as_str().unwrap(),
        want["range"][1].as_str().unwrap(),
    );

    // Events: the same ids, contacts, properties (numbers exact), offsets.
    let events = app.events(key, from, to, "").await;
    let old: Vec<Value> = want["events"]
        .as_array()
        .unwrap()
        .iter()
        .cloned()
        .map(without_null_fields)
        .collect();
    assert_eq!(events, old);

    // The contact the release resolved, found by its user id.
    let contact = app
        .get(
            &format!("/v1/core/contacts?user_id={}", urlenc("user-1")),
            key,
        )
        .await;
    assert_eq!(contact.status, 200, "{}", contact.body);
    assert_eq!(contact.body, want["contact"]);
    let by_id = app
        .get(
            &format!(
                "/v1/core/contacts/{}",
                want["contact"]["id"].as_str().unwrap()
            ),
            key,
        )
        .await;
    assert_eq!(by_id.body, want["contact"]);

    // The finished export, byte for byte the document its event carried.
    let job_id = want["job"]["job_id"].as_str().unwrap();
    let job = app.get(&format!("/v1/core/jobs/{job_id}"), key).await;
    assert_eq!(job.status, 200, "{}", job.body);
    assert_eq!(job.body, want["job"]);

    // Rows owed at the upgrade: the one for the relay is still owed (no
    // broker here); the one for the fan-out became a delivery.
    assert_eq!(
        app.store
            .outbox()
            .depth(fastack_core::store::SinkName("amqp"))
            .await
            .unwrap(),
        1
    );
    let tenant_id = app.t.tenant.id;
    eventually("the owed fan-out", Duration::from_secs(20), || async {
        app.store
            .deliveries()
            .list(tenant_id, None, None, 100)
            .await
            .unwrap()
            .iter()
            .any(|d| d.ce_id == "upgrade-webhooks")
            .then_some(())
    })
    .await;

    // The event accepted by the release and still in its inbox is stored.
    let (f, t) = (
        (owed_at() - chrono::Duration::hours(1)).to_rfc3339(),
        (owed_at() + chrono::Duration::hours(1)).to_rfc3339(),
    );
    let owed = eventually("the owed event", Duration::from_secs(20), || async {
        let ev = app.events(key, &f, &t, "").await;
        (!ev.is_empty()).then_some(ev)
    })
    .await;
    assert_eq!(owed.len(), 1, "{owed:?}");
    assert_eq!(owed[0]["event"], "Owed At Upgrade");
    assert_eq!(app.store.processing().inbox_stats().await.unwrap().0, 0);

    // Endpoints as the admin surface lists them.
    let endpoints = serde_json::to_value(app.store.endpoints().list(None).await.unwrap()).unwrap();
    assert_eq!(endpoints, want["endpoints"]);

    // And the upgraded database takes new events: a retry of an old key is
    // still a duplicate of the old event, a new key is appended.
    let first = &want["events"][0];
    let again = app
        .post(
            "/v1/core/track",
            key,
            &json!({
                "anonymous_id": "anon-1",
                "event": "Page Viewed",
                "properties": {"path": "/pricing", "ref": null},
                "occurred_at": "2026-10-15T08:30:00+05:30",
                "idempotency_key": "fx-1",
            }),
        )
        .await;
    assert_eq!(again.status, 202, "{}", again.body);
    assert_eq!(
        again.body["duplicate"],
        json!(true),
        "a retry answers the original"
    );
    assert_eq!(again.body["id"], first["id"]);
    let now = Utc::now();
    let fresh = app
        .post(
            "/v1/core/track",
            key,
            &json!({
                "user_id": "user-1",
                "event": "After Upgrade",
                "occurred_at": now.to_rfc3339(),
                "idempotency_key": "after-upgrade",
            }),
        )
        .await;
    assert_eq!(fresh.status, 202, "{}", fresh.body);
    let (f, t) = (
        (now - chrono::Duration::hours(1)).to_rfc3339(),
        (now + chrono::Duration::hours(1)).to_rfc3339(),
    );
    let read = eventually("the new event", Duration::from_secs(20), || async {
        let ev = app.events(key, &f, &t, "").await;
        (!ev.is_empty()).then_some(ev)
    })
    .await;
    assert_eq!(read[0]["id"], fresh.body["id"]);
    // Identity resolution goes on from the old contacts.
    assert_eq!(read[0]["contact_id"], want["contact"]["id"]);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_reads_what_the_release_wrote() {
    reads_what_the_release_wrote(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reads_what_the_release_wrote() {
    reads_what_the_release_wrote(Backend::Postgres).await;
}

/// A node of this release restarting after a newer release migrated the
/// database (a migration it does not know is applied) starts on the
/// expanded schema and says so, instead of refusing: the rolling upgrade
/// after this one.
async fn a_newer_schema_does_not_stop_this_release(backend: Backend) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    drop(db.store().await);
    const FUTURE: &str = "INSERT INTO seaql_migrations (version, applied_at) \
                          VALUES ('m20991231_000001_from_a_newer_release', 0)";
    match backend {
        Backend::Postgres => {
            sqlx::query(FUTURE)
                .execute(&db.pg_pool().await)
                .await
                .unwrap();
        }
        Backend::Sqlite => {
            let path = db.dir.path().join("fastack.db");
            let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display()))
                .await
                .unwrap();
            sqlx::query(FUTURE).execute(&pool).await.unwrap();
            pool.close().await;
        }
    }
    let app = spawn_on(Arc::new(db), |_| {}).await;
    let a = app
        .post(
            "/v1/core/track",
            &app.t.key,
            &crate::helpers::track("newer-schema", "u", Utc::now()),
        )
        .await;
    assert_eq!(a.status, 202, "{}", a.body);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_a_newer_schema_does_not_stop_this_release() {
    a_newer_schema_does_not_stop_this_release(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_newer_schema_does_not_stop_this_release() {
    a_newer_schema_does_not_stop_this_release(Backend::Postgres).await;
}
