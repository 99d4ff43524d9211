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

mod ingest;
mod outbox;
pub mod postgres;
mod processing;
pub mod shared;
pub(crate) mod sql;
pub mod sqlite;
#[allow(unsafe_code)]
pub mod sqlite_alloc;
mod sqlite_handoff;
mod sqlite_inbox;
#[allow(unsafe_code)]
pub mod sqlite_pcache;

pub use sql::Db;

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
    /// The event as processing takes it: what [`decode_payload`] makes of
    /// `payload`, kept so the embedded store's processing need not decode it.
    pub event: Arc<NewEvent>,
}

impl IngestRow {
    /// The row of a validated event under a new event id.
    pub fn new(
        tenant_id: TenantId,
        mut event: NewEvent,
        fingerprint: [u8; 32],
        received_at: DateTime<Utc>,
    ) -> Self {
        // The payload keeps the offset the client sent; the shared event is
        // normalised for processing. Taking the event by value spares a deep
        // copy of its property maps per accepted event.
        let payload = serde_json::to_string(&event).expect("a NewEvent's maps have string keys");
        let occurred_at = event.occurred_at.with_timezone(&Utc);
        event.occurred_at = crate::validate::normalize(event.occurred_at);
        IngestRow {
            tenant_id,
            idempotency_key: event.idempotency_key.clone(),
            event_id: EventId::new(),
            fingerprint,
            occurred_at,
            received_at,
            payload,
            event: Arc::new(event),
        }
    }
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

/// An endpoint's sealed signing secrets.
#[derive(Clone, Debug)]
pub struct SealedSecrets {
    pub current: Vec<u8>,
    /// The rotated-out secret, while it still signs.
    pub previous: Option<(Vec<u8>, DateTime<Utc>)>,
}

/// A delivery to create from an outbox row.
#[derive(Clone, Debug)]
pub struct NewDelivery {
    pub id: DeliveryId,
    pub endpoint_id: EndpointId,
    pub tenant_id: TenantId,
    pub event_type: String,
    pub ce_id: String,
    pub body: String,
    /// When the outbox row was written (for the latency metric).
    pub emitted_at: DateTime<Utc>,
}

impl NewDelivery {
    /// A delivery of event `ce_id` to `endpoint_id`. Its id — the
    /// `webhook-id` receivers deduplicate on — is derived from the two, so
    /// a fan-out made again after a crash (its first attempt may already
    /// have gone out) sends the same id. Time-ordered like every id: a v7
    /// with the event's time, a hash in place of the random bits.
    pub fn new(
        endpoint_id: EndpointId,
        tenant_id: TenantId,
        event_type: &str,
        ce_id: &str,
        body: String,
        emitted_at: DateTime<Utc>,
    ) -> Self {
        use sha2::{Digest, Sha256};
        let hash = Sha256::new()
            .chain_update(endpoint_id.0.as_bytes())
            .chain_update(ce_id.as_bytes())
            .finalize();
        let mut bits = [0u8; 10];
        bits.copy_from_slice(&hash[..10]);
        let millis = u64::try_from(emitted_at.timestamp_millis()).unwrap_or(0);
        NewDelivery {
            id: DeliveryId(uuid::Builder::from_unix_timestamp_millis(millis, &bits).into_uuid()),
            endpoint_id,
            tenant_id,
            event_type: event_type.to_owned(),
            ce_id: ce_id.to_owned(),
            body,
            emitted_at,
        }
    }
}

/// A delivery due for an attempt, with what the attempt needs.
#[derive(Clone, Debug)]
pub struct DueDelivery {
    pub id: DeliveryId,
    pub endpoint: Endpoint,
    pub secrets: SealedSecrets,
    pub event_type: String,
    pub body: String,
    /// Attempts made so far.
    pub attempts: u32,
    pub emitted_at: DateTime<Utc>,
}

/// A finished attempt, to be logged with what it decided.
#[derive(Clone, Debug)]
pub struct AttemptRecord {
    pub delivery: DeliveryId,
    pub endpoint: EndpointId,
    pub attempt: Attempt,
    pub outcome: AttemptOutcome,
}

/// What an attempt decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttemptOutcome {
    Delivered,
    Retry {
        at: DateTime<Utc>,
    },
    /// No more attempts; `disable` the endpoint with this reason (404/410).
    Failed {
        disable: Option<String>,
    },
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

/// An outbound sink, by the name outbox rows record it under (`amqp`,
/// `webhooks`, …). Storage knows no sink by name: the runtime says which
/// sinks a row is written for, and each sink claims its own rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SinkName(pub &'static str);

impl SinkName {
    pub fn as_str(&self) -> &'static str {
        self.0
    }
}

