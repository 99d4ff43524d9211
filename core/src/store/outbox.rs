//! The transactional outbox, written once: `outbox` holds each event on its
//! way out (body byte for byte, CloudEvents id), `outbox_sinks` holds a row
//! per (sink, outbox row) still owed. A sink claims its own rows, completes
//! or releases them; a row no sink owes any more is deleted, and a job whose
//! event is out loses its pending marker, in the same transaction. Adding a
//! sink adds rows under a new name: no column, no migration. The webhook
//! fan-out ([`super::FAN_OUT`]) owes no row: whoever writes an event asks
//! for its deliveries beside the outbox rows ([`super::emit`]).
//!
//! A sink that writes files claims rows as a named batch
//! ([`claim_batch`]): the name is given once, durably, with the claim that
//! takes the rows, and a batch whose claim ran out is claimed again whole,
//! never mixed with other rows. A file named after its batch is then
//! written again with the same rows after a crash, never twice with
//! different ones.

use chrono::{DateTime, Duration, Utc};
use fastack_entities::{JobId, TenantId};
use uuid::Uuid;

use super::db::{Col, Db, ListKind, Q, Row, Tx};
use crate::error::{Error, Result};

/// An outbound sink, by the name outbox rows record it under (`amqp`,
/// `webhooks`, …). Storage names one sink only, the webhook fan-out
/// ([`FAN_OUT`], written in the event's own transaction); for every other
/// sink the runtime says which sinks a row is written for, and each sink
/// claims its own rows.
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
/// sink (one that only reads its rows back in batches, as a lake does) is owed
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
/// [`Outbox::claim_batch`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxBatch {
    /// Given once, with the first claim; the same when the batch is claimed
    /// again. Files named after it are written once whatever happens.
    pub name: String,
    /// Oldest first.
    pub rows: Vec<OutboxRow>,
}

/// What a sink owes outside any batch (see [`Outbox::owed`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Owed {
    /// Events owed, counted up to the limit asked (a grouped row carries
    /// several).
    pub events: i64,
    /// When the oldest of them was written.
    pub oldest: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "o.id, o.tenant_id, o.topic, o.routing_key, o.ce_id, o.subject, o.body, \
                       o.job_id, o.created_at";

/// An event to write to the outbox.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub tenant_id: TenantId,
    pub topic: Topic,
    pub routing_key: String,
    pub ce_id: String,
    pub subject: String,
    /// The event JSON (empty when only grouped sinks take the event).
    pub body: String,
    /// The event's record ([`super::record`]), what a grouped row carries:
    /// `Some` for an event when a grouped sink takes it.
    pub record: Option<String>,
    pub job_id: Option<JobId>,
    pub created_at: DateTime<Utc>,
}

fn row_from(r: &Row) -> Result<OutboxRow> {
    Ok(OutboxRow {
        id: r.int("id")?,
        tenant_id: TenantId(r.uuid("tenant_id")?),
        topic: Topic::parse(&r.text("topic")?)?,
        routing_key: r.text("routing_key")?,
        ce_id: r.text("ce_id")?,
        subject: r.text("subject")?,
        body: r.text("body")?,
        job_id: r.opt_uuid("job_id")?.map(JobId),
        created_at: r.time("created_at")?,
    })
}

