//! Reads of what processing wrote to `tracked_events`, through an
//! [`EventQuery`] (a time range is part of the type, so every read names its
//! partitions; the backend's [`Engine`] knows where they are). Contacts are
//! [`super::contacts`]'.

use async_trait::async_trait;
use chrono::FixedOffset;
use fastack_entities::{ContactId, EventId, StoredEvent, TenantId};

use super::{
    EventQuery, TimeRange,
    db::{Row, object},
};
use crate::error::{Error, Result};

/// Reads of `tracked_events`, where the backend keeps them.
#[async_trait]
pub(crate) trait EventsEngine: Send + Sync {
    /// See [`Events::query`].
    async fn query_events(&self, q: &EventQuery) -> Result<Vec<StoredEvent>>;
    /// See [`Events::count`].
    async fn count_events(&self, tenant: TenantId, range: TimeRange) -> Result<i64>;
}

/// Events as processing left them (see the module doc).
#[derive(Clone, Copy)]
pub struct Events<'a> {
    pub(super) engine: &'a dyn EventsEngine,
}

impl Events<'_> {
    /// Events in a time range, as the query says (its partitions only).
    pub async fn query(self, q: &EventQuery) -> Result<Vec<StoredEvent>> {
        self.engine.query_events(q).await
    }

    /// Row count of `tracked_events` over a range, for tests and admin.
    pub async fn count(self, tenant: TenantId, range: TimeRange) -> Result<i64> {
        self.engine.count_events(tenant, range).await
    }
}

/// The columns [`event_from`] reads.
pub(crate) const EVENT_COLUMNS: &str = "id, kind, event, contact_id, user_id, anonymous_id, \
     properties, occurred_at, occurred_offset_s, received_at, annotations";

/// A `tracked_events` row read with [`EVENT_COLUMNS`].
pub(crate) fn event_from(r: &Row) -> Result<StoredEvent> {
    Ok(StoredEvent {
        id: EventId(r.uuid("id")?),
        kind: r.text("kind")?.parse().map_err(Error::Corrupt)?,
        event: r.opt_text("event")?,
        contact_id: ContactId(r.uuid("contact_id")?),
        user_id: r.opt_text("user_id")?,
        anonymous_id: r.opt_text("anonymous_id")?,
        properties: object(r.json("properties")?),
        occurred_at: r
            .time("occurred_at")?
            .with_timezone(&offset(r.int("occurred_offset_s")?)?),
        received_at: r.time("received_at")?,
        plan: super::plan_of(r.opt_json("annotations")?)?,
    })
}

/// An event's UTC offset, stored in seconds.
fn offset(seconds: i64) -> Result<FixedOffset> {
    i32::try_from(seconds)
        .ok()
        .and_then(FixedOffset::east_opt)
        .ok_or_else(|| Error::Corrupt(format!("offset {seconds}")))
}
