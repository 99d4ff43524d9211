//! Storage: every SQL statement of fastack lives under this module, one
//! implementation per backend behind the [`Storage`] trait.
//!
//! `tracked_events` can only be read through [`EventQuery`], which cannot be
//! built without a time range: the partition key is part of the type.

use std::{sync::Arc, time::Instant};

use async_trait::async_trait;
use chrono::{DateTime, Datelike, Duration, NaiveDate, TimeZone, Utc};
use fastack_entities::{
    ApiKey, ApiKeyId, Attempt, Contact, ContactId, Delivery, DeliveryId, DeliveryStatus, Endpoint,
    EndpointId, EventId, IdentityKind, Job, JobId, JobStatus, NewEvent, NodeId, PlanVersion,
    QuarantinedEvent, StoredEvent, Tenant, TenantId,
};

use crate::{
    config::Config,
    error::{Error, Result},
};

pub mod console;
pub mod deliveries;
mod encoding;
pub mod erasures;
mod ingest;
pub(crate) mod outbox;
pub mod postgres;
mod processing;
mod record;
mod records;
pub(crate) mod sql;
pub mod sql_store;
pub mod sqlite;
#[allow(unsafe_code)]
pub mod sqlite_alloc;
mod sqlite_handoff;
mod sqlite_inbox;
#[allow(unsafe_code)]
pub mod sqlite_pcache;

pub use console::ConsoleRecords;
pub use deliveries::Deliveries;
// The domain's values, where storage's signatures name them.
pub use crate::domain::{
    EventQuery, IngestRow, Person, Replayed, Subject, SubjectKind, Suppression, TakenKey,
    TimeRange, Window, sha256_hex,
};
pub(crate) use encoding::{annotations, decode_payload, plan_of};
pub use encoding::{archive_row, tracked_body, v7_floor};
pub use erasures::{ErasureRecord, Erasures, Found, Matcher, OutboxScrub};
pub use record::{EventRecord, record_of, records_in};
pub use records::*;
pub use sql::Db;

pub type Store = Arc<dyn Storage>;