/// Writes outbox rows for `entries`, owed to every relayed sink of `emit`
/// (none when no relayed sink takes them), in the caller's transaction, and
/// returns how many rows sinks woken at commit are owed (a grouped sink,
/// which flushes by size or age, is not woken). The fan-out owes no row:
/// the writer asks for its deliveries ([`super::emit`]).
pub(crate) async fn write(tx: &mut Tx<'_>, entries: Vec<Entry>, emit: &Emit) -> Result<usize> {
    if entries.is_empty() {
        return Ok(0);
    }
    let (grouped, single): (Vec<SinkName>, Vec<SinkName>) =
        emit.relayed().partition(|s| emit.groups(*s));
    if grouped.is_empty() && single.is_empty() {
        return Ok(0);
    }
    let every: Vec<SinkName> = single.iter().chain(&grouped).copied().collect();
    let owing = |by: OwedBy| match by {
        OwedBy::Single => &single[..],
        OwedBy::Grouped => &grouped[..],
        OwedBy::All => &every[..],
    };
    let rows = rows_for(entries, !single.is_empty(), !grouped.is_empty());
    if rows.is_empty() {
        return Ok(0);
    }
    let d = tx.dialect();
    let mut cols = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    let mut owed = Vec::with_capacity(rows.len());
    for NewRow {
        entry: e,
        owed_by,
        events,
    } in rows
    {
        cols.0.push(e.tenant_id.0);
        cols.1.push(e.topic.as_str().to_owned());
        cols.2.push(e.routing_key);
        cols.3.push(e.ce_id);
        cols.4.push(e.subject);
        cols.5.push(e.body);
        cols.6.push(e.job_id.map(|j| j.0));
        cols.7.push(e.created_at);
        owed.push((owed_by, events));
    }
    let ids: Vec<i64> = tx
        .insert(d.insert(
            "outbox",
            &[
                ("tenant_id", Col::Uuid(cols.0)),
                ("topic", Col::Text(cols.1)),
                ("routing_key", Col::Text(cols.2)),
                ("ce_id", Col::Text(cols.3)),
                ("subject", Col::Text(cols.4)),
                ("body", Col::Text(cols.5)),
                ("job_id", Col::OptUuid(cols.6)),
                ("created_at", Col::Time(cols.7)),
            ],
            "RETURNING id",
        ))
        .await?
        .iter()
        .map(|r| r.int("id"))
        .collect::<Result<_>>()?;
    let outboxed = owed.iter().filter(|(by, _)| *by != OwedBy::Grouped).count();
    let (mut sinks, mut outbox_ids, mut counts) = (Vec::new(), Vec::new(), Vec::new());
    for (id, (owed_by, events)) in ids.iter().zip(owed) {
        for sink in owing(owed_by) {
            sinks.push(sink.as_str().to_owned());
            outbox_ids.push(*id);
            counts.push(events);
        }
    }
    tx.insert(d.insert(
        "outbox_sinks",
        &[
            ("sink", Col::Text(sinks)),
            ("outbox_id", Col::Int(outbox_ids)),
            ("events", Col::Int(counts)),
        ],
        "",
    ))
    .await?;
    // Other nodes' relays hear of the rows when the transaction commits
    // (this node's are woken by the caller); a grouped sink flushes on its
    // timer, so its rows alone wake no one.
    if outboxed > 0
        && let Some(notify) = d.notify(OUTBOX_CHANNEL)
    {
        tx.execute(notify).await?;
    }
    Ok(outboxed)
}

/// An outbox row to write: which sinks owe it and how many events it
/// carries.
struct NewRow {
    entry: Entry,
    owed_by: OwedBy,
    events: i64,
}

/// Which of the emit's relayed sinks owe a row.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OwedBy {
    /// Those that take events one by one.
    Single,
    /// The grouped ones (the row holds a round's events).
    Grouped,
    /// Every one (a job's event, never grouped).
    All,
}

/// The outbox rows for `entries`: one row per event for the sinks that take
/// events one by one; for the grouped sinks one row per tenant and topic,
/// the events' records one after another (read back with
/// [`super::records_in`]). A job's event is never grouped: its row clears
/// the job's pending marker; nor is an event without its record (its JSON
/// reads back as a record too).
fn rows_for(entries: Vec<Entry>, singles: bool, grouping: bool) -> Vec<NewRow> {
    let one = |entry, owed_by| NewRow {
        entry,
        owed_by,
        events: 1,
    };
    let mut rows = Vec::new();
    let mut groups: Vec<(Entry, i64)> = Vec::new();
    for mut e in entries {
        let record = match e.record.take() {
            Some(record) if grouping && e.job_id.is_none() => record,
            _ if e.job_id.is_some() || grouping => {
                rows.push(one(e, OwedBy::All));
                continue;
            }
            _ => {
                if singles {
                    rows.push(one(e, OwedBy::Single));
                }
                continue;
            }
        };
        match groups
            .iter_mut()
            .find(|(g, _)| g.tenant_id == e.tenant_id && g.topic == e.topic)
        {
            Some((group, n)) => {
                group.body.push_str(&record);
                group.created_at = group.created_at.max(e.created_at);
                *n += 1;
            }
            None => groups.push((
                Entry {
                    tenant_id: e.tenant_id,
                    topic: e.topic,
                    routing_key: e.routing_key.clone(),
                    ce_id: e.ce_id.clone(),
                    subject: e.subject.clone(),
                    body: record,
                    record: None,
                    job_id: None,
                    created_at: e.created_at,
                },
                1,
            )),
        }
        if singles {
            rows.push(one(e, OwedBy::Single));
        }
    }
    rows.extend(groups.into_iter().map(|(entry, events)| NewRow {
        entry,
        owed_by: OwedBy::Grouped,
        events,
    }));
    rows
}

