//! The accept path: 202s, idempotency, time, batches and bad input.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{Datelike, Utc};
use futures::future::join_all;
use serde_json::{Value, json};

use crate::helpers::{Backend, TestApp, eventually, track};
use crate::on_both_backends;

on_both_backends!(
    accepted_event_is_readable_with_its_offset,
    hundred_concurrent_copies_make_one_row,
    same_key_other_payload_is_a_conflict,
    hour_ago_lands_in_its_month_sorted_by_occurred_at,
    batch_of_500_is_accepted_501_is_not,
    batch_is_all_or_nothing,
    bad_input_gets_typed_problems,
    duplicate_across_track_and_batch,
    cold_cache_groups_mixing_old_and_new_keys,
    revoked_key_stops_working,
    an_expired_key_is_looked_up_once,
);

fn range_around_now() -> (String, String) {
    let now = Utc::now();
    (
        (now - chrono::Duration::days(40)).to_rfc3339(),
        (now + chrono::Duration::days(2)).to_rfc3339(),
    )
}

async fn wait_for_events(app: &TestApp, n: usize) -> Vec<Value> {
    let (from, to) = range_around_now();
    eventually(
        "events to be processed",
        Duration::from_secs(20),
        || async {
            let evs = app.events(&app.t.key, &from, &to, "").await;
            (evs.len() >= n).then_some(evs)
        },
    )
    .await
}

async fn accepted_event_is_readable_with_its_offset(app: TestApp) {
    let body = json!({
        "event": "Signed Up",
        "anonymous_id": "anon-1",
        "properties": {"plan": "pro", "seats": 3},
        "occurred_at": "2026-11-29T23:30:00.250+05:30",
        "idempotency_key": "signup-1",
        "sent_at": "2026-11-29T23:30:01+05:30"
    });
    let a = app.post("/v1/core/track", &app.t.key, &body).await;
    assert_eq!(a.status, 202, "{}", a.body);
    assert_eq!(a.body["duplicate"], false);
    let id = a.body["id"].as_str().unwrap().to_owned();

    let evs = wait_for_events(&app, 1).await;
    assert_eq!(evs.len(), 1);
    let e = &evs[0];
    assert_eq!(e["id"], id);
    assert_eq!(e["type"], "track");
    assert_eq!(e["event"], "Signed Up");
    assert_eq!(e["anonymous_id"], "anon-1");
    assert_eq!(e["properties"], json!({"plan": "pro", "seats": 3}));
    assert_eq!(e["occurred_at"], "2026-11-29T23:30:00.250+05:30");
    assert!(e["received_at"].as_str().unwrap().ends_with('Z'));
    assert!(e["contact_id"].as_str().is_some());
    app.cleanup().await;
}

