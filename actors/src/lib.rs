//! fastack's supervision tree (ractor):
//!
//! ```text
//! Root
//! ├── IngestWriter          group commit of accepted events
//! ├── TenantRegistry ── TenantSupervisor(tenant) ── Processor(tenant)
//! ├── PartitionManager      partitions ahead, retention jobs scheduled
//! ├── JobRunner             exports and retention archives
//! ├── OutboxRelay           outbox → RabbitMQ, publisher confirms (with AMQP)
//! ├── Repairer              re-emits terminal events still marked pending
//! └── WebhookDispatcher ── EndpointWorker(endpoint)   retries at ~2 s and ~8 s
//! ```
//!
//! [`Runtime`] is the handle the HTTP layer holds: it finds a tenant's
//! shared state without a message round trip and submits rows to the group
//! commit.

pub mod backoff;
pub mod context;
pub mod endpoint_worker;
pub mod error;
pub mod ingest_writer;
pub mod job_runner;
pub mod outbox_relay;
pub mod partition_manager;
pub mod processor;
pub mod repairer;
pub mod root;
pub mod tenant_registry;
pub mod tenant_supervisor;
pub mod webhook_dispatcher;

use std::sync::Arc;

use dashmap::DashMap;
use fastack_core::{
    Config, amqp::Emitter, clock::SharedClock, crypto::Keys, metrics::Metrics, objects::Objects,
    ratelimit::RedisLimiter, store::Store,
};
use fastack_entities::Tenant;
use parking_lot::RwLock;
use ractor::{Actor, ActorRef};
use tokio::task::JoinHandle;

pub use context::{Ctx, TenantShared};
pub use error::{Error, Result};
pub use ingest_writer::{IngestError, IngestQueue, ItemOutcome};

use crate::{
    root::{RootActor, RootArgs, RootMsg},
    tenant_registry::TenantRegistryMsg,
};

/// Requests allowed to wait for a group commit before callers are pushed
/// back on.
const INGEST_QUEUE_CAPACITY: usize = 65_536;

/// How long a supervisor waits for its children to stop.
pub(crate) const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

pub struct Runtime {
    ctx: Arc<Ctx>,
    root: ActorRef<RootMsg>,
    root_task: parking_lot::Mutex<Option<JoinHandle<()>>>,
}

impl Runtime {
    pub async fn start(
        config: Config,
        store: Store,
        clock: SharedClock,
        metrics: Arc<Metrics>,
        redis_limiter: Option<RedisLimiter>,
        keys: Keys,
        objects: Objects,
        faults: fastack_core::faults::SharedFaults,
    ) -> Result<Self> {
        let ingest = IngestQueue::new(INGEST_QUEUE_CAPACITY, config.ingest_split_rows);
        let emitter = config.amqp_url.as_ref().map(|_| Emitter {
            source: config.cloudevents_source.clone().unwrap_or_default(),
            job_exchange: config.job_events_exchange.clone(),
            core_exchange: config.core_events_exchange.clone(),
            single_tenant: config.single_tenant,
            signing_key: keys.deployment_hmac(),
        });
        let ctx = Arc::new(Ctx {
            node_id: config.node_id,
            config,
            store,
            clock,
            metrics,
            redis_limiter,
            tenants: DashMap::new(),
            registry: RwLock::new(None),
            ingest,
            keys,
            objects,
            emitter,
            relay: RwLock::new(None),
            job_runner: RwLock::new(None),
            partition_manager: RwLock::new(None),
            webhooks: RwLock::new(None),
            idempotency: context::IdempotencyCache::default(),
            faults,
        });
        let (root, root_task) = Actor::spawn(None, RootActor, RootArgs { ctx: ctx.clone() })
            .await
            .map_err(|source| Error::Spawn {
                actor: "root",
                source,
            })?;
        Ok(Runtime {
            ctx,
            root,
            root_task: parking_lot::Mutex::new(Some(root_task)),
        })
    }

    pub fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    /// The tenant's running shared state, starting its actors if needed.
    pub async fn tenant(&self, tenant: &Tenant) -> Result<Arc<TenantShared>> {
        if let Some(shared) = self.ctx.tenants.get(&tenant.id) {
            shared.touch();
            return Ok(shared.clone());
        }
        let registry = self.ctx.registry.read().clone().ok_or(Error::Unavailable {
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
        self.root.stop(Some("shutdown".to_owned()));
        let task = self.root_task.lock().take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}
