//! fastack's supervision tree (ractor):
//!
//! ```text
//! Root (children from one table, root.rs)
//! ├── IngestWriter                  group commit of accepted events
//! ├── TenantRegistry ── TenantSupervisor(tenant) ── Processor(tenant)
//! ├── JobRunner                     exports, retention archives, erasures, sinks' backfills
//! ├── Periodic<Repairer>            re-emits terminal events still marked pending
//! ├── Periodic<PartitionManager>    partitions ahead, retention jobs scheduled
//! ├── Periodic<PlanRefresher>       tracking plans installed on any node, in force here
//! ├── Periodic<ClockWatch>          warns while the machine's clock moved from the node's
//! ├── Periodic<DependencyWatch>     dependencies checked for /readyz
//! └── Relay<Sink>, one per sink on  each sink a file of sinks/, listed once in
//!     and the sink's workers        sinks::SINKS: webhooks (fan-out to deliveries;
//!                                   its worker WebhookDispatcher ── EndpointWorker),
//!                                   amqp (RabbitMQ, publisher confirms), the
//!                                   Parquet lake's
//! ```
//!
//! Actors do not hold each other's references: they raise [`Signal`]s
//! (new outbox rows, new deliveries, a job queued), and the front door
//! finds the tenant registry by its registered name.
//!
//! [`Runtime`] is the handle the HTTP layer holds: [`Runtime::open`] wires a
//! node (storage opened and migrated, an empty database
//! bootstrapped, keys, object storage, Redis, the tree started); the handle
//! finds a tenant's shared state without a message round trip and submits
//! rows to the group commit.

pub mod child;
pub mod clock_watch;
pub mod context;
pub mod dependency_watch;
pub mod error;
pub mod ingest_queue;
pub mod ingest_writer;
pub mod job_runner;
pub mod node;
pub mod partition_manager;
pub mod periodic;
pub mod plan_refresher;
pub mod processor;
pub mod repairer;
pub mod root;
pub mod routing;
pub mod service;
pub mod signal;
pub mod sinks;
pub mod tenant_registry;
pub mod tenant_supervisor;

use std::sync::Arc;

use dashmap::DashMap;
use fastack_core::{
    Config,
    clock::SharedClock,
    health::{self, Dependency, Health},
    metrics::Metrics,
    objects::Objects,
    ratelimit::{Decision, Quota, RedisLimiter},
    store::{IngestRow, Store},
};
use fastack_entities::{ApiKeyId, EventId, Tenant, TenantId};
use ractor::{Actor, ActorRef};
use tokio::task::JoinHandle;

pub use context::{Ctx, TenantShared};
pub use error::{Error, Result};
pub use ingest_writer::{IngestError, IngestQueue, ItemOutcome};
pub use node::{NodeParts, Opening};
pub use service::Service;
pub use signal::{Signal, Signals};

use crate::{
    root::{RootActor, RootArgs, RootMsg, TENANT_REGISTRY, registered_name},
    tenant_registry::TenantRegistryMsg,
};

/// Requests allowed to wait for a group commit before callers are pushed
/// back on.
const INGEST_QUEUE_CAPACITY: usize = 65_536;

/// How long a supervisor waits for its children to stop.
pub(crate) const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

pub struct Runtime {
    ctx: Arc<Ctx>,
    /// The operations front ends call (the runtime derefs to it).
    service: service::Service,
    root: ActorRef<RootMsg>,
    root_task: parking_lot::Mutex<Option<JoinHandle<()>>>,
    /// Forwards other nodes' outbox notifications to the relays.
    notified: Option<JoinHandle<()>>,
}

/// The operations of [`service::Service`] are the runtime's: front ends
/// call `runtime.list_tenants()` and the like, and hold no store.
impl std::ops::Deref for Runtime {
    type Target = service::Service;

    fn deref(&self) -> &service::Service {
        &self.service
    }
}

/// What a caller may inject when opening a node (tests: a manual clock,
/// object storage with faults, storage faults).
pub struct RuntimeOptions {
    pub clock: SharedClock,
    pub objects: Option<Objects>,
    pub faults: fastack_core::faults::SharedFaults,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            clock: fastack_core::clock::system(),
            objects: None,
            faults: fastack_core::faults::Faults::new(),
        }
    }
}