async fn hundred_concurrent_copies_make_one_row(app: TestApp) {
    let body = track("order-100", "u-100", Utc::now());
    let answers = join_all((0..100).map(|_| app.post("/v1/core/track", &app.t.key, &body))).await;
    let ids: HashSet<String> = answers
        .iter()
        .map(|a| {
            assert_eq!(a.status, 202, "{}", a.body);
            a.body["id"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(ids.len(), 1, "every copy answers the original id");
    let fresh = answers
        .iter()
        .filter(|a| a.body["duplicate"] == false)
        .count();
    assert_eq!(fresh, 1, "exactly one copy is new, 99 are duplicates");

    // One more, after the fact, also answers the original.
    let late = app.post("/v1/core/track", &app.t.key, &body).await;
    assert_eq!(late.body["duplicate"], true);
    assert!(ids.contains(late.body["id"].as_str().unwrap()));

    let evs = wait_for_events(&app, 1).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (from, to) = range_around_now();
    let evs_again = app.events(&app.t.key, &from, &to, "").await;
    assert_eq!(evs.len(), 1);
    assert_eq!(evs_again.len(), 1, "one row, also after processing settles");
    app.cleanup().await;
}

async fn same_key_other_payload_is_a_conflict(app: TestApp) {
    let now = Utc::now();
    let a = app
        .post("/v1/core/track", &app.t.key, &track("k", "u1", now))
        .await;
    assert_eq!(a.status, 202);
    let mut other = track("k", "u1", now);
    other["properties"]["total"] = json!(43);
    let b = app.post("/v1/core/track", &app.t.key, &other).await;
    assert_eq!(b.status, 409, "{}", b.body);
    assert_eq!(b.body["code"], "idempotency_key_conflict");
    assert_eq!(
        b.headers["content-type"].to_str().unwrap(),
        "application/problem+json"
    );
    // sent_at is not part of the comparison.
    let mut resent = track("k", "u1", now);
    resent["sent_at"] = json!(Utc::now().to_rfc3339());
    let c = app.post("/v1/core/track", &app.t.key, &resent).await;
    assert_eq!(c.status, 202);
    assert_eq!(c.body["duplicate"], true);
    assert_eq!(c.body["id"], a.body["id"]);
    app.cleanup().await;
}

async fn hour_ago_lands_in_its_month_sorted_by_occurred_at(app: TestApp) {
    let now = Utc::now();
    let hour_ago = now - chrono::Duration::hours(1);
    let first = app
        .post("/v1/core/track", &app.t.key, &track("late", "pos-1", now))
        .await;
    let second = app
        .post(
            "/v1/core/track",
            &app.t.key,
            &track("offline", "pos-1", hour_ago),
        )
        .await;
    assert_eq!(first.status, 202);
    assert_eq!(second.status, 202);
    let evs = wait_for_events(&app, 2).await;
    // Sorted by occurred_at, not by arrival.
    assert_eq!(evs[0]["id"], second.body["id"]);
    assert_eq!(evs[1]["id"], first.body["id"]);

    // Stored in the partition of its occurred_at month.
    let table = partition_of(&app, second.body["id"].as_str().unwrap()).await;
    let expected = format!(
        "tracked_events_y{:04}m{:02}_r37",
        hour_ago.year(),
        hour_ago.month()
    );
    assert_eq!(table, expected);
    if app.db.backend == Backend::Postgres {
        assert_eq!(default_partition_rows(&app).await, 0);
    }
    app.cleanup().await;
}

/// The table holding an event.
pub async fn partition_of(app: &TestApp, id: &str) -> String {
    let id: uuid::Uuid = id.parse().unwrap();
    match app.db.backend {
        Backend::Postgres => {
            let pool = app.db.pg_pool().await;
            let t: String = sqlx::query_scalar(
                "SELECT tableoid::regclass::text FROM tracked_events WHERE id = $1 \
                 AND occurred_at >= '2000-01-01' AND occurred_at < '2100-01-01'",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
            pool.close().await;
            t
        }
        Backend::Sqlite => {
            let path = app.db.dir.path().join("fastack.db");
            let pool = sqlx::SqlitePool::connect(&format!("sqlite:{}", path.display()))
                .await
                .unwrap();
            let tables: Vec<String> = sqlx::query_scalar(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'tracked_events_y%'",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            let mut found = Vec::new();
            for t in tables {
                let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT count(*) FROM {t} WHERE id = $1"
                )))
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap();
                if n > 0 {
                    found.push(t);
                }
            }
            pool.close().await;
            assert_eq!(found.len(), 1, "{found:?}");
            found.remove(0)
        }
    }
}

pub async fn default_partition_rows(app: &TestApp) -> i64 {
    let pool = app.db.pg_pool().await;
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM tracked_events_default")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    n
}

fn batch_of(n: usize, prefix: &str) -> Value {
    let now = Utc::now();
    let items: Vec<Value> = (0..n)
        .map(|i| {
            let mut t = track(
                &format!("{prefix}-{i}"),
                &format!("user-{}", i % 7),
                now - chrono::Duration::seconds(i as i64),
            );
            t["type"] = json!("track");
            t
        })
        .collect();
    json!({ "batch": items })
}

async fn batch_of_500_is_accepted_501_is_not(app: TestApp) {
    let five_hundred = batch_of(500, "b500");
    let a = app.post("/v1/core/batch", &app.t.key, &five_hundred).await;
    assert_eq!(a.status, 202, "{}", a.body);
    let items = a.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 500);
    assert!(items.iter().all(|i| i["duplicate"] == false));

    let b = app
        .post("/v1/core/batch", &app.t.key, &batch_of(501, "b501"))
        .await;
    assert_eq!(b.status, 400, "{}", b.body);
    assert_eq!(b.body["code"], "batch_too_large");

    let evs = wait_for_events(&app, 500).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (from, to) = range_around_now();
    assert_eq!(evs.len(), 500);
    assert_eq!(
        app.events(&app.t.key, &from, &to, "").await.len(),
        500,
        "nothing of the 501 was queued"
    );
    // The same batch again: all duplicates, same ids, in order.
    let again = app.post("/v1/core/batch", &app.t.key, &five_hundred).await;
    assert_eq!(again.status, 202);
    assert!(
        again.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["duplicate"] == true)
    );
    assert_eq!(again.body["items"][17]["id"], items[17]["id"]);
    app.cleanup().await;
}

