//! OutboxRelayActor: publishes outbox rows to RabbitMQ as signed CloudEvents.
//!
//! Rows are claimed (`FOR UPDATE SKIP LOCKED` with a claim expiry, so
//! several nodes relay without double work and a dead relay's rows come
//! back), published persistent and `mandatory` with publisher confirms
//! pipelined (all publishes of a batch go out before the first confirm is
//! awaited), and only confirmed rows are cleared — with the job's pending
//! marker — in one transaction. A broker outage only delays: unconfirmed
//! rows are released and the relay reconnects with capped backoff.

use std::{sync::Arc, time::Duration};

use chrono::Duration as ChronoDuration;
use fastack_core::amqp::{Emitter, declare_exchange};
use lapin::{
    Channel, Confirmation, Connection, ConnectionProperties,
    options::{BasicPublishOptions, ConfirmSelectOptions},
};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::{backoff::Backoff, context::Ctx};

/// Rows per publish round.
const BATCH: u32 = 500;

pub struct OutboxRelayActor;

pub struct OutboxRelayArgs {
    pub ctx: Arc<Ctx>,
    pub emitter: Emitter,
    pub amqp_url: String,
}

pub struct OutboxRelayState {
    ctx: Arc<Ctx>,
    emitter: Emitter,
    amqp_url: String,
    link: Option<(Connection, Channel)>,
    backoff: Backoff,
    /// A reconnect is scheduled: pumps wait for it.
    reconnecting: bool,
    ticker: Option<JoinHandle<()>>,
}

/// Messages of the outbox relay.
#[derive(Debug)]
pub enum OutboxRelayMsg {
    /// Publish whatever is waiting.
    Pump,
    /// (Re)connect to the broker (sent after a backoff).
    Connect,
}

impl OutboxRelayActor {
    async fn connect(state: &mut OutboxRelayState) -> Result<(), lapin::Error> {
        let conn = Connection::connect(&state.amqp_url, ConnectionProperties::default()).await?;
        let channel = conn.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        for exchange in [&state.emitter.job_exchange, &state.emitter.core_exchange] {
            declare_exchange(&channel, exchange).await?;
        }
        state.link = Some((conn, channel));
        Ok(())
    }

    fn drop_link(myself: &ActorRef<OutboxRelayMsg>, state: &mut OutboxRelayState, why: &str) {
        state.link = None;
        if !state.reconnecting {
            state.reconnecting = true;
            let delay = state.backoff.next_delay();
            warn!(
                why,
                delay_ms = delay.as_millis() as u64,
                "amqp link down, reconnecting after backoff"
            );
            myself.send_after(delay, || OutboxRelayMsg::Connect);
        }
    }

    /// One round: claim, publish all, await confirms, clear the confirmed.
    /// Returns how many rows were claimed.
    async fn pump(
        myself: &ActorRef<OutboxRelayMsg>,
        state: &mut OutboxRelayState,
    ) -> Result<usize, ActorProcessingErr> {
        let Some(channel) = state.link.as_ref().map(|(_, c)| c.clone()) else {
            return Ok(0);
        };
        let ctx = state.ctx.clone();
        let rows = ctx
            .store
            .claim_outbox(ctx.now(), ChronoDuration::seconds(30), BATCH)
            .await?;
        if rows.is_empty() {
            return Ok(0);
        }
        let now = ctx.now();
        let mut pending = Vec::with_capacity(rows.len());
        let mut failed: Vec<i64> = Vec::new();
        let mut link_error: Option<String> = None;
        for row in &rows {
            if link_error.is_some() {
                failed.push(row.id);
                continue;
            }
            let (exchange, message) = match state.emitter.message(row, now) {
                Ok(m) => m,
                Err(error) => {
                    warn!(outbox = row.id, %error, "cannot encode outbox row");
                    failed.push(row.id);
                    continue;
                }
            };
            match channel
                .basic_publish(
                    exchange.as_str().into(),
                    row.routing_key.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    },
                    &message.body,
                    message.properties(),
                )
                .await
            {
                Ok(confirm) => pending.push((row.id, confirm)),
                Err(error) => {
                    link_error = Some(error.to_string());
                    failed.push(row.id);
                }
            }
        }
        let mut confirmed = Vec::with_capacity(pending.len());
        for (id, confirm) in pending {
            match confirm.await {
                Ok(Confirmation::Ack(returned)) => {
                    if returned.is_some() {
                        // No queue is bound for this routing key: the broker
                        // took the message and had nowhere to put it.
                        ctx.metrics.amqp_unroutable.inc();
                    }
                    confirmed.push(id);
                }
                Ok(Confirmation::Nack(_)) | Ok(Confirmation::NotRequested) => failed.push(id),
                Err(error) => {
                    link_error.get_or_insert_with(|| error.to_string());
                    failed.push(id);
                }
            }
        }
        if !confirmed.is_empty() {
            ctx.store.complete_publish(&confirmed).await?;
            ctx.metrics.amqp_published.inc_by(confirmed.len() as u64);
        }
        if !failed.is_empty() {
            // Back to the queue at once (not after the claim expires).
            if let Err(error) = ctx.store.release_outbox(&failed).await {
                warn!(%error, "could not release unpublished outbox rows; they return when the claim expires");
            }
        }
        if let Some(why) = link_error {
            Self::drop_link(myself, state, &why);
        }
        Ok(rows.len())
    }
}

impl Actor for OutboxRelayActor {
    type Msg = OutboxRelayMsg;
    type State = OutboxRelayState;
    type Arguments = OutboxRelayArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        *args.ctx.relay.write() = Some(myself);
        Ok(OutboxRelayState {
            ctx: args.ctx,
            emitter: args.emitter,
            amqp_url: args.amqp_url,
            link: None,
            backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(10)),
            reconnecting: false,
            ticker: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.ticker =
            Some(myself.send_interval(Duration::from_millis(250), || OutboxRelayMsg::Pump));
        myself.send_message(OutboxRelayMsg::Connect)?;
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(t) = state.ticker.take() {
            t.abort();
        }
        *state.ctx.relay.write() = None;
        if let Some((conn, _)) = state.link.take() {
            let _ = conn.close(200, "shutdown".into()).await;
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            OutboxRelayMsg::Connect => {
                state.reconnecting = false;
                if state.link.is_some() {
                    return Ok(());
                }
                match Self::connect(state).await {
                    Ok(()) => {
                        info!(exchanges = ?[&state.emitter.job_exchange, &state.emitter.core_exchange], "amqp connected, exchanges declared");
                        state.backoff.started();
                        myself.send_message(OutboxRelayMsg::Pump)?;
                    }
                    Err(error) => Self::drop_link(&myself, state, &error.to_string()),
                }
            }
            OutboxRelayMsg::Pump => {
                // Drain: keep going while full batches come back.
                while Self::pump(&myself, state).await? == BATCH as usize {}
            }
        }
        Ok(())
    }
}
