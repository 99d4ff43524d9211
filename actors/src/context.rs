//! What every actor of a node shares: configuration, storage, clock,
//! metrics, the rate limiter backend, the tenant map (read by the front
//! door without a message round trip), who takes outbox rows, and the
//! signals actors raise for each other. No actor's type is known here:
//! actors reach each other through [`Signals`], never through references
//! kept in the context.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicI64, Ordering},
};

use dashmap::DashMap;
use fastack_core::{
    Config, clock::SharedClock, crypto::Keys, metrics::Metrics, objects::Objects,
    ratelimit::LocalCells, ratelimit::RedisLimiter, store::Store,
};
use fastack_entities::{EventId, NodeId, Tenant, TenantId};
use parking_lot::{Mutex, RwLock};

use crate::{
    ingest_queue::IngestQueue,
    routing::Routing,
    signal::{Signal, Signals},
};

pub struct Ctx {
    pub config: Config,
    pub store: Store,
    pub clock: SharedClock,
    pub metrics: Arc<Metrics>,
    pub redis_limiter: Option<RedisLimiter>,
    pub node_id: NodeId,
    /// Running tenants: the front door's lock-free lookup.
    pub tenants: DashMap<TenantId, Arc<TenantShared>>,
    /// The ingest queue: it outlives writer restarts (the mailbox is kept).
    pub ingest: IngestQueue,
    pub keys: Keys,
    pub objects: Objects,
    /// Which sinks take jobs' and events' outbox rows.
    pub routing: Routing,
    pub signals: Signals,
    pub idempotency: IdempotencyCache,
    /// Every tenant's tracking plan in force on this node.
    pub plans: Arc<fastack_core::taxonomy::Plans>,
    /// Faults a test armed (see `fastack_core::faults`); none in production.
    pub faults: fastack_core::faults::SharedFaults,
    /// How each dependency is doing (`/readyz`).
    pub health: Arc<fastack_core::health::Health>,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("node_id", &self.node_id)
            .finish()
    }
}

impl Ctx {
    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.clock.now()
    }

    /// Tells a tenant's processor that new inbox rows are waiting.
    pub fn wake(&self, tenant: TenantId) {
        if let Some(shared) = self.tenants.get(&tenant) {
            shared.wake();
        }
    }
}

/// Per-tenant state shared between the tenant's actors and the front door.
/// Created by the registry, managed by the tenant's supervisor; it survives
/// supervisor and processor restarts.
pub struct TenantShared {
    tenant: RwLock<Tenant>,
    /// In-process rate limit cells (embedded mode).
    pub limits: LocalCells,
    pending: AtomicBool,
    last_activity_ms: AtomicI64,
    /// Raised when work is pending; the tenant's supervisor listens.
    pub(crate) work: Signal,
    /// Stops the tenant's supervisor, while one runs (set by it).
    stop: Mutex<Option<Stop>>,
}

/// Stops a running actor, with a reason for its log (the context holds no
/// actor handle).
pub type Stop = Box<dyn FnOnce(String) + Send>;

impl std::fmt::Debug for TenantShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantShared")
            .field("tenant", &self.tenant.read().id)
            .finish()
    }
}

/// Keys the node remembers across all tenants: the cache's memory does not
/// grow with the number of tenants (measured: ~280 MiB for 1M keys over
/// 1,000 tenants with per-tenant caches, bounded now).
pub const IDEMPOTENCY_CACHE_ENTRIES: usize = 100_000;

/// Recently committed idempotency keys of every tenant: answers most
/// duplicates (retries come within seconds) without a database round trip.
/// The storage fence stays the source of truth, so eviction only costs a
/// round trip.
pub struct IdempotencyCache {
    inner: quick_cache::sync::Cache<(TenantId, String), (EventId, [u8; 32])>,
}

impl Default for IdempotencyCache {
    fn default() -> Self {
        IdempotencyCache {
            inner: quick_cache::sync::Cache::new(IDEMPOTENCY_CACHE_ENTRIES),
        }
    }
}

/// A borrowed `(tenant, key)`: looks a key up without allocating it. Hashes
/// exactly like the owned tuple (fields in order, `str` as `String` does).
#[derive(Hash)]
struct KeyRef<'a>(TenantId, &'a str);

impl quick_cache::Equivalent<(TenantId, String)> for KeyRef<'_> {
    fn equivalent(&self, key: &(TenantId, String)) -> bool {
        self.0 == key.0 && self.1 == key.1
    }
}

impl IdempotencyCache {
    pub fn get(&self, tenant: TenantId, key: &str) -> Option<(EventId, [u8; 32])> {
        self.inner.get(&KeyRef(tenant, key))
    }

    pub fn insert(&self, tenant: TenantId, key: String, value: (EventId, [u8; 32])) {
        self.inner.insert((tenant, key), value);
    }
}

impl TenantShared {
    pub fn new(tenant: Tenant) -> Self {
        TenantShared {
            tenant: RwLock::new(tenant),
            limits: LocalCells::default(),
            pending: AtomicBool::new(false),
            last_activity_ms: AtomicI64::new(now_ms()),
            work: Signal::default(),
            stop: Mutex::new(None),
        }
    }

    pub fn tenant(&self) -> Tenant {
        self.tenant.read().clone()
    }

    pub fn set_tenant(&self, tenant: Tenant) {
        *self.tenant.write() = tenant;
    }

    pub fn touch(&self) {
        self.last_activity_ms.store(now_ms(), Ordering::Relaxed);
    }

    pub fn idle_ms(&self) -> i64 {
        now_ms() - self.last_activity_ms.load(Ordering::Relaxed)
    }

    /// How to stop the tenant's supervisor while it runs (`None` once it
    /// stopped).
    pub(crate) fn set_supervisor(&self, stop: Option<Stop>) {
        *self.stop.lock() = stop;
    }

    /// Stops the tenant's supervisor, if one runs.
    pub(crate) fn stop_supervisor(&self, reason: &str) {
        if let Some(stop) = self.stop.lock().take() {
            stop(reason.to_owned());
        }
    }

    /// Marks work pending; only the first wake after a drain sends a message.
    pub fn wake(&self) {
        self.touch();
        if !self.pending.swap(true, Ordering::AcqRel) {
            self.work.raise();
        }
    }

    /// Clears the pending flag; returns whether it was set.
    pub(crate) fn take_pending(&self) -> bool {
        self.pending.swap(false, Ordering::AcqRel)
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_cache_finds_owned_keys_by_borrowed_ones() {
        let cache = IdempotencyCache::default();
        let (a, b) = (TenantId::new(), TenantId::new());
        let id = EventId::new();
        cache.insert(a, "order-1".to_owned(), (id, [7; 32]));
        assert_eq!(cache.get(a, "order-1"), Some((id, [7; 32])));
        assert_eq!(cache.get(a, "order-2"), None);
        assert_eq!(cache.get(b, "order-1"), None, "keys are per tenant");
    }
}