async fn batch_is_all_or_nothing(app: TestApp) {
    let now = Utc::now();
    // An invalid item rejects the whole batch, naming its index.
    let mut bad = batch_of(3, "aon");
    bad["batch"][1]["occurred_at"] = json!("yesterday");
    let a = app.post("/v1/core/batch", &app.t.key, &bad).await;
    assert_eq!(a.status, 422, "{}", a.body);
    assert_eq!(a.body["errors"][0]["index"], 1);
    assert_eq!(a.body["errors"][0]["field"], "/batch/1/occurred_at");

    // A conflicting item (its key taken with other content) rejects the
    // whole batch, and releases the other items' keys.
    let taken = app
        .post("/v1/core/track", &app.t.key, &track("taken", "u", now))
        .await;
    assert_eq!(taken.status, 202);
    let mut conflicting = batch_of(3, "aon");
    conflicting["batch"][2]["idempotency_key"] = json!("taken");
    let b = app.post("/v1/core/batch", &app.t.key, &conflicting).await;
    assert_eq!(b.status, 409, "{}", b.body);
    assert_eq!(b.body["errors"][0]["index"], 2);
    // Item 0's key was not kept: other content under it is new, not a conflict.
    let mut reuse = track("aon-0", "someone-else", now);
    reuse["event"] = json!("Different");
    let c = app.post("/v1/core/track", &app.t.key, &reuse).await;
    assert_eq!(c.status, 202, "{}", c.body);
    assert_eq!(c.body["duplicate"], false);

    let evs = wait_for_events(&app, 2).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (from, to) = range_around_now();
    assert_eq!(evs.len(), 2);
    assert_eq!(app.events(&app.t.key, &from, &to, "").await.len(), 2);

    // The same key twice inside one batch: same content is a duplicate of
    // the first, other content a conflict.
    let mut twice = batch_of(2, "twice");
    twice["batch"][1] = twice["batch"][0].clone();
    let d = app.post("/v1/core/batch", &app.t.key, &twice).await;
    assert_eq!(d.status, 202, "{}", d.body);
    assert_eq!(d.body["items"][0]["duplicate"], false);
    assert_eq!(d.body["items"][1]["duplicate"], true);
    assert_eq!(d.body["items"][0]["id"], d.body["items"][1]["id"]);
    app.cleanup().await;
}