/// What a node checks before it serves, so that a misconfiguration fails
/// the start with the setting named instead of the first job hours later:
/// object storage (a probe object written, read back and deleted), the
/// lake's storage when a sink keeping one is on, each sink's link (RabbitMQ:
/// connected, exchanges declared) and the data directory's disk.
async fn check_at_start(config: &Config, health: &Health, objects: &Objects) -> Result<()> {
    let node = config.node_id.to_string();
    health::probe_objects(objects, &node)
        .await
        .map_err(|e| health::unusable(Dependency::ObjectStorage, &objects.location, e))?;
    health.up(Dependency::ObjectStorage, Some(objects.location.clone()));
    if let Some(lake) = sinks::lake(config) {
        let lake = lake?;
        let dep = Dependency::Lake(lake.settings);
        health::probe_objects(&lake.objects, &node)
            .await
            .map_err(|e| health::unusable(dep, &lake.objects.location, e))?;
        health.up(dep, Some(lake.objects.location.clone()));
    }
    for probe in sinks::probes(config).await {
        probe
            .result
            .map_err(|e| health::unusable(probe.dependency, &probe.location, e))?;
        health.up(probe.dependency, None);
    }
    dependency_watch::disk(config, health);
    Ok(())
}

impl Runtime {
    /// Opens storage (migrating it), bootstraps an empty database (tenant
    /// `default`, its key written to the data directory), makes
    /// sure the partition window exists, connects Redis when configured and
    /// starts the tree.
    pub async fn open(config: &Config, options: RuntimeOptions) -> Result<Self> {
        let parts = NodeParts::open(config, Opening::Serve, &options).await?;
        let metrics = Arc::new(Metrics::with_counters(&sinks::counters(config)));
        let health = Arc::new(Health::new(&metrics));
        let redis_limiter = match &config.redis_url {
            Some(url) => {
                let limiter = RedisLimiter::connect(
                    url,
                    &config.redis_prefix,
                    metrics.ratelimit_round_trips.clone(),
                )
                .await
                .map_err(|e| {
                    health::unusable(Dependency::Redis, &health::without_credentials(url), e)
                })?;
                limiter.ping().await.map_err(|e| {
                    health::unusable(Dependency::Redis, &health::without_credentials(url), e)
                })?;
                health.up(Dependency::Redis, None);
                Some(limiter)
            }
            None => None,
        };
        check_at_start(config, &health, &parts.objects).await?;
        Self::start(parts, metrics, health, redis_limiter, options.faults).await
    }

    /// The node's storage, for tests that inspect what it holds (the front
    /// ends use the operations of [`service`]).
    #[doc(hidden)]
    pub fn store_for_tests(&self) -> &Store {
        &self.ctx.store
    }

