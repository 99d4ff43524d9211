//! A processor that fails (its storage breaks under it) is restarted by its
//! supervisor with backoff and resumes from the durable inbox: nothing
//! accepted meanwhile is lost or processed twice.

use std::time::Duration;

use chrono::Utc;
use serde_json::json;

use crate::helpers::{Backend, TestApp, eventually, track};
use crate::on_both_backends;

on_both_backends!(failed_processor_is_restarted_and_resumes);

async fn exec(app: &TestApp, sql: &str) {
    match app.db.backend {
        Backend::Postgres => {
            let pool = app.db.pg_pool().await;
            sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
                .execute(&pool)
                .await
                .unwrap();
            pool.close().await;
        }
        Backend::Sqlite => {
            let path = app.db.dir.path().join("fastack.db");
            let pool = sqlx::SqlitePool::connect(&format!("sqlite:{}", path.display()))
                .await
                .unwrap();
            sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
                .execute(&pool)
                .await
                .unwrap();
            pool.close().await;
        }
    }
}

async fn restarts(app: &TestApp) -> u64 {
    let m = app.metrics().await;
    m.lines()
        .find(|l| l.starts_with("fastack_actor_restarts_total{actor=\"processor\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

async fn failed_processor_is_restarted_and_resumes(app: TestApp) {
    let now = Utc::now();
    let a = app
        .post("/v1/core/track", &app.t.key, &track("before", "u", now))
        .await;
    assert_eq!(a.status, 202);
    let from = (now - chrono::Duration::hours(1)).to_rfc3339();
    let to = (now + chrono::Duration::hours(1)).to_rfc3339();
    eventually("first event processed", Duration::from_secs(15), || async {
        (app.events(&app.t.key, &from, &to, "").await.len() == 1).then_some(())
    })
    .await;

    // Break the processor's storage: the identity table disappears. The
    // events come from a user the node has not met, so processing must
    // look them up there (a known one is resolved from memory).
    exec(
        &app,
        "ALTER TABLE contact_identities RENAME TO contact_identities_away",
    )
    .await;
    let items: Vec<_> = (0..50)
        .map(|i| {
            let mut t = track(&format!("during-{i}"), "u-new", now);
            t["type"] = json!("track");
            t
        })
        .collect();
    let b = app
        .post("/v1/core/batch", &app.t.key, &json!({"batch": items}))
        .await;
    assert_eq!(b.status, 202, "accepting does not depend on processing");
    eventually(
        "the processor to fail and be restarted",
        Duration::from_secs(15),
        || async { (restarts(&app).await >= 2).then_some(()) },
    )
    .await;
    assert_eq!(app.events(&app.t.key, &from, &to, "").await.len(), 1);

    // Repair: the restarted processor resumes from the inbox.
    exec(
        &app,
        "ALTER TABLE contact_identities_away RENAME TO contact_identities",
    )
    .await;
    let evs = eventually("the backlog processed", Duration::from_secs(40), || async {
        let e = app.events(&app.t.key, &from, &to, "").await;
        (e.len() >= 51).then_some(e)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(app.events(&app.t.key, &from, &to, "").await.len(), 51);
    let ids: std::collections::HashSet<_> = evs
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 51);
    app.cleanup().await;
}
