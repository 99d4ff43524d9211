//! Inbox rows processing could not take: each failure is counted on its
//! row, a row that fails too often moves to `quarantine`, and an operator
//! lists, puts back or discards what is there.

use chrono::{DateTime, Utc};
use fastack_entities::{EventId, QuarantinedEvent, TenantId, db::quarantine};
use sea_orm::{
    ColumnTrait, EntityTrait, IntoActiveModel, QueryFilter, QueryOrder, QuerySelect,
    sea_query::OnConflict,
};

use super::{
    db::{Db, Q, domain, domain_opt, u32_of},
    processing::ProcessingEngine,
};
use crate::error::Result;

/// Quarantined events (see the module doc).
#[derive(Clone, Copy)]
pub struct Quarantine<'a> {
    pub(super) db: &'a Db,
    pub(super) engine: &'a dyn ProcessingEngine,
}

impl Quarantine<'_> {
    /// The tenant's first inbox row above `after_seq`: `(seq, event id)`.
    pub async fn next_inbox_row(
        self,
        tenant: TenantId,
        after_seq: Option<i64>,
    ) -> Result<Option<(i64, EventId)>> {
        let row = self
            .db
            .write_opt(
                Q::new(
                    "SELECT seq, event_id FROM inbox WHERE tenant_id = $1 AND seq > $2 \
                     ORDER BY seq LIMIT 1",
                )
                .bind(tenant.0)
                .bind(after_seq.unwrap_or(i64::MIN)),
            )
            .await?;
        row.map(|r| Ok((r.int("seq")?, EventId(r.uuid("event_id")?))))
            .transpose()
    }

    /// Counts a failed processing attempt of an inbox row and keeps its
    /// error; returns the attempts so far (0 when the row is gone).
    pub async fn record_failure(self, tenant: TenantId, seq: i64, error: &str) -> Result<u32> {
        let row = self
            .db
            .write_opt(
                Q::new(
                    "UPDATE inbox SET attempts = attempts + 1, last_error = $3 \
                     WHERE tenant_id = $1 AND seq = $2 RETURNING attempts",
                )
                .bind(tenant.0)
                .bind(seq)
                .bind(error),
            )
            .await?;
        Ok(row
            .map(|r| r.int("attempts"))
            .transpose()?
            .map_or(0, u32_of))
    }

    /// Moves an inbox row to quarantine in one transaction; `None` when the
    /// row is gone.
    pub async fn take(
        self,
        tenant: TenantId,
        seq: i64,
        now: DateTime<Utc>,
    ) -> Result<Option<QuarantinedEvent>> {
        use quarantine::Column as C;
        // The row leaves the inbox and enters quarantine together.
        let mut tx = self.db.begin().await?;
        let Some(moved) = tx
            .fetch_opt(
                Q::new(
                    "DELETE FROM inbox WHERE tenant_id = $1 AND seq = $2 \
                     RETURNING event_id, payload, received_at, \
                               coalesce(last_error, 'unknown error') AS error, attempts",
                )
                .bind(tenant.0)
                .bind(seq),
            )
            .await?
        else {
            return Ok(None);
        };
        let row = quarantine::Model {
            tenant_id: tenant,
            event_id: EventId(moved.uuid("event_id")?),
            payload: moved.text("payload")?,
            received_at: moved.time("received_at")?.into(),
            error: moved.text("error")?,
            attempts: i32::try_from(moved.int("attempts")?).unwrap_or(i32::MAX),
            quarantined_at: now.into(),
        };
        tx.run(
            &quarantine::Entity::insert(row.clone().into_active_model()).on_conflict(
                OnConflict::columns([C::TenantId, C::EventId])
                    .update_columns([
                        C::Payload,
                        C::ReceivedAt,
                        C::Error,
                        C::Attempts,
                        C::QuarantinedAt,
                    ])
                    .to_owned(),
            ),
        )
        .await?;
        tx.commit().await?;
        self.engine.inbox_rewritten(tenant);
        Ok(Some(row.into()))
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
        self.engine.inbox_rewritten(tenant);
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
        self.engine.inbox_rewritten(tenant);
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