async fn bad_input_gets_typed_problems(app: TestApp) {
    let key = app.t.key.clone();
    let now = Utc::now();
    let check = |a: &crate::helpers::Answer, status: u16, code: &str| {
        assert_eq!(a.status, status, "{}", a.body);
        assert_eq!(a.body["code"], code, "{}", a.body);
        assert_eq!(a.body["status"], status);
        assert_eq!(
            a.headers["content-type"].to_str().unwrap(),
            "application/problem+json"
        );
    };

    let a = app
        .post_raw("/v1/core/track", &key, b"{not json".to_vec())
        .await;
    check(&a, 400, "invalid_json");

    let a = app
        .post("/v1/core/track", &key, &json!({"event": 5, "user_id": [], "occurred_at": now.to_rfc3339(), "idempotency_key": "x"}))
        .await;
    check(&a, 422, "invalid_payload");
    let fields: Vec<&str> = a.body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert!(
        fields.contains(&"/event") && fields.contains(&"/user_id"),
        "{fields:?}"
    );

    let a = app
        .post(
            "/v1/core/track",
            &key,
            &json!({"event": "e", "occurred_at": now.to_rfc3339(), "idempotency_key": "x"}),
        )
        .await;
    check(&a, 422, "invalid_payload");
    assert_eq!(a.body["errors"][0]["code"], "required");

    let mut unknown = track("x", "u", now);
    unknown["occured_at"] = json!("typo");
    let a = app.post("/v1/core/track", &key, &unknown).await;
    check(&a, 422, "invalid_payload");
    assert_eq!(a.body["errors"][0]["code"], "unknown_field");
    assert_eq!(a.body["errors"][0]["field"], "/occured_at");

    let mut future = track("x", "u", now + chrono::Duration::hours(25));
    let a = app.post("/v1/core/track", &key, &future).await;
    check(&a, 422, "occurred_at_in_future");
    future["occurred_at"] = json!((now - chrono::Duration::days(365 * 4)).to_rfc3339());
    let a = app.post("/v1/core/track", &key, &future).await;
    check(&a, 422, "occurred_at_out_of_retention");
    future["occurred_at"] = json!("2026-11-30 10:00:00");
    let a = app.post("/v1/core/track", &key, &future).await;
    check(&a, 422, "invalid_payload");
    assert_eq!(a.body["errors"][0]["code"], "invalid_timestamp");

    let mut big = track("big", "u", now);
    big["properties"]["blob"] = json!("x".repeat(33 * 1024));
    let a = app.post("/v1/core/track", &key, &big).await;
    check(&a, 413, "payload_too_large");

    let mut batch = batch_of(2, "bigbatch");
    batch["batch"][1]["properties"]["blob"] = json!("x".repeat(33 * 1024));
    let a = app.post("/v1/core/batch", &key, &batch).await;
    check(&a, 413, "payload_too_large");
    assert_eq!(a.body["errors"][0]["index"], 1);

    let huge = vec![b' '; 4 * 1024 * 1024 + 10];
    let a = app.post_raw("/v1/core/batch", &key, huge).await;
    check(&a, 413, "payload_too_large");

    let a = app
        .post("/v1/core/batch", &key, &json!({"batch": []}))
        .await;
    check(&a, 422, "invalid_payload");
    let a = app
        .post("/v1/core/batch", &key, &json!({"items": []}))
        .await;
    check(&a, 422, "invalid_payload");

    let a = app
        .post("/v1/core/track", "fsk_nope", &track("x", "u", now))
        .await;
    check(&a, 401, "unauthorized");
    let resp = app
        .http
        .post(app.url("/v1/core/track"))
        .json(&track("x", "u", now))
        .send()
        .await
        .unwrap();
    let a = crate::helpers::answer(resp).await;
    check(&a, 401, "unauthorized");

    let a = app
        .get("/v1/core/events?from=2026-01-01T00:00:00Z", &key)
        .await;
    check(&a, 400, "invalid_query");
    let a = app
        .get(
            "/v1/core/events?from=yesterday&to=2026-01-01T00:00:00Z",
            &key,
        )
        .await;
    check(&a, 400, "invalid_query");
    assert_eq!(a.body["errors"][0]["field"], "from");
    let a = app.get("/v1/core/nope", &key).await;
    check(&a, 404, "not_found");

    // Nothing of the above was accepted.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (from, to) = range_around_now();
    assert!(app.events(&key, &from, &to, "").await.is_empty());
    app.cleanup().await;
}

async fn duplicate_across_track_and_batch(app: TestApp) {
    let now = Utc::now();
    let single = track("cross-1", "u-cross", now);
    let a = app.post("/v1/core/track", &app.t.key, &single).await;
    assert_eq!(a.status, 202);
    let mut item = single.clone();
    item["type"] = json!("track");
    let b = app
        .post(
            "/v1/core/batch",
            &app.t.key,
            &json!({"batch": [item, track_item("cross-2", now)]}),
        )
        .await;
    assert_eq!(b.status, 202, "{}", b.body);
    assert_eq!(b.body["items"][0]["duplicate"], true);
    assert_eq!(b.body["items"][0]["id"], a.body["id"]);
    assert_eq!(b.body["items"][1]["duplicate"], false);
    app.cleanup().await;
}

