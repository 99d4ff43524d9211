//! What the rest of the node sees of the embedded store's waiting events:
//! the accept log's (from this process's index, or read from the files
//! where another process appends), and rows of the inbox table not moved
//! into it yet (an earlier release's, a quarantined event put back), which
//! the node moves in.

use std::{
    collections::HashMap,
    sync::{Arc, atomic::Ordering},
};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use fastack_entities::TenantId;
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::{
    INBOX_SCHEMA, SqliteStore,
    accept_log::{self, Record},
    log::{AcceptLog, LegacyRow},
};
use crate::{
    error::{Error, Result},
    store::{
        db::{Db, Q, Tx},
        decode_payload, processing,
        waiting::WaitingEngine,
    },
};

/// Inbox-table rows moved into the log at a time.
const MOVE_ROWS: i64 = 10_000;

/// How often processing looks for inbox-table rows to move into the log
/// (besides the backlog scan's look, and at once after a put-back here).
pub(super) const INBOX_LOOK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl SqliteStore {
    /// Moves the inbox table's rows (an earlier release's, or quarantined
    /// events put back) into the log, then deletes them from the table.
    pub(super) async fn move_inbox_rows(&self, log: &Arc<AcceptLog>) -> Result<()> {
        loop {
            let rows: Vec<(i64, Uuid, Uuid, String, i64)> = sqlx::query_as(
                "SELECT seq, tenant_id, event_id, payload, received_at FROM inbox \
                 ORDER BY seq LIMIT $1",
            )
            .bind(MOVE_ROWS)
            .fetch_all(&self.reader)
            .await?;
            if rows.is_empty() {
                return Ok(());
            }
            let full = rows.len() as i64 == MOVE_ROWS;
            let rows: Vec<LegacyRow> = rows
                .into_iter()
                .map(|(seq, tenant, event_id, payload, received_at)| LegacyRow {
                    seq,
                    tenant: TenantId(tenant),
                    event_id: fastack_entities::EventId(event_id),
                    payload,
                    received_at: DateTime::from_timestamp_micros(received_at).unwrap_or_default(),
                })
                .collect();
            let total = rows.len();
            let moved = log.import(rows).await?;
            if !moved.is_empty() {
                let mut tx = self.writer.begin().await?;
                for chunk in moved.chunks(500) {
                    let list = vec!["?"; chunk.len()].join(", ");
                    let mut q = sqlx::query(AssertSqlSafe(format!(
                        "DELETE FROM {INBOX_SCHEMA}.inbox WHERE seq IN ({list})"
                    )));
                    for s in chunk {
                        q = q.bind(*s);
                    }
                    q.execute(&mut *tx).await?;
                }
                tx.commit().await?;
                log.forget_moved(&moved);
                tracing::info!(rows = moved.len(), "inbox rows moved into the accept log");
            }
            if !full || moved.len() < total {
                return Ok(());
            }
        }
    }
}

impl SqliteStore {
    /// Every event waiting in the log's files (past its tenant's cursor),
    /// handed to `f`, and the cursors read: where another process appends
    /// to the log (a command beside a running node, the load tool beside
    /// the node it measures), the files are what this process can read.
    async fn waiting_in_files(
        &self,
        mut f: impl FnMut(Record) + Send,
    ) -> Result<HashMap<Uuid, u64>> {
        let cursors: HashMap<Uuid, u64> =
            sqlx::query_as::<_, (Uuid, i64)>("SELECT tenant_id, seq FROM log_cursors")
                .fetch_all(&self.reader)
                .await?
                .into_iter()
                .map(|(tenant, seq)| (tenant, seq.max(0) as u64))
                .collect();
        accept_log::scan(&self.log_dir, |r, _| {
            if r.seq > cursors.get(&r.tenant.0).copied().unwrap_or(0) {
                f(r);
            }
            Ok(())
        })?;
        Ok(cursors)
    }

