//! What the HTTP handlers share.

use std::sync::Arc;

use fastack_actors::Runtime;
use fastack_core::{
    Config, auth::KeyCache, clock::SharedClock, metrics::Metrics, ratelimit::ClientLimiter,
    store::Store,
};

pub struct AppState {
    pub config: Config,
    /// Budget of requests without a valid key, per client address.
    pub unauthenticated: ClientLimiter,
    /// Methods per documented path (the `Allow` header of a 405).
    pub allow: crate::gate::AllowIndex,
    pub store: Store,
    pub runtime: Runtime,
    pub keys: KeyCache,
    pub metrics: Arc<Metrics>,
    pub clock: SharedClock,
}

pub type SharedState = Arc<AppState>;
