//! EndpointWorkerActor: delivers to one webhook endpoint, a bounded number
//! of requests at a time, so a slow or dead receiver only ever holds up its
//! own deliveries. How many at a time adapts to the receiver ([`Limit`]):
//! it grows while answers come back fast and 2xx and halves on an error, a
//! timeout or a latency well above the endpoint's best, between 1 and
//! `FASTACK_WEBHOOK_MAX_CONCURRENCY` (64).
//!
//! Each attempt: Standard Webhooks headers (`webhook-id` fixed per delivery,
//! `webhook-timestamp` per attempt, `webhook-signature` with every active
//! secret), a 10 s timeout, no redirects, and an address check at connect
//! time (DNS rebinding cannot turn a public name into a private address).
//! 2xx is delivered; 404/410 stop at once and disable the endpoint; anything
//! else is retried ~2 s and ~8 s later, then failed. Every attempt is logged
//! (never the bodies).

use std::{
    collections::VecDeque,
    net::{IpAddr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use fastack_core::{
    store::{AttemptOutcome, AttemptRecord, DueDelivery},
    webhooks::{self, MAX_ATTEMPTS, Secret, is_forbidden, retry_delay},
};
use fastack_entities::{Attempt, EndpointId};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use tracing::{debug, warn};

use super::WebhookSettings;
use crate::context::Ctx;

/// Requests in flight to one endpoint when it is new.
pub const INITIAL_CONCURRENCY: f64 = 4.0;
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// An endpoint's concurrency limit: additive increase while it answers
/// fast and 2xx, multiplicative decrease on trouble (AIMD, as TCP does),
/// at most one decrease per round trip so a burst of failures of requests
/// sent together counts once.
#[derive(Debug)]
pub struct Limit {
    value: f64,
    max: f64,
    /// The fastest recent answer: what "fast" is measured against.
    best: Option<Duration>,
    last_cut: Option<Instant>,
}

impl Limit {
    pub fn new(max: usize) -> Limit {
        let max = max.max(1) as f64;
        Limit {
            value: INITIAL_CONCURRENCY.min(max),
            max,
            best: None,
            last_cut: None,
        }
    }

    /// Requests that may be in flight now.
    pub fn allowed(&self) -> usize {
        self.value.floor().max(1.0) as usize
    }

    /// What one finished attempt says about the endpoint.
    pub fn record(&mut self, ok: bool, latency: Duration, now: Instant) {
        // The best latency drifts up slowly, so a receiver that became
        // slower for good is not judged against an old best forever.
        let best = match self.best {
            Some(b) if latency < b => latency,
            Some(b) => b + (latency - b) / 64,
            None => latency,
        };
        self.best = Some(best);
        let slow = latency > best * 2 + Duration::from_millis(20);
        if ok && !slow {
            self.value = (self.value + 1.0 / self.value).min(self.max);
        } else if self
            .last_cut
            .is_none_or(|at| now.duration_since(at) >= latency.max(Duration::from_millis(1)))
        {
            self.value = (self.value / 2.0).max(1.0);
            self.last_cut = Some(now);
        }
    }
}

/// Resolves names but refuses addresses that are not global unicast
/// (unless allowed).
#[derive(Debug)]
pub struct PublicOnly;

/// A host the address guard refused at connect time.
#[derive(Debug, thiserror::Error)]
#[error("{host} resolves only to addresses that are not globally routable")]
pub struct AddressRefused {
    host: String,
}

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .filter(|a| !is_forbidden(a.ip()))
                .collect();
            if addrs.is_empty() {
                return Err(Box::new(AddressRefused { host }) as _);
            }
            let addrs: Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// The HTTP client of deliveries. Environment proxies (`HTTP_PROXY`…) are
/// ignored: through a proxy the connect-time address check would not see
/// the receiver's address. An egress proxy is an explicit setting
/// (`FASTACK_WEBHOOK_PROXY`), and then the proxy enforces the addresses.
pub fn http_client(
    allow_private: bool,
    proxy: Option<&str>,
) -> Result<reqwest::Client, fastack_core::Error> {
    let mut b = reqwest::Client::builder()
        .timeout(ATTEMPT_TIMEOUT)
        .connect_timeout(Duration::from_secs(5))
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("fastack-webhooks/", env!("CARGO_PKG_VERSION")));
    match proxy {
        Some(url) => {
            let proxy = reqwest::Proxy::all(url)
                .map_err(|e| fastack_core::Error::Config(format!("FASTACK_WEBHOOK_PROXY: {e}")))?;
            b = b.proxy(proxy);
        }
        None => {
            b = b.no_proxy();
            if !allow_private {
                b = b.dns_resolver(Arc::new(PublicOnly));
            }
        }
    }
    b.build()
        .map_err(|e| fastack_core::Error::Config(format!("webhook HTTP client: {e}")))
}

pub struct EndpointWorkerActor;

/// Where a worker reports each finished attempt (its dispatcher, which
/// records them in batches): a callback, so the worker knows no dispatcher.
pub type Report = Arc<dyn Fn(EndpointId, AttemptRecord) + Send + Sync>;

pub struct EndpointWorkerArgs {
    pub ctx: Arc<Ctx>,
    pub endpoint: EndpointId,
    pub client: reqwest::Client,
    pub report: Report,
}

pub struct EndpointWorkerState {
    ctx: Arc<Ctx>,
    endpoint: EndpointId,
    client: reqwest::Client,
    report: Report,
    limit: Limit,
    in_flight: usize,
    /// Deliveries waiting for a slot (at most the dispatcher's backlog).
    waiting: VecDeque<Box<DueDelivery>>,
    /// Whether a refusal by the address guard was logged already.
    warned: Arc<AtomicBool>,
}

/// Messages of an endpoint's worker.
#[derive(Debug)]
pub enum EndpointWorkerMsg {
    /// Make the next attempt of this delivery.
    Deliver { delivery: Box<DueDelivery> },
    /// An attempt finished: whether the receiver answered 2xx, how fast.
    Finished { ok: bool, latency: Duration },
}

impl Actor for EndpointWorkerActor {
    type Msg = EndpointWorkerMsg;
    type State = EndpointWorkerState;
    type Arguments = EndpointWorkerArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(EndpointWorkerState {
            limit: Limit::new(WebhookSettings::of(&args.ctx.config).max_concurrency),
            ctx: args.ctx,
            endpoint: args.endpoint,
            client: args.client,
            report: args.report,
            in_flight: 0,
            waiting: VecDeque::new(),
            warned: Arc::default(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            EndpointWorkerMsg::Deliver { delivery } => state.waiting.push_back(delivery),
            EndpointWorkerMsg::Finished { ok, latency } => {
                state.in_flight = state.in_flight.saturating_sub(1);
                state.limit.record(ok, latency, Instant::now());
            }
        }
        while state.in_flight < state.limit.allowed()
            && let Some(delivery) = state.waiting.pop_front()
        {
            state.in_flight += 1;
            let (ctx, client, warned) = (
                state.ctx.clone(),
                state.client.clone(),
                state.warned.clone(),
            );
            let (report, worker) = (state.report.clone(), myself.clone());
            let endpoint = state.endpoint;
            // The attempt runs beside the mailbox: a hanging receiver holds
            // one slot, not the worker.
            tokio::spawn(async move {
                let started = Instant::now();
                let record = attempt(&ctx, &client, *delivery, &warned).await;
                let _ = worker.cast(EndpointWorkerMsg::Finished {
                    ok: record.outcome == AttemptOutcome::Delivered,
                    latency: started.elapsed(),
                });
                report(endpoint, record);
            });
        }
        Ok(())
    }
}

/// The active secrets of a delivery's endpoint (the previous one while its
/// rotation overlap lasts).
fn secrets(ctx: &Ctx, d: &DueDelivery) -> fastack_core::Result<Vec<Secret>> {
    let key = ctx.keys.webhook_secrets_key();
    let mut out = vec![Secret::open(&key, &d.secrets.current)?];
    if let Some((sealed, until)) = &d.secrets.previous
        && *until > ctx.now()
    {
        out.push(Secret::open(&key, sealed)?);
    }
    Ok(out)
}

/// What a finished request says about the delivery.
fn classify(
    attempt_no: u32,
    result: &Result<reqwest::StatusCode, String>,
    now: chrono::DateTime<chrono::Utc>,
) -> AttemptOutcome {
    let retry_or_fail = || match retry_delay(attempt_no) {
        Some(delay) if attempt_no < MAX_ATTEMPTS => AttemptOutcome::Retry { at: now + delay },
        _ => AttemptOutcome::Failed { disable: None },
    };
    match result {
        Ok(s) if s.is_success() => AttemptOutcome::Delivered,
        Ok(s) if *s == reqwest::StatusCode::NOT_FOUND || *s == reqwest::StatusCode::GONE => {
            AttemptOutcome::Failed {
                disable: Some(format!("receiver answered {s}: endpoint retired")),
            }
        }
        _ => retry_or_fail(),
    }
}

fn error_kind(e: &reqwest::Error) -> &'static str {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<AddressRefused>() {
            return REFUSED_ADDRESS;
        }
        source = err.source();
    }
    if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else {
        "request"
    }
}

