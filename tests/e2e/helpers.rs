//! Test harness: every test gets its own database (a fresh SQLite file, or
//! `CREATE DATABASE t_<uuid>` on the shared PostgreSQL), its own Redis key
//! prefix, and a server on port 0 — so the suite runs in parallel against
//! the real services.
//!
//! PostgreSQL and Redis are found at `FASTACK_TEST_PG_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`) and `FASTACK_TEST_REDIS_URL`
//! (default `redis://127.0.0.1:6379`). When they are unreachable the
//! service-backed variants are skipped with a message, unless
//! `FASTACK_TEST_REQUIRE_SERVICES=1` (set by CI): then they fail.
//!
//! S3-compatible storage is exercised when `FASTACK_TEST_S3_ENDPOINT` names
//! one (`.ci/run` starts moto's server and sets it); each test makes its
//! own bucket there.

use std::{
    future::Future,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use fastack_api::Server;
use fastack_core::{Config, admin, store::Store};
use fastack_entities::{Plan, Tenant};
use serde_json::Value;
use sqlx::{Connection, Executor, PgConnection};
use tempfile::TempDir;
use uuid::Uuid;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

pub fn pg_admin_url() -> String {
    env_or(
        "FASTACK_TEST_PG_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    )
}

pub fn redis_url() -> String {
    env_or("FASTACK_TEST_REDIS_URL", "redis://127.0.0.1:6379")
}

/// The master key of every test deployment (32 bytes, base64).
pub const TEST_ENC_KEY: &str = "ZmFzdGFjay10ZXN0LW1hc3Rlci1rZXktMzItYnl0ZXMh";

pub fn amqp_url() -> String {
    env_or(
        "FASTACK_TEST_AMQP_URL",
        "amqp://guest:guest@127.0.0.1:5672/%2f",
    )
}

pub fn services_required() -> bool {
    std::env::var("FASTACK_TEST_REQUIRE_SERVICES").is_ok_and(|v| v == "1" || v == "true")
}

/// A fresh bucket on the S3-compatible test endpoint.
pub struct S3Bucket {
    pub endpoint: String,
    pub bucket: String,
}

impl S3Bucket {
    /// Creates a bucket on `FASTACK_TEST_S3_ENDPOINT`; `None` (with a
    /// message) when no endpoint is configured. A configured endpoint that
    /// does not answer fails the test.
    pub async fn create() -> Option<S3Bucket> {
        let Ok(endpoint) = std::env::var("FASTACK_TEST_S3_ENDPOINT") else {
            eprintln!("skipping: FASTACK_TEST_S3_ENDPOINT is not set (no S3-compatible endpoint)");
            return None;
        };
        let bucket = format!("t-{}", Uuid::new_v4().simple());
        // moto accepts unsigned bucket creation; the server itself signs.
        let resp = reqwest::Client::new()
            .put(format!("{endpoint}/{bucket}"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("S3 endpoint {endpoint} unreachable: {e}"));
        assert!(
            resp.status().is_success(),
            "create bucket: {}",
            resp.status()
        );
        Some(S3Bucket { endpoint, bucket })
    }

    /// The endpoint's address (a proxy in front of it, for tests that take
    /// it away).
    pub fn addr(&self) -> std::net::SocketAddr {
        self.endpoint
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .expect("the test S3 endpoint is http://host:port")
    }

    /// Points a configuration's object storage at this bucket.
    pub fn apply(&self, c: &mut Config) {
        c.storage_url = Some(format!("s3://{}/fastack", self.bucket));
        c.s3.endpoint = Some(self.endpoint.clone());
        c.s3.region = Some("us-east-1".to_owned());
        c.s3.access_key_id = Some("test".to_owned());
        c.s3.secret_access_key = Some("test".to_owned());
    }

    /// The object keys stored in the bucket (S3 ListObjectsV2).
    pub async fn keys(&self) -> Vec<String> {
        let body = reqwest::Client::new()
            .get(format!("{}/{}?list-type=2", self.endpoint, self.bucket))
            .send()
            .await
            .expect("list bucket")
            .text()
            .await
            .expect("list body");
        body.split("<Key>")
            .skip(1)
            .filter_map(|s| s.split_once("</Key>").map(|(k, _)| k.to_owned()))
            .collect()
    }
}

/// Whether Redis answers a PING; `false` (after saying the test is skipped)
/// when it does not and services are not required, a panic when they are.
pub fn redis_or_skip() -> bool {
    match redis::Client::open(redis_url())
        .and_then(|c| c.get_connection())
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
    {
        Ok(_) => true,
        Err(e) if !services_required() => {
            eprintln!("skipped: Redis not reachable: {e}");
            false
        }
        Err(e) => panic!("Redis required but not reachable: {e}"),
    }
}

/// A database of one test, dropped at the end.
pub struct TestDb {
    pub backend: Backend,
    pub dir: TempDir,
    pub pg_name: Option<String>,
    pub redis_prefix: String,
}

impl TestDb {
    /// `None` when the backend's services are unreachable and not required.
    pub async fn new(backend: Backend) -> Option<TestDb> {
        let dir = tempfile::tempdir().expect("temp dir");
        let redis_prefix = format!("t{}", Uuid::new_v4().simple());
        match backend {
            Backend::Sqlite => Some(TestDb {
                backend,
                dir,
                pg_name: None,
                redis_prefix,
            }),
            Backend::Postgres => {
                let admin = pg_admin_url();
                let mut conn = match PgConnection::connect(&admin).await {
                    Ok(c) => c,
                    Err(e) if !services_required() => {
                        eprintln!("skipped: PostgreSQL not reachable at {admin}: {e}");
                        return None;
                    }
                    Err(e) => panic!("PostgreSQL required but not reachable at {admin}: {e}"),
                };
                if !redis_or_skip() {
                    return None;
                }
                let name = format!("t_{}", Uuid::new_v4().simple());
                conn.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .await
                    .expect("create test database");
                Some(TestDb {
                    backend,
                    dir,
                    pg_name: Some(name),
                    redis_prefix,
                })
            }
        }
    }

    /// A pool on this test's PostgreSQL database (panics on SQLite).
    pub async fn pg_pool(&self) -> sqlx::PgPool {
        sqlx::PgPool::connect(&self.database_url().expect("a PostgreSQL test database"))
            .await
            .expect("connecting to the test database")
    }

    pub fn database_url(&self) -> Option<String> {
        self.pg_name.as_ref().map(|name| {
            let admin = pg_admin_url();
            let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
            format!("{base}/{name}")
        })
    }

    /// Configuration of a node on this database.
    pub fn config(&self) -> Config {
        let mut vars: Vec<(String, String)> = vec![
            ("FASTACK_LISTEN".into(), "127.0.0.1:0".into()),
            (
                "FASTACK_DATA_DIR".into(),
                self.dir.path().display().to_string(),
            ),
            ("FASTACK_POLL_INTERVAL_MS".into(), "200".into()),
            ("FASTACK_LEASE_TTL_MS".into(), "3000".into()),
            ("FASTACK_BOOTSTRAP".into(), "false".into()),
            ("FASTACK_REDIS_PREFIX".into(), self.redis_prefix.clone()),
            ("FASTACK_ENC_KEY".into(), TEST_ENC_KEY.into()),
        ];
        if let Some(url) = self.database_url() {
            vars.push(("FASTACK_DATABASE_URL".into(), url));
            vars.push(("FASTACK_REDIS_URL".into(), redis_url()));
        }
        Config::load(vars, &fastack_actors::sinks::settings()).expect("test config")
    }

    pub fn env(&self) -> Vec<(String, String)> {
        let mut vars = vec![
            (
                "FASTACK_DATA_DIR".to_owned(),
                self.dir.path().display().to_string(),
            ),
            ("FASTACK_REDIS_PREFIX".to_owned(), self.redis_prefix.clone()),
            ("FASTACK_BOOTSTRAP".to_owned(), "false".to_owned()),
            ("FASTACK_ENC_KEY".to_owned(), TEST_ENC_KEY.to_owned()),
        ];
        if let Some(url) = self.database_url() {
            vars.push(("FASTACK_DATABASE_URL".to_owned(), url));
            vars.push(("FASTACK_REDIS_URL".to_owned(), redis_url()));
        }
        vars
    }

    pub async fn store(&self) -> Store {
        fastack_core::store::open(&self.config())
            .await
            .expect("open store")
    }

    pub async fn drop_db(&self) {
        if let Some(name) = &self.pg_name
            && let Ok(mut conn) = PgConnection::connect(&pg_admin_url()).await
        {
            let _ = conn
                .execute(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .await;
        }
    }
}

/// A tenant with a key.
#[derive(Clone, Debug)]
pub struct TestTenant {
    pub tenant: Tenant,
    pub key: String,
}

pub async fn make_tenant(
    store: &Store,
    name: &str,
    plan: Plan,
    key_rps: Option<u32>,
) -> TestTenant {
    let tenant = admin::create_tenant(store.as_ref(), name, plan, None)
        .await
        .expect("create tenant");
    let key = admin::create_key(store.as_ref(), tenant.id, key_rps)
        .await
        .expect("create key");
    TestTenant {
        tenant,
        key: key.secret,
    }
}

/// A running server on a test database.
pub struct TestApp {
    pub db: Arc<TestDb>,
    pub server: Option<Server>,
    pub base: String,
    pub http: reqwest::Client,
    pub store: Store,
    pub t: TestTenant,
}

pub async fn spawn_app(backend: Backend) -> Option<TestApp> {
    let db = Arc::new(TestDb::new(backend).await?);
    Some(spawn_on(db, |_| {}).await)
}

/// A server on an existing test database, its config adjusted by `tweak`.
pub async fn spawn_on(db: Arc<TestDb>, tweak: impl FnOnce(&mut Config)) -> TestApp {
    spawn_with(db, fastack_api::StartOptions::default(), tweak).await
}

/// Like [`spawn_on`], with injected clock or object storage.
pub async fn spawn_with(
    db: Arc<TestDb>,
    options: fastack_api::StartOptions,
    tweak: impl FnOnce(&mut Config),
) -> TestApp {
    let mut config = db.config();
    tweak(&mut config);
    let server = fastack_api::start(config, options)
        .await
        .expect("server starts");
    let store = server.state().runtime.store_for_tests().clone();
    let t = match store.tenants().find_by_name("acme").await.expect("lookup") {
        Some(tenant) => {
            let key = admin::create_key(store.as_ref(), tenant.id, None)
                .await
                .expect("key");
            TestTenant {
                tenant,
                key: key.secret,
            }
        }
        None => make_tenant(&store, "acme", Plan::Enterprise, None).await,
    };
    TestApp {
        base: format!("http://{}", server.addr()),
        server: Some(server),
        db,
        http: reqwest::Client::new(),
        store,
        t,
    }
}

/// What a response said.
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn post(&self, path: &str, key: &str, body: &Value) -> Answer {
        self.post_raw(path, key, serde_json::to_vec(body).unwrap())
            .await
    }

    pub async fn post_raw(&self, path: &str, key: &str, body: Vec<u8>) -> Answer {
        let resp = self
            .http
            .post(self.url(path))
            .bearer_auth(key)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("request sent");
        answer(resp).await
    }

    /// The node's `/metrics` text.
    pub async fn metrics(&self) -> String {
        self.http
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub async fn get(&self, path: &str, key: &str) -> Answer {
        let resp = self
            .http
            .get(self.url(path))
            .bearer_auth(key)
            .send()
            .await
            .expect("request sent");
        answer(resp).await
    }

    /// Events of the tenant with `key` in `[from, to)`, all pages.
    pub async fn events(&self, key: &str, from: &str, to: &str, extra: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut path = format!(
                "/v1/core/events?from={}&to={}&limit=1000{extra}",
                urlenc(from),
                urlenc(to)
            );
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={c}"));
            }
            let a = self.get(&path, key).await;
            assert_eq!(a.status, 200, "{}", a.body);
            out.extend(a.body["events"].as_array().unwrap().iter().cloned());
            match a.body["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => return out,
            }
        }
    }

    pub async fn stop(mut self) -> Arc<TestDb> {
        if let Some(server) = self.server.take() {
            server.stop().await;
        }
        self.db.clone()
    }

    /// Stops the server and drops the test database.
    pub async fn cleanup(self) {
        let db = self.stop().await;
        db.drop_db().await;
    }
}

pub async fn answer(resp: reqwest::Response) -> Answer {
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.bytes().await.expect("body");
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    Answer {
        status,
        headers,
        body,
    }
}

pub fn urlenc(s: &str) -> String {
    s.replace('+', "%2B").replace(':', "%3A")
}

/// A valid track event.
pub fn track(key: &str, user: &str, occurred_at: DateTime<Utc>) -> Value {
    serde_json::json!({
        "event": "Order Completed",
        "user_id": user,
        "properties": {"total": 42.5, "currency": "EUR"},
        "occurred_at": occurred_at.to_rfc3339(),
        "idempotency_key": key,
    })
}

/// Polls `check` until it returns `Some` or the deadline passes.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls a PostgreSQL `count(*)` query until it returns zero.
pub async fn until_none_left(
    pool: &sqlx::PgPool,
    what: &str,
    count_sql: &'static str,
    timeout: Duration,
) {
    eventually(what, timeout, || async {
        let left: i64 = sqlx::query_scalar(count_sql).fetch_one(pool).await.unwrap();
        (left == 0).then_some(())
    })
    .await
}

/// Runs a scenario against both backends: `mod name { sqlite, postgres }`.
#[macro_export]
macro_rules! on_both_backends {
    ($($scenario:ident),* $(,)?) => {
        $(
            mod $scenario {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    if let Some(app) = $crate::helpers::spawn_app($crate::helpers::Backend::Sqlite).await {
                        super::$scenario(app).await;
                    }
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    if let Some(app) = $crate::helpers::spawn_app($crate::helpers::Backend::Postgres).await {
                        super::$scenario(app).await;
                    }
                }
            }
        )*
    };
}

pub fn bin_path() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fastack"))
}

