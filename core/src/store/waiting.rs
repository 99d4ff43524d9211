//! Accepted events not processed yet, as the parts outside processing see
//! them: the inbox's gauges, a failing event counted and moved to
//! quarantine, and what an erasure must wait for or search. Written once
//! over the `inbox` table (PostgreSQL, where the group commit inserts
//! there); the embedded store keeps these events in its accept log and
//! answers from it ([`super::sqlite_log`]).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use fastack_entities::{EventId, QuarantinedEvent, TenantId, db::quarantine};
use sea_orm::{EntityTrait, IntoActiveModel, sea_query::OnConflict};

use super::db::{Db, Q, Tx, u32_of};
use crate::error::Result;

/// A tenant's waiting events from its first to its last, by their number
/// (an inbox row's `seq`, a log record's sequence number).
pub type WaitingRange = (i64, i64);

/// What a backend keeps of accepted events not processed yet (see the
/// module doc); every method's default reads the `inbox` table.
#[async_trait]
pub(crate) trait WaitingEngine: Send + Sync {
    /// Events waiting, and the oldest one's `received_at`.
    async fn waiting_stats(&self, db: &Db) -> Result<(i64, Option<DateTime<Utc>>)> {
        let row = db
            .read_one(Q::new(
                "SELECT count(*) AS n, min(received_at) AS oldest FROM inbox",
            ))
            .await?;
        Ok((row.int("n")?, row.opt_time("oldest")?))
    }

    /// Whether no event waits. Cheap while rows wait (one descent from the
    /// newest end of the key index), unlike [`WaitingEngine::waiting_stats`].
    async fn waiting_empty(&self, db: &Db) -> Result<bool> {
        let newest = db
            .read_opt(Q::new(
                "SELECT seq FROM inbox ORDER BY tenant_id DESC, seq DESC LIMIT 1",
            ))
            .await?;
        Ok(newest.is_none())
    }

    /// The tenant's first waiting event after `after`: `(number, event id)`.
    async fn next_waiting(
        &self,
        db: &Db,
        tenant: TenantId,
        after: Option<i64>,
    ) -> Result<Option<(i64, EventId)>> {
        let row = db
            .write_opt(
                Q::new(
                    "SELECT seq, event_id FROM inbox WHERE tenant_id = $1 AND seq > $2 \
                     ORDER BY seq LIMIT 1",
                )
                .bind(tenant.0)
                .bind(after.unwrap_or(i64::MIN)),
            )
            .await?;
        row.map(|r| Ok((r.int("seq")?, EventId(r.uuid("event_id")?))))
            .transpose()
    }

    /// Counts a failed processing attempt of a waiting event and keeps its
    /// error; the attempts so far (0 when it no longer waits).
    async fn record_failure(
        &self,
        db: &Db,
        tenant: TenantId,
        seq: i64,
        error: &str,
    ) -> Result<u32> {
        let row = db
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

    /// Moves a waiting event to quarantine, in one transaction; `None` when
    /// it no longer waits.
    async fn quarantine(
        &self,
        db: &Db,
        tenant: TenantId,
        seq: i64,
        now: DateTime<Utc>,
    ) -> Result<Option<QuarantinedEvent>> {
        // The row leaves the inbox and enters quarantine together.
        let mut tx = db.begin().await?;
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
        put_in_quarantine(&mut tx, &row).await?;
        tx.commit().await?;
        Ok(Some(row.into()))
    }

    /// A quarantined event was put back into the inbox table (by this
    /// process).
    fn put_back(&self) {}

    /// The tenant's waiting events' first and last numbers, read in the
    /// erasure's settling transaction `tx` (`None`: nothing waits).
    async fn waiting_range(
        &self,
        tx: &mut Tx<'_>,
        tenant: TenantId,
    ) -> Result<Option<WaitingRange>> {
        let r = tx
            .fetch_opt(
                Q::new("SELECT MIN(seq) AS lo, MAX(seq) AS hi FROM inbox WHERE tenant_id = $1")
                    .bind(tenant.0),
            )
            .await?;
        let Some(r) = r else { return Ok(None) };
        Ok(match (r.opt_int("lo")?, r.opt_int("hi")?) {
            (Some(lo), Some(hi)) => Some((lo, hi)),
            _ => None,
        })
    }

    /// The payloads of the tenant's waiting events in `range` (only
    /// `identify` events' when `identifies`), read in `tx` when given.
    async fn waiting_payloads(
        &self,
        db: &Db,
        tx: Option<&mut Tx<'_>>,
        tenant: TenantId,
        (from, to): WaitingRange,
        identifies: bool,
    ) -> Result<Vec<String>> {
        // Only identifies link: the others are not read (a backlog of
        // tracks under load is thousands of rows).
        let q = Q::new(format!(
            "SELECT payload FROM inbox WHERE tenant_id = $1 AND seq >= $2 AND seq <= $3{}",
            if identifies {
                " AND payload LIKE '%\"identify\"%'"
            } else {
                ""
            }
        ))
        .bind(tenant.0)
        .bind(from)
        .bind(to);
        let rows = match tx {
            Some(tx) => tx.fetch(q).await?,
            None => db.read(q).await?,
        };
        rows.iter().map(|r| r.text("payload")).collect()
    }

    /// The tenant's first event of `range` still waiting; `None` once
    /// processing has passed `range`'s end.
    async fn first_waiting(
        &self,
        db: &Db,
        tenant: TenantId,
        (from, to): WaitingRange,
    ) -> Result<Option<i64>> {
        db.read_opt(
            Q::new(
                "SELECT seq FROM inbox WHERE tenant_id = $1 AND seq >= $2 AND seq <= $3 \
                 ORDER BY seq LIMIT 1",
            )
            .bind(tenant.0)
            .bind(from)
            .bind(to),
        )
        .await?
        .map(|r| r.int("seq"))
        .transpose()
    }
}

/// A quarantine row written (or written again: a second failure of an
/// event put back replaces the first), in the caller's transaction.
pub(crate) async fn put_in_quarantine(tx: &mut Tx<'_>, row: &quarantine::Model) -> Result<()> {
    use quarantine::Column as C;
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
    Ok(())
}
