//! Outbound sinks: what takes outbox rows out of a node. Each sink is one
//! file implementing [`Sink`], driven by the one relay actor type
//! ([`crate::relay::RelayActor`]): claim the rows the sink owes, send them,
//! complete what it took and give back the rest. A sink that reports its
//! link down is reconnected after a capped backoff.
//!
//! Adding a sink: a file here implementing [`Sink`], and a line in
//! [`enabled`]. Outbox rows then record it by name; no migration. A sink
//! that writes files says so with [`Sink::batches`]: it is then sent named
//! batches that come back whole after a crash.

pub mod amqp;
pub mod mirror;
pub mod webhooks;

use std::time::Duration;

use async_trait::async_trait;
use fastack_core::{
    Config,
    store::{Emit, OutboxBatch, OutboxRow, SinkName},
};

use crate::{context::Ctx, relay::RelayActor, root::ChildSpec};

/// Which `core.event.tracked` events a sink takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tracked {
    /// Every one (a stream).
    Every,
    /// Those of tenants with an enabled endpoint subscribed to them, as the
    /// endpoints are when the event is processed.
    WhenSubscribed,
}

/// What sending a batch did.
#[derive(Debug, Default)]
pub struct Sent {
    /// Rows the sink took: they no longer owe it.
    pub done: Vec<i64>,
    /// Rows to offer again at once.
    pub retry: Vec<i64>,
    /// The sink's link broke (why): the relay reconnects after a backoff.
    pub down: Option<String>,
}

/// When a batching sink is sent its next batch: once `rows` are owed, or
/// the oldest owed row has waited `age`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flush {
    pub rows: u32,
    pub age: Duration,
}

#[async_trait]
pub trait Sink: Send + Sync + 'static {
    /// The name outbox rows owe it under.
    const NAME: SinkName;
    /// Rows per batch.
    const BATCH: u32 = 500;

    /// How often the relay looks without being signalled.
    fn interval(&self) -> Duration;

    /// `Some` for a sink that writes files: it is sent named batches
    /// ([`Sink::send_batch`]) when this says, each claimed again whole, under
    /// its name, if it is not completed.
    fn batches(&self) -> Option<Flush> {
        None
    }

    /// How long a claim lasts: what one send may take before another relay
    /// may take the same rows.
    fn claim_for(&self) -> Duration {
        Duration::from_secs(30)
    }

    /// Opens what the sink needs (a broker connection). Called before the
    /// first batch, and again after the sink reported its link down.
    async fn connect(&mut self, _ctx: &Ctx) -> Result<(), String> {
        Ok(())
    }

    /// Sends a batch of rows (oldest first) and says what became of each.
    async fn send(&mut self, ctx: &Ctx, rows: &[OutboxRow]) -> Sent;

    /// Sends a named batch (a sink whose [`Sink::batches`] is `Some`): all
    /// its rows done, or all offered again.
    async fn send_batch(&mut self, ctx: &Ctx, batch: &OutboxBatch) -> Sent {
        self.send(ctx, &batch.rows).await
    }

    /// Closes the link, at shutdown.
    async fn close(&mut self) {}
}

/// A sink a node runs, with what it takes.
pub struct SinkSpec {
    pub name: SinkName,
    /// Takes jobs' terminal events.
    pub jobs: bool,
    pub tracked: Tracked,
    /// Starts its relay under the root.
    pub child: ChildSpec,
}

impl SinkSpec {
    fn of<S: Sink>(jobs: bool, tracked: Tracked, make: fn(&Ctx) -> Option<S>) -> SinkSpec {
        SinkSpec {
            name: S::NAME,
            jobs,
            tracked,
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

/// Who takes what, as outbox rows are written.
#[derive(Clone, Debug, Default)]
pub struct Routing {
    /// Jobs' terminal events.
    pub jobs: Emit,
    /// Every `core.event.tracked`.
    pub tracked: Emit,
    /// `core.event.tracked` of tenants whose endpoints subscribe to it.
    pub tracked_if_subscribed: Emit,
}

impl Routing {
    pub fn of(sinks: &[SinkSpec]) -> Routing {
        let pick =
            |f: &dyn Fn(&SinkSpec) -> bool| Emit::to(sinks.iter().filter(|s| f(s)).map(|s| s.name));
        Routing {
            jobs: pick(&|s| s.jobs),
            tracked: pick(&|s| s.tracked == Tracked::Every),
            tracked_if_subscribed: pick(&|s| s.tracked == Tracked::WhenSubscribed),
        }
    }

    /// For a configuration (the CLI finishing jobs outside a node).
    pub fn for_config(config: &Config) -> Routing {
        Routing::of(&enabled(config))
    }
}
