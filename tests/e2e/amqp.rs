//! Jobs, the transactional outbox and signed CloudEvents on the real
//! RabbitMQ, seen from a consumer's side (seed 000): exactly one logical
//! terminal event per job, every header of the contract, signatures that
//! verify with the key `fastack keys external-hmac` prints, results that
//! decrypt and verify, outages that delay but never lose, and a repairer
//! that re-emits with the same ce-id.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use chrono::Utc;
use fastack_core::amqp;
use futures::StreamExt;
use lapin::{
    Connection, ConnectionProperties,
    options::{BasicAckOptions, ExchangeDeleteOptions},
    types::FieldTable,
};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::helpers::{
    Backend, S3Bucket, TestApp, TestDb, amqp_url, bin_path, eventually, services_required,
    spawn_on, track, until_none_left,
};

pub const SOURCE: &str = "//fastack/e2e";

/// One delivered message.
#[derive(Clone, Debug)]
pub struct Received {
    pub exchange: String,
    pub routing_key: String,
    pub headers: FieldTable,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

impl Received {
    pub fn header(&self, name: &str) -> String {
        amqp::header_str(&self.headers, name).unwrap_or_else(|| panic!("header {name} missing"))
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// A consumer with its own exclusive queue bound to `keys` on `exchange`.
pub struct Consumer {
    pub rx: mpsc::UnboundedReceiver<Received>,
    _conn: Connection,
}

impl Consumer {
    pub async fn next(&mut self, within: Duration) -> Option<Received> {
        tokio::time::timeout(within, self.rx.recv())
            .await
            .ok()
            .flatten()
    }

    /// Everything that arrives until `quiet` passes with nothing new.
    pub async fn drain(&mut self, quiet: Duration) -> Vec<Received> {
        let mut out = Vec::new();
        while let Some(m) = self.next(quiet).await {
            out.push(m);
        }
        out
    }
}

pub async fn consumer(exchange: &str, keys: &[&str]) -> Consumer {
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .expect("consumer connects");
    let channel = conn.create_channel().await.unwrap();
    let mut stream = amqp::subscribe(&channel, exchange, keys, false)
        .await
        .expect("subscribe");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(d)) = stream.next().await {
            let _ = d.acker.ack(BasicAckOptions::default()).await;
            let _ = tx.send(Received {
                exchange: d.exchange.to_string(),
                routing_key: d.routing_key.to_string(),
                headers: d.properties.headers().clone().unwrap_or_default(),
                content_type: d.properties.content_type().as_ref().map(|c| c.to_string()),
                body: d.data,
            });
        }
    });
    Consumer { rx, _conn: conn }
}

/// Exchange names of one test.
#[derive(Clone)]
pub struct Names {
    pub job: String,
    pub core: String,
}

pub async fn rabbit_reachable() -> bool {
    match Connection::connect(&amqp_url(), ConnectionProperties::default()).await {
        Ok(c) => {
            let _ = c.close(200, "probe".into()).await;
            true
        }
        Err(e) if services_required() => panic!("RabbitMQ required but not reachable: {e}"),
        Err(e) => {
            eprintln!("skipped: RabbitMQ not reachable: {e}");
            false
        }
    }
}

/// Turns streaming on in a node's configuration: the broker at `url`, the
/// test's own exchanges.
pub fn streaming_on(c: &mut fastack_core::Config, url: String, names: &Names) {
    c.sections.set(fastack_actors::sinks::amqp::AmqpSettings {
        url: Some(url),
        cloudevents_source: Some(SOURCE.to_owned()),
        job_events_exchange: names.job.clone(),
        core_events_exchange: names.core.clone(),
    });
}

/// A server with AMQP streaming on (through `via`, a proxy, if given).
pub async fn streaming_app(
    backend: Backend,
    via: Option<String>,
    tweak: impl FnOnce(&mut fastack_core::Config),
) -> Option<(TestApp, Names)> {
    if !rabbit_reachable().await {
        return None;
    }
    let db = Arc::new(TestDb::new(backend).await?);
    let names = Names {
        job: format!("{}.job.events", db.redis_prefix),
        core: format!("{}.core.events", db.redis_prefix),
    };
    let n = names.clone();
    let app = spawn_on(db, move |c| {
        streaming_on(c, via.unwrap_or_else(amqp_url), &n);
        tweak(c);
    })
    .await;
    Some((app, names))
}