/// The error kind of an attempt the address guard refused.
pub const REFUSED_ADDRESS: &str = "refused_address";

/// One attempt of one delivery and what it decided (the dispatcher
/// records it). `warned` is set once the endpoint's first refusal by the
/// address guard was logged.
pub async fn attempt(
    ctx: &Ctx,
    client: &reqwest::Client,
    d: DueDelivery,
    warned: &AtomicBool,
) -> AttemptRecord {
    let attempt_no = d.attempts + 1;
    let started_at = ctx.now();
    let started = Instant::now();
    if attempt_no == 1 {
        let lag = (started_at - d.emitted_at)
            .num_microseconds()
            .unwrap_or(0)
            .max(0);
        ctx.metrics
            .webhook_first_attempt_lag_seconds
            .observe(lag as f64 / 1e6);
    }
    let webhook_id = d.id.webhook_id();
    let result: Result<reqwest::StatusCode, String> = match secrets(ctx, &d) {
        Err(e) => Err(format!("secret:{e}")),
        Ok(secrets) => {
            let literal_forbidden = url::Url::parse(&d.endpoint.url)
                .ok()
                .and_then(|u| {
                    u.host_str()
                        .map(|h| h.trim_matches(|c| c == '[' || c == ']').to_owned())
                })
                .and_then(|h| h.parse::<IpAddr>().ok())
                .is_some_and(|ip| {
                    is_forbidden(ip) && !WebhookSettings::of(&ctx.config).allow_private
                });
            if literal_forbidden {
                Err(REFUSED_ADDRESS.to_owned())
            } else {
                let ts = started_at.timestamp();
                let signature =
                    webhooks::signature_header(&secrets, &webhook_id, ts, d.body.as_bytes());
                client
                    .post(&d.endpoint.url)
                    .header("content-type", "application/json")
                    .header("webhook-id", &webhook_id)
                    .header("webhook-timestamp", ts.to_string())
                    .header("webhook-signature", signature)
                    .header("webhook-event", &d.event_type)
                    .body(d.body.clone())
                    .send()
                    .await
                    .map(|r| r.status())
                    .map_err(|e| error_kind(&e).to_owned())
            }
        }
    };
    if matches!(&result, Err(kind) if kind == REFUSED_ADDRESS)
        && !warned.swap(true, Ordering::Relaxed)
    {
        // Once per endpoint: typically the CLI registered a private address
        // with FASTACK_WEBHOOK_ALLOW_PRIVATE but the server runs without it.
        warn!(
            endpoint = %d.endpoint.id,
            "webhook deliveries refused: the endpoint's address is not globally routable \
             (set FASTACK_WEBHOOK_ALLOW_PRIVATE=true on the server to deliver to private addresses)"
        );
    }
    let latency_ms = started.elapsed().as_millis().min(u32::MAX as u128) as u32;
    let outcome = classify(attempt_no, &result, ctx.now());
    let log = Attempt {
        attempt: attempt_no,
        attempted_at: started_at,
        status_code: result.as_ref().ok().map(|s| s.as_u16()),
        error_kind: match &result {
            Ok(s) if s.is_success() => None,
            Ok(_) => Some("http_status".to_owned()),
            Err(kind) => Some(kind.split(':').next().unwrap_or("request").to_owned()),
        },
        latency_ms,
    };
    debug!(delivery = %webhook_id, attempt = attempt_no, status = ?log.status_code, error = ?log.error_kind, ?outcome, "webhook attempt");
    ctx.metrics
        .webhook_attempts
        .get_or_create(&fastack_core::metrics::OutcomeLabels {
            outcome: match &outcome {
                AttemptOutcome::Delivered => "delivered",
                AttemptOutcome::Retry { .. } => "retry",
                AttemptOutcome::Failed { .. } => "failed",
            },
        })
        .inc();
    if let AttemptOutcome::Failed {
        disable: Some(reason),
    } = &outcome
    {
        warn!(endpoint = %d.endpoint.id, reason, "webhook endpoint disabled");
    }
    AttemptRecord {
        delivery: d.id,
        endpoint: d.endpoint.id,
        attempt: log,
        outcome,
    }
}

