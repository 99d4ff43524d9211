//! A 202 is durable: `kill -9` of the server process right after the
//! answers loses nothing, and after a restart every accepted event is
//! processed exactly once.

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    sync::Arc,
    time::Duration,
};

use crate::helpers::{Backend, Node, TestDb, answer, eventually, make_tenant, track, urlenc};
use chrono::Utc;
use fastack_entities::Plan;
use futures::future::join_all;
use serde_json::{Value, json};

async fn start_node(db: &TestDb, processing: bool) -> Node {
    Node::start(
        db,
        &[
            ("FASTACK_LEASE_TTL_MS", "2000"),
            (
                "FASTACK_PROCESSING",
                if processing { "true" } else { "false" },
            ),
        ],
    )
    .await
}

fn item(key: &str, at: chrono::DateTime<Utc>) -> Value {
    let mut t = track(key, &format!("user-{}", key.len() % 13), at);
    t["type"] = json!("track");
    t
}

/// Sends `requests` batches of `per` events from 8 concurrent clients and
/// returns the ids and keys answered 202.
async fn send_all(
    addr: SocketAddr,
    key: &str,
    prefix: &str,
    requests: usize,
    per: usize,
) -> HashMap<String, String> {
    let http = reqwest::Client::new();
    let now = Utc::now();
    let accepted = Arc::new(parking_lot::Mutex::new(HashMap::new()));
    let chunks: Vec<Vec<usize>> = (0..requests)
        .collect::<Vec<_>>()
        .chunks(requests.div_ceil(8))
        .map(|c| c.to_vec())
        .collect();
    join_all(chunks.into_iter().map(|chunk| {
        let http = http.clone();
        let accepted = accepted.clone();
        let key = key.to_owned();
        let prefix = prefix.to_owned();
        async move {
            for r in chunk {
                let keys: Vec<String> = (0..per).map(|i| format!("{prefix}-{r}-{i}")).collect();
                let body = json!({"batch": keys.iter().enumerate().map(|(i, k)| item(k, now - chrono::Duration::seconds(i as i64))).collect::<Vec<_>>()});
                let resp = http
                    .post(format!("http://{addr}/v1/core/batch"))
                    .bearer_auth(&key)
                    .json(&body)
                    .send()
                    .await
                    .expect("send");
                let a = answer(resp).await;
                assert_eq!(a.status, 202, "{}", a.body);
                let mut acc = accepted.lock();
                for (k, it) in keys.iter().zip(a.body["items"].as_array().unwrap()) {
                    acc.insert(it["id"].as_str().unwrap().to_owned(), k.clone());
                }
            }
        }
    }))
    .await;
    Arc::try_unwrap(accepted).unwrap().into_inner()
}

async fn read_all(addr: SocketAddr, key: &str) -> Vec<Value> {
    let http = reqwest::Client::new();
    let from = (Utc::now() - chrono::Duration::days(2)).to_rfc3339();
    let to = (Utc::now() + chrono::Duration::days(2)).to_rfc3339();
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!(
            "http://{addr}/v1/core/events?from={}&to={}&limit=1000",
            urlenc(&from),
            urlenc(&to)
        );
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let a = answer(http.get(url).bearer_auth(key).send().await.unwrap()).await;
        assert_eq!(a.status, 200, "{}", a.body);
        out.extend(a.body["events"].as_array().unwrap().iter().cloned());
        match a.body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return out,
        }
    }
}

fn assert_exactly_once(stored: &[Value], accepted: &HashMap<String, String>) {
    let ids: Vec<&str> = stored.iter().map(|e| e["id"].as_str().unwrap()).collect();
    let unique: HashSet<&str> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "an event was stored twice");
    for id in accepted.keys() {
        assert!(unique.contains(id.as_str()), "accepted event {id} was lost");
    }
}