#[async_trait]
pub trait Storage: Send + Sync + std::fmt::Debug + 'static {
    fn backend(&self) -> Backend;

    /// Webhook deliveries as people act on them: replays, endpoint
    /// deletion, latest outcomes ([`deliveries`]).
    fn deliveries(&self) -> Deliveries<'_>;

    /// The account console's users, links and sessions ([`console`]). A
    /// new record kind is a module here with a handle like these.
    fn console(&self) -> ConsoleRecords<'_>;

    /// Erasure requests, their holds and suppressions, and an erasure's
    /// work on the database ([`erasures`]).
    fn erasures(&self) -> Erasures<'_>;

    /// The connection itself, for tests that inspect its session settings;
    /// nothing else reads or writes through it.
    #[doc(hidden)]
    fn connection_for_tests(&self) -> &Db;

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
    /// Records when a key was last used.
    async fn touch_api_key(&self, id: ApiKeyId, at: DateTime<Utc>) -> Result<()>;

    // --- the accept path --------------------------------------------------

    /// The group commit: records idempotency keys and, for the rows `keep`
    /// accepts, their inbox rows, in one durable transaction. Returns the
    /// fence result of every row (in input order).
    ///
    /// Nothing commits once `deadline` has passed: a group that reaches
    /// the store too late (a network that held the statement back, a
    /// writer busy until then) fails with [`Error::Deadline`] and stores
    /// nothing. The caller answers `503` at the deadline whatever the
    /// store is doing; this guard is what makes that answer true.
    ///
    /// [`Error::Deadline`]: crate::Error::Deadline
    async fn commit_ingest(
        &self,
        rows: &[IngestRow],
        keep: KeepFn<'_>,
        deadline: Instant,
    ) -> Result<Vec<Fence>>;

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
    /// Whether any inbox row is unprocessed. Cheap while rows wait (one
    /// descent from the newest end of the key index), unlike
    /// [`Storage::inbox_stats`], which counts them all: for pollers.
    async fn inbox_empty(&self) -> Result<bool>;

    /// One processing transaction: lease check, second fence, identity
    /// resolution, append to `tracked_events`, inbox rows consumed (or
    /// listed in [`ProcessOutcome::to_consume`]).
    async fn process_batch(&self, req: &ProcessRequest) -> Result<ProcessOutcome>;

    /// Deletes inbox rows whose processing has committed. Losing this
    /// (a crash) is harmless: the rows are read again and skipped by the
    /// second fence.
    async fn consume_inbox(&self, tenant: TenantId, seqs: &[i64]) -> Result<()>;

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

    // --- jobs -------------------------------------------------------------

    async fn insert_job(&self, job: &Job) -> Result<()>;
    async fn get_job(&self, tenant: TenantId, id: JobId) -> Result<Option<Job>>;
    async fn list_jobs(
        &self,
        tenant: TenantId,
        status: Option<JobStatus>,
        limit: u32,
    ) -> Result<Vec<Job>>;
    /// Claims the oldest runnable job (queued, or processing with an expired
    /// claim: its runner died) for this node, of one kind if given.
    async fn claim_job(
        &self,
        node: NodeId,
        now: DateTime<Utc>,
        claim_for: Duration,
        kind: Option<fastack_entities::JobKind>,
    ) -> Result<Option<Job>>;
    async fn renew_job_claim(&self, id: JobId, node: NodeId, until: DateTime<Utc>) -> Result<bool>;
    /// Writes the terminal state, the pending-event marker and the outbox row
    /// in one transaction — only if this node still holds the job, so a job
    /// ends exactly once. Returns whether it did.
    async fn finish_job(&self, job: &Job, node: NodeId, emit: &Emit) -> Result<bool>;

    // --- outbox -----------------------------------------------------------

    /// New outbox rows written by any node, as they commit: `None` where
    /// the backend has no notifications (SQLite: one process). Missed
    /// notifications (a reconnect) are covered by the relays' polling.
    async fn outbox_notifications(&self) -> Result<Option<tokio::sync::mpsc::Receiver<()>>>;

    /// Claims rows the sink still owes (safe across nodes: a row is claimed
    /// by one caller until the claim expires or is released).
    async fn claim_outbox(
        &self,
        sink: SinkName,
        now: DateTime<Utc>,
        claim_for: Duration,
        limit: u32,
    ) -> Result<Vec<OutboxRow>>;
    /// The sink is done with these rows (published, fanned out): they no
    /// longer owe it; rows no sink owes are deleted, and jobs with nothing
    /// left to send lose their pending marker — one transaction.
    async fn complete_outbox(&self, sink: SinkName, ids: &[i64]) -> Result<()>;
    /// Gives claimed rows back to the sink's queue at once (it failed).
    /// Rows of a batch stay in it, to be claimed again together.
    async fn release_outbox(&self, sink: SinkName, ids: &[i64]) -> Result<()>;
    /// Claims a batch, for a sink that writes files: a batch whose claim
    /// ran out or was given back, whole and under its name, else (with
    /// `new_up_to`) the oldest owed rows holding up to that many events,
    /// under a new name (recorded durably before it is returned).
    async fn claim_outbox_batch(
        &self,
        sink: SinkName,
        now: DateTime<Utc>,
        claim_for: Duration,
        new_up_to: Option<u32>,
    ) -> Result<Option<OutboxBatch>>;
    /// Events the sink owes outside any batch (counted up to `up_to`) and
    /// the oldest one's time: whether a batching sink should flush.
    async fn outbox_owed(&self, sink: SinkName, up_to: u32) -> Result<Owed>;
    /// When the oldest row the sink still owes was written (its lag).
    async fn outbox_oldest(&self, sink: SinkName) -> Result<Option<DateTime<Utc>>>;
    /// The tenant's rows the sink still owes, oldest first.
    async fn outbox_owed_rows(&self, sink: SinkName, tenant: TenantId) -> Result<Vec<OutboxRow>>;
    /// Terminal jobs whose marker is still set but whose outbox row is gone
    /// (a crash between confirm and clear): writes their stored event body
    /// to the outbox again, same ce-id. Claimed, so several nodes sweeping
    /// at once do the work once.
    async fn repair_pending_events(
        &self,
        now: DateTime<Utc>,
        claim_for: Duration,
        emit: &Emit,
        limit: u32,
    ) -> Result<Vec<JobId>>;
    /// Events the sink still owes (metric).
    async fn outbox_depth(&self, sink: SinkName) -> Result<i64>;

    // --- partitions and retention -----------------------------------------

    /// Every partition of `tracked_events` (month × retention class), with
    /// exact row counts when asked (`rows` is -1 otherwise). A partition
    /// dropped while the list is made is left out.
    async fn list_partitions(&self, with_rows: bool) -> Result<Vec<PartitionInfo>>;
    /// Exact row count of one partition; `None` when it does not exist
    /// (never created, or dropped by a concurrent retention run).
    async fn partition_rows(&self, key: PartitionKey) -> Result<Option<i64>>;
    /// A page of a partition in primary-key order, as archive rows.
    async fn read_partition(
        &self,
        key: PartitionKey,
        after: Option<ArchiveCursor>,
        limit: u32,
    ) -> Result<Vec<(ArchiveCursor, ArchiveRow)>>;
    /// Drops the partition if it still holds exactly `expected_rows` rows
    /// (checked under an exclusive lock: the table is append-only, so the
    /// same count means the same rows as the verified archive).
    async fn drop_partition(&self, key: PartitionKey, expected_rows: i64) -> Result<DropOutcome>;
    /// Forgets idempotency keys of events older than `before` for these
    /// tenants (their events are gone with their partition).
    async fn prune_idempotency(&self, tenants: &[TenantId], before: DateTime<Utc>) -> Result<u64>;
    /// The second fence is only needed while an inbox row may be
    /// redelivered. Event ids are UUIDv7 (time-ordered), so the primary key
    /// serves the range and no extra index is kept on the hot path.
    async fn prune_processed(&self, before: DateTime<Utc>) -> Result<u64>;
    /// Partition tables with a retention job queued or running.
    async fn active_retention_jobs(&self) -> Result<Vec<String>>;

    // --- webhooks -----------------------------------------------------------

    async fn insert_endpoint(&self, endpoint: &Endpoint, secret: &[u8]) -> Result<()>;
    async fn list_endpoints(&self, tenant: Option<TenantId>) -> Result<Vec<Endpoint>>;
    async fn get_endpoint(&self, id: EndpointId) -> Result<Option<Endpoint>>;
    /// Enables or disables an endpoint; disabling fails its pending
    /// deliveries.
    async fn set_endpoint_enabled(
        &self,
        id: EndpointId,
        enabled: bool,
        reason: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<bool>;
    /// The current secret becomes the previous one (signing until
    /// `previous_until`); `secret` becomes current.
    async fn rotate_endpoint_secret(
        &self,
        id: EndpointId,
        secret: &[u8],
        previous_until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<bool>;
    /// Whether an enabled endpoint of the tenant subscribes to the type.
    async fn tenant_subscribes(&self, tenant: TenantId, event_type: &str) -> Result<bool>;
    /// Claims deliveries whose next attempt is due, except those of the
    /// endpoints in `skip` (their workers are full: claiming their rows only
    /// to give them back would be churn).
    async fn claim_deliveries(
        &self,
        now: DateTime<Utc>,
        claim_for: Duration,
        limit: u32,
        skip: &[EndpointId],
    ) -> Result<Vec<DueDelivery>>;
    async fn release_deliveries(&self, ids: &[DeliveryId]) -> Result<()>;
    /// Logs attempts and applies their outcomes, in one transaction.
    async fn record_attempts(&self, attempts: &[AttemptRecord]) -> Result<()>;
    /// A tenant's deliveries, newest first, with their attempts; of one
    /// endpoint and in one status when given.
    async fn list_deliveries(
        &self,
        tenant: TenantId,
        endpoint: Option<EndpointId>,
        status: Option<DeliveryStatus>,
        limit: u32,
    ) -> Result<Vec<Delivery>>;

    // --- quarantine ---------------------------------------------------------

    /// The tenant's first inbox row above `after_seq`: `(seq, event id)`.
    async fn next_inbox_row(
        &self,
        tenant: TenantId,
        after_seq: Option<i64>,
    ) -> Result<Option<(i64, EventId)>>;
    /// Counts a failed processing attempt of an inbox row and keeps its
    /// error; returns the attempts so far (0 when the row is gone).
    async fn record_process_failure(&self, tenant: TenantId, seq: i64, error: &str) -> Result<u32>;
    /// Moves an inbox row to quarantine in one transaction; `None` when the
    /// row is gone.
    async fn quarantine(
        &self,
        tenant: TenantId,
        seq: i64,
        now: DateTime<Utc>,
    ) -> Result<Option<QuarantinedEvent>>;
    /// The tenant's quarantined events, oldest first.
    async fn list_quarantine(&self, tenant: TenantId, limit: u32) -> Result<Vec<QuarantinedEvent>>;
    async fn get_quarantined(
        &self,
        tenant: TenantId,
        event: EventId,
    ) -> Result<Option<QuarantinedEvent>>;
    /// Puts a quarantined event back into the inbox, same id and payload,
    /// attempts from zero, in one transaction. Returns whether it was there.
    async fn retry_quarantined(&self, tenant: TenantId, event: EventId) -> Result<bool>;
    /// Discards a quarantined event for good.
    async fn drop_quarantined(&self, tenant: TenantId, event: EventId) -> Result<bool>;

    // --- tracking plans ---------------------------------------------------

    /// Stores `document` as the tenant's next plan version (`None`: the
    /// plan is removed) and returns the version.
    async fn install_plan(
        &self,
        tenant: TenantId,
        document: Option<&serde_json::Value>,
        at: DateTime<Utc>,
    ) -> Result<u32>;
    /// One version of a tenant's plan; the latest when `version` is `None`.
    async fn plan_version(
        &self,
        tenant: TenantId,
        version: Option<u32>,
    ) -> Result<Option<PlanVersion>>;
    /// Every version of a tenant's plan, oldest first.
    async fn plan_history(&self, tenant: TenantId) -> Result<Vec<PlanVersion>>;
    /// The latest plan version of every tenant that ever had one.
    async fn latest_plan_versions(&self) -> Result<Vec<(TenantId, u32)>>;
    /// Which of `keys` the tenant already used: the event each answered and
    /// its fingerprint.
    async fn taken_keys(&self, tenant: TenantId, keys: &[String]) -> Result<Vec<TakenKey>>;
}

/// Opens the store the configuration names and applies migrations.
pub async fn open(config: &Config) -> Result<Store> {
    let store: Store = match &config.database_url {
        Some(url) if url.starts_with("postgres") => {
            let pg = postgres::PgStore::connect(url).await?;
            Arc::new(sql_store::SqlStore::new(
                sql::Db::Pg(pg.pool().clone()),
                Box::new(pg),
            ))
        }
        _ => {
            let lite = sqlite::SqliteStore::open(&config.sqlite_path()).await?;
            Arc::new(sql_store::SqlStore::new(lite.db(), Box::new(lite)))
        }
    };
    store.migrate().await?;
    Ok(store)
}

/// Opens the store of an existing node, for the command line's tools: on
/// the embedded backend, refuses where no database is (a tool run in the
/// wrong directory would otherwise create an empty one and show nothing).
pub async fn open_existing(config: &Config) -> Result<Store> {
    if config.is_embedded() {
        embedded_exists(config)?;
    }
    open(config).await
}

/// The embedded database the configuration names, or where it was looked
/// for ([`Error::NoDatabase`]).
pub fn embedded_exists(config: &Config) -> Result<std::path::PathBuf> {
    let path = config.sqlite_path();
    if path.exists() {
        return Ok(path);
    }
    let shown = std::path::absolute(&path).unwrap_or(path);
    Err(Error::NoDatabase {
        path: shown.display().to_string(),
    })
}

/// Says so when a newer release migrated the database past this build
/// (see `fastack_migration::up`): the node runs on the expanded schema.
pub(crate) fn newer_schema(unknown: Vec<String>) {
    if !unknown.is_empty() {
        tracing::warn!(
            migrations = ?unknown,
            "the database was migrated by a newer release; running on its schema (releases only expand it)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_made_again_keeps_its_id() {
        let (endpoint, tenant) = (EndpointId::new(), TenantId::new());
        let at: DateTime<Utc> = "2026-12-01T10:00:00.123Z".parse().unwrap();
        let make = |endpoint, ce: &str| {
            NewDelivery::new(endpoint, tenant, "core.event.tracked", ce, "{}".into(), at).id
        };
        let id = make(endpoint, "ev-1");
        assert_eq!(id, make(endpoint, "ev-1"));
        assert_ne!(id, make(endpoint, "ev-2"));
        assert_ne!(id, make(EndpointId::new(), "ev-1"));
        // A v7 carrying the event's time: delivery ids still sort by time.
        assert_eq!(id.0.get_version_num(), 7);
        let (secs, nanos) = id.0.get_timestamp().unwrap().to_unix();
        assert_eq!((secs, nanos / 1_000_000), (at.timestamp() as u64, 123));
    }

    /// AMQP and webhook consumers see what the tracking plan said, in the
    /// same fields as `GET /v1/core/events`.
    #[test]
    fn tracked_body_carries_the_plan_check() {
        let mut ev = StoredEvent {
            id: EventId::new(),
            kind: fastack_entities::EventKind::Track,
            event: Some("Order Completed".into()),
            contact_id: fastack_entities::ContactId::new(),
            user_id: Some("u1".into()),
            anonymous_id: None,
            properties: serde_json::Map::new(),
            occurred_at: Utc::now().fixed_offset(),
            received_at: Utc::now(),
            plan: None,
        };
        let plain: serde_json::Value = serde_json::from_str(&tracked_body(&ev)).unwrap();
        assert!(plain.get("plan_version").is_none());
        ev.plan = Some(fastack_entities::PlanCheck {
            plan_version: 7,
            schema_violations: vec![fastack_entities::SchemaViolation {
                field: "/properties/amount".into(),
                code: "required".into(),
                message: "\"amount\" is a required property".into(),
            }],
        });
        let body: serde_json::Value = serde_json::from_str(&tracked_body(&ev)).unwrap();
        assert_eq!(body["plan_version"], 7);
        assert_eq!(body["schema_violations"][0]["field"], "/properties/amount");
        assert_eq!(body["schema_violations"][0]["code"], "required");
    }

    #[test]
    fn v7_floor_orders_ids_by_time() {
        let t: DateTime<Utc> = "2026-11-30T10:00:00Z".parse().unwrap();
        let floor = v7_floor(t);
        let before = uuid::Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            (t.timestamp() - 1) as u64,
            0,
        ));
        let after = uuid::Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            (t.timestamp() + 1) as u64,
            0,
        ));
        assert!(before < floor && floor < after);
        assert_eq!(floor.get_version_num(), 7);
    }

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
