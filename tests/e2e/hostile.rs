//! Hostile input. What the front door accepts, both backends store and
//! return as sent; everything else is a typed 4xx, never a 5xx. One
//! request's bad row never fails another tenant's; an event processing
//! refuses goes to quarantine and its tenant goes on; time is normalised
//! once, so every month boundary lands in its month.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use chrono::{DateTime, Datelike, FixedOffset, SecondsFormat, TimeZone, Utc};
use fastack_api::StartOptions;
use fastack_core::{clock::ManualClock, faults::Faults, validate::parse_timestamp};
use fastack_entities::Plan;
use futures::{StreamExt, future::join_all, stream};
use rand::{Rng, SeedableRng, rngs::StdRng, seq::IndexedRandom};
use serde_json::{Value, json};

use crate::{
    helpers::{
        Backend, TestApp, TestDb, answer, eventually, make_tenant, spawn_with, track, urlenc,
    },
    webhooks::{ADMIN_TOKEN, admin_get, admin_post, tweak},
};

/// Every `code` a problem answer may carry (README "Errors").
const KNOWN_CODES: &[&str] = &[
    "invalid_json",
    "invalid_payload",
    "invalid_query",
    "batch_too_large",
    "payload_too_large",
    "unsupported_media_type",
    "request_timeout",
    "idempotency_key_conflict",
    "occurred_at_in_future",
    "occurred_at_out_of_retention",
    "unauthorized",
    "rate_limited",
    "not_found",
];

/// What a generated request should get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Accepted,
    Status(u16, &'static str),
    /// Accepted as a duplicate of an earlier request (same id).
    Duplicate,
}

/// One generated request.
struct Case {
    path: &'static str,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    expect: Expect,
    /// The events as sent (for accepted requests), to compare on read.
    events: Vec<Value>,
    what: String,
}

struct Corpus {
    rng: StdRng,
    now: DateTime<Utc>,
    serial: usize,
    /// Accepted single-event bodies, for duplicates and conflicts.
    accepted: Vec<(Vec<u8>, Value)>,
}

fn words(rng: &mut StdRng) -> String {
    const PARTS: &[&str] = &[
        "plan",
        "Ünïcødé",
        "日本語",
        "emoji 🎉",
        "tab\there",
        "line\nbreak",
        "quote\"d",
        "back\\slash",
        "bell\u{7}",
        "del\u{7f}",
        "ctl\u{1f}",
        "<script>",
        "'; DROP TABLE x;--",
        "",
        " ",
        "\u{2028}\u{2029}",
        "\u{feff}bom",
        "\u{fffd}",
    ];
    PARTS.choose(rng).unwrap().to_string()
}

fn number(rng: &mut StdRng) -> Value {
    match rng.random_range(0..8) {
        0 => json!(rng.random::<i64>()),
        1 => json!(rng.random::<u64>()),
        2 => json!(rng.random::<f64>() * 1e6),
        3 => json!(u64::MAX),
        4 => json!(i64::MIN),
        5 => json!(0.1),
        6 => json!(-0.0),
        _ => json!(1e300),
    }
}

fn value(rng: &mut StdRng, depth: u32) -> Value {
    match rng.random_range(0..if depth > 3 { 4 } else { 7 }) {
        0 => Value::Null,
        1 => json!(rng.random::<bool>()),
        2 => number(rng),
        3 => json!(words(rng)),
        4 => Value::Array(
            (0..rng.random_range(0..4))
                .map(|_| value(rng, depth + 1))
                .collect(),
        ),
        _ => Value::Object(properties(rng, depth + 1)),
    }
}

fn properties(rng: &mut StdRng, depth: u32) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    for i in 0..rng.random_range(0..5) {
        let mut name = words(rng);
        name.push_str(&format!("#{i}"));
        m.insert(name, value(rng, depth));
    }
    m
}

impl Corpus {
    fn new(seed: u64, now: DateTime<Utc>) -> Self {
        Corpus {
            rng: StdRng::seed_from_u64(seed),
            now,
            serial: 0,
            accepted: Vec::new(),
        }
    }

    /// A valid `occurred_at`: within the last 30 days, sometimes a leap
    /// second at a month's end or an extreme offset.
    fn occurred_at(&mut self) -> String {
        let rng = &mut self.rng;
        match rng.random_range(0..6) {
            0 => {
                // The last leap-second form of the month before this one.
                let start = Utc
                    .with_ymd_and_hms(self.now.year(), self.now.month(), 1, 0, 0, 0)
                    .unwrap();
                let last = start - chrono::Duration::seconds(1);
                format!("{}:60Z", last.format("%Y-%m-%dT%H:%M"))
            }
            1 => {
                let offset = [
                    -14 * 3600,
                    14 * 3600,
                    5 * 3600 + 45 * 60,
                    -(9 * 3600 + 30 * 60),
                ]
                .choose(rng)
                .copied()
                .unwrap();
                let at = self.now - chrono::Duration::minutes(rng.random_range(0..60 * 24 * 20));
                at.with_timezone(&FixedOffset::east_opt(offset).unwrap())
                    .to_rfc3339_opts(SecondsFormat::Nanos, false)
            }
            _ => (self.now - chrono::Duration::seconds(rng.random_range(0..86_400 * 29)))
                .to_rfc3339_opts(SecondsFormat::AutoSi, true),
        }
    }

    fn key(&mut self) -> String {
        self.serial += 1;
        format!("hostile-{}-{}", self.serial, self.rng.random::<u32>())
    }

    fn valid_event(&mut self, batched: bool) -> Value {
        let identify = self.rng.random_range(0..4) == 0;
        let mut ev = serde_json::Map::new();
        if batched {
            ev.insert(
                "type".into(),
                json!(if identify { "identify" } else { "track" }),
            );
        }
        if !identify {
            ev.insert(
                "event".into(),
                json!(format!("Event {}", self.rng.random_range(0..7))),
            );
        }
        match self.rng.random_range(0..3) {
            0 => {
                ev.insert(
                    "user_id".into(),
                    json!(format!("u-{}", self.rng.random_range(0..50))),
                );
            }
            1 => {
                ev.insert(
                    "anonymous_id".into(),
                    json!(format!("a-{}", self.rng.random_range(0..50))),
                );
            }
            _ => {
                ev.insert(
                    "user_id".into(),
                    json!(format!("u-{}", self.rng.random_range(0..50))),
                );
                ev.insert(
                    "anonymous_id".into(),
                    json!(format!("a-{}", self.rng.random_range(0..50))),
                );
            }
        }
        let props = properties(&mut self.rng, 0);
        ev.insert(
            (if identify { "traits" } else { "properties" }).into(),
            Value::Object(props),
        );
        ev.insert("occurred_at".into(), json!(self.occurred_at()));
        let key = self.key();
        ev.insert("idempotency_key".into(), json!(key));
        Value::Object(ev)
    }

