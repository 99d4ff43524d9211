//! Reads of what processing wrote: `tracked_events` through an
//! [`EventQuery`] (a time range is part of the type, so every read names its
//! partitions; the backend's [`Engine`] knows where they are), and contacts
//! with their identities and merges.

use async_trait::async_trait;
use chrono::FixedOffset;
use fastack_entities::{Contact, ContactId, EventId, IdentityKind, StoredEvent, TenantId};

use super::{
    EventQuery, TimeRange,
    db::{Db, Q, Row, object},
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

/// Events and contacts as processing left them (see the module doc).
#[derive(Clone, Copy)]
pub struct Events<'a> {
    pub(super) db: &'a Db,
    pub(super) engine: &'a dyn EventsEngine,
}

impl Events<'_> {
    /// The contact `id` resolves to (merges followed to the survivor),
    /// with its identities and the contacts merged into it.
    async fn load_contact(self, tenant: TenantId, id: ContactId) -> Result<Option<Contact>> {
        let mut current = id.0;
        // Chains are kept flat on merge; the bound protects against a cycle.
        for _ in 0..8 {
            let row = self
                .db
                .read_opt(
                    Q::new(
                        "SELECT id, merged_into, traits, created_at, updated_at FROM contacts \
                         WHERE tenant_id = $1 AND id = $2",
                    )
                    .bind(tenant.0)
                    .bind(current),
                )
                .await?;
            let Some(row) = row else { return Ok(None) };
            if let Some(next) = row.opt_uuid("merged_into")? {
                current = next;
                continue;
            }
            let identities = self
                .db
                .read(
                    Q::new(
                        "SELECT kind, value FROM contact_identities \
                         WHERE tenant_id = $1 AND contact_id = $2 ORDER BY kind, value",
                    )
                    .bind(tenant.0)
                    .bind(current),
                )
                .await?;
            let merged = self
                .db
                .read(
                    Q::new(
                        "SELECT id FROM contacts WHERE tenant_id = $1 AND merged_into = $2 ORDER BY id",
                    )
                    .bind(tenant.0)
                    .bind(current),
                )
                .await?;
            let mut user_ids = Vec::new();
            let mut anonymous_ids = Vec::new();
            for r in identities {
                let kind = r.int("kind")?;
                let value = r.text("value")?;
                match IdentityKind::from_i16(kind as i16) {
                    Some(IdentityKind::User) => user_ids.push(value),
                    Some(IdentityKind::Anonymous) => anonymous_ids.push(value),
                    None => return Err(Error::Corrupt(format!("identity kind {kind}"))),
                }
            }
            return Ok(Some(Contact {
                id: ContactId(current),
                user_ids,
                anonymous_ids,
                traits: object(row.json("traits")?),
                merged_ids: merged
                    .iter()
                    .map(|r| r.uuid("id").map(ContactId))
                    .collect::<Result<_>>()?,
                created_at: row.time("created_at")?,
                updated_at: row.time("updated_at")?,
            }));
        }
        Err(Error::Corrupt(format!(
            "merge chain of contact {id} too long"
        )))
    }

    /// Events in a time range, as the query says (its partitions only).
    pub async fn query(self, q: &EventQuery) -> Result<Vec<StoredEvent>> {
        self.engine.query_events(q).await
    }

    /// The contact `id` resolves to (merges followed), with its identities.
    pub async fn contact(self, tenant: TenantId, id: ContactId) -> Result<Option<Contact>> {
        self.load_contact(tenant, id).await
    }

    /// The contact holding an identity (`user_id` or `anonymous_id`).
    pub async fn find_contact(
        self,
        tenant: TenantId,
        kind: IdentityKind,
        value: &str,
    ) -> Result<Option<Contact>> {
        let row = self
            .db
            .read_opt(
                Q::new(
                    "SELECT contact_id FROM contact_identities \
                     WHERE tenant_id = $1 AND kind = $2 AND value = $3",
                )
                .bind(tenant.0)
                .bind(i64::from(kind.as_i16()))
                .bind(value),
            )
            .await?;
        match row {
            Some(r) => {
                self.load_contact(tenant, ContactId(r.uuid("contact_id")?))
                    .await
            }
            None => Ok(None),
        }
    }

    /// The contact's canonical id and every contact merged into it.
    pub async fn contact_family(self, tenant: TenantId, id: ContactId) -> Result<Vec<ContactId>> {
        let Some(contact) = self.load_contact(tenant, id).await? else {
            return Ok(Vec::new());
        };
        let mut ids = vec![contact.id];
        ids.extend(contact.merged_ids);
        Ok(ids)
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
