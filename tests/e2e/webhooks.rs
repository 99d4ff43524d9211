//! Webhook delivery against real HTTP receivers on 127.0.0.1 (seed 004, the
//! receiver's guide): Standard Webhooks signatures that an independent
//! library verifies, retries ~2 s and ~8 s apart with one webhook-id,
//! 404/410 retiring an endpoint, retries that survive a restart, no
//! head-of-line blocking, secret rotation, and endpoints that only the
//! admin surface can create.

use std::{
    collections::VecDeque,
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use chrono::Utc;
use parking_lot::Mutex;
use poem::{
    EndpointExt, Request, Response, Route, handler,
    http::{HeaderMap, StatusCode},
    listener::{Acceptor, Listener, TcpListener},
    web::Data,
};
use serde_json::{Value, json};

use crate::helpers::{
    Backend, Node, TestApp, TestDb, answer, bin_path, eventually, spawn_on, track,
};

pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789abcdef";

/// What a receiver does with a request.
#[derive(Clone, Copy, Debug)]
pub enum Reply {
    Status(u16),
    /// Holds the request open this long, then answers 200.
    Hang(Duration),
}

/// One request a receiver saw.
#[derive(Clone, Debug)]
pub struct Hit {
    pub at: Instant,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Hit {
    pub fn header(&self, name: &str) -> String {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    }
}

#[derive(Default)]
struct ReceiverState {
    hits: Mutex<Vec<Hit>>,
    script: Mutex<VecDeque<Reply>>,
}

/// An HTTP receiver answering from a script (then 200).
pub struct Receiver {
    pub addr: SocketAddr,
    state: Arc<ReceiverState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

#[handler]
async fn receive(req: &Request, body: Vec<u8>, state: Data<&Arc<ReceiverState>>) -> Response {
    state.hits.lock().push(Hit {
        at: Instant::now(),
        headers: req.headers().clone(),
        body,
    });
    let reply = state
        .script
        .lock()
        .pop_front()
        .unwrap_or(Reply::Status(200));
    match reply {
        Reply::Status(code) => {
            let mut r = Response::builder().status(StatusCode::from_u16(code).unwrap());
            if code == 302 {
                r = r.header("location", "http://127.0.0.1:1/elsewhere");
            }
            r.body("ok")
        }
        Reply::Hang(d) => {
            tokio::time::sleep(d).await;
            Response::builder().status(StatusCode::OK).body("late")
        }
    }
}

impl Receiver {
    pub async fn start(script: &[Reply]) -> Receiver {
        let state = Arc::new(ReceiverState::default());
        state.script.lock().extend(script.iter().copied());
        let acceptor = TcpListener::bind("127.0.0.1:0")
            .into_acceptor()
            .await
            .unwrap();
        let addr = acceptor.local_addr()[0].as_socket_addr().copied().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let app = Route::new()
            .at("/*path", poem::post(receive))
            .data(state.clone());
        tokio::spawn(async move {
            let _ = poem::Server::new_with_acceptor(acceptor)
                .run_with_graceful_shutdown(
                    app,
                    async move {
                        let _ = rx.await;
                    },
                    Some(Duration::from_millis(100)),
                )
                .await;
        });
        Receiver {
            addr,
            state,
            stop: Some(tx),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/hooks", self.addr)
    }

    /// What the next requests are answered (then 200 again).
    pub fn script(&self, replies: &[Reply]) {
        self.state.script.lock().extend(replies.iter().copied());
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.state.hits.lock().clone()
    }

    pub async fn wait_hits(&self, n: usize, within: Duration) -> Vec<Hit> {
        eventually(
            &format!("{n} deliveries at {}", self.addr),
            within,
            || async {
                let h = self.hits();
                (h.len() >= n).then_some(h)
            },
        )
        .await
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// A server with the admin listener on and private receivers allowed.
pub async fn webhook_app(backend: Backend) -> Option<TestApp> {
    let db = Arc::new(TestDb::new(backend).await?);
    Some(spawn_on(db, tweak).await)
}

/// Allows (or refuses) receivers on private addresses.
pub fn allow_private(c: &mut fastack_core::Config, allow: bool) {
    let mut settings = fastack_actors::sinks::webhooks::WebhookSettings::of(c).clone();
    settings.allow_private = allow;
    c.sections.set(settings);
}

pub fn tweak(c: &mut fastack_core::Config) {
    c.admin_token = Some(ADMIN_TOKEN.to_owned());
    c.admin_listen = "127.0.0.1:0".parse().unwrap();
    allow_private(c, true);
}

pub fn admin_url(app: &TestApp, path: &str) -> String {
    format!(
        "http://{}{path}",
        app.server.as_ref().unwrap().admin_addr().unwrap()
    )
}

pub async fn admin_post(app: &TestApp, path: &str, body: Value) -> crate::helpers::Answer {
    let resp = app
        .http
        .post(admin_url(app, path))
        .bearer_auth(ADMIN_TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    answer(resp).await
}

pub async fn admin_get(app: &TestApp, path: &str) -> crate::helpers::Answer {
    let resp = app
        .http
        .get(admin_url(app, path))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    answer(resp).await
}

/// Registers an endpoint through the admin listener: (id, secret).
pub async fn register(app: &TestApp, url: &str, events: &[&str]) -> (String, String) {
    let a = admin_post(
        app,
        "/admin/v1/tenants/acme/webhooks",
        json!({"url": url, "events": events}),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    assert!(a.body["secret"].as_str().unwrap().starts_with("whsec_"));
    (
        a.body["id"].as_str().unwrap().to_owned(),
        a.body["secret"].as_str().unwrap().to_owned(),
    )
}

pub async fn deliveries(app: &TestApp, endpoint: &str) -> Vec<Value> {
    let a = admin_get(
        app,
        &format!("/admin/v1/tenants/acme/deliveries?endpoint={endpoint}"),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    a.body.as_array().unwrap().clone()
}

pub async fn send(app: &TestApp, key: &str) -> String {
    let a = app
        .post("/v1/core/track", &app.t.key, &track(key, "u", Utc::now()))
        .await;
    assert_eq!(a.status, 202, "{}", a.body);
    a.body["id"].as_str().unwrap().to_owned()
}

pub fn verify_independently(secret: &str, hit: &Hit) {
    let wh = standardwebhooks::Webhook::new(secret).expect("secret accepted by standardwebhooks");
    wh.verify(&hit.body, &hit.headers)
        .expect("standardwebhooks verifies the delivery");
}

async fn delivery_verifies_with_standard_webhooks(backend: Backend) {
    let Some(app) = webhook_app(backend).await else {
        return;
    };
    let rx = Receiver::start(&[]).await;
    let (_, secret) = register(&app, &rx.url(), &["core.event.tracked", "job.completed"]).await;
    let id = send(&app, "wh-1").await;
    let hit = rx.wait_hits(1, Duration::from_secs(15)).await.remove(0);
    verify_independently(&secret, &hit);
    assert_eq!(hit.header("webhook-event"), "core.event.tracked");
    assert_eq!(hit.header("content-type"), "application/json");
    assert!(hit.header("webhook-id").starts_with("msg_"));
    let body: Value = serde_json::from_slice(&hit.body).unwrap();
    assert_eq!(body["id"], id);
    assert_eq!(body["type"], "track");
    // Our own verify agrees.
    fastack_core::webhooks::verify(
        &secret,
        &hit.header("webhook-id"),
        &hit.header("webhook-timestamp"),
        &hit.header("webhook-signature"),
        &hit.body,
        Utc::now(),
    )
    .unwrap();

    // A job's terminal event: the body is exactly GET /v1/core/jobs/{id}.
    let from = (Utc::now() - chrono::Duration::days(1)).to_rfc3339();
    let to = (Utc::now() + chrono::Duration::days(1)).to_rfc3339();
    let job = app
        .post(
            "/v1/core/exports",
            &app.t.key,
            &json!({"from": from, "to": to}),
        )
        .await;
    let job_id = job.body["job_id"].as_str().unwrap().to_owned();
    let hits = eventually(
        "job.completed delivered",
        Duration::from_secs(20),
        || async {
            rx.hits()
                .into_iter()
                .find(|h| h.header("webhook-event") == "job.completed")
        },
    )
    .await;
    verify_independently(&secret, &hits);
    let resp = app
        .http
        .get(app.url(&format!("/v1/core/jobs/{job_id}")))
        .bearer_auth(&app.t.key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.bytes().await.unwrap().to_vec(), hits.body);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_delivery_verifies_with_standard_webhooks() {
    delivery_verifies_with_standard_webhooks(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_delivery_verifies_with_standard_webhooks() {
    delivery_verifies_with_standard_webhooks(Backend::Sqlite).await;
}

fn secs_between(a: &Hit, b: &Hit) -> f64 {
    b.at.duration_since(a.at).as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_at_two_and_eight_seconds_with_one_webhook_id() {
    let Some(app) = webhook_app(Backend::Postgres).await else {
        return;
    };
    let rx = Receiver::start(&[Reply::Status(500), Reply::Status(500), Reply::Status(200)]).await;
    let (endpoint, secret) = register(&app, &rx.url(), &["core.event.tracked"]).await;
    send(&app, "retry-1").await;
    let hits = rx.wait_hits(3, Duration::from_secs(25)).await;
    assert_eq!(hits.len(), 3);
    let first_gap = secs_between(&hits[0], &hits[1]);
    let second_gap = secs_between(&hits[1], &hits[2]);
    assert!(
        (1.6..=3.2).contains(&first_gap),
        "second attempt {first_gap:.2}s after the first"
    );
    assert!(
        (7.0..=9.5).contains(&second_gap),
        "third attempt {second_gap:.2}s after the second"
    );
    let ids: Vec<String> = hits.iter().map(|h| h.header("webhook-id")).collect();
    assert!(ids.iter().all(|i| i == &ids[0]), "one webhook-id: {ids:?}");
    let stamps: Vec<String> = hits.iter().map(|h| h.header("webhook-timestamp")).collect();
    assert_ne!(stamps[0], stamps[2], "webhook-timestamp is per attempt");
    for h in &hits {
        verify_independently(&secret, h);
    }
    // The attempt log shows all three (no bodies kept).
    let log = eventually("delivered status", Duration::from_secs(5), || async {
        let d = deliveries(&app, &endpoint).await;
        (d.len() == 1 && d[0]["status"] == "delivered").then_some(d)
    })
    .await;
    let attempts = log[0]["attempts"].as_array().unwrap();
    let codes: Vec<u64> = attempts
        .iter()
        .map(|a| a["status_code"].as_u64().unwrap())
        .collect();
    assert_eq!(codes, vec![500, 500, 200]);
    assert_eq!(log[0]["webhook_id"], ids[0].as_str());
    assert!(attempts.iter().all(|a| a.get("body").is_none()));
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_failures_then_the_delivery_fails() {
    let Some(app) = webhook_app(Backend::Sqlite).await else {
        return;
    };
    let rx = Receiver::start(&[
        Reply::Status(500),
        Reply::Status(503),
        Reply::Status(302),
        Reply::Status(200),
    ])
    .await;
    let (endpoint, _) = register(&app, &rx.url(), &["core.event.tracked"]).await;
    send(&app, "fail-1").await;
    rx.wait_hits(3, Duration::from_secs(25)).await;
    // A redirect is not followed (the receiver saw no fourth request at the
    // Location) and counts as a failure.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(rx.hits().len(), 3, "exactly three attempts");
    let d = deliveries(&app, &endpoint).await;
    assert_eq!(d[0]["status"], "failed");
    assert_eq!(d[0]["attempts"].as_array().unwrap().len(), 3);
    // Failure of one delivery does not disable the endpoint.
    let ep = admin_get(&app, "/admin/v1/tenants/acme/webhooks").await;
    assert_eq!(ep.body[0]["enabled"], true);
    app.cleanup().await;
}

async fn gone_disables_the_endpoint(backend: Backend, code: u16) {
    let Some(app) = webhook_app(backend).await else {
        return;
    };
    let rx = Receiver::start(&[Reply::Status(code)]).await;
    let (endpoint, _) = register(&app, &rx.url(), &["core.event.tracked"]).await;
    send(&app, "gone-1").await;
    rx.wait_hits(1, Duration::from_secs(15)).await;
    let ep = eventually("the endpoint disabled", Duration::from_secs(5), || async {
        let e = admin_get(&app, "/admin/v1/tenants/acme/webhooks").await;
        (e.body[0]["enabled"] == false).then_some(e.body[0].clone())
    })
    .await;
    assert!(
        ep["disabled_reason"]
            .as_str()
            .unwrap()
            .contains(&code.to_string()),
        "{ep}"
    );
    // Later events are not sent to it; no retry either.
    send(&app, "gone-2").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(rx.hits().len(), 1);
    let d = deliveries(&app, &endpoint).await;
    assert_eq!(d.len(), 1, "no delivery for a disabled endpoint");
    assert_eq!(d[0]["status"], "failed");
    assert_eq!(d[0]["attempts"].as_array().unwrap().len(), 1);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_410_disables_the_endpoint() {
    gone_disables_the_endpoint(Backend::Postgres, 410).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_404_disables_the_endpoint() {
    gone_disables_the_endpoint(Backend::Sqlite, 404).await;
}

async fn retry_survives_a_restart(backend: Backend) {
    let Some(app) = webhook_app(backend).await else {
        return;
    };
    let rx = Receiver::start(&[Reply::Status(500), Reply::Status(200)]).await;
    register(&app, &rx.url(), &["core.event.tracked"]).await;
    send(&app, "restart-1").await;
    rx.wait_hits(1, Duration::from_secs(15)).await;
    // Stop right after attempt 1; attempt 2 falls due while we are down.
    let db = app.stop().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(rx.hits().len(), 1);
    let restarted_at = Instant::now();
    let app = spawn_on(db, tweak).await;
    let hits = rx.wait_hits(2, Duration::from_secs(10)).await;
    let after = hits[1].at.duration_since(restarted_at);
    assert!(
        after < Duration::from_secs(3),
        "attempt 2 came {after:?} after the restart"
    );
    assert_eq!(hits[0].header("webhook-id"), hits[1].header("webhook-id"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(rx.hits().len(), 2, "attempt 2 happened exactly once");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_retry_survives_a_restart() {
    retry_survives_a_restart(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_retry_survives_a_restart() {
    retry_survives_a_restart(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_receiver_does_not_delay_another_endpoint() {
    let Some(app) = webhook_app(Backend::Postgres).await else {
        return;
    };
    let slow = Receiver::start(&[Reply::Hang(Duration::from_secs(30)); 8]).await;
    let fast = Receiver::start(&[]).await;
    register(&app, &slow.url(), &["core.event.tracked"]).await;
    register(&app, &fast.url(), &["core.event.tracked"]).await;
    for i in 0..6 {
        send(&app, &format!("hol-{i}")).await;
    }
    let started = Instant::now();
    fast.wait_hits(6, Duration::from_secs(5)).await;
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "fast endpoint waited {:?}",
        started.elapsed()
    );
    // The slow one holds at most its concurrency bound at a time.
    assert!(slow.hits().len() <= 4, "{}", slow.hits().len());
    app.cleanup().await;
}

/// Send -> received latencies at `receiver` of `n` events sent one by one
/// (each waits for its delivery), sorted.
async fn paced_latencies(
    app: &TestApp,
    receiver: &Receiver,
    prefix: &str,
    n: usize,
) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let before = receiver.hits().len();
        let sent = Instant::now();
        send(app, &format!("{prefix}-{i}")).await;
        let hits = receiver
            .wait_hits(before + 1, Duration::from_secs(10))
            .await;
        out.push(hits[before].at.duration_since(sent));
    }
    out.sort();
    out
}

/// A receiver that takes 2 s per answer beside a fast one: the fast one's
/// latency does not change, and the slow one is not given more requests
/// than it can answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_endpoint_leaves_a_fast_ones_latency_unchanged() {
    let Some(app) = webhook_app(Backend::Postgres).await else {
        return;
    };
    let fast = Receiver::start(&[]).await;
    register(&app, &fast.url(), &["core.event.tracked"]).await;
    let alone = paced_latencies(&app, &fast, "alone", 20).await;

    let slow = Receiver::start(&[Reply::Hang(Duration::from_secs(2)); 200]).await;
    register(&app, &slow.url(), &["core.event.tracked"]).await;
    let beside = paced_latencies(&app, &fast, "beside", 20).await;
    let median = |l: &[Duration]| l[l.len() / 2];
    eprintln!(
        "fast endpoint, median send -> received: alone {:?}, beside a 2 s endpoint {:?}",
        median(&alone),
        median(&beside)
    );
    assert!(
        median(&beside) <= median(&alone) * 2 + Duration::from_millis(20),
        "alone {alone:?}, beside {beside:?}"
    );
    assert!(
        beside[beside.len() - 1] < Duration::from_millis(500),
        "{beside:?}"
    );
    // The slow one got every event it was sent, a few at a time.
    slow.wait_hits(20, Duration::from_secs(30)).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_secret_signs_alongside_the_new_one() {
    let Some(app) = webhook_app(Backend::Sqlite).await else {
        return;
    };
    let rx = Receiver::start(&[]).await;
    let (endpoint, old_secret) = register(&app, &rx.url(), &["core.event.tracked"]).await;
    let r = admin_post(
        &app,
        &format!("/admin/v1/webhooks/{endpoint}/rotate-secret"),
        json!({}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let new_secret = r.body["secret"].as_str().unwrap().to_owned();
    assert_ne!(new_secret, old_secret);
    send(&app, "rot-1").await;
    let hit = rx.wait_hits(1, Duration::from_secs(15)).await.remove(0);
    let sigs = hit.header("webhook-signature");
    assert_eq!(sigs.split(' ').count(), 2, "{sigs}");
    verify_independently(&new_secret, &hit);
    verify_independently(&old_secret, &hit);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_admin_surface_manages_endpoints() {
    let Some(app) = webhook_app(Backend::Sqlite).await else {
        return;
    };
    // No tenant API route creates or changes an endpoint.
    for path in [
        "/v1/core/webhooks",
        "/v1/core/endpoints",
        "/admin/v1/tenants/acme/webhooks",
    ] {
        let a = app
            .post(path, &app.t.key, &json!({"url": "http://example.com"}))
            .await;
        assert_eq!(a.status, 404, "{path}: {}", a.body);
    }
    // The admin listener refuses an API key, and no token at all.
    let resp = app
        .http
        .post(admin_url(&app, "/admin/v1/tenants/acme/webhooks"))
        .bearer_auth(&app.t.key)
        .json(&json!({"url": "http://127.0.0.1:9/x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let resp = app
        .http
        .get(admin_url(&app, "/admin/v1/tenants"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert!(
        admin_get(&app, "/admin/v1/tenants/acme/webhooks")
            .await
            .body
            .as_array()
            .unwrap()
            .is_empty()
    );
    // Bad URLs are refused at registration.
    let a = admin_post(
        &app,
        "/admin/v1/tenants/acme/webhooks",
        json!({"url": "ftp://example.com/x"}),
    )
    .await;
    assert_eq!(a.status, 422);
    assert_eq!(a.body["code"], "invalid_endpoint");
    app.cleanup().await;
}

/// Without FASTACK_WEBHOOK_ALLOW_PRIVATE, private targets are refused
/// (the CLI path).
#[tokio::test]
async fn cli_refuses_private_endpoints_and_shows_the_secret_once() {
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let store = db.store().await;
    crate::helpers::make_tenant(&store, "acme", fastack_entities::Plan::Free, None).await;
    drop(store);
    let run = |args: &[&str], allow: bool| {
        let out = std::process::Command::new(bin_path())
            .args(args)
            .env_clear()
            .envs(db.env())
            .env("FASTACK_WEBHOOK_ALLOW_PRIVATE", allow.to_string())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for url in [
        "http://127.0.0.1:8080/x",
        "http://169.254.169.254/latest",
        "http://localhost/x",
        "http://10.0.0.8/x",
    ] {
        let (ok, _, err) = run(
            &["admin", "webhook", "add", "--tenant", "acme", "--url", url],
            false,
        );
        assert!(!ok, "{url} accepted");
        assert!(err.contains("FASTACK_WEBHOOK_ALLOW_PRIVATE"), "{err}");
        assert!(err.contains("error: endpoint refused:"), "{err}");
    }
    // The README's production example runs as written: a name that does
    // not resolve (yet) is registered, with a note.
    let (ok, out, err) = run(
        &[
            "admin",
            "webhook",
            "add",
            "--tenant",
            "acme",
            "--url",
            "https://hooks.acme.example/fastack",
        ],
        false,
    );
    assert!(ok, "{err}");
    assert!(out.contains("does not resolve"), "{out}");
    let (ok, out, err) = run(
        &[
            "admin",
            "webhook",
            "add",
            "--tenant",
            "acme",
            "--url",
            "http://127.0.0.1:8080/x",
        ],
        true,
    );
    assert!(ok, "{err}");
    assert!(out.contains("whsec_") && out.contains("shown once"));
    let (ok, out, _) = run(&["admin", "webhook", "list", "--tenant", "acme"], true);
    assert!(ok);
    assert!(
        out.contains("http://127.0.0.1:8080/x") && !out.contains("whsec_"),
        "{out}"
    );
}

/// DNS rebinding: an endpoint registered while its name pointed somewhere
/// public (here: registered with private targets allowed) is refused at
/// connect time once the node does not allow private targets. Nothing
/// reaches the receiver; the attempts are logged with the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_addresses_are_refused_at_delivery_time() {
    let Some(app) = webhook_app(Backend::Sqlite).await else {
        return;
    };
    let rx = Receiver::start(&[]).await;
    let by_name = format!("http://localhost:{}/hooks", rx.addr.port());
    let (name_endpoint, _) = register(&app, &by_name, &["core.event.tracked"]).await;
    let (ip_endpoint, _) = register(&app, &rx.url(), &["core.event.tracked"]).await;
    let db = app.stop().await;
    let app = spawn_on(db, |c| {
        tweak(c);
        allow_private(c, false);
    })
    .await;
    send(&app, "rebind-1").await;
    for endpoint in [&name_endpoint, &ip_endpoint] {
        let d = eventually(
            "the first attempt logged",
            Duration::from_secs(15),
            || async {
                let d = deliveries(&app, endpoint).await;
                (d.len() == 1 && !d[0]["attempts"].as_array().unwrap().is_empty()).then_some(d)
            },
        )
        .await;
        let attempt = &d[0]["attempts"][0];
        assert!(attempt["status_code"].is_null(), "{attempt}");
        assert_eq!(attempt["error_kind"], "refused_address", "{attempt}");
    }
    assert!(rx.hits().is_empty(), "nothing reached the private receiver");
    app.cleanup().await;
}

/// The admin CLI against a running server on PostgreSQL, as an operator
/// uses it: a tenant and a key created with `--json`, an endpoint added,
/// disabled (events in the meantime are not sent to it) and enabled again
/// (later events are), and the key revoked (it stops working).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_cli_tenant_key_and_endpoint_lifecycle() {
    use sqlx::Connection;
    let Some(app) = webhook_app(Backend::Postgres).await else {
        return;
    };
    let env = app.db.env();
    let cli = |args: &[&str]| -> Value {
        let out = std::process::Command::new(bin_path())
            .args(["admin", "--json"])
            .args(args)
            .env_clear()
            .envs(env.clone())
            .env("FASTACK_WEBHOOK_ALLOW_PRIVATE", "true")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?} printed no JSON: {e}"))
    };

    let tenant = cli(&["tenant", "create", "--name", "cli-co", "--plan", "pro"]);
    assert_eq!(tenant["name"], "cli-co");
    assert_eq!(tenant["plan"], "pro");
    let listed = cli(&["tenant", "list"]);
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["id"] == tenant["id"]),
        "{listed}"
    );
    let key = cli(&["key", "create", "--tenant", "cli-co"]);
    let secret = key["secret"].as_str().unwrap().to_owned();
    let key_id = key["id"].as_str().unwrap().to_owned();

    let rx = Receiver::start(&[]).await;
    let endpoint = cli(&[
        "webhook",
        "add",
        "--tenant",
        "cli-co",
        "--url",
        &rx.url(),
        "--events",
        "core.event.tracked",
    ]);
    assert!(endpoint["secret"].as_str().unwrap().starts_with("whsec_"));
    let endpoint_id = endpoint["id"].as_str().unwrap().to_owned();

    let post = |k: &'static str| {
        let (app, secret) = (&app, secret.clone());
        async move {
            app.post("/v1/core/track", &secret, &track(k, "u", Utc::now()))
                .await
        }
    };
    let body_id = |h: &Hit| -> String {
        serde_json::from_slice::<Value>(&h.body).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let first = post("cli-1").await;
    assert_eq!(first.status, 202, "{}", first.body);
    rx.wait_hits(1, Duration::from_secs(15)).await;

    let disabled = cli(&[
        "webhook",
        "disable",
        "--endpoint",
        &endpoint_id,
        "--reason",
        "maintenance",
    ]);
    assert_eq!(disabled["enabled"], false);
    let while_off = post("cli-2").await;
    assert_eq!(while_off.status, 202);
    // Enable only after that event was stored and fanned out (its outbox
    // row is gone), so it met the endpoint disabled.
    let db_url = app.db.database_url().unwrap();
    let (from, to) = (
        (Utc::now() - chrono::Duration::hours(1)).to_rfc3339(),
        (Utc::now() + chrono::Duration::hours(1)).to_rfc3339(),
    );
    eventually(
        "the event sent while disabled stored and fanned out",
        Duration::from_secs(15),
        || async {
            let stored = app.events(&secret, &from, &to, "").await.len() == 2;
            let mut conn = sqlx::PgConnection::connect(&db_url).await.unwrap();
            let outbox: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
                .fetch_one(&mut conn)
                .await
                .unwrap();
            (stored && outbox == 0).then_some(())
        },
    )
    .await;
    let enabled = cli(&["webhook", "enable", "--endpoint", &endpoint_id]);
    assert_eq!(enabled["enabled"], true);
    let after = post("cli-3").await;
    assert_eq!(after.status, 202);
    let hits = rx.wait_hits(2, Duration::from_secs(15)).await;
    let ids: Vec<String> = hits.iter().map(body_id).collect();
    assert!(ids.contains(&after.body["id"].as_str().unwrap().to_owned()));
    assert!(ids.contains(&first.body["id"].as_str().unwrap().to_owned()));
    // Given the chance, the event sent while disabled still does not come.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ids: Vec<String> = rx.hits().iter().map(body_id).collect();
    assert!(
        !ids.contains(&while_off.body["id"].as_str().unwrap().to_owned()),
        "an event sent while the endpoint was disabled was delivered"
    );

    let revoked = cli(&["key", "revoke", "--key", &key_id]);
    assert_eq!(revoked["revoked"], true);
    eventually(
        "the revoked key refused",
        Duration::from_secs(10),
        || async { (post("cli-4").await.status == 401).then_some(()) },
    )
    .await;
    app.cleanup().await;
}

/// Environment proxies are ignored: with `HTTP_PROXY` and `ALL_PROXY`
/// pointing at a listener, the delivery still goes straight to the
/// receiver (through a proxy, the connect-time address check would not see
/// the receiver's address).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_ignore_environment_proxies() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let rx = Receiver::start(&[]).await;
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    let proxied = Arc::new(AtomicUsize::new(0));
    let seen = proxied.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = proxy.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
            drop(conn);
        }
    });
    let store = db.store().await;
    let t =
        crate::helpers::make_tenant(&store, "acme", fastack_entities::Plan::Enterprise, None).await;
    let keys = fastack_core::keyring::open(store.as_ref(), &db.config(), Utc::now())
        .await
        .unwrap();
    fastack_core::admin::add_webhook(
        store.as_ref(),
        &keys,
        t.tenant.id,
        &rx.url(),
        Some("core.event.tracked"),
        true,
    )
    .await
    .unwrap();
    drop(store);
    let node = crate::helpers::Node::start(
        &db,
        &[
            ("FASTACK_WEBHOOK_ALLOW_PRIVATE", "true"),
            ("HTTP_PROXY", &proxy_url),
            ("http_proxy", &proxy_url),
            ("ALL_PROXY", &proxy_url),
            ("all_proxy", &proxy_url),
        ],
    )
    .await;
    let resp = reqwest::Client::new()
        .post(format!("http://{}/v1/core/track", node.addr))
        .bearer_auth(&t.key)
        .json(&track("proxy-1", "u", Utc::now()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    rx.wait_hits(1, Duration::from_secs(15)).await;
    assert_eq!(
        proxied.load(Ordering::SeqCst),
        0,
        "a delivery went through the proxy"
    );
    drop(node);
    db.drop_db().await;
}

/// `kill -9` while an attempt is in flight (sent, not yet recorded): the
/// restarted node sends the delivery again, with the same webhook-id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_delivery_and_its_record_redelivers_the_same_webhook_id() {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let store = db.store().await;
    let t = crate::helpers::make_tenant(&store, "acme", fastack_entities::Plan::Pro, None).await;
    drop(store);
    // The first attempt is held open until the node is gone.
    let receiver = Receiver::start(&[Reply::Hang(Duration::from_secs(30))]).await;
    let add = std::process::Command::new(bin_path())
        .args(["admin", "webhook", "add", "--tenant", "acme", "--url"])
        .arg(receiver.url())
        .args(["--events", "core.event.tracked"])
        .env_clear()
        .envs(db.env())
        .env("FASTACK_WEBHOOK_ALLOW_PRIVATE", "true")
        .output()
        .unwrap();
    assert!(
        add.status.success(),
        "{}",
        String::from_utf8_lossy(&add.stderr)
    );
    let env = [
        ("FASTACK_WEBHOOK_ALLOW_PRIVATE", "true"),
        ("FASTACK_WEBHOOK_CLAIM_MS", "1500"),
    ];
    let mut node = Node::start(&db, &env).await;
    let http = reqwest::Client::new();
    let resp = http
        .post(format!("http://{}/v1/core/track", node.addr))
        .bearer_auth(&t.key)
        .json(&track("crash-mid-delivery", "u", Utc::now()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    let first = receiver.wait_hits(1, Duration::from_secs(10)).await;
    node.child.start_kill().expect("SIGKILL");
    let _ = node.child.wait().await;

    let mut node = Node::start(&db, &env).await;
    let hits = receiver.wait_hits(2, Duration::from_secs(20)).await;
    assert_eq!(hits[1].header("webhook-id"), first[0].header("webhook-id"));
    assert_eq!(hits[1].body, first[0].body);
    node.child.start_kill().ok();
    let _ = node.child.wait().await;
    db.drop_db().await;
}

/// An operator's test message and replays, on the admin listener and in
/// the CLI, with the console's rules: a test message goes to the one
/// endpoint whatever it subscribes to and verifies like any delivery; a
/// replay keeps the delivery's `webhook-id`, goes only to an enabled
/// endpoint and leaves a pending delivery alone; replaying every failed
/// delivery since a time takes exactly those.
async fn test_message_and_replay(backend: Backend) {
    let Some(app) = webhook_app(backend).await else {
        return;
    };
    let env = app.db.env();
    let cli = |args: &[&str]| -> (bool, Value, String) {
        let mut all = vec!["admin", "--json"];
        all.extend_from_slice(args);
        let (ok, out, err) = crate::helpers::run_cli(&bin_path(), env.clone(), &all);
        (ok, serde_json::from_str(&out).unwrap_or(Value::Null), err)
    };
    // The first event's delivery is answered 404: it fails and the
    // endpoint is disabled.
    let rx = Receiver::start(&[Reply::Status(404)]).await;
    let (endpoint, secret) = register(&app, &rx.url(), &["core.event.tracked"]).await;

    // A test message, on the admin listener: one `webhook.test` delivery,
    // though the endpoint subscribes to `core.event.tracked` only.
    let rx_ok = Receiver::start(&[]).await;
    let (other, other_secret) = register(&app, &rx_ok.url(), &["job.failed"]).await;
    let t = admin_post(&app, &format!("/admin/v1/webhooks/{other}/test"), json!({})).await;
    assert_eq!(t.status, 202, "{}", t.body);
    let hit = rx_ok.wait_hits(1, Duration::from_secs(15)).await.remove(0);
    verify_independently(&other_secret, &hit);
    assert_eq!(hit.header("webhook-event"), "webhook.test");
    assert_eq!(
        hit.header("webhook-id"),
        t.body["webhook_id"].as_str().unwrap()
    );
    let body: Value = serde_json::from_slice(&hit.body).unwrap();
    assert_eq!(body["type"], "webhook.test");
    assert_eq!(body["endpoint_id"], other.as_str());
    let logged = deliveries(&app, &other).await;
    assert_eq!(logged.len(), 1);
    assert_eq!(logged[0]["id"], t.body["delivery_id"]);
    assert_eq!(logged[0]["event_type"], "webhook.test");

    // The same from the CLI.
    let (ok, sent, err) = cli(&["webhook", "test", "--endpoint", &other]);
    assert!(ok, "{err}");
    let hit = rx_ok.wait_hits(2, Duration::from_secs(15)).await.remove(1);
    verify_independently(&other_secret, &hit);
    assert_eq!(
        hit.header("webhook-id"),
        sent["webhook_id"].as_str().unwrap()
    );
    assert_ne!(
        sent["webhook_id"], t.body["webhook_id"],
        "each test message is new"
    );

    // A delivery that failed (404: the endpoint is disabled too).
    send(&app, "replay-1").await;
    let first = rx.wait_hits(1, Duration::from_secs(15)).await.remove(0);
    let failed = eventually("the delivery failed", Duration::from_secs(10), || async {
        let d = deliveries(&app, &endpoint).await;
        (d.len() == 1 && d[0]["status"] == "failed").then(|| d[0].clone())
    })
    .await;
    let delivery = failed["id"].as_str().unwrap().to_owned();

    // Nothing goes to a disabled endpoint: not a replay, not a test.
    let refused = admin_post(
        &app,
        &format!("/admin/v1/deliveries/{delivery}/replay"),
        json!({}),
    )
    .await;
    assert_eq!(refused.status, 409, "{}", refused.body);
    assert_eq!(refused.body["code"], "conflict");
    let refused = admin_post(
        &app,
        &format!("/admin/v1/webhooks/{endpoint}/test"),
        json!({}),
    )
    .await;
    assert_eq!(refused.status, 409, "{}", refused.body);
    let (ok, _, err) = cli(&["webhook", "replay", "--delivery", &delivery]);
    assert!(!ok && err.contains("disabled"), "{err}");

    // Enabled again, the failed delivery replayed on the admin listener:
    // the same webhook-id, verified.
    let e = admin_post(
        &app,
        &format!("/admin/v1/webhooks/{endpoint}/enable"),
        json!({}),
    )
    .await;
    assert_eq!(e.status, 200, "{}", e.body);
    let r = admin_post(
        &app,
        &format!("/admin/v1/deliveries/{delivery}/replay"),
        json!({}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["replayed"], true);
    let again = rx.wait_hits(2, Duration::from_secs(15)).await.remove(1);
    verify_independently(&secret, &again);
    assert_eq!(again.header("webhook-id"), first.header("webhook-id"));
    assert_eq!(again.body, first.body);
    eventually("the replay delivered", Duration::from_secs(10), || async {
        let d = deliveries(&app, &endpoint).await;
        (d[0]["status"] == "delivered").then_some(())
    })
    .await;

    // The CLI replays one delivery too (delivered already: queued again).
    let (ok, r, err) = cli(&["webhook", "replay", "--delivery", &delivery]);
    assert!(ok, "{err}");
    assert_eq!(r["replayed"], 1);
    let third = rx.wait_hits(3, Duration::from_secs(15)).await.remove(2);
    assert_eq!(third.header("webhook-id"), first.header("webhook-id"));
    verify_independently(&secret, &third);

    // Every failed delivery since a time: two events fail (500 three
    // times each would take ten seconds; 404 fails at once but disables,
    // so the endpoint is enabled again before the replay).
    rx.script(&[Reply::Status(404)]);
    let since = Utc::now();
    send(&app, "replay-2").await;
    eventually(
        "the second delivery failed",
        Duration::from_secs(15),
        || async {
            let d = deliveries(&app, &endpoint).await;
            d.iter().any(|d| d["status"] == "failed").then_some(())
        },
    )
    .await;
    admin_post(
        &app,
        &format!("/admin/v1/webhooks/{endpoint}/enable"),
        json!({}),
    )
    .await;
    let bad = admin_post(
        &app,
        &format!("/admin/v1/webhooks/{endpoint}/replay"),
        json!({"since": "yesterday"}),
    )
    .await;
    assert!(
        bad.status == 400 || bad.status == 422,
        "{} {}",
        bad.status,
        bad.body
    );
    let r = admin_post(
        &app,
        &format!("/admin/v1/webhooks/{endpoint}/replay"),
        json!({"since": since.to_rfc3339()}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["replayed"], 1, "only the delivery failed since then");
    let hits = rx.wait_hits(5, Duration::from_secs(15)).await;
    verify_independently(&secret, &hits[4]);
    assert_eq!(hits[4].header("webhook-id"), hits[3].header("webhook-id"));
    // Nothing failed since: the CLI's form answers 0, and a time it cannot
    // read is refused with the forms it takes.
    let since_text = (Utc::now() + chrono::Duration::seconds(1))
        .format("%Y-%m-%d %H:%M:%S UTC")
        .to_string();
    let (ok, r, err) = cli(&[
        "webhook",
        "replay",
        "--endpoint",
        &endpoint,
        "--since",
        &since_text,
    ]);
    assert!(ok, "{err}");
    assert_eq!(r["replayed"], 0);
    let (ok, _, err) = cli(&[
        "webhook",
        "replay",
        "--endpoint",
        &endpoint,
        "--since",
        "soon",
    ]);
    assert!(!ok && err.contains("YYYY-MM-DD"), "{err}");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_test_message_and_replay() {
    test_message_and_replay(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_test_message_and_replay() {
    test_message_and_replay(Backend::Sqlite).await;
}
