//! Erasure and suppression records, reached through [`Erasures`]
//! (`Storage::erasures`): `erasures` (a request: whom it covers, its
//! window, what it removed so far), `erasure_holds` (identifiers whose
//! events processing drops while their erasure runs) and `suppressions`
//! (identifiers whose events processing drops until lifted), and the
//! erasure's own work on the database: the person's events partition by
//! partition (the partition key on every statement), contacts and
//! identities, quarantined events, owed outbox rows, stored webhook
//! payloads — each with its part of the report in the same transaction, so
//! a run resumed after a crash neither loses nor doubles a count.
//!
//! Identifiers are kept as the hex SHA-256 of their value in holds,
//! suppressions and the report; the request keeps their values only while
//! its job runs. The rules of an erasure (order of the steps, verification,
//! the certificate) are `crate::erasure`'s; this module reads and writes
//! rows.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use fastack_entities::{
    ContactId, IdentityKind, Job, JobId, JobKind, JobStatus, NodeId, TenantId, db::job,
};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use serde::Serialize;
use serde_json::{Map, Value};
use uuid::Uuid;

use super::{
    Emit, Month, PartitionKey, Topic,
    db::{Col, Db, Dialect, ListKind, Q, Row, Tx},
    emit,
    event_record::{records_in, write_event_record},
    jobs::{end_job, job_model},
    outbox::Entry,
    partitions::PartitionsEngine,
};
use crate::{
    domain::{Person, Subject, SubjectKind, Suppression, Window, sha256_hex},
    error::{Error, Result},
};

impl Person {
    fn contact_texts(&self) -> Vec<String> {
        self.contact_ids.iter().map(ContactId::to_string).collect()
    }

    pub(super) fn contact_uuids(&self) -> Vec<Uuid> {
        self.contact_ids.iter().map(|c| c.0).collect()
    }
}

/// Tells whether an event belongs to an erasure, and occurred in its
/// window: a stored event (it has a contact) when it was recorded under one
/// of the person's contacts — the contact they were resolved to, every
/// contact merged into it; an event not processed yet (no contact) when it
/// carries one of their identifiers. An event another person's contact
/// recorded (an anonymous id that moved on to them) stays theirs.
#[derive(Clone, Debug, Default)]
pub struct Matcher {
    contacts: HashSet<String>,
    users: HashSet<String>,
    anonymous: HashSet<String>,
    window: Window,
}

impl Matcher {
    pub fn new(person: &Person, window: Window) -> Matcher {
        Matcher {
            contacts: person.contact_texts().into_iter().collect(),
            users: person.user_ids.iter().cloned().collect(),
            anonymous: person.anonymous_ids.iter().cloned().collect(),
            window,
        }
    }

    pub fn window(&self) -> Window {
        self.window
    }

    /// Whether an event with these fields is the person's.
    pub fn matches(
        &self,
        contact_id: Option<&str>,
        user_id: Option<&str>,
        anonymous_id: Option<&str>,
        occurred_at: DateTime<Utc>,
    ) -> bool {
        let theirs = match contact_id {
            Some(c) => self.contacts.contains(&c.to_ascii_lowercase()),
            None => {
                user_id.is_some_and(|u| self.users.contains(u))
                    || anonymous_id.is_some_and(|a| self.anonymous.contains(a))
            }
        };
        theirs && self.window.contains(occurred_at)
    }

    /// Whether a JSON line of a stored event (an archive row, an export
    /// line) may be the person's, decided without parsing it: `false` when
    /// its `contact_id` (the first one: the event's own, written before its
    /// properties) is there and not theirs. A line without one may be.
    pub fn may_match_line(&self, line: &[u8]) -> bool {
        const KEY: &[u8] = b"\"contact_id\":\"";
        let Some(at) = memchr::memmem::find(line, KEY) else {
            return true;
        };
        let rest = &line[at + KEY.len()..];
        match memchr::memchr(b'"', rest) {
            Some(end) => std::str::from_utf8(&rest[..end])
                .is_ok_and(|c| self.contacts.contains(&c.to_ascii_lowercase())),
            None => true,
        }
    }

    /// Whether a JSON document of an event (the event JSON, an archive
    /// row, an inbox payload) is the person's. A document without a
    /// readable `occurred_at` counts as in the window.
    pub fn matches_json(&self, doc: &Value) -> bool {
        let text = |k: &str| doc.get(k).and_then(Value::as_str);
        let at = text("occurred_at")
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc));
        let theirs = text("contact_id")
            .is_some_and(|c| self.contacts.contains(&c.to_ascii_lowercase()))
            || text("user_id").is_some_and(|u| self.users.contains(u))
            || text("anonymous_id").is_some_and(|a| self.anonymous.contains(a));
        theirs && at.is_none_or(|t| self.window.contains(t))
    }
}

/// An erasure as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct ErasureRecord {
    pub id: JobId,
    pub tenant_id: TenantId,
    /// Whom it covers, by value; `None` once its job ended.
    pub person: Option<Person>,
    /// Whom it covers, hashed (kept).
    pub subjects: Vec<Subject>,
    /// What it removed so far, store by store ([`crate::erasure`]).
    pub report: Value,
    pub suppress: bool,
    pub window: Window,
    /// The tenant's last inbox row when the erasure settled: every row up
    /// to it was accepted before the request was answered.
    pub watermark: Option<i64>,
    pub created_at: DateTime<Utc>,
}

