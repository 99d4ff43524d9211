//! Tracking plans: installed by an operator (CLI or admin listener), in
//! force on every node within 2 s, enforced or flagged at the front door,
//! recorded with each event, and never turning a duplicate into a 422.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use chrono::Utc;
use serde_json::{Value, json};

use crate::{
    helpers::{Backend, TestApp, TestDb, eventually, spawn_on},
    webhooks::{ADMIN_TOKEN, admin_url, tweak},
};

fn plan(mode: &str) -> Value {
    json!({
        "$defs": {"money": {"type": "number", "minimum": 0}},
        "events": {
            "Order Completed": {
                "type": "object",
                "properties": {"amount": {"$ref": "#/$defs/money"}, "sku": {"type": "string"}},
                "required": ["amount"]
            }
        },
        "identify": {"type": "object", "properties": {"email": {"type": "string", "format": "email"}}},
        "unplanned": "reject",
        "mode": mode
    })
}

fn order(key: &str, props: Value) -> Value {
    json!({
        "event": "Order Completed",
        "user_id": "u1",
        "properties": props,
        "occurred_at": Utc::now().to_rfc3339(),
        "idempotency_key": key,
    })
}

/// `fastack admin taxonomy …` against the app's storage: (ok, stdout, stderr).
fn cli(app: &TestApp, args: &[&str]) -> (bool, String, String) {
    let args: Vec<&str> = ["admin", "taxonomy"].iter().chain(args).copied().collect();
    crate::helpers::fastack_cli(&app.db, &args)
}

fn install_file(app: &TestApp, doc: &Value) -> (bool, String, String) {
    let file = app
        .db
        .dir
        .path()
        .join(format!("plan-{}.json", uuid::Uuid::now_v7()));
    std::fs::write(&file, doc.to_string()).unwrap();
    cli(
        app,
        &[
            "install",
            "--tenant",
            "acme",
            "--file",
            file.to_str().unwrap(),
            "--json",
        ],
    )
}

