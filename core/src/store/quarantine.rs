//! Accepted events processing could not take: each failure is counted, an
//! event that fails too often moves to `quarantine`, and an operator lists,
//! puts back (into the `inbox` table, whence the node takes it again) or
//! discards what is there.

use chrono::{DateTime, Utc};
use fastack_entities::{EventId, QuarantinedEvent, TenantId, db::quarantine};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use super::{
    db::{Db, Q, domain, domain_opt},
    waiting::WaitingEngine,
};
use crate::error::Result;

/// Quarantined events (see the module doc).
#[derive(Clone, Copy)]
pub struct Quarantine<'a> {
    pub(super) db: &'a Db,
    pub(super) waiting: &'a dyn WaitingEngine,
}

impl Quarantine<'_> {
    /// The tenant's first waiting event after `after_seq`: `(seq, event id)`.
    pub async fn next_inbox_row(
        self,
        tenant: TenantId,
        after_seq: Option<i64>,
    ) -> Result<Option<(i64, EventId)>> {
        self.waiting.next_waiting(self.db, tenant, after_seq).await
    }

    /// Counts a failed processing attempt of a waiting event and keeps its
    /// error; returns the attempts so far (0 when it no longer waits).
    pub async fn record_failure(self, tenant: TenantId, seq: i64, error: &str) -> Result<u32> {
        self.waiting
            .record_failure(self.db, tenant, seq, error)
            .await
    }

    /// Moves a waiting event to quarantine in one transaction; `None` when
    /// it no longer waits.
    pub async fn take(
        self,
        tenant: TenantId,
        seq: i64,
        now: DateTime<Utc>,
    ) -> Result<Option<QuarantinedEvent>> {
        self.waiting.quarantine(self.db, tenant, seq, now).await
    }

    /// The tenant's quarantined events, oldest first.
    pub async fn list(self, tenant: TenantId, limit: u32) -> Result<Vec<QuarantinedEvent>> {
        use quarantine::Column as C;
        domain(
            quarantine::Entity::find()
                .filter(C::TenantId.eq(tenant))
                .order_by_asc(C::QuarantinedAt)
                .order_by_asc(C::EventId)
                .limit(u64::from(limit))
                .all(self.db)
                .await?,
        )
    }

    /// One quarantined event of the tenant.
    pub async fn get(self, tenant: TenantId, event: EventId) -> Result<Option<QuarantinedEvent>> {
        domain_opt(
            quarantine::Entity::find_by_id((tenant, event))
                .one(self.db)
                .await?,
        )
    }

    /// Puts a quarantined event back into the inbox, same id and payload,
    /// attempts from zero, in one transaction. Returns whether it was there.
    pub async fn retry(self, tenant: TenantId, event: EventId) -> Result<bool> {
        let mut tx = self.db.begin().await?;
        let found: Vec<quarantine::Model> = tx
            .models(&quarantine::Entity::find_by_id((tenant, event)))
            .await?;
        let Some(row) = found.into_iter().next() else {
            return Ok(false);
        };
        // Two retries at once: the one whose delete counts moves the event.
        if tx
            .run(&quarantine::Entity::delete_by_id((tenant, event)))
            .await?
            != 1
        {
            return Ok(false);
        }
        tx.execute(
            Q::new(
                "INSERT INTO inbox (tenant_id, event_id, payload, received_at) VALUES ($1, $2, $3, $4)",
            )
            .bind(tenant.0)
            .bind(event.0)
            .bind(row.payload)
            .bind(row.received_at.0),
        )
        .await?;
        tx.commit().await?;
        self.waiting.put_back();
        Ok(true)
    }

    /// Discards a quarantined event for good.
    pub async fn discard(self, tenant: TenantId, event: EventId) -> Result<bool> {
        let r = quarantine::Entity::delete_by_id((tenant, event))
            .exec(self.db)
            .await?;
        Ok(r.rows_affected == 1)
    }
}
