//! The trait every sink implements, and what it answers: kept apart from
//! the sinks' registry so the relay that drives a sink imports the trait
//! alone.

use std::time::Duration;

use async_trait::async_trait;
use fastack_core::{
    metrics::CounterSpec,
    store::{OutboxBatch, OutboxRow, SinkName},
};

use crate::context::Ctx;

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
    /// Owed one outbox row per writing transaction, holding its events'
    /// records one after another (`store::records_in` reads them), instead
    /// of a row per event: a row (and its claim, completion and delete) per commit
    /// rather than per event. For a sink that only takes whole batches
    /// ([`Sink::batches`]) and reads every event of a row.
    const GROUPED: bool = false;
    /// The counters it keeps, registered with the node's metrics when the
    /// sink is on (`Metrics::counter` finds them by name).
    const COUNTERS: &'static [CounterSpec] = &[];

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