    /// The tenant's cursor and its events waiting in the log: from this
    /// process's index, or from the files where another process appends.
    async fn waiting_records(&self, tenant: TenantId) -> Result<(u64, Vec<Record>)> {
        match self.log().await {
            Ok(log) => log.waiting(tenant),
            Err(Error::Storage(_)) => {
                let mut out = Vec::new();
                let cursors = self
                    .waiting_in_files(|r| {
                        if r.tenant == tenant {
                            out.push(r);
                        }
                    })
                    .await?;
                Ok((cursors.get(&tenant.0).copied().unwrap_or(0), out))
            }
            Err(e) => Err(e),
        }
    }

    /// The events waiting in the log and the oldest one's `received_at`:
    /// from this process's index, or from the files where another process
    /// appends.
    async fn log_stats(&self) -> Result<(i64, Option<DateTime<Utc>>)> {
        match self.log().await {
            Ok(log) => Ok(log.stats()),
            Err(Error::Storage(_)) => {
                let (mut n, mut oldest) = (0i64, None::<DateTime<Utc>>);
                self.waiting_in_files(|r| {
                    n += 1;
                    oldest = Some(oldest.map_or(r.received_at, |o| o.min(r.received_at)));
                })
                .await?;
                Ok((n, oldest))
            }
            Err(e) => Err(e),
        }
    }
}

/// Accepted events waiting: the accept log's, and rows of the inbox table
/// not moved into it yet (counted and searched like the inbox rows they
/// are, by the trait's defaults).
#[async_trait]
impl WaitingEngine for SqliteStore {
    async fn waiting_stats(&self, db: &Db) -> Result<(i64, Option<DateTime<Utc>>)> {
        let (n, oldest) = self.log_stats().await?;
        let (rows, row_oldest) = db
            .read_one(Q::new(
                "SELECT count(*) AS n, min(received_at) AS oldest FROM inbox",
            ))
            .await
            .and_then(|r| Ok((r.int("n")?, r.opt_time("oldest")?)))?;
        let oldest = match (oldest, row_oldest) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Ok((n + rows, oldest))
    }

    async fn waiting_empty(&self, db: &Db) -> Result<bool> {
        if self.log_stats().await?.0 > 0 {
            return Ok(false);
        }
        Ok(db
            .read_opt(Q::new("SELECT seq FROM inbox LIMIT 1"))
            .await?
            .is_none())
    }

    async fn next_waiting(
        &self,
        _db: &Db,
        tenant: TenantId,
        after: Option<i64>,
    ) -> Result<Option<(i64, fastack_entities::EventId)>> {
        Ok(self
            .log()
            .await?
            .next_waiting(tenant, after.map(|a| a.max(0) as u64))
            .map(|(seq, id)| (seq as i64, id)))
    }

    fn put_back(&self) {
        self.inbox_rows.store(true, Ordering::Release);
    }

    async fn record_failure(
        &self,
        _db: &Db,
        tenant: TenantId,
        seq: i64,
        error: &str,
    ) -> Result<u32> {
        if self
            .log()
            .await?
            .waiting_record(tenant, seq.max(0) as u64)?
            .is_none()
        {
            return Ok(0);
        }
        let attempts: i64 = sqlx::query_scalar(
            "INSERT INTO log_failures (tenant_id, seq, attempts, last_error) VALUES ($1, $2, 1, $3) \
             ON CONFLICT (tenant_id, seq) DO UPDATE SET attempts = attempts + 1, \
                 last_error = excluded.last_error \
             RETURNING attempts",
        )
        .bind(tenant.0)
        .bind(seq)
        .bind(error)
        .fetch_all(&self.writer)
        .await?
        .into_iter()
        .next()
        .unwrap_or(0);
        Ok(u32::try_from(attempts).unwrap_or(u32::MAX))
    }

