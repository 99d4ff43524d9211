//! Where the embedded store keeps events: a table per month and retention
//! class, read with `UNION ALL`, created under the writer, dropped whole.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use fastack_entities::{StoredEvent, TenantId};
use sqlx::{AssertSqlSafe, SqliteConnection};
use uuid::Uuid;

use super::{SqliteStore, us};
use crate::{
    error::{Error, Result},
    store::{
        DropOutcome, EventQuery, PartitionKey, TimeRange,
        db::Tx,
        events::{EVENT_COLUMNS, EventsEngine, event_from},
        partitions::{KnownPartitions, Layout, PartitionsEngine, drop_counted},
    },
};

/// `$start, $start+1, …`: for the few statements that reuse a parameter.
fn numbered(start: usize, n: usize) -> String {
    (start..start + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

async fn create_partition(conn: &mut SqliteConnection, key: &PartitionKey) -> Result<()> {
    let table = key.table_name();
    let (from, to) = (us(key.month.start()), us(key.month.end()));
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {table} (
            tenant_id BLOB NOT NULL,
            occurred_at INTEGER NOT NULL CHECK (occurred_at >= {from} AND occurred_at < {to}),
            id BLOB NOT NULL,
            retention_class INTEGER NOT NULL CHECK (retention_class = {class}),
            kind TEXT NOT NULL,
            event TEXT,
            contact_id BLOB NOT NULL,
            user_id TEXT,
            anonymous_id TEXT,
            properties TEXT NOT NULL,
            occurred_offset_s INTEGER NOT NULL,
            received_at INTEGER NOT NULL,
            idempotency_key TEXT NOT NULL,
            annotations TEXT,
            PRIMARY KEY (tenant_id, occurred_at, id)
        ) WITHOUT ROWID",
        class = key.retention_class
    )))
    .execute(&mut *conn)
    .await?;
    sqlx::query(AssertSqlSafe(format!(
        "CREATE INDEX IF NOT EXISTS {table}_contact ON {table} (tenant_id, contact_id, occurred_at)"
    )))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Rows of one month table, or `None` when it does not exist; callers run
/// it inside a transaction so existence and count agree.
async fn count_partition(conn: &mut SqliteConnection, table: &str) -> Result<Option<i64>> {
    let exists: Option<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' AND name = $1")
            .bind(table)
            .fetch_optional(&mut *conn)
            .await?;
    if exists.is_none() {
        return Ok(None);
    }
    let rows = sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(&mut *conn)
        .await?;
    Ok(Some(rows))
}

/// A table per month and class; SQLite's DDL is transactional, so a new
/// month's table commits with the rows it receives, or not at all.
#[async_trait]
impl Layout for SqliteStore {
    async fn prepare(&self, tx: &mut Tx<'_>, keys: &[PartitionKey]) -> Result<()> {
        let Tx::Lite(tx) = tx else {
            return Err(Error::Corrupt(
                "a SQLite layout in another backend's transaction".to_owned(),
            ));
        };
        for key in self.partitions.missing(keys) {
            create_partition(tx, &key).await?;
        }
        Ok(())
    }

    fn table(&self, key: &PartitionKey) -> String {
        key.table_name()
    }

    fn forget(&self) {
        self.partitions.forget();
    }

    fn created(&self, keys: &[PartitionKey]) {
        self.partitions.add(keys.iter().copied());
    }
}

