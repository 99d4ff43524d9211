//! An event written for its sinks, in the transaction that writes it: the
//! webhook fan-out's deliveries and the outbox rows every relayed sink is
//! owed. Whoever writes events for their sinks (processing, a job's end, the
//! repair of a lost terminal event, an erasure's own event) asks for both
//! here; the outbox's write knows nothing of the fan-out.

use super::{
    Emit,
    db::Tx,
    deliveries,
    outbox::{self, Entry},
};
use crate::error::Result;

/// What [`write`] wrote.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Written {
    /// Outbox rows owed to sinks woken at commit (a grouped sink, which
    /// flushes by size or age, is not).
    pub outboxed: usize,
    /// Webhook deliveries (the fan-out).
    pub deliveries: usize,
}

/// Writes `entries` for the sinks of `emit` in the caller's transaction:
/// the fan-out's deliveries when it takes them, and the outbox rows owed to
/// every relayed sink.
pub(crate) async fn write(tx: &mut Tx<'_>, entries: Vec<Entry>, emit: &Emit) -> Result<Written> {
    let deliveries = if emit.fans_out() {
        deliveries::fan_out_entries(tx, &entries).await?
    } else {
        0
    };
    let outboxed = outbox::write(tx, entries, emit).await?;
    Ok(Written {
        outboxed,
        deliveries,
    })
}