    fn single(&mut self, ev: &Value) -> (&'static str, Vec<u8>) {
        let path = if ev.get("event").is_some() {
            "/v1/core/track"
        } else {
            "/v1/core/identify"
        };
        (path, serde_json::to_vec(ev).unwrap())
    }

    fn case(&mut self) -> Case {
        let kind = self.rng.random_range(0..22);
        let mut ev = self.valid_event(false);
        let json_ct = Some("application/json");
        let bad = |path, body: Vec<u8>, status, code, what: &str| Case {
            path,
            content_type: json_ct,
            body,
            expect: Expect::Status(status, code),
            events: vec![],
            what: what.to_owned(),
        };
        match kind {
            // Valid single events (the most common case).
            0..=5 => {
                let (path, body) = self.single(&ev);
                self.accepted.push((body.clone(), ev.clone()));
                Case {
                    path,
                    content_type: if kind == 5 {
                        Some("application/json; charset=utf-8")
                    } else {
                        json_ct
                    },
                    body,
                    expect: Expect::Accepted,
                    events: vec![ev],
                    what: "valid event".into(),
                }
            }
            // A valid batch.
            6 | 7 => {
                let items: Vec<Value> = (0..self.rng.random_range(1..6))
                    .map(|_| self.valid_event(true))
                    .collect();
                Case {
                    path: "/v1/core/batch",
                    content_type: json_ct,
                    body: serde_json::to_vec(&json!({ "batch": items })).unwrap(),
                    expect: Expect::Accepted,
                    events: items,
                    what: "valid batch".into(),
                }
            }
            // NUL anywhere.
            8 => {
                let place = self.rng.random_range(0..5);
                match place {
                    0 => ev["idempotency_key"] = json!("k\u{0}ey"),
                    1 if ev.get("user_id").is_some() => ev["user_id"] = json!("u\u{0}"),
                    2 if ev.get("event").is_some() => ev["event"] = json!("E\u{0}"),
                    3 => {
                        let props = if ev.get("traits").is_some() {
                            "traits"
                        } else {
                            "properties"
                        };
                        ev[props]["deep"] = json!({"a": [1, {"b": "x\u{0}y"}]});
                    }
                    _ => {
                        let props = if ev.get("traits").is_some() {
                            "traits"
                        } else {
                            "properties"
                        };
                        ev[props]["na\u{0}me"] = json!(1);
                    }
                }
                let (path, body) = self.single(&ev);
                bad(path, body, 422, "invalid_payload", "NUL")
            }
            // A lone surrogate (raw JSON text: serde cannot write one).
            9 => {
                let (path, body) = self.single(&ev);
                let text = String::from_utf8(body).unwrap();
                let text = text.replacen(
                    "\"occurred_at\"",
                    r#""occurred_at_x":"\ud800", "occurred_at""#,
                    1,
                );
                // The unknown member makes no difference: the surrogate is
                // refused first.
                bad(
                    path,
                    text.into_bytes(),
                    422,
                    "invalid_payload",
                    "lone surrogate",
                )
            }
            // A number storage cannot keep.
            10 => {
                let (path, body) = self.single(&ev);
                let text = String::from_utf8(body).unwrap();
                let big = [
                    "123456789012345678901234567890",
                    "3.14159265358979323846",
                    "1e400",
                ]
                .choose(&mut self.rng)
                .unwrap()
                .to_string();
                let text = text.replacen(
                    "\"idempotency_key\"",
                    &format!(r#""idempotency_key_n":{big}, "idempotency_key""#),
                    1,
                );
                bad(
                    path,
                    text.into_bytes(),
                    422,
                    "invalid_payload",
                    "inexact number",
                )
            }
            // Control characters in identifiers.
            11 => {
                ev["idempotency_key"] = json!(format!("key\n{}", self.serial));
                let (path, body) = self.single(&ev);
                bad(
                    path,
                    body,
                    422,
                    "invalid_payload",
                    "control character in key",
                )
            }
            // Repeated member names, at the top or deep down.
            12 => {
                let (path, body) = self.single(&ev);
                let text = String::from_utf8(body).unwrap();
                let text = if self.rng.random() {
                    text.replacen('{', r#"{"user_id":"x","user_id":"y","#, 1)
                } else {
                    text.replacen(
                        "\"occurred_at\"",
                        r#""properties_extra":{"role":"user","role":"admin"},"occurred_at""#,
                        1,
                    )
                };
                bad(
                    path,
                    text.into_bytes(),
                    400,
                    "invalid_json",
                    "repeated member name",
                )
            }
            // Not JSON.
            13 => {
                let (path, body) = self.single(&ev);
                let cut = self.rng.random_range(1..body.len());
                let mut body = body[..cut].to_vec();
                if self.rng.random() {
                    body.extend_from_slice(b"}garbage");
                }
                bad(path, body, 400, "invalid_json", "malformed JSON")
            }
            // Not sent as JSON.
            14 => {
                let (path, body) = self.single(&ev);
                let ct = [
                    Some("text/plain"),
                    Some("application/x-www-form-urlencoded"),
                    None,
                ]
                .choose(&mut self.rng)
                .copied()
                .unwrap();
                Case {
                    path,
                    content_type: ct,
                    body,
                    expect: Expect::Status(415, "unsupported_media_type"),
                    events: vec![],
                    what: "wrong content type".into(),
                }
            }
            // Out of range times.
            15 => {
                let future = self.rng.random();
                ev["occurred_at"] = json!(if future {
                    (self.now + chrono::Duration::hours(25)).to_rfc3339()
                } else {
                    (self.now - chrono::Duration::days(365 * 4)).to_rfc3339()
                });
                let (path, body) = self.single(&ev);
                let code = if future {
                    "occurred_at_in_future"
                } else {
                    "occurred_at_out_of_retention"
                };
                bad(path, body, 422, code, "time out of range")
            }
            // Wrong types and unknown fields.
            16 => {
                match self.rng.random_range(0..3) {
                    0 => ev["occurred_at"] = json!(5),
                    1 => ev["idempotency_key"] = json!(["k"]),
                    _ => ev["occured_at"] = json!("typo"),
                }
                let (path, body) = self.single(&ev);
                bad(
                    path,
                    body,
                    422,
                    "invalid_payload",
                    "wrong type or unknown field",
                )
            }
            // Too large an event.
            17 => {
                let props = if ev.get("traits").is_some() {
                    "traits"
                } else {
                    "properties"
                };
                ev[props]["blob"] = json!("x".repeat(33 * 1024));
                let (path, body) = self.single(&ev);
                bad(path, body, 413, "payload_too_large", "event over 32 KiB")
            }
            // Nesting beyond the parser's depth.
            18 => {
                let depth = 200;
                let nested = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
                let (path, body) = self.single(&ev);
                let text = String::from_utf8(body).unwrap().replacen(
                    "\"occurred_at\"",
                    &format!(r#""deep":{nested},"occurred_at""#),
                    1,
                );
                bad(
                    path,
                    text.into_bytes(),
                    400,
                    "invalid_json",
                    "nesting too deep",
                )
            }
            // A batch with one bad item is refused whole.
            19 => {
                let mut items: Vec<Value> = (0..3).map(|_| self.valid_event(true)).collect();
                items[1]["idempotency_key"] = json!("bad\u{0}key");
                bad(
                    "/v1/core/batch",
                    serde_json::to_vec(&json!({ "batch": items })).unwrap(),
                    422,
                    "invalid_payload",
                    "batch with a NUL item",
                )
            }
            // A repeat of an accepted event: a duplicate, or a conflict
            // when its content changed.
            _ => match self.accepted.choose(&mut self.rng).cloned() {
                Some((body, sent)) if kind == 20 => Case {
                    path: if sent.get("event").is_some() {
                        "/v1/core/track"
                    } else {
                        "/v1/core/identify"
                    },
                    content_type: json_ct,
                    body,
                    expect: Expect::Duplicate,
                    events: vec![],
                    what: "duplicate".into(),
                },
                Some((_, mut sent)) => {
                    let props = if sent.get("traits").is_some() {
                        "traits"
                    } else {
                        "properties"
                    };
                    sent[props]["changed"] = json!(true);
                    let (path, body) = self.single(&sent);
                    bad(path, body, 409, "idempotency_key_conflict", "conflict")
                }
                None => {
                    let (path, body) = self.single(&ev);
                    self.accepted.push((body.clone(), ev.clone()));
                    Case {
                        path,
                        content_type: json_ct,
                        body,
                        expect: Expect::Accepted,
                        events: vec![ev],
                        what: "valid event".into(),
                    }
                }
            },
        }
    }
}

fn seed() -> u64 {
    std::env::var("FASTACK_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_201)
}

/// The stored form of a sent `occurred_at`.
fn stored_time(sent: &str) -> String {
    parse_timestamp(sent)
        .expect("a valid timestamp")
        .to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// 2,400 seeded requests from 8 concurrent clients: every answer is 202 or
/// the expected typed 4xx (problem+json, a known code), never a 5xx; every
/// accepted event is readable within 30 s with what was sent.
async fn hostile_corpus_is_answered_and_stored_as_sent(app: TestApp) {
    const REQUESTS: usize = 2_400;
    let seed = seed();
    let now = Utc::now();
    let mut corpus = Corpus::new(seed, now);
    let cases: Vec<Case> = (0..REQUESTS).map(|_| corpus.case()).collect();
    // Duplicates and conflicts refer to earlier requests: they go second,
    // once every first request was answered.
    let (repeats, firsts): (Vec<Case>, Vec<Case>) = cases
        .into_iter()
        .partition(|c| matches!(c.expect, Expect::Duplicate) || c.what == "conflict");
    let mut results = send_cases(&app, firsts).await;
    results.extend(send_cases(&app, repeats).await);
    check_corpus(&app, seed, now, results).await;
    app.cleanup().await;
}

type Answered = (Case, u16, Value, Option<String>);

/// Sends cases from 8 concurrent clients.
async fn send_cases(app: &TestApp, cases: Vec<Case>) -> Vec<Answered> {
    stream::iter(cases)
        .map(|case| async move {
            let mut req = app
                .http
                .post(app.url(case.path))
                .bearer_auth(&app.t.key)
                .body(case.body.clone());
            if let Some(ct) = case.content_type {
                req = req.header("content-type", ct);
            }
            let resp = req.send().await.expect("request sent");
            let a = answer(resp).await;
            let ct = a
                .headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            (case, a.status, a.body, ct)
        })
        .buffered(8)
        .collect()
        .await
}

/// Checks every answer, then that every accepted event reads back as sent.
async fn check_corpus(app: &TestApp, seed: u64, now: DateTime<Utc>, results: Vec<Answered>) {
    let mut accepted: HashMap<String, Value> = HashMap::new();
    let mut counts: HashMap<String, usize> = HashMap::new();
    for (case, status, body, ct) in &results {
        *counts.entry(case.what.clone()).or_default() += 1;
        let context = || {
            format!(
                "seed {seed}, {}: {} {}\nsent: {}\ngot {status}: {body}",
                case.what,
                case.path,
                case.content_type.unwrap_or("(no content-type)"),
                String::from_utf8_lossy(&case.body)
                    .chars()
                    .take(300)
                    .collect::<String>()
            )
        };
        assert!(status < &500, "a 5xx: {}", context());
        match case.expect {
            Expect::Accepted => {
                assert_eq!(*status, 202, "{}", context());
                let acks: Vec<&Value> = match body.get("items") {
                    Some(items) => items.as_array().unwrap().iter().collect(),
                    None => vec![body],
                };
                assert_eq!(acks.len(), case.events.len(), "{}", context());
                for (ack, ev) in acks.iter().zip(&case.events) {
                    assert_eq!(ack["duplicate"], false, "{}", context());
                    accepted.insert(ack["id"].as_str().unwrap().to_owned(), ev.clone());
                }
            }
            Expect::Duplicate => {
                assert_eq!(*status, 202, "{}", context());
                assert_eq!(body["duplicate"], true, "{}", context());
            }
            Expect::Status(code, problem) => {
                assert_eq!(*status, code, "{}", context());
                assert_eq!(
                    ct.as_deref(),
                    Some("application/problem+json"),
                    "{}",
                    context()
                );
                let got = body["code"].as_str().unwrap_or_default();
                assert!(KNOWN_CODES.contains(&got), "unknown code: {}", context());
                assert_eq!(got, problem, "{}", context());
                if problem == "invalid_payload" {
                    let first = &body["errors"][0];
                    let field = first["field"].as_str().unwrap_or_default();
                    assert!(
                        field.is_empty() || field.starts_with('/'),
                        "field is a JSON pointer: {}",
                        context()
                    );
                }
            }
        }
    }
    assert!(accepted.len() > 500, "{counts:?}");

    // Every accepted event is readable, with what was sent.
    let from = (now - chrono::Duration::days(62)).to_rfc3339();
    let to = (now + chrono::Duration::days(2)).to_rfc3339();
    let stored = eventually(
        "every accepted event readable",
        Duration::from_secs(30),
        || {
            let (from, to, accepted) = (&from, &to, &accepted);
            async move {
                let events = app.events(&app.t.key, from, to, "").await;
                let ids: HashSet<&str> = events.iter().filter_map(|e| e["id"].as_str()).collect();
                accepted
                    .keys()
                    .all(|id| ids.contains(id.as_str()))
                    .then_some(events)
            }
        },
    )
    .await;
    let by_id: HashMap<&str, &Value> = stored
        .iter()
        .map(|e| (e["id"].as_str().unwrap(), e))
        .collect();
    for (id, sent) in &accepted {
        let got = by_id[id.as_str()];
        let props = if sent.get("traits").is_some() {
            "traits"
        } else {
            "properties"
        };
        assert_eq!(got[props], sent[props], "seed {seed}: {id} properties");
        for f in ["event", "user_id", "anonymous_id"] {
            if let Some(v) = sent.get(f) {
                assert_eq!(&got[f], v, "seed {seed}: {id} {f}");
            }
        }
        assert_eq!(
            got["occurred_at"].as_str().unwrap(),
            stored_time(sent["occurred_at"].as_str().unwrap()),
            "seed {seed}: {id} occurred_at (sent {})",
            sent["occurred_at"]
        );
    }
}

crate::on_both_backends!(hostile_corpus_is_answered_and_stored_as_sent);

/// The Prometheus value of a metric (0 when absent).
async fn metric(app: &TestApp, name: &str) -> f64 {
    let text = app.metrics().await;
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn app_with_faults(backend: Backend, faults: Arc<Faults>) -> Option<TestApp> {
    let db = Arc::new(TestDb::new(backend).await?);
    Some(
        spawn_with(
            db,
            StartOptions {
                faults,
                ..StartOptions::default()
            },
            tweak,
        )
        .await,
    )
}

/// A request the database refuses (a fault armed for its key) shares group
/// commits with another tenant's requests: only it gets a 4xx; the others
/// get their 202 and are readable. Nothing of the refused request is kept.
async fn refused_request_in_a_shared_group(backend: Backend) {
    let faults = Faults::new();
    let Some(app) = app_with_faults(backend, faults.clone()).await else {
        return;
    };
    let x = make_tenant(&app.store, "x-co", Plan::Enterprise, None).await;
    faults.fail_commit_of("poison");
    let now = Utc::now();
    let mut good = Vec::new();
    let poison_body = track("poison", "ux", now);
    let app_ref = &app;
    for round in 0..20 {
        let poison = app.post("/v1/core/track", &x.key, &poison_body);
        let others = join_all((0..40).map(|i| {
            let body = track(&format!("y-{round}-{i}"), "uy", now);
            async move { app_ref.post("/v1/core/track", &app_ref.t.key, &body).await }
        }));
        let (p, others) = tokio::join!(poison, others);
        assert_eq!(p.status, 422, "{}", p.body);
        assert_eq!(p.body["code"], "invalid_payload");
        for a in others {
            assert_eq!(a.status, 202, "another tenant's request failed: {}", a.body);
            good.push(a.body["id"].as_str().unwrap().to_owned());
        }
        if metric(&app, "fastack_group_commit_splits_total").await > 0.0 {
            break;
        }
    }
    assert!(
        metric(&app, "fastack_group_commit_splits_total").await > 0.0,
        "the poison request never shared a group"
    );
    let from = (now - chrono::Duration::hours(1)).to_rfc3339();
    let to = (now + chrono::Duration::hours(1)).to_rfc3339();
    eventually(
        "the other tenant's events readable",
        Duration::from_secs(30),
        || async {
            let ids: HashSet<String> = app
                .events(&app.t.key, &from, &to, "")
                .await
                .iter()
                .map(|e| e["id"].as_str().unwrap().to_owned())
                .collect();
            good.iter().all(|id| ids.contains(id)).then_some(())
        },
    )
    .await;
    // Nothing of the refused request was kept: once the fault is gone the
    // same request is new, not a duplicate.
    faults.clear();
    let again = app
        .post("/v1/core/track", &x.key, &track("poison", "ux", now))
        .await;
    assert_eq!(again.status, 202, "{}", again.body);
    assert_eq!(again.body["duplicate"], false);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_refused_request_in_a_shared_group() {
    refused_request_in_a_shared_group(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refused_request_in_a_shared_group() {
    refused_request_in_a_shared_group(Backend::Postgres).await;
}

/// The case found in the field, without a fault: PostgreSQL refuses a NUL
/// in an idempotency key (`text`). Rows that bypass the edge rule (the
/// queue is fed directly) are refused alone; the rows sharing their group
/// commit are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_a_nul_key_alone() {
    use fastack_actors::IngestError;
    use fastack_core::{store::IngestRow, validate::fingerprint};
    use fastack_entities::{EventKind, NewEvent};
    let Some(app) = app_with_faults(Backend::Postgres, Faults::new()).await else {
        return;
    };
    let runtime = &app.server.as_ref().unwrap().state().runtime;
    let now = Utc::now();
    let row = |key: &str| {
        let ev = NewEvent {
            kind: EventKind::Track,
            event: Some("E".into()),
            user_id: Some("u".into()),
            anonymous_id: None,
            properties: Default::default(),
            occurred_at: now.fixed_offset(),
            idempotency_key: key.to_owned(),
            plan: None,
        };
        let fp = fingerprint(&ev);
        IngestRow::new(app.t.tenant.id, ev, fp, now)
    };
    let mut refused = 0;
    for round in 0..20 {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut submits = vec![runtime.submit(vec![row(&format!("nul-{round}\u{0}"))], deadline)];
        submits.extend(
            (0..30).map(|i| runtime.submit(vec![row(&format!("ok-{round}-{i}"))], deadline)),
        );
        let results = join_all(submits).await;
        match &results[0] {
            Err(IngestError::Refused { reason }) => {
                assert!(reason.contains("22021"), "{reason}");
                refused += 1;
            }
            other => panic!("a NUL key was not refused: {other:?}"),
        }
        for r in &results[1..] {
            assert!(r.is_ok(), "a good row failed with the bad one: {r:?}");
        }
        if metric(&app, "fastack_group_commit_splits_total").await > 0.0 {
            break;
        }
    }
    assert!(refused > 0);
    assert!(metric(&app, "fastack_group_commit_splits_total").await > 0.0);
    app.cleanup().await;
}

/// An event processing refuses (a fault armed for it) moves to quarantine
/// after five attempts; the tenant's next 100 events are readable; the
/// admin surface lists and shows it, and after the fault is gone `retry`
/// makes it readable under its original id.
async fn poison_event_is_quarantined_and_retried(backend: Backend) {
    let faults = Faults::new();
    let Some(app) = app_with_faults(backend, faults.clone()).await else {
        return;
    };
    faults.fail_processing_of("poison-1");
    let now = Utc::now();
    let poison = app
        .post("/v1/core/track", &app.t.key, &track("poison-1", "u-p", now))
        .await;
    assert_eq!(poison.status, 202, "{}", poison.body);
    let poison_id = poison.body["id"].as_str().unwrap().to_owned();
    let mut later = Vec::new();
    for i in 0..100 {
        let a = app
            .post(
                "/v1/core/track",
                &app.t.key,
                &track(&format!("after-{i}"), "u-a", now),
            )
            .await;
        assert_eq!(a.status, 202);
        later.push(a.body["id"].as_str().unwrap().to_owned());
    }
    let from = (now - chrono::Duration::hours(1)).to_rfc3339();
    let to = (now + chrono::Duration::hours(1)).to_rfc3339();
    let ids = || async {
        app.events(&app.t.key, &from, &to, "")
            .await
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_owned())
            .collect::<HashSet<String>>()
    };
    eventually(
        "the 100 later events readable",
        Duration::from_secs(30),
        || async {
            let ids = ids().await;
            later.iter().all(|id| ids.contains(id)).then_some(())
        },
    )
    .await;
    let listed = eventually(
        "the poison event in quarantine",
        Duration::from_secs(30),
        || async {
            let a = admin_get(&app, "/admin/v1/tenants/acme/quarantine").await;
            assert_eq!(a.status, 200, "{}", a.body);
            let list = a.body.as_array().unwrap().clone();
            (!list.is_empty()).then_some(list)
        },
    )
    .await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["event_id"], poison_id.as_str());
    assert_eq!(listed[0]["attempts"], 5);
    assert!(
        listed[0]["error"]
            .as_str()
            .unwrap()
            .contains("injected fault"),
        "{}",
        listed[0]
    );
    assert_eq!(listed[0]["payload"]["idempotency_key"], "poison-1");
    assert!(!ids().await.contains(&poison_id));
    assert_eq!(metric(&app, "fastack_quarantined_events_total").await, 1.0);
    let shown = admin_get(
        &app,
        &format!("/admin/v1/tenants/acme/quarantine/{poison_id}"),
    )
    .await;
    assert_eq!(shown.status, 200, "{}", shown.body);
    assert_eq!(shown.body["event_id"], poison_id.as_str());

    // A duplicate of the quarantined event still answers its id.
    let dup = app
        .post("/v1/core/track", &app.t.key, &track("poison-1", "u-p", now))
        .await;
    assert_eq!(dup.status, 202);
    assert_eq!(dup.body["id"], poison_id.as_str());
    assert_eq!(dup.body["duplicate"], true);

    faults.clear();
    let retried = admin_post(
        &app,
        &format!("/admin/v1/tenants/acme/quarantine/{poison_id}/retry"),
        json!({}),
    )
    .await;
    assert_eq!(retried.status, 200, "{}", retried.body);
    eventually(
        "the retried event readable",
        Duration::from_secs(30),
        || async { ids().await.contains(&poison_id).then_some(()) },
    )
    .await;
    let a = admin_get(&app, "/admin/v1/tenants/acme/quarantine").await;
    assert_eq!(a.body, json!([]));
    let gone = admin_post(
        &app,
        &format!("/admin/v1/tenants/acme/quarantine/{poison_id}/drop"),
        json!({}),
    )
    .await;
    assert_eq!(gone.status, 404, "{}", gone.body);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_poison_event_is_quarantined_and_retried() {
    poison_event_is_quarantined_and_retried(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_poison_event_is_quarantined_and_retried() {
    poison_event_is_quarantined_and_retried(Backend::Postgres).await;
}

/// What stranded tenants in the field, without a fault: an inbox row whose
/// properties hold a NUL (accepted by an earlier release) is refused by
/// PostgreSQL's `jsonb` at every attempt. It is quarantined with the
/// SQLSTATE in its error, the tenant's later events are stored, and the CLI
/// lists, shows and drops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stranded_row_goes_to_quarantine() {
    let Some(app) = app_with_faults(Backend::Postgres, Faults::new()).await else {
        return;
    };
    let pool = app.db.pg_pool().await;
    let now = Utc::now();
    let event_id = uuid::Uuid::now_v7();
    let payload = json!({
        "kind": "track", "event": "Old", "user_id": "u-old", "anonymous_id": null,
        "properties": {"note": "a\u{0}b"}, "occurred_at": now.to_rfc3339(),
        "idempotency_key": "from-an-old-release"
    });
    sqlx::query(
        "INSERT INTO inbox (tenant_id, event_id, payload, received_at) VALUES ($1, $2, $3, $4)",
    )
    .bind(app.t.tenant.id.0)
    .bind(event_id)
    .bind(payload.to_string())
    .bind(now)
    .execute(&pool)
    .await
    .unwrap();
    let later = app
        .post("/v1/core/track", &app.t.key, &track("later-1", "u", now))
        .await;
    assert_eq!(later.status, 202);
    let later_id = later.body["id"].as_str().unwrap().to_owned();
    let from = (now - chrono::Duration::hours(1)).to_rfc3339();
    let to = (now + chrono::Duration::hours(1)).to_rfc3339();
    eventually(
        "the later event readable",
        Duration::from_secs(30),
        || async {
            app.events(&app.t.key, &from, &to, "")
                .await
                .iter()
                .any(|e| e["id"] == later_id.as_str())
                .then_some(())
        },
    )
    .await;
    let env = app.db.env();
    let cli = |args: &[&str]| -> Value {
        let out = std::process::Command::new(crate::helpers::bin_path())
            .args(["admin", "--json", "quarantine"])
            .args(args)
            .env_clear()
            .envs(env.clone())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let tenant = app.t.tenant.id.to_string();
    let listed = cli(&["list", "--tenant", &tenant]);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    let error = listed[0]["error"].as_str().unwrap();
    assert!(error.contains("22P05"), "the SQLSTATE is named: {error}");
    let shown = cli(&[
        "show",
        "--tenant",
        &tenant,
        "--event",
        &event_id.to_string(),
    ]);
    assert_eq!(shown["payload"]["properties"]["note"], "a\u{0}b");
    let dropped = cli(&[
        "drop",
        "--tenant",
        &tenant,
        "--event",
        &event_id.to_string(),
    ]);
    assert_eq!(dropped["dropped"], true);
    assert_eq!(cli(&["list", "--tenant", &tenant]), json!([]));
    app.cleanup().await;
}

/// Every month boundary of three years, read as a leap second, as the last
/// nanosecond before midnight and as the first microsecond after it, from
/// UTC and from ±14:00: all accepted, each stored in the month of its
/// instant, and read back in its normalised form.
async fn month_boundaries_land_in_their_month(backend: Backend) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let clock = ManualClock::new("2028-12-15T12:00:00Z".parse().unwrap());
    let app = spawn_with(
        Arc::new(db),
        StartOptions {
            clock: clock.clone(),
            ..StartOptions::default()
        },
        |_| {},
    )
    .await;
    // (key, occurred_at as sent, the instant and text expected back)
    let mut sent: Vec<(String, String, DateTime<Utc>, String)> = Vec::new();
    for month_start in (0..35).map(|i| {
        Utc.with_ymd_and_hms(2026 + (i / 12), (i % 12) as u32 + 1, 1, 0, 0, 0)
            .unwrap()
            .checked_add_months(chrono::Months::new(1))
            .unwrap()
    }) {
        let last = month_start - chrono::Duration::seconds(1);
        for offset in [-14 * 3600, 0, 14 * 3600] {
            let tz = FixedOffset::east_opt(offset).unwrap();
            let z = |t: DateTime<FixedOffset>| {
                if offset == 0 {
                    "Z".to_owned()
                } else {
                    t.format("%:z").to_string()
                }
            };
            let l = last.with_timezone(&tz);
            let f = month_start.with_timezone(&tz);
            // A leap second and the last nanosecond both read as the last
            // microsecond of the month; the first microsecond after is the
            // next month's.
            let end = last + chrono::Duration::microseconds(999_999);
            let start = month_start + chrono::Duration::microseconds(1);
            for (at, instant) in [
                (format!("{}:60{}", l.format("%Y-%m-%dT%H:%M"), z(l)), end),
                (
                    format!("{}.999999999{}", l.format("%Y-%m-%dT%H:%M:%S"), z(l)),
                    end,
                ),
                (
                    format!("{}.000001{}", f.format("%Y-%m-%dT%H:%M:%S"), z(f)),
                    start,
                ),
            ] {
                let text = instant
                    .with_timezone(&tz)
                    .to_rfc3339_opts(SecondsFormat::AutoSi, true);
                sent.push((format!("b-{}", sent.len()), at, instant, text));
            }
        }
    }
    let mut ids: HashMap<String, String> = HashMap::new();
    for chunk in sent.chunks(100) {
        let items: Vec<Value> = chunk
            .iter()
            .map(|(key, at, _, _)| {
                json!({"type": "track", "event": "Boundary", "user_id": "u", "occurred_at": at, "idempotency_key": key})
            })
            .collect();
        let a = app
            .post("/v1/core/batch", &app.t.key, &json!({ "batch": items }))
            .await;
        assert_eq!(a.status, 202, "{}", a.body);
        for ((key, ..), ack) in chunk.iter().zip(a.body["items"].as_array().unwrap()) {
            ids.insert(key.clone(), ack["id"].as_str().unwrap().to_owned());
        }
    }
    // Expected: per UTC month, the ids whose normalised instant falls in it.
    let mut by_month: HashMap<(i32, u32), HashSet<String>> = HashMap::new();
    let mut expected_time: HashMap<String, String> = HashMap::new();
    for (key, _, instant, text) in &sent {
        by_month
            .entry((instant.year(), instant.month()))
            .or_default()
            .insert(ids[key].clone());
        expected_time.insert(ids[key].clone(), text.clone());
    }
    assert_eq!(by_month.len(), 36);
    eventually(
        "every boundary event stored",
        Duration::from_secs(60),
        || async {
            let all = app
                .events(
                    &app.t.key,
                    "2026-01-01T00:00:00Z",
                    "2029-02-01T00:00:00Z",
                    "",
                )
                .await;
            (all.len() == sent.len()).then_some(())
        },
    )
    .await;
    for ((year, month), want) in &by_month {
        let from = Utc.with_ymd_and_hms(*year, *month, 1, 0, 0, 0).unwrap();
        let to = from.checked_add_months(chrono::Months::new(1)).unwrap();
        let got = app
            .events(&app.t.key, &from.to_rfc3339(), &to.to_rfc3339(), "")
            .await;
        let got_ids: HashSet<String> = got
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(&got_ids, want, "{year}-{month:02}");
        for e in &got {
            let id = e["id"].as_str().unwrap();
            assert_eq!(
                e["occurred_at"].as_str().unwrap(),
                expected_time[id],
                "{id}"
            );
        }
    }
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_month_boundaries_land_in_their_month() {
    month_boundaries_land_in_their_month(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_month_boundaries_land_in_their_month() {
    month_boundaries_land_in_their_month(Backend::Postgres).await;
}

/// Bodies must be JSON: other media types get 415; a repeated member name
/// gets 400 naming it; numbers come back with their value or are refused.
async fn json_only_and_strict(app: TestApp) {
    let now = Utc::now();
    let body = serde_json::to_vec(&track("ct-1", "u", now)).unwrap();
    for ct in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/jsonx",
    ] {
        let resp = app
            .http
            .post(app.url("/v1/core/track"))
            .bearer_auth(&app.t.key)
            .header("content-type", ct)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let a = answer(resp).await;
        assert_eq!(a.status, 415, "{ct}: {}", a.body);
        assert_eq!(a.body["code"], "unsupported_media_type");
    }
    let dup = br#"{"event":"a","event":"b","user_id":"u","occurred_at":"2026-11-30T10:00:00Z","idempotency_key":"d"}"#;
    let a = app
        .post_raw("/v1/core/track", &app.t.key, dup.to_vec())
        .await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(a.body["code"], "invalid_json");
    assert!(
        a.body["detail"].as_str().unwrap().contains("`event`"),
        "{}",
        a.body
    );

    let exact =
        json!({"max": u64::MAX, "min": i64::MIN, "tenth": 0.1, "big": 1e300, "tiny": 5e-324});
    let mut ev = track("numbers-1", "u", now);
    ev["properties"] = exact.clone();
    let a = app.post("/v1/core/track", &app.t.key, &ev).await;
    assert_eq!(a.status, 202, "{}", a.body);
    let id = a.body["id"].as_str().unwrap().to_owned();
    let text = format!(
        r#"{{"event":"n","user_id":"u","occurred_at":"{}","idempotency_key":"numbers-2","properties":{{"id":123456789012345678901234567890}}}}"#,
        now.to_rfc3339()
    );
    let a = app
        .post_raw("/v1/core/track", &app.t.key, text.into_bytes())
        .await;
    assert_eq!(a.status, 422, "{}", a.body);
    assert_eq!(a.body["errors"][0]["field"], "/properties/id");
    assert_eq!(a.body["errors"][0]["code"], "invalid_number");
    let from = urlenc(&(now - chrono::Duration::hours(1)).to_rfc3339());
    let to = urlenc(&(now + chrono::Duration::hours(1)).to_rfc3339());
    let got = eventually("the numbers event", Duration::from_secs(20), || async {
        let a = app
            .get(&format!("/v1/core/events?from={from}&to={to}"), &app.t.key)
            .await;
        a.body["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == id.as_str())
            .cloned()
    })
    .await;
    assert_eq!(got["properties"], exact);
    app.cleanup().await;
}

crate::on_both_backends!(json_only_and_strict);

/// Requests with unknown keys draw on their address's budget: past it they
/// get 429 with `Retry-After` and no key lookup, while a valid key keeps
/// working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_keys_are_limited_per_address() {
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let app = crate::helpers::spawn_on(Arc::new(db), |c| c.unauth_rps = 5).await;
    let now = Utc::now();
    // A key in use (cached on this node) is not affected by a flood of bad
    // keys from its address.
    let warm = app
        .post("/v1/core/track", &app.t.key, &track("valid-0", "u", now))
        .await;
    assert_eq!(warm.status, 202);
    let mut statuses = Vec::new();
    for i in 0..20 {
        let key = format!("fsk_random{i:036}");
        let a = app
            .post("/v1/core/track", &key, &track("k", "u", now))
            .await;
        if a.status == 429 {
            assert!(a.headers.get("retry-after").is_some());
            assert_eq!(a.body["code"], "rate_limited");
        }
        statuses.push(a.status);
    }
    assert!(statuses.iter().take(5).all(|s| *s == 401), "{statuses:?}");
    assert!(
        statuses.iter().skip(5).filter(|s| **s == 429).count() >= 14,
        "{statuses:?}"
    );
    let ok = app
        .post("/v1/core/track", &app.t.key, &track("valid-1", "u", now))
        .await;
    assert_eq!(ok.status, 202, "a valid key is not limited: {}", ok.body);
    assert!(
        metric(
            &app,
            "fastack_requests_refused_total{outcome=\"unauthenticated_limit\""
        )
        .await
            >= 14.0
    );
    app.cleanup().await;
}

/// The embedded data directory and its files are the owner's alone.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let data = db.dir.path().join("data");
    let db = Arc::new(db);
    let app = crate::helpers::spawn_on(db, |c| {
        c.data_dir = data.clone();
        c.enc_key = None;
        c.bootstrap = true;
    })
    .await;
    let now = Utc::now();
    let a = app
        .post("/v1/core/track", &app.t.key, &track("priv-1", "u", now))
        .await;
    assert_eq!(a.status, 202);
    let export = app
        .post(
            "/v1/core/exports",
            &app.t.key,
            &json!({"from": (now - chrono::Duration::hours(1)).to_rfc3339(), "to": (now + chrono::Duration::hours(1)).to_rfc3339()}),
        )
        .await;
    assert_eq!(export.status, 202, "{}", export.body);
    let job = export.body["job_id"].as_str().unwrap().to_owned();
    eventually("the export done", Duration::from_secs(30), || async {
        let a = app.get(&format!("/v1/core/jobs/{job}"), &app.t.key).await;
        (a.body["status"] == "completed").then_some(())
    })
    .await;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700);
    for f in [
        "fastack.db",
        "fastack.db-wal",
        "fastack.db-shm",
        "fastack-inbox.db",
        "fastack-inbox.db-wal",
        "fastack-inbox.db-shm",
        "master-key",
        "bootstrap-key",
    ] {
        assert_eq!(mode(&data.join(f)), 0o600, "{f}");
    }
    let object = data.join(format!("objects/exports/{}/{job}.ndjson", app.t.tenant.id));
    assert_eq!(mode(&object), 0o600, "{}", object.display());
    app.cleanup().await;
}

mod slow_clients {
    //! Real sockets against the listener's limits (set to a second here).
    use std::time::Instant;

    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpStream,
    };

    use super::*;

    async fn app(tweak: impl FnOnce(&mut fastack_core::Config)) -> Option<TestApp> {
        let db = TestDb::new(Backend::Sqlite).await?;
        Some(
            crate::helpers::spawn_on(Arc::new(db), |c| {
                c.header_timeout = Duration::from_millis(1_000);
                c.body_timeout = Duration::from_millis(1_000);
                c.idle_timeout = Duration::from_millis(1_500);
                tweak(c);
            })
            .await,
        )
    }

    fn addr(app: &TestApp) -> std::net::SocketAddr {
        app.server.as_ref().unwrap().addr()
    }

    /// Reads until the server closes the connection; what it sent.
    async fn read_to_close(s: &mut TcpStream, within: Duration) -> Option<String> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            match tokio::time::timeout(left, s.read(&mut buf)).await {
                Err(_) => return None,
                Ok(Ok(0)) | Ok(Err(_)) => return Some(String::from_utf8_lossy(&out).into_owned()),
                Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            }
        }
    }

    /// Headers trickling in one byte at a time are cut off at the header
    /// timeout, however steady the trickle.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slow_headers_are_cut_off() {
        let Some(app) = app(|_| {}).await else { return };
        let mut s = TcpStream::connect(addr(&app)).await.unwrap();
        let started = Instant::now();
        let head = b"POST /v1/core/track HTTP/1.1\r\nhost: x\r\nx-slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        let mut closed = false;
        let mut buf = [0u8; 256];
        for b in head {
            if s.write_all(&[*b]).await.is_err() {
                closed = true;
                break;
            }
            // Wait for the next byte's turn, noticing a close meanwhile.
            match tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => {
                    closed = true;
                    break;
                }
                _ => {}
            }
            if started.elapsed() > Duration::from_secs(5) {
                break;
            }
        }
        if !closed {
            closed = read_to_close(&mut s, Duration::from_secs(3))
                .await
                .is_some();
        }
        assert!(closed, "the connection stayed open");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(4),
            "closed after {took:?}"
        );
        assert!(
            metric(
                &app,
                "fastack_requests_refused_total{outcome=\"header_timeout\""
            )
            .await
                >= 1.0
        );
        app.cleanup().await;
    }

    /// A body that does not arrive within the body timeout is answered 408
    /// and the connection is closed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slow_bodies_get_408() {
        let Some(app) = app(|_| {}).await else { return };
        let mut s = TcpStream::connect(addr(&app)).await.unwrap();
        let head = format!(
            "POST /v1/core/track HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: 200\r\n\r\n{{\"event\":",
            app.t.key
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let started = Instant::now();
        let got = read_to_close(&mut s, Duration::from_secs(5))
            .await
            .expect("closed");
        assert!(got.starts_with("HTTP/1.1 408"), "{got}");
        assert!(got.contains("request_timeout"), "{got}");
        assert!(started.elapsed() < Duration::from_secs(3));
        app.cleanup().await;
    }

    /// A connection with no request, and a keep-alive connection after its
    /// answer, are closed after the idle timeout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_connections_are_closed() {
        let Some(app) = app(|_| {}).await else { return };
        let mut silent = TcpStream::connect(addr(&app)).await.unwrap();
        let started = Instant::now();
        assert!(
            read_to_close(&mut silent, Duration::from_secs(5))
                .await
                .is_some()
        );
        assert!(
            started.elapsed() >= Duration::from_millis(1_400),
            "{:?}",
            started.elapsed()
        );

        let mut kept = TcpStream::connect(addr(&app)).await.unwrap();
        kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 1024];
        let n = kept.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        // Still open well inside the timeout: keep-alive works.
        tokio::time::sleep(Duration::from_millis(500)).await;
        kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let n = kept.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        let idle_from = Instant::now();
        assert!(
            read_to_close(&mut kept, Duration::from_secs(5))
                .await
                .is_some()
        );
        assert!(idle_from.elapsed() >= Duration::from_millis(1_400));
        app.cleanup().await;
    }