async fn kill_then_recover(backend: Backend, processing_before_kill: bool) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let store = db.store().await;
    let t = make_tenant(&store, "crash", Plan::Enterprise, None).await;
    drop(store);

    let mut node = start_node(&db, processing_before_kill).await;
    let accepted = send_all(node.addr, &t.key, "crash", 24, 100).await;
    assert_eq!(accepted.len(), 2400);
    // kill -9 right after the last 202.
    node.child.start_kill().expect("SIGKILL");
    let _ = node.child.wait().await;

    let node = start_node(&db, true).await;
    let stored = eventually(
        "every accepted event to be processed",
        Duration::from_secs(60),
        || async {
            let s = read_all(node.addr, &t.key).await;
            (s.len() >= accepted.len()).then_some(s)
        },
    )
    .await;
    // Let processing settle, then check nothing was stored twice.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let stored_again = read_all(node.addr, &t.key).await;
    assert_eq!(stored.len(), stored_again.len());
    assert_exactly_once(&stored_again, &accepted);

    // The idempotency keys survived the crash too.
    let (some_id, some_key) = accepted.iter().next().unwrap();
    let again = send_one_again(node.addr, &t.key, &stored_again, some_id, some_key).await;
    assert_eq!(again["duplicate"], true);
    assert_eq!(again["id"], some_id.as_str());

    let mut node = node;
    node.child.start_kill().ok();
    let _ = node.child.wait().await;
    db.drop_db().await;
}

