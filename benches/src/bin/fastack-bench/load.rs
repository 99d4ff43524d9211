//! The load tool's run.
//!
//! It starts the real server (`fastack serve`, a child process, on embedded
//! SQLite in a temporary directory or on a fresh PostgreSQL database with a
//! Redis prefix of its own) and a bare poem endpoint that answers 202 with a
//! fixed body (`fastack-bench baseline`, also a child process: no auth, no
//! validation, no storage), then drives both with the same profile over
//! HTTP on loopback and reports every figure as fastack / baseline. With
//! `--capture` PostHog's capture (print sink: parsed, checked, nothing
//! stored) runs between the two, the peer that stores nothing.
//!
//! Open loop (`--rate`): requests are scheduled at a fixed rate and latency
//! is counted from the *scheduled* send time, so a stalled server cannot
//! hide its queueing (no coordinated omission). Closed loop (no `--rate`):
//! `--connections` workers send back to back; throughput is the figure.

use std::{
    collections::BTreeMap,
    io::Write as _,
    net::SocketAddr,
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use chrono::Utc;
use clap::{Args, ValueEnum};
use fastack_core::{Config, admin, store};
use fastack_entities::Plan;
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    /// Single `track` events, one tenant, unique keys.
    Track,
    /// `batch` requests of 100 events.
    Batch,
    /// 10 tenants; one hot tenant sends half of the traffic.
    Mixed,
    /// `track` where 20 % of requests repeat an earlier key (same content).
    Duplicates,
}

/// How request bodies are sent (`content-encoding`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BodyEncoding {
    Identity,
    /// gzip level 1, what the trackers send.
    Gzip,
    /// zstd level 3.
    Zstd,
}