/// Waits (at most 2 s, the promise) until `check` holds on `app`.
async fn within_2s(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{what}: not in force within 2 s"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn plan_lifecycle_at_the_front_door(app: TestApp) {
    let key = app.t.key.clone();
    let from = (Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    let to = (Utc::now() + chrono::Duration::hours(1)).to_rfc3339();

    // No plan: anything goes, and the tenant's read says so.
    assert_eq!(app.get("/v1/core/taxonomy", &key).await.status, 404);
    let early = order("before-plan", json!({"amount": -5}));
    let a = app.post("/v1/core/track", &key, &early).await;
    assert_eq!(a.status, 202, "{}", a.body);
    let early_id = a.body["id"].clone();

    // A broken plan is refused with the event and the reason.
    let mut broken = plan("enforce");
    broken["events"]["Signed Up"] = json!({"type": "strnig"});
    let (ok, _, err) = install_file(&app, &broken);
    assert!(!ok, "a broken plan was installed");
    assert!(
        err.contains("Signed Up") && err.contains("tracking plan refused"),
        "{err}"
    );

    // Enforce.
    let (ok, out, err) = install_file(&app, &plan("enforce"));
    assert!(ok, "{err}");
    let installed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(installed["version"], 1, "{out}");
    within_2s("version 1", async || {
        let probe = order(
            &format!("probe-1-{}", uuid::Uuid::now_v7()),
            json!({"amount": -1}),
        );
        app.post("/v1/core/track", &key, &probe).await.status == 422
    })
    .await;
    let a = app
        .post(
            "/v1/core/track",
            &key,
            &order("bad-1", json!({"amount": -1})),
        )
        .await;
    assert_eq!(a.status, 422);
    assert_eq!(a.body["code"], "schema_violation", "{}", a.body);
    assert_eq!(a.body["errors"][0]["field"], "/properties/amount");
    assert_eq!(a.body["errors"][0]["code"], "minimum");

    // A batch is all or nothing; the pointer names the item.
    let good = order("batch-good", json!({"amount": 3}));
    let mut bad = order("batch-bad", json!({"amount": 1, "sku": 5}));
    bad["type"] = json!("track");
    let mut good_item = good.clone();
    good_item["type"] = json!("track");
    let a = app
        .post("/v1/core/batch", &key, &json!({"batch": [good_item, bad]}))
        .await;
    assert_eq!(a.status, 422, "{}", a.body);
    assert_eq!(a.body["errors"][0]["field"], "/batch/1/properties/sku");
    assert_eq!(a.body["errors"][0]["index"], 1);
    assert_eq!(a.body["errors"][0]["code"], "type");
    let a = app.post("/v1/core/track", &key, &good).await;
    assert_eq!(a.status, 202);
    assert_eq!(
        a.body["duplicate"], false,
        "nothing of the refused batch was kept"
    );
    let good_id = a.body["id"].clone();

    // identify traits, and an event the plan does not list.
    let a = app
        .post(
            "/v1/core/identify",
            &key,
            &json!({"user_id": "u1", "traits": {"email": "not-an-address"},
                    "occurred_at": Utc::now().to_rfc3339(), "idempotency_key": "id-1"}),
        )
        .await;
    assert_eq!(a.status, 422, "{}", a.body);
    assert_eq!(a.body["errors"][0]["field"], "/traits/email");
    assert_eq!(a.body["errors"][0]["code"], "format");
    let mut other = order("unplanned-1", json!({}));
    other["event"] = json!("Page Viewed");
    let a = app.post("/v1/core/track", &key, &other).await;
    assert_eq!(a.status, 422);
    assert_eq!(a.body["code"], "unplanned_event");
    assert_eq!(a.body["errors"][0]["field"], "/event");

    // What was accepted before the plan is still a duplicate, not a 422.
    let a = app.post("/v1/core/track", &key, &early).await;
    assert_eq!(a.status, 202, "{}", a.body);
    assert_eq!(a.body["id"], early_id);
    assert_eq!(a.body["duplicate"], true);

    // The tenant reads its plan; an API key cannot change it.
    let a = app.get("/v1/core/taxonomy", &key).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body["version"], 1);
    assert_eq!(a.body["document"]["mode"], "enforce");
    for method in [
        reqwest::Method::PUT,
        reqwest::Method::POST,
        reqwest::Method::DELETE,
    ] {
        let resp = app
            .http
            .request(method.clone(), app.url("/v1/core/taxonomy"))
            .bearer_auth(&key)
            .json(&plan("flag"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 405, "{method} with an API key");
    }

    // Flag (and unplanned events allowed): accepted, and the stored event
    // says what broke and under which version.
    let mut flag = plan("flag");
    flag["unplanned"] = json!("allow");
    let (ok, _, err) = install_file(&app, &flag);
    assert!(ok, "{err}");
    within_2s("version 2", async || {
        let probe = order(
            &format!("probe-2-{}", uuid::Uuid::now_v7()),
            json!({"amount": -1}),
        );
        app.post("/v1/core/track", &key, &probe).await.status == 202
    })
    .await;
    let a = app
        .post(
            "/v1/core/track",
            &key,
            &order("flagged", json!({"amount": "x"})),
        )
        .await;
    assert_eq!(a.status, 202, "{}", a.body);
    let flagged_id = a.body["id"].clone();
    let mut in_batch = order("flagged-in-batch", json!({"amount": 2, "sku": 7}));
    in_batch["type"] = json!("track");
    let mut fine = order("fine-in-batch", json!({"amount": 2}));
    fine["type"] = json!("track");
    let a = app
        .post("/v1/core/batch", &key, &json!({"batch": [fine, in_batch]}))
        .await;
    assert_eq!(a.status, 202, "{}", a.body);
    let batch_ids: Vec<Value> = a.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].clone())
        .collect();
    let a = app
        .post(
            "/v1/core/identify",
            &key,
            &json!({"user_id": "u1", "traits": {"email": "still-not-an-address"},
                    "occurred_at": Utc::now().to_rfc3339(), "idempotency_key": "id-flagged"}),
        )
        .await;
    assert_eq!(a.status, 202, "{}", a.body);
    let identify_id = a.body["id"].clone();
    let mut unplanned = order("unplanned-allowed", json!({"anything": true}));
    unplanned["event"] = json!("Page Viewed");
    let a = app.post("/v1/core/track", &key, &unplanned).await;
    assert_eq!(
        a.status, 202,
        "unplanned events are allowed now: {}",
        a.body
    );
    let unplanned_id = a.body["id"].clone();

    let wanted = [&flagged_id, &identify_id, &unplanned_id, &batch_ids[1]];
    let events = eventually("flagged events stored", Duration::from_secs(20), || async {
        let e = app.events(&key, &from, &to, "").await;
        wanted
            .iter()
            .all(|id| e.iter().any(|e| &&e["id"] == id))
            .then_some(e)
    })
    .await;
    let by_id = |id: &Value| events.iter().find(|e| &e["id"] == id).unwrap().clone();
    let flagged = by_id(&flagged_id);
    assert_eq!(flagged["plan_version"], 2, "{flagged}");
    assert_eq!(
        flagged["schema_violations"][0]["field"],
        "/properties/amount"
    );
    assert_eq!(flagged["schema_violations"][0]["code"], "type");
    let item = by_id(&batch_ids[1]);
    assert_eq!(
        item["schema_violations"][0]["field"], "/properties/sku",
        "{item}"
    );
    assert!(by_id(&batch_ids[0]).get("schema_violations").is_none());
    let identified = by_id(&identify_id);
    assert_eq!(identified["type"], "identify");
    assert_eq!(identified["schema_violations"][0]["field"], "/traits/email");
    assert_eq!(identified["schema_violations"][0]["code"], "format");
    let unplanned = by_id(&unplanned_id);
    assert_eq!(unplanned["plan_version"], 2);
    assert!(unplanned.get("schema_violations").is_none());
    let conforming = by_id(&good_id);
    assert_eq!(
        conforming["plan_version"], 1,
        "it was accepted under version 1"
    );
    assert!(conforming.get("schema_violations").is_none());
    let before = by_id(&early_id);
    assert!(
        before.get("plan_version").is_none(),
        "accepted without a plan"
    );

    // History, one version, removal.
    let (ok, out, _) = cli(&app, &["history", "--tenant", "acme", "--json"]);
    assert!(ok);
    let history: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(history.as_array().unwrap().len(), 2);
    let (ok, out, _) = cli(
        &app,
        &["show", "--tenant", "acme", "--version", "1", "--json"],
    );
    assert!(ok);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["document"]["mode"],
        "enforce"
    );
    let (ok, out, err) = cli(&app, &["remove", "--tenant", "acme"]);
    assert!(ok, "{err}");
    assert!(out.contains("version 3"), "{out}");
    // Removal is in force within 2 s: an event sent then records no plan.
    let removed_at = Instant::now();
    for n in 0.. {
        let sent_at = removed_at.elapsed();
        let probe = order(&format!("after-removal-{n}"), json!({"amount": -1}));
        let a = app.post("/v1/core/track", &key, &probe).await;
        assert_eq!(a.status, 202);
        let id = a.body["id"].clone();
        let stored = eventually("event stored", Duration::from_secs(20), || async {
            app.events(&key, &from, &to, "")
                .await
                .into_iter()
                .find(|e| e["id"] == id)
        })
        .await;
        if stored.get("plan_version").is_none() {
            break;
        }
        assert!(
            sent_at < Duration::from_secs(2),
            "removal not in force within 2 s"
        );
    }
    assert_eq!(app.get("/v1/core/taxonomy", &key).await.status, 404);
    let (ok, _, err) = cli(&app, &["show", "--tenant", "acme"]);
    assert!(!ok && err.contains("not found"), "{err}");
    app.cleanup().await;
}

