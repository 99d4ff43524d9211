//! Prometheus metrics of one node. One registry per server instance (no
//! global recorder), so several servers in one test process stay apart.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub route: &'static str,
    pub method: &'static str,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActorLabels {
    pub actor: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SinkLabels {
    pub sink: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

/// Where processing found an identity's contact: `memory` (the node's
/// known contacts) or `database`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResolvedLabels {
    pub from: &'static str,
}

/// Why processing dropped a tenant's event: `suppressed` (its identifier
/// is suppressed) or `erasure` (its person's erasure was running).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PrivacyLabels {
    pub tenant: String,
    pub reason: &'static str,
}

/// A dependency of the node (see `health::Dependency`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DependencyLabels {
    pub dependency: &'static str,
}

fn latency_histogram() -> Histogram {
    // 50 µs .. ~26 s
    Histogram::new(exponential_buckets(0.000_05, 2.0, 20))
}

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub http_requests: Family<HttpLabels, Counter>,
    pub http_duration: Family<HttpLabels, Histogram, fn() -> Histogram>,
    pub events_accepted: Counter,
    pub events_duplicate: Counter,
    pub events_processed: Counter,
    /// Distinct identities of processing rounds, by where their contact
    /// was found (`memory`: the node's known contacts; `database`).
    pub identities_resolved: Family<ResolvedLabels, Counter>,
    pub ingest_queue_depth: Gauge,
    pub inbox_depth: Gauge,
    pub oldest_unprocessed_seconds: Gauge<f64, AtomicU64>,
    pub processing_lag_seconds: Histogram,
    pub group_commit_rows: Histogram,
    pub processing_round_events: Histogram,
    pub group_commit_seconds: Histogram,
    pub active_tenants: Gauge,
    /// Tenant processors alive on this node: one per running tenant,
    /// whatever failed and restarted before.
    pub processors: Gauge,
    pub actor_restarts: Family<ActorLabels, Counter>,
    pub ratelimit_round_trips: Counter,
    pub outbox_depth: Family<SinkLabels, Gauge>,
    pub sink_lag_seconds: Family<SinkLabels, Gauge>,
    /// Counters a part of the node declares for itself (a sink's, by
    /// [`CounterSpec`]), by name.
    declared: std::collections::HashMap<&'static str, Counter>,
    pub events_repaired: Counter,
    pub webhook_attempts: Family<OutcomeLabels, Counter>,
    pub webhook_first_attempt_lag_seconds: Histogram,
    pub quarantined_events: Counter,
    pub privacy_dropped_events: Family<PrivacyLabels, Counter>,
    pub group_commit_splits: Counter,
    pub ingest_deadline_missed: Counter,
    pub requests_refused: Family<OutcomeLabels, Counter>,
    pub dependency_up: Family<DependencyLabels, Gauge>,
    pub data_dir_free_bytes: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// A counter a part of the node declares where it is written (a sink's
/// file), registered with the node's metrics when they are made:
/// `fastack_<name>_total`.
#[derive(Clone, Copy, Debug)]
pub struct CounterSpec {
    pub name: &'static str,
    pub help: &'static str,
}

impl Metrics {
    pub fn new() -> Self {
        Self::with_counters(&[])
    }

