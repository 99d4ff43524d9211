//! An operator's first day: a way in on PostgreSQL (one node of several
//! bootstraps), admin commands that never create a database by accident,
//! dependencies checked at start and shown in `/readyz`, a quiet start.

use std::time::Duration;

use chrono::Utc;
use fastack_entities::Plan;
use serde_json::Value;

use crate::helpers::{Backend, Node, TestDb, bin_path, eventually, make_tenant, track};

async fn post_track(addr: std::net::SocketAddr, key: &str, idem: &str) -> u16 {
    reqwest::Client::new()
        .post(format!("http://{addr}/v1/core/track"))
        .bearer_auth(key)
        .json(&track(idem, "u-1", Utc::now()))
        .send()
        .await
        .expect("the node answers")
        .status()
        .as_u16()
}

/// Three nodes starting at once on one empty PostgreSQL database, each with
/// a data directory of its own: exactly one creates tenant `default` and a
/// key and writes it to its `bootstrap-key`; every node accepts that key.
/// A restart on that directory says nothing more; a node whose directory
/// holds a key from another database says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_bootstraps_once_among_nodes() {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let data: Vec<String> = dirs
        .iter()
        .map(|d| d.path().join("data").display().to_string())
        .collect();
    let nodes = futures::future::join_all(data.iter().map(|dir| {
        Node::start_with(Node::env(
            &db,
            &[("FASTACK_BOOTSTRAP", "true"), ("FASTACK_DATA_DIR", dir)],
        ))
    }))
    .await;
    let written: Vec<(usize, String)> = data
        .iter()
        .enumerate()
        .filter_map(|(i, d)| {
            let path = std::path::Path::new(d).join("bootstrap-key");
            std::fs::read_to_string(path)
                .ok()
                .map(|k| (i, k.trim().to_owned()))
        })
        .collect();
    assert_eq!(written.len(), 1, "bootstrap keys written: {written:?}");
    let (creator, key) = written[0].clone();
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(std::path::Path::new(&data[creator]).join("bootstrap-key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let store = db.store().await;
    let tenants = store.tenants().list().await.unwrap();
    assert_eq!(tenants.len(), 1, "{tenants:?}");
    assert_eq!(tenants[0].name, "default");
    assert_eq!(store.keys().list(tenants[0].id).await.unwrap().len(), 1);
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(post_track(n.addr, &key, &format!("first-{i}")).await, 202);
    }
    let said: usize = nodes
        .iter()
        .map(|n| {
            n.log
                .lock()
                .iter()
                .filter(|l| l.contains("created tenant `default`"))
                .count()
        })
        .sum();
    assert_eq!(said, 1);
    for n in nodes {
        n.terminate().await;
    }

    // Again on the creator's directory: nothing created, nothing to say.
    let again = Node::start(
        &db,
        &[
            ("FASTACK_BOOTSTRAP", "true"),
            ("FASTACK_DATA_DIR", &data[creator]),
        ],
    )
    .await;
    assert_eq!(store.tenants().list().await.unwrap().len(), 1);
    assert!(
        !again
            .log
            .lock()
            .iter()
            .any(|l| l.contains("bootstrap-key") || l.contains("created tenant")),
        "{}",
        again.log.lock().join("\n")
    );
    again.terminate().await;

    // A directory left by a run on another database.
    let other = tempfile::tempdir().unwrap();
    fastack_core::owner_only::write_secret(
        &other.path().join("bootstrap-key"),
        "fsk_notfromthisdatabase000000000000000",
    )
    .unwrap();
    let dir = other.path().display().to_string();
    let stale = Node::start(
        &db,
        &[("FASTACK_BOOTSTRAP", "true"), ("FASTACK_DATA_DIR", &dir)],
    )
    .await;
    let log = stale.log.lock().join("\n");
    assert!(
        log.contains("the bootstrap-key file holds a key this database does not know"),
        "{log}"
    );
    drop(stale);
    drop(store);
    db.drop_db().await;
}

/// An admin command run where no data directory is: it fails, says where
/// it looked and how to point it at the server's data, and creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_commands_never_create_a_database() {
    let cwd = tempfile::tempdir().unwrap();
    for args in [
        &["admin", "tenant", "list"][..],
        &["admin", "key", "list", "--tenant", "default"],
        &["admin", "retention", "run", "--dry-run"],
        &["keys", "external-hmac"],
    ] {
        let out = std::process::Command::new(bin_path())
            .args(args)
            .current_dir(cwd.path())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded: {stderr}");
        let looked = cwd.path().join("fastack-data").join("fastack.db");
        assert!(
            stderr.contains(&format!("no fastack database at {}", looked.display()))
                && stderr.contains("FASTACK_DATA_DIR"),
            "{args:?}: {stderr}"
        );
        let left: Vec<_> = std::fs::read_dir(cwd.path()).unwrap().flatten().collect();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    }

    // Pointed at a node's data, the same command works.
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let store = db.store().await;
    make_tenant(&store, "acme", Plan::Pro, None).await;
    drop(store);
    let out = std::process::Command::new(bin_path())
        .args(["admin", "tenant", "list"])
        .current_dir(cwd.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("FASTACK_DATA_DIR", db.dir.path())
        .env("FASTACK_ENC_KEY", crate::helpers::TEST_ENC_KEY)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("acme"));
    db.drop_db().await;
}

