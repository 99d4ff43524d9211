//! The values that cross the [`super::Storage`] trait: rows to commit, what
//! a fence decided, time ranges and partition keys, deliveries and attempts,
//! outbox rows and batches, sinks and what they take, processing requests
//! and outcomes.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
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
/// completes it. A row no relayed sink takes is not written. A grouped
/// sink (one that only reads its rows back in batches: the mirror) is owed
/// one row per writing transaction holding all its events, not one per
/// event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Emit {
    sinks: Vec<SinkName>,
    grouped: Vec<SinkName>,
}

impl Emit {
    pub fn to(sinks: impl IntoIterator<Item = SinkName>) -> Self {
        Emit {
            sinks: sorted(sinks),
            grouped: Vec::new(),
        }
    }

    /// These sinks, those of `grouped` among them owed grouped rows.
    pub fn grouping(mut self, grouped: impl IntoIterator<Item = SinkName>) -> Self {
        self.grouped = sorted(grouped.into_iter().filter(|s| self.sinks.contains(s)));
        self
    }

    /// These sinks and `more`.
    pub fn and(&self, more: &Emit) -> Emit {
        Emit::to(self.sinks.iter().chain(&more.sinks).copied())
            .grouping(self.grouped.iter().chain(&more.grouped).copied())
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

    /// Whether an event's JSON is needed: the fan-out or a sink owed a
    /// row per event takes it.
    pub fn takes_bodies(&self) -> bool {
        self.fans_out() || self.relayed().any(|s| !self.groups(s))
    }

    /// Whether a sink is owed grouped rows (of event records).
    pub fn groups_any(&self) -> bool {
        !self.grouped.is_empty()
    }

    /// Whether `sink` is owed grouped rows.
    pub fn groups(&self, sink: SinkName) -> bool {
        self.grouped.contains(&sink)
    }
}

fn sorted(sinks: impl IntoIterator<Item = SinkName>) -> Vec<SinkName> {
    let mut sinks: Vec<SinkName> = sinks.into_iter().collect();
    sinks.sort();
    sinks.dedup();
    sinks
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
    /// Events owed, counted up to the limit asked (a grouped row carries
    /// several).
    pub events: i64,
    /// When the oldest of them was written.
    pub oldest: Option<DateTime<Utc>>,
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
    /// Outbox rows written for sinks woken at commit (events on their way
    /// to relayed sinks; a grouped sink's rows wait for its timer and are
    /// not counted).
    pub outboxed: usize,
    /// Webhook deliveries created (the fan-out, in the same transaction).
    pub deliveries: usize,
    /// Events consumed without being stored: their identifier is
    /// suppressed.
    pub suppressed: usize,
    /// Events consumed without being stored: they belong to a running
    /// erasure's people.
    pub held: usize,
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

impl TakenKey {
    /// What the fence says to a row meeting this key.
    pub fn fence(&self) -> Fence {
        Fence::Taken {
            event_id: self.event_id,
            fingerprint: self.fingerprint,
        }
    }
}