pub async fn delete_exchanges(names: &Names) {
    if let Ok(conn) = Connection::connect(&amqp_url(), ConnectionProperties::default()).await {
        let ch = conn.create_channel().await.unwrap();
        for x in [&names.job, &names.core] {
            let _ = ch
                .exchange_delete(x.as_str().into(), ExchangeDeleteOptions::default())
                .await;
        }
        let _ = conn.close(200, "done".into()).await;
    }
}

async fn send_events(app: &TestApp, n: usize, prefix: &str) -> Vec<String> {
    send_events_at(app, n, prefix, Utc::now()).await
}

async fn send_events_at(
    app: &TestApp,
    n: usize,
    prefix: &str,
    now: chrono::DateTime<Utc>,
) -> Vec<String> {
    let items: Vec<Value> = (0..n)
        .map(|i| {
            let mut t = track(
                &format!("{prefix}-{i}"),
                &format!("u{}", i % 3),
                now - chrono::Duration::seconds(i as i64),
            );
            t["type"] = json!("track");
            t
        })
        .collect();
    let a = app
        .post("/v1/core/batch", &app.t.key, &json!({"batch": items}))
        .await;
    assert_eq!(a.status, 202, "{}", a.body);
    a.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect()
}

async fn wait_processed(app: &TestApp, n: usize) {
    let from = (Utc::now() - chrono::Duration::days(1)).to_rfc3339();
    let to = (Utc::now() + chrono::Duration::days(1)).to_rfc3339();
    eventually("events processed", Duration::from_secs(20), || async {
        (app.events(&app.t.key, &from, &to, "").await.len() >= n).then_some(())
    })
    .await;
}

async fn export(app: &TestApp, metadata: Value) -> String {
    let from = (Utc::now() - chrono::Duration::days(1)).to_rfc3339();
    let to = (Utc::now() + chrono::Duration::days(1)).to_rfc3339();
    let a = app
        .post(
            "/v1/core/exports",
            &app.t.key,
            &json!({"from": from, "to": to, "metadata": metadata}),
        )
        .await;
    assert_eq!(a.status, 202, "{}", a.body);
    a.body["job_id"].as_str().unwrap().to_owned()
}