    async fn quarantine(
        &self,
        _db: &Db,
        tenant: TenantId,
        seq: i64,
        now: DateTime<Utc>,
    ) -> Result<Option<fastack_entities::QuarantinedEvent>> {
        let log = self.log().await?;
        let seq = seq.max(0) as u64;
        // Only the tenant's first waiting event moves: the cursor moves to
        // it, past nothing else.
        if log.first_waiting(tenant).map(|(s, _)| s) != Some(seq) {
            return Ok(None);
        }
        let Some(record) = log.waiting_record(tenant, seq)? else {
            return Ok(None);
        };
        let (cursor, _) = log.waiting(tenant)?;
        let mut tx = Tx::Lite(self.writer.begin().await?);
        let failure = tx
            .fetch_opt(
                Q::new(
                    "DELETE FROM log_failures WHERE tenant_id = $1 AND seq = $2 \
                     RETURNING attempts, last_error",
                )
                .bind(tenant.0)
                .bind(seq as i64),
            )
            .await?;
        let (attempts, error) = match failure {
            Some(r) => (r.int("attempts")?, r.opt_text("last_error")?),
            None => (0, None),
        };
        let row = fastack_entities::db::quarantine::Model {
            tenant_id: tenant,
            event_id: record.event_id,
            payload: record.payload.clone(),
            received_at: record.received_at.into(),
            error: error.unwrap_or_else(|| "unknown error".to_owned()),
            attempts: i32::try_from(attempts).unwrap_or(i32::MAX),
            quarantined_at: now.into(),
        };
        crate::store::waiting::put_in_quarantine(&mut tx, &row).await?;
        // Its key stays taken: a retry of the event is a duplicate (the
        // event, if put back, keeps its key).
        let occurred_at = decode_payload(&record.payload)
            .map(|e| e.occurred_at.with_timezone(&Utc))
            .unwrap_or(record.received_at);
        tx.execute(
            Q::new(
                "INSERT INTO idempotency_keys \
                 (tenant_id, idempotency_key, event_id, fingerprint, occurred_at, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
            )
            .bind(tenant.0)
            .bind(record.key.clone())
            .bind(record.event_id.0)
            .bind(record.fingerprint.to_vec())
            .bind(occurred_at)
            .bind(record.received_at),
        )
        .await?;
        processing::advance_cursor(&mut tx, tenant, cursor, seq).await?;
        tx.commit().await?;
        log.consumed(tenant, seq);
        Ok(Some(row.into()))
    }

    async fn waiting_range(
        &self,
        _tx: &mut Tx<'_>,
        tenant: TenantId,
    ) -> Result<Option<(i64, i64)>> {
        // (Rows of the inbox table not moved into the log yet are not in the
        // range; `first_waiting` waits for them while they are there.)
        let (_, records) = self.waiting_records(tenant).await?;
        Ok(match (records.first(), records.last()) {
            (Some(a), Some(b)) => Some((a.seq as i64, b.seq as i64)),
            _ => None,
        })
    }

    async fn waiting_payloads(
        &self,
        db: &Db,
        _tx: Option<&mut Tx<'_>>,
        tenant: TenantId,
        (from, to): (i64, i64),
        identifies: bool,
    ) -> Result<Vec<String>> {
        let (_, records) = self.waiting_records(tenant).await?;
        let mut out: Vec<String> = records
            .into_iter()
            .filter(|r| (from..=to).contains(&(r.seq as i64)))
            .map(|r| r.payload)
            .filter(|p| !identifies || p.contains("\"identify\""))
            .collect();
        // Rows of the inbox table not moved yet: every one of the tenant's.
        let rows = db
            .read(Q::new("SELECT payload FROM inbox WHERE tenant_id = $1").bind(tenant.0))
            .await?;
        for r in rows {
            out.push(r.text("payload")?);
        }
        Ok(out)
    }

    async fn first_waiting(
        &self,
        db: &Db,
        tenant: TenantId,
        (from, to): (i64, i64),
    ) -> Result<Option<i64>> {
        let (_, records) = self.waiting_records(tenant).await?;
        if let Some(r) = records
            .iter()
            .find(|r| (from..=to).contains(&(r.seq as i64)))
        {
            return Ok(Some(r.seq as i64));
        }
        // A row of the inbox table not moved yet waits too.
        Ok(db
            .read_opt(Q::new("SELECT seq FROM inbox WHERE tenant_id = $1 LIMIT 1").bind(tenant.0))
            .await?
            .map(|_| to))
    }
}
