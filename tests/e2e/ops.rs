//! Health, readiness, metrics, OpenAPI.

use chrono::Utc;

use crate::helpers::{TestApp, track};
use crate::on_both_backends;

on_both_backends!(ops_endpoints_answer);

async fn ops_endpoints_answer(app: TestApp) {
    let h = app.http.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(h.status(), 200);
    let r = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let a = app
        .post("/v1/core/track", &app.t.key, &track("m1", "u", Utc::now()))
        .await;
    assert_eq!(a.status, 202);
    let m = app.metrics().await;
    assert!(
        m.contains(
            "fastack_http_requests_total{route=\"/v1/core/track\",method=\"POST\",status=\"202\"} 1"
        ),
        "{m}"
    );
    assert!(m.contains("fastack_http_request_duration_seconds_bucket"));
    assert!(m.contains("fastack_inbox_depth"));
    assert!(m.contains("fastack_processing_lag_seconds"));
    let spec = app
        .http
        .get(app.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(spec.trim(), fastack_api::openapi_json().trim());
    let docs = app.http.get(app.url("/docs")).send().await.unwrap();
    assert_eq!(docs.status(), 200);
    app.cleanup().await;
}

#[test]
fn committed_openapi_matches_the_code() {
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json"))
            .expect("openapi/openapi.json is committed");
    assert_eq!(
        committed.trim(),
        fastack_api::openapi_json().trim(),
        "openapi/openapi.json drifted: run `cargo run -- openapi > openapi/openapi.json`"
    );
    let admin = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/admin.json"))
        .expect("openapi/admin.json is committed");
    assert_eq!(
        admin.trim(),
        fastack_api::admin::admin_openapi_json().trim(),
        "openapi/admin.json drifted: run `cargo run -- openapi --admin > openapi/admin.json`"
    );
}

/// `GET /` sends a newcomer (or a browser) to the API docs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_root_leads_to_the_docs() {
    let Some(app) = crate::helpers::spawn_app(crate::helpers::Backend::Sqlite).await else {
        return;
    };
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let root = http.get(app.url("/")).send().await.unwrap();
    assert_eq!(root.status(), 303);
    assert_eq!(root.headers()["location"], "/docs");
    let docs = app.http.get(app.url("/")).send().await.unwrap();
    assert_eq!(docs.status(), 200, "followed to the docs");
    assert!(docs.text().await.unwrap().contains("swagger"));
    app.cleanup().await;
}

/// The admin listener serves its own document and docs without the token
/// (the listener is private; the document is not a secret), and what the
/// document says is what it does: operations behind the token, unknown
/// query parameters refused, bodies closed to unknown members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_serves_its_document() {
    let Some(app) = crate::webhooks::webhook_app(crate::helpers::Backend::Sqlite).await else {
        return;
    };
    let admin = app
        .server
        .as_ref()
        .unwrap()
        .admin_addr()
        .expect("admin listener");
    let http = reqwest::Client::new();
    let spec: serde_json::Value = http
        .get(format!("http://{admin}/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        spec,
        serde_json::from_str::<serde_json::Value>(&fastack_api::admin::admin_openapi_json())
            .unwrap()
    );
    for path in [
        "/admin/v1/tenants",
        "/admin/v1/tenants/{tenant}/webhooks",
        "/admin/v1/tenants/{tenant}/erasures",
        "/admin/v1/tenants/{tenant}/taxonomy",
    ] {
        assert!(spec["paths"][path].is_object(), "{path} documented");
    }
    assert_eq!(
        spec["components"]["schemas"]["NewWebhook"]["additionalProperties"],
        false
    );
    let docs = http
        .get(format!("http://{admin}/docs"))
        .send()
        .await
        .unwrap();
    assert_eq!(docs.status(), 200);
    assert!(docs.text().await.unwrap().contains("swagger"));
    // Behind the token.
    let bare = http
        .get(format!("http://{admin}/admin/v1/tenants"))
        .send()
        .await
        .unwrap();
    assert_eq!(bare.status(), 401);
    let token = crate::webhooks::ADMIN_TOKEN;
    let typo = http
        .get(format!(
            "http://{admin}/admin/v1/tenants/{}/quarantine?limt=5",
            app.t.tenant.id
        ))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(typo.status(), 400);
    let body: serde_json::Value = typo.json().await.unwrap();
    assert_eq!(body["errors"][0]["field"], "limt", "{body}");
    let unknown = http
        .post(format!(
            "http://{admin}/admin/v1/tenants/{}/webhooks",
            app.t.tenant.id
        ))
        .bearer_auth(token)
        .json(&serde_json::json!({"url": "https://example.com/h", "event": "job.failed"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        unknown.status(),
        400,
        "an unknown member is refused, not dropped"
    );
    let listed = http
        .get(format!("http://{admin}/admin/v1/tenants"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200);
    app.cleanup().await;
}

/// The queue tables carry their own autovacuum thresholds (a fixed number
/// of dead rows, not a fifth of the table), as an operator sees them in
/// `\d+ inbox`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_tables_are_vacuumed_by_dead_row_count() {
    let Some(app) = crate::helpers::spawn_app(crate::helpers::Backend::Postgres).await else {
        return;
    };
    let pool = app.db.pg_pool().await;
    for table in ["inbox", "outbox"] {
        let options: Vec<String> =
            sqlx::query_scalar("SELECT unnest(reloptions) FROM pg_class WHERE oid = $1::regclass")
                .bind(table)
                .fetch_all(&pool)
                .await
                .unwrap();
        for expected in [
            "autovacuum_vacuum_scale_factor=0",
            "autovacuum_vacuum_threshold=10000",
        ] {
            assert!(
                options.iter().any(|o| o == expected),
                "{table}: {options:?}"
            );
        }
    }
    pool.close().await;
    app.cleanup().await;
}