impl std::fmt::Display for SinkName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.0)
    }
}

/// The sink that fans events out to webhook deliveries. Its work is a
/// write to the same database, so the transaction that writes an event
/// does it: delivery rows, not an outbox row it would owe (one commit and
/// one wake-up less between an event and its webhook). Its relay only
/// drains rows owed by an earlier release.
pub const FAN_OUT: SinkName = SinkName("webhooks");

/// The sinks an event is written for. The fan-out ([`FAN_OUT`]) takes it
/// in the writing transaction; every other sink owes an outbox row until it
/// completes it. A row no relayed sink takes is not written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Emit {
    sinks: Vec<SinkName>,
}

impl Emit {
    pub fn to(sinks: impl IntoIterator<Item = SinkName>) -> Self {
        let mut sinks: Vec<SinkName> = sinks.into_iter().collect();
        sinks.sort();
        sinks.dedup();
        Emit { sinks }
    }

    /// These sinks and `more`.
    pub fn and(&self, more: &Emit) -> Emit {
        Emit::to(self.sinks.iter().chain(&more.sinks).copied())
    }

    pub fn any(&self) -> bool {
        !self.sinks.is_empty()
    }

    pub fn sinks(&self) -> &[SinkName] {
        &self.sinks
    }

    /// Whether the fan-out takes the events (in the writing transaction).
    pub fn fans_out(&self) -> bool {
        self.sinks.contains(&FAN_OUT)
    }

    /// Whether a sink takes the events from the outbox (so an outbox row,
    /// and a job's pending marker, are written).
    pub fn relays(&self) -> bool {
        self.relayed().next().is_some()
    }

    /// The sinks that take the events from the outbox.
    pub fn relayed(&self) -> impl Iterator<Item = SinkName> + '_ {
        self.sinks.iter().copied().filter(|s| *s != FAN_OUT)
    }
}

/// The stream an outbox row goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Topic {
    /// `job.completed` / `job.failed`
    Job,
    /// `core.event.tracked`
    Core,
}

impl Topic {
    pub fn as_str(&self) -> &'static str {
        match self {
            Topic::Job => "job",
            Topic::Core => "core",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "job" => Ok(Topic::Job),
            "core" => Ok(Topic::Core),
            other => Err(Error::Corrupt(format!("outbox topic {other}"))),
        }
    }
}

/// An outbox row: one event on its way out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxRow {
    pub id: i64,
    pub tenant_id: TenantId,
    pub topic: Topic,
    /// `job.completed`, `job.failed` or `core.event.tracked`.
    pub routing_key: String,
    /// The CloudEvents id: stable across re-emits, the consumers' dedup key.
    pub ce_id: String,
    /// Job id or event id.
    pub subject: String,
    /// The JSON body, byte for byte.
    pub body: String,
    pub job_id: Option<JobId>,
    pub created_at: DateTime<Utc>,
}

/// Rows a sink that writes files claimed together (see
/// [`Storage::claim_outbox_batch`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxBatch {
    /// Given once, with the first claim; the same when the batch is claimed
    /// again. Files named after it are written once whatever happens.
    pub name: String,
    /// Oldest first.
    pub rows: Vec<OutboxRow>,
}

/// What a sink owes outside any batch (see [`Storage::outbox_owed`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Owed {
    /// At most this many (the span of their ids).
    pub rows: i64,
    /// When the oldest of them was written.
    pub oldest: Option<DateTime<Utc>>,
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

/// The routing key and CloudEvents id of a job's terminal event.
pub fn job_event(id: JobId, status: JobStatus) -> (String, String) {
    let status = status.as_str();
    (
        format!("job.{status}"),
        format!("fastack.job.{status}.{id}"),
    )
}

/// Whether an enabled endpoint of the tenant (`$1`) subscribes to
/// `core.event.tracked`: the same SQL on both backends.
pub(crate) const TRACKED_SUBSCRIBED: &str = "EXISTS (SELECT 1 FROM webhook_endpoints e \
     WHERE e.tenant_id = $1 AND e.enabled AND (',' || e.events || ',') LIKE '%,core.event.tracked,%')";