/// The notification channel of new outbox rows (PostgreSQL).
pub(crate) const OUTBOX_CHANNEL: &str = "fastack_outbox";

/// The oldest rows the sink owes outside any batch (with `now`: those not
/// claimed), with the events each carries: as many as hold `up_to` events
/// (the first row past it included). Read a page at a time, so a backlog of
/// grouped rows costs one page.
async fn unbatched(
    db: &Db,
    sink: SinkName,
    now: Option<DateTime<Utc>>,
    up_to: u32,
) -> Result<Vec<(i64, i64)>> {
    const PAGE: i64 = 1000;
    let mut out: Vec<(i64, i64)> = Vec::new();
    let mut events = 0i64;
    loop {
        let after = out.last().map_or(0, |(id, _)| *id);
        let mut q = Q::new(format!(
            "SELECT outbox_id, events FROM outbox_sinks \
             WHERE sink = $1 AND batch IS NULL AND outbox_id > $2{} \
             ORDER BY outbox_id LIMIT {PAGE}",
            if now.is_some() {
                " AND (claimed_until IS NULL OR claimed_until < $3)"
            } else {
                ""
            }
        ))
        .bind(sink.as_str())
        .bind(after);
        if let Some(now) = now {
            q = q.bind(now);
        }
        let page = db.read(q).await?;
        for r in &page {
            let n = r.int("events")?;
            out.push((r.int("outbox_id")?, n));
            events += n;
            if events >= i64::from(up_to) {
                return Ok(out);
            }
        }
        if (page.len() as i64) < PAGE {
            return Ok(out);
        }
    }
}

/// The outbox as its sinks see it (see the module doc).
#[derive(Clone, Copy)]
pub struct Outbox<'a> {
    pub(super) db: &'a Db,
}