/// The `/readyz` document of the node at `base` (`http://host:port`).
pub async fn readyz(base: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .get(format!("{base}/readyz"))
        .send()
        .await
        .expect("the node answers");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Polls `/readyz` until `dependency` shows `state`; the document then.
pub async fn until_dependency(base: &str, dependency: &str, state: &str) -> (u16, Value) {
    eventually(
        &format!("{dependency} {state} in /readyz"),
        Duration::from_secs(30),
        || async {
            let (status, doc) = readyz(base).await;
            (doc["dependencies"][dependency]["state"] == state).then_some((status, doc))
        },
    )
    .await
}

/// `fastack serve` with `env` that is expected to refuse to start: its
/// standard error, once it has exited (non-zero).
fn refused_start(env: &[(String, String)]) -> String {
    let out = std::process::Command::new(bin_path())
        .arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("FASTACK_LISTEN", "127.0.0.1:0")
        .envs(env.iter().cloned())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "the node started: {stderr}");
    stderr
}

fn with(env: &[(String, String)], extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env = env.to_vec();
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

/// A moto server of this test's own that checks credentials (the shared
/// one takes any), on a free port; killed when dropped.
struct StrictS3 {
    child: std::process::Child,
    endpoint: String,
}

impl StrictS3 {
    fn start() -> Option<StrictS3> {
        let moto = std::env::var("FASTACK_TEST_MOTO_SERVER").unwrap_or("moto_server".to_owned());
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = match std::process::Command::new(&moto)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .env("INITIAL_NO_AUTH_ACTION_COUNT", "0")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                assert!(
                    !crate::helpers::services_required(),
                    "cannot start {moto} (FASTACK_TEST_MOTO_SERVER): {e}"
                );
                eprintln!("skipped: cannot start {moto}: {e}");
                return None;
            }
        };
        let up = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(100));
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        assert!(up, "{moto} did not listen on {port}");
        Some(StrictS3 {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        })
    }
}

impl Drop for StrictS3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Object storage that cannot be used fails the start, with the setting
/// named and nothing served: a bucket that does not exist (for exports and
/// for the lake), credentials the storage refuses, no credentials at all
/// (said in the log before the instance's metadata service is asked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_object_storage_fails_the_start() {
    let Some(bucket) = crate::helpers::S3Bucket::create().await else {
        return;
    };
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let s3 = |endpoint: &str| -> Vec<(String, String)> {
        with(
            &db.env(),
            &[
                ("FASTACK_S3_ENDPOINT", endpoint),
                ("FASTACK_S3_REGION", "us-east-1"),
                ("FASTACK_S3_ACCESS_KEY_ID", "test"),
                ("FASTACK_S3_SECRET_ACCESS_KEY", "test"),
            ],
        )
    };
    let missing = format!("no-such-{}", uuid::Uuid::new_v4().simple());

    let err = refused_start(&with(
        &s3(&bucket.endpoint),
        &[("FASTACK_STORAGE_URL", &format!("s3://{missing}/exports"))],
    ));
    assert!(
        err.contains(&format!(
            "cannot use the object_storage at s3://{missing}/exports"
        )) && err.contains("FASTACK_STORAGE_URL")
            && err.contains("NoSuchBucket"),
        "{err}"
    );

    let err = refused_start(&with(
        &s3(&bucket.endpoint),
        &[
            (
                "FASTACK_STORAGE_URL",
                &format!("s3://{}/exports", bucket.bucket),
            ),
            ("FASTACK_MIRROR_URL", &format!("s3://{missing}/lake")),
        ],
    ));
    assert!(
        err.contains(&format!("cannot use the lake at s3://{missing}/lake"))
            && err.contains("FASTACK_MIRROR_URL"),
        "{err}"
    );

    if let Some(strict) = StrictS3::start() {
        let create = reqwest::Client::new()
            .put(format!("{}/{}", strict.endpoint, bucket.bucket))
            .send()
            .await;
        drop(create);
        let err = refused_start(&with(
            &s3(&strict.endpoint),
            &[(
                "FASTACK_STORAGE_URL",
                &format!("s3://{}/exports", bucket.bucket),
            )],
        ));
        assert!(
            err.contains("cannot use the object_storage")
                && err.contains("FASTACK_S3_ACCESS_KEY_ID")
                && err.contains("InvalidAccessKeyId"),
            "{err}"
        );
    }

    // No credentials: the log says where they are looked for.
    let no_credentials = with(
        &db.env(),
        &[
            ("FASTACK_S3_ENDPOINT", bucket.endpoint.as_str()),
            ("FASTACK_S3_REGION", "us-east-1"),
            (
                "FASTACK_STORAGE_URL",
                &format!("s3://{}/exports", bucket.bucket),
            ),
        ],
    );
    let err = refused_start(&no_credentials);
    assert!(
        err.contains("no FASTACK_S3_ACCESS_KEY_ID")
            && err.contains("instance metadata")
            && err.contains("cannot use the object_storage"),
        "{err}"
    );
    let left = std::fs::read_dir(db.dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect::<Vec<_>>();
    assert!(!left.contains(&"bootstrap-key".to_owned()), "{left:?}");

    // The environment's usual chain: AWS_ACCESS_KEY_ID and its secret,
    // taken (and named in the log) when the settings give none.
    let node = Node::start_with(with(
        &no_credentials,
        &[
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
            ("FASTACK_LISTEN", "127.0.0.1:0"),
        ],
    ))
    .await;
    let log = node.log.lock().join("\n");
    assert!(
        log.contains("object storage credentials from the environment")
            && log.contains("AWS_ACCESS_KEY_ID"),
        "{log}"
    );
    assert!(!log.contains("instance metadata"), "{log}");
    node.terminate().await;
    db.drop_db().await;
}

