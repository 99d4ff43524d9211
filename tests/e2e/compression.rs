//! Compressed request bodies: `gzip` and `zstd` batches are stored exactly
//! as the same batch sent as is; a body that would inflate past the limit
//! is refused without the server's memory growing with it; a corrupt
//! stream and an unknown encoding get their typed answers and store
//! nothing.

use std::{collections::HashMap, io::Write, time::Duration};

use chrono::Utc;
use fastack_entities::Plan;
use serde_json::{Value, json};

use crate::helpers::{
    Answer, Backend, Node, TestApp, TestDb, answer, eventually, make_tenant, track,
};

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

pub fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 3).unwrap()
}

async fn send(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    encoding: Option<&str>,
    body: Vec<u8>,
) -> Answer {
    let mut req = http
        .post(url)
        .bearer_auth(key)
        .header("content-type", "application/json");
    if let Some(e) = encoding {
        req = req.header("content-encoding", e);
    }
    answer(req.body(body).send().await.expect("request sent")).await
}

/// A batch whose events carry what compression could mangle: multi-byte
/// text, escapes, numbers at their limits, nesting.
fn batch_of(prefix: &str, n: usize) -> Value {
    let now = Utc::now() - chrono::Duration::minutes(5);
    let items: Vec<Value> = (0..n)
        .map(|i| {
            let mut t = track(&format!("{prefix}-{i}"), &format!("u-{}", i % 7), now);
            t["type"] = json!("track");
            t["properties"] = json!({
                "i": i,
                "text": format!("café ☕ 𝄞 \"quoted\" \\ line\nbreak {i}"),
                "max": u64::MAX,
                "min": i64::MIN,
                "tenth": 0.1,
                "nested": {"a": [1, {"b": null}, true]},
            });
            t
        })
        .collect();
    json!({ "batch": items })
}

