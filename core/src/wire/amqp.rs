//! The AMQP side of fastack's event contract:
//!
//! - a CloudEvents 1.0 **binary mode** binding for lapin messages
//!   (cloudevents-sdk ships none): context attributes travel as `ce-`
//!   headers, the data as the message body, `datacontenttype` also as the
//!   AMQP content-type;
//! - how an outbox row becomes a CloudEvent (`ce-id`, `ce-type`, …);
//! - message signatures (`x-message-signature`, `t`, `signature-version`)
//!   and their verification, which consumers and tests use alike;
//! - the exchanges' declaration, identical wherever one is declared, and a
//!   consumer's subscription to them.

use chrono::{DateTime, Utc};
use cloudevents::{
    Event, EventBuilder, EventBuilderV10,
    event::SpecVersion,
    message::{
        BinaryDeserializer, BinarySerializer, Error as CeError, MessageAttributeValue,
        Result as CeResult,
    },
};
use lapin::{
    BasicProperties, Channel, Consumer, ExchangeKind,
    options::{BasicConsumeOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions},
    types::{AMQPValue, FieldTable, LongString, ShortString},
};

use crate::{
    crypto::{hmac_hex, hmac_verify_hex},
    error::{Error, Result},
    store::{OutboxRow, Topic},
};

pub const SPEC_VERSION_HEADER: &str = "ce-specversion";
pub const SIGNATURE_HEADER: &str = "x-message-signature";
pub const SIGNATURE_TIME_HEADER: &str = "t";
pub const SIGNATURE_VERSION_HEADER: &str = "signature-version";
pub const SIGNATURE_VERSION: &str = "v1";
pub const SCHEMA_VERSION: &str = "1.0.0";
pub const SINGLE_TENANT: &str = "single-tenant";
/// Signatures older (or further in the future) than this are refused.
pub const SIGNATURE_TOLERANCE_SECS: i64 = 300;

