//! RootActor: the top of a node's supervision tree. It starts the ingest
//! writer and the tenant registry and restarts either with capped backoff
//! when it fails. The ingest queue and the tenant map live in [`Ctx`], so a
//! restarted child picks up where the failed one stopped.

use std::{collections::HashMap, sync::Arc};

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use tracing::{error, warn};

use crate::{
    SHUTDOWN_WAIT,
    backoff::Backoff,
    context::Ctx,
    ingest_writer::{IngestWriterActor, IngestWriterArgs},
    job_runner::{JobRunnerActor, JobRunnerArgs},
    outbox_relay::{OutboxRelayActor, OutboxRelayArgs},
    partition_manager::{PartitionManagerActor, PartitionManagerArgs},
    repairer::{RepairerActor, RepairerArgs},
    tenant_registry::{TenantRegistryActor, TenantRegistryArgs},
    webhook_dispatcher::{WebhookDispatcherActor, WebhookDispatcherArgs},
};

pub struct RootActor;

pub struct RootArgs {
    pub ctx: Arc<Ctx>,
}

/// The children of the root.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Child {
    IngestWriter,
    TenantRegistry,
    JobRunner,
    OutboxRelay,
    Repairer,
    PartitionManager,
    WebhookDispatcher,
}

impl Child {
    fn name(&self) -> &'static str {
        match self {
            Child::IngestWriter => "ingest_writer",
            Child::TenantRegistry => "tenant_registry",
            Child::JobRunner => "job_runner",
            Child::OutboxRelay => "outbox_relay",
            Child::Repairer => "repairer",
            Child::PartitionManager => "partition_manager",
            Child::WebhookDispatcher => "webhook_dispatcher",
        }
    }
}

pub struct RootState {
    ctx: Arc<Ctx>,
    children: HashMap<ActorId, Child>,
    backoff: HashMap<Child, Backoff>,
}

/// Messages of the root supervisor.
#[derive(Debug)]
pub enum RootMsg {
    /// (Re)start a child (sent after a backoff when it failed).
    Start { child: Child },
}

impl RootActor {
    async fn start(
        myself: &ActorRef<RootMsg>,
        state: &mut RootState,
        child: Child,
    ) -> Result<(), ActorProcessingErr> {
        let cell = myself.get_cell();
        let id = match child {
            Child::IngestWriter => {
                let (r, _) = Actor::spawn_linked(
                    None,
                    IngestWriterActor,
                    IngestWriterArgs {
                        ctx: state.ctx.clone(),
                    },
                    cell,
                )
                .await?;
                r.get_id()
            }
            Child::TenantRegistry => {
                let (r, _) = Actor::spawn_linked(
                    None,
                    TenantRegistryActor,
                    TenantRegistryArgs {
                        ctx: state.ctx.clone(),
                    },
                    cell,
                )
                .await?;
                *state.ctx.registry.write() = Some(r.clone());
                r.get_id()
            }
            Child::JobRunner => {
                let (r, _) = Actor::spawn_linked(
                    None,
                    JobRunnerActor,
                    JobRunnerArgs {
                        ctx: state.ctx.clone(),
                    },
                    cell,
                )
                .await?;
                r.get_id()
            }
            Child::OutboxRelay => {
                let (Some(emitter), Some(url)) =
                    (state.ctx.emitter.clone(), state.ctx.config.amqp_url.clone())
                else {
                    return Ok(());
                };
                let (r, _) = Actor::spawn_linked(
                    None,
                    OutboxRelayActor,
                    OutboxRelayArgs {
                        ctx: state.ctx.clone(),
                        emitter,
                        amqp_url: url,
                    },
                    cell,
                )
                .await?;
                r.get_id()
            }
            Child::Repairer => {
                let (r, _) = Actor::spawn_linked(
                    None,
                    RepairerActor,
                    RepairerArgs {
                        ctx: state.ctx.clone(),
                    },
                    cell,
                )
                .await?;
                r.get_id()
            }
            Child::WebhookDispatcher => {
                let (r, _) = Actor::spawn_linked(
                    None,
                    WebhookDispatcherActor,
                    WebhookDispatcherArgs {
                        ctx: state.ctx.clone(),
                    },
                    cell,
                )
                .await?;
                r.get_id()
            }
            Child::PartitionManager => {
                let (r, _) = Actor::spawn_linked(
                    None,
                    PartitionManagerActor,
                    PartitionManagerArgs {
                        ctx: state.ctx.clone(),
                    },
                    cell,
                )
                .await?;
                r.get_id()
            }
        };
        state.backoff.entry(child).or_default().started();
        state.children.insert(id, child);
        Ok(())
    }

    fn schedule_restart(
        myself: &ActorRef<RootMsg>,
        state: &mut RootState,
        child: Child,
        why: &str,
    ) {
        if child == Child::TenantRegistry {
            *state.ctx.registry.write() = None;
        }
        state.ctx.metrics.restarted(child.name());
        let delay = state.backoff.entry(child).or_default().next_delay();
        warn!(
            ?child,
            why,
            delay_ms = delay.as_millis() as u64,
            "child stopped, restarting after backoff"
        );
        myself.send_after(delay, move || RootMsg::Start { child });
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
            ctx: args.ctx,
            children: HashMap::new(),
            backoff: HashMap::new(),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        for child in [
            Child::IngestWriter,
            Child::TenantRegistry,
            Child::JobRunner,
            Child::OutboxRelay,
            Child::Repairer,
            Child::PartitionManager,
            Child::WebhookDispatcher,
        ] {
            Self::start(&myself, state, child).await?;
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
            RootMsg::Start { child } => {
                if state.children.values().any(|c| *c == child) {
                    return Ok(());
                }
                if let Err(e) = Self::start(&myself, state, child).await {
                    error!(?child, error = %e, "child failed to start");
                    Self::schedule_restart(&myself, state, child, "start failed");
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
            SupervisionEvent::ActorFailed(cell, err) => {
                if let Some(child) = state.children.remove(&cell.get_id()) {
                    Self::schedule_restart(&myself, state, child, &err.to_string());
                }
            }
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                if let Some(child) = state.children.remove(&cell.get_id()) {
                    let why = reason.unwrap_or_else(|| "terminated".to_owned());
                    Self::schedule_restart(&myself, state, child, &why);
                }
            }
            _ => {}
        }
        Ok(())
    }
}