/// Work for one processing transaction.
#[derive(Clone, Debug)]
pub struct ProcessRequest {
    pub tenant_id: TenantId,
    pub node_id: NodeId,
    pub retention_class: i16,
    pub limit: u32,
    pub now: DateTime<Utc>,
    pub lease_ttl: Duration,
    /// The sinks that take every `core.event.tracked` (the AMQP relay
    /// when streaming is on).
    pub tracked: Emit,
    /// The sinks that take `core.event.tracked` when an enabled endpoint of
    /// the tenant subscribes to it (the webhook fan-out). Decided inside the
    /// transaction, from the endpoints as they are then: an endpoint added
    /// before the transaction starts gets its events, on every node.
    pub tracked_if_subscribed: Emit,
    /// Read only inbox rows whose `seq` is above this (`None`: from the
    /// tenant's oldest row). Lets a processor start its index scan near the
    /// live rows instead of walking every row deleted since the last vacuum.
    pub after_seq: Option<i64>,
    /// Faults a test armed (none in production).
    pub faults: crate::faults::SharedFaults,
}

impl ProcessRequest {
    /// The sinks this transaction's events are written for, given whether
    /// the tenant's endpoints take them.
    pub(crate) fn emit_tracked(&self, subscribed: bool) -> Emit {
        if subscribed {
            self.tracked.and(&self.tracked_if_subscribed)
        } else {
            self.tracked.clone()
        }
    }

    /// Fails the transaction when a test armed a fault for one of these
    /// events (called by every backend once the batch is read, so the
    /// rollback is the real one).
    pub fn check_faults(&self, events: &[(EventId, NewEvent, DateTime<Utc>)]) -> Result<()> {
        self.faults
            .check_processing(events.iter().map(|(_, e, _)| e.idempotency_key.as_str()))
    }
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
    /// Highest inbox `seq` consumed.
    pub last_seq: Option<i64>,
    /// Outbox rows written (events on their way to relayed sinks).
    pub outboxed: usize,
    /// Webhook deliveries created (the fan-out, in the same transaction).
    pub deliveries: usize,
    /// Inbox rows (`seq`) this transaction processed but left in the inbox:
    /// the caller passes them to [`Storage::consume_inbox`] once it has
    /// acted on the commit (empty where the transaction deleted them).
    pub to_consume: Vec<i64>,
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

    /// The connection sea-orm's queries run on: a new record kind (an
    /// entity of `fastack_entities::db`) is read and written through it
    /// without a method here.
    fn records(&self) -> &Db;

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
    /// `new_up_to`) up to that many owed rows, oldest first, under a new
    /// name (recorded durably before it is returned).
    async fn claim_outbox_batch(
        &self,
        sink: SinkName,
        now: DateTime<Utc>,
        claim_for: Duration,
        new_up_to: Option<u32>,
    ) -> Result<Option<OutboxBatch>>;
    /// Rows the sink owes outside any batch (at most) and the oldest one's
    /// time: whether a batching sink should flush.
    async fn outbox_owed(&self, sink: SinkName) -> Result<Owed>;
    /// When the oldest row the sink still owes was written (its lag).
    async fn outbox_oldest(&self, sink: SinkName) -> Result<Option<DateTime<Utc>>>;
    /// The subjects (event ids, job ids) of the tenant's rows the sink
    /// still owes.
    async fn outbox_owed_subjects(
        &self,
        sink: SinkName,
        tenant: TenantId,
    ) -> Result<std::collections::HashSet<String>>;
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
    /// Rows the sink still owes (metric).
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

/// An idempotency key in use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TakenKey {
    pub key: String,
    pub event_id: EventId,
    pub fingerprint: [u8; 32],
}

impl TakenKey {
    /// What the fence says to a row meeting this key.
    pub fn fence(&self) -> Fence {
        Fence::Taken {
            event_id: self.event_id,
            fingerprint: self.fingerprint,
        }
    }
}

