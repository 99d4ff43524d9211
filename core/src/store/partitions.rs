//! The monthly partitions of `tracked_events` and what retention does with
//! them: list and count them, read one in key order for its archive, drop it
//! once its archive is verified; and the pruning of the fences whose events
//! are gone. Where a partition's rows are is the backend's [`Engine`]'s.

use async_trait::async_trait;
use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use fastack_entities::{ContactId, EventId, TenantId};

use super::{
    TimeRange,
    db::{Db, Q, Row, Tx},
};
use crate::error::{Error, Result};

impl TimeRange {
    /// The months this range touches.
    pub fn months(&self) -> Vec<Month> {
        let mut out = Vec::new();
        let mut m = Month::of(self.from);
        while m.start() < self.to {
            out.push(m);
            m = m.next();
        }
        out
    }
}

/// A calendar month in UTC: the partition unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Month {
    pub year: i32,
    pub month: u32,
}

impl Month {
    pub fn of(t: DateTime<Utc>) -> Self {
        Month {
            year: t.year(),
            month: t.month(),
        }
    }

    pub fn start(&self) -> DateTime<Utc> {
        Utc.from_utc_datetime(
            &NaiveDate::from_ymd_opt(self.year, self.month, 1)
                .expect("valid month")
                .and_hms_opt(0, 0, 0)
                .expect("midnight"),
        )
    }

    pub fn next(&self) -> Self {
        if self.month == 12 {
            Month {
                year: self.year + 1,
                month: 1,
            }
        } else {
            Month {
                year: self.year,
                month: self.month + 1,
            }
        }
    }

    pub fn prev(&self) -> Self {
        if self.month == 1 {
            Month {
                year: self.year - 1,
                month: 12,
            }
        } else {
            Month {
                year: self.year,
                month: self.month - 1,
            }
        }
    }

    pub fn end(&self) -> DateTime<Utc> {
        self.next().start()
    }

    /// `y2026m11`: the suffix of partition table names.
    pub fn suffix(&self) -> String {
        format!("y{:04}m{:02}", self.year, self.month)
    }

    pub fn parse_suffix(s: &str) -> Option<Self> {
        let rest = s.strip_prefix('y')?;
        let (y, m) = rest.split_once('m')?;
        let month = Month {
            year: y.parse().ok()?,
            month: m.parse().ok()?,
        };
        (1..=12).contains(&month.month).then_some(month)
    }
}

/// A partition of `tracked_events`: one month of one retention class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartitionKey {
    pub month: Month,
    pub retention_class: i16,
}

impl PartitionKey {
    /// The key of a partition table name (`tracked_events_y2026m11_r13`).
    pub fn parse_table(name: &str) -> Option<Self> {
        let rest = name.strip_prefix("tracked_events_")?;
        let (month, class) = rest.split_once("_r")?;
        Some(PartitionKey {
            month: Month::parse_suffix(month)?,
            retention_class: class.parse().ok()?,
        })
    }

    pub fn table_name(&self) -> String {
        format!(
            "tracked_events_{}_r{}",
            self.month.suffix(),
            self.retention_class
        )
    }
}

/// A partition as it exists, with its exact row count.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PartitionInfo {
    #[serde(skip)]
    pub key: PartitionKey,
    pub table: String,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub retention_class: i16,
    pub rows: i64,
}

/// Position in a partition read in primary-key order.
pub type ArchiveCursor = (TenantId, DateTime<Utc>, EventId);

/// One row of `tracked_events` as archived (every column).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ArchiveRow {
    pub tenant_id: TenantId,
    pub id: EventId,
    #[serde(rename = "type")]
    pub kind: String,
    pub event: Option<String>,
    pub contact_id: ContactId,
    pub user_id: Option<String>,
    pub anonymous_id: Option<String>,
    pub properties: serde_json::Value,
    /// With the caller's offset.
    pub occurred_at: String,
    pub received_at: String,
    pub idempotency_key: String,
    pub retention_class: i16,
}

/// What dropping a partition found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropOutcome {
    Dropped,
    /// The partition no longer has the archived row count (a late row
    /// arrived): it is kept, and archived again next run.
    RowsChanged {
        rows: i64,
    },
}