/// Runs the `fastack` command with `args` on `db`'s storage, as an operator
/// would on that node: (succeeded, stdout, stderr).
pub fn fastack_cli(db: &TestDb, args: &[&str]) -> (bool, String, String) {
    run_cli(&bin_path(), db.env(), args)
}

/// Runs the fastack binary at `bin` (this build's or another release's)
/// with exactly `env`: (succeeded, stdout, stderr).
pub fn run_cli(
    bin: &std::path::Path,
    env: impl IntoIterator<Item = (String, String)>,
    args: &[&str],
) -> (bool, String, String) {
    let out = std::process::Command::new(bin)
        .args(args)
        .env_clear()
        .envs(env)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A `fastack serve` child process on a test database (crash tests kill it
/// with `kill -9`).
pub struct Node {
    pub child: tokio::process::Child,
    pub addr: std::net::SocketAddr,
    /// The admin listener, when the node has a token.
    pub admin_addr: Option<std::net::SocketAddr>,
    /// Every line the node wrote to stderr (its log), as it comes.
    pub log: Arc<parking_lot::Mutex<Vec<String>>>,
}

impl Node {
    /// Starts the binary with the database's environment plus `extra`, and
    /// waits until it listens.
    pub async fn start(db: &TestDb, extra: &[(&str, &str)]) -> Node {
        Node::start_with(Node::env(db, extra)).await
    }

    /// A node's environment on `db`, plus `extra`.
    pub fn env(db: &TestDb, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = vec![
            ("FASTACK_LISTEN".into(), "127.0.0.1:0".into()),
            ("FASTACK_POLL_INTERVAL_MS".into(), "200".into()),
        ];
        env.extend(db.env());
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        env
    }

    /// Stops the node as an orchestrator does (SIGTERM: it stops accepting,
    /// finishes its requests and releases its leases) and waits for it.
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().expect("a running node").to_string();
        let sent = tokio::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .expect("kill -TERM");
        assert!(sent.success());
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the node stops within 30 s")
            .expect("wait for the node")
    }

    /// Starts the binary with exactly `env` (and `PATH`), and waits until it
    /// listens.
    pub async fn start_with(env: Vec<(String, String)>) -> Node {
        Node::start_bin(&bin_path(), env).await
    }

    /// Starts the fastack binary at `bin` (another release's) with exactly
    /// `env` (and `PATH`), and waits until it listens.
    pub async fn start_bin(bin: &std::path::Path, env: Vec<(String, String)>) -> Node {
        use tokio::io::{AsyncBufReadExt, BufReader};
        let mut cmd = tokio::process::Command::new(bin);
        cmd.arg("serve")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("FASTACK_LOG", "info")
            .envs(env)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn fastack serve");
        let stderr = child.stderr.take().expect("stderr piped");
        let mut lines = BufReader::new(stderr).lines();
        let addr_in = |line: &str| -> Option<std::net::SocketAddr> {
            let rest = line.split("addr=").nth(1)?;
            rest.split_whitespace().next()?.parse().ok()
        };
        let mut admin_addr = None;
        let mut log = Vec::new();
        let addr = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.expect("read stderr") {
                if line.contains("admin listener up") {
                    admin_addr = addr_in(&line);
                }
                if line.contains("fastack listening")
                    && let Some(addr) = addr_in(&line)
                {
                    return addr;
                }
                log.push(line);
            }
            panic!("server exited before listening:\n{}", log.join("\n"));
        })
        .await
        .expect("server starts within 30 s");
        // Keep draining the log so the child never blocks on a full pipe.
        let kept = Arc::new(parking_lot::Mutex::new(log));
        let sink = kept.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                sink.lock().push(line);
            }
        });
        Node {
            child,
            addr,
            admin_addr,
            log: kept,
        }
    }
}

/// Makes this node's processing lease of the tenant another node's (for an
/// hour) or gives it back (expired), as a node that stopped would.
pub async fn lease(app: &TestApp, held: bool) {
    use sea_orm::ConnectionTrait;
    let tenant = app.t.tenant.id.0;
    let other = Uuid::now_v7();
    let until = Utc::now() + chrono::Duration::hours(if held { 1 } else { -1 });
    let sql = match app.db.backend {
        Backend::Postgres => format!(
            "UPDATE tenant_leases SET node_id = '{other}', expires_at = '{}' WHERE tenant_id = '{tenant}'",
            until.to_rfc3339()
        ),
        Backend::Sqlite => format!(
            "UPDATE tenant_leases SET node_id = x'{}', expires_at = {} WHERE tenant_id = x'{}'",
            other.simple(),
            until.timestamp_micros(),
            tenant.simple()
        ),
    };
    let db = app.store.connection_for_tests();
    let done = db.execute_unprepared(&sql).await.unwrap();
    assert_eq!(done.rows_affected(), 1);
}