/// Declares one of the event exchanges: durable, topic. Consumers that
/// declare it before the server does must use the same parameters, or the
/// broker refuses the second declaration.
pub async fn declare_exchange(channel: &Channel, name: &str) -> lapin::Result<()> {
    channel
        .exchange_declare(
            name.into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
}

/// A consumer's view of an event exchange: declares it, binds a private
/// queue (gone with the connection) to each routing key and consumes it.
/// With `auto_ack` the broker forgets a message as soon as it is sent.
pub async fn subscribe(
    channel: &Channel,
    exchange: &str,
    routing_keys: &[&str],
    auto_ack: bool,
) -> lapin::Result<Consumer> {
    declare_exchange(channel, exchange).await?;
    let queue = channel
        .queue_declare(
            "".into(),
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    for key in routing_keys {
        channel
            .queue_bind(
                queue.name().clone(),
                exchange.into(),
                (*key).into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
    }
    channel
        .basic_consume(
            queue.name().clone(),
            "".into(),
            BasicConsumeOptions {
                no_ack: auto_ack,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
}

/// A message in CloudEvents binary mode.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AmqpMessage {
    pub headers: FieldTable,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

impl AmqpMessage {
    /// Persistent message properties carrying the headers.
    pub fn properties(&self) -> BasicProperties {
        let mut props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(self.headers.clone());
        if let Some(ct) = &self.content_type {
            props = props.with_content_type(ShortString::from(ct.as_str()));
        }
        if let Some(id) = header_str(&self.headers, "ce-id") {
            props = props.with_message_id(ShortString::from(id));
        }
        props
    }

    pub fn header(&self, name: &str) -> Option<String> {
        header_str(&self.headers, name)
    }
}

/// A header as text (long or short string, or a number).
pub fn header_str(headers: &FieldTable, name: &str) -> Option<String> {
    match headers.inner().get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        AMQPValue::LongLongInt(i) => Some(i.to_string()),
        AMQPValue::LongInt(i) => Some(i.to_string()),
        AMQPValue::Timestamp(t) => Some(t.to_string()),
        _ => None,
    }
}

fn put(headers: &mut FieldTable, name: &str, value: String) {
    headers.insert(
        ShortString::from(name),
        AMQPValue::LongString(LongString::from(value)),
    );
}

/// Serializes a CloudEvent into an [`AmqpMessage`] (binary mode).
#[derive(Debug, Default)]
pub struct AmqpSerializer {
    message: AmqpMessage,
}

impl AmqpSerializer {
    pub fn new() -> Self {
        Self::default()
    }
}

impl BinarySerializer<AmqpMessage> for AmqpSerializer {
    fn set_spec_version(mut self, spec_version: SpecVersion) -> CeResult<Self> {
        put(
            &mut self.message.headers,
            SPEC_VERSION_HEADER,
            spec_version.to_string(),
        );
        Ok(self)
    }

    fn set_attribute(mut self, name: &str, value: MessageAttributeValue) -> CeResult<Self> {
        let text = value.to_string();
        if name == "datacontenttype" {
            self.message.content_type = Some(text.clone());
        }
        put(&mut self.message.headers, &format!("ce-{name}"), text);
        Ok(self)
    }

    fn set_extension(mut self, name: &str, value: MessageAttributeValue) -> CeResult<Self> {
        put(
            &mut self.message.headers,
            &format!("ce-{name}"),
            value.to_string(),
        );
        Ok(self)
    }

    fn end_with_data(mut self, bytes: Vec<u8>) -> CeResult<AmqpMessage> {
        self.message.body = bytes;
        Ok(self.message)
    }

    fn end(self) -> CeResult<AmqpMessage> {
        Ok(self.message)
    }
}

/// Reads a CloudEvent back from a delivered message's headers and body.
pub struct AmqpDeserializer<'a> {
    headers: &'a FieldTable,
    content_type: Option<&'a str>,
    body: &'a [u8],
}

impl<'a> AmqpDeserializer<'a> {
    pub fn new(headers: &'a FieldTable, content_type: Option<&'a str>, body: &'a [u8]) -> Self {
        AmqpDeserializer {
            headers,
            content_type,
            body,
        }
    }
}

impl BinaryDeserializer for AmqpDeserializer<'_> {
    fn deserialize_binary<R: Sized, V: BinarySerializer<R>>(self, mut visitor: V) -> CeResult<R> {
        let version =
            header_str(self.headers, SPEC_VERSION_HEADER).ok_or(CeError::WrongEncoding {})?;
        let spec = SpecVersion::try_from(version.as_str())?;
        let attributes = spec.attribute_names();
        visitor = visitor.set_spec_version(spec)?;
        for (name, _) in self.headers.inner().iter() {
            let name = name.as_str();
            let Some(attr) = name.strip_prefix("ce-") else {
                continue;
            };
            if name == SPEC_VERSION_HEADER
                || (attr == "datacontenttype" && self.content_type.is_some())
            {
                continue;
            }
            let value =
                MessageAttributeValue::String(header_str(self.headers, name).unwrap_or_default());
            visitor = if attributes.contains(&attr) {
                visitor.set_attribute(attr, value)?
            } else {
                visitor.set_extension(attr, value)?
            };
        }
        if let Some(ct) = self.content_type {
            visitor = visitor.set_attribute(
                "datacontenttype",
                MessageAttributeValue::String(ct.to_owned()),
            )?;
        }
        if self.body.is_empty() {
            visitor.end()
        } else {
            visitor.end_with_data(self.body.to_vec())
        }
    }
}

/// A delivered message as a CloudEvent.
pub fn event_from_message(
    headers: &FieldTable,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Event> {
    BinaryDeserializer::into_event(AmqpDeserializer::new(headers, content_type, body))
        .map_err(|e| Error::Protocol(format!("not a CloudEvent: {e}")))
}

/// A CloudEvent as a message (binary mode).
pub fn event_to_message(event: Event) -> Result<AmqpMessage> {
    event
        .deserialize_binary(AmqpSerializer::new())
        .map_err(|e| Error::Protocol(format!("cannot encode CloudEvent: {e}")))
}

/// What is fixed per deployment when emitting.
#[derive(Clone, Debug)]
pub struct Emitter {
    pub source: String,
    pub job_exchange: String,
    pub core_exchange: String,
    pub single_tenant: bool,
    pub signing_key: [u8; 32],
}

impl Emitter {
    pub fn exchange(&self, topic: Topic) -> &str {
        match topic {
            Topic::Job => &self.job_exchange,
            Topic::Core => &self.core_exchange,
        }
    }

    /// The outbox row as a signed CloudEvent message: the exchange to
    /// publish to and the message.
    pub fn message(&self, row: &OutboxRow, now: DateTime<Utc>) -> Result<(String, AmqpMessage)> {
        let (ty, resource, event_type) = match row.topic {
            Topic::Job => {
                let status = row
                    .routing_key
                    .strip_prefix("job.")
                    .ok_or_else(|| Error::Corrupt(format!("routing key {}", row.routing_key)))?;
                (format!("io.fastack.job.{status}"), "job", status.to_owned())
            }
            // `core.<resource>.<event type>`: `core.event.tracked`,
            // `core.contact.erased`.
            Topic::Core => {
                let (resource, event_type) = row
                    .routing_key
                    .strip_prefix("core.")
                    .and_then(|rest| rest.split_once('.'))
                    .ok_or_else(|| Error::Corrupt(format!("routing key {}", row.routing_key)))?;
                (
                    format!("io.fastack.{resource}.{event_type}"),
                    resource,
                    event_type.to_owned(),
                )
            }
        };
        let tenant = if self.single_tenant {
            SINGLE_TENANT.to_owned()
        } else {
            row.tenant_id.to_string()
        };
        let event = EventBuilderV10::new()
            .id(row.ce_id.clone())
            .source(self.source.clone())
            .ty(ty)
            .time(now)
            .subject(row.subject.clone())
            .data("application/json", row.body.as_bytes().to_vec())
            .extension("resourcetype", resource)
            .extension("eventtype", event_type)
            .extension("schemaversion", SCHEMA_VERSION)
            .extension("tenantid", tenant.clone())
            .build()
            .map_err(|e| Error::Protocol(format!("cannot build CloudEvent: {e}")))?;
        let mut message = event_to_message(event)?;
        let exchange = self.exchange(row.topic).to_owned();
        let t = now.timestamp();
        let signature = sign(
            &self.signing_key,
            t,
            &tenant,
            &row.subject,
            &exchange,
            &row.routing_key,
            &message.body,
        );
        put(&mut message.headers, SIGNATURE_HEADER, signature);
        message.headers.insert(
            ShortString::from(SIGNATURE_TIME_HEADER),
            AMQPValue::LongLongInt(t),
        );
        put(
            &mut message.headers,
            SIGNATURE_VERSION_HEADER,
            SIGNATURE_VERSION.to_owned(),
        );
        Ok((exchange, message))
    }
}

/// `t \n v1 \n tenant \n subject \n exchange \n routing_key \n body`, HMAC-SHA256,
/// lowercase hex.
pub fn sign(
    key: &[u8],
    t: i64,
    tenant: &str,
    subject: &str,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
) -> String {
    let head =
        format!("{t}\n{SIGNATURE_VERSION}\n{tenant}\n{subject}\n{exchange}\n{routing_key}\n");
    hmac_hex(key, &[head.as_bytes(), body])
}

/// Verifies a received message: version, age (±5 min) and signature
/// (constant-time), over the exact body bytes.
pub fn verify(
    key: &[u8],
    headers: &FieldTable,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    now: DateTime<Utc>,
) -> Result<()> {
    let get = |name: &'static str| header_str(headers, name).ok_or(Error::Signature(name));
    if get(SIGNATURE_VERSION_HEADER)? != SIGNATURE_VERSION {
        return Err(Error::Signature("unsupported signature-version"));
    }
    let t: i64 = get(SIGNATURE_TIME_HEADER)?
        .parse()
        .map_err(|_| Error::Signature("t is not a number"))?;
    if (now.timestamp() - t).abs() > SIGNATURE_TOLERANCE_SECS {
        return Err(Error::Signature("signature timestamp outside 5 minutes"));
    }
    let tenant = get("ce-tenantid")?;
    let subject = get("ce-subject")?;
    let signature = get(SIGNATURE_HEADER)?;
    let head =
        format!("{t}\n{SIGNATURE_VERSION}\n{tenant}\n{subject}\n{exchange}\n{routing_key}\n");
    if hmac_verify_hex(key, &[head.as_bytes(), body], &signature) {
        Ok(())
    } else {
        Err(Error::Signature("signature does not match"))
    }
}

#[cfg(test)]
mod tests {
    use cloudevents::AttributesReader;
    use fastack_entities::{JobId, TenantId};

    use super::*;

    fn emitter(single: bool) -> Emitter {
        Emitter {
            source: "//fastack/test".into(),
            job_exchange: "fastack.job.events".into(),
            core_exchange: "fastack.core.events".into(),
            single_tenant: single,
            signing_key: [9u8; 32],
        }
    }

    fn job_row() -> OutboxRow {
        let job = JobId::new();
        OutboxRow {
            id: 1,
            tenant_id: TenantId::new(),
            topic: Topic::Job,
            routing_key: "job.completed".into(),
            ce_id: format!("fastack.job.completed.{job}"),
            subject: job.to_string(),
            body: r#"{"job_id":"x","status":"completed"}"#.into(),
            job_id: Some(job),
            created_at: Utc::now(),
        }
    }

    #[test]
    fn event_to_amqp_and_back() {
        let row = job_row();
        let now = Utc::now();
        let (exchange, msg) = emitter(false).message(&row, now).unwrap();
        assert_eq!(exchange, "fastack.job.events");
        let h = |n: &str| msg.header(n).unwrap();
        assert_eq!(h("ce-specversion"), "1.0");
        assert_eq!(h("ce-id"), row.ce_id);
        assert_eq!(h("ce-source"), "//fastack/test");
        assert_eq!(h("ce-type"), "io.fastack.job.completed");
        assert_eq!(h("ce-subject"), row.subject);
        assert_eq!(h("ce-resourcetype"), "job");
        assert_eq!(h("ce-eventtype"), "completed");
        assert_eq!(h("ce-schemaversion"), "1.0.0");
        assert_eq!(h("ce-datacontenttype"), "application/json");
        assert_eq!(h("ce-tenantid"), row.tenant_id.to_string());
        assert!(DateTime::parse_from_rfc3339(&h("ce-time")).is_ok());
        assert_eq!(msg.content_type.as_deref(), Some("application/json"));
        assert_eq!(msg.body, row.body.as_bytes());

        let event =
            event_from_message(&msg.headers, msg.content_type.as_deref(), &msg.body).unwrap();
        assert_eq!(event.id(), row.ce_id);
        assert_eq!(event.ty(), "io.fastack.job.completed");
        assert_eq!(event.subject(), Some(row.subject.as_str()));
        assert_eq!(event.source().to_string(), "//fastack/test");
        assert_eq!(
            event.extension("tenantid").map(|e| e.to_string()),
            Some(row.tenant_id.to_string())
        );
        // And round trip again: Event -> AMQP gives the same headers.
        let again = event_to_message(event).unwrap();
        assert_eq!(again.header("ce-id"), msg.header("ce-id"));
        assert_eq!(again.header("ce-tenantid"), msg.header("ce-tenantid"));
        assert_eq!(again.body, msg.body);
    }

    #[test]
    fn single_tenant_label_and_core_events() {
        let mut row = job_row();
        row.topic = Topic::Core;
        row.routing_key = "core.event.tracked".into();
        let (exchange, msg) = emitter(true).message(&row, Utc::now()).unwrap();
        assert_eq!(exchange, "fastack.core.events");
        assert_eq!(msg.header("ce-tenantid").unwrap(), "single-tenant");
        assert_eq!(msg.header("ce-type").unwrap(), "io.fastack.event.tracked");
        assert_eq!(msg.header("ce-resourcetype").unwrap(), "event");
        assert_eq!(msg.header("ce-eventtype").unwrap(), "tracked");
    }

    #[test]
    fn signatures_verify_and_refuse_tampering_and_age() {
        let e = emitter(false);
        let row = job_row();
        let now = Utc::now();
        let (exchange, msg) = e.message(&row, now).unwrap();
        let key = e.signing_key;
        assert!(
            verify(
                &key,
                &msg.headers,
                &exchange,
                "job.completed",
                &msg.body,
                now
            )
            .is_ok()
        );
        // Another key, body, routing key or exchange fails.
        assert!(
            verify(
                &[1u8; 32],
                &msg.headers,
                &exchange,
                "job.completed",
                &msg.body,
                now
            )
            .is_err()
        );
        assert!(verify(&key, &msg.headers, &exchange, "job.failed", &msg.body, now).is_err());
        assert!(verify(&key, &msg.headers, "other", "job.completed", &msg.body, now).is_err());
        assert!(verify(&key, &msg.headers, &exchange, "job.completed", b"{}", now).is_err());
        // Older than five minutes.
        let later = now + chrono::Duration::seconds(301);
        assert!(matches!(
            verify(
                &key,
                &msg.headers,
                &exchange,
                "job.completed",
                &msg.body,
                later
            ),
            Err(Error::Signature(_))
        ));
        // Known vector: the canonical string is exactly the documented one.
        let sig = sign(b"k", 1_700_000_000, "t1", "s1", "x", "job.failed", b"{}");
        assert_eq!(
            sig,
            hmac_hex(b"k", &[b"1700000000\nv1\nt1\ns1\nx\njob.failed\n{}"])
        );
    }
}