pub fn archive_row(
    tenant_id: TenantId,
    id: EventId,
    kind: String,
    event: Option<String>,
    contact_id: ContactId,
    user_id: Option<String>,
    anonymous_id: Option<String>,
    properties: serde_json::Value,
    occurred_at: DateTime<Utc>,
    offset_s: i32,
    received_at: DateTime<Utc>,
    idempotency_key: String,
    retention_class: i16,
) -> Result<ArchiveRow> {
    let offset = chrono::FixedOffset::east_opt(offset_s)
        .ok_or_else(|| Error::Corrupt(format!("offset {offset_s}")))?;
    Ok(ArchiveRow {
        tenant_id,
        id,
        kind,
        event,
        contact_id,
        user_id,
        anonymous_id,
        properties,
        occurred_at: occurred_at
            .with_timezone(&offset)
            .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
        received_at: received_at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
        idempotency_key,
        retention_class,
    })
}

/// Opens the store the configuration names and applies migrations.
pub async fn open(config: &Config) -> Result<Store> {
    let store: Store = match &config.database_url {
        Some(url) if url.starts_with("postgres") => {
            let pg = postgres::PgStore::connect(url).await?;
            Arc::new(shared::SqlStore::new(
                sql::Db::Pg(pg.pool().clone()),
                Box::new(pg),
            ))
        }
        _ => {
            let lite = sqlite::SqliteStore::open(&config.sqlite_path()).await?;
            Arc::new(shared::SqlStore::new(lite.db(), Box::new(lite)))
        }
    };
    store.migrate().await?;
    Ok(store)
}

/// The JSON body of a `core.event.tracked` event (same fields as
/// `GET /v1/core/events`).
pub fn tracked_body(ev: &StoredEvent) -> String {
    use serde_json::{Map, Value, json};
    let mut m = Map::new();
    m.insert("id".into(), json!(ev.id));
    m.insert("type".into(), json!(ev.kind.as_str()));
    if let Some(name) = &ev.event {
        m.insert("event".into(), json!(name));
    }
    m.insert("contact_id".into(), json!(ev.contact_id));
    // Absent ids are left out, as `GET /v1/core/events` leaves them out.
    if let Some(u) = &ev.user_id {
        m.insert("user_id".into(), json!(u));
    }
    if let Some(a) = &ev.anonymous_id {
        m.insert("anonymous_id".into(), json!(a));
    }
    let key = match ev.kind {
        fastack_entities::EventKind::Track => "properties",
        fastack_entities::EventKind::Identify => "traits",
    };
    m.insert(key.into(), Value::Object(ev.properties.clone()));
    m.insert(
        "occurred_at".into(),
        json!(
            ev.occurred_at
                .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
        ),
    );
    m.insert(
        "received_at".into(),
        json!(
            ev.received_at
                .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
        ),
    );
    if let Some(plan) = &ev.plan {
        m.insert("plan_version".into(), json!(plan.plan_version));
        if !plan.schema_violations.is_empty() {
            m.insert("schema_violations".into(), json!(plan.schema_violations));
        }
    }
    Value::Object(m).to_string()
}

/// An event's `annotations` column: what its tracking plan said.
pub(crate) fn annotations(plan: &fastack_entities::PlanCheck) -> String {
    serde_json::to_string(plan).expect("a plan check serialises")
}

/// Reads an event's `annotations` column.
pub(crate) fn plan_of(
    annotations: Option<serde_json::Value>,
) -> Result<Option<fastack_entities::PlanCheck>> {
    annotations
        .map(serde_json::from_value)
        .transpose()
        .map_err(|e| crate::Error::Corrupt(format!("annotations: {e}")))
}

/// The smallest UUIDv7 of the millisecond `at`: every v7 id generated
/// before `at` sorts below it.
pub fn v7_floor(at: DateTime<Utc>) -> uuid::Uuid {
    let ms = at.timestamp_millis().max(0) as u64;
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    bytes[6] = 0x70;
    bytes[8] = 0x80;
    uuid::Uuid::from_bytes(bytes)
}

/// Decodes an inbox payload. The instant is normalised again, so rows
/// queued by a release that kept leap seconds are stored like new ones.
pub(crate) fn decode_payload(payload: &str) -> Result<NewEvent> {
    let mut event: NewEvent =
        serde_json::from_str(payload).map_err(|e| Error::Corrupt(format!("inbox payload: {e}")))?;
    event.occurred_at = crate::validate::normalize(event.occurred_at);
    Ok(event)
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
