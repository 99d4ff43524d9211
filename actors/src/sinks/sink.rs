//! The trait every sink implements, and what it declares and answers:
//! kept apart from the sinks' registry so the relay that drives a sink
//! imports the trait alone.

use std::time::Duration;

use async_trait::async_trait;
use fastack_core::{
    Config, erasure,
    health::Dependency,
    metrics::CounterSpec,
    objects::Objects,
    settings::Extension,
    store::{OutboxBatch, OutboxRow, SinkName, Storage, TimeRange},
};
use fastack_entities::{Job, TenantId};
use serde_json::Value;

use crate::{child::ChildSpec, context::Ctx};

/// Which `core.event.tracked` events a sink takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tracked {
    /// Every one (a stream).
    Every,
    /// Those of tenants with an enabled endpoint subscribed to them, as the
    /// endpoints are when the event is processed.
    WhenSubscribed,
}

/// Files of events a sink keeps (a lake): checked at start and watched for
/// `/readyz` as the `lake` dependency, and reached by an erasure.
pub struct Lake {
    pub objects: Objects,
    /// The settings that point at it, named by every error about it.
    pub settings: &'static str,
    /// How an erasure rewrites its files.
    pub files: Box<dyn erasure::Lake>,
}

/// What a sink's probe at start found of its link (a broker): a node
/// whose probe failed does not start, and names the dependency's settings.
pub struct Probe {
    /// The dependency it reports under (`/readyz`, `fastack_dependency_up`).
    pub dependency: Dependency,
    /// Where it is, without credentials.
    pub location: String,
    pub result: Result<(), String>,
}

/// What a `backfill` job asks of its sink: a tenant's stored events of a
/// range, written where the sink would have written them.
#[derive(Clone, Debug)]
pub struct BackfillRequest {
    pub tenant: TenantId,
    pub range: TimeRange,
    /// Replace what the sink holds for the range instead of adding to it.
    pub rewrite: bool,
}

/// A sink's backfill: the `backfill` job's work for it.
#[async_trait]
pub trait Backfill: Send + Sync {
    /// The unit its progress counts (`hours`).
    fn unit(&self) -> &'static str;

    /// Runs the job; the result becomes the job's.
    async fn run(
        &self,
        store: &Storage,
        config: &Config,
        job: &Job,
        request: &BackfillRequest,
        progress: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<Value, String>;

    /// One line saying what a completed run did (the CLI prints it).
    fn summary(&self, result: &Value) -> String;
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

/// A sink: what it takes, when a node runs it, and how it sends. Its file
/// declares everything about it (settings, counters, backfill, lake); the
/// registry (`sinks/mod.rs`) lists it once.
#[async_trait]
pub trait Sink: Send + Sync + Sized + 'static {
    /// The name outbox rows owe it under.
    const NAME: SinkName;
    /// Takes jobs' terminal events (and `core.contact.erased`).
    const JOBS: bool;
    /// Which tracked events it takes.
    const TRACKED: Tracked;
    /// Its settings, declared in its file with `fastack_core::settings!`
    /// and loaded, documented and checked with the rest.
    const SETTINGS: Option<Extension> = None;
    /// Its `backfill` job's work, where it has one.
    const BACKFILL: Option<&'static dyn Backfill> = None;
    /// Rows per batch.
    const BATCH: u32 = 500;
    /// Owed one outbox row per writing transaction, holding its events'
    /// records one after another (`store::records_in` reads them), instead
    /// of a row per event: a row (and its claim, completion and delete) per commit
    /// rather than per event. For a sink that only takes whole batches
    /// ([`Sink::batches`]) and reads every event of a row.
    const GROUPED: bool = false;
    /// The counters it keeps, registered with the node's metrics when the
    /// sink is on (`Metrics::counter` finds them by name).
    const COUNTERS: &'static [CounterSpec] = &[];

    /// Whether a node with this configuration runs it.
    fn on(config: &Config) -> bool;

    /// Checks its settings together, before a node binds anything: an
    /// error names the settings to fix.
    fn check(_config: &Config) -> fastack_core::Result<()> {
        Ok(())
    }

    /// Probes its link before a node serves, when it is on and has one.
    async fn probe(_config: &Config) -> Option<Probe> {
        None
    }

    /// The sink of a node it is on for (`None`: it cannot start, and said
    /// why in the log).
    fn open(ctx: &Ctx) -> Option<Self>;

    /// The actors it runs beside its relay, under the root (webhooks: the
    /// dispatcher that delivers what the fan-out created).
    fn workers() -> Vec<ChildSpec> {
        Vec::new()
    }

    /// The files of events it keeps, when it is on and keeps some.
    fn lake(_config: &Config) -> Option<fastack_core::Result<Lake>> {
        None
    }

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