/// How a backend lays out `tracked_events`.
#[async_trait]
pub(crate) trait Layout: Send + Sync {
    /// Makes the partitions of `keys` exist before rows go in.
    async fn prepare(&self, tx: &mut Tx<'_>, keys: &[PartitionKey]) -> Result<()>;
    /// The table rows of partition `key` are inserted into.
    fn table(&self, key: &PartitionKey) -> String;
    /// An insert was refused (a partition dropped meanwhile, possibly on
    /// another node): forget which partitions exist, so the retry makes
    /// them again.
    fn forget(&self);
    /// The transaction that prepared `keys` committed.
    fn created(&self, keys: &[PartitionKey]);
}

/// What a backend does its own way with partitions: where a month's rows
/// are, which partitions exist, and dropping and pruning them.
#[async_trait]
pub(crate) trait PartitionsEngine: Send + Sync {
    /// Where a partition's rows are (`tracked_events`, or the month's own
    /// table).
    fn layout(&self) -> &dyn Layout;
    /// The partitions this node knows exist.
    fn known(&self) -> &KnownPartitions;
    /// Creates `keys` in one transaction (idempotent, safe across nodes).
    async fn create_partitions(&self, keys: &[PartitionKey]) -> Result<()>;
    /// Makes sure the partitions exist: those not known to exist are
    /// created, then known.
    async fn ensure_partitions(&self, keys: &[PartitionKey]) -> Result<()> {
        let missing = self.known().missing(keys);
        if missing.is_empty() {
            return Ok(());
        }
        self.create_partitions(&missing).await?;
        self.known().add(missing);
        Ok(())
    }
    /// The partitions that exist, sorted.
    async fn partition_keys(&self) -> Result<Vec<PartitionKey>>;
    /// Exact row count of one partition; `None` when it does not exist.
    async fn partition_rows(&self, key: PartitionKey) -> Result<Option<i64>>;
    /// See [`Partitions::drop`].
    async fn drop_partition(&self, key: PartitionKey, expected_rows: i64) -> Result<DropOutcome>;
    /// See [`Partitions::prune_idempotency`].
    async fn prune_idempotency(&self, tenants: &[TenantId], before: DateTime<Utc>) -> Result<u64>;
    /// See [`Partitions::prune_processed`].
    async fn prune_processed(&self, before: DateTime<Utc>) -> Result<u64>;
}

/// The partitions of `tracked_events` (see the module doc).
#[derive(Clone, Copy)]
pub struct Partitions<'a> {
    pub(super) db: &'a Db,
    pub(super) engine: &'a dyn PartitionsEngine,
}

impl Partitions<'_> {
    /// Makes sure the partitions exist (idempotent, safe across nodes).
    pub async fn ensure(self, keys: &[PartitionKey]) -> Result<()> {
        self.engine.ensure_partitions(keys).await
    }

    /// Every partition of `tracked_events` (month × retention class), with
    /// exact row counts when asked (`rows` is -1 otherwise). A partition
    /// dropped while the list is made is left out.
    pub async fn list(self, with_rows: bool) -> Result<Vec<PartitionInfo>> {
        let mut out = Vec::new();
        for key in self.engine.partition_keys().await? {
            let rows = if with_rows {
                match self.engine.partition_rows(key).await? {
                    Some(rows) => rows,
                    // Dropped since it was listed.
                    None => continue,
                }
            } else {
                -1
            };
            out.push(PartitionInfo {
                key,
                table: key.table_name(),
                from: key.month.start(),
                to: key.month.end(),
                retention_class: key.retention_class,
                rows,
            });
        }
        Ok(out)
    }

    /// Exact row count of one partition; `None` when it does not exist
    /// (never created, or dropped by a concurrent retention run).
    pub async fn rows(self, key: PartitionKey) -> Result<Option<i64>> {
        self.engine.partition_rows(key).await
    }

    /// A page of a partition in primary-key order, as archive rows.
    pub async fn read(
        self,
        key: PartitionKey,
        after: Option<ArchiveCursor>,
        limit: u32,
    ) -> Result<Vec<(ArchiveCursor, ArchiveRow)>> {
        let q = match after {
            None => Q::new(format!(
                "SELECT {ARCHIVE_COLUMNS} FROM {} ORDER BY tenant_id, occurred_at, id LIMIT $1",
                key.table_name()
            ))
            .bind(i64::from(limit)),
            Some((tenant, occurred, id)) => Q::new(format!(
                "SELECT {ARCHIVE_COLUMNS} FROM {} \
                 WHERE (tenant_id, occurred_at, id) > ($1, $2, $3) \
                 ORDER BY tenant_id, occurred_at, id LIMIT $4",
                key.table_name()
            ))
            .bind(tenant.0)
            .bind(occurred)
            .bind(id.0)
            .bind(i64::from(limit)),
        };
        self.db.read(q).await?.iter().map(archive_from).collect()
    }

    /// Drops the partition if it still holds exactly `expected_rows` rows
    /// (checked under an exclusive lock: the table is append-only, so the
    /// same count means the same rows as the verified archive).
    pub async fn drop(self, key: PartitionKey, expected_rows: i64) -> Result<DropOutcome> {
        self.engine.drop_partition(key, expected_rows).await
    }

    /// Forgets idempotency keys of events older than `before` for these
    /// tenants (their events are gone with their partition).
    pub async fn prune_idempotency(
        self,
        tenants: &[TenantId],
        before: DateTime<Utc>,
    ) -> Result<u64> {
        self.engine.prune_idempotency(tenants, before).await
    }

    /// The second fence is only needed while an inbox row may be
    /// redelivered. Event ids are UUIDv7 (time-ordered), so the primary key
    /// serves the range and no extra index is kept on the hot path.
    pub async fn prune_processed(self, before: DateTime<Utc>) -> Result<u64> {
        self.engine.prune_processed(before).await
    }
}

