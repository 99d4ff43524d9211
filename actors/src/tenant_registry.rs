//! TenantRegistryActor: starts a TenantSupervisor per active tenant (lazily,
//! on the first request, or when the backlog scan finds rows nobody on this
//! node is processing), restarts failed ones with backoff, and forgets
//! tenants whose supervisor stopped because they went idle.

use std::{collections::HashMap, sync::Arc};

use fastack_entities::{Tenant, TenantId};
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::{
    SHUTDOWN_WAIT,
    context::{Ctx, TenantShared},
    tenant_supervisor::{TenantSupervisorActor, TenantSupervisorArgs},
};
use fastack_core::backoff::Backoff;

pub struct TenantRegistryActor;

pub struct TenantRegistryArgs {
    pub ctx: Arc<Ctx>,
}

/// Inbox gauges are refreshed on every this-many backlog scans.
const STATS_EVERY: u64 = 5;

pub struct TenantRegistryState {
    ctx: Arc<Ctx>,
    running: HashMap<ActorId, TenantId>,
    backoff: HashMap<TenantId, Backoff>,
    /// Backlog scans so far; the inbox gauges are refreshed every
    /// [`STATS_EVERY`]th one.
    scans: u64,
    scanner: Option<JoinHandle<()>>,
}

/// Messages of the tenant registry.
#[derive(Debug)]
pub enum TenantRegistryMsg {
    /// Returns the tenant's shared state, starting its actors if needed.
    Ensure {
        tenant: Tenant,
        reply: RpcReplyPort<Arc<TenantShared>>,
    },
    /// Periodic: start tenants with unprocessed inbox rows; update gauges.
    ScanBacklog,
    /// Start a tenant's supervisor again after it failed.
    Restart { tenant: TenantId },
}

impl TenantRegistryActor {
    async fn start_tenant(
        myself: &ActorRef<TenantRegistryMsg>,
        state: &mut TenantRegistryState,
        shared: Arc<TenantShared>,
    ) -> Result<(), ActorProcessingErr> {
        let id = shared.tenant().id;
        let (sup, _) = Actor::spawn_linked(
            None,
            TenantSupervisorActor,
            TenantSupervisorArgs {
                ctx: state.ctx.clone(),
                shared: shared.clone(),
            },
            myself.get_cell(),
        )
        .await?;
        state.backoff.entry(id).or_default().started();
        state.running.insert(sup.get_id(), id);
        state.ctx.tenants.insert(id, shared);
        state
            .ctx
            .metrics
            .active_tenants
            .set(state.running.len() as i64);
        Ok(())
    }

    async fn ensure(
        myself: &ActorRef<TenantRegistryMsg>,
        state: &mut TenantRegistryState,
        tenant: Tenant,
    ) -> Result<Arc<TenantShared>, ActorProcessingErr> {
        if let Some(shared) = state.ctx.tenants.get(&tenant.id) {
            return Ok(shared.clone());
        }
        let shared = Arc::new(TenantShared::new(tenant));
        Self::start_tenant(myself, state, shared.clone()).await?;
        Ok(shared)
    }
}

impl Actor for TenantRegistryActor {
    type Msg = TenantRegistryMsg;
    type State = TenantRegistryState;
    type Arguments = TenantRegistryArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(TenantRegistryState {
            ctx: args.ctx,
            running: HashMap::new(),
            backoff: HashMap::new(),
            scans: 0,
            scanner: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // After a registry restart, supervisors of the failed registry may
        // still run without a parent: stop them and start afresh, so a
        // tenant never has two processors on one node.
        for entry in state.ctx.tenants.iter() {
            entry.value().stop_supervisor("tenant registry restarted");
        }
        state.ctx.tenants.clear();
        let every = state.ctx.config.poll_interval;
        state.scanner = Some(myself.send_interval(every, || TenantRegistryMsg::ScanBacklog));
        myself.send_message(TenantRegistryMsg::ScanBacklog)?;
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(t) = state.scanner.take() {
            t.abort();
        }
        myself
            .stop_children_and_wait(Some("shutdown".to_owned()), Some(SHUTDOWN_WAIT))
            .await;
        state.ctx.tenants.clear();
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            TenantRegistryMsg::Ensure { tenant, reply } => {
                let shared = Self::ensure(&myself, state, tenant).await?;
                let _ = reply.send(shared);
            }
            TenantRegistryMsg::ScanBacklog => {
                let ctx = state.ctx.clone();
                // The gauges count the whole inbox (a heap scan), so they are
                // refreshed less often than the backlog is looked at.
                if state.scans % STATS_EVERY == 0 {
                    match ctx.store.processing().inbox_stats().await {
                        Ok((depth, oldest)) => {
                            ctx.metrics.inbox_depth.set(depth);
                            let age = oldest
                                .map(|t| (ctx.now() - t).num_milliseconds().max(0) as f64 / 1000.0)
                                .unwrap_or(0.0);
                            ctx.metrics.oldest_unprocessed_seconds.set(age);
                        }
                        Err(error) => warn!(%error, "inbox statistics failed"),
                    }
                }
                state.scans += 1;
                // An accept-only node leaves the backlog to others.
                if !ctx.config.processing {
                    return Ok(());
                }
                let tenants = match ctx.store.processing().backlog_tenants(10_000).await {
                    Ok(t) => t,
                    Err(error) => {
                        warn!(%error, "backlog scan failed");
                        return Ok(());
                    }
                };
                for id in tenants {
                    if let Some(shared) = ctx.tenants.get(&id) {
                        shared.wake();
                        continue;
                    }
                    match ctx.store.tenants().get(id).await {
                        Ok(Some(tenant)) => {
                            let shared = Self::ensure(&myself, state, tenant).await?;
                            shared.wake();
                        }
                        Ok(None) => warn!(tenant = %id, "inbox rows of an unknown tenant"),
                        Err(error) => warn!(tenant = %id, %error, "could not load tenant"),
                    }
                }
            }
            TenantRegistryMsg::Restart { tenant } => {
                if let Some(shared) = state.ctx.tenants.get(&tenant).map(|s| s.clone())
                    && !state.running.values().any(|t| *t == tenant)
                {
                    Self::start_tenant(&myself, state, shared).await?;
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                if let Some(tenant) = state.running.remove(&cell.get_id()) {
                    state.ctx.tenants.remove(&tenant);
                    state.backoff.remove(&tenant);
                    info!(%tenant, ?reason, "tenant actors stopped");
                }
            }
            SupervisionEvent::ActorFailed(cell, error) => {
                if let Some(tenant) = state.running.remove(&cell.get_id()) {
                    state.ctx.metrics.restarted("tenant_supervisor");
                    let delay = state.backoff.entry(tenant).or_default().next_delay();
                    warn!(%tenant, %error, delay_ms = delay.as_millis() as u64, "tenant supervisor failed, restarting");
                    myself.send_after(delay, move || TenantRegistryMsg::Restart { tenant });
                }
            }
            _ => {}
        }
        state
            .ctx
            .metrics
            .active_tenants
            .set(state.running.len() as i64);
        Ok(())
    }
}