    /// With the cap reached, a further client waits until a connection
    /// ends, then is served.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_are_capped() {
        let Some(app) = app(|c| {
            c.max_connections = 2;
            c.idle_timeout = Duration::from_secs(30);
        })
        .await
        else {
            return;
        };
        let a = TcpStream::connect(addr(&app)).await.unwrap();
        let b = TcpStream::connect(addr(&app)).await.unwrap();
        // Let the listener accept both.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut c = TcpStream::connect(addr(&app)).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 1024];
        let waited = tokio::time::timeout(Duration::from_millis(700), c.read(&mut buf)).await;
        assert!(
            waited.is_err(),
            "a third connection was served beyond the cap"
        );
        drop(a);
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
            .await
            .expect("served once a slot is free")
            .unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        // Free the slots: the metrics request needs one.
        drop((b, c));
        assert!(
            metric(
                &app,
                "fastack_requests_refused_total{outcome=\"connection_cap\""
            )
            .await
                >= 1.0
        );
        app.cleanup().await;
    }

    /// 401 and 429 answers read the body first, so a keep-alive client
    /// keeps its connection.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn refusals_keep_the_connection() {
        let Some(app) = app(|c| c.idle_timeout = Duration::from_secs(30)).await else {
            return;
        };
        let mut s = TcpStream::connect(addr(&app)).await.unwrap();
        let body = serde_json::to_vec(&track("k", "u", Utc::now())).unwrap();
        let mut buf = vec![0u8; 8192];
        for _ in 0..3 {
            // Headers first, then the body a moment later: the answer must
            // not come (and the connection must not close) before it.
            let head = format!(
                "POST /v1/core/track HTTP/1.1\r\nhost: x\r\nauthorization: Bearer fsk_nope\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            s.write_all(&body).await.unwrap();
            let n = s.read(&mut buf).await.unwrap();
            let got = String::from_utf8_lossy(&buf[..n]);
            assert!(got.starts_with("HTTP/1.1 401"), "{got}");
            assert!(
                !got.to_ascii_lowercase().contains("connection: close"),
                "{got}"
            );
        }
        app.cleanup().await;
    }
}

/// The admin token of the webhook test harness is long enough to pass the
/// node's minimum (a shorter one stops the node at start).
#[test]
fn admin_tokens_have_a_minimum_length() {
    assert!(ADMIN_TOKEN.len() >= fastack_core::config::MIN_ADMIN_TOKEN_CHARS);
}