impl BodyEncoding {
    /// The body as sent, and its `content-encoding` header.
    fn encode(self, json: Vec<u8>) -> (Vec<u8>, Option<&'static str>) {
        use std::io::Write;
        match self {
            BodyEncoding::Identity => (json, None),
            BodyEncoding::Gzip => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                e.write_all(&json).expect("gzip in memory");
                (e.finish().expect("gzip in memory"), Some("gzip"))
            }
            BodyEncoding::Zstd => (
                zstd::encode_all(&json[..], 3).expect("zstd in memory"),
                Some("zstd"),
            ),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Sqlite,
    Postgres,
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// The fastack binary to load (default: `fastack` beside this one).
    #[arg(long, value_name = "PATH")]
    pub server: Option<std::path::PathBuf>,
    /// What each request is (see benches/README.md).
    #[arg(long, value_enum, default_value = "track")]
    pub profile: Profile,
    /// Events per `batch` request (the `batch` profile), 1 to 500.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=500))]
    pub batch_size: u64,
    /// Send request bodies compressed (`content-encoding`); the client
    /// compresses each body before it is sent. The baseline does not
    /// inflate: compare compressed runs with `--no-baseline`.
    #[arg(long, value_enum, default_value = "identity")]
    pub encoding: BodyEncoding,
    /// Storage of the server under test: embedded SQLite, or PostgreSQL
    /// and Redis (`--postgres`, `--redis`).
    #[arg(long, value_enum, default_value = "sqlite")]
    pub backend: Backend,
    /// Requests per second (open loop); omit for closed loop.
    #[arg(long)]
    pub rate: Option<u64>,
    /// Seconds of measurement (after a short warm-up).
    #[arg(long, default_value_t = 20)]
    pub duration: u64,
    /// Concurrent requests in closed loop; connection pool size.
    #[arg(long, default_value_t = 64)]
    pub connections: usize,
    /// Seconds of warm-up load before measuring.
    #[arg(long, default_value_t = 3)]
    pub warmup: u64,
    /// PostgreSQL server for `--backend postgres` (a fresh database is
    /// created on it and dropped afterwards).
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    pub postgres: String,
    /// Redis for `--backend postgres` (the run uses a key prefix of its own).
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub redis: String,
    /// Measure time from send to readable via GET /v1/core/events on a
    /// sample of events.
    #[arg(long)]
    pub visibility: bool,
    /// Turn streaming on for the server under test (RabbitMQ at this URL,
    /// exchanges of the run's own) and, with `--visibility`, also measure
    /// send -> `core.event.tracked` consumed from a bound queue.
    #[arg(long, value_name = "AMQP_URL")]
    pub amqp: Option<String>,
    /// Register a webhook endpoint for `core.event.tracked` on every tenant
    /// of the run, at a receiver in this process that answers 204 at once,
    /// and measure send -> delivered for every event (and the delivered
    /// rate).
    #[arg(long)]
    pub webhook: bool,
    /// Tenants to spread the load over (the memory profile uses 1000).
    #[arg(long)]
    pub tenants: Option<usize>,
    /// Stop after this many accepted events instead of after `--duration`.
    #[arg(long)]
    pub events: Option<u64>,
    /// Skip the baseline run.
    #[arg(long)]
    pub no_baseline: bool,
    /// Write the JSON report here (it is also printed with `--json`).
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Extra `FASTACK_*=value` settings for the server under test.
    #[arg(long = "server-env", value_name = "KEY=VALUE")]
    pub server_env: Vec<String>,
    /// Install this tracking plan (a JSON document) for every tenant of the
    /// run before it starts (`benches/plan-50-events.json`: the profile's
    /// event among 50).
    #[arg(long, value_name = "FILE")]
    pub tracking_plan: Option<std::path::PathBuf>,
    /// While fastack is measured, erase the profile's users one after
    /// another (`POST /v1/core/erasures` for `user-0`, `user-1`, …, each
    /// waited for), and report how many completed and what they took:
    /// ingestion's throughput with erasures running.
    #[arg(long)]
    pub erasures: bool,
    /// With `--erasures`: wait this long between one erasure's end and the
    /// next request (0: back to back).
    #[arg(long, default_value_t = 0, value_name = "MS")]
    pub erasure_pause_ms: u64,
    /// Before the load, suppress this many identifiers nobody sends (one
    /// erasure with `suppress`): processing then screens every event of
    /// the tenant, as it does for a tenant with a suppression list.
    #[arg(long, value_name = "N")]
    pub suppressed: Option<usize>,
    /// Drive both targets with wrk instead of the built-in client: closed
    /// loop, one thread, `--connections` connections, this Lua script
    /// (`benches/wrk/events.lua`); `track` and `batch` profiles only.
    #[arg(long, value_name = "SCRIPT")]
    pub wrk: Option<std::path::PathBuf>,
    /// Also measure PostHog's capture (the binary
    /// `benches/scripts/build-capture.sh` builds), with its print sink and
    /// `--redis`, between the baseline and fastack, driven by the same wrk
    /// script in capture's body format; needs `--wrk`.
    #[arg(long, value_name = "PATH")]
    pub capture: Option<std::path::PathBuf>,
}

/// The numbers of one run.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub target: String,
    pub mode: String,
    pub requests: u64,
    pub events: u64,
    pub errors: BTreeMap<String, u64>,
    pub seconds: f64,
    pub requests_per_sec: f64,
    pub events_per_sec: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    /// Request body bytes on the wire per accepted event.
    pub wire_bytes_per_event: f64,
    /// CPU time (user + system) the server process used per accepted
    /// event while the load was measured: the front door and whatever
    /// processing ran meanwhile.
    pub server_cpu_us_per_event: Option<f64>,
    /// On PostgreSQL: CPU time the database's processes used per accepted
    /// event in the same window (the node's own is the line above).
    pub database_cpu_us_per_event: Option<f64>,
    /// fastack's own counts over the window, from its `/metrics`: ingest
    /// group commits (each one sync) and processing rounds (each one
    /// transaction) per thousand accepted events.
    pub server_work: Option<ServerWork>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct ServerWork {
    pub group_commits_per_1k_events: f64,
    pub rounds_per_1k_events: f64,
    pub events_per_round: f64,
}

/// Group commits, processing rounds and the events those rounds consumed,
/// so far, as fastack's `/metrics` counts them.
async fn work_counts(base: &str) -> Option<[f64; 3]> {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    Some([
        value("fastack_group_commit_rows_count")?,
        value("fastack_processing_round_events_count")?,
        value("fastack_processing_round_events_sum")?,
    ])
}

fn server_work(start: Option<[f64; 3]>, end: Option<[f64; 3]>, events: u64) -> Option<ServerWork> {
    let (start, end) = (start?, end?);
    let per_1k = |i: usize| (end[i] - start[i]) * 1000.0 / events.max(1) as f64;
    Some(ServerWork {
        group_commits_per_1k_events: per_1k(0),
        rounds_per_1k_events: per_1k(1),
        events_per_round: (end[2] - start[2]) / (end[1] - start[1]).max(1.0),
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct Visibility {
    pub samples: u64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub not_seen: u64,
}

/// What a receiver got: latencies from (scheduled) send to arrival, and
/// how fast arrivals came while the load ran.
#[derive(Debug, Clone, Serialize)]
pub struct Delivered {
    #[serde(flatten)]
    pub latency: Visibility,
    /// Arrivals while the load was measured, per second.
    pub per_sec: f64,
    /// Seconds from the end of the load until the last sample arrived.
    pub drain_seconds: f64,
}

impl Visibility {
    /// Send-to-seen latencies in µs, up to 10 minutes.
    fn hist() -> Histogram<u64> {
        Histogram::new_with_bounds(1, 600_000_000, 3).expect("histogram bounds")
    }

    /// Percentiles of latencies recorded in µs, out of `samples` sent.
    fn from_hist(samples: u64, hist: &Histogram<u64>) -> Visibility {
        let q = |p: f64| hist.value_at_quantile(p) as f64 / 1000.0;
        Visibility {
            samples,
            p50_ms: q(0.5),
            p95_ms: q(0.95),
            p99_ms: q(0.99),
            not_seen: samples.saturating_sub(hist.len()),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub profile: Profile,
    pub backend: Backend,
    pub encoding: BodyEncoding,
    /// Events per `batch` request (the `batch` profile).
    pub batch_size: u64,
    pub rate: Option<u64>,
    pub connections: usize,
    pub fastack: RunReport,
    pub baseline: Option<RunReport>,
    /// PostHog's capture with its print sink (with `--capture`).
    pub capture: Option<RunReport>,
    pub ratio_throughput: Option<f64>,
    pub visibility: Option<Visibility>,
    /// Send -> `core.event.tracked` consumed (with `--amqp --visibility`).
    pub stream_visibility: Option<Visibility>,
    /// Send -> webhook received, every event (with `--webhook`).
    pub webhook: Option<Delivered>,
    /// The erasures that ran during the measurement (with `--erasures`).
    pub erasures: Option<Erasures>,
    pub server_rss_mib_before: Option<f64>,
    pub server_rss_mib_after: Option<f64>,
    pub server_rss_mib_peak: Option<f64>,
    /// Inbox rows waiting when the load ended, and the seconds until the
    /// inbox was empty (`None`: not within two minutes).
    pub inbox_at_end: Option<i64>,
    pub inbox_drain_seconds: Option<f64>,
    pub machine: String,
}

/// Erasures run beside the load.
#[derive(Debug, Clone, Serialize)]
pub struct Erasures {
    pub completed: u64,
    pub failed: u64,
    /// Events they removed from storage, and dropped from the inbox.
    pub events_removed: u64,
    pub events_dropped: u64,
    /// The jobs' own `execution_time_ms`.
    pub execution_ms_p50: u64,
    pub execution_ms_max: u64,
}

/// Suppresses `n` identifiers nobody sends, and waits for the erasure.
async fn suppress_strangers(base: &str, key: &str, n: usize) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let ids: Vec<String> = (0..n.max(1)).map(|i| format!("stranger-{i}")).collect();
    let asked: Value = http
        .post(format!("{base}/v1/core/erasures"))
        .bearer_auth(key)
        .json(&json!({"user_ids": ids, "suppress": true}))
        .send()
        .await?
        .json()
        .await?;
    let id = asked["job_id"].as_str().context("no job id")?.to_owned();
    loop {
        let job: Value = http
            .get(format!("{base}/v1/core/jobs/{id}"))
            .bearer_auth(key)
            .send()
            .await?
            .json()
            .await?;
        match job["status"].as_str() {
            Some("completed") => return Ok(()),
            Some("failed") => bail!("the suppressing erasure failed: {job}"),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Erases `user-0`, `user-1`, … one after another on `base` until `stop`,
/// starting after the warm-up.
async fn erase_users(
    base: String,
    key: String,
    warmup: Duration,
    pause: Duration,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Erasures {
    let http = reqwest::Client::new();
    let mut out = Erasures {
        completed: 0,
        failed: 0,
        events_removed: 0,
        events_dropped: 0,
        execution_ms_p50: 0,
        execution_ms_max: 0,
    };
    let mut took = Vec::new();
    tokio::time::sleep(warmup).await;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        if n > 0 {
            tokio::time::sleep(pause).await;
        }
        let asked = http
            .post(format!("{base}/v1/core/erasures"))
            .bearer_auth(&key)
            .json(&json!({"user_ids": [format!("user-{n}")]}))
            .send()
            .await;
        n += 1;
        let Some(id) = (match asked {
            Ok(r) => r.json::<Value>().await.ok(),
            Err(_) => None,
        })
        .and_then(|v| v["job_id"].as_str().map(str::to_owned)) else {
            out.failed += 1;
            continue;
        };
        // Polled as a client would: every 100 ms.
        let job = loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let got = http
                .get(format!("{base}/v1/core/jobs/{id}"))
                .bearer_auth(&key)
                .send()
                .await;
            if let Ok(r) = got
                && let Ok(v) = r.json::<Value>().await
                && matches!(v["status"].as_str(), Some("completed" | "failed"))
            {
                break v;
            }
        };
        if job["status"] == "completed" {
            out.completed += 1;
            let stores = &job["result"]["stores"];
            out.events_removed += stores["tracked_events"]["events_removed"]
                .as_u64()
                .unwrap_or(0);
            out.events_dropped += stores["inbox"]["events_dropped"].as_u64().unwrap_or(0);
            took.push(job["execution_time_ms"].as_u64().unwrap_or(0));
        } else {
            out.failed += 1;
        }
    }
    took.sort_unstable();
    out.execution_ms_p50 = took.get(took.len() / 2).copied().unwrap_or(0);
    out.execution_ms_max = took.last().copied().unwrap_or(0);
    out
}

/// A child process serving HTTP on a port it prints.
struct Served {
    child: Child,
    addr: SocketAddr,
}

impl Served {
    /// The server's resident memory now (`VmRSS`) or at its highest so
    /// far (`VmHWM`).
    fn rss_mib(&self) -> Option<f64> {
        self.status_mib("VmRSS:")
    }

    fn peak_rss_mib(&self) -> Option<f64> {
        self.status_mib("VmHWM:")
    }

    fn status_mib(&self, field: &str) -> Option<f64> {
        let pid = self.child.id()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let kb: f64 = status
            .lines()
            .find(|l| l.starts_with(field))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        Some(kb / 1024.0)
    }

    async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            // SIGTERM for a graceful stop; the child is killed if it lingers.
            let _ = std::process::Command::new("kill")
                .arg(pid.to_string())
                .status();
        }
        if tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

async fn spawn_served(
    exe: &std::path::Path,
    args: &[&str],
    env: &[(String, String)],
    marker: &str,
) -> anyhow::Result<Served> {
    let mut child = Command::new(exe)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().cloned())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting a child process")?;
    let stderr = child.stderr.take().context("child stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let addr = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            if line.contains(marker)
                && let Some(rest) = line.split("addr=").nth(1)
            {
                let a = rest.split_whitespace().next().unwrap_or_default();
                return Ok::<_, anyhow::Error>(a.parse::<SocketAddr>()?);
            }
        }
        bail!("child exited before listening")
    })
    .await
    .context("child did not start within 60 s")??;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Served { child, addr })
}

/// One request of a profile: path, key, body, events in it.
struct Req {
    path: &'static str,
    key: usize,
    body: Vec<u8>,
    encoding: Option<&'static str>,
    events: u64,
    sample: Option<(String, chrono::DateTime<Utc>)>,
}

struct Generator {
    profile: Profile,
    tenants: usize,
    seq: AtomicU64,
    sent_keys: Mutex<Vec<(usize, Vec<u8>)>>,
    run: String,
    visibility: bool,
    /// Every request is a sample (webhook deliveries are measured for all).
    sample_all: bool,
    encoding: BodyEncoding,
    batch_size: u64,
}

impl Generator {
    /// The next request, its body encoded as the run sends them.
    fn next(&self) -> Req {
        let mut req = self.next_json();
        (req.body, req.encoding) = self.encoding.encode(std::mem::take(&mut req.body));
        req
    }

    fn next_json(&self) -> Req {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let pick_tenant = |n: u64| -> usize {
            match self.profile {
                Profile::Mixed => {
                    if n.is_multiple_of(2) {
                        0
                    } else {
                        1 + (n as usize / 2) % (self.tenants.max(2) - 1)
                    }
                }
                _ => (n as usize) % self.tenants.max(1),
            }
        };
        let tenant = pick_tenant(n);
        if self.profile == Profile::Duplicates && n % 5 == 4 {
            let sent = self.sent_keys.lock();
            if !sent.is_empty() {
                let (t, body) = sent[(n as usize * 7919) % sent.len()].clone();
                return Req {
                    path: "/v1/core/track",
                    key: t,
                    body,
                    encoding: None,
                    events: 1,
                    sample: None,
                };
            }
        }
        let now = Utc::now();
        let event = |i: u64, at: chrono::DateTime<Utc>| {
            json!({
                "event": "Order Completed",
                "user_id": format!("user-{}", (n * 131 + i) % 5000),
                "properties": {"order_id": format!("o-{n}-{i}"), "total": 129.9, "currency": "EUR", "items": 3},
                "occurred_at": at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                "idempotency_key": format!("{}-{n}-{i}", self.run),
            })
        };
        if self.profile == Profile::Batch {
            let items: Vec<Value> = (0..self.batch_size)
                .map(|i| {
                    let mut e = event(i, now);
                    e["type"] = json!("track");
                    e
                })
                .collect();
            return Req {
                path: "/v1/core/batch",
                key: tenant,
                body: serde_json::to_vec(&json!({ "batch": items })).expect("json"),
                encoding: None,
                events: self.batch_size,
                sample: None,
            };
        }
        // Sampled events get a unique instant so one narrow read finds them.
        let sampled = self.sample_all || (self.visibility && n.is_multiple_of(100));
        let at = if sampled {
            now - chrono::Duration::microseconds((n % 1_000_000) as i64)
        } else {
            now
        };
        let body = serde_json::to_vec(&event(0, at)).expect("json");
        if self.profile == Profile::Duplicates {
            let mut sent = self.sent_keys.lock();
            if sent.len() < 100_000 {
                sent.push((tenant, body.clone()));
            }
        }
        Req {
            path: "/v1/core/track",
            key: tenant,
            body,
            encoding: None,
            events: 1,
            sample: sampled.then(|| (format!("{}-{n}-0", self.run), at)),
        }
    }
}

struct Recorder {
    hist: Mutex<Histogram<u64>>,
    requests: AtomicU64,
    events: AtomicU64,
    wire_bytes: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
}

impl Recorder {
    fn new() -> Self {
        Recorder {
            hist: Mutex::new(
                Histogram::new_with_bounds(1, 120_000_000, 3).expect("histogram bounds"),
            ),
            requests: AtomicU64::new(0),
            events: AtomicU64::new(0),
            wire_bytes: AtomicU64::new(0),
            errors: Mutex::new(BTreeMap::new()),
        }
    }

    fn record(&self, latency: Duration, outcome: Result<u16, String>, req: &Req) {
        let events = req.events;
        let us = latency.as_micros().clamp(1, 120_000_000) as u64;
        self.hist.lock().saturating_record(us);
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.wire_bytes
            .fetch_add(req.body.len() as u64, Ordering::Relaxed);
        match outcome {
            Ok(202) => {
                self.events.fetch_add(events, Ordering::Relaxed);
            }
            Ok(code) => *self.errors.lock().entry(code.to_string()).or_default() += 1,
            Err(kind) => *self.errors.lock().entry(kind).or_default() += 1,
        }
    }

    fn report(&self, target: &str, mode: &str, seconds: f64) -> RunReport {
        let h = self.hist.lock();
        let q = |p: f64| h.value_at_quantile(p) as f64 / 1000.0;
        let requests = self.requests.load(Ordering::Relaxed);
        let events = self.events.load(Ordering::Relaxed);
        RunReport {
            target: target.to_owned(),
            mode: mode.to_owned(),
            requests,
            events,
            errors: self.errors.lock().clone(),
            seconds,
            requests_per_sec: requests as f64 / seconds,
            events_per_sec: events as f64 / seconds,
            p50_ms: q(0.50),
            p95_ms: q(0.95),
            p99_ms: q(0.99),
            p999_ms: q(0.999),
            max_ms: h.max() as f64 / 1000.0,
            wire_bytes_per_event: self.wire_bytes.load(Ordering::Relaxed) as f64
                / events.max(1) as f64,
            server_cpu_us_per_event: None,
            database_cpu_us_per_event: None,
            server_work: None,
        }
    }
}

/// CPU seconds (user + system) process `pid` has used so far.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may hold spaces: state is the
    // first, utime the 12th and stime the 13th, in clock ticks.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / CLOCK_TICKS_PER_SEC)
}

/// CPU seconds the PostgreSQL server's processes (every process named
/// `postgres`: the postmaster, its backends and workers) have used so far.
fn postgres_cpu_seconds() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim_end() == "postgres")
        })
        .filter_map(cpu_seconds)
        .sum()
}

