//! Outbound sinks: what takes outbox rows out of a node. Each sink is one
//! file implementing [`Sink`], driven by the one relay actor type
//! ([`relay::RelayActor`]): claim the rows the sink owes, send them,
//! complete what it took and give back the rest. A sink that reports its
//! link down is reconnected after a capped backoff.
//!
//! Adding a sink: a file here implementing [`Sink`], and a line in
//! [`enabled`]. Outbox rows then record it by name; no migration. A sink
//! that writes files says so with [`Sink::batches`]: it is then sent named
//! batches that come back whole after a crash.

pub mod amqp;
pub mod mirror;
pub mod relay;
pub mod sink;
pub mod webhooks;

use fastack_core::{
    Config,
    metrics::CounterSpec,
    store::{Emit, SinkName},
};

pub use crate::routing::Routing;
use crate::{child::ChildSpec, context::Ctx};
use relay::RelayActor;
pub use sink::{Flush, Sent, Sink};

/// Which `core.event.tracked` events a sink takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tracked {
    /// Every one (a stream).
    Every,
    /// Those of tenants with an enabled endpoint subscribed to them, as the
    /// endpoints are when the event is processed.
    WhenSubscribed,
}

/// A sink a node runs, with what it takes.
pub struct SinkSpec {
    pub name: SinkName,
    /// Takes jobs' terminal events.
    pub jobs: bool,
    pub tracked: Tracked,
    /// Owed grouped rows ([`Sink::GROUPED`]).
    pub grouped: bool,
    /// Its counters ([`Sink::COUNTERS`]).
    pub counters: &'static [CounterSpec],
    /// Starts its relay under the root.
    pub child: ChildSpec,
}

impl SinkSpec {
    fn of<S: Sink>(jobs: bool, tracked: Tracked, make: fn(&Ctx) -> Option<S>) -> SinkSpec {
        SinkSpec {
            name: S::NAME,
            jobs,
            tracked,
            grouped: S::GROUPED,
            counters: S::COUNTERS,
            child: RelayActor::<S>::child(make),
        }
    }
}

/// The sinks of a node with this configuration.
pub fn enabled(config: &Config) -> Vec<SinkSpec> {
    let mut sinks = vec![SinkSpec::of(
        true,
        Tracked::WhenSubscribed,
        webhooks::WebhookSink::new,
    )];
    if config.amqp_url.is_some() {
        sinks.push(SinkSpec::of(true, Tracked::Every, amqp::AmqpSink::new));
    }
    if config.mirror_url.is_some() {
        sinks.push(SinkSpec::of(false, Tracked::Every, mirror::MirrorSink::new));
    }
    sinks
}

/// The counters of the sinks of a node with this configuration.
pub fn counters(config: &Config) -> Vec<CounterSpec> {
    enabled(config)
        .iter()
        .flat_map(|s| s.counters.iter().copied())
        .collect()
}

impl Routing {
    pub fn of(sinks: &[SinkSpec]) -> Routing {
        let grouped = sinks.iter().filter(|s| s.grouped).map(|s| s.name);
        let pick = |f: &dyn Fn(&SinkSpec) -> bool| {
            Emit::to(sinks.iter().filter(|s| f(s)).map(|s| s.name)).grouping(grouped.clone())
        };
        Routing {
            jobs: pick(&|s| s.jobs),
            erased: pick(&|s| s.jobs),
            tracked: pick(&|s| s.tracked == Tracked::Every),
            tracked_if_subscribed: pick(&|s| s.tracked == Tracked::WhenSubscribed),
        }
    }

    /// For a configuration (the CLI finishing jobs outside a node).
    pub fn for_config(config: &Config) -> Routing {
        Routing::of(&enabled(config))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use fastack_core::metrics::{
        DependencyLabels, HttpLabels, Metrics, OutcomeLabels, PrivacyLabels, SinkLabels,
    };

    use super::*;

    /// `docs/metrics.md`: exposed name -> (type, label names).
    fn documented() -> BTreeMap<String, (String, Vec<String>)> {
        include_str!("../../../docs/metrics.md")
            .lines()
            .filter(|l| l.starts_with("| `fastack_"))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let labels = cells[3]
                    .split(',')
                    .map(|s| s.trim().trim_matches('`').to_owned())
                    .filter(|s| !s.is_empty() && s != "—")
                    .collect();
                (
                    cells[1].trim_matches('`').to_owned(),
                    (cells[2].to_owned(), labels),
                )
            })
            .collect()
    }

    /// Every metric a node can expose (every sink on) is in
    /// `docs/metrics.md`, and nothing else is.
    #[test]
    fn the_documented_metrics_are_the_exposed_ones() {
        let config = Config {
            amqp_url: Some("amqp://localhost".to_owned()),
            mirror_url: Some("file:///lake".to_owned()),
            ..Config::default()
        };
        let declared = counters(&config);
        let m = Metrics::with_counters(&declared);
        // One sample in every labelled family, so each is exposed.
        let http = HttpLabels {
            route: "/v1/core/track",
            method: "POST",
            status: 202,
        };
        m.http_requests.get_or_create(&http).inc();
        m.http_duration.get_or_create(&http).observe(0.001);
        m.restarted("processor");
        m.outbox_depth
            .get_or_create(&SinkLabels { sink: "amqp" })
            .set(1);
        m.sink_lag_seconds
            .get_or_create(&SinkLabels { sink: "amqp" })
            .set(1);
        m.webhook_attempts
            .get_or_create(&OutcomeLabels {
                outcome: "delivered",
            })
            .inc();
        m.privacy_dropped_events
            .get_or_create(&PrivacyLabels {
                tenant: "t".to_owned(),
                reason: "suppressed",
            })
            .inc();
        m.refused("connection_cap");
        m.dependency_up
            .get_or_create(&DependencyLabels {
                dependency: "database",
            })
            .set(1);
        let text = m.render();
        let mut exposed: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                let name = if kind == "counter" {
                    format!("{name}_total")
                } else {
                    name.to_owned()
                };
                exposed.insert(name, (kind.to_owned(), Vec::new()));
            }
        }
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, labels)) = line.split_once('{') else {
                continue;
            };
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| series.strip_suffix(s))
                .filter(|f| exposed.contains_key(*f))
                .unwrap_or(series);
            let names: Vec<String> = labels
                .split("\",")
                .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.trim().to_owned()))
                .filter(|k| k != "le")
                .collect();
            if let Some((_, seen)) = exposed.get_mut(family)
                && seen.is_empty()
            {
                *seen = names;
            }
        }
        let documented = documented();
        // A family added without a sample above would not be exposed here:
        // every registration is documented.
        // The node's own registrations (less the one that registers the
        // declared counters) and the sinks' counters.
        assert_eq!(
            include_str!("../../../core/src/metrics.rs")
                .matches("registry.register(")
                .count()
                - 1
                + declared.len(),
            documented.len(),
            "a registered metric is missing from docs/metrics.md (or from this test's samples)"
        );
        assert_eq!(
            documented.keys().collect::<Vec<_>>(),
            exposed.keys().collect::<Vec<_>>(),
            "docs/metrics.md lists other metrics than /metrics exposes"
        );
        for (name, (kind, labels)) in &exposed {
            let (doc_kind, doc_labels) = &documented[name];
            assert_eq!(doc_kind, kind, "{name}: type");
            let (mut a, mut b) = (doc_labels.clone(), labels.clone());
            a.sort();
            b.sort();
            assert_eq!(a, b, "{name}: labels");
        }
    }
}
