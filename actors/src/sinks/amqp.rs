//! The AMQP sink: outbox rows to RabbitMQ as signed CloudEvents, persistent
//! and `mandatory`, with publisher confirms pipelined (every publish of a
//! batch goes out before the first confirm is awaited). Only confirmed rows
//! are done; the rest are offered again, and a broken link is reported so
//! the relay reconnects after a capped backoff.

use std::time::Duration;

use async_trait::async_trait;
use fastack_core::{
    amqp::{Emitter, declare_exchange},
    store::{OutboxRow, SinkName},
};
use lapin::{
    Channel, Confirmation, Connection, ConnectionProperties,
    options::{BasicPublishOptions, ConfirmSelectOptions},
};
use tracing::{info, warn};

use super::{Sent, Sink};
use crate::context::Ctx;

pub struct AmqpSink {
    emitter: Emitter,
    url: String,
    link: Option<(Connection, Channel)>,
}

impl AmqpSink {
    /// The sink of a node streaming to a broker (`None` without one).
    pub fn new(ctx: &Ctx) -> Option<Self> {
        Some(AmqpSink {
            emitter: ctx.emitter.clone()?,
            url: ctx.config.amqp_url.clone()?,
            link: None,
        })
    }
}

#[async_trait]
impl Sink for AmqpSink {
    const NAME: SinkName = SinkName("amqp");

    fn interval(&self) -> Duration {
        Duration::from_millis(250)
    }

    async fn connect(&mut self, _ctx: &Ctx) -> Result<(), String> {
        let conn = Connection::connect(&self.url, ConnectionProperties::default())
            .await
            .map_err(|e| e.to_string())?;
        let channel = conn.create_channel().await.map_err(|e| e.to_string())?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        for exchange in [&self.emitter.job_exchange, &self.emitter.core_exchange] {
            declare_exchange(&channel, exchange)
                .await
                .map_err(|e| e.to_string())?;
        }
        info!(
            exchanges = ?[&self.emitter.job_exchange, &self.emitter.core_exchange],
            "amqp connected, exchanges declared"
        );
        self.link = Some((conn, channel));
        Ok(())
    }

    async fn send(&mut self, ctx: &Ctx, rows: &[OutboxRow]) -> Sent {
        let mut sent = Sent::default();
        let Some(channel) = self.link.as_ref().map(|(_, c)| c.clone()) else {
            sent.retry = rows.iter().map(|r| r.id).collect();
            sent.down = Some("not connected".to_owned());
            return sent;
        };
        let now = ctx.now();
        let mut pending = Vec::with_capacity(rows.len());
        for row in rows {
            if sent.down.is_some() {
                sent.retry.push(row.id);
                continue;
            }
            let (exchange, message) = match self.emitter.message(row, now) {
                Ok(m) => m,
                Err(error) => {
                    warn!(outbox = row.id, %error, "cannot encode outbox row");
                    sent.retry.push(row.id);
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
                    sent.down = Some(error.to_string());
                    sent.retry.push(row.id);
                }
            }
        }
        for (id, confirm) in pending {
            match confirm.await {
                Ok(Confirmation::Ack(returned)) => {
                    if returned.is_some() {
                        // No queue is bound for this routing key: the broker
                        // took the message and had nowhere to put it.
                        ctx.metrics.amqp_unroutable.inc();
                        warn!(
                            outbox = id,
                            "the broker had no queue for an event and dropped it \
                             (fastack_amqp_unroutable_total counts them)"
                        );
                    }
                    sent.done.push(id);
                }
                Ok(Confirmation::Nack(_)) | Ok(Confirmation::NotRequested) => sent.retry.push(id),
                Err(error) => {
                    sent.down.get_or_insert_with(|| error.to_string());
                    sent.retry.push(id);
                }
            }
        }
        ctx.metrics.amqp_published.inc_by(sent.done.len() as u64);
        if sent.down.is_some() {
            self.link = None;
        }
        sent
    }

    async fn close(&mut self) {
        if let Some((conn, _)) = self.link.take() {
            let _ = conn.close(200, "shutdown".into()).await;
        }
    }
}
