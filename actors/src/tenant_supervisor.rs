//! TenantSupervisorActor: one per active tenant on this node. It manages the
//! tenant's shared state (rate limit cells, idempotency cache, processing
//! mailbox flag), supervises the tenant's processor with capped backoff and
//! stops itself when the tenant has been idle for a while (memory stays
//! bounded with many tenants; the registry starts it again on demand).

use std::{sync::Arc, time::Duration};

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::{
    SHUTDOWN_WAIT,
    context::{Ctx, TenantShared},
    processor::{ProcessorActor, ProcessorArgs, ProcessorMsg},
};
use fastack_core::backoff::Backoff;

pub struct TenantSupervisorActor;

pub struct TenantSupervisorArgs {
    pub ctx: Arc<Ctx>,
    pub shared: Arc<TenantShared>,
}

pub struct TenantSupervisorState {
    ctx: Arc<Ctx>,
    shared: Arc<TenantShared>,
    processor: Option<ActorRef<ProcessorMsg>>,
    backoff: Backoff,
    timers: Vec<JoinHandle<()>>,
}

/// Messages of a tenant supervisor.
#[derive(Debug)]
pub enum TenantSupervisorMsg {
    /// Inbox rows are waiting: poke the processor.
    Wake,
    /// Periodic: stop when idle long enough.
    IdleCheck,
    /// Periodic: reload the tenant row (plan or retention changes).
    Refresh,
    /// Start the processor again after a failure (sent after a backoff).
    RestartProcessor,
}

impl TenantSupervisorActor {
    async fn spawn_processor(
        myself: &ActorRef<TenantSupervisorMsg>,
        state: &mut TenantSupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let (processor, _) = Actor::spawn_linked(
            None,
            ProcessorActor,
            ProcessorArgs {
                ctx: state.ctx.clone(),
                shared: state.shared.clone(),
            },
            myself.get_cell(),
        )
        .await?;
        state.backoff.started();
        state.processor = Some(processor);
        Ok(())
    }
}

impl Actor for TenantSupervisorActor {
    type Msg = TenantSupervisorMsg;
    type State = TenantSupervisorState;
    type Arguments = TenantSupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let cell = myself.get_cell();
        args.shared
            .set_supervisor(Some(Box::new(move |reason| cell.stop(Some(reason)))));
        Ok(TenantSupervisorState {
            ctx: args.ctx,
            shared: args.shared,
            processor: None,
            backoff: Backoff::default(),
            timers: Vec::new(),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if state.ctx.config.processing {
            Self::spawn_processor(&myself, state).await?;
        }
        let idle_every = state
            .ctx
            .config
            .tenant_idle
            .min(Duration::from_secs(30))
            .max(Duration::from_millis(100));
        state
            .timers
            .push(myself.send_interval(idle_every, || TenantSupervisorMsg::IdleCheck));
        state
            .timers
            .push(myself.send_interval(Duration::from_secs(30), || TenantSupervisorMsg::Refresh));
        state.timers.push(
            state
                .shared
                .work
                .forward(myself.clone(), || TenantSupervisorMsg::Wake),
        );
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        for t in state.timers.drain(..) {
            t.abort();
        }
        // The processor releases the lease as it stops.
        myself
            .stop_children_and_wait(Some("tenant stopping".to_owned()), Some(SHUTDOWN_WAIT))
            .await;
        state.shared.set_supervisor(None);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            TenantSupervisorMsg::Wake => {
                if let Some(p) = &state.processor {
                    let _ = p.cast(ProcessorMsg::Work);
                }
            }
            TenantSupervisorMsg::IdleCheck => {
                let idle = Duration::from_millis(state.shared.idle_ms().max(0) as u64);
                if idle >= state.ctx.config.tenant_idle {
                    info!(tenant = %state.shared.tenant().id, idle_s = idle.as_secs(), "tenant idle, stopping its actors");
                    myself.stop(Some("idle".to_owned()));
                }
            }
            TenantSupervisorMsg::Refresh => {
                let id = state.shared.tenant().id;
                match state.ctx.store.tenants().get(id).await {
                    Ok(Some(t)) => state.shared.set_tenant(t),
                    Ok(None) => warn!(tenant = %id, "tenant vanished from storage"),
                    Err(error) => warn!(tenant = %id, %error, "could not refresh tenant"),
                }
            }
            TenantSupervisorMsg::RestartProcessor => {
                if state.processor.is_none() && state.ctx.config.processing {
                    Self::spawn_processor(&myself, state).await?;
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
        let is_processor = |cell: &ractor::ActorCell| {
            state
                .processor
                .as_ref()
                .is_some_and(|p| p.get_id() == cell.get_id())
        };
        match event {
            SupervisionEvent::ActorFailed(cell, error) if is_processor(&cell) => {
                state.processor = None;
                state.ctx.metrics.restarted("processor");
                let delay = state.backoff.next_delay();
                warn!(
                    tenant = %state.shared.tenant().id,
                    %error,
                    attempt = state.backoff.attempts(),
                    delay_ms = delay.as_millis() as u64,
                    "processor failed, restarting after backoff"
                );
                myself.send_after(delay, || TenantSupervisorMsg::RestartProcessor);
            }
            SupervisionEvent::ActorTerminated(cell, _, reason) if is_processor(&cell) => {
                state.processor = None;
                info!(tenant = %state.shared.tenant().id, ?reason, "processor stopped");
            }
            _ => {}
        }
        Ok(())
    }
}
