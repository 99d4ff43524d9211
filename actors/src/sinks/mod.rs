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
