//! RootActor: the top of a node's supervision tree. Its children come from
//! one table ([`children`]): each is started at boot and, when it fails or
//! stops, started again after a capped backoff. What children share (the
//! ingest queue, the tenant map, signals) lives in [`Ctx`], so a restarted
//! child picks up where the failed one stopped.

use std::{collections::HashMap, sync::Arc};

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use tracing::{error, warn};

pub use crate::child::{ChildSpec, registered_name};
use crate::{
    SHUTDOWN_WAIT,
    clock_watch::ClockWatch,
    context::Ctx,
    dependency_watch::DependencyWatch,
    ingest_writer::{IngestWriterActor, IngestWriterArgs},
    job_runner::{JobRunnerActor, JobRunnerArgs},
    partition_manager::PartitionManager,
    periodic::PeriodicActor,
    plan_refresher::PlanRefresher,
    repairer::Repairer,
    sinks,
    tenant_registry::{TenantRegistryActor, TenantRegistryArgs},
};
use fastack_core::backoff::Backoff;

/// The children of a node's root, in start order.
pub fn children(ctx: &Ctx) -> Vec<ChildSpec> {
    let mut children = vec![
        ChildSpec::new("ingest_writer", |ctx| {
            Some((IngestWriterActor, IngestWriterArgs { ctx }))
        }),
        ChildSpec::new(TENANT_REGISTRY, |ctx| {
            Some((TenantRegistryActor, TenantRegistryArgs { ctx }))
        }),
        ChildSpec::new("job_runner", |ctx| {
            Some((JobRunnerActor, JobRunnerArgs { ctx }))
        }),
        PeriodicActor::child(Repairer),
        PeriodicActor::child(PartitionManager),
        PeriodicActor::child(PlanRefresher),
        PeriodicActor::child(ClockWatch),
        PeriodicActor::child(DependencyWatch::new(&ctx.config)),
    ];
    children.extend(
        sinks::enabled(&ctx.config)
            .into_iter()
            .flat_map(|s| s.children),
    );
    children
}

/// The tenant registry's name (the front door asks it for tenants).
pub const TENANT_REGISTRY: &str = "tenant_registry";

pub struct RootActor;

pub struct RootArgs {
    pub ctx: Arc<Ctx>,
}

pub struct RootState {
    ctx: Arc<Ctx>,
    children: Vec<ChildSpec>,
    /// Running children: actor id → index in `children`.
    running: HashMap<ActorId, usize>,
    backoff: HashMap<usize, Backoff>,
}

/// Messages of the root supervisor.
#[derive(Debug)]
pub enum RootMsg {
    /// (Re)start child `index` of the table (sent after a backoff when it
    /// failed).
    Start { index: usize },
}

impl RootActor {
    async fn start(
        myself: &ActorRef<RootMsg>,
        state: &mut RootState,
        index: usize,
    ) -> Result<(), ActorProcessingErr> {
        let spec = &state.children[index];
        if let Some(cell) = (spec.start)(state.ctx.clone(), myself.get_cell()).await? {
            state.running.insert(cell.get_id(), index);
        }
        state.backoff.entry(index).or_default().started();
        Ok(())
    }

    fn schedule_restart(
        myself: &ActorRef<RootMsg>,
        state: &mut RootState,
        index: usize,
        why: &str,
    ) {
        let child = state.children[index].name.as_str();
        state.ctx.metrics.restarted(child);
        let delay = state.backoff.entry(index).or_default().next_delay();
        warn!(
            child,
            why,
            delay_ms = delay.as_millis() as u64,
            "child stopped, restarting after backoff"
        );
        myself.send_after(delay, move || RootMsg::Start { index });
    }
}

impl Actor for RootActor {
    type Msg = RootMsg;
    type State = RootState;
    type Arguments = RootArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(RootState {
            children: children(&args.ctx),
            ctx: args.ctx,
            running: HashMap::new(),
            backoff: HashMap::new(),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        for index in 0..state.children.len() {
            Self::start(&myself, state, index).await?;
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        _state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        myself
            .stop_children_and_wait(Some("shutdown".to_owned()), Some(SHUTDOWN_WAIT))
            .await;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            RootMsg::Start { index } => {
                if state.running.values().any(|i| *i == index) {
                    return Ok(());
                }
                if let Err(e) = Self::start(&myself, state, index).await {
                    error!(child = state.children[index].name.as_str(), error = %e, "child failed to start");
                    Self::schedule_restart(&myself, state, index, "start failed");
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
        let (cell, why) = match event {
            SupervisionEvent::ActorFailed(cell, err) => (cell, err.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                (cell, reason.unwrap_or_else(|| "terminated".to_owned()))
            }
            _ => return Ok(()),
        };
        if let Some(index) = state.running.remove(&cell.get_id()) {
            Self::schedule_restart(&myself, state, index, &why);
        }
        Ok(())
    }
}