/// An erasure ready for its work ([`Erasures::settle`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    /// Whom it covers, by value.
    pub person: Person,
    /// The tenant's inbox rows accepted before the request: from its first
    /// live row to the watermark (the last row when the erasure settled).
    pub inbox: (i64, i64),
}

/// What one pass over the owed outbox rows did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutboxScrub {
    /// Rows no longer sent: every event they carried was the person's.
    pub rows_cancelled: u64,
    /// Grouped rows written again without the person's events.
    pub rows_rewritten: u64,
    /// The person's events in both.
    pub events_removed: u64,
    /// A sink holds a batch with the person's events right now: nothing
    /// was changed; look again once its claim ends.
    pub busy: bool,
}

/// What was found of a person in the database (the verification pass).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Found {
    pub tracked_events: u64,
    pub contacts: u64,
    pub identities: u64,
    pub inbox: u64,
    pub quarantine: u64,
    pub outbox: u64,
    pub webhook_payloads: u64,
}

impl Found {
    pub fn total(&self) -> u64 {
        self.tracked_events
            + self.contacts
            + self.identities
            + self.inbox
            + self.quarantine
            + self.outbox
            + self.webhook_payloads
    }
}

/// Whether a tenant's processing must screen its events: it has a running
/// erasure or a suppression (`$1` is the tenant). Read by the processing
/// transaction in a statement that runs once it holds its lease row.
pub(crate) const SCREEN: &str = "(EXISTS (SELECT 1 FROM erasure_holds WHERE tenant_id = $1) \
     OR EXISTS (SELECT 1 FROM suppressions WHERE tenant_id = $1))";

/// The erasure and suppression records (see the module doc).
#[derive(Clone, Copy)]
pub struct Erasures<'a> {
    pub(super) db: &'a Db,
    pub(super) engine: &'a dyn PartitionsEngine,
    pub(super) waiting: &'a dyn super::waiting::WaitingEngine,
}