/// The columns [`archive_from`] reads.
const ARCHIVE_COLUMNS: &str = "tenant_id, id, kind, event, contact_id, user_id, anonymous_id, \
     properties, occurred_at, occurred_offset_s, received_at, idempotency_key, retention_class";

/// A partition's row read with [`ARCHIVE_COLUMNS`], and its cursor.
fn archive_from(r: &Row) -> Result<(ArchiveCursor, ArchiveRow)> {
    let tenant = TenantId(r.uuid("tenant_id")?);
    let id = EventId(r.uuid("id")?);
    let occurred = r.time("occurred_at")?;
    let row = super::archive_row(
        tenant,
        id,
        r.text("kind")?,
        r.opt_text("event")?,
        ContactId(r.uuid("contact_id")?),
        r.opt_text("user_id")?,
        r.opt_text("anonymous_id")?,
        r.json("properties")?,
        occurred,
        i32::try_from(r.int("occurred_offset_s")?)
            .map_err(|_| Error::Corrupt("offset out of range".to_owned()))?,
        r.time("received_at")?,
        r.text("idempotency_key")?,
        i16::try_from(r.int("retention_class")?)
            .map_err(|_| Error::Corrupt("retention class out of range".to_owned()))?,
    )?;
    Ok(((tenant, occurred, id), row))
}

/// The partitions a backend knows exist: a cache in front of its catalog
/// (creating one that exists is harmless, so a stale "missing" costs a
/// statement, never a wrong answer).
#[derive(Debug, Default)]
pub(crate) struct KnownPartitions(parking_lot::Mutex<std::collections::HashSet<PartitionKey>>);

impl KnownPartitions {
    /// Those of `keys` not known to exist, in their order.
    pub(crate) fn missing(&self, keys: &[PartitionKey]) -> Vec<PartitionKey> {
        let known = self.0.lock();
        keys.iter()
            .filter(|k| !known.contains(k))
            .copied()
            .collect()
    }

    pub(crate) fn add(&self, keys: impl IntoIterator<Item = PartitionKey>) {
        self.0.lock().extend(keys);
    }

    /// Every known partition, sorted.
    pub(crate) fn sorted(&self) -> Vec<PartitionKey> {
        let mut keys: Vec<PartitionKey> = self.0.lock().iter().copied().collect();
        keys.sort();
        keys
    }

    pub(crate) fn forget(&self) {
        self.0.lock().clear();
    }

    fn remove(&self, key: &PartitionKey) {
        self.0.lock().remove(key);
    }
}

/// The end of a partition drop, once `tx` holds what keeps rows out of
/// `key`'s table (`rows`: its row count then, `None` when it is gone
/// already): it is dropped only if it still has the `expected` rows its
/// archive holds, and `known` forgets it once it is gone.
pub(crate) async fn drop_counted(
    mut tx: Tx<'_>,
    key: PartitionKey,
    rows: Option<i64>,
    expected: i64,
    known: &KnownPartitions,
) -> Result<DropOutcome> {
    let outcome = match rows {
        None if expected == 0 => DropOutcome::Dropped,
        None => DropOutcome::RowsChanged { rows: 0 },
        Some(rows) if rows != expected => DropOutcome::RowsChanged { rows },
        Some(_) => {
            tx.execute(Q::new(format!("DROP TABLE {}", key.table_name())))
                .await?;
            DropOutcome::Dropped
        }
    };
    tx.commit().await?;
    if rows.is_none() || outcome == DropOutcome::Dropped {
        known.remove(&key);
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use crate::domain::TimeRange;

    use super::*;

    #[test]
    fn months_and_ranges() {
        let m = Month {
            year: 2026,
            month: 12,
        };
        assert_eq!(
            m.next(),
            Month {
                year: 2027,
                month: 1
            }
        );
        assert_eq!(m.next().prev(), m);
        assert_eq!(m.suffix(), "y2026m12");
        assert_eq!(Month::parse_suffix("y2026m12"), Some(m));
        assert_eq!(Month::parse_suffix("y2026m13"), None);
        let r = TimeRange::new(
            "2026-11-30T23:00:00Z".parse().unwrap(),
            "2027-01-01T00:00:00Z".parse().unwrap(),
        )
        .unwrap();
        assert_eq!(
            r.months(),
            vec![
                Month {
                    year: 2026,
                    month: 11
                },
                m
            ]
        );
        assert!(TimeRange::new(r.to, r.from).is_none());
        let key = PartitionKey {
            month: m,
            retention_class: 13,
        };
        assert_eq!(key.table_name(), "tracked_events_y2026m12_r13");
    }
}