crate::on_both_backends!(plan_lifecycle_at_the_front_door);

/// Two nodes on one PostgreSQL: a plan installed through one node's admin
/// listener is in force on the other within 2 s, and an event the other
/// node never saw, accepted before the plan, stays a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_see_a_new_version_within_2s() {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let db = Arc::new(db);
    let a = spawn_on(db.clone(), tweak).await;
    let b = spawn_on(db.clone(), |_| {}).await;

    let early = order("two-nodes-early", json!({"amount": -5}));
    let first = a.post("/v1/core/track", &a.t.key, &early).await;
    assert_eq!(first.status, 202);

    // Only the admin token installs.
    let resp = a
        .http
        .put(admin_url(&a, "/admin/v1/tenants/acme/taxonomy"))
        .json(&plan("enforce"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let mut broken = plan("enforce");
    broken["identify"] = json!({"$ref": "https://example.com/traits.json"});
    let resp = a
        .http
        .put(admin_url(&a, "/admin/v1/tenants/acme/taxonomy"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&broken)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 422, "a remote reference is refused");
    let problem: Value = resp.json().await.unwrap();
    assert_eq!(problem["code"], "invalid_plan");
    assert!(
        problem["detail"].as_str().unwrap().contains("identify"),
        "{problem}"
    );

    let resp = a
        .http
        .put(admin_url(&a, "/admin/v1/tenants/acme/taxonomy"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&plan("enforce"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    let installed_at = Instant::now();
    // The installing node enforces at once.
    let r = a
        .post(
            "/v1/core/track",
            &a.t.key,
            &order("on-a", json!({"amount": -1})),
        )
        .await;
    assert_eq!(r.status, 422, "{}", r.body);
    let mut n = 0;
    within_2s("the other node", async || {
        n += 1;
        b.post(
            "/v1/core/track",
            &b.t.key,
            &order(&format!("on-b-{n}"), json!({"amount": -1})),
        )
        .await
        .status
            == 422
    })
    .await;
    eprintln!(
        "version in force on the other node after {:?}",
        installed_at.elapsed()
    );

    // Node b never saw the early event: it finds the key taken with the
    // same content and answers the duplicate.
    let again = b.post("/v1/core/track", &b.t.key, &early).await;
    assert_eq!(again.status, 202, "{}", again.body);
    assert_eq!(again.body["id"], first.body["id"]);
    assert_eq!(again.body["duplicate"], true);
    // The same key with other content is still a conflict.
    let other = order("two-nodes-early", json!({"amount": -6}));
    assert_eq!(b.post("/v1/core/track", &b.t.key, &other).await.status, 409);

    let resp = a
        .http
        .get(admin_url(&a, "/admin/v1/tenants/acme/taxonomy/history"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    let history: Value = resp.json().await.unwrap();
    assert_eq!(history.as_array().unwrap().len(), 1);
    drop(b.stop().await);
    a.cleanup().await;
}