#[async_trait]
impl EventsEngine for SqliteStore {
    async fn query_events(&self, q: &EventQuery) -> Result<Vec<StoredEvent>> {
        let tables = self.tables_for(&q.range);
        if tables.is_empty() {
            return Ok(Vec::new());
        }
        // $1 tenant, $2 from, $3 to, $4 limit, then optional filters.
        let mut filter = String::new();
        let mut next = 5;
        if q.event.is_some() {
            filter.push_str(&format!(" AND event = ${next}"));
            next += 1;
        }
        if q.after.is_some() {
            filter.push_str(&format!(
                " AND (occurred_at, id) > (${}, ${})",
                next,
                next + 1
            ));
            next += 2;
        }
        if let Some(ids) = &q.contact_ids {
            filter.push_str(&format!(
                " AND contact_id IN ({})",
                numbered(next, ids.len().max(1))
            ));
        }
        let parts: Vec<String> = tables
            .iter()
            .map(|t| {
                format!(
                    "SELECT {EVENT_COLUMNS} FROM {t} \
                     WHERE tenant_id = $1 AND occurred_at >= $2 AND occurred_at < $3{filter}"
                )
            })
            .collect();
        let sql = format!(
            "SELECT * FROM ({}) ORDER BY occurred_at, id LIMIT $4",
            parts.join(" UNION ALL ")
        );
        let mut query = sqlx::query(AssertSqlSafe(sql))
            .bind(q.tenant_id.0)
            .bind(us(q.range.from))
            .bind(us(q.range.to))
            .bind(q.limit as i64);
        if let Some(event) = &q.event {
            query = query.bind(event.as_str());
        }
        if let Some((at, id)) = q.after {
            query = query.bind(us(at)).bind(id.0);
        }
        if let Some(ids) = &q.contact_ids {
            if ids.is_empty() {
                query = query.bind(Uuid::nil());
            }
            for c in ids {
                query = query.bind(c.0);
            }
        }
        let rows = query.fetch_all(&self.reader).await?;
        rows.into_iter()
            .map(|r| event_from(&crate::store::db::Row::Lite(r)))
            .collect()
    }

    async fn count_events(&self, tenant: TenantId, range: TimeRange) -> Result<i64> {
        let mut total = 0;
        for table in self.tables_for(&range) {
            let n: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT count(*) FROM {table} WHERE tenant_id = $1 AND occurred_at >= $2 AND occurred_at < $3"
            )))
            .bind(tenant.0)
            .bind(us(range.from))
            .bind(us(range.to))
            .fetch_one(&self.reader)
            .await?;
            total += n;
        }
        Ok(total)
    }
}

#[async_trait]
impl PartitionsEngine for SqliteStore {
    fn layout(&self) -> &dyn Layout {
        self
    }

    fn known(&self) -> &KnownPartitions {
        &self.partitions
    }

    async fn create_partitions(&self, keys: &[PartitionKey]) -> Result<()> {
        let mut tx = self.writer.begin().await?;
        for key in keys {
            create_partition(&mut tx, key).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn partition_keys(&self) -> Result<Vec<PartitionKey>> {
        Ok(self.partitions.sorted())
    }

    async fn partition_rows(&self, key: PartitionKey) -> Result<Option<i64>> {
        // One read transaction: the existence check and the count see the
        // same snapshot, so a concurrent drop cannot fall between them.
        let mut tx = self.reader.begin().await?;
        let rows = count_partition(&mut tx, &key.table_name()).await?;
        tx.commit().await?;
        Ok(rows)
    }

    async fn drop_partition(&self, key: PartitionKey, expected_rows: i64) -> Result<DropOutcome> {
        let table = key.table_name();
        // The single writer connection: nothing inserts while this runs.
        let mut tx = self.writer.begin().await?;
        let rows = count_partition(&mut tx, &table).await?;
        drop_counted(Tx::Lite(tx), key, rows, expected_rows, &self.partitions).await
    }

    async fn prune_idempotency(&self, tenants: &[TenantId], before: DateTime<Utc>) -> Result<u64> {
        let mut total = 0;
        for t in tenants {
            total += sqlx::query(
                "DELETE FROM idempotency_keys WHERE tenant_id = $1 AND occurred_at < $2",
            )
            .bind(t.0)
            .bind(us(before))
            .execute(&self.writer)
            .await?
            .rows_affected();
        }
        Ok(total)
    }

    async fn prune_processed(&self, before: DateTime<Utc>) -> Result<u64> {
        let done = sqlx::query("DELETE FROM processed_jobs WHERE event_id < $1")
            .bind(crate::store::v7_floor(before))
            .execute(&self.writer)
            .await?;
        Ok(done.rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Month;

    #[test]
    fn placeholders() {
        assert_eq!(numbered(3, 2), "$3, $4");
        assert_eq!(
            PartitionKey::parse_table("tracked_events_y2026m11_r13"),
            Some(PartitionKey {
                month: Month {
                    year: 2026,
                    month: 11
                },
                retention_class: 13
            })
        );
        assert_eq!(
            PartitionKey::parse_table("tracked_events_y2026m11_r13_contact"),
            None
        );
    }
}