    /// The node's metrics, with the counters its parts declare.
    pub fn with_counters(specs: &[CounterSpec]) -> Self {
        let mut registry = Registry::with_prefix("fastack");
        let mut declared = std::collections::HashMap::new();
        for spec in specs {
            let counter: &Counter = declared.entry(spec.name).or_default();
            registry.register(spec.name, spec.help, counter.clone());
        }
        let http_requests = Family::<HttpLabels, Counter>::default();
        let http_duration =
            Family::<HttpLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram,
            );
        let events_accepted = Counter::default();
        let events_duplicate = Counter::default();
        let events_processed = Counter::default();
        let identities_resolved = Family::<ResolvedLabels, Counter>::default();
        let ingest_queue_depth = Gauge::default();
        let inbox_depth = Gauge::default();
        let oldest_unprocessed_seconds = Gauge::<f64, AtomicU64>::default();
        let processing_lag_seconds = latency_histogram();
        let group_commit_rows = Histogram::new(exponential_buckets(1.0, 2.0, 14));
        let processing_round_events = Histogram::new(exponential_buckets(1.0, 2.0, 14));
        let group_commit_seconds = latency_histogram();
        let active_tenants = Gauge::default();
        let processors = Gauge::default();
        let actor_restarts = Family::<ActorLabels, Counter>::default();
        let ratelimit_round_trips = Counter::default();
        registry.register(
            "ratelimit_redis_round_trips",
            "rate-limit decisions that went to Redis (the rest were served from leased tokens)",
            ratelimit_round_trips.clone(),
        );
        let outbox_depth = Family::<SinkLabels, Gauge>::default();
        let sink_lag_seconds = Family::<SinkLabels, Gauge>::default();
        registry.register(
            "sink_lag_seconds",
            "how long the oldest event a sink still owes has waited (0: it owes none)",
            sink_lag_seconds.clone(),
        );
        let events_repaired = Counter::default();
        let webhook_attempts = Family::<OutcomeLabels, Counter>::default();
        let webhook_first_attempt_lag_seconds = latency_histogram();
        registry.register(
            "webhook_attempts",
            "webhook delivery attempts by outcome (delivered, retry, failed)",
            webhook_attempts.clone(),
        );
        registry.register(
            "webhook_first_attempt_lag_seconds",
            "time from the outbox row to a delivery's first attempt",
            webhook_first_attempt_lag_seconds.clone(),
        );
        registry.register(
            "outbox_depth",
            "events each sink still owes in the outbox",
            outbox_depth.clone(),
        );
        registry.register(
            "events_repaired",
            "terminal events re-emitted by the repairer",
            events_repaired.clone(),
        );
        registry.register(
            "http_requests",
            "HTTP requests by route, method and status",
            http_requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency by route, method and status",
            http_duration.clone(),
        );
        registry.register(
            "events_accepted",
            "events durably accepted (202, new)",
            events_accepted.clone(),
        );
        registry.register(
            "events_duplicate",
            "events answered as duplicates of an earlier idempotency key",
            events_duplicate.clone(),
        );
        registry.register(
            "events_processed",
            "events appended to tracked_events",
            events_processed.clone(),
        );
        registry.register(
            "identities_resolved",
            "distinct user and anonymous ids of processing rounds, by where their contact was found (memory: the node's known contacts; database: looked up)",
            identities_resolved.clone(),
        );
        registry.register(
            "ingest_queue_depth",
            "requests waiting for the next group commit",
            ingest_queue_depth.clone(),
        );
        registry.register(
            "inbox_depth",
            "accepted events not yet processed (all nodes)",
            inbox_depth.clone(),
        );
        registry.register(
            "oldest_unprocessed_seconds",
            "age of the oldest accepted but unprocessed event",
            oldest_unprocessed_seconds.clone(),
        );
        registry.register(
            "processing_lag_seconds",
            "time from 202 to the event being stored",
            processing_lag_seconds.clone(),
        );
        registry.register(
            "group_commit_rows",
            "rows per ingest group commit",
            group_commit_rows.clone(),
        );
        registry.register(
            "processing_round_events",
            "events each committed processing round consumed (its count: rounds, each one transaction)",
            processing_round_events.clone(),
        );
        registry.register(
            "group_commit_seconds",
            "duration of an ingest group commit",
            group_commit_seconds.clone(),
        );
        registry.register(
            "active_tenants",
            "tenants with running actors on this node",
            active_tenants.clone(),
        );
        registry.register(
            "processors",
            "tenant processors alive on this node (one per running tenant)",
            processors.clone(),
        );
        registry.register(
            "actor_restarts",
            "children restarted by their supervisor after a failure",
            actor_restarts.clone(),
        );
        let quarantined_events = Counter::default();
        registry.register(
            "quarantined_events",
            "accepted events moved to quarantine after failing processing repeatedly",
            quarantined_events.clone(),
        );
        let privacy_dropped_events = Family::<PrivacyLabels, Counter>::default();
        registry.register(
            "privacy_dropped_events",
            "accepted events processing dropped before storing or sending them: their identifier is suppressed, or their person's erasure was running",
            privacy_dropped_events.clone(),
        );
        let ingest_deadline_missed = Counter::default();
        registry.register(
            "ingest_deadline_missed",
            "requests answered 503 because the event store did not commit them within the answer budget",
            ingest_deadline_missed.clone(),
        );
        let group_commit_splits = Counter::default();
        registry.register(
            "group_commit_splits",
            "group commits split in two to isolate a request the database refused",
            group_commit_splits.clone(),
        );
        let requests_refused = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "requests_refused",
            "requests or connections refused before reaching a handler, by reason \
             (unauthenticated_limit, header_timeout, connection_cap, address_guard)",
            requests_refused.clone(),
        );
        let dependency_up = Family::<DependencyLabels, Gauge>::default();
        registry.register(
            "dependency_up",
            "whether each dependency of the node works (1) or is down (0): database, \
             object_storage, lake, amqp, redis, disk; /readyz says why",
            dependency_up.clone(),
        );
        let data_dir_free_bytes = Gauge::default();
        registry.register(
            "data_dir_free_bytes",
            "free bytes on the disk holding the data directory",
            data_dir_free_bytes.clone(),
        );
        Metrics {
            registry,
            dependency_up,
            data_dir_free_bytes,
            quarantined_events,
            privacy_dropped_events,
            group_commit_splits,
            ingest_deadline_missed,
            requests_refused,
            http_requests,
            http_duration,
            events_accepted,
            events_duplicate,
            events_processed,
            identities_resolved,
            ingest_queue_depth,
            inbox_depth,
            oldest_unprocessed_seconds,
            processing_lag_seconds,
            group_commit_rows,
            processing_round_events,
            group_commit_seconds,
            active_tenants,
            processors,
            actor_restarts,
            ratelimit_round_trips,
            outbox_depth,
            sink_lag_seconds,
            declared,
            events_repaired,
            webhook_attempts,
            webhook_first_attempt_lag_seconds,
        }
    }

    /// A declared counter ([`CounterSpec`]); `None` when nothing declared
    /// it (its part is off on this node).
    pub fn counter(&self, name: &str) -> Option<&Counter> {
        self.declared.get(name)
    }

    pub fn refused(&self, outcome: &'static str) {
        self.requests_refused
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    pub fn restarted(&self, actor: &str) {
        self.actor_restarts
            .get_or_create(&ActorLabels {
                actor: actor.to_owned(),
            })
            .inc();
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// One in a gauge for as long as it is held: dropped however its holder
/// ends (an actor's state is dropped when it stops, fails or is killed).
pub struct Held(Gauge);

impl Held {
    pub fn new(gauge: &Gauge) -> Held {
        gauge.inc();
        Held(gauge.clone())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.dec();
    }
}