impl Outbox<'_> {
    /// Listens for [`OUTBOX_CHANNEL`] on a connection of its own (PostgreSQL).
    /// The listener reconnects by itself; the task ends when the receiver is
    /// dropped.
    pub async fn notifications(self) -> Result<Option<tokio::sync::mpsc::Receiver<()>>> {
        let db = self.db;
        let Db::Pg(pool) = db else { return Ok(None) };
        let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
        listener.listen(OUTBOX_CHANNEL).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            loop {
                match listener.recv().await {
                    // A full channel already says "look": nothing is lost.
                    Ok(_) => {
                        if let Err(tokio::sync::mpsc::error::TrySendError::Closed(())) =
                            tx.try_send(())
                        {
                            return;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "outbox notifications interrupted; reconnecting");
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    }
                }
            }
        });
        Ok(Some(rx))
    }

    /// Claims up to `limit` rows the sink owes, oldest first.
    pub async fn claim(
        self,
        sink: SinkName,
        now: DateTime<Utc>,
        claim_for: Duration,
        limit: u32,
    ) -> Result<Vec<OutboxRow>> {
        let db = self.db;
        let d = db.dialect();
        // Relaxed: a claim or completion lost to a crash only sends again.
        let mut tx = db.begin_relaxed().await?;
        let ids: Vec<i64> = tx
            .fetch(
                Q::new(format!(
                    "UPDATE outbox_sinks SET claimed_until = $3, attempts = attempts + 1 \
                     WHERE sink = $1 AND outbox_id IN \
                         (SELECT outbox_id FROM outbox_sinks \
                          WHERE sink = $1 AND (claimed_until IS NULL OR claimed_until < $2) \
                          ORDER BY outbox_id LIMIT $4{}) \
                     RETURNING outbox_id",
                    d.skip_locked("outbox_sinks")
                ))
                .bind(sink.as_str())
                .bind(now)
                .bind(now + claim_for)
                .bind(i64::from(limit)),
            )
            .await?
            .iter()
            .map(|r| r.int("outbox_id"))
            .collect::<Result<_>>()?;
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let rows = tx
            .fetch(
                Q::new(format!(
                    "SELECT {COLUMNS} FROM outbox o WHERE {} ORDER BY o.id",
                    d.in_list("o.id", 1, ListKind::Int)
                ))
                .bind(ids),
            )
            .await?;
        tx.commit().await?;
        rows.iter().map(row_from).collect()
    }

    /// Claims a batch for a sink that writes files: first a batch whose claim
    /// ran out or was given back (whole, under its name), else, with
    /// `new_up_to`, the oldest owed rows holding up to that many events (at
    /// least one row), under a new name.
    /// `None`: nothing to claim, or another relay is taking the only stale
    /// batch right now.
    pub async fn claim_batch(
        self,
        sink: SinkName,
        now: DateTime<Utc>,
        claim_for: Duration,
        new_up_to: Option<u32>,
    ) -> Result<Option<OutboxBatch>> {
        let db = self.db;
        let d = db.dialect();
        // Synced, not relaxed: a name lost to a crash after its file was
        // written would let the same rows go out again under another name.
        let mut tx = db.begin().await?;
        let stale = tx
            .fetch_opt(
                Q::new(
                    "SELECT batch FROM outbox_sinks WHERE sink = $1 AND batch IS NOT NULL \
                     AND (claimed_until IS NULL OR claimed_until < $2) LIMIT 1",
                )
                .bind(sink.as_str())
                .bind(now),
            )
            .await?
            .map(|r| r.text("batch"))
            .transpose()?;
        let name = match stale {
            Some(name) => {
                // Every row of the batch, locked in one order, so two relays
                // never split it; a claim renewed meanwhile means another relay
                // has it.
                let claims = tx
                    .fetch(
                        Q::new(format!(
                            "SELECT claimed_until FROM outbox_sinks WHERE sink = $1 AND batch = $2 \
                             ORDER BY outbox_id{}",
                            d.lock()
                        ))
                        .bind(sink.as_str())
                        .bind(name.clone()),
                    )
                    .await?;
                for claim in &claims {
                    if claim
                        .opt_time("claimed_until")?
                        .is_some_and(|until| until >= now)
                    {
                        tx.commit().await?;
                        return Ok(None);
                    }
                }
                tx.execute(
                    Q::new(
                        "UPDATE outbox_sinks SET claimed_until = $3, attempts = attempts + 1 \
                         WHERE sink = $1 AND batch = $2",
                    )
                    .bind(sink.as_str())
                    .bind(name.clone())
                    .bind(now + claim_for),
                )
                .await?;
                name
            }
            None => {
                let Some(limit) = new_up_to else {
                    tx.commit().await?;
                    return Ok(None);
                };
                // As many of the oldest rows as hold up to `limit` events (at
                // least one): a grouped row carries a transaction's events.
                let mut rows = 0i64;
                let mut events = 0i64;
                for (_, n) in unbatched(db, sink, Some(now), limit).await? {
                    if rows > 0 && events + n > i64::from(limit) {
                        break;
                    }
                    rows += 1;
                    events += n;
                }
                if rows == 0 {
                    tx.commit().await?;
                    return Ok(None);
                }
                let name = Uuid::now_v7().to_string();
                let taken = tx
                    .execute(
                        Q::new(format!(
                            "UPDATE outbox_sinks SET claimed_until = $3, attempts = attempts + 1, \
                                 batch = $5 \
                             WHERE sink = $1 AND outbox_id IN \
                                 (SELECT outbox_id FROM outbox_sinks \
                                  WHERE sink = $1 AND batch IS NULL \
                                    AND (claimed_until IS NULL OR claimed_until < $2) \
                                  ORDER BY outbox_id LIMIT $4{})",
                            d.skip_locked("outbox_sinks")
                        ))
                        .bind(sink.as_str())
                        .bind(now)
                        .bind(now + claim_for)
                        .bind(rows)
                        .bind(name.clone()),
                    )
                    .await?;
                if taken == 0 {
                    tx.commit().await?;
                    return Ok(None);
                }
                name
            }
        };
        let rows = tx
            .fetch(
                Q::new(format!(
                    "SELECT {COLUMNS} FROM outbox o JOIN outbox_sinks s ON s.outbox_id = o.id \
                     WHERE s.sink = $1 AND s.batch = $2 ORDER BY o.id"
                ))
                .bind(sink.as_str())
                .bind(name.clone()),
            )
            .await?
            .iter()
            .map(row_from)
            .collect::<Result<Vec<_>>>()?;
        tx.commit().await?;
        Ok(Some(OutboxBatch { name, rows }))
    }

    /// What the sink owes and has not yet put in a batch: how many events,
    /// counted up to `up_to` (the oldest rows only: bounded whatever the
    /// backlog), and when the oldest was written.
    pub async fn owed(self, sink: SinkName, up_to: u32) -> Result<Owed> {
        let db = self.db;
        let first = db
            .read_opt(
                Q::new(
                    "SELECT o.created_at FROM outbox_sinks s \
                     JOIN outbox o ON o.id = s.outbox_id \
                     WHERE s.sink = $1 AND s.batch IS NULL ORDER BY s.outbox_id LIMIT 1",
                )
                .bind(sink.as_str()),
            )
            .await?;
        let Some(first) = first else {
            return Ok(Owed::default());
        };
        let events = unbatched(db, sink, None, up_to).await?;
        Ok(Owed {
            events: events.iter().map(|(_, n)| n).sum(),
            oldest: Some(first.time("created_at")?),
        })
    }

    /// The tenant's rows the sink still owes: what it is going to send, so
    /// another writer must not.
    pub async fn owed_rows(self, sink: SinkName, tenant: TenantId) -> Result<Vec<OutboxRow>> {
        let db = self.db;
        db.read(
            Q::new(format!(
                "SELECT {COLUMNS} FROM outbox_sinks s JOIN outbox o ON o.id = s.outbox_id \
                 WHERE s.sink = $1 AND o.tenant_id = $2 ORDER BY o.id"
            ))
            .bind(sink.as_str())
            .bind(tenant.0),
        )
        .await?
        .iter()
        .map(row_from)
        .collect()
    }

    /// When the oldest row the sink still owes (batched or not) was written.
    pub async fn oldest(self, sink: SinkName) -> Result<Option<DateTime<Utc>>> {
        let db = self.db;
        db.read_opt(
            Q::new(
                "SELECT o.created_at FROM outbox_sinks s JOIN outbox o ON o.id = s.outbox_id \
                 WHERE s.sink = $1 ORDER BY s.outbox_id LIMIT 1",
            )
            .bind(sink.as_str()),
        )
        .await?
        .map(|r| r.time("created_at"))
        .transpose()
    }

    /// The sink is done with `ids`.
    pub async fn complete(self, sink: SinkName, ids: &[i64]) -> Result<()> {
        let db = self.db;
        if ids.is_empty() {
            return Ok(());
        }
        let d = db.dialect();
        // Relaxed: a claim or completion lost to a crash only sends again.
        let mut tx = db.begin_relaxed().await?;
        // Two sinks completing the same row at once would each still see the
        // other's claim and neither would delete the row (nor clear its job's
        // marker): the row lock makes the second wait and see the first.
        tx.fetch(
            Q::new(format!(
                "SELECT id FROM outbox WHERE {} ORDER BY id{}",
                d.in_list("id", 1, ListKind::Int),
                d.lock()
            ))
            .bind(ids.to_vec()),
        )
        .await?;
        tx.execute(
            Q::new(format!(
                "DELETE FROM outbox_sinks WHERE sink = $1 AND {}",
                d.in_list("outbox_id", 2, ListKind::Int)
            ))
            .bind(sink.as_str())
            .bind(ids.to_vec()),
        )
        .await?;
        let jobs: Vec<Uuid> = tx
            .fetch(
                Q::new(format!(
                    "DELETE FROM outbox WHERE {} \
                       AND NOT EXISTS (SELECT 1 FROM outbox_sinks s WHERE s.outbox_id = outbox.id) \
                     RETURNING job_id",
                    d.in_list("id", 1, ListKind::Int)
                ))
                .bind(ids.to_vec()),
            )
            .await?
            .iter()
            .map(|r| r.opt_uuid("job_id"))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .flatten()
            .collect();
        if !jobs.is_empty() {
            tx.execute(
                Q::new(format!(
                    "UPDATE jobs SET event_pending = false WHERE {} \
                       AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.job_id = jobs.id)",
                    d.in_list("id", 1, ListKind::Uuid)
                ))
                .bind(jobs),
            )
            .await?;
        }
        tx.commit().await
    }

    /// Gives claimed rows back to the sink's queue.
    pub async fn release(self, sink: SinkName, ids: &[i64]) -> Result<()> {
        let db = self.db;
        if ids.is_empty() {
            return Ok(());
        }
        db.execute(
            Q::new(format!(
                "UPDATE outbox_sinks SET claimed_until = NULL WHERE sink = $1 AND {}",
                db.dialect().in_list("outbox_id", 2, ListKind::Int)
            ))
            .bind(sink.as_str())
            .bind(ids.to_vec()),
        )
        .await?;
        Ok(())
    }

    /// Events the sink owes (a grouped row counts its events).
    pub async fn depth(self, sink: SinkName) -> Result<i64> {
        let db = self.db;
        db.read_one(
            Q::new("SELECT coalesce(sum(events), 0) AS n FROM outbox_sinks WHERE sink = $1")
                .bind(sink.as_str()),
        )
        .await?
        .int("n")
    }
}