/// Deliveries a dispatcher hands one endpoint per unit of its concurrency
/// ceiling before it leaves the rest for later (bounds memory and claim
/// age, and keeps the worker's queue ahead of its slots).
pub const BACKLOG_PER_SLOT: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_follow_the_contract() {
        let now = chrono::Utc::now();
        assert_eq!(
            classify(1, &Ok(reqwest::StatusCode::NO_CONTENT), now),
            AttemptOutcome::Delivered
        );
        assert!(matches!(
            classify(1, &Ok(reqwest::StatusCode::GONE), now),
            AttemptOutcome::Failed { disable: Some(_) }
        ));
        assert!(matches!(
            classify(2, &Ok(reqwest::StatusCode::NOT_FOUND), now),
            AttemptOutcome::Failed { disable: Some(_) }
        ));
        match classify(1, &Ok(reqwest::StatusCode::INTERNAL_SERVER_ERROR), now) {
            AttemptOutcome::Retry { at } => assert!((at - now).num_milliseconds() >= 1_800),
            other => panic!("{other:?}"),
        }
        match classify(2, &Err("timeout".into()), now) {
            AttemptOutcome::Retry { at } => assert!((at - now).num_milliseconds() >= 7_200),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            classify(3, &Ok(reqwest::StatusCode::FOUND), now),
            AttemptOutcome::Failed { disable: None }
        );
    }

    #[test]
    fn the_limit_grows_on_fast_answers_and_halves_on_trouble() {
        let mut l = Limit::new(64);
        let t0 = Instant::now();
        let fast = Duration::from_millis(2);
        assert_eq!(l.allowed(), 4);
        for i in 0..5_000 {
            l.record(true, fast, t0 + Duration::from_millis(i));
        }
        assert_eq!(l.allowed(), 64, "capped at the ceiling");
        // A burst of failures of requests sent together is one cut.
        let t1 = t0 + Duration::from_secs(10);
        for _ in 0..20 {
            l.record(false, fast, t1);
        }
        assert_eq!(l.allowed(), 32);
        l.record(false, fast, t1 + Duration::from_millis(5));
        assert_eq!(l.allowed(), 16);
        // Answers far slower than the endpoint's best count as trouble.
        l.record(
            true,
            Duration::from_millis(500),
            t1 + Duration::from_secs(1),
        );
        assert_eq!(l.allowed(), 8);
        for _ in 0..20 {
            l.record(false, fast, t1 + Duration::from_secs(2 + 1));
            l.last_cut = None;
        }
        assert_eq!(l.allowed(), 1, "never below one");
    }
}