/// A broker that refuses the node's credentials fails the start with
/// `FASTACK_AMQP_URL` named (and the password not shown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_broker_fails_the_start() {
    if !crate::amqp::rabbit_reachable().await {
        return;
    }
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let url = crate::helpers::amqp_url().replacen("guest:guest", "fastack:wrong-secret", 1);
    let err = refused_start(&with(
        &db.env(),
        &[
            ("FASTACK_AMQP_URL", url.as_str()),
            ("FASTACK_CLOUDEVENTS_SOURCE", "//fastack/e2e"),
        ],
    ));
    assert!(
        err.contains("cannot use the amqp at") && err.contains("FASTACK_AMQP_URL"),
        "{err}"
    );
    assert!(!err.contains("wrong-secret"), "{err}");
    db.drop_db().await;
}

/// A database the node cannot reach fails the start with
/// `FASTACK_DATABASE_URL` named and its password not shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_fails_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let err = refused_start(&[
        (
            "FASTACK_DATABASE_URL".to_owned(),
            "postgres://fastack:db-secret@127.0.0.1:1/fastack".to_owned(),
        ),
        (
            "FASTACK_ENC_KEY".to_owned(),
            crate::helpers::TEST_ENC_KEY.to_owned(),
        ),
        (
            "FASTACK_DATA_DIR".to_owned(),
            dir.path().display().to_string(),
        ),
    ]);
    assert!(
        err.contains("cannot use the database at postgres://127.0.0.1:1/fastack")
            && err.contains("FASTACK_DATABASE_URL"),
        "{err}"
    );
    assert!(!err.contains("db-secret"), "{err}");
}

/// An exchange with nothing bound shows as a warning that names it, from
/// the first event the broker had to drop, until a queue is bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exchange_with_nothing_bound_is_shown() {
    let Some((app, names)) = crate::amqp::streaming_app(Backend::Sqlite, None, |c| {
        c.dependency_check = Duration::from_millis(200);
    })
    .await
    else {
        return;
    };
    let (status, doc) = until_dependency(&app.base, "amqp", "up").await;
    assert_eq!(status, 200);
    assert_eq!(doc["status"], "ready", "{doc}");
    let now = Utc::now();
    let a = app
        .post("/v1/core/track", &app.t.key, &track("unbound-1", "u", now))
        .await;
    assert_eq!(a.status, 202);
    let (status, doc) = until_dependency(&app.base, "amqp", "warning").await;
    assert_eq!(status, 200);
    assert_eq!(doc["status"], "ready", "a warning is not an outage: {doc}");
    let said = doc["dependencies"]["amqp"]["last_error"]
        .as_str()
        .unwrap_or_default();
    assert!(said.contains(&format!("`{}`", names.core)), "{doc}");

    let mut consumer = crate::amqp::consumer(&names.core, &["#"]).await;
    let a = app
        .post("/v1/core/track", &app.t.key, &track("bound-1", "u", now))
        .await;
    assert_eq!(a.status, 202);
    assert!(consumer.next(Duration::from_secs(20)).await.is_some());
    until_dependency(&app.base, "amqp", "up").await;
    crate::amqp::delete_exchanges(&names).await;
    app.db.drop_db().await;
}

