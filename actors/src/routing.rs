//! Who takes what, as outbox rows are written: the sinks of jobs' terminal
//! events and of `core.event.tracked`. Filled from the node's sinks (the
//! sinks module); data only, so the shared context holds it without
//! importing the sinks.

use fastack_core::store::Emit;

/// Who takes what, as outbox rows are written.
#[derive(Clone, Debug, Default)]
pub struct Routing {
    /// Jobs' terminal events.
    pub jobs: Emit,
    /// Every `core.event.tracked`.
    pub tracked: Emit,
    /// `core.event.tracked` of tenants whose endpoints subscribe to it.
    pub tracked_if_subscribed: Emit,
    /// `core.contact.erased`: the sinks of jobs' events (the streams and
    /// the webhook fan-out), never a sink that takes only tracked events.
    pub erased: Emit,
}