    /// The node's metrics registry.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.ctx.metrics
    }

    /// The node's clock.
    pub fn clock(&self) -> &SharedClock {
        &self.ctx.clock
    }

    async fn start(
        parts: NodeParts,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
        redis_limiter: Option<RedisLimiter>,
        faults: fastack_core::faults::SharedFaults,
    ) -> Result<Self> {
        let service_parts = parts.clone();
        let NodeParts {
            config,
            store,
            keys,
            objects,
            clock,
            routing,
        } = parts;
        let ingest = IngestQueue::new(INGEST_QUEUE_CAPACITY, config.ingest_split_rows);
        let ctx = Arc::new(Ctx {
            node_id: config.node_id,
            config,
            store,
            clock,
            metrics,
            redis_limiter,
            tenants: DashMap::new(),
            ingest,
            keys,
            objects,
            routing,
            signals: Signals::default(),
            idempotency: context::IdempotencyCache::default(),
            plans: Arc::default(),
            faults,
            health,
        });
        // A node enforces the plans in force from its first request.
        ctx.plans.refresh(ctx.store.as_ref()).await?;
        // Outbox rows other nodes commit wake this node's relays too.
        let notified = match ctx.store.outbox().notifications().await? {
            Some(mut rx) => {
                let outbox = ctx.signals.outbox.clone();
                Some(tokio::spawn(async move {
                    while rx.recv().await.is_some() {
                        outbox.raise();
                    }
                }))
            }
            None => None,
        };
        let (root, root_task) = Actor::spawn(None, RootActor, RootArgs { ctx: ctx.clone() })
            .await
            .map_err(|source| Error::Spawn {
                actor: "root",
                source,
            })?;
        Ok(Runtime {
            service: service::Service::serving(service_parts, ctx.clone()),
            ctx,
            root,
            root_task: parking_lot::Mutex::new(Some(root_task)),
            notified,
        })
    }

    /// Queues accepted rows for the group commit; answers once they are
    /// durable (or refused), or `Unavailable` with nothing stored once
    /// `deadline` has passed (see [`ingest_writer::COMMIT_GRACE`]).
    pub async fn submit(
        &self,
        rows: Vec<IngestRow>,
        deadline: std::time::Instant,
    ) -> ingest_writer::IngestReply {
        self.ctx.ingest.submit(rows, deadline).await
    }

    /// Requests waiting for the group commit (metric).
    pub fn ingest_depth(&self) -> usize {
        self.ctx.ingest.depth()
    }

    /// A key the tenant used recently: the event it answered and its
    /// fingerprint (the storage fence stays the source of truth).
    pub fn recent_key(&self, tenant: TenantId, key: &str) -> Option<(EventId, [u8; 32])> {
        self.ctx.idempotency.get(tenant, key)
    }

    /// Takes one request out of the tenant's budget (and the key's): in
    /// Redis, shared by every node, when configured — falling back to this
    /// node's cells if Redis does not answer — else in this node's cells.
    pub async fn rate_limit(
        &self,
        shared: &TenantShared,
        tenant_q: Quota,
        key_q: Option<(ApiKeyId, Quota)>,
    ) -> Decision {
        let tenant = shared.tenant().id;
        match &self.ctx.redis_limiter {
            Some(redis) => match redis.check(tenant, tenant_q, key_q).await {
                Ok(d) => d,
                Err(error) => {
                    tracing::warn!(%error, %tenant, "rate limiter unavailable, letting the request through");
                    shared.limits.check(tenant_q, key_q)
                }
            },
            None => shared.limits.check(tenant_q, key_q),
        }
    }

    /// How each dependency is doing (`/readyz`).
    pub fn health(&self) -> &Health {
        &self.ctx.health
    }

    /// Runs partition maintenance now (tests that move the clock).
    pub fn maintain_partitions(&self) {
        self.ctx.signals.partitions.raise();
    }

    /// Every tenant's tracking plan in force on this node.
    pub fn plans(&self) -> &fastack_core::taxonomy::Plans {
        &self.ctx.plans
    }

    /// The tenant's shared state if its actors run on this node (the
    /// common case: no wait, see [`Runtime::tenant`]).
    pub fn running_tenant(&self, tenant: TenantId) -> Option<Arc<TenantShared>> {
        let shared = self.ctx.tenants.get(&tenant)?;
        shared.touch();
        Some(shared.clone())
    }

    /// The tenant's running shared state, starting its actors if needed.
    pub async fn tenant(&self, tenant: &Tenant) -> Result<Arc<TenantShared>> {
        if let Some(shared) = self.running_tenant(tenant.id) {
            return Ok(shared);
        }
        let registry =
            ActorRef::<TenantRegistryMsg>::where_is(registered_name(TENANT_REGISTRY, &self.ctx))
                .ok_or(Error::Unavailable {
                    actor: "tenant registry",
                })?;
        let tenant = tenant.clone();
        let shared = ractor::call!(registry, |reply| TenantRegistryMsg::Ensure {
            tenant,
            reply
        })
        .map_err(|_| Error::Unavailable {
            actor: "tenant registry",
        })?;
        shared.touch();
        Ok(shared)
    }

    /// Stops the tree, leaves first: processors release their leases.
    pub async fn shutdown(&self) {
        if let Some(task) = &self.notified {
            task.abort();
        }
        self.root.stop(Some("shutdown".to_owned()));
        let task = self.root_task.lock().take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}