async fn send_one_again(
    addr: SocketAddr,
    key: &str,
    stored: &[Value],
    id: &str,
    idem: &str,
) -> Value {
    let ev = stored.iter().find(|e| e["id"] == id).expect("stored");
    let body = json!({
        "type": "track",
        "event": ev["event"],
        "user_id": ev["user_id"],
        "properties": ev["properties"],
        "occurred_at": ev["occurred_at"],
        "idempotency_key": idem,
    });
    let resp = reqwest::Client::new()
        .post(format!("http://{addr}/v1/core/batch"))
        .bearer_auth(key)
        .json(&json!({"batch": [body]}))
        .send()
        .await
        .unwrap();
    let a = answer(resp).await;
    assert_eq!(a.status, 202, "{}", a.body);
    a.body["items"][0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_kill_9_before_processing() {
    kill_then_recover(Backend::Sqlite, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_kill_9_during_processing() {
    kill_then_recover(Backend::Sqlite, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_kill_9_before_processing() {
    kill_then_recover(Backend::Postgres, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_kill_9_during_processing() {
    kill_then_recover(Backend::Postgres, true).await;
}

/// The database drops every connection of the server (a restart, a
/// failover, an operator's `pg_terminate_backend`): a request whose commit
/// hit a dead connection is answered 503 (nothing kept, retry), the next
/// ones are accepted on fresh connections, and processing resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_dropped_connections_are_replaced() {
    let Some(app) = crate::helpers::spawn_app(Backend::Postgres).await else {
        return;
    };
    let now = Utc::now();
    let first = app
        .post("/v1/core/track", &app.t.key, &track("dc-1", "u1", now))
        .await;
    assert_eq!(first.status, 202, "{}", first.body);

    let admin = app.db.pg_pool().await;
    // Materialized first: a `pg_terminate_backend(pid)` in the same WHERE
    // is pushed down below the database filter and hits every backend of
    // the cluster, other tests' servers included.
    let killed: Vec<String> = sqlx::query_scalar(
        "WITH ours AS MATERIALIZED ( \
             SELECT pid, application_name FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name LIKE 'fastack%') \
         SELECT application_name FROM ours WHERE pg_terminate_backend(pid)",
    )
    .fetch_all(&admin)
    .await
    .unwrap();
    assert!(
        killed.iter().any(|a| a == "fastack-ingest"),
        "the group commit's own connection was among those dropped: {killed:?}"
    );

    // Sequential retries, as a client would make them: each answer is a 202
    // or a retryable 503, and dead connections are not handed out again.
    let mut unavailable = 0;
    let second = loop {
        let a = app
            .post("/v1/core/track", &app.t.key, &track("dc-2", "u1", now))
            .await;
        match a.status {
            202 => break a,
            503 => {
                assert_eq!(a.body["code"], "unavailable", "{}", a.body);
                unavailable += 1;
                assert!(
                    unavailable <= 2,
                    "still failing after {unavailable} retries"
                );
            }
            s => panic!("unexpected {s}: {}", a.body),
        }
    };
    assert_eq!(second.body["duplicate"], false, "{}", second.body);

    let from = urlenc(&(now - chrono::Duration::hours(1)).to_rfc3339());
    let to = urlenc(&(now + chrono::Duration::hours(1)).to_rfc3339());
    let path = format!("/v1/core/events?from={from}&to={to}&limit=10");
    let ids: HashSet<String> =
        eventually("both events processed", Duration::from_secs(30), || async {
            let a = app.get(&path, &app.t.key).await;
            let evs = a.body["events"].as_array().cloned().unwrap_or_default();
            (a.status == 200 && evs.len() >= 2).then(|| {
                evs.iter()
                    .map(|e| e["id"].as_str().unwrap().to_owned())
                    .collect()
            })
        })
        .await;
    let want: HashSet<String> = [&first, &second]
        .iter()
        .map(|a| a.body["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, want);
    app.cleanup().await;
}

/// One batch of the random-kill load: its keys and body, and the answer.
struct Sent {
    keys: Vec<String>,
    body: Value,
    ids: Option<Vec<String>>,
}

/// Clients sending batches until told to stop; every batch kept with its
/// answer (none when the connection broke).
fn batches_until(
    addr: SocketAddr,
    key: &str,
    prefix: String,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<Vec<Sent>>> {
    (0..4)
        .map(|c| {
            let (key, prefix, stop) = (key.to_owned(), prefix.clone(), stop.clone());
            tokio::spawn(async move {
                let http = reqwest::Client::builder()
                    .timeout(Duration::from_secs(5))
                    .build()
                    .unwrap();
                let now = Utc::now();
                let mut sent = Vec::new();
                let mut n = 0;
                while !*stop.borrow() {
                    let keys: Vec<String> =
                        (0..20).map(|i| format!("{prefix}-c{c}-{n}-{i}")).collect();
                    n += 1;
                    let body =
                        json!({"batch": keys.iter().map(|k| item(k, now)).collect::<Vec<_>>()});
                    let ids = match http
                        .post(format!("http://{addr}/v1/core/batch"))
                        .bearer_auth(&key)
                        .json(&body)
                        .send()
                        .await
                    {
                        Ok(r) if r.status() == 202 => {
                            let v: Value = r.json().await.unwrap_or(Value::Null);
                            v["items"].as_array().map(|items| {
                                items
                                    .iter()
                                    .map(|i| i["id"].as_str().unwrap_or_default().to_owned())
                                    .collect()
                            })
                        }
                        _ => None,
                    };
                    let broken = ids.is_none();
                    sent.push(Sent { keys, body, ids });
                    if broken {
                        // The node is gone: wait for the next one.
                        break;
                    }
                }
                sent
            })
        })
        .collect()
}

/// `kill -9` at random points of the write path (20 times, each after a
/// random 50–650 ms of batch load, processing on), the node started again
/// on what was left each time: every event answered `202` is readable
/// once, every batch left without an answer and sent again with its keys
/// is answered `202` (its events accepted before the kill answer as
/// duplicates with their first id), and no key is stored twice.
async fn kill_9_at_random_points(backend: Backend) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let store = db.store().await;
    let t = make_tenant(&store, "kills", Plan::Enterprise, None).await;
    drop(store);
    // A fixed sequence: a failing run can be run again as it was.
    let mut seed: u64 = 0x5EED_F00D;
    let mut next = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        seed >> 33
    };
    let mut answered: HashMap<String, String> = HashMap::new();
    let mut unanswered: Vec<Sent> = Vec::new();
    let (mut retried, mut retried_duplicates) = (0usize, 0usize);
    let mut node = start_node(&db, true).await;
    for run in 0..20 {
        // What the last kill left without an answer, sent again as a
        // client would: the same keys, the same bodies.
        for s in unanswered.drain(..) {
            let a = answer(
                reqwest::Client::new()
                    .post(format!("http://{}/v1/core/batch", node.addr))
                    .bearer_auth(&t.key)
                    .json(&s.body)
                    .send()
                    .await
                    .expect("the node answers after its restart"),
            )
            .await;
            assert_eq!(a.status, 202, "a batch sent again: {}", a.body);
            retried += 1;
            retried_duplicates += a.body["items"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|i| i["duplicate"] == true)
                .count();
            for (k, it) in s.keys.iter().zip(a.body["items"].as_array().unwrap()) {
                let id = it["id"].as_str().unwrap().to_owned();
                if let Some(first) = answered.get(k) {
                    assert_eq!(first, &id, "key {k} answered with two ids");
                }
                answered.insert(k.clone(), id);
            }
        }
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let clients = batches_until(node.addr, &t.key, format!("run{run}"), stopped);
        tokio::time::sleep(Duration::from_millis(50 + next() % 600)).await;
        node.child.start_kill().expect("SIGKILL");
        let _ = node.child.wait().await;
        stop.send_replace(true);
        for c in clients {
            for s in c.await.expect("client") {
                match s.ids {
                    Some(ids) => {
                        for (k, id) in s.keys.iter().zip(ids) {
                            answered.insert(k.clone(), id);
                        }
                    }
                    None => unanswered.push(s),
                }
            }
        }
        node = start_node(&db, true).await;
    }
    // The last kill's unanswered batches too.
    for s in unanswered.drain(..) {
        let a = answer(
            reqwest::Client::new()
                .post(format!("http://{}/v1/core/batch", node.addr))
                .bearer_auth(&t.key)
                .json(&s.body)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(a.status, 202, "{}", a.body);
        for (k, it) in s.keys.iter().zip(a.body["items"].as_array().unwrap()) {
            answered.insert(k.clone(), it["id"].as_str().unwrap().to_owned());
        }
    }
    let accepted: HashMap<String, String> = answered
        .iter()
        .map(|(k, id)| (id.clone(), k.clone()))
        .collect();
    assert_eq!(
        accepted.len(),
        answered.len(),
        "two keys answered with one id"
    );
    let stored = eventually(
        "every answered event readable",
        Duration::from_secs(90),
        || async {
            let s = read_all(node.addr, &t.key).await;
            let ids: HashSet<&str> = s.iter().filter_map(|e| e["id"].as_str()).collect();
            accepted
                .keys()
                .all(|id| ids.contains(id.as_str()))
                .then_some(s)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let stored = {
        let again = read_all(node.addr, &t.key).await;
        assert_eq!(again.len(), stored.len(), "events still arriving");
        again
    };
    assert_exactly_once(&stored, &accepted);
    // One event per key: every batch was answered in the end, so an event
    // stored beside the one its key was answered with would be one too many.
    assert_eq!(
        stored.len(),
        accepted.len(),
        "events nobody was answered for"
    );
    println!(
        "kill -9 at random points ({backend:?}): 20 kills, {} events answered, {} stored, each \
         once; {retried} batches left unanswered by a kill and sent again, {retried_duplicates} \
         of their events already accepted (answered as duplicates)",
        accepted.len(),
        stored.len()
    );
    node.child.start_kill().ok();
    let _ = node.child.wait().await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_kill_9_at_random_points() {
    kill_9_at_random_points(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_kill_9_at_random_points() {
    kill_9_at_random_points(Backend::Postgres).await;
}
