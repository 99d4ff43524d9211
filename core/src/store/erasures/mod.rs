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
//! rows: the requests here, the holds and suppressions in [`holds`], the
//! work on each store in [`work`].

mod holds;
mod work;

use holds::hold;

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
    domain::{Matcher, Person, Subject, SubjectKind, Suppression, Window, sha256_hex},
    error::{Error, Result},
};

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
        let person = crate::store::contacts::resolve(&mut tx, tenant, asked).await?;
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
        let mut person = crate::store::contacts::resolve(&mut tx, tenant, &known).await?;
        // An `identify` accepted before the request and not processed yet
        // links its identifiers all the same.
        let payloads = self
            .waiting
            .waiting_payloads(self.db, Some(&mut tx), tenant, (floor, watermark), true)
            .await?;
        let linked = inbox_links(&payloads, &person);
        if linked.len() > person.len() {
            person = crate::store::contacts::resolve(&mut tx, tenant, &linked).await?;
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
