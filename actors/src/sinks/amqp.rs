//! The AMQP sink: outbox rows to RabbitMQ as signed CloudEvents, persistent
//! and `mandatory`, with publisher confirms pipelined (every publish of a
//! batch goes out before the first confirm is awaited). Only confirmed rows
//! are done; the rest are offered again, and a broken link is reported so
//! the relay reconnects after a capped backoff.

use std::{collections::BTreeSet, time::Duration};

use async_trait::async_trait;
use fastack_core::{
    Config,
    amqp::{Emitter, declare_exchange},
    health::{CHECK_TIMEOUT, Dependency},
    store::{OutboxRow, SinkName},
};
use lapin::{
    Channel, Confirmation, Connection, ConnectionProperties,
    options::{BasicPublishOptions, ConfirmSelectOptions},
};
use tracing::{info, warn};

use super::{Sent, Sink, Tracked};
use crate::context::Ctx;

pub struct AmqpSink {
    emitter: Emitter,
    url: String,
    link: Option<(Connection, Channel)>,
    /// Exchanges whose latest message the broker could route nowhere.
    unroutable: BTreeSet<String>,
}

/// Connects, asks for publisher confirms and declares both exchanges.
async fn open_link(url: &str, exchanges: [&str; 2]) -> Result<(Connection, Channel), String> {
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .map_err(|e| e.to_string())?;
    let channel = conn.create_channel().await.map_err(|e| e.to_string())?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    for exchange in exchanges {
        declare_exchange(&channel, exchange)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok((conn, channel))
}

/// The start's check of a node streaming to a broker: it connects and
/// declares the exchanges, within the dependency check's time.
pub async fn check(config: &Config, url: &str) -> Result<(), String> {
    let exchanges = [
        config.job_events_exchange.as_str(),
        config.core_events_exchange.as_str(),
    ];
    let (conn, channel) = tokio::time::timeout(CHECK_TIMEOUT, open_link(url, exchanges))
        .await
        .map_err(|_| "the broker did not answer in time".to_owned())??;
    // The channel first: closing a connection with a channel open makes
    // lapin log an error for what is a normal close.
    let _ = channel.close(200, "checked".into()).await;
    let _ = conn.close(200, "checked".into()).await;
    Ok(())
}

#[async_trait]
impl Sink for AmqpSink {
    const NAME: SinkName = SinkName("amqp");
    const JOBS: bool = true;
    const TRACKED: Tracked = Tracked::Every;

    /// With a broker (`FASTACK_AMQP_URL`).
    fn on(config: &Config) -> bool {
        config.amqp_url.is_some()
    }

    fn open(ctx: &Ctx) -> Option<Self> {
        Some(AmqpSink {
            emitter: ctx.emitter.clone()?,
            url: ctx.config.amqp_url.clone()?,
            link: None,
            unroutable: BTreeSet::new(),
        })
    }

    fn interval(&self) -> Duration {
        Duration::from_millis(250)
    }

    async fn connect(&mut self, ctx: &Ctx) -> Result<(), String> {
        let exchanges = [
            self.emitter.job_exchange.as_str(),
            self.emitter.core_exchange.as_str(),
        ];
        match open_link(&self.url, exchanges).await {
            Ok(link) => {
                info!(
                    exchanges = ?[&self.emitter.job_exchange, &self.emitter.core_exchange],
                    "amqp connected, exchanges declared"
                );
                if self.unroutable.is_empty() {
                    ctx.health.up(Dependency::Amqp, None);
                }
                self.link = Some(link);
                Ok(())
            }
            Err(e) => {
                ctx.health.down(Dependency::Amqp, &e);
                Err(e)
            }
        }
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
                Ok(confirm) => pending.push((row.id, exchange, confirm)),
                Err(error) => {
                    sent.down = Some(error.to_string());
                    sent.retry.push(row.id);
                }
            }
        }
        let before = self.unroutable.clone();
        for (id, exchange, confirm) in pending {
            match confirm.await {
                Ok(Confirmation::Ack(returned)) => {
                    if returned.is_some() {
                        // No queue is bound for this routing key: the broker
                        // took the message and had nowhere to put it.
                        ctx.metrics.amqp_unroutable.inc();
                        if self.unroutable.insert(exchange.clone()) {
                            warn!(
                                outbox = id,
                                %exchange,
                                "the broker had no queue for an event and dropped it: bind a \
                                 queue to the exchange (fastack_amqp_unroutable_total counts them)"
                            );
                        }
                    } else {
                        self.unroutable.remove(&exchange);
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
        if let Some(error) = &sent.down {
            ctx.health.down(Dependency::Amqp, error);
            self.link = None;
        } else if self.unroutable != before || !sent.done.is_empty() {
            match self.unroutable.iter().next() {
                Some(_) => ctx.health.warning(
                    Dependency::Amqp,
                    format!(
                        "nothing is bound to exchange {}: the broker drops the events \
                         published there",
                        self.unroutable
                            .iter()
                            .map(|e| format!("`{e}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ),
                None => ctx.health.up(Dependency::Amqp, None),
            }
        }
        sent
    }

    async fn close(&mut self) {
        if let Some((conn, _)) = self.link.take() {
            let _ = conn.close(200, "shutdown".into()).await;
        }
    }
}