impl Erasures<'_> {
    fn d(self) -> Dialect {
        self.db.dialect()
    }

    /// Queues an erasure in one transaction: its job, its record, a hold on
    /// every identifier of the people it names (resolved now, merges
    /// followed), and their suppression when asked. From its commit on,
    /// processing drops their events.
    pub async fn request(
        self,
        job: &Job,
        asked: &Person,
        window: Window,
        suppress: bool,
    ) -> Result<ErasureRecord> {
        let tenant = job.tenant_id;
        let mut tx = self.db.begin().await?;
        let person = super::contacts::resolve(&mut tx, tenant, asked).await?;
        let subjects = person.subjects();
        tx.run(&job::Entity::insert(job_model(job))).await?;
        tx.execute(
            Q::new(
                "INSERT INTO erasures (id, tenant_id, request, subjects, report, suppress, \
                 window_from, window_to, watermark, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, NULL, $9)",
            )
            .bind(job.id.0)
            .bind(tenant.0)
            .bind(json(&person))
            .bind(json(&subjects))
            .bind(Value::Object(Map::new()))
            .bind(suppress)
            .bind(window.from)
            .bind(window.to)
            .bind(job.created_at),
        )
        .await?;
        hold(&mut tx, tenant, job.id, &person, suppress, job.created_at).await?;
        tx.commit().await?;
        Ok(ErasureRecord {
            id: job.id,
            tenant_id: tenant,
            person: Some(person),
            subjects,
            report: Value::Object(Map::new()),
            suppress,
            window,
            watermark: None,
            created_at: job.created_at,
        })
    }

    /// One erasure.
    pub async fn get(self, id: JobId) -> Result<Option<ErasureRecord>> {
        let Some(r) = self
            .db
            .read_opt(
                Q::new(
                    "SELECT id, tenant_id, request, subjects, report, suppress, window_from, \
                     window_to, watermark, created_at FROM erasures WHERE id = $1",
                )
                .bind(id.0),
            )
            .await?
        else {
            return Ok(None);
        };
        Ok(Some(ErasureRecord {
            id: JobId(r.uuid("id")?),
            tenant_id: TenantId(r.uuid("tenant_id")?),
            person: r
                .opt_json("request")?
                .filter(|v| !v.is_null())
                .map(|v| parse("request", v))
                .transpose()?,
            subjects: parse("subjects", r.json("subjects")?)?,
            report: r.json("report")?,
            suppress: r.bool("suppress")?,
            window: Window {
                from: r.opt_time("window_from")?,
                to: r.opt_time("window_to")?,
            },
            watermark: r.opt_int("watermark")?,
            created_at: r.time("created_at")?,
        }))
    }

    /// Makes the erasure's hold complete before its work starts: waits out
    /// the tenant's processing transaction in flight (it holds its lease row
    /// until it commits; one that starts later sees the holds), resolves
    /// the person again (identities linked since the request, and by
    /// `identify` events still waiting), holds those too, and records the
    /// tenant's last inbox row once.
    pub async fn settle(self, rec: &ErasureRecord) -> Result<Settled> {
        let d = self.d();
        let tenant = rec.tenant_id;
        let known = rec.person.clone().unwrap_or_default();
        let mut tx = self.db.begin_relaxed().await?;
        let waiting = self.waiting.waiting_range(&mut tx, tenant).await?;
        let watermark = match rec.watermark {
            Some(w) => w,
            None => waiting.map_or(0, |(_, hi)| hi),
        };
        // The tenant's first waiting event: every later look at the events
        // up to the watermark starts there, not at the tenant's first index
        // entry (a queue table's deleted rows stay in its index until a
        // vacuum).
        let floor = waiting.map_or(watermark + 1, |(lo, _)| lo);
        let mut person = super::contacts::resolve(&mut tx, tenant, &known).await?;
        // An `identify` accepted before the request and not processed yet
        // links its identifiers all the same.
        let payloads = self
            .waiting
            .waiting_payloads(self.db, Some(&mut tx), tenant, (floor, watermark), true)
            .await?;
        let linked = inbox_links(&payloads, &person);
        if linked.len() > person.len() {
            person = super::contacts::resolve(&mut tx, tenant, &linked).await?;
        }
        hold(
            &mut tx,
            tenant,
            rec.id,
            &person,
            rec.suppress,
            rec.created_at,
        )
        .await?;
        // Last, so processing waits for this transaction no longer than its
        // commit: the lease row is locked by a processing transaction from
        // its first statement to its commit, so taking it waits out the
        // one in flight, and the next one waits for these holds.
        tx.fetch(
            Q::new(format!(
                "SELECT tenant_id FROM tenant_leases WHERE tenant_id = $1{}",
                d.lock()
            ))
            .bind(tenant.0),
        )
        .await?;
        tx.execute(
            Q::new("UPDATE erasures SET request = $2, subjects = $3, watermark = $4 WHERE id = $1")
                .bind(rec.id.0)
                .bind(json(&person))
                .bind(json(&person.subjects()))
                .bind(watermark),
        )
        .await?;
        tx.commit().await?;
        Ok(Settled {
            person,
            inbox: (floor, watermark),
        })
    }

    /// The tenant's first waiting event of `[from, to]`; `None` once
    /// processing has passed `to`.
    pub async fn inbox_waiting(self, tenant: TenantId, range: (i64, i64)) -> Result<Option<i64>> {
        self.waiting.first_waiting(self.db, tenant, range).await
    }

    /// Writes the report (after work outside the database).
    pub async fn save_report(self, id: JobId, report: &Value) -> Result<()> {
        self.db
            .execute(
                Q::new("UPDATE erasures SET report = $2 WHERE id = $1")
                    .bind(id.0)
                    .bind(report.clone()),
            )
            .await?;
        Ok(())
    }

    /// Records what the erasure did (or is about to do) to one object of a
    /// store outside the database: `entry` replaces what was recorded.
    pub async fn record_object(
        self,
        id: JobId,
        store: &str,
        path: &str,
        entry: &Value,
    ) -> Result<()> {
        self.db
            .execute(
                Q::new(
                    "INSERT INTO erasure_objects (request_id, store, path, entry) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (request_id, store, path) DO UPDATE SET entry = excluded.entry",
                )
                .bind(id.0)
                .bind(store)
                .bind(path)
                .bind(entry.clone()),
            )
            .await?;
        Ok(())
    }

    /// Every object the erasure recorded: (store, path, entry).
    pub async fn objects(self, id: JobId) -> Result<Vec<(String, String, Value)>> {
        self.db
            .read(
                Q::new(
                    "SELECT store, path, entry FROM erasure_objects WHERE request_id = $1 \
                     ORDER BY store, path",
                )
                .bind(id.0),
            )
            .await?
            .iter()
            .map(|r| Ok((r.text("store")?, r.text("path")?, r.json("entry")?)))
            .collect()
    }

    /// The partitions of `tracked_events`, oldest first.
    pub async fn partitions(self) -> Result<Vec<PartitionKey>> {
        self.engine.partition_keys().await
    }

    /// Where the tenant's events are, month by month: a table and the
    /// month's time range, once per table (PostgreSQL's partitioned
    /// `tracked_events` takes a month's range across its classes; SQLite's
    /// tables are a month and a class each), cut to `window`.
    async fn months(
        self,
        window: Window,
    ) -> Result<Vec<(Month, String, (DateTime<Utc>, DateTime<Utc>))>> {
        let mut out: Vec<(Month, String, (DateTime<Utc>, DateTime<Utc>))> = Vec::new();
        for key in self.partitions().await? {
            let Some(range) = window.clamp(key.month.start(), key.month.end()) else {
                continue;
            };
            let table = self.engine.layout().table(&key);
            if !out.iter().any(|(m, t, _)| *m == key.month && *t == table) {
                out.push((key.month, table, range));
            }
        }
        Ok(out)
    }

    /// `{verb} FROM <table> WHERE <the person's events in it, from-to>
    /// {tail}`: the month's time range on the statement (the partition
    /// key), the person's contacts through the contact index.
    fn in_month(
        self,
        verb: &str,
        tail: &str,
        tenant: TenantId,
        table: &str,
        (from, to): (DateTime<Utc>, DateTime<Utc>),
        person: &Person,
    ) -> Q {
        let d = self.d();
        Q::new(format!(
            "{verb} FROM {table}{} WHERE tenant_id = $1 \
             AND occurred_at >= $2 AND occurred_at < $3 AND {} {tail}",
            d.by_contact(table),
            d.in_list("contact_id", 4, ListKind::Uuid)
        ))
        .bind(tenant.0)
        .bind(from)
        .bind(to)
        .bind(person.contact_uuids())
    }

    /// Deletes the person's events, month by month (every statement names
    /// its month's time range: the partition key), and, within a window,
    /// the traits their erased `identify` events set, unless set again
    /// since; then writes `report(events by month, traits)` — one
    /// transaction. Returns the events removed by month.
    pub async fn erase_events(
        self,
        id: JobId,
        tenant: TenantId,
        person: &Person,
        window: Window,
        report: impl FnOnce(&BTreeMap<Month, u64>, u64) -> Value,
    ) -> Result<BTreeMap<Month, u64>> {
        let returning = if window.is_whole() {
            "RETURNING id"
        } else {
            "RETURNING kind, contact_id, properties"
        };
        let months = self.months(window).await?;
        let mut tx = self.db.begin_relaxed().await?;
        let mut erased: BTreeMap<Month, u64> = BTreeMap::new();
        let mut set: Vec<(ContactId, Map<String, Value>)> = Vec::new();
        for (month, table, range) in months {
            let rows = tx
                .fetch(self.in_month("DELETE", returning, tenant, &table, range, person))
                .await?;
            if rows.is_empty() {
                continue;
            }
            *erased.entry(month).or_default() += rows.len() as u64;
            if !window.is_whole() {
                for r in &rows {
                    if r.text("kind")? == "identify"
                        && let Value::Object(t) = r.json("properties")?
                    {
                        set.push((ContactId(r.uuid("contact_id")?), t));
                    }
                }
            }
        }
        let traits = strip_traits(&mut tx, tenant, &set).await?;
        if !erased.is_empty() || traits > 0 {
            save(&mut tx, id, report(&erased, traits)).await?;
        }
        tx.commit().await?;
        Ok(erased)
    }

    /// Deletes the person's contacts and identities, then writes
    /// `report(contacts, identities)` — one transaction.
    pub async fn erase_contacts(
        self,
        id: JobId,
        tenant: TenantId,
        person: &Person,
        report: impl FnOnce(u64, u64) -> Value,
    ) -> Result<()> {
        let mut tx = self.db.begin_relaxed().await?;
        let (contacts, identities) = super::contacts::erase(&mut tx, tenant, person).await?;
        if contacts + identities > 0 {
            save(&mut tx, id, report(contacts, identities)).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Drops the person's quarantined events, then writes `report(n)` —
    /// one transaction. Returns how many (with `act` false, only counts).
    pub async fn erase_quarantine(
        self,
        id: JobId,
        tenant: TenantId,
        matcher: &Matcher,
        act: bool,
        report: impl FnOnce(u64) -> Value,
    ) -> Result<u64> {
        let d = self.d();
        let mut theirs = Vec::new();
        for r in self
            .db
            .read(
                Q::new("SELECT event_id, payload FROM quarantine WHERE tenant_id = $1")
                    .bind(tenant.0),
            )
            .await?
        {
            if payload_matches(matcher, &r.text("payload")?) {
                theirs.push(r.uuid("event_id")?);
            }
        }
        let n = theirs.len() as u64;
        // A row put back in the inbox meanwhile is deleted nowhere here:
        // processing drops it (its person is held).
        if act && !theirs.is_empty() {
            let mut tx = self.db.begin_relaxed().await?;
            tx.execute(
                Q::new(format!(
                    "DELETE FROM quarantine WHERE tenant_id = $1 AND {}",
                    d.in_list("event_id", 2, ListKind::Uuid)
                ))
                .bind(tenant.0)
                .bind(theirs),
            )
            .await?;
            save(&mut tx, id, report(n)).await?;
            tx.commit().await?;
        }
        Ok(n)
    }

    /// The person's events still owed to a sink: a row that only carries
    /// theirs is no longer sent, a grouped row that carries others' too is
    /// written again without theirs; then `report(scrub)` — one
    /// transaction. Nothing changes while a sink holds one of those rows in
    /// a claimed batch ([`OutboxScrub::busy`]): its files are being written
    /// from the rows as they were. With `act` false, only counts.
    pub async fn cancel_outbox(
        self,
        id: JobId,
        tenant: TenantId,
        matcher: &Matcher,
        now: DateTime<Utc>,
        act: bool,
        report: impl FnOnce(&OutboxScrub) -> Value,
    ) -> Result<OutboxScrub> {
        let d = self.d();
        let owed = |lock: &str| {
            Q::new(format!(
                "SELECT id, body FROM outbox WHERE tenant_id = $1 AND topic = $2 \
                 AND routing_key = 'core.event.tracked' ORDER BY id{lock}"
            ))
            .bind(tenant.0)
            .bind(Topic::Core.as_str())
        };
        // A look without locks first: most erasures find nothing owed.
        let (scrub, ..) = owed_scrub(&self.db.read(owed("")).await?, matcher)?;
        if !act || scrub.events_removed == 0 {
            return Ok(scrub);
        }
        let mut tx = self.db.begin_relaxed().await?;
        let rows = tx.fetch(owed(d.lock())).await?;
        let (scrub, cancel, rewrite) = owed_scrub(&rows, matcher)?;
        let touched: Vec<i64> = cancel
            .iter()
            .copied()
            .chain(rewrite.iter().map(|(id, _, _)| *id))
            .collect();
        if touched.is_empty() {
            tx.commit().await?;
            return Ok(scrub);
        }
        let claimed = tx
            .fetch_opt(
                Q::new(format!(
                    "SELECT outbox_id FROM outbox_sinks WHERE {} AND batch IS NOT NULL \
                     AND claimed_until >= $2 LIMIT 1",
                    d.in_list("outbox_id", 1, ListKind::Int)
                ))
                .bind(touched.clone())
                .bind(now),
            )
            .await?;
        if claimed.is_some() {
            tx.commit().await?;
            return Ok(OutboxScrub {
                busy: true,
                ..OutboxScrub::default()
            });
        }
        if !cancel.is_empty() {
            for table_col in [("outbox_sinks", "outbox_id"), ("outbox", "id")] {
                tx.execute(
                    Q::new(format!(
                        "DELETE FROM {} WHERE {}",
                        table_col.0,
                        d.in_list(table_col.1, 1, ListKind::Int)
                    ))
                    .bind(cancel.clone()),
                )
                .await?;
            }
        }
        for (row_id, body, events) in rewrite {
            tx.execute(
                Q::new("UPDATE outbox SET body = $2 WHERE id = $1")
                    .bind(row_id)
                    .bind(body),
            )
            .await?;
            tx.execute(
                Q::new("UPDATE outbox_sinks SET events = $2 WHERE outbox_id = $1")
                    .bind(row_id)
                    .bind(events),
            )
            .await?;
        }
        save(&mut tx, id, report(&scrub)).await?;
        tx.commit().await?;
        Ok(scrub)
    }

    /// Scrubs the stored payloads of the person's `core.event.tracked`
    /// deliveries (the delivery and its attempts stay, the content goes);
    /// those still pending are not sent. Then `report(cancelled,
    /// scrubbed)` — one transaction. With `act` false, only counts.
    pub async fn scrub_deliveries(
        self,
        id: JobId,
        tenant: TenantId,
        person: &Person,
        matcher: &Matcher,
        act: bool,
        report: impl FnOnce(u64, u64) -> Value,
    ) -> Result<u64> {
        let d = self.d();
        let rows = self
            .db
            .read(
                Q::new(format!(
                    "SELECT id, body FROM webhook_deliveries WHERE tenant_id = $1 \
                     AND event_type = 'core.event.tracked' AND body <> '' AND {}",
                    d.in_list(&d.json_member("body", "contact_id"), 2, ListKind::Text)
                ))
                .bind(tenant.0)
                .bind(person.contact_texts()),
            )
            .await?;
        let mut theirs = Vec::new();
        for r in &rows {
            let doc: Value = serde_json::from_str(&r.text("body")?).unwrap_or(Value::Null);
            if matcher.matches_json(&doc) {
                theirs.push(r.uuid("id")?);
            }
        }
        let scrubbed = theirs.len() as u64;
        if act && !theirs.is_empty() {
            let mut tx = self.db.begin_relaxed().await?;
            let cancelled = tx
                .execute(
                    Q::new(format!(
                        "UPDATE webhook_deliveries SET status = 'failed', next_attempt_at = NULL \
                             WHERE status = 'pending' AND {}",
                        d.in_list("id", 1, ListKind::Uuid)
                    ))
                    .bind(theirs.clone()),
                )
                .await?;
            tx.execute(
                Q::new(format!(
                    "UPDATE webhook_deliveries SET body = '' WHERE {}",
                    d.in_list("id", 1, ListKind::Uuid)
                ))
                .bind(theirs),
            )
            .await?;
            save(&mut tx, id, report(cancelled, scrubbed)).await?;
            tx.commit().await?;
        }
        Ok(scrubbed)
    }

    /// Events of the person's the tenant's inbox still holds in `[from,
    /// to]` (none once processing has passed it).
    async fn inbox_matches(
        self,
        tenant: TenantId,
        (from, to): (i64, i64),
        matcher: &Matcher,
    ) -> Result<u64> {
        let payloads = self
            .waiting
            .waiting_payloads(self.db, None, tenant, (from, to), false)
            .await?;
        Ok(payloads
            .iter()
            .filter(|p| payload_matches(matcher, p))
            .count() as u64)
    }

    /// Looks for the person everywhere in the database, changing nothing:
    /// the verification pass.
    pub async fn search(
        self,
        tenant: TenantId,
        person: &Person,
        window: Window,
        inbox: (i64, i64),
        now: DateTime<Utc>,
    ) -> Result<Found> {
        let matcher = Matcher::new(person, window);
        let mut found = Found::default();
        for (_, table, range) in self.months(window).await? {
            let r = self
                .db
                .read_one(self.in_month("SELECT COUNT(*) AS n", "", tenant, &table, range, person))
                .await?;
            found.tracked_events += r.int("n")? as u64;
        }
        if window.is_whole() {
            (found.contacts, found.identities) =
                super::contacts::count(self.db, tenant, person).await?;
        }
        found.inbox = self.inbox_matches(tenant, inbox, &matcher).await?;
        let nothing = |_: u64| Value::Null;
        found.quarantine = self
            .erase_quarantine(JobId(Uuid::nil()), tenant, &matcher, false, nothing)
            .await?;
        found.outbox = self
            .cancel_outbox(JobId(Uuid::nil()), tenant, &matcher, now, false, |_| {
                Value::Null
            })
            .await?
            .events_removed;
        found.webhook_payloads = self
            .scrub_deliveries(
                JobId(Uuid::nil()),
                tenant,
                person,
                &matcher,
                false,
                |_, _| Value::Null,
            )
            .await?;
        Ok(found)
    }

    /// Events of a running erasure's people that processing dropped.
    pub async fn dropped(self, id: JobId) -> Result<u64> {
        let r = self
            .db
            .read_one(
                Q::new(
                    "SELECT CAST(COALESCE(SUM(dropped), 0) AS BIGINT) AS n FROM erasure_holds \
                     WHERE request_id = $1",
                )
                .bind(id.0),
            )
            .await?;
        Ok(r.int("n")?.max(0) as u64)
    }

    /// Ends an erasure's job (as ``Jobs::finish``, only while this
    /// runner holds it) and, in the same transaction, lifts its holds,
    /// forgets the identifiers' values and writes `announce` (the
    /// `core.contact.erased` event) for the sinks of `announce_to`.
    pub(crate) async fn finish(
        self,
        job: &Job,
        node: NodeId,
        emit: &Emit,
        announce: Option<(Entry, &Emit)>,
    ) -> Result<bool> {
        let mut tx = self.db.begin().await?;
        if !end_job(&mut tx, job, node, emit).await? {
            return Ok(false);
        }
        tx.execute(Q::new("DELETE FROM erasure_holds WHERE request_id = $1").bind(job.id.0))
            .await?;
        tx.execute(Q::new("UPDATE erasures SET request = NULL WHERE id = $1").bind(job.id.0))
            .await?;
        if let Some((entry, to)) = announce {
            emit::write(&mut tx, vec![entry], to).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Writes an export job's result (and its document) again: its stored
    /// result was rewritten by an erasure.
    pub async fn rewrite_result(self, job: &Job) -> Result<()> {
        use job::Column as C;
        use sea_orm::sea_query::Expr;
        job::Entity::update_many()
            .col_expr(C::Result, Expr::value(job.result.clone()))
            .col_expr(C::EventBody, Expr::value(job.render()))
            .filter(C::Id.eq(job.id))
            .exec(self.db)
            .await?;
        Ok(())
    }

    /// A tenant's jobs of one kind (in one status), newest first, at most
    /// `limit`: its erasure requests, or the exports an erasure rewrites.
    pub async fn jobs(
        self,
        tenant: TenantId,
        kind: JobKind,
        status: Option<JobStatus>,
        limit: u32,
    ) -> Result<Vec<Job>> {
        use job::Column as C;
        let mut q = job::Entity::find()
            .filter(C::TenantId.eq(tenant))
            .filter(C::Kind.eq(kind.as_str()));
        if let Some(s) = status {
            q = q.filter(C::Status.eq(s.as_str()));
        }
        q.order_by_desc(C::CreatedAt)
            .order_by_desc(C::Id)
            .limit(u64::from(limit))
            .all(self.db)
            .await?
            .into_iter()
            .map(|m| Job::try_from(m).map_err(Error::from))
            .collect()
    }

    /// A tenant's suppressions, newest first; of one identifier when given.
    pub async fn suppressions(
        self,
        tenant: TenantId,
        only: Option<&Subject>,
        limit: u32,
    ) -> Result<Vec<Suppression>> {
        let (filter, kind, sha) = match only.and_then(|s| Some((s.kind.identity()?, s))) {
            Some((kind, s)) => (
                " AND kind = $3 AND sha256 = $4",
                i64::from(kind.as_i16()),
                s.sha256.clone(),
            ),
            None => ("", 0, String::new()),
        };
        let mut q = Q::new(format!(
            "SELECT kind, sha256, request_id, created_at, dropped FROM suppressions \
             WHERE tenant_id = $1{filter} ORDER BY created_at DESC, kind, sha256 LIMIT $2"
        ))
        .bind(tenant.0)
        .bind(i64::from(limit));
        if !filter.is_empty() {
            q = q.bind(kind).bind(sha);
        }
        self.db
            .read(q)
            .await?
            .iter()
            .map(|r| {
                Ok(Suppression {
                    kind: subject_kind(r.int("kind")?)?,
                    sha256: r.text("sha256")?,
                    request_id: JobId(r.uuid("request_id")?),
                    created_at: r.time("created_at")?,
                    dropped: r.int("dropped")?,
                })
            })
            .collect()
    }

    /// Lifts a suppression; whether there was one.
    pub async fn lift(self, tenant: TenantId, subject: &Subject) -> Result<bool> {
        let Some(kind) = subject.kind.identity() else {
            return Ok(false);
        };
        Ok(self
            .db
            .execute(
                Q::new(
                    "DELETE FROM suppressions WHERE tenant_id = $1 AND kind = $2 AND sha256 = $3",
                )
                .bind(tenant.0)
                .bind(i64::from(kind.as_i16()))
                .bind(subject.sha256.clone()),
            )
            .await?
            == 1)
    }
}

fn parse<T: serde::de::DeserializeOwned>(col: &str, v: Value) -> Result<T> {
    serde_json::from_value(v).map_err(|e| Error::Corrupt(format!("erasures.{col}: {e}")))
}

fn json<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("erasure records serialise")
}

fn subject_kind(v: i64) -> Result<SubjectKind> {
    i16::try_from(v)
        .ok()
        .and_then(IdentityKind::from_i16)
        .map(SubjectKind::of)
        .ok_or_else(|| Error::Corrupt(format!("identity kind {v}")))
}

async fn save(tx: &mut Tx<'_>, id: JobId, report: Value) -> Result<()> {
    tx.execute(
        Q::new("UPDATE erasures SET report = $2 WHERE id = $1")
            .bind(id.0)
            .bind(report),
    )
    .await?;
    Ok(())
}

/// What owed outbox rows carry of the person: the counts, the rows that
/// carry only their events, and the others with the person's events taken
/// out (id, the body without them, events left).
fn owed_scrub(
    rows: &[Row],
    matcher: &Matcher,
) -> Result<(OutboxScrub, Vec<i64>, Vec<(i64, String, i64)>)> {
    let mut scrub = OutboxScrub::default();
    let (mut cancel, mut rewrite) = (Vec::new(), Vec::new());
    for r in rows {
        let body = r.text("body")?;
        let (mut kept, mut theirs, mut all) = (String::new(), 0u64, 0u64);
        for record in records_in(&body) {
            // A row this build cannot read is left to its sink, which
            // reports it.
            let Ok(record) = record else {
                theirs = 0;
                break;
            };
            all += 1;
            if matcher.matches(
                Some(&record.contact_id),
                record.user_id.as_deref(),
                record.anonymous_id.as_deref(),
                record.occurred_at,
            ) {
                theirs += 1;
            } else {
                write_event_record(&mut kept, &record);
            }
        }
        if theirs == 0 {
            continue;
        }
        scrub.events_removed += theirs;
        let row_id = r.int("id")?;
        if theirs == all {
            scrub.rows_cancelled += 1;
            cancel.push(row_id);
        } else {
            scrub.rows_rewritten += 1;
            rewrite.push((row_id, kept, (all - theirs) as i64));
        }
    }
    Ok((scrub, cancel, rewrite))
}

/// Whether an inbox or quarantine payload is the person's event.
fn payload_matches(matcher: &Matcher, payload: &str) -> bool {
    serde_json::from_str::<Value>(payload).is_ok_and(|doc| matcher.matches_json(&doc))
}

/// The person with the identifiers the `identify` events waiting in the
/// tenant's inbox (up to `watermark`) link to theirs, transitively.
fn inbox_links(payloads: &[String], person: &Person) -> Person {
    let mut links: Vec<(String, String)> = Vec::new();
    for payload in payloads {
        // A payload this build cannot read is processing's to refuse.
        let Ok(e) = super::decode_payload(payload) else {
            continue;
        };
        if let (fastack_entities::EventKind::Identify, Some(u), Some(a)) =
            (e.kind, e.user_id, e.anonymous_id)
        {
            links.push((u, a));
        }
    }
    let mut users: HashSet<String> = person.user_ids.iter().cloned().collect();
    let mut anons: HashSet<String> = person.anonymous_ids.iter().cloned().collect();
    loop {
        let before = users.len() + anons.len();
        for (u, a) in &links {
            if users.contains(u) || anons.contains(a) {
                users.insert(u.clone());
                anons.insert(a.clone());
            }
        }
        if users.len() + anons.len() == before {
            break;
        }
    }
    Person {
        user_ids: users.into_iter().collect(),
        anonymous_ids: anons.into_iter().collect(),
        contact_ids: person.contact_ids.clone(),
    }
    .normalized()
}

/// Holds every identity of the person for erasure `id` (and suppresses
/// them when asked); identities held already are left as they are.
async fn hold(
    tx: &mut Tx<'_>,
    tenant: TenantId,
    id: JobId,
    person: &Person,
    suppress: bool,
    now: DateTime<Utc>,
) -> Result<()> {
    let d = tx.dialect();
    let ids: Vec<(i64, String)> = person
        .identities()
        .map(|(kind, v)| (i64::from(kind.as_i16()), sha256_hex(v)))
        .collect();
    if ids.is_empty() {
        return Ok(());
    }
    let k = ids.len();
    let kinds = || Col::Int(ids.iter().map(|(kind, _)| *kind).collect());
    let shas = || Col::Text(ids.iter().map(|(_, sha)| sha.clone()).collect());
    tx.insert(d.insert(
        "erasure_holds",
        &[
            ("tenant_id", Col::Uuid(vec![tenant.0; k])),
            ("kind", kinds()),
            ("sha256", shas()),
            ("request_id", Col::Uuid(vec![id.0; k])),
        ],
        "ON CONFLICT DO NOTHING",
    ))
    .await?;
    if suppress {
        tx.insert(d.insert(
            "suppressions",
            &[
                ("tenant_id", Col::Uuid(vec![tenant.0; k])),
                ("kind", kinds()),
                ("sha256", shas()),
                ("request_id", Col::Uuid(vec![id.0; k])),
                ("created_at", Col::Time(vec![now; k])),
            ],
            "ON CONFLICT DO NOTHING",
        ))
        .await?;
    }
    Ok(())
}

/// Within a window the contact stays, but what an erased `identify` set
/// goes: each trait it set is removed from its contact (and the contact it
/// was merged into) where the contact still holds that value. Returns the
/// traits removed.
async fn strip_traits(
    tx: &mut Tx<'_>,
    tenant: TenantId,
    set: &[(ContactId, Map<String, Value>)],
) -> Result<u64> {
    if set.is_empty() {
        return Ok(0);
    }
    let ids: Vec<Uuid> = set.iter().map(|(c, _)| c.0).collect();
    let mut merged: HashMap<Uuid, Uuid> = HashMap::new();
    let mut traits: BTreeMap<Uuid, Map<String, Value>> = BTreeMap::new();
    let mut survivors = Vec::new();
    for (id, into, t) in super::contacts::traits_of(tx, tenant, ids).await? {
        if let Some(s) = into {
            merged.insert(id, s);
            survivors.push(s);
        }
        traits.insert(id, t);
    }
    survivors.retain(|s| !traits.contains_key(s));
    for (id, _, t) in super::contacts::traits_of(tx, tenant, survivors).await? {
        traits.insert(id, t);
    }
    let mut changed: HashSet<Uuid> = HashSet::new();
    let mut removed = 0u64;
    for (contact, erased) in set {
        for target in [Some(contact.0), merged.get(&contact.0).copied()]
            .into_iter()
            .flatten()
        {
            let Some(current) = traits.get_mut(&target) else {
                continue;
            };
            for (k, v) in erased {
                if current.get(k) == Some(v) {
                    current.remove(k);
                    changed.insert(target);
                    removed += 1;
                }
            }
        }
    }
    for id in changed {
        let t = traits.remove(&id).unwrap_or_default();
        super::contacts::set_traits(tx, tenant, id, t).await?;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_person_matches_by_any_identifier_within_the_window() {
        let c = ContactId::new();
        let person = Person {
            user_ids: vec!["u-1".into()],
            anonymous_ids: vec!["a-1".into()],
            contact_ids: vec![c],
        };
        let t: DateTime<Utc> = "2026-11-01T10:00:00Z".parse().unwrap();
        let all = Matcher::new(&person, Window::default());
        assert!(all.matches(None, Some("u-1"), None, t));
        assert!(all.matches(None, None, Some("a-1"), t));
        assert!(all.matches(Some(&c.to_string().to_uppercase()), None, None, t));
        assert!(!all.matches(Some(&ContactId::new().to_string()), Some("u-2"), None, t));
        // Recorded under another person's contact: theirs, not this one's.
        assert!(!all.matches(Some(&ContactId::new().to_string()), Some("u-1"), None, t));
        let window = Window {
            from: Some(t),
            to: Some(t + chrono::Duration::minutes(10)),
        };
        let some = Matcher::new(&person, window);
        assert!(some.matches(None, Some("u-1"), None, t));
        assert!(!some.matches(None, Some("u-1"), None, t + chrono::Duration::minutes(10)));
        assert!(some.matches_json(&serde_json::json!({
            "user_id": "u-1", "occurred_at": "2026-11-01T12:05:00+02:00"
        })));
        let line = format!(r#"{{"id":"x","contact_id":"{c}","user_id":"u-1"}}"#);
        assert!(all.may_match_line(line.as_bytes()));
        let other = format!(
            r#"{{"contact_id":"{}","properties":{{"contact_id":"{c}"}}}}"#,
            ContactId::new()
        );
        assert!(!all.may_match_line(other.as_bytes()));
        assert!(all.may_match_line(br#"{"user_id":"u-1"}"#));
        assert!(!some.matches_json(&serde_json::json!({
            "user_id": "u-1", "occurred_at": "2026-11-01T12:15:00+02:00"
        })));
    }

    #[test]
    fn subjects_are_hashes_sorted_once() {
        let person = Person {
            user_ids: vec!["u-1".into(), "u-1".into()],
            anonymous_ids: vec![],
            contact_ids: vec![],
        }
        .normalized();
        let subjects = person.subjects();
        assert_eq!(subjects.len(), 1);
        assert_eq!(subjects[0].kind, SubjectKind::UserId);
        // sha256("u-1"), as `printf u-1 | sha256sum` prints it.
        assert_eq!(
            subjects[0].sha256,
            "a24a7f55f278dd49fb1f99c5507800cb198a5bfe10fe2126cd0b25672152b0da"
        );
        let window = Window {
            from: Some("2026-01-01T00:00:00Z".parse().unwrap()),
            to: None,
        };
        let start: DateTime<Utc> = "2025-12-01T00:00:00Z".parse().unwrap();
        let end: DateTime<Utc> = "2026-01-01T00:00:00Z".parse().unwrap();
        assert_eq!(window.clamp(start, end), None);
        assert_eq!(
            window.clamp(end, end + chrono::Duration::days(31)),
            Some((end, end + chrono::Duration::days(31)))
        );
    }
}
