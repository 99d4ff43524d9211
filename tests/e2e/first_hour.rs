//! The first hour of a new user: the compose file starts a ready node, a
//! port in use writes nothing, a new endpoint gets the very next event,
//! every problem code is documented, errors speak our words, refusals keep
//! the connection, output into a closed pipe ends quietly.

use std::time::Duration;

use chrono::Utc;
use fastack_api::problem::ProblemCode;
use serde_json::{Value, json};
use sqlx::{Connection, Executor};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{
    helpers::{
        Backend, Node, TestApp, TestDb, bin_path, eventually, make_tenant, pg_admin_url, redis_url,
        track,
    },
    webhooks::Receiver,
};

fn repo_file(name: &str) -> String {
    std::fs::read_to_string(format!("{}/{name}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// What `compose.yaml` gives the fastack service.
struct ComposeService {
    environment: Vec<(String, String)>,
    restart: String,
    ports: Vec<String>,
    healthcheck: Vec<String>,
}

fn compose_fastack() -> ComposeService {
    use yaml_rust2::{Yaml, YamlLoader};
    let docs = YamlLoader::load_from_str(&repo_file("compose.yaml")).expect("compose.yaml is YAML");
    let svc = &docs[0]["services"]["fastack"];
    let strings = |y: &Yaml| -> Vec<String> {
        y.as_vec()
            .map(|v| {
                v.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let environment = svc["environment"]
        .as_hash()
        .expect("the fastack service has an environment map")
        .iter()
        .map(|(k, v)| {
            let value = match v {
                Yaml::String(s) => s.clone(),
                Yaml::Integer(i) => i.to_string(),
                Yaml::Boolean(b) => b.to_string(),
                other => panic!("{k:?}: {other:?}"),
            };
            (k.as_str().unwrap().to_owned(), value)
        })
        .collect();
    ComposeService {
        environment,
        restart: svc["restart"].as_str().unwrap_or_default().to_owned(),
        ports: strings(&svc["ports"]),
        healthcheck: strings(&svc["healthcheck"]["test"]),
    }
}

/// `${NAME:?message}` from `.env`, as compose interpolates it; any other
/// form of interpolation (a silent default) fails the test.
fn interpolate(value: &str, dotenv: &[(&str, String)]) -> String {
    let Some(start) = value.find("${") else {
        return value.to_owned();
    };
    let end = start + value[start..].find('}').expect("closed ${…}");
    let inner = &value[start + 2..end];
    let (name, rest) = inner.split_at(inner.find([':', '-', '?']).unwrap_or(inner.len()));
    assert!(
        rest.starts_with(":?"),
        "`{value}` must refuse to start without {name} (`${{{name}:?…}}`), not default it"
    );
    let v = dotenv
        .iter()
        .find(|(k, _)| *k == name)
        .unwrap_or_else(|| panic!("{name} is not in the .env the README makes"));
    format!("{}{}{}", &value[..start], v.1, &value[end + 1..])
}

/// `compose.yaml`'s fastack service, run as the binary with exactly its
/// environment (service hosts mapped to the local services, the database to
/// this test's, ports to free ones, the data volume to a temp dir), becomes
/// ready and has its admin listener up. The file restarts fastack, probes
/// `/readyz`, publishes 8081, and reads both secrets from `.env`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_environment_starts_a_ready_node() {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    if !crate::amqp::rabbit_reachable().await {
        db.drop_db().await;
        return;
    }
    let svc = compose_fastack();
    assert_eq!(svc.restart, "unless-stopped");
    assert!(
        svc.ports.iter().any(|p| p.ends_with(":8081")),
        "{:?}",
        svc.ports
    );
    assert!(
        svc.ports.iter().any(|p| p.ends_with(":8080")),
        "{:?}",
        svc.ports
    );
    assert!(
        svc.healthcheck.iter().any(|a| a.ends_with("/readyz")),
        "{:?}",
        svc.healthcheck
    );

    // The .env the README's command writes.
    use base64::Engine;
    let b64 = |n: usize| {
        base64::engine::general_purpose::STANDARD
            .encode((0..n).map(|_| rand::random::<u8>()).collect::<Vec<_>>())
    };
    let dotenv = [
        ("FASTACK_ENC_KEY", b64(32)),
        ("FASTACK_ADMIN_TOKEN", b64(24)),
    ];
    let token = dotenv[1].1.clone();

    // The compose database's role, as the postgres image creates it.
    let db_name = db.pg_name.clone().unwrap();
    let mut admin = sqlx::PgConnection::connect(&pg_admin_url()).await.unwrap();
    admin
        .execute(
            "DO $$ BEGIN CREATE ROLE fastack LOGIN PASSWORD 'fastack'; \
             EXCEPTION WHEN duplicate_object THEN NULL; END $$",
        )
        .await
        .unwrap();
    admin
        .execute(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE {db_name} OWNER TO fastack"
        )))
        .await
        .unwrap();
    let pg = url::Url::parse(&pg_admin_url()).unwrap();
    let redis = url::Url::parse(&redis_url()).unwrap();
    let map_host = |value: &str| -> String {
        let Ok(mut u) = url::Url::parse(value) else {
            return value.to_owned();
        };
        match u.host_str() {
            Some("postgres") => {
                u.set_host(pg.host_str()).unwrap();
                u.set_port(pg.port()).unwrap();
                u.set_path(&format!("/{db_name}"));
            }
            Some("redis") => {
                u.set_host(redis.host_str()).unwrap();
                u.set_port(redis.port()).unwrap();
            }
            Some("rabbitmq") => u.set_host(Some("127.0.0.1")).unwrap(),
            _ => return value.to_owned(),
        }
        u.to_string()
    };
    let data = db.dir.path().join("volume");
    let env: Vec<(String, String)> = svc
        .environment
        .iter()
        .map(|(k, v)| {
            let v = interpolate(v, &dotenv);
            let v = match k.as_str() {
                "FASTACK_LISTEN" | "FASTACK_ADMIN_LISTEN" => "127.0.0.1:0".to_owned(),
                "FASTACK_DATA_DIR" => data.display().to_string(),
                _ => map_host(&v),
            };
            (k.clone(), v)
        })
        .collect();
    for required in [
        "FASTACK_ENC_KEY",
        "FASTACK_ADMIN_TOKEN",
        "FASTACK_DATABASE_URL",
    ] {
        assert!(
            env.iter().any(|(k, _)| k == required),
            "compose sets no {required}"
        );
    }
    let node = Node::start_with(env).await;
    let http = reqwest::Client::new();
    eventually("/readyz answers 200", Duration::from_secs(30), || async {
        let r = http
            .get(format!("http://{}/readyz", node.addr))
            .send()
            .await
            .ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    let admin_addr = node.admin_addr.expect("the admin listener is up");
    let r = http
        .get(format!("http://{admin_addr}/admin/v1/tenants"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    drop(node);
    db.drop_db().await;
}

/// A port already in use fails the start before anything is written: no
/// data directory, no tenant, no bootstrap key, no tables.
async fn port_in_use_writes_nothing(backend: Backend) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut config = db.config();
    config.listen = taken.local_addr().unwrap();
    config.data_dir = db.dir.path().join("fresh");
    config.bootstrap = true;
    let err = match fastack_api::start(config, fastack_api::StartOptions::default()).await {
        Ok(_) => panic!("started on a port in use"),
        Err(e) => e,
    };
    // The message names the setting that moves it.
    assert!(
        err.to_string().contains(&format!(
            "cannot listen on {} (set by FASTACK_LISTEN)",
            taken.local_addr().unwrap()
        )),
        "{err}"
    );
    assert!(!db.dir.path().join("fresh").exists());
    if backend == Backend::Postgres {
        let pool = db.pg_pool().await;
        let tables: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(tables, 0, "migrations ran before the bind");
        pool.close().await;
    }
    db.drop_db().await;
}

/// A data directory others can read is named once at start, however many
/// parts of the node open it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_data_directory_is_warned_about_once() {
    use std::os::unix::fs::PermissionsExt;
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    std::fs::set_permissions(db.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let node = Node::start(&db, &[("FASTACK_BOOTSTRAP", "true")]).await;
    let warnings = node
        .log
        .lock()
        .iter()
        .filter(|line| line.contains("the data directory is open to other local users"))
        .count();
    assert_eq!(warnings, 1, "{}", node.log.lock().join("\n"));
    node.terminate().await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_port_in_use_writes_nothing() {
    port_in_use_writes_nothing(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_port_in_use_writes_nothing() {
    port_in_use_writes_nothing(Backend::Postgres).await;
}

/// A tenant in use gets an endpoint subscribed to `core.event.tracked`
/// from the CLI (another process, as on another node), then sends an event
/// at once: that event is delivered.
async fn new_endpoint_gets_the_next_event(app: TestApp) {
    let now = Utc::now();
    let from = (now - chrono::Duration::hours(1)).to_rfc3339();
    let to = (now + chrono::Duration::hours(1)).to_rfc3339();
    let first = app
        .post("/v1/core/track", &app.t.key, &track("before", "u", now))
        .await;
    assert_eq!(first.status, 202);
    eventually(
        "the first event processed",
        Duration::from_secs(20),
        || async { (!app.events(&app.t.key, &from, &to, "").await.is_empty()).then_some(()) },
    )
    .await;
    for round in 0..3 {
        // A receiver per round: earlier endpoints receive this round's
        // event too.
        let rx = Receiver::start(&[]).await;
        let out = std::process::Command::new(bin_path())
            .args(["admin", "--json", "webhook", "add", "--tenant", "acme"])
            .args(["--url", &rx.url()])
            .args(["--events", "core.event.tracked"])
            .env_clear()
            .envs(app.db.env())
            .env("FASTACK_WEBHOOK_ALLOW_PRIVATE", "true")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let key = format!("right-after-{round}");
        let a = app
            .post("/v1/core/track", &app.t.key, &track(&key, "u", now))
            .await;
        assert_eq!(a.status, 202);
        let id = a.body["id"].as_str().unwrap().to_owned();
        let hits = rx.wait_hits(1, Duration::from_secs(20)).await;
        let body: Value = serde_json::from_slice(&hits[0].body).unwrap();
        assert_eq!(body["id"], id.as_str(), "round {round}");
    }
    app.cleanup().await;
}

/// The admin listener on, private receivers allowed (as the CLI above).
async fn webhook_app_on(backend: Backend) -> Option<TestApp> {
    crate::webhooks::webhook_app(backend).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_new_endpoint_gets_the_next_event() {
    if let Some(app) = webhook_app_on(Backend::Sqlite).await {
        new_endpoint_gets_the_next_event(app).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_new_endpoint_gets_the_next_event() {
    if let Some(app) = webhook_app_on(Backend::Postgres).await {
        new_endpoint_gets_the_next_event(app).await;
    }
}

/// Every code the server can emit (the `ProblemCode` enum is the only way
/// to make a problem) is in the README's list and in the OpenAPI document;
/// a 405 carries one of them.
async fn every_problem_code_is_documented(app: TestApp) {
    let readme = repo_file("README.md");
    let list_start = readme
        .find("- **Errors** are RFC 9457")
        .expect("the README's error list");
    let list = &readme[list_start..list_start + readme[list_start..].find("\n\n").unwrap()];
    let spec = repo_file("openapi/openapi.json");
    let spec: Value = serde_json::from_str(&spec).unwrap();
    let enumerated: Vec<&str> = spec["components"]["schemas"]["ProblemCode"]["enum"]
        .as_array()
        .expect("ProblemCode is an enum in the OpenAPI document")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for code in ProblemCode::ALL {
        assert!(
            list.contains(&format!("`{code}`")),
            "README misses `{code}`"
        );
        assert!(enumerated.contains(&code.as_str()), "OpenAPI misses {code}");
    }
    let resp = app
        .http
        .delete(app.url("/v1/core/track"))
        .bearer_auth(&app.t.key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    assert_eq!(resp.headers()["allow"], "POST");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["code"], "method_not_allowed");
    app.cleanup().await;
}

crate::on_both_backends!(every_problem_code_is_documented);

/// Errors say in our words what is wrong and what is expected.
async fn errors_speak_our_words(app: TestApp) {
    let a = app
        .get("/v1/core/events?to=2026-12-01T00:00:00Z", &app.t.key)
        .await;
    assert_eq!(a.status, 400);
    assert_eq!(
        a.body["detail"],
        "`from` is required: an RFC 3339 instant with an offset, e.g. 2026-11-01T00:00:00Z"
    );
    assert_eq!(a.body["errors"][0]["field"], "from");
    assert_eq!(a.body["errors"][0]["code"], "required");
    let a = app
        .get(
            "/v1/core/events?from=2026-11-01T00:00:00Z&to=2026-12-01T00:00:00Z&limit=x",
            &app.t.key,
        )
        .await;
    assert_eq!(a.status, 400);
    assert_eq!(
        a.body["detail"],
        "`limit` is not valid: expected an integer within the page size range"
    );
    let a = app
        .get(
            "/v1/core/events?from=2026-11-01T00:00:00Z&to=2026-12-01T00:00:00Z&limit=5000",
            &app.t.key,
        )
        .await;
    assert_eq!(a.status, 400);
    assert!(
        a.body["detail"]
            .as_str()
            .unwrap()
            .starts_with("`limit` must be at most 1000"),
        "{}",
        a.body
    );
    for body in [json!([]), json!([track("k", "u", Utc::now())])] {
        let a = app.post("/v1/core/batch", &app.t.key, &body).await;
        assert_eq!(a.status, 422, "{}", a.body);
        assert!(
            a.body["detail"]
                .as_str()
                .unwrap()
                .starts_with("the body must be a JSON object {\"batch\": [ … ]}"),
            "{}",
            a.body
        );
    }
    let a = app.post("/v1/core/batch", &app.t.key, &json!({})).await;
    assert_eq!(a.body["errors"][0]["field"], "/batch");
    assert_eq!(a.body["errors"][0]["code"], "required");
    // An item that is not JSON the parser takes is named by its index.
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let mut item = track("deep-1", "u", Utc::now());
    item["type"] = json!("track");
    let body = format!(r#"{{"batch":[{},{{"type":"track","x":{deep}}}]}}"#, item);
    let a = app
        .post_raw("/v1/core/batch", &app.t.key, body.into_bytes())
        .await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(a.body["errors"][0]["index"], 1);
    assert_eq!(a.body["errors"][0]["field"], "/batch/1");
    // A key sent without its scheme, or with another, is not "missing".
    let events = app.url("/v1/core/events?from=2026-11-01T00:00:00Z&to=2026-12-01T00:00:00Z");
    for (header, detail) in [
        (
            Some(app.t.key.clone()),
            "the `Authorization` header carries a key without its scheme: send `Bearer <api key>`",
        ),
        (
            Some(format!("Basic {}", app.t.key)),
            "the `Authorization` header uses another scheme: send `Bearer <api key>`",
        ),
        (None, "missing `Authorization: Bearer <api key>`"),
    ] {
        let mut req = app.http.get(&events);
        if let Some(h) = header {
            req = req.header("authorization", h);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 401);
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["code"], "unauthorized");
        assert_eq!(body["detail"], detail);
    }
    app.cleanup().await;
}

crate::on_both_backends!(errors_speak_our_words);

/// 401 and 429 read the body before answering, so a keep-alive client keeps
/// its connection (the 429 from the key's own limit: Redis on PostgreSQL).
async fn refusals_keep_the_connection(app: TestApp) {
    let limited = make_tenant(&app.store, "limited", fastack_entities::Plan::Pro, Some(1)).await;
    let mut s = tokio::net::TcpStream::connect(app.server.as_ref().unwrap().addr())
        .await
        .unwrap();
    let mut buf = vec![0u8; 8192];
    let mut statuses = Vec::new();
    for (i, key) in [
        "fsk_nope",
        &limited.key,
        &limited.key,
        "fsk_nope",
        &limited.key,
    ]
    .into_iter()
    .enumerate()
    {
        let body = serde_json::to_vec(&track(&format!("keep-{i}"), "u", Utc::now())).unwrap();
        // Headers first, the body a moment later: the answer must wait for
        // it, and the connection must stay open.
        let head = format!(
            "POST /v1/core/track HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        s.write_all(&body).await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("an answer")
            .unwrap();
        assert!(n > 0, "the connection was closed");
        let got = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
        assert!(!got.contains("connection: close"), "{got}");
        statuses.push(got[9..12].to_owned());
    }
    assert_eq!(statuses[0], "401");
    assert_eq!(statuses[1], "202");
    assert!(statuses.iter().any(|s| s == "429"), "{statuses:?}");
    app.cleanup().await;
}

crate::on_both_backends!(refusals_keep_the_connection);

/// `admin key revoke` takes the id or the prefix `key list` prints, says
/// what it expects otherwise, and never echoes what may be a secret; the
/// revoked key stops working.
async fn a_key_is_revoked_by_its_prefix(app: TestApp) {
    let cli = |args: &[&str]| {
        let args: Vec<&str> = ["admin", "key"].iter().chain(args).copied().collect();
        crate::helpers::fastack_cli(&app.db, &args)
    };
    let (ok, _, err) = cli(&["revoke", "--key", "nonsense"]);
    assert!(!ok);
    assert!(
        err.contains("is neither a key id (a UUID, the ID column of `fastack admin key list`) nor a key prefix"),
        "{err}"
    );
    let (ok, _, err) = cli(&["revoke", "--key", &app.t.key]);
    assert!(!ok);
    assert!(err.contains("longer than a key prefix"), "{err}");
    assert!(!err.contains(&app.t.key), "the secret was echoed: {err}");
    let (ok, _, err) = cli(&["revoke", "--key", "fsk_zzzzzzzz"]);
    assert!(!ok);
    assert!(err.contains("no key has the prefix fsk_zzzzzzzz"), "{err}");
    let prefix = &app.t.key[..12];
    let (ok, list, _) = cli(&["list", "--tenant", &app.t.tenant.name]);
    assert!(ok && list.contains(prefix), "{list}");
    let (ok, out, err) = cli(&["revoke", "--key", prefix]);
    assert!(ok, "{err}");
    assert!(out.starts_with("revoked key "), "{out}");
    eventually(
        "the revoked key is refused",
        Duration::from_secs(10),
        || async {
            let a = app
                .get(
                    "/v1/core/events?from=2026-11-01T00:00:00Z&to=2026-12-01T00:00:00Z",
                    &app.t.key,
                )
                .await;
            (a.status == 401).then_some(())
        },
    )
    .await;
    app.cleanup().await;
}

crate::on_both_backends!(a_key_is_revoked_by_its_prefix);

/// The admin CLI's help names every flag and lists the values of choices;
/// the server binary has no load tool in it (the load tool's own help is
/// checked in `benches/tests/help.rs`).
#[test]
fn cli_help_describes_every_flag() {
    let help_of = |bin: &std::path::Path, args: &[&str]| -> String {
        let out = std::process::Command::new(bin)
            .args(args)
            .arg("--help")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let help = |args: &[&str]| help_of(&bin_path(), args);
    let admin = help(&["admin"]);
    assert!(!admin.contains("Tenants and API keys\n\nUsage"), "{admin}");
    for (bin, cmd) in [
        vec!["admin", "webhook", "add"],
        vec!["admin", "webhook", "enable"],
        vec!["admin", "webhook", "disable"],
        vec!["admin", "deliveries"],
        vec!["admin", "tenant", "create"],
        vec!["admin", "key", "create"],
        vec!["admin", "key", "revoke"],
        vec!["admin", "quarantine", "retry"],
    ]
    .into_iter()
    .map(|cmd| (bin_path(), cmd))
    {
        let text = help_of(&bin, &cmd);
        let options = text.split("Options:").nth(1).unwrap_or_default();
        for line in options.lines().filter(|l| l.trim_start().starts_with("--")) {
            let flag = line.split_whitespace().next().unwrap();
            if flag == "--help" {
                continue;
            }
            // Clap puts the help on the flag's line or on the next ones.
            let described = line.trim().len() > flag.len() + 10
                || options
                    .split(line)
                    .nth(1)
                    .and_then(|rest| rest.lines().nth(1))
                    .is_some_and(|next| !next.trim().is_empty() && !next.trim().starts_with('-'));
            assert!(described, "{cmd:?} {flag} has no help:\n{text}");
        }
    }
    assert!(
        help(&["admin", "tenant", "create"]).contains("[possible values: free, pro, enterprise]")
    );
    assert!(help(&["serve"]).contains("fastack config"));
    // Every event type an endpoint can subscribe to is named where it is chosen.
    let add = help(&["admin", "webhook", "add"]);
    for event in fastack_entities::webhook::EVENT_TYPES {
        assert!(
            add.contains(event),
            "`webhook add --help` leaves out {event}:\n{add}"
        );
    }
    assert!(!help(&[]).contains("bench"), "{}", help(&[]));
}

/// `fastack openapi | head`: the reader leaving early ends the command
/// quietly (exit 0), not with a panic about a broken pipe.
#[test]
fn output_into_a_closed_pipe_is_not_a_panic() {
    use std::process::{Command, Stdio};
    let mut child = Command::new(bin_path())
        .arg("openapi")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Close the read end before the spec (~70 KiB, more than a pipe
    // buffer) is written.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}