/// Redis going away after the start: `/readyz` shows it down with its
/// error (200, `degraded`), the metric says 0, events are still accepted;
/// once it is back, it shows up again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependency_that_goes_away_shows_in_readyz() {
    if !crate::helpers::redis_or_skip() {
        return;
    }
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let upstream: std::net::SocketAddr = crate::helpers::redis_url()
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .parse()
        .expect("the test Redis URL is host:port");
    let proxy = crate::netfault::Proxy::start(upstream).await;
    let redis = format!("redis://{}", proxy.addr);
    let app = crate::helpers::spawn_on(std::sync::Arc::new(db), |c| {
        c.redis_url = Some(redis);
        c.dependency_check = Duration::from_millis(200);
    })
    .await;
    let (status, doc) = until_dependency(&app.base, "redis", "up").await;
    assert_eq!(
        (status, doc["status"].as_str()),
        (200, Some("ready")),
        "{doc}"
    );
    for dep in ["database", "object_storage", "disk"] {
        assert_eq!(doc["dependencies"][dep]["state"], "up", "{doc}");
    }

    proxy.cut();
    let (status, doc) = until_dependency(&app.base, "redis", "down").await;
    assert_eq!(status, 200, "{doc}");
    assert_eq!(doc["status"], "degraded", "{doc}");
    assert!(
        doc["dependencies"]["redis"]["last_error"].is_string(),
        "{doc}"
    );
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("fastack_dependency_up{dependency=\"redis\"} 0"),
        "{metrics}"
    );
    let a = app
        .post(
            "/v1/core/track",
            &app.t.key,
            &track("while-redis-is-away", "u", Utc::now()),
        )
        .await;
    assert_eq!(a.status, 202, "{:?}", a.body);

    proxy.restore();
    let (status, doc) = until_dependency(&app.base, "redis", "up").await;
    assert_eq!(
        (status, doc["status"].as_str()),
        (200, Some("ready")),
        "{doc}"
    );
    assert!(
        doc["dependencies"]["redis"]["last_error"].is_string(),
        "kept: {doc}"
    );
    app.db.drop_db().await;
}

/// A bucket deleted under a running node: object storage shows down with
/// the storage's answer, ingestion goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_that_goes_away_shows_in_readyz() {
    let Some(bucket) = crate::helpers::S3Bucket::create().await else {
        return;
    };
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let app = crate::helpers::spawn_on(std::sync::Arc::new(db), |c| {
        bucket.apply(c);
        c.dependency_check = Duration::from_millis(200);
    })
    .await;
    let (_, doc) = until_dependency(&app.base, "object_storage", "up").await;
    assert_eq!(
        doc["dependencies"]["object_storage"]["detail"],
        format!("s3://{}/fastack", bucket.bucket)
    );
    // Between two probes: while one is written the bucket is not empty.
    eventually("the bucket deleted", Duration::from_secs(10), || async {
        let gone = reqwest::Client::new()
            .delete(format!("{}/{}", bucket.endpoint, bucket.bucket))
            .send()
            .await
            .ok()?;
        gone.status().is_success().then_some(())
    })
    .await;
    let (status, doc) = until_dependency(&app.base, "object_storage", "down").await;
    assert_eq!(
        (status, doc["status"].as_str()),
        (200, Some("degraded")),
        "{doc}"
    );
    let said = doc["dependencies"]["object_storage"]["last_error"]
        .as_str()
        .unwrap_or_default();
    assert!(said.contains("NoSuchBucket"), "{doc}");
    let a = app
        .post(
            "/v1/core/track",
            &app.t.key,
            &track("bucketless", "u", Utc::now()),
        )
        .await;
    assert_eq!(a.status, 202);
    app.db.drop_db().await;
}

/// `fastack` with `args` and exactly `env` (and `PATH`), off the test's
/// threads: (succeeded, stdout, stderr).
async fn cli(env: &[(String, String)], args: &[&str]) -> (bool, String, String) {
    let mut env = env.to_vec();
    env.push(("PATH".to_owned(), std::env::var("PATH").unwrap_or_default()));
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        crate::helpers::run_cli(&bin_path(), env, &args)
    })
    .await
    .unwrap()
}

