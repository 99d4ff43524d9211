//! Storage: every SQL statement of fastack lives under this module, one
//! implementation per backend behind the [`Storage`] trait.
//!
//! `tracked_events` can only be read through [`EventQuery`], which cannot be
//! built without a time range: the partition key is part of the type.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Datelike, Duration, NaiveDate, TimeZone, Utc};
use fastack_entities::{
    ApiKey, ApiKeyId, Contact, ContactId, EventId, IdentityKind, NewEvent, NodeId, StoredEvent,
    Tenant, TenantId,
};

use crate::{
    config::Config,
    error::{Error, Result},
};

pub mod postgres;
pub mod sqlite;

pub type Store = Arc<dyn Storage>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// One accepted event on its way into the inbox.
#[derive(Clone, Debug)]
pub struct IngestRow {
    pub tenant_id: TenantId,
    pub idempotency_key: String,
    pub event_id: EventId,
    pub fingerprint: [u8; 32],
    pub occurred_at: DateTime<Utc>,
    pub received_at: DateTime<Utc>,
    /// The validated [`NewEvent`] as JSON.
    pub payload: String,
}

/// What the idempotency fence said about one row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fence {
    /// The key is new: this row's event id now owns it.
    Fresh,
    /// The key was already taken, by this event id and fingerprint.
    Taken {
        event_id: EventId,
        fingerprint: [u8; 32],
    },
}

/// Given the fence result of every row, says which fresh rows to keep. A row
/// not kept is rolled back (its key is released) inside the same transaction:
/// this is how one conflicting item rejects its whole batch request without
/// failing the other requests of the group commit.
pub type KeepFn<'a> = &'a (dyn Fn(&[Fence]) -> Vec<bool> + Sync);

/// A time range `[from, to)`. Every read of `tracked_events` carries one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeRange {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
}

impl TimeRange {
    pub fn new(from: DateTime<Utc>, to: DateTime<Utc>) -> Option<Self> {
        (from < to).then_some(TimeRange { from, to })
    }

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
    pub fn table_name(&self) -> String {
        format!(
            "tracked_events_{}_r{}",
            self.month.suffix(),
            self.retention_class
        )
    }
}

/// A read of `tracked_events`: the time range is mandatory.
#[derive(Clone, Debug)]
pub struct EventQuery {
    pub tenant_id: TenantId,
    pub range: TimeRange,
    /// Contact and everything merged into it.
    pub contact_ids: Option<Vec<ContactId>>,
    pub event: Option<String>,
    /// Resume strictly after this (occurred_at, id).
    pub after: Option<(DateTime<Utc>, EventId)>,
    pub limit: u32,
}

/// Work for one processing transaction.
#[derive(Clone, Debug)]
pub struct ProcessRequest {
    pub tenant_id: TenantId,
    pub node_id: NodeId,
    pub retention_class: i16,
    pub limit: u32,
    pub now: DateTime<Utc>,
    pub lease_ttl: Duration,
}

/// What one processing transaction did.
#[derive(Clone, Debug, Default)]
pub struct ProcessOutcome {
    /// Inbox rows consumed (processed now or already processed before).
    pub consumed: usize,
    /// Events appended to `tracked_events` by this transaction.
    pub appended: Vec<(EventId, DateTime<Utc>)>,
    /// Rows skipped by the second fence (processed by an earlier attempt).
    pub already_processed: usize,
    /// Oldest `received_at` among consumed rows, for the lag metric.
    pub received: Vec<DateTime<Utc>>,
}

/// An API key with its tenant, as the front door needs it.
#[derive(Clone, Debug)]
pub struct KeyRecord {
    pub key: ApiKey,
    pub tenant: Tenant,
}