/// After a restart the idempotency cache is empty, so keys that already
/// exist reach the group commit next to new ones: old keys answer as
/// duplicates, new ones are stored, and a conflicting request keeps none of
/// its rows.
async fn cold_cache_groups_mixing_old_and_new_keys(app: TestApp) {
    let now = Utc::now();
    let old = track_item("cold-old", now);
    let first = app
        .post("/v1/core/batch", &app.t.key, &json!({"batch": [old]}))
        .await;
    assert_eq!(first.status, 202, "{}", first.body);
    let old_id = first.body["items"][0]["id"].clone();

    let app = crate::helpers::spawn_on(app.stop().await, |_| {}).await;
    let mixed = app
        .post(
            "/v1/core/batch",
            &app.t.key,
            &json!({"batch": [track_item("cold-new", now), old]}),
        )
        .await;
    assert_eq!(mixed.status, 202, "{}", mixed.body);
    assert_eq!(mixed.body["items"][0]["duplicate"], false);
    assert_eq!(mixed.body["items"][1]["duplicate"], true);
    assert_eq!(mixed.body["items"][1]["id"], old_id);

    let app = crate::helpers::spawn_on(app.stop().await, |_| {}).await;
    let mut changed = old.clone();
    changed["event"] = json!("Something Else");
    let conflict = app
        .post(
            "/v1/core/batch",
            &app.t.key,
            &json!({"batch": [track_item("cold-released", now), changed]}),
        )
        .await;
    assert_eq!(conflict.status, 409, "{}", conflict.body);
    assert_eq!(conflict.body["errors"][0]["index"], 1);
    // The conflicting request's new key was not kept.
    let mut reuse = track_item("cold-released", now);
    reuse["event"] = json!("Different");
    let again = app
        .post("/v1/core/batch", &app.t.key, &json!({"batch": [reuse]}))
        .await;
    assert_eq!(again.status, 202, "{}", again.body);
    assert_eq!(again.body["items"][0]["duplicate"], false);

    let evs = wait_for_events(&app, 3).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (from, to) = range_around_now();
    assert_eq!(evs.len(), 3);
    assert_eq!(app.events(&app.t.key, &from, &to, "").await.len(), 3);
    app.cleanup().await;
}

fn track_item(key: &str, at: chrono::DateTime<Utc>) -> Value {
    let mut t = track(key, "u-item", at);
    t["type"] = json!("track");
    t
}

async fn revoked_key_stops_working(app: TestApp) {
    let created = fastack_core::admin::create_key(app.store.as_ref(), app.t.tenant.id, None)
        .await
        .unwrap();
    let now = Utc::now();
    let a = app
        .post("/v1/core/track", &created.secret, &track("rv-1", "u", now))
        .await;
    assert_eq!(a.status, 202);
    fastack_core::admin::revoke_key(app.store.as_ref(), created.key.id)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    eventually(
        "the revoked key to be refused",
        Duration::from_secs(5),
        || async {
            let a = app
                .post("/v1/core/track", &created.secret, &track("rv-2", "u", now))
                .await;
            (a.status == 401).then_some(())
        },
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(4));
    app.cleanup().await;
}

/// Requests in flight when a key's cache entry expires share one lookup
/// (and one last-use write) instead of making one each.
async fn an_expired_key_is_looked_up_once(app: TestApp) {
    let created = fastack_core::admin::create_key(app.store.as_ref(), app.t.tenant.id, None)
        .await
        .unwrap();
    let ttl = Duration::from_millis(50);
    let cache = fastack_core::auth::KeyCache::new(app.store.clone(), ttl);
    assert!(cache.authenticate(&created.secret).await.unwrap().is_some());
    assert_eq!(cache.lookups(), 1);
    // Fresh: answered from the cache.
    assert!(cache.authenticate(&created.secret).await.unwrap().is_some());
    assert_eq!(cache.lookups(), 1);
    tokio::time::sleep(ttl + Duration::from_millis(20)).await;
    let all = join_all((0..64).map(|_| cache.authenticate(&created.secret))).await;
    assert!(all.iter().all(|p| matches!(p, Ok(Some(_)))));
    assert_eq!(cache.lookups(), 2, "one lookup for the whole burst");
    app.cleanup().await;
}
