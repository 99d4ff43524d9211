//! Several nodes on one PostgreSQL: any node accepts, one node at a time
//! processes a tenant, nothing is processed twice, and a stopped node's
//! tenants move to the other.

use std::{collections::HashSet, sync::Arc, time::Duration};

use chrono::Utc;
use futures::future::join_all;
use serde_json::json;

use crate::helpers::{Backend, TestDb, eventually, spawn_on, track, until_none_left};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_one_database_process_each_event_once() {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let db = Arc::new(db);
    let a = spawn_on(db.clone(), |_| {}).await;
    let b = spawn_on(db.clone(), |_| {}).await;
    assert_ne!(
        a.server.as_ref().unwrap().state().config.node_id,
        b.server.as_ref().unwrap().state().config.node_id
    );

    let now = Utc::now();
    // 40 batches of 25, alternating nodes, each node with its own key.
    let sends = (0..40).map(|r| {
        let (app, key) = if r % 2 == 0 {
            (&a, &a.t.key)
        } else {
            (&b, &b.t.key)
        };
        let items: Vec<_> = (0..25)
            .map(|i| {
                let mut t = track(
                    &format!("mn-{r}-{i}"),
                    &format!("u{}", i % 5),
                    now - chrono::Duration::seconds(i),
                );
                t["type"] = json!("track");
                t
            })
            .collect();
        async move {
            let ans = app
                .post("/v1/core/batch", key, &json!({"batch": items}))
                .await;
            assert_eq!(ans.status, 202, "{}", ans.body);
        }
    });
    join_all(sends).await;

    let from = (now - chrono::Duration::hours(1)).to_rfc3339();
    let to = (now + chrono::Duration::hours(1)).to_rfc3339();
    let evs = eventually("1000 events processed", Duration::from_secs(30), || async {
        let e = a.events(&a.t.key, &from, &to, "").await;
        (e.len() >= 1000).then_some(e)
    })
    .await;
    let ids: HashSet<&str> = evs.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), evs.len(), "no event stored twice");
    assert_eq!(evs.len(), 1000);

    // Every inbox row was taken by one processing commit.
    let pool = db.pg_pool().await;
    let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(waiting, 0);
    // One lease per tenant.
    let holders: i64 = sqlx::query_scalar("SELECT count(*) FROM tenant_leases")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(holders, 1);
    let holder: uuid::Uuid = sqlx::query_scalar("SELECT node_id FROM tenant_leases")
        .fetch_one(&pool)
        .await
        .unwrap();

    // Stop the holder: the other node takes the tenant over.
    let (holder_app, other) = if a.server.as_ref().unwrap().state().config.node_id.0 == holder {
        (a, b)
    } else {
        (b, a)
    };
    holder_app.stop().await;
    let more = app_post_batch(&other, "after-stop", 50).await;
    assert_eq!(more, 202);
    eventually(
        "the other node to process",
        Duration::from_secs(20),
        || async {
            let e = other.events(&other.t.key, &from, &to, "").await;
            (e.len() == 1050).then_some(())
        },
    )
    .await;
    let holder_now: uuid::Uuid = sqlx::query_scalar("SELECT node_id FROM tenant_leases")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        holder_now,
        other.server.as_ref().unwrap().state().config.node_id.0
    );
    pool.close().await;
    other.cleanup().await;
}

async fn app_post_batch(app: &crate::helpers::TestApp, prefix: &str, n: usize) -> u16 {
    let items: Vec<_> = (0..n)
        .map(|i| {
            let mut t = track(&format!("{prefix}-{i}"), "u", Utc::now());
            t["type"] = json!("track");
            t
        })
        .collect();
    app.post("/v1/core/batch", &app.t.key, &json!({"batch": items}))
        .await
        .status
}

/// An inbox row that becomes visible below rows a processor has already
/// consumed (a group commit that started earlier but ended later, here
/// made by hand) is still processed, once: woken rounds read from a little
/// below the processor's cursor, and every tick reads the tenant's whole
/// inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_row_below_the_cursor_is_still_processed() {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let db = Arc::new(db);
    let pool = db.pg_pool().await;
    let now = Utc::now();
    let from = (now - chrono::Duration::hours(1)).to_rfc3339();
    let to = (now + chrono::Duration::hours(1)).to_rfc3339();

    // An accept-only node queues the late event; its row is held aside.
    let accept = spawn_on(db.clone(), |c| c.processing = false).await;
    let late = accept
        .post("/v1/core/track", &accept.t.key, &track("late", "u1", now))
        .await;
    assert_eq!(late.status, 202, "{}", late.body);
    for sql in [
        "CREATE TABLE held AS SELECT * FROM inbox",
        "DELETE FROM inbox",
        // Rows from now on are numbered far above it, beyond the window a
        // woken round looks back.
        "SELECT setval(pg_get_serial_sequence('inbox', 'seq'), 10000000)",
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .unwrap();
    }

    let node = spawn_on(db.clone(), |_| {}).await;
    let first = node
        .post("/v1/core/track", &node.t.key, &track("first", "u2", now))
        .await;
    assert_eq!(first.status, 202, "{}", first.body);
    eventually(
        "the first event processed",
        Duration::from_secs(20),
        || async { (node.events(&node.t.key, &from, &to, "").await.len() == 1).then_some(()) },
    )
    .await;

    // The late row appears below the processor's cursor; a new event wakes
    // the processor as well.
    sqlx::raw_sql(
        "INSERT INTO inbox (seq, tenant_id, event_id, payload, received_at) OVERRIDING SYSTEM VALUE \
         SELECT seq, tenant_id, event_id, payload, received_at FROM held",
    )
    .execute(&pool)
    .await
    .unwrap();
    let wake = node
        .post("/v1/core/track", &node.t.key, &track("wake", "u3", now))
        .await;
    assert_eq!(wake.status, 202, "{}", wake.body);

    let evs = eventually(
        "the late event processed",
        Duration::from_secs(20),
        || async {
            let e = node.events(&node.t.key, &from, &to, "").await;
            (e.len() >= 3).then_some(e)
        },
    )
    .await;
    let ids: HashSet<&str> = evs.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(evs.len(), 3, "each event stored once: {evs:?}");
    assert!(ids.contains(late.body["id"].as_str().unwrap()));
    until_none_left(
        &pool,
        "the inbox drained",
        "SELECT count(*) FROM inbox",
        Duration::from_secs(20),
    )
    .await;

    pool.close().await;
    accept.stop().await;
    node.cleanup().await;
}