/// `sysconf(_SC_CLK_TCK)`: 100 on every Linux this runs on.
const CLOCK_TICKS_PER_SEC: f64 = 100.0;

async fn send(
    client: &reqwest::Client,
    base: &str,
    keys: &[String],
    req: &Req,
) -> Result<u16, String> {
    client
        .post(format!("{base}{}", req.path))
        .bearer_auth(&keys[req.key])
        .header("content-type", "application/json")
        .headers(
            req.encoding
                .map(|e| {
                    let mut h = reqwest::header::HeaderMap::new();
                    h.insert(
                        reqwest::header::CONTENT_ENCODING,
                        reqwest::header::HeaderValue::from_static(e),
                    );
                    h
                })
                .unwrap_or_default(),
        )
        .body(req.body.clone())
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map_err(|e| {
            if e.is_timeout() {
                "timeout".to_owned()
            } else {
                "connection".to_owned()
            }
        })
}

/// Runs the load against `base` and returns the measured part.
#[allow(clippy::too_many_arguments)]
async fn drive(
    label: &str,
    base: &str,
    keys: Arc<Vec<String>>,
    generator: Arc<Generator>,
    args: &BenchArgs,
    samples: Vec<tokio::sync::mpsc::UnboundedSender<Sample>>,
    progress: bool,
    server_pid: Option<u32>,
) -> RunReport {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.connections.max(1) * 2)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client");
    let warm = Recorder::new();
    let measured = Arc::new(Recorder::new());
    let total = Duration::from_secs(args.warmup + args.duration);
    let measure_from = Duration::from_secs(args.warmup);
    let started = Instant::now();
    let stop_events = args.events;
    let cpu_at_start = server_pid.map(|pid| {
        let base = base.to_owned();
        tokio::spawn(async move {
            tokio::time::sleep_until((started + measure_from).into()).await;
            (cpu_seconds(pid), work_counts(&base).await)
        })
    });
    let ticker = {
        let m = measured.clone();
        let label = label.to_owned();
        tokio::spawn(async move {
            if !progress {
                return;
            }
            let mut last = 0;
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let n = m.requests.load(Ordering::Relaxed);
                let p99 = m.hist.lock().value_at_quantile(0.99) as f64 / 1000.0;
                let errs: u64 = m.errors.lock().values().sum();
                eprint!(
                    "\r{label:<9} t={:>4}s  req/s={:>7}  events={:>9}  p99={:>8.2}ms  errors={:<6}",
                    started.elapsed().as_secs(),
                    n - last,
                    m.events.load(Ordering::Relaxed),
                    p99,
                    errs
                );
                last = n;
            }
        })
    };
    let done = |m: &Recorder| stop_events.is_some_and(|n| m.events.load(Ordering::Relaxed) >= n);
    match args.rate {
        Some(rate) => {
            // Open loop: request i is due at started + i / rate.
            let interval = Duration::from_secs_f64(1.0 / rate as f64);
            let mut i: u64 = 0;
            let limit = Arc::new(tokio::sync::Semaphore::new(args.connections.max(1) * 64));
            loop {
                let due = started + interval.mul_f64(i as f64);
                let now = Instant::now();
                if due.duration_since(started) >= total || done(&measured) {
                    break;
                }
                if due > now {
                    tokio::time::sleep_until(due.into()).await;
                }
                i += 1;
                let Ok(permit) = limit.clone().acquire_owned().await else {
                    break;
                };
                let req = generator.next();
                let (client, base, keys) = (client.clone(), base.to_owned(), keys.clone());
                let measured = measured.clone();
                let in_measure = due.duration_since(started) >= measure_from;
                let samples = samples.clone();
                tokio::spawn(async move {
                    let outcome = send(&client, &base, &keys, &req).await;
                    let latency = Instant::now().duration_since(due);
                    if in_measure {
                        measured.record(latency, outcome.clone(), &req);
                        if let (Some((key, at)), Ok(202)) = (&req.sample, &outcome) {
                            for s in &samples {
                                let _ = s.send((key.clone(), *at, due, req.key));
                            }
                        }
                    }
                    drop(permit);
                });
            }
        }
        None => {
            let mut workers = Vec::new();
            for _ in 0..args.connections.max(1) {
                let (client, base, keys) = (client.clone(), base.to_owned(), keys.clone());
                let generator = generator.clone();
                let measured = measured.clone();
                let samples = samples.clone();
                workers.push(tokio::spawn(async move {
                    let warm = Recorder::new();
                    loop {
                        let elapsed = started.elapsed();
                        if elapsed >= total
                            || stop_events
                                .is_some_and(|n| measured.events.load(Ordering::Relaxed) >= n)
                        {
                            break;
                        }
                        let req = generator.next();
                        let t = Instant::now();
                        let outcome = send(&client, &base, &keys, &req).await;
                        let rec = if elapsed >= measure_from {
                            if let (Some((key, at)), Ok(202)) = (&req.sample, &outcome) {
                                for s in &samples {
                                    let _ = s.send((key.clone(), *at, t, req.key));
                                }
                            }
                            &*measured
                        } else {
                            &warm
                        };
                        rec.record(t.elapsed(), outcome, &req);
                    }
                }));
            }
            for w in workers {
                let _ = w.await;
            }
        }
    }
    let cpu_at_end = server_pid.and_then(cpu_seconds);
    let work_at_end = match server_pid {
        Some(_) => work_counts(base).await,
        None => None,
    };
    // Let in-flight open-loop requests land.
    tokio::time::sleep(Duration::from_millis(200)).await;
    ticker.abort();
    if progress {
        eprintln!();
    }
    let _ = warm;
    let seconds = (started.elapsed().saturating_sub(measure_from))
        .as_secs_f64()
        .max(0.001);
    let mode = match args.rate {
        Some(r) => format!("open loop {r} req/s"),
        None => format!("closed loop, {} connections", args.connections),
    };
    let mut report = measured.report(label, &mode, seconds);
    if let Some(start) = cpu_at_start
        && let Ok((cpu_start, work_start)) = start.await
        && report.events > 0
    {
        if let (Some(start), Some(end)) = (cpu_start, cpu_at_end) {
            report.server_cpu_us_per_event = Some((end - start) * 1e6 / report.events as f64);
        }
        report.server_work = server_work(work_start, work_at_end, report.events);
    }
    report
}