fn item_ids(a: &Answer) -> Vec<(String, bool)> {
    a.body["items"]
        .as_array()
        .unwrap_or_else(|| panic!("{}", a.body))
        .iter()
        .map(|i| {
            (
                i["id"].as_str().unwrap().to_owned(),
                i["duplicate"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// A gzip batch and a zstd batch are accepted, and what is stored is what
/// was sent: the same batch sent again as is answers duplicate for every
/// item, with the same ids, and reading the events back gives the
/// properties as sent. `track` and `identify` take compressed bodies too.
async fn compressed_batches_are_stored_as_sent(app: TestApp) {
    let url = app.url("/v1/core/batch");
    let key = app.t.key.clone();
    let plain = batch_of("gz", 100);
    let bytes = serde_json::to_vec(&plain).unwrap();
    let a = send(&app.http, &url, &key, Some("gzip"), gzip(&bytes)).await;
    assert_eq!(a.status, 202, "{}", a.body);
    let first = item_ids(&a);
    assert!(first.iter().all(|(_, dup)| !dup));
    let again = send(&app.http, &url, &key, None, bytes.clone()).await;
    assert_eq!(again.status, 202, "{}", again.body);
    let second = item_ids(&again);
    assert!(second.iter().all(|(_, dup)| *dup), "{}", again.body);
    assert_eq!(
        first.iter().map(|(id, _)| id).collect::<Vec<_>>(),
        second.iter().map(|(id, _)| id).collect::<Vec<_>>()
    );

    let zplain = batch_of("zs", 50);
    let z = send(
        &app.http,
        &url,
        &key,
        Some("zstd"),
        zstd(&serde_json::to_vec(&zplain).unwrap()),
    )
    .await;
    assert_eq!(z.status, 202, "{}", z.body);
    let now = Utc::now() - chrono::Duration::minutes(1);
    let one = track("gz-track", "u-single", now);
    let t = send(
        &app.http,
        &app.url("/v1/core/track"),
        &key,
        Some("GZip"),
        gzip(&serde_json::to_vec(&one).unwrap()),
    )
    .await;
    assert_eq!(t.status, 202, "{}", t.body);
    let who = json!({
        "user_id": "u-single",
        "traits": {"email": "ü@example.com"},
        "occurred_at": now.to_rfc3339(),
        "idempotency_key": "zs-identify",
    });
    let i = send(
        &app.http,
        &app.url("/v1/core/identify"),
        &key,
        Some("zstd"),
        zstd(&serde_json::to_vec(&who).unwrap()),
    )
    .await;
    assert_eq!(i.status, 202, "{}", i.body);

    // Every accepted event by the id it was answered with.
    let mut sent: HashMap<String, Value> = HashMap::new();
    for (answered, events) in [(&first, &plain), (&item_ids(&z), &zplain)] {
        for ((id, _), e) in answered.iter().zip(events["batch"].as_array().unwrap()) {
            sent.insert(id.clone(), e.clone());
        }
    }
    sent.insert(t.body["id"].as_str().unwrap().to_owned(), one);
    let (from, to) = ("2020-01-01T00:00:00Z", "2100-01-01T00:00:00Z");
    let stored = eventually(
        "151 tracked events readable",
        Duration::from_secs(30),
        || async {
            let e: Vec<Value> = app
                .events(&key, from, to, "")
                .await
                .into_iter()
                .filter(|e| sent.contains_key(e["id"].as_str().unwrap()))
                .collect();
            (e.len() >= sent.len()).then_some(e)
        },
    )
    .await;
    assert_eq!(stored.len(), sent.len(), "nothing stored twice");
    for e in &stored {
        let want = &sent[e["id"].as_str().unwrap()];
        assert_eq!(e["event"], want["event"]);
        assert_eq!(e["user_id"], want["user_id"]);
        assert_eq!(e["properties"], want["properties"], "{e}");
    }
    app.cleanup().await;
}

/// A corrupt or truncated stream is `400 invalid_encoding`, an encoding
/// that is not accepted is `415` naming those that are; none of them
/// stores anything.
async fn corrupt_and_unknown_encodings_are_refused(app: TestApp) {
    let url = app.url("/v1/core/batch");
    let key = app.t.key.clone();
    let bytes = serde_json::to_vec(&batch_of("bad", 20)).unwrap();
    let whole = gzip(&bytes);
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("gzip", bytes.clone(), 400, "invalid_encoding"),
        (
            "gzip",
            whole[..whole.len() - 8].to_vec(),
            400,
            "invalid_encoding",
        ),
        ("zstd", gzip(&bytes), 400, "invalid_encoding"),
        ("zstd", zstd(&bytes)[..40].to_vec(), 400, "invalid_encoding"),
        ("br", bytes.clone(), 415, "unsupported_media_type"),
        ("deflate", bytes.clone(), 415, "unsupported_media_type"),
        ("gzip, zstd", bytes.clone(), 415, "unsupported_media_type"),
    ];
    for (encoding, body, status, code) in cases {
        let a = send(&app.http, &url, &key, Some(encoding), body).await;
        assert_eq!(a.status, status, "{encoding}: {}", a.body);
        assert_eq!(a.body["code"], code, "{encoding}: {}", a.body);
        assert_eq!(
            a.headers["content-type"], "application/problem+json",
            "{encoding}"
        );
        if status == 415 {
            let detail = a.body["detail"].as_str().unwrap();
            assert!(
                detail.contains("gzip") && detail.contains("zstd"),
                "{detail}"
            );
        }
    }
    // Something accepted afterwards is the only thing stored.
    let ok = track(
        "after",
        "u-after",
        Utc::now() - chrono::Duration::minutes(1),
    );
    let a = send(
        &app.http,
        &app.url("/v1/core/track"),
        &key,
        Some("gzip"),
        gzip(&serde_json::to_vec(&ok).unwrap()),
    )
    .await;
    assert_eq!(a.status, 202, "{}", a.body);
    let stored = eventually("the accepted event", Duration::from_secs(30), || async {
        let e = app
            .events(&key, "2020-01-01T00:00:00Z", "2100-01-01T00:00:00Z", "")
            .await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0]["id"], a.body["id"]);
    app.cleanup().await;
}

crate::on_both_backends!(
    compressed_batches_are_stored_as_sent,
    corrupt_and_unknown_encodings_are_refused
);

/// `VmHWM` (peak resident set) of a process, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmHWM in /proc/<pid>/status");
    kb * 1024
}

/// Bodies of about a megabyte that inflate to 1 GiB (gzip members and zstd
/// frames repeated: a decoder reads them as one stream) are refused `413`,
/// and the server's peak memory grows by a bounded amount, far from the
/// gigabyte: sixteen of them (16 GiB inflated) grow the peak by about 35 MiB,
/// a few request limits held at once by the allocator's per-thread arenas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bomb_is_refused_with_memory_bounded() {
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let store = db.store().await;
    let t = make_tenant(&store, "bomb", Plan::Free, None).await;
    let node = Node::start(&db, &[]).await;
    let pid = node.child.id().unwrap();
    let http = reqwest::Client::new();
    let url = format!("http://{}/v1/core/batch", node.addr);
    // Warm the node up with an accepted compressed batch first.
    let warm = serde_json::to_vec(&batch_of("warm", 100)).unwrap();
    let a = send(&http, &url, &t.key, Some("gzip"), gzip(&warm)).await;
    assert_eq!(a.status, 202, "{}", a.body);
    let before = peak_rss(pid);

    let mib = vec![b' '; 1 << 20];
    let (gz_member, zstd_frame) = (gzip(&mib), zstd(&mib));
    let gz_bomb = gz_member.repeat(1024);
    let zstd_bomb = zstd_frame.repeat(1024);
    assert!(gz_bomb.len() < 2 << 20, "{}", gz_bomb.len());
    for (encoding, bomb) in [("gzip", gz_bomb), ("zstd", zstd_bomb)] {
        for _ in 0..8 {
            let a = send(&http, &url, &t.key, Some(encoding), bomb.clone()).await;
            assert_eq!(a.status, 413, "{encoding}: {}", a.body);
            assert_eq!(a.body["code"], "payload_too_large");
            assert!(
                a.body["detail"].as_str().unwrap().contains("inflated"),
                "{}",
                a.body
            );
        }
    }
    let grown = peak_rss(pid).saturating_sub(before);
    eprintln!(
        "peak rss before the bombs {} MiB, grown by {} KiB",
        before >> 20,
        grown >> 10
    );
    assert!(
        grown < 64 << 20,
        "peak RSS grew by {} MiB for bodies inflating to 1 GiB",
        grown >> 20
    );
    // The node still answers.
    let a = send(&http, &url, &t.key, Some("zstd"), zstd(&warm)).await;
    assert_eq!(a.status, 202, "{}", a.body);
    node.terminate().await;
    db.drop_db().await;
}