#[async_trait]
pub trait Storage: Send + Sync + std::fmt::Debug + 'static {
    fn backend(&self) -> Backend;

    /// Cheap round trip for readiness.
    async fn ping(&self) -> Result<()>;

    /// Applies pending migrations.
    async fn migrate(&self) -> Result<()>;

    // --- tenants and keys -------------------------------------------------

    async fn insert_tenant(&self, tenant: &Tenant) -> Result<()>;
    async fn list_tenants(&self) -> Result<Vec<Tenant>>;
    async fn get_tenant(&self, id: TenantId) -> Result<Option<Tenant>>;
    async fn find_tenant_by_name(&self, name: &str) -> Result<Option<Tenant>>;
    async fn update_tenant_plan(
        &self,
        id: TenantId,
        plan: fastack_entities::Plan,
        retention_months: Option<u32>,
    ) -> Result<bool>;

    async fn insert_api_key(&self, key: &ApiKey, hash: &[u8; 32]) -> Result<()>;
    async fn list_api_keys(&self, tenant: TenantId) -> Result<Vec<ApiKey>>;
    async fn revoke_api_key(&self, id: ApiKeyId, at: DateTime<Utc>) -> Result<bool>;
    async fn lookup_api_key(&self, hash: &[u8; 32]) -> Result<Option<KeyRecord>>;

    // --- the accept path --------------------------------------------------

    /// The group commit: records idempotency keys and, for the rows `keep`
    /// accepts, their inbox rows, in one durable transaction. Returns the
    /// fence result of every row (in input order).
    async fn commit_ingest(&self, rows: &[IngestRow], keep: KeepFn<'_>) -> Result<Vec<Fence>>;

    // --- processing -------------------------------------------------------

    /// Takes or renews the tenant's processing lease for this node.
    async fn try_lease(
        &self,
        tenant: TenantId,
        node: NodeId,
        now: DateTime<Utc>,
        ttl: Duration,
    ) -> Result<bool>;
    async fn release_lease(&self, tenant: TenantId, node: NodeId) -> Result<()>;

    /// Tenants with unprocessed inbox rows.
    async fn backlog_tenants(&self, limit: u32) -> Result<Vec<TenantId>>;
    /// Unprocessed inbox rows and the oldest `received_at` among them.
    async fn inbox_stats(&self) -> Result<(i64, Option<DateTime<Utc>>)>;

    /// One processing transaction: lease check, second fence, identity
    /// resolution, append to `tracked_events`, inbox rows consumed.
    async fn process_batch(&self, req: &ProcessRequest) -> Result<ProcessOutcome>;

    /// Makes sure the partitions exist (idempotent, safe across nodes).
    async fn ensure_partitions(&self, keys: &[PartitionKey]) -> Result<()>;

    // --- reads ------------------------------------------------------------

    async fn query_events(&self, q: &EventQuery) -> Result<Vec<StoredEvent>>;
    async fn get_contact(&self, tenant: TenantId, id: ContactId) -> Result<Option<Contact>>;
    async fn find_contact(
        &self,
        tenant: TenantId,
        kind: IdentityKind,
        value: &str,
    ) -> Result<Option<Contact>>;
    /// The contact's canonical id and every contact merged into it.
    async fn contact_family(&self, tenant: TenantId, id: ContactId) -> Result<Vec<ContactId>>;

    /// Row count of `tracked_events` over a range, for tests and admin.
    async fn count_events(&self, tenant: TenantId, range: TimeRange) -> Result<i64>;
}

/// Opens the store the configuration names and applies migrations.
pub async fn open(config: &Config) -> Result<Store> {
    let store: Store = match &config.database_url {
        Some(url) if url.starts_with("postgres") => {
            Arc::new(postgres::PgStore::connect(url).await?)
        }
        _ => {
            let path = config.sqlite_path();
            Arc::new(sqlite::SqliteStore::open(&path).await?)
        }
    };
    store.migrate().await?;
    Ok(store)
}

/// Decodes an inbox payload.
pub(crate) fn decode_payload(payload: &str) -> Result<NewEvent> {
    serde_json::from_str(payload).map_err(|e| Error::Corrupt(format!("inbox payload: {e}")))
}

/// Maps a unique-violation to a conflict with a readable message.
pub(crate) fn map_unique(err: sqlx::Error, what: &str) -> Error {
    match &err {
        sqlx::Error::Database(db) if db.is_unique_violation() => {
            Error::Conflict(format!("{what} already exists"))
        }
        _ => Error::Database(err),
    }
}

#[cfg(test)]
mod tests {
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