async fn job(app: &TestApp, id: &str) -> (Value, Vec<u8>) {
    let resp = app
        .http
        .get(app.url(&format!("/v1/core/jobs/{id}")))
        .bearer_auth(&app.t.key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let bytes = resp.bytes().await.unwrap().to_vec();
    (serde_json::from_slice(&bytes).unwrap(), bytes)
}

/// `GET /v1/core/jobs/{id}/result` with the tenant's key.
async fn download(app: &TestApp, job_id: &str) -> reqwest::Response {
    app.http
        .get(app.url(&format!("/v1/core/jobs/{job_id}/result")))
        .bearer_auth(&app.t.key)
        .send()
        .await
        .unwrap()
}

async fn wait_terminal(app: &TestApp, id: &str) -> (Value, Vec<u8>) {
    eventually("the job to end", Duration::from_secs(30), || async {
        let (doc, bytes) = job(app, id).await;
        matches!(doc["status"].as_str(), Some("completed" | "failed")).then_some((doc, bytes))
    })
    .await
}

/// `fastack keys external-hmac [--tenant …]` on the app's configuration.
fn external_hmac(app: &TestApp, tenant: Option<&str>) -> Vec<u8> {
    let mut cmd = std::process::Command::new(bin_path());
    cmd.args(["keys", "external-hmac"])
        .env_clear()
        .envs(app.db.env());
    if let Some(t) = tenant {
        cmd.args(["--tenant", t]);
    }
    let out = cmd.output().expect("run fastack keys");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    hex::decode(String::from_utf8(out.stdout).unwrap().trim()).unwrap()
}

const HEADERS: [&str; 11] = [
    "ce-specversion",
    "ce-id",
    "ce-source",
    "ce-type",
    "ce-time",
    "ce-subject",
    "ce-resourcetype",
    "ce-eventtype",
    "ce-schemaversion",
    "ce-datacontenttype",
    "ce-tenantid",
];

async fn completed_export_event_verifies(backend: Backend) {
    let Some((app, names)) = streaming_app(backend, None, |_| {}).await else {
        return;
    };
    let mut sub = consumer(&names.job, &["job.completed", "job.failed"]).await;
    send_events(&app, 20, "exp").await;
    wait_processed(&app, 20).await;
    let job_id = export(
        &app,
        json!({"source": "payments", "correlationId": "settlement-1"}),
    )
    .await;
    let (doc, get_bytes) = wait_terminal(&app, &job_id).await;
    assert_eq!(doc["status"], "completed", "{doc}");

    let msg = sub
        .next(Duration::from_secs(15))
        .await
        .expect("job.completed arrives");
    assert_eq!(msg.routing_key, "job.completed");
    assert_eq!(msg.exchange, names.job);
    for h in HEADERS {
        assert!(
            amqp::header_str(&msg.headers, h).is_some(),
            "header {h} missing"
        );
    }
    assert_eq!(msg.header("ce-specversion"), "1.0");
    assert_eq!(
        msg.header("ce-id"),
        format!("fastack.job.completed.{job_id}")
    );
    assert_eq!(msg.header("ce-source"), SOURCE);
    assert_eq!(msg.header("ce-type"), "io.fastack.job.completed");
    assert_eq!(msg.header("ce-subject"), job_id);
    assert_eq!(msg.header("ce-resourcetype"), "job");
    assert_eq!(msg.header("ce-eventtype"), "completed");
    assert_eq!(msg.header("ce-schemaversion"), "1.0.0");
    assert_eq!(msg.header("ce-datacontenttype"), "application/json");
    assert_eq!(msg.content_type.as_deref(), Some("application/json"));
    assert_eq!(msg.header("ce-tenantid"), app.t.tenant.id.to_string());
    assert!(chrono::DateTime::parse_from_rfc3339(&msg.header("ce-time")).is_ok());
    assert_eq!(msg.header("signature-version"), "v1");

    // The signature verifies with the deployment key the CLI prints.
    let deployment_key = external_hmac(&app, None);
    amqp::verify(
        &deployment_key,
        &msg.headers,
        &msg.exchange,
        &msg.routing_key,
        &msg.body,
        Utc::now(),
    )
    .expect("signature verifies");
    assert!(
        amqp::verify(
            &[0u8; 32],
            &msg.headers,
            &msg.exchange,
            &msg.routing_key,
            &msg.body,
            Utc::now()
        )
        .is_err()
    );
    // The binding turns it back into a CloudEvent.
    let event =
        amqp::event_from_message(&msg.headers, msg.content_type.as_deref(), &msg.body).unwrap();
    assert_eq!(
        cloudevents::AttributesReader::id(&event),
        format!("fastack.job.completed.{job_id}")
    );

    // The body is exactly what GET /v1/core/jobs/{id} returns.
    assert_eq!(msg.body, get_bytes);
    let body = msg.json();
    assert_eq!(body["job_id"], job_id);
    assert_eq!(body["status"], "completed");
    assert_eq!(
        body["metadata"],
        json!({"source": "payments", "correlationId": "settlement-1"})
    );
    let result = &body["result"];
    assert_eq!(
        result["path"],
        format!("exports/{}/{job_id}.ndjson", app.t.tenant.id)
    );
    assert_eq!(result["row_count"], 20);
    assert_eq!(result["format"], "ndjson");
    assert_eq!(result["integrity"]["algorithm"], "HMAC-SHA256");
    assert_eq!(result["integrity"]["signature"], result["hmac"]);
    assert_eq!(
        result["protection"],
        json!({"encrypted": true, "applied_by": "adapter", "mode": "adapter-managed"})
    );
    assert!(body["execution_time_ms"].is_number());
    assert!(body["completed_at"].is_string());

    // The result downloads, decrypts, and its HMAC verifies with the
    // tenant's external key.
    let resp = download(&app, &job_id).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let ndjson = resp.bytes().await.unwrap();
    assert_eq!(ndjson.len() as u64, result["size_bytes"].as_u64().unwrap());
    let lines: Vec<Value> = ndjson
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 20);
    assert_eq!(lines[0]["type"], "track");
    let tenant_key = external_hmac(&app, Some("acme"));
    assert!(fastack_core::crypto::hmac_verify_hex(
        &tenant_key,
        &[&ndjson],
        result["hmac"].as_str().unwrap()
    ));
    // The stored object is not plaintext.
    let stored = std::fs::read(
        app.db
            .dir
            .path()
            .join("objects")
            .join(result["path"].as_str().unwrap()),
    )
    .unwrap();
    assert!(!stored.windows(5).any(|w| w == b"track"));

    // Exactly one logical event for the job.
    let more = sub.drain(Duration::from_secs(2)).await;
    let ids: HashSet<String> = more
        .iter()
        .map(|m| m.header("ce-id"))
        .chain([msg.header("ce-id")])
        .collect();
    assert_eq!(ids.len(), 1);
    let listed = app.get("/v1/core/jobs?status=completed", &app.t.key).await;
    assert_eq!(listed.body["jobs"].as_array().unwrap().len(), 1);
    delete_exchanges(&names).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_completed_export_event_verifies() {
    completed_export_event_verifies(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_completed_export_event_verifies() {
    completed_export_event_verifies(Backend::Sqlite).await;
}

/// The production storage path for exports: the encrypted result goes to an
/// S3-compatible bucket and downloads from there, decrypted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_to_s3_round_trips() {
    let Some(bucket) = S3Bucket::create().await else {
        return;
    };
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let app = spawn_on(Arc::new(db), |c| bucket.apply(c)).await;
    let sent: HashSet<String> = send_events(&app, 12, "s3").await.into_iter().collect();
    wait_processed(&app, 12).await;
    let job_id = export(&app, json!({"to": "s3"})).await;
    let (doc, _) = wait_terminal(&app, &job_id).await;
    assert_eq!(doc["status"], "completed", "{doc}");
    let result = &doc["result"];
    let path = result["path"].as_str().unwrap();

    let resp = download(&app, &job_id).await;
    assert_eq!(resp.status(), 200);
    let ndjson = resp.bytes().await.unwrap();
    assert_eq!(ndjson.len() as u64, result["size_bytes"].as_u64().unwrap());
    let ids: HashSet<String> = ndjson
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            serde_json::from_slice::<Value>(l).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(ids, sent);

    // The object sits in the bucket under the configured prefix, encrypted.
    let key = format!("fastack/{path}");
    assert!(bucket.keys().await.contains(&key), "{key} not in bucket");
    let objects =
        fastack_core::objects::Objects::from_config(&app.server.as_ref().unwrap().state().config)
            .unwrap();
    let stored = objects.get(path).await.unwrap();
    assert!(!stored.is_empty());
    assert!(!stored.windows(5).any(|w| w == b"track"));
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_export_emits_job_failed_redacted() {
    // Storage is an S3 endpoint behind a proxy, there at start (the node
    // checks it) and gone before the export: every write fails with an
    // error naming the address.
    let Some(bucket) = S3Bucket::create().await else {
        return;
    };
    let proxy = crate::netfault::Proxy::start(bucket.addr()).await;
    let via = format!("http://{}", proxy.addr);
    let Some((app, names)) = streaming_app(Backend::Postgres, None, |c| {
        bucket.apply(c);
        c.s3.endpoint = Some(via);
    })
    .await
    else {
        return;
    };
    proxy.cut();
    let mut sub = consumer(&names.job, &["job.*"]).await;
    send_events(&app, 3, "f").await;
    wait_processed(&app, 3).await;
    let job_id = export(
        &app,
        json!({"source": "payments", "error": "caller's own value"}),
    )
    .await;
    let msg = sub
        .next(Duration::from_secs(40))
        .await
        .expect("job.failed arrives");
    assert_eq!(msg.routing_key, "job.failed");
    assert_eq!(msg.header("ce-id"), format!("fastack.job.failed.{job_id}"));
    assert_eq!(msg.header("ce-type"), "io.fastack.job.failed");
    assert_eq!(msg.header("ce-eventtype"), "failed");
    let body = msg.json();
    assert_eq!(body["status"], "failed");
    assert!(body.get("result").is_none());
    assert!(body.get("completed_at").is_none());
    assert_eq!(body["metadata"]["source"], "payments");
    let message = body["metadata"]["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("[redacted]"), "{message}");
    assert!(!message.contains("127.0.0.1"), "address leaked: {message}");
    assert!(!message.contains("http://"), "uri leaked: {message}");
    let (doc, bytes) = job(&app, &job_id).await;
    assert_eq!(doc["status"], "failed");
    assert_eq!(bytes, msg.body);
    let r = app
        .get(&format!("/v1/core/jobs/{job_id}/result"), &app.t.key)
        .await;
    assert_eq!(r.status, 409);
    assert_eq!(r.body["code"], "job_not_completed");
    delete_exchanges(&names).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_outage_delays_but_loses_nothing() {
    if !rabbit_reachable().await {
        return;
    }
    let proxy = crate::netfault::Proxy::start("127.0.0.1:5672".parse().unwrap()).await;
    let Some((app, names)) = streaming_app(Backend::Postgres, Some(proxy.amqp_url()), |_| {}).await
    else {
        return;
    };
    let mut sub = consumer(&names.job, &["job.completed"]).await;
    send_events(&app, 5, "o").await;
    wait_processed(&app, 5).await;
    // Broker reachable: one job goes through.
    let first = export(&app, json!({"n": 0})).await;
    let m = sub
        .next(Duration::from_secs(15))
        .await
        .expect("first event");
    assert_eq!(m.header("ce-subject"), first);

    proxy.cut();
    let mut jobs = Vec::new();
    for n in 1..=5 {
        jobs.push(export(&app, json!({"n": n})).await);
    }
    for id in &jobs {
        let (doc, _) = wait_terminal(&app, id).await;
        assert_eq!(doc["status"], "completed");
    }
    assert!(
        sub.next(Duration::from_secs(2)).await.is_none(),
        "nothing can arrive while the broker is away"
    );

    proxy.restore();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !jobs.iter().all(|j| seen.contains_key(j)) {
        assert!(
            std::time::Instant::now() < deadline,
            "events lost after the outage: {seen:?}"
        );
        if let Some(m) = sub.next(Duration::from_millis(500)).await {
            *seen.entry(m.header("ce-subject")).or_default() += 1;
        }
    }
    delete_exchanges(&names).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repairer_reemits_when_the_marker_stays_set() {
    let Some((app, names)) = streaming_app(Backend::Postgres, None, |c| {
        c.repair_interval = Duration::from_millis(500);
    })
    .await
    else {
        return;
    };
    let mut sub = consumer(&names.job, &["job.completed"]).await;
    let job_id = export(&app, json!({})).await;
    let first = sub
        .next(Duration::from_secs(15))
        .await
        .expect("first emission");
    // The marker is cleared once the broker confirmed.
    let pool = app.db.pg_pool().await;
    let id: uuid::Uuid = job_id.parse().unwrap();
    eventually("the marker cleared", Duration::from_secs(10), || async {
        let pending: bool = sqlx::query_scalar("SELECT event_pending FROM jobs WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
        (!pending).then_some(())
    })
    .await;
    // Simulate a crash between the confirm and clearing the marker.
    sqlx::query("UPDATE jobs SET event_pending = true WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    let again = sub
        .next(Duration::from_secs(5))
        .await
        .expect("the repairer re-emits within one sweep");
    assert_eq!(again.header("ce-id"), first.header("ce-id"));
    assert_eq!(again.body, first.body);
    let deployment_key = external_hmac(&app, None);
    amqp::verify(
        &deployment_key,
        &again.headers,
        &again.exchange,
        &again.routing_key,
        &again.body,
        Utc::now(),
    )
    .unwrap();
    eventually(
        "the marker cleared again",
        Duration::from_secs(10),
        || async {
            let pending: bool = sqlx::query_scalar("SELECT event_pending FROM jobs WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap();
            (!pending).then_some(())
        },
    )
    .await;
    assert!(
        sub.next(Duration::from_secs(2)).await.is_none(),
        "one repair, not a storm"
    );
    pool.close().await;
    delete_exchanges(&names).await;
    app.cleanup().await;
}

async fn tracked_events_stream_once(backend: Backend) {
    let Some((app, names)) = streaming_app(backend, None, |_| {}).await else {
        return;
    };
    let mut sub = consumer(&names.core, &["core.event.tracked"]).await;
    let mut accepted = HashSet::new();
    let at = Utc::now();
    for round in 0..4 {
        accepted.extend(send_events_at(&app, 50, &format!("s{round}"), at).await);
    }
    // Retries of the same keys: duplicates, no new events downstream.
    accepted.extend(send_events_at(&app, 50, "s0", at).await);
    assert_eq!(accepted.len(), 200);
    let mut got: HashMap<String, Received> = HashMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while got.len() < 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "only {} of 200 events arrived",
            got.len()
        );
        if let Some(m) = sub.next(Duration::from_millis(500)).await {
            got.insert(m.header("ce-id"), m);
        }
    }
    let extra = sub.drain(Duration::from_secs(1)).await;
    for m in extra {
        got.insert(m.header("ce-id"), m);
    }
    assert_eq!(
        got.len(),
        200,
        "exactly one logical event per accepted event"
    );
    let deployment_key = external_hmac(&app, None);
    for (ce_id, m) in &got {
        let subject = m.header("ce-subject");
        assert_eq!(ce_id, &format!("fastack.event.tracked.{subject}"));
        assert!(accepted.contains(&subject));
        assert_eq!(m.header("ce-type"), "io.fastack.event.tracked");
        assert_eq!(m.json()["id"], subject);
        amqp::verify(
            &deployment_key,
            &m.headers,
            &m.exchange,
            &m.routing_key,
            &m.body,
            Utc::now(),
        )
        .unwrap();
    }
    delete_exchanges(&names).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_tracked_events_stream_once() {
    tracked_events_stream_once(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_tracked_events_stream_once() {
    tracked_events_stream_once(Backend::Sqlite).await;
}

#[tokio::test]
async fn serve_refuses_amqp_without_source_or_exchange() {
    let dir = tempfile::tempdir().unwrap();
    for (name, value, expect) in [
        (
            "FASTACK_CLOUDEVENTS_SOURCE",
            "",
            "FASTACK_CLOUDEVENTS_SOURCE",
        ),
        ("FASTACK_JOB_EVENTS_EXCHANGE", "", "EXCHANGE"),
    ] {
        let mut cmd = std::process::Command::new(bin_path());
        cmd.arg("serve")
            .env_clear()
            .env("FASTACK_DATA_DIR", dir.path())
            .env("FASTACK_LISTEN", "127.0.0.1:0")
            .env("FASTACK_AMQP_URL", amqp_url())
            .env("FASTACK_CLOUDEVENTS_SOURCE", "//x")
            .env(name, value);
        let out = cmd.output().unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expect), "{stderr}");
    }
}

/// Two nodes' repairers sweeping at once re-emit a stuck event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repairers_on_two_nodes_do_the_work_once() {
    let Some((a, names)) = streaming_app(Backend::Postgres, None, |c| {
        c.repair_interval = Duration::from_millis(300);
    })
    .await
    else {
        return;
    };
    let n = names.clone();
    let b = spawn_on(a.db.clone(), move |c| {
        streaming_on(c, amqp_url(), &n);
        c.repair_interval = Duration::from_millis(300);
    })
    .await;
    let mut sub = consumer(&names.job, &["job.completed"]).await;
    let mut jobs = Vec::new();
    for i in 0..5 {
        jobs.push(export(&a, json!({"n": i})).await);
    }
    let mut first = HashSet::new();
    while first.len() < 5 {
        let m = sub
            .next(Duration::from_secs(20))
            .await
            .expect("first emissions");
        first.insert(m.header("ce-id"));
    }
    let pool = a.db.pg_pool().await;
    until_none_left(
        &pool,
        "markers cleared",
        "SELECT count(*) FROM jobs WHERE event_pending",
        Duration::from_secs(10),
    )
    .await;
    // Five crashes between confirm and clear, both repairers sweeping.
    sqlx::query("UPDATE jobs SET event_pending = true WHERE kind = 'export'")
        .execute(&pool)
        .await
        .unwrap();
    let again = sub.drain(Duration::from_secs(3)).await;
    let mut counts: HashMap<String, usize> = HashMap::new();
    for m in &again {
        *counts.entry(m.header("ce-id")).or_default() += 1;
    }
    assert_eq!(counts.len(), 5, "every stuck event re-emitted: {counts:?}");
    assert!(
        counts.values().all(|c| *c == 1),
        "re-emitted once each, not by both nodes: {counts:?}"
    );
    assert_eq!(first, counts.keys().cloned().collect::<HashSet<_>>());
    pool.close().await;
    delete_exchanges(&names).await;
    b.stop().await;
    a.cleanup().await;
}