/// An export on the node at `addr`, waited for: its job document and its
/// downloaded result.
async fn completed_export(
    http: &reqwest::Client,
    addr: std::net::SocketAddr,
    key: &str,
) -> (Value, Vec<u8>) {
    let now = Utc::now();
    let v: Value = http
        .post(format!("http://{addr}/v1/core/exports"))
        .bearer_auth(key)
        .json(&serde_json::json!({
            "from": (now - chrono::Duration::days(1)).to_rfc3339(),
            "to": (now + chrono::Duration::days(1)).to_rfc3339(),
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let job = v["job_id"].as_str().expect("a job id").to_owned();
    let doc: Value = eventually("the export completes", Duration::from_secs(60), || async {
        let d: Value = http
            .get(format!("http://{addr}/v1/core/jobs/{job}"))
            .bearer_auth(key)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (d["status"] == "completed").then_some(d)
    })
    .await;
    let bytes = http
        .get(format!("http://{addr}/v1/core/jobs/{job}/result"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    (doc, bytes)
}

/// A backup of the embedded node taken under load, restored into a new data
/// directory: the new node holds every event answered `202` before the
/// backup began (once each), reads and verifies the old export with the
/// restored master key, accepts, and delivers webhooks to the endpoint
/// registered before the backup (its secret decrypted with that key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_restores_into_a_new_node() {
    use std::sync::{Arc, atomic::AtomicBool};
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    // The node's own master key (a file in its data directory), not the
    // tests' FASTACK_ENC_KEY: the backup has to carry it.
    let base: Vec<(String, String)> = db
        .env()
        .into_iter()
        .filter(|(k, _)| k != "FASTACK_ENC_KEY" && k != "FASTACK_DATA_DIR")
        .chain([(
            "FASTACK_WEBHOOK_ALLOW_PRIVATE".to_owned(),
            "true".to_owned(),
        )])
        .collect();
    let old_dir = db.dir.path().join("old");
    let env_old = with(
        &base,
        &[
            ("FASTACK_DATA_DIR", &old_dir.display().to_string()),
            ("FASTACK_BOOTSTRAP", "true"),
        ],
    );
    let old = Node::start_with(with(&env_old, &[("FASTACK_LISTEN", "127.0.0.1:0")])).await;
    let key = std::fs::read_to_string(old_dir.join("bootstrap-key"))
        .unwrap()
        .trim()
        .to_owned();
    let rx = crate::webhooks::Receiver::start(&[]).await;
    let (ok, added, err) = cli(
        &env_old,
        &[
            "admin",
            "--json",
            "webhook",
            "add",
            "--tenant",
            "default",
            "--url",
            &rx.url(),
            "--events",
            "job.completed",
        ],
    )
    .await;
    assert!(ok, "{err}");
    let secret = serde_json::from_str::<Value>(&added).unwrap()["secret"]
        .as_str()
        .expect("the endpoint's secret, shown once")
        .to_owned();
    let http = reqwest::Client::new();
    for i in 0..20 {
        assert_eq!(
            post_track(old.addr, &key, &format!("before-{i}")).await,
            202
        );
    }
    eventually("20 events processed", Duration::from_secs(30), || async {
        let n = crate::faults::read_events(&http, old.addr, &key)
            .await?
            .len();
        (n >= 20).then_some(())
    })
    .await;
    let (old_export, old_result) = completed_export(&http, old.addr, &key).await;
    rx.wait_hits(1, Duration::from_secs(30)).await;

    // Load, and the backup taken in the middle of it.
    let stop = Arc::new(AtomicBool::new(false));
    let addr = old.addr;
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (stop, key, http) = (stop.clone(), key.clone(), http.clone());
            tokio::spawn(async move {
                let mut answered = Vec::new();
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    let r = http
                        .post(format!("http://{addr}/v1/core/track"))
                        .bearer_auth(&key)
                        .json(&track(&format!("load-{c}-{n}"), "u-load", Utc::now()))
                        .send()
                        .await;
                    if let Ok(r) = r
                        && r.status() == 202
                        && let Ok(v) = r.json::<Value>().await
                    {
                        answered.push((
                            std::time::Instant::now(),
                            v["id"].as_str().unwrap_or_default().to_owned(),
                        ));
                    }
                }
                answered
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let backup_dir = db.dir.path().join("backup");
    let began = std::time::Instant::now();
    let (ok, out, err) = cli(
        &env_old,
        &["admin", "backup", "--to", &backup_dir.display().to_string()],
    )
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("backed up to"), "{out}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut answered = Vec::new();
    for c in clients {
        answered.extend(c.await.unwrap());
    }
    let before: Vec<&String> = answered
        .iter()
        .filter(|(at, _)| *at < began)
        .map(|(_, id)| id)
        .collect();
    let after = answered.len() - before.len();
    assert!(
        before.len() > 100 && after > 0,
        "{} before, {after} after",
        before.len()
    );
    old.terminate().await;

    // Restored into a new data directory.
    let new_dir = db.dir.path().join("new");
    let env_new = with(
        &base,
        &[("FASTACK_DATA_DIR", &new_dir.display().to_string())],
    );
    let (ok, out, err) = cli(
        &env_new,
        &[
            "admin",
            "restore",
            "--from",
            &backup_dir.display().to_string(),
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("restored the backup"), "{out}");
    let new = Node::start_with(with(&env_new, &[("FASTACK_LISTEN", "127.0.0.1:0")])).await;

    let read = eventually(
        "every event answered before the backup, on the new node",
        Duration::from_secs(60),
        || async {
            let all = crate::faults::read_events(&http, new.addr, &key).await?;
            let ids: std::collections::HashSet<&str> =
                all.iter().filter_map(|e| e["id"].as_str()).collect();
            before
                .iter()
                .all(|id| ids.contains(id.as_str()))
                .then_some(all)
        },
    )
    .await;
    let ids: Vec<&str> = read.iter().filter_map(|e| e["id"].as_str()).collect();
    let unique: std::collections::HashSet<&&str> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "an event read twice");

    // The old export: readable, and its HMAC verifies with the tenant's key
    // as the new node derives it.
    let job = old_export["job_id"].as_str().unwrap();
    let again = http
        .get(format!("http://{}/v1/core/jobs/{job}/result", new.addr))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(again.as_ref(), old_result.as_slice());
    let (ok, hmac_key, err) =
        cli(&env_new, &["keys", "external-hmac", "--tenant", "default"]).await;
    assert!(ok, "{err}");
    assert!(fastack_core::crypto::hmac_verify_hex(
        &hex::decode(hmac_key.trim()).unwrap(),
        &[&old_result],
        old_export["result"]["hmac"].as_str().unwrap()
    ));

    // It accepts, and delivers to the endpoint registered before.
    assert_eq!(post_track(new.addr, &key, "after-restore").await, 202);
    let (new_export, _) = completed_export(&http, new.addr, &key).await;
    let hits = rx.wait_hits(2, Duration::from_secs(30)).await;
    let last = &hits[hits.len() - 1];
    let body: Value = serde_json::from_slice(&last.body).unwrap();
    assert_eq!(body["job_id"], new_export["job_id"], "{body}");
    crate::webhooks::verify_independently(&secret, last);
    println!(
        "backup under load: {} events answered before the backup began, {after} after; all on the restored node once",
        before.len()
    );
    new.terminate().await;
    db.drop_db().await;
}

/// A PostgreSQL node's start writes only what an operator can act on:
/// the schema migrated (first start only), where it listens, where events
/// stream; no database notices, no line per migration, no line per
/// tenant's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_start_is_quiet() {
    if !crate::amqp::rabbit_reachable().await {
        return;
    }
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let names = format!("{}.quiet", db.redis_prefix);
    let (job, core) = (format!("{names}.job"), format!("{names}.core"));
    let extra = [
        ("FASTACK_AMQP_URL", crate::helpers::amqp_url()),
        ("FASTACK_CLOUDEVENTS_SOURCE", "//fastack/e2e".to_owned()),
        ("FASTACK_JOB_EVENTS_EXCHANGE", job.clone()),
        ("FASTACK_CORE_EVENTS_EXCHANGE", core.clone()),
    ];
    let extra: Vec<(&str, &str)> = extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // Queues bound to both exchanges: what is published is routed (an
    // exchange with nothing bound is worth its warning, not this test's).
    let _job_queue = crate::amqp::consumer(&job, &["#"]).await;
    let _core_queue = crate::amqp::consumer(&core, &["#"]).await;
    let mut lines = Vec::new();
    for start in 0..2 {
        let node = Node::start(&db, &extra).await;
        if start == 0 {
            let store = db.store().await;
            for name in ["a", "b", "c"] {
                let t = make_tenant(&store, name, Plan::Pro, None).await;
                assert_eq!(post_track(node.addr, &t.key, "wake").await, 202);
            }
        }
        // Settled: the relays connected, the tenants' processors leased.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let log = node.log.lock().clone();
        node.terminate().await;
        lines.push(log);
    }
    for (start, log) in lines.iter().enumerate() {
        let noisy: Vec<&String> = log
            .iter()
            .filter(|l| {
                l.contains("notice")
                    || l.contains("Applying migration")
                    || l.contains("processing lease")
                    || l.contains(" ERROR ")
            })
            .collect();
        assert!(noisy.is_empty(), "start {start}: {noisy:?}");
    }
    // Every line but `fastack listening` (which the helper does not keep):
    // the first start migrates, both say where events stream.
    assert!(
        lines[0].iter().any(|l| l.contains("schema migrated")),
        "{:?}",
        lines[0]
    );
    assert!(lines[0].len() <= 3, "first start: {:#?}", lines[0]);
    assert!(lines[1].len() <= 2, "second start: {:#?}", lines[1]);
    println!(
        "a PostgreSQL node's start: {} lines the first time, {} the next",
        lines[0].len() + 1,
        lines[1].len() + 1
    );
    crate::amqp::delete_exchanges(&crate::amqp::Names { job, core }).await;
    db.drop_db().await;
}

/// A backup to object storage and back; a backup altered after it was
/// taken is refused by `restore`, which then leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_in_object_storage_restores_and_a_damaged_one_is_refused() {
    let Some(bucket) = crate::helpers::S3Bucket::create().await else {
        return;
    };
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let store = db.store().await;
    let t = make_tenant(&store, "acme", Plan::Pro, None).await;
    drop(store);
    let node = Node::start(&db, &[]).await;
    for i in 0..5 {
        assert_eq!(post_track(node.addr, &t.key, &format!("s3-{i}")).await, 202);
    }
    let http = reqwest::Client::new();
    eventually("5 events processed", Duration::from_secs(30), || async {
        let n = crate::faults::read_events(&http, node.addr, &t.key)
            .await?
            .len();
        (n == 5).then_some(())
    })
    .await;
    let s3 = [
        ("FASTACK_S3_ENDPOINT", bucket.endpoint.as_str()),
        ("FASTACK_S3_REGION", "us-east-1"),
        ("FASTACK_S3_ACCESS_KEY_ID", "test"),
        ("FASTACK_S3_SECRET_ACCESS_KEY", "test"),
    ];
    let to = format!("s3://{}/backups/one", bucket.bucket);
    let (ok, out, err) = cli(&with(&db.env(), &s3), &["admin", "backup", "--to", &to]).await;
    assert!(ok, "{err}");
    assert!(out.contains("the master key is FASTACK_ENC_KEY"), "{out}");
    let keys = bucket.keys().await;
    assert!(
        keys.iter().any(|k| k == "backups/one/fastack-backup.json")
            && keys.iter().any(|k| k == "backups/one/fastack.db"),
        "{keys:?}"
    );
    node.terminate().await;

    let fresh = tempfile::tempdir().unwrap();
    let data = fresh.path().join("data").display().to_string();
    let env = with(&with(&db.env(), &s3), &[("FASTACK_DATA_DIR", &data)]);
    let (ok, _, err) = cli(&env, &["admin", "restore", "--from", &to]).await;
    assert!(ok, "{err}");
    let restored = Node::start_with(with(&env, &[("FASTACK_LISTEN", "127.0.0.1:0")])).await;
    let read = crate::faults::read_events(&http, restored.addr, &t.key)
        .await
        .unwrap();
    assert_eq!(read.len(), 5);
    restored.terminate().await;

    // One byte of the main database changed in the backup.
    let local = db.dir.path().join("local-backup");
    let (ok, _, err) = cli(
        &db.env(),
        &["admin", "backup", "--to", &local.display().to_string()],
    )
    .await;
    assert!(ok, "{err}");
    let file = local.join("fastack.db");
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&file, bytes).unwrap();
    let other = tempfile::tempdir().unwrap();
    let env = with(
        &db.env(),
        &[(
            "FASTACK_DATA_DIR",
            &other.path().join("data").display().to_string(),
        )],
    );
    let (ok, _, err) = cli(
        &env,
        &["admin", "restore", "--from", &local.display().to_string()],
    )
    .await;
    assert!(!ok, "a damaged backup was restored");
    assert!(
        err.contains("fastack.db in the backup is not what its manifest says"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(other.path().join("data"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
    db.drop_db().await;
}

/// A random master key, base64.
fn new_master_key() -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(uuid::Uuid::new_v4().as_bytes().repeat(2))
}

/// Deletes the store's record of its master key, as a store written by a
/// release before the record looks.
async fn forget_master_key_record(db: &TestDb) {
    match db.backend {
        Backend::Postgres => {
            sqlx::query("DELETE FROM master_key")
                .execute(&db.pg_pool().await)
                .await
                .unwrap();
        }
        Backend::Sqlite => {
            let url = format!("sqlite://{}", db.config().sqlite_path().display());
            let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
            sqlx::query("DELETE FROM master_key")
                .execute(&pool)
                .await
                .unwrap();
            pool.close().await;
        }
    }
}

/// The master key is checked at start and rotated without losing what it
/// protects: a node refuses a key the store was not written with (naming
/// `FASTACK_ENC_KEY`), also on a store written before the check existed
/// when the key does not open its webhook secrets; `fastack keys rotate`
/// moves the store to a new key, after which the old one is refused, and
/// with the new one the export made before downloads the same bytes, its
/// HMAC key is unchanged and the endpoint's deliveries still verify with
/// the secret its receiver kept.
async fn master_key_checked_and_rotated(backend: Backend) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let (key_a, key_b) = (new_master_key(), new_master_key());
    let env_a = Node::env(
        &db,
        &[
            ("FASTACK_ENC_KEY", key_a.as_str()),
            ("FASTACK_WEBHOOK_ALLOW_PRIVATE", "true"),
        ],
    );
    let env_b = with(&env_a, &[("FASTACK_ENC_KEY", key_b.as_str())]);
    let node = Node::start_with(env_a.clone()).await;
    let store = db.store().await;
    let tenant = make_tenant(&store, "keyed", Plan::Enterprise, None).await;
    let rx = crate::webhooks::Receiver::start(&[]).await;
    let (ok, out, err) = cli(
        &env_a,
        &[
            "admin",
            "--json",
            "webhook",
            "add",
            "--tenant",
            "keyed",
            "--url",
            &rx.url(),
            "--events",
            "core.event.tracked",
        ],
    )
    .await;
    assert!(ok, "{err}");
    let secret = serde_json::from_str::<Value>(&out).unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    let http = reqwest::Client::new();
    assert_eq!(
        post_track(node.addr, &tenant.key, "before-rotation").await,
        202
    );
    let first = rx.wait_hits(1, Duration::from_secs(20)).await.remove(0);
    crate::webhooks::verify_independently(&secret, &first);
    let (export, bytes) = completed_export(&http, node.addr, &tenant.key).await;
    let (ok, hmac_key, err) = cli(&env_a, &["keys", "external-hmac", "--tenant", "keyed"]).await;
    assert!(ok, "{err}");
    drop(node);

    // Another key: refused at start, the setting named.
    let refusal = refused_start(&env_b);
    assert!(
        refusal.contains("FASTACK_ENC_KEY is not the master key this store was written with"),
        "{refusal}"
    );
    // A store written before the record: a key that cannot open its
    // webhook secrets is refused too; its own key is recorded again.
    forget_master_key_record(&db).await;
    let refusal = refused_start(&env_b);
    assert!(
        refusal.contains("FASTACK_ENC_KEY is not the master key"),
        "{refusal}"
    );
    let (ok, _, err) = cli(&env_a, &["migrate"]).await;
    assert!(ok, "{err}");

    // The rotation: from a file holding the new key.
    let key_file = db.dir.path().join("new-enc-key");
    std::fs::write(&key_file, &key_b).unwrap();
    let (ok, out, err) = cli(
        &env_a,
        &[
            "keys",
            "rotate",
            "--new-key-file",
            key_file.to_str().unwrap(),
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("master key rotated"), "{out}");
    // The old key is refused now; so is a second rotation from it.
    let refusal = refused_start(&env_a);
    assert!(
        refusal.contains("FASTACK_ENC_KEY is not the master key"),
        "{refusal}"
    );
    let (ok, _, _) = cli(
        &env_a,
        &[
            "keys",
            "rotate",
            "--new-key-file",
            key_file.to_str().unwrap(),
        ],
    )
    .await;
    assert!(!ok, "a rotation from a key the store no longer takes");

    // With the new key everything the old one protected still opens.
    let node = Node::start_with(env_b.clone()).await;
    let job = export["job_id"].as_str().unwrap();
    let again = http
        .get(format!("http://{}/v1/core/jobs/{job}/result", node.addr))
        .bearer_auth(&tenant.key)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(again.bytes().await.unwrap().to_vec(), bytes);
    let (ok, hmac_key_b, err) = cli(&env_b, &["keys", "external-hmac", "--tenant", "keyed"]).await;
    assert!(ok, "{err}");
    assert_eq!(hmac_key_b, hmac_key, "the tenant's HMAC key did not change");
    let key = hex::decode(hmac_key.trim()).unwrap();
    assert_eq!(
        fastack_core::crypto::hmac_hex(&key, &[&bytes]),
        export["result"]["hmac"].as_str().unwrap(),
        "the export made before the rotation verifies"
    );
    assert_eq!(
        post_track(node.addr, &tenant.key, "after-rotation").await,
        202
    );
    let second = rx.wait_hits(2, Duration::from_secs(20)).await.remove(1);
    crate::webhooks::verify_independently(&secret, &second);
    crate::webhooks::verify_independently(&secret, &first);
    drop(node);
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_master_key_checked_and_rotated() {
    master_key_checked_and_rotated(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_master_key_checked_and_rotated() {
    master_key_checked_and_rotated(Backend::Sqlite).await;
}

/// The embedded node's own key file (no `FASTACK_ENC_KEY`): `fastack keys
/// rotate` replaces it, the node starts with the new file, and the old
/// file put back is refused, naming the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_key_file_rotates() {
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let env: Vec<(String, String)> = Node::env(&db, &[])
        .into_iter()
        .filter(|(k, _)| k != "FASTACK_ENC_KEY")
        .collect();
    let node = Node::start_with(env.clone()).await;
    drop(node);
    let file = db.dir.path().join("master-key");
    let old = std::fs::read_to_string(&file).unwrap();
    let (ok, out, err) = cli(&env, &["keys", "rotate"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("holds the new key"), "{out}");
    let new = std::fs::read_to_string(&file).unwrap();
    assert_ne!(old.trim(), new.trim());
    assert!(!db.dir.path().join("master-key.next").exists());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let node = Node::start_with(env.clone()).await;
    drop(node);
    std::fs::write(&file, &old).unwrap();
    let refusal = refused_start(&env);
    assert!(refusal.contains("master key file"), "{refusal}");
    assert!(refusal.contains("is not the master key"), "{refusal}");
}