/// A sampled event: idempotency key, its unique `occurred_at`, when it was
/// (scheduled to be) sent, and its tenant.
pub type Sample = (String, chrono::DateTime<Utc>, Instant, usize);

/// Polls, while the load runs, for sampled events until each is readable
/// through `GET /v1/core/events`; latency is from the scheduled send.
async fn visibility(
    base: String,
    keys: Arc<Vec<String>>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Sample>,
) -> Visibility {
    let client = reqwest::Client::new();
    let mut hist = Visibility::hist();
    let mut pending: Vec<Sample> = Vec::new();
    let mut samples = 0u64;
    let mut closed = false;
    let mut drain_deadline: Option<Instant> = None;
    loop {
        while let Ok(s) = rx.try_recv() {
            samples += 1;
            pending.push(s);
        }
        if !closed && rx.is_closed() && rx.is_empty() {
            closed = true;
            drain_deadline = Some(Instant::now() + Duration::from_secs(60));
        }
        if closed && (pending.is_empty() || drain_deadline.is_some_and(|d| Instant::now() > d)) {
            break;
        }
        let mut still = Vec::with_capacity(pending.len());
        for (key, at, sent, tenant) in pending {
            let from = at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
            let to = (at + chrono::Duration::microseconds(1))
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
            let url = format!(
                "{base}/v1/core/events?from={}&to={}&limit=10",
                from.replace('+', "%2B"),
                to.replace('+', "%2B")
            );
            let seen = match client.get(url).bearer_auth(&keys[tenant]).send().await {
                Ok(r) => r
                    .json::<Value>()
                    .await
                    .ok()
                    .is_some_and(|b| b["events"].as_array().is_some_and(|a| !a.is_empty())),
                Err(_) => false,
            };
            if seen {
                hist.saturating_record(sent.elapsed().as_micros().max(1) as u64);
            } else {
                still.push((key, at, sent, tenant));
            }
        }
        pending = still;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Visibility::from_hist(samples, &hist)
}

/// A queue bound to the run's core exchange, consumed while the load runs.
struct StreamConsumer {
    _conn: lapin::Connection,
    deliveries: lapin::Consumer,
}

impl StreamConsumer {
    /// Binds an exclusive queue to `core.event.tracked` on `exchange`
    /// (declared here too, with the server's parameters, so binding does not
    /// race the server's own declaration).
    async fn bind(url: &str, exchange: &str) -> anyhow::Result<StreamConsumer> {
        use lapin::{Connection, ConnectionProperties};
        let conn = Connection::connect(url, ConnectionProperties::default())
            .await
            .context("connecting to RabbitMQ")?;
        let channel = conn.create_channel().await?;
        let deliveries =
            fastack_core::amqp::subscribe(&channel, exchange, &["core.event.tracked"], true)
                .await?;
        Ok(StreamConsumer {
            _conn: conn,
            deliveries,
        })
    }

    /// Latency from each sampled event's scheduled send to its
    /// `core.event.tracked` message, matched on `properties.order_id`.
    async fn measure(self, rx: tokio::sync::mpsc::UnboundedReceiver<Sample>) -> Visibility {
        use futures::StreamExt;
        let (tx, arrivals) = tokio::sync::mpsc::unbounded_channel();
        let StreamConsumer {
            _conn: conn,
            mut deliveries,
        } = self;
        let pump = tokio::spawn(async move {
            while let Some(Ok(d)) = deliveries.next().await {
                let arrived = Instant::now();
                if let Some(id) = order_of(&d.data)
                    && tx.send((id, arrived)).is_err()
                {
                    return;
                }
            }
        });
        let (latency, _) = match_arrivals(rx, arrivals, sampled_order, None).await;
        pump.abort();
        drop(conn);
        latency
    }
}

/// The `properties.order_id` of an event's JSON.
fn order_of(body: &[u8]) -> Option<String> {
    let body: Value = serde_json::from_slice(body).ok()?;
    Some(body["properties"]["order_id"].as_str()?.to_owned())
}

/// Matches sampled sends with arrivals (by order id) until the load ends
/// and every sample arrived, or 60 s after. Returns the latencies and,
/// given the measured window `(from, to)`, the arrivals per second in it
/// and the seconds from `to` to the last arrival.
async fn match_arrivals(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Sample>,
    mut arrivals: tokio::sync::mpsc::UnboundedReceiver<(String, Instant)>,
    sampled: fn(&str) -> bool,
    window: Option<(Instant, std::sync::Arc<parking_lot::Mutex<Option<Instant>>>)>,
) -> (Visibility, Option<(f64, f64)>) {
    let mut hist = Visibility::hist();
    // Sampled idempotency keys end in `-{n}-0`; the order id is `o-{n}-0`.
    let order_id = |key: &str| {
        let mut parts = key.rsplitn(3, '-');
        let (_zero, n) = (parts.next(), parts.next().unwrap_or_default());
        format!("o-{n}-0")
    };
    let mut pending: std::collections::HashMap<String, Instant> = Default::default();
    // An arrival can beat the 202 to the load tool.
    let mut early: std::collections::HashMap<String, Instant> = Default::default();
    let mut samples = 0u64;
    let mut closed_at: Option<Instant> = None;
    let mut arrived_at: Vec<Instant> = Vec::new();
    let mut last_arrival: Option<Instant> = None;
    loop {
        if let Some(t) = closed_at
            && (pending.is_empty() || t.elapsed() > Duration::from_secs(60))
        {
            break;
        }
        tokio::select! {
            s = rx.recv(), if closed_at.is_none() => match s {
                Some((key, _, sent, _)) => {
                    samples += 1;
                    let id = order_id(&key);
                    match early.remove(&id) {
                        Some(arrived) => {
                            hist.saturating_record(arrived.saturating_duration_since(sent).as_micros().max(1) as u64);
                        }
                        None => {
                            pending.insert(id, sent);
                        }
                    }
                }
                None => closed_at = Some(Instant::now()),
            },
            a = arrivals.recv() => {
                let Some((id, arrived)) = a else { break };
                if window.is_some() {
                    arrived_at.push(arrived);
                }
                match pending.remove(&id) {
                    Some(sent) => {
                        last_arrival = Some(arrived);
                        hist.saturating_record(arrived.saturating_duration_since(sent).as_micros().max(1) as u64);
                    }
                    None if sampled(&id) && early.len() < 1_000_000 => {
                        early.insert(id, arrived);
                    }
                    None => {}
                }
            }
            _ = tokio::time::sleep(Duration::from_millis(500)), if closed_at.is_some() => {}
        }
    }
    let rate = window.and_then(|(from, to)| {
        let to = (*to.lock())?;
        let secs = to.saturating_duration_since(from).as_secs_f64().max(1e-3);
        let n = arrived_at
            .iter()
            .filter(|a| **a >= from && **a <= to)
            .count();
        let drain = last_arrival.map_or(0.0, |l| l.saturating_duration_since(to).as_secs_f64());
        Some((n as f64 / secs, drain))
    });
    (Visibility::from_hist(samples, &hist), rate)
}

/// A webhook receiver in the load tool: answers 204 at once and reports
/// each `core.event.tracked` delivery's order id with when it arrived.
async fn webhook_receiver(
    tx: tokio::sync::mpsc::UnboundedSender<(String, Instant)>,
) -> anyhow::Result<SocketAddr> {
    use poem::{EndpointExt, Route, handler, listener::TcpListener, post, web::Data};
    #[handler]
    async fn hook(
        body: poem::web::Json<Value>,
        tx: Data<&tokio::sync::mpsc::UnboundedSender<(String, Instant)>>,
    ) -> poem::http::StatusCode {
        let arrived = Instant::now();
        if let Some(id) = body.0["properties"]["order_id"].as_str() {
            let _ = tx.send((id.to_owned(), arrived));
        }
        poem::http::StatusCode::NO_CONTENT
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    drop(listener);
    let app = Route::new().at("/hook", post(hook)).data(tx);
    tokio::spawn(poem::Server::new(TcpListener::bind(addr)).run(app));
    Ok(addr)
}

/// Every order id is a sample.
fn every_order(_: &str) -> bool {
    true
}

/// Whether an order id `o-{n}-0` belongs to a sampled request (every 100th).
fn sampled_order(id: &str) -> bool {
    id.strip_prefix("o-")
        .and_then(|r| r.strip_suffix("-0"))
        .and_then(|n| n.parse::<u64>().ok())
        .is_some_and(|n| n.is_multiple_of(100))
}

/// Removes the run's exchanges from the broker.
async fn delete_exchanges(url: &str, names: &[&str]) {
    use lapin::{Connection, ConnectionProperties, options::ExchangeDeleteOptions};
    let Ok(conn) = Connection::connect(url, ConnectionProperties::default()).await else {
        return;
    };
    if let Ok(channel) = conn.create_channel().await {
        for name in names {
            let _ = channel
                .exchange_delete((*name).into(), ExchangeDeleteOptions::default())
                .await;
        }
    }
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    format!("{cpus} cpus, {model}")
}

/// The bare baseline: poem answering 202 with a fixed body.
pub async fn baseline(listen: SocketAddr) -> anyhow::Result<()> {
    use poem::{
        EndpointExt, Response, Route, handler,
        listener::{Acceptor, Listener, TcpListener},
    };
    #[handler]
    fn accept() -> Response {
        Response::builder()
            .status(poem::http::StatusCode::ACCEPTED)
            .content_type("application/json")
            .body(r#"{"duplicate":false,"id":"01a22b60-b188-73bd-8897-d8bc6e31c17a"}"#)
    }
    let app = Route::new()
        .at("/*path", poem::post(accept))
        .map_to_response();
    let acceptor = TcpListener::bind(listen).into_acceptor().await?;
    let addr = acceptor.local_addr()[0]
        .as_socket_addr()
        .copied()
        .context("address")?;
    eprintln!("baseline listening addr={addr}");
    poem::Server::new_with_acceptor(acceptor).run(app).await?;
    Ok(())
}

fn table(report: &Report) -> String {
    let mut out = String::new();
    let row = |r: &RunReport| {
        format!(
            "| {:<8} | {:>9.0} | {:>10.0} | {:>7.2} | {:>7.2} | {:>7.2} | {:>7.2} | {:>6} |\n",
            r.target,
            r.requests_per_sec,
            r.events_per_sec,
            r.p50_ms,
            r.p95_ms,
            r.p99_ms,
            r.p999_ms,
            r.errors.values().sum::<u64>()
        )
    };
    out.push_str(&format!(
        "profile {:?}{}, backend {:?}, bodies {:?}, {}, machine: {}\n\n",
        report.profile,
        if report.profile == Profile::Batch {
            format!(" of {}", report.batch_size)
        } else {
            String::new()
        },
        report.backend,
        report.encoding,
        report.fastack.mode,
        report.machine
    ));
    out.push_str(
        "| target   |     req/s |   events/s | p50 ms  | p95 ms  | p99 ms  | p99.9ms | errors |\n",
    );
    out.push_str(
        "|----------|-----------|------------|---------|---------|---------|---------|--------|\n",
    );
    out.push_str(&row(&report.fastack));
    if let Some(c) = &report.capture {
        out.push_str(&row(c));
    }
    if let Some(b) = &report.baseline {
        out.push_str(&row(b));
        let f = &report.fastack;
        out.push_str(&format!(
            "| ratio    | {:>9.2} | {:>10} | {:>7.2} | {:>7.2} | {:>7.2} | {:>7.2} |        |\n",
            f.requests_per_sec / b.requests_per_sec.max(1e-9),
            "",
            f.p50_ms / b.p50_ms.max(1e-9),
            f.p95_ms / b.p95_ms.max(1e-9),
            f.p99_ms / b.p99_ms.max(1e-9),
            f.p999_ms / b.p999_ms.max(1e-9),
        ));
    }
    for r in std::iter::once(&report.fastack)
        .chain(&report.capture)
        .chain(&report.baseline)
    {
        if let Some(us) = r.server_cpu_us_per_event
            && r.wire_bytes_per_event == 0.0
        {
            out.push_str(&format!(
                "\n{}: server CPU {us:.1} µs per event{}",
                r.target,
                r.database_cpu_us_per_event
                    .map(|db| format!(" + PostgreSQL {db:.1} µs = {:.1} µs", us + db))
                    .unwrap_or_default()
            ));
        }
        if let Some(w) = r.server_work {
            out.push_str(&format!(
                "\n{}: {:.2} group commits and {:.2} processing rounds per 1,000 events ({:.0} events a round)",
                r.target, w.group_commits_per_1k_events, w.rounds_per_1k_events, w.events_per_round
            ));
        }
        if r.wire_bytes_per_event > 0.0 {
            out.push_str(&format!(
                "\n{}: {:.0} body bytes on the wire per event{}",
                r.target,
                r.wire_bytes_per_event,
                r.server_cpu_us_per_event
                    .map(|us| format!(", server CPU {us:.1} µs per event"))
                    .unwrap_or_default()
            ));
        }
    }
    out.push('\n');
    if let Some(v) = &report.visibility {
        out.push_str(&format!(
            "\nsend -> readable via GET /v1/core/events: p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms ({} samples, {} not seen)\n",
            v.p50_ms, v.p95_ms, v.p99_ms, v.samples, v.not_seen
        ));
    }
    if let Some(v) = &report.stream_visibility {
        out.push_str(&format!(
            "send -> core.event.tracked consumed from RabbitMQ: p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms ({} samples, {} not seen)\n",
            v.p50_ms, v.p95_ms, v.p99_ms, v.samples, v.not_seen
        ));
    }
    if let Some(w) = &report.webhook {
        out.push_str(&format!(
            "send -> webhook delivered: p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms ({} events, {} not delivered); {:.0} delivered/s while measured, last delivery {:.1} s after the load\n",
            w.latency.p50_ms, w.latency.p95_ms, w.latency.p99_ms, w.latency.samples, w.latency.not_seen, w.per_sec, w.drain_seconds
        ));
    }
    if let Some(e) = &report.erasures {
        out.push_str(&format!(
            "erasures while measured: {} completed ({} failed), {} events removed and {} dropped, execution p50 {} ms, max {} ms\n",
            e.completed, e.failed, e.events_removed, e.events_dropped, e.execution_ms_p50, e.execution_ms_max
        ));
    }
    if let Some(rows) = report.inbox_at_end {
        out.push_str(&match report.inbox_drain_seconds {
            Some(s) => format!("inbox: {rows} rows when the load ended, empty {s:.2} s later\n"),
            None => format!("inbox: {rows} rows when the load ended, not empty 120 s later\n"),
        });
    }
    if let (Some(a), Some(b)) = (report.server_rss_mib_before, report.server_rss_mib_after) {
        let peak = report
            .server_rss_mib_peak
            .map(|p| format!(", {p:.1} MiB at its peak"))
            .unwrap_or_default();
        out.push_str(&format!(
            "server RSS: {a:.1} MiB before, {b:.1} MiB after{peak}\n"
        ));
    }
    if !report.fastack.errors.is_empty() {
        out.push_str(&format!("fastack errors: {:?}\n", report.fastack.errors));
    }
    out
}

/// The server under test: `--server`, or the `fastack` built beside this
/// binary.
fn server_bin(args: &BenchArgs) -> anyhow::Result<std::path::PathBuf> {
    if let Some(path) = &args.server {
        return Ok(path.clone());
    }
    let me = std::env::current_exe().context("locating fastack-bench")?;
    let beside = me.with_file_name("fastack");
    if !beside.exists() {
        bail!(
            "no fastack binary beside {}: build it (cargo build --release) or pass --server",
            me.display()
        );
    }
    Ok(beside)
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let run_id = format!("b{}", uuid::Uuid::new_v4().simple());
    let dir = tempfile_dir()?;
    let mut env: Vec<(String, String)> = vec![
        ("FASTACK_LISTEN".into(), "127.0.0.1:0".into()),
        ("FASTACK_DATA_DIR".into(), dir.display().to_string()),
        ("FASTACK_BOOTSTRAP".into(), "false".into()),
        ("FASTACK_LOG".into(), "info".into()),
        (
            "FASTACK_ENC_KEY".into(),
            "ZmFzdGFjay1iZW5jaC1tYXN0ZXIta2V5LTMyLWJ5dGVzIQ==".into(),
        ),
    ];
    for kv in &args.server_env {
        let (k, v) = kv.split_once('=').context("--server-env takes KEY=VALUE")?;
        env.push((k.to_owned(), v.to_owned()));
    }
    // The receiver is up before the tenants get their endpoint.
    let (hook_tx, hook_rx) = tokio::sync::mpsc::unbounded_channel();
    let hook_addr = if args.webhook {
        env.push(("FASTACK_WEBHOOK_ALLOW_PRIVATE".into(), "true".into()));
        Some(webhook_receiver(hook_tx).await?)
    } else {
        drop(hook_tx);
        None
    };
    let mut pg_db = None;
    if args.backend == Backend::Postgres {
        use sqlx::{Connection, Executor};
        let mut conn = sqlx::PgConnection::connect(&args.postgres)
            .await
            .context("connecting to PostgreSQL")?;
        let name = format!("fastack_bench_{}", &run_id[1..13]);
        conn.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await?;
        // Swap the database name, keeping any query (e.g. a socket `host=`).
        let (url, query) = args
            .postgres
            .split_once('?')
            .map_or((args.postgres.as_str(), ""), |(u, q)| (u, q));
        let base = url.rsplit_once('/').map_or(url, |(b, _)| b);
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{query}")
        };
        env.push((
            "FASTACK_DATABASE_URL".into(),
            format!("{base}/{name}{query}"),
        ));
        env.push(("FASTACK_REDIS_URL".into(), args.redis.clone()));
        env.push(("FASTACK_REDIS_PREFIX".into(), run_id.clone()));
        pg_db = Some(name);
    }
    if args.wrk.is_some()
        && (args.rate.is_some()
            || args.visibility
            || args.webhook
            || args.tenants.is_some_and(|t| t > 1)
            || !matches!(args.profile, Profile::Track | Profile::Batch))
    {
        bail!("--wrk runs the closed loop of the track or batch profile on one tenant");
    }
    let config = server_config(&env)?;
    let tenants = args.tenants.unwrap_or(match args.profile {
        Profile::Mixed => 10,
        _ => 1,
    });
    // Kept open: after the load it tells when the inbox is empty.
    let store = store::open(&config).await?;
    let keys: Vec<String> = {
        let mut keys = Vec::with_capacity(tenants);
        for i in 0..tenants {
            let t = admin::create_tenant(
                store.as_ref(),
                &format!("bench-{i}"),
                Plan::Enterprise,
                None,
            )
            .await?;
            keys.push(admin::create_key(store.as_ref(), t.id, None).await?.secret);
            if let Some(addr) = hook_addr {
                let keys = fastack_core::keyring::open(store.as_ref(), &config, Utc::now()).await?;
                admin::add_webhook(
                    store.as_ref(),
                    &keys,
                    t.id,
                    &format!("http://{addr}/hook"),
                    Some("core.event.tracked"),
                    true,
                )
                .await?;
            }
            if let Some(file) = &args.tracking_plan {
                let doc: Value = serde_json::from_slice(&std::fs::read(file)?)?;
                fastack_core::taxonomy::install(store.as_ref(), t.id, &doc, Utc::now()).await?;
            }
        }
        keys
    };
    let keys = Arc::new(keys);
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());

    let baseline_report = if args.no_baseline {
        None
    } else {
        let me = std::env::current_exe().context("locating fastack-bench")?;
        let b = spawn_served(&me, &["baseline"], &[], "baseline listening").await?;
        let gen_b = Arc::new(Generator {
            profile: args.profile,
            tenants,
            seq: AtomicU64::new(0),
            sent_keys: Mutex::new(Vec::new()),
            run: format!("{run_id}-base"),
            visibility: false,
            sample_all: false,
            encoding: args.encoding,
            batch_size: args.batch_size,
        });
        let url = format!("http://{}", b.addr);
        let r = match &args.wrk {
            Some(script) => {
                drive_wrk(
                    "baseline",
                    &url,
                    &keys[0],
                    script,
                    &args,
                    &gen_b.run,
                    WrkFormat::Fastack,
                    b.child.id(),
                )
                .await
            }
            None => Ok(drive(
                "baseline",
                &url,
                keys.clone(),
                gen_b,
                &args,
                Vec::new(),
                progress,
                b.child.id(),
            )
            .await),
        };
        let r = r?;
        b.stop().await;
        Some(r)
    };
    let capture_report = match (&args.capture, &args.wrk) {
        (None, _) => None,
        (Some(_), None) => bail!("--capture runs with --wrk"),
        (Some(bin), Some(script)) => {
            let c = spawn_capture(bin, &args.redis).await?;
            let url = format!("http://{}", c.addr);
            let r = drive_wrk(
                "capture",
                &url,
                "phc_bench",
                script,
                &args,
                &format!("{run_id}-capture"),
                WrkFormat::Capture,
                c.child.id(),
            )
            .await;
            c.stop().await;
            Some(r?)
        }
    };

    let core_exchange = format!("{run_id}.core");
    let job_exchange = format!("{run_id}.job");
    if let Some(url) = &args.amqp {
        env.push(("FASTACK_AMQP_URL".into(), url.clone()));
        env.push((
            "FASTACK_CLOUDEVENTS_SOURCE".into(),
            "//fastack/bench".into(),
        ));
        env.push(("FASTACK_CORE_EVENTS_EXCHANGE".into(), core_exchange.clone()));
        env.push(("FASTACK_JOB_EVENTS_EXCHANGE".into(), job_exchange.clone()));
    }
    let server = spawn_served(&server_bin(&args)?, &["serve"], &env, "fastack listening").await?;
    let rss_before = server.rss_mib();
    let base = format!("http://{}", server.addr);
    let mut samples = Vec::new();
    let poller = args.visibility.then(|| {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        samples.push(tx);
        tokio::spawn(visibility(base.clone(), keys.clone(), rx))
    });
    let stream_poller = match (&args.amqp, args.visibility) {
        (Some(url), true) => {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            samples.push(tx);
            let consumer = StreamConsumer::bind(url, &core_exchange).await?;
            Some(tokio::spawn(consumer.measure(rx)))
        }
        _ => None,
    };
    let load_end = Arc::new(Mutex::new(None));
    let hook_poller = hook_addr.map(|_| {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        samples.push(tx);
        let window = (
            Instant::now() + Duration::from_secs(args.warmup),
            load_end.clone(),
        );
        tokio::spawn(match_arrivals(rx, hook_rx, every_order, Some(window)))
    });
    let gen_f = Arc::new(Generator {
        profile: args.profile,
        tenants,
        seq: AtomicU64::new(0),
        sent_keys: Mutex::new(Vec::new()),
        run: run_id.clone(),
        visibility: args.visibility && !args.webhook,
        sample_all: args.webhook,
        encoding: args.encoding,
        batch_size: args.batch_size,
    });
    if let Some(n) = args.suppressed {
        suppress_strangers(&base, &keys[0], n).await?;
    }
    let stop_erasing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let erasing = args.erasures.then(|| {
        tokio::spawn(erase_users(
            base.clone(),
            keys[0].clone(),
            Duration::from_secs(args.warmup),
            Duration::from_millis(args.erasure_pause_ms),
            stop_erasing.clone(),
        ))
    });
    let fastack = match &args.wrk {
        Some(script) => {
            drive_wrk(
                "fastack",
                &base,
                &keys[0],
                script,
                &args,
                &gen_f.run,
                WrkFormat::Fastack,
                server.child.id(),
            )
            .await?
        }
        None => {
            drive(
                "fastack",
                &base,
                keys.clone(),
                gen_f,
                &args,
                samples,
                progress,
                server.child.id(),
            )
            .await
        }
    };
    *load_end.lock() = Some(Instant::now());
    stop_erasing.store(true, Ordering::Relaxed);
    let erasures = match erasing {
        Some(task) => task.await.ok(),
        None => None,
    };
    let inbox = inbox_drain(store.as_ref()).await;
    drop(store);
    let vis = match poller {
        Some(p) => p.await.ok(),
        None => None,
    };
    let stream_vis = match stream_poller {
        Some(p) => p.await.ok(),
        None => None,
    };
    let webhook = match hook_poller {
        Some(p) => p.await.ok().map(|(latency, rate)| {
            let (per_sec, drain_seconds) = rate.unwrap_or_default();
            Delivered {
                latency,
                per_sec,
                drain_seconds,
            }
        }),
        None => None,
    };
    let rss_after = server.rss_mib();
    let rss_peak = server.peak_rss_mib();
    server.stop().await;
    if let Some(url) = &args.amqp {
        delete_exchanges(url, &[&core_exchange, &job_exchange]).await;
    }
    if let Some(name) = pg_db {
        use sqlx::{Connection, Executor};
        if let Ok(mut conn) = sqlx::PgConnection::connect(&args.postgres).await {
            let _ = conn
                .execute(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .await;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let report = Report {
        profile: args.profile,
        backend: args.backend,
        encoding: args.encoding,
        batch_size: args.batch_size,
        rate: args.rate,
        connections: args.connections,
        ratio_throughput: baseline_report
            .as_ref()
            .map(|b| fastack.requests_per_sec / b.requests_per_sec.max(1e-9)),
        fastack,
        baseline: baseline_report,
        capture: capture_report,
        visibility: vis,
        stream_visibility: stream_vis,
        webhook,
        erasures,
        server_rss_mib_before: rss_before,
        server_rss_mib_after: rss_after,
        server_rss_mib_peak: rss_peak,
        inbox_at_end: inbox.map(|(rows, _)| rows),
        inbox_drain_seconds: inbox.and_then(|(_, secs)| secs),
        machine: machine(),
    };
    let json_text = serde_json::to_string_pretty(&report)?;
    if let Some(path) = &args.out {
        std::fs::write(path, &json_text).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        writeln!(std::io::stdout().lock(), "{json_text}")?;
    } else {
        writeln!(std::io::stdout().lock(), "{}", table(&report))?;
    }
    Ok(())
}

/// The inbox rows waiting when the load ended and the seconds until none
/// are (`None` after two minutes): whether processing keeps up. The rows
/// are counted once; the wait polls a check that does not scan them, so
/// the measurement does not slow the drain it measures.
async fn inbox_drain(store: &store::Storage) -> Option<(i64, Option<f64>)> {
    let start = Instant::now();
    let at_end = store
        .processing()
        .inbox_stats()
        .await
        .inspect_err(|e| eprintln!("the waiting events could not be counted: {e:?}"))
        .ok()?
        .0;
    while !store
        .processing()
        .inbox_empty()
        .await
        .inspect_err(|e| eprintln!("the waiting events could not be looked at: {e:?}"))
        .ok()?
    {
        if start.elapsed() > Duration::from_secs(120) {
            return Some((at_end, None));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Some((at_end, Some(start.elapsed().as_secs_f64())))
}

/// One target driven by wrk (a warm-up run, then the measured one), read
/// from the `WRK_JSON` line its script prints at the end.
#[allow(clippy::too_many_arguments)]
async fn drive_wrk(
    label: &str,
    base: &str,
    key: &str,
    script: &std::path::Path,
    args: &BenchArgs,
    run: &str,
    format: WrkFormat,
    server_pid: Option<u32>,
) -> anyhow::Result<RunReport> {
    anyhow::ensure!(
        args.encoding == BodyEncoding::Identity,
        "--wrk sends its script's bodies as is: drop --encoding"
    );
    let batch: u64 = if args.profile == Profile::Batch {
        args.batch_size
    } else {
        1
    };
    let wrk = |seconds: u64, run: String| {
        Command::new("wrk")
            .arg("-t1")
            .arg(format!("-c{}", args.connections))
            .arg(format!("-d{seconds}s"))
            .args(["--timeout", "30s", "-s"])
            .arg(script)
            .arg(base)
            .env("FASTACK_BENCH_KEY", key)
            .env("FASTACK_BENCH_RUN", run)
            .env("FASTACK_BENCH_BATCH", batch.to_string())
            .env("FASTACK_BENCH_FORMAT", format.name())
            .output()
    };
    if args.warmup > 0 {
        wrk(args.warmup, format!("{run}-warm"))
            .await
            .context("running wrk (install the Debian package `wrk`)")?;
    }
    let on_postgres = args.backend == Backend::Postgres && format == WrkFormat::Fastack;
    let cpu_at_start = server_pid.and_then(cpu_seconds);
    let db_cpu_at_start = on_postgres.then(postgres_cpu_seconds);
    let work_at_start = match format {
        WrkFormat::Fastack => work_counts(base).await,
        WrkFormat::Capture => None,
    };
    let out = wrk(args.duration.max(1), run.to_owned())
        .await
        .context("running wrk (install the Debian package `wrk`)")?;
    let cpu_at_end = server_pid.and_then(cpu_seconds);
    let db_cpu_at_end = on_postgres.then(postgres_cpu_seconds);
    let work_at_end = match format {
        WrkFormat::Fastack => work_counts(base).await,
        WrkFormat::Capture => None,
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("WRK_JSON "))
        .with_context(|| {
            format!(
                "wrk printed no WRK_JSON line: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    let v: Value = serde_json::from_str(line)?;
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let ms = |k: &str| n(k) as f64 / 1000.0;
    let seconds = (n("duration_us") as f64 / 1e6).max(1e-9);
    let events = n("requests") * batch;
    let per_event = |start: Option<f64>, end: Option<f64>| match (start, end) {
        (Some(a), Some(b)) if events > 0 => Some((b - a) * 1e6 / events as f64),
        _ => None,
    };
    let mut errors = BTreeMap::new();
    for (name, k) in [("transport", "errors"), ("non-2xx", "non_2xx")] {
        if n(k) > 0 {
            errors.insert(name.to_owned(), n(k));
        }
    }
    Ok(RunReport {
        target: label.to_owned(),
        mode: format!("closed loop, wrk -t1 -c{}", args.connections),
        requests: n("requests"),
        events: n("requests") * batch,
        errors,
        seconds,
        requests_per_sec: n("requests") as f64 / seconds,
        events_per_sec: (n("requests") * batch) as f64 / seconds,
        p50_ms: ms("p50_us"),
        p95_ms: ms("p95_us"),
        p99_ms: ms("p99_us"),
        p999_ms: ms("p999_us"),
        max_ms: ms("max_us"),
        // wrk's script builds the bodies: not counted here.
        wire_bytes_per_event: 0.0,
        server_cpu_us_per_event: per_event(cpu_at_start, cpu_at_end),
        database_cpu_us_per_event: per_event(db_cpu_at_start, db_cpu_at_end),
        server_work: server_work(work_at_start, work_at_end, events),
    })
}

/// The body format of a wrk run (`FASTACK_BENCH_FORMAT` for the script).
#[derive(Clone, Copy, PartialEq, Eq)]
enum WrkFormat {
    Fastack,
    Capture,
}

impl WrkFormat {
    fn name(self) -> &'static str {
        match self {
            WrkFormat::Fastack => "fastack",
            WrkFormat::Capture => "capture",
        }
    }
}

/// PostHog's capture, started on a free port with its print sink (Kafka's
/// settings are required but unused) and its Redis for the quota limiter.
async fn spawn_capture(bin: &std::path::Path, redis: &str) -> anyhow::Result<Served> {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let env = [
        ("PRINT_SINK", "true".to_owned()),
        ("ADDRESS", addr.to_string()),
        ("REDIS_URL", redis.to_owned()),
        ("KAFKA_HOSTS", "127.0.0.1:9092".to_owned()),
        ("KAFKA_TOPIC", "events".to_owned()),
    ];
    let child = Command::new(bin)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "capture did not listen within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(Served { child, addr })
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("fastack-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The configuration of the server under test, as it loads it (its sinks'
/// settings included): the load tool opens the same storage.
fn server_config(env: &[(String, String)]) -> anyhow::Result<Config> {
    Ok(Config::load(
        env.iter().cloned(),
        &fastack_actors::sinks::settings(),
    )?)
}

#[cfg(test)]
mod tests {
    /// A sink's setting given with `--server-env` is the server's, not an
    /// unknown one.
    #[test]
    fn a_sinks_setting_is_a_server_setting() {
        let env =
            [("FASTACK_MIRROR_URL", "file:///tmp/lake")].map(|(k, v)| (k.to_owned(), v.to_owned()));
        assert!(super::server_config(&env).is_ok());
    }
}
