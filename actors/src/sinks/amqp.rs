//! The AMQP sink: outbox rows to RabbitMQ as signed CloudEvents, persistent
//! and `mandatory`, with publisher confirms pipelined (every publish of a
//! batch goes out before the first confirm is awaited). Only confirmed rows
//! are done; the rest are offered again, and a broken link is reported so
//! the relay reconnects after a capped backoff.
//!
//! Everything about it is declared here: its settings ([`AmqpSettings`],
//! checked together before a node serves), its counters, the start's
//! probe of the broker and the `amqp` dependency of `/readyz`.

use std::{collections::BTreeSet, time::Duration};

use async_trait::async_trait;
use fastack_core::{
    Config, Error,
    amqp::{Emitter, declare_exchange},
    health::{CHECK_TIMEOUT, Dependency, without_credentials},
    metrics::CounterSpec,
    settings::{Extension, parse},
    store::{OutboxRow, SinkName},
};
use lapin::{
    Channel, Confirmation, Connection, ConnectionProperties,
    options::{BasicPublishOptions, ConfirmSelectOptions},
};
use tracing::{info, warn};

use super::{Probe, Sent, Sink, Tracked};
use crate::context::Ctx;

fastack_core::settings! {
    /// The AMQP sink's settings.
    pub struct AmqpSettings {
        /// RabbitMQ for job and event streams
        pub url: Option<String> = "FASTACK_AMQP_URL" {
            default: "",
            shown: "(unset: streaming off)",
            parse: parse::optional_text,
            show: url,
        },
        /// topic exchange of job.completed / job.failed
        pub job_events_exchange: String = "FASTACK_JOB_EVENTS_EXCHANGE" {
            default: "fastack.job.events",
            parse: parse::text,
        },
        /// topic exchange of core.event.tracked
        pub core_events_exchange: String = "FASTACK_CORE_EVENTS_EXCHANGE" {
            default: "fastack.core.events",
            parse: parse::text,
        },
        /// ce-source of every emitted CloudEvent; required with AMQP
        pub cloudevents_source: Option<String> = "FASTACK_CLOUDEVENTS_SOURCE" {
            default: "",
            shown: "(none)",
            parse: parse::optional_text,
        },
    }
}

/// The settings of a node streaming to a broker (`None`: streaming off).
fn streaming(config: &Config) -> Option<&AmqpSettings> {
    config
        .sections
        .get::<AmqpSettings>()
        .filter(|s| s.url.is_some())
}

/// How `/readyz` and the start's errors name the broker.
const LINK: Dependency = Dependency::Link {
    name: "amqp",
    settings: "FASTACK_AMQP_URL",
};

/// Outbox rows the broker confirmed.
const PUBLISHED: CounterSpec = CounterSpec {
    name: "amqp_published",
    help: "outbox rows confirmed by the broker",
};
/// Confirmed messages no queue took.
const UNROUTABLE: CounterSpec = CounterSpec {
    name: "amqp_unroutable",
    help: "confirmed messages the broker could not route to any queue",
};

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

/// Connects and declares the exchanges, within the dependency check's
/// time, then closes.
async fn check(settings: &AmqpSettings, url: &str) -> Result<(), String> {
    let exchanges = [
        settings.job_events_exchange.as_str(),
        settings.core_events_exchange.as_str(),
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
    const SETTINGS: Option<Extension> = Some(Extension::of::<AmqpSettings>());
    const COUNTERS: &'static [CounterSpec] = &[PUBLISHED, UNROUTABLE];

    /// With a broker (`FASTACK_AMQP_URL`).
    fn on(config: &Config) -> bool {
        streaming(config).is_some()
    }

    /// The event contract needs exchange names and a CloudEvents source:
    /// a node streaming without them refuses to start.
    fn check(config: &Config) -> fastack_core::Result<()> {
        let Some(settings) = streaming(config) else {
            return Ok(());
        };
        if settings.job_events_exchange.trim().is_empty()
            || settings.core_events_exchange.trim().is_empty()
        {
            return Err(Error::Config(
                "FASTACK_AMQP_URL is set but FASTACK_JOB_EVENTS_EXCHANGE or FASTACK_CORE_EVENTS_EXCHANGE is empty"
                    .to_owned(),
            ));
        }
        if settings
            .cloudevents_source
            .as_deref()
            .is_none_or(|s| s.trim().is_empty())
        {
            return Err(Error::Config(
                "FASTACK_AMQP_URL is set but FASTACK_CLOUDEVENTS_SOURCE is empty: job events need a ce-source"
                    .to_owned(),
            ));
        }
        Ok(())
    }

    async fn probe(config: &Config) -> Option<Probe> {
        let settings = streaming(config)?;
        let url = settings.url.as_deref()?;
        Some(Probe {
            dependency: LINK,
            location: without_credentials(url),
            result: check(settings, url).await,
        })
    }

    fn open(ctx: &Ctx) -> Option<Self> {
        let settings = streaming(&ctx.config)?;
        Some(AmqpSink {
            emitter: Emitter {
                source: settings.cloudevents_source.clone().unwrap_or_default(),
                job_exchange: settings.job_events_exchange.clone(),
                core_exchange: settings.core_events_exchange.clone(),
                single_tenant: ctx.config.single_tenant,
                signing_key: ctx.keys.deployment_hmac(),
            },
            url: settings.url.clone()?,
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
                    ctx.health.up(LINK, None);
                }
                self.link = Some(link);
                Ok(())
            }
            Err(e) => {
                ctx.health.down(LINK, &e);
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
                        if let Some(c) = ctx.metrics.counter(UNROUTABLE.name) {
                            c.inc();
                        }
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
        if let Some(c) = ctx.metrics.counter(PUBLISHED.name) {
            c.inc_by(sent.done.len() as u64);
        }
        if let Some(error) = &sent.down {
            ctx.health.down(LINK, error);
            self.link = None;
        } else if self.unroutable != before || !sent.done.is_empty() {
            match self.unroutable.iter().next() {
                Some(_) => ctx.health.warning(
                    LINK,
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
                None => ctx.health.up(LINK, None),
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
