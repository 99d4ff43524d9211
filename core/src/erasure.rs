//! Forgetting a person: an erasure request and the job that carries it out.
//!
//! A request names people by user id, anonymous id or contact id (at most
//! [`MAX_IDENTIFIERS`] in all), optionally a window of `occurred_at` (only
//! what was sent then is erased; the contact stays) and `suppress` (their
//! future events are dropped too). It is queued as a job of kind `erasure`
//! together with a hold on every identifier linked to the people named
//! ([`crate::store::Erasures::request`]): from that commit on, processing
//! drops their events, so nothing accepted before the answer can be stored
//! after the erasure looked.
//!
//! The job ([`run`]) settles the hold (waits out a processing transaction
//! in flight, resolves the people again, notes the last inbox row accepted
//! before it), waits until processing has passed that row, then removes the
//! people from every store the product keeps: owed outbox rows, stored
//! webhook payloads, quarantine, `tracked_events` partition by partition,
//! contacts and identities, retention archives and stored export results
//! (rewritten, the new objects verified from storage before the old ones
//! are replaced), the Parquet lake. Every step records what it did in the
//! erasure's report in the same transaction (or, for an object, before the
//! object is replaced), so a run resumed after a crash finishes the work
//! without losing or doubling a count. A verification pass then looks
//! everywhere again; the job's result is a certificate of both, signed with
//! the tenant's external HMAC key. Its end lifts the hold, forgets the
//! identifiers' values (the record keeps their SHA-256) and writes
//! `core.contact.erased` in the same transaction ([`finish`]).
//!
//! Nothing here logs an identifier: logs carry the request id and counts.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use fastack_entities::{Job, JobId, JobKind, JobStatus, NodeId, TenantId};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tracing::info;

use crate::{
    crypto::{Keys, hmac_hex},
    domain::Matcher,
    error::{Error, Result},
    export,
    objects::Objects,
    retention,
    store::{Emit, ErasureRecord, Person, Storage, Topic, Window, outbox::Entry},
    validate::FieldError,
};

/// Identifiers (user ids, anonymous ids and contact ids) one request may
/// name in all.
pub const MAX_IDENTIFIERS: usize = 5_000;

/// How long the job waits for processing to pass the events accepted
/// before its request, and for a sink to finish a batch holding them.
const PROCESSING_WAIT: Duration = Duration::from_secs(600);
const BATCH_WAIT: Duration = Duration::from_secs(120);

/// Passes over every store before the job gives up: the verification pass
/// that finds something sends the work round once more.
const PASSES: usize = 2;

/// The routing key and webhook event type of the event an erasure ends
/// with (CloudEvents type `io.fastack.contact.erased`).
pub use fastack_entities::webhook::CONTACT_ERASED;

/// What a request asks for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ErasureRequest {
    pub people: Person,
    pub window: Window,
    pub suppress: bool,
}

impl ErasureRequest {
    /// The rules a request must meet, whoever makes it (the tenant API, the
    /// CLI, the console): 1 to [`MAX_IDENTIFIERS`] identifiers, each 1–255
    /// characters without control characters, `to` after `from`. Errors
    /// name the request member (`/user_ids/3`).
    pub fn check(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let err = |field: String, code: &'static str, message: String| FieldError {
            field,
            index: None,
            code,
            message,
        };
        for (name, list) in [
            ("user_ids", &self.people.user_ids),
            ("anonymous_ids", &self.people.anonymous_ids),
        ] {
            for (i, v) in list.iter().enumerate() {
                let n = v.chars().count();
                if n == 0 || n > 255 {
                    errors.push(err(
                        format!("/{name}/{i}"),
                        "invalid_length",
                        format!("each of `{name}` must be 1 to 255 characters"),
                    ));
                } else if v.chars().any(crate::validate::is_control) {
                    errors.push(err(
                        format!("/{name}/{i}"),
                        "invalid_character",
                        format!("`{name}` must not contain control characters"),
                    ));
                }
            }
        }
        let n = self.people.len();
        if n == 0 {
            errors.push(err(
                String::new(),
                "required",
                "name at least one person: `user_ids`, `anonymous_ids` or `contact_ids`".to_owned(),
            ));
        } else if n > MAX_IDENTIFIERS {
            errors.push(err(
                String::new(),
                "too_many_identifiers",
                format!("at most {MAX_IDENTIFIERS} identifiers in one request ({n} given)"),
            ));
        }
        if let (Some(f), Some(t)) = (self.window.from, self.window.to)
            && f >= t
        {
            errors.push(err(
                "/to".to_owned(),
                "invalid_value",
                "`to` must be after `from`".to_owned(),
            ));
        }
        errors
    }
}

/// Queues an erasure: its job (kind `erasure`, its parameters without the
/// identifiers), its record and the hold on its people, in one
/// transaction. The request must have passed [`ErasureRequest::check`].
pub async fn request(
    store: &Storage,
    tenant: TenantId,
    req: &ErasureRequest,
    metadata: Map<String, Value>,
    now: DateTime<Utc>,
) -> Result<Job> {
    let mut params = json!({
        "identifiers": req.people.len(),
        "suppress": req.suppress,
    });
    if let Some(f) = req.window.from {
        params["from"] = json!(ts(f));
    }
    if let Some(t) = req.window.to {
        params["to"] = json!(ts(t));
    }
    let job = Job::queued(tenant, JobKind::Erasure, params, metadata, now);
    store
        .erasures()
        .request(
            &job,
            &req.people.clone().normalized(),
            req.window,
            req.suppress,
        )
        .await?;
    info!(job = %job.id, identifiers = req.people.len(), suppress = req.suppress, "erasure requested");
    Ok(job)
}

fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// The Parquet lake, as an erasure reaches it: the files of events a sink
/// keeps.
#[async_trait]
pub trait Lake: Send + Sync {
    /// Every file of the tenant: those its table holds, those a version
    /// removed and are still kept, those not yet committed.
    async fn files(&self, tenant: TenantId) -> Result<Vec<String>>;
    /// The file without the events `matcher` picks: `None` when it holds
    /// none of them.
    async fn without(&self, path: &str, matcher: &Matcher) -> Result<Option<LakeRewrite>>;
    /// Writes a file's replacement beside it, named after the job (the
    /// same name when the job runs again), not yet part of the lake;
    /// `None`: the file is to be removed.
    async fn stage(&self, job: JobId, path: &str, bytes: Option<Vec<u8>>) -> Result<LakeStaged>;
    /// Puts every staged replacement of a tenant in place at once (one
    /// commit of its table) and deletes the files replaced: the version
    /// committed, if any. [`Error::Conflict`] when another commit removed
    /// one of the files first: the caller lists the files again.
    async fn swap(&self, tenant: TenantId, staged: &[LakeStaged]) -> Result<Option<u64>>;
}

/// A lake file's replacement, written and not yet in place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LakeStaged {
    /// The file replaced.
    pub path: String,
    /// Its replacement; `None` when nothing is left of it.
    pub new: Option<String>,
    /// The replacement's size in bytes.
    pub size: u64,
}

/// A lake file without a person's events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LakeRewrite {
    pub removed: u64,
    pub kept: u64,
    /// The file's new bytes; `None` when nothing is left in it.
    pub bytes: Option<Vec<u8>>,
}

/// What an erasure job needs.
pub struct Env<'a> {
    pub store: &'a Storage,
    pub objects: &'a Objects,
    pub keys: &'a Keys,
    /// The lake, where a sink keeping one is on.
    pub lake: Option<&'a dyn Lake>,
    pub now: &'a (dyn Fn() -> DateTime<Utc> + Sync),
    /// (steps done, steps).
    pub progress: &'a (dyn Fn(u64, u64) + Sync),
}

/// What an erasure has removed so far, store by store: the record's
/// `report`, and the certificate's `stores`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Report {
    pub tracked_events: EventsReport,
    pub inbox: InboxReport,
    pub contacts: ContactsReport,
    pub quarantine: QuarantineReport,
    pub outbox: OutboxReport,
    pub webhooks: WebhooksReport,
    /// Objects outside the database, by (store, path): archives by object
    /// path, exports by job id, lake files by path. Each is its own row of
    /// the erasure's records ([`record`]), not part of the report's JSON.
    #[serde(skip)]
    pub objects: BTreeMap<(String, String), Rewritten>,
}

/// The stores of objects outside the database.
const ARCHIVES: &str = "archives";
const EXPORTS: &str = "exports";
const LAKE: &str = "lake";

impl Report {
    fn object(&self, store: &str, path: &str) -> Option<&Rewritten> {
        self.objects.get(&(store.to_owned(), path.to_owned()))
    }

    /// One store's objects, by path.
    fn of(&self, store: &str) -> BTreeMap<String, Rewritten> {
        self.objects
            .iter()
            .filter(|((s, _), _)| s == store)
            .map(|((_, p), r)| (p.clone(), r.clone()))
            .collect()
    }
}

/// Records what the erasure did (or is about to do) to one object, in the
/// report and in the erasure's records.
async fn record(
    env: &Env<'_>,
    id: JobId,
    report: &mut Report,
    store: &str,
    path: &str,
    entry: Rewritten,
) -> Result<()> {
    env.store
        .erasures()
        .record_object(id, store, path, &json(&entry))
        .await?;
    report
        .objects
        .insert((store.to_owned(), path.to_owned()), entry);
    Ok(())
}

/// Records that an object's replacement is done.
async fn replaced(
    env: &Env<'_>,
    id: JobId,
    report: &mut Report,
    store: &str,
    path: &str,
) -> Result<()> {
    match report.object(store, path) {
        Some(r) => {
            let entry = Rewritten {
                state: DONE.to_owned(),
                ..r.clone()
            };
            record(env, id, report, store, path, entry).await
        }
        None => Ok(()),
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EventsReport {
    pub events_removed: u64,
    /// `YYYY-MM` → events removed from that month.
    pub by_month: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct InboxReport {
    /// Accepted events of the people that processing dropped before they
    /// were stored or sent.
    pub events_dropped: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ContactsReport {
    pub contacts_removed: u64,
    pub identities_removed: u64,
    /// Within a window: traits an erased `identify` had set.
    pub traits_removed: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct QuarantineReport {
    pub events_dropped: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OutboxReport {
    /// Rows owed to a sink (RabbitMQ, the lake) that will not be sent.
    pub rows_cancelled: u64,
    /// Grouped rows (a batching sink's) written again without the people.
    pub rows_rewritten: u64,
    pub events_removed: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WebhooksReport {
    /// Pending deliveries of the people's events that will not be sent.
    pub deliveries_cancelled: u64,
    /// Deliveries whose stored payload was removed (their attempts stay).
    pub payloads_scrubbed: u64,
}

/// One object written again without the people.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rewritten {
    pub events_removed: u64,
    /// Rows left in it (0: the object was removed).
    pub rows: u64,
    /// SHA-256 of the new plain content (archives), or the new result's
    /// HMAC (exports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hmac: Option<String>,
    /// The lake table's version whose commit replaced the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table_version: Option<u64>,
    /// `replacing` until the old object is replaced, then `done`.
    pub state: String,
}

const REPLACING: &str = "replacing";
const DONE: &str = "done";

/// Where an erasure keeps a new object until it replaces the old one.
fn staged(job: JobId, path: &str) -> String {
    format!("erasures/{job}/{path}")
}

/// Runs an erasure job to its certificate (the job's `result`).
pub async fn run(env: &Env<'_>, job: &Job) -> Result<Value> {
    let erasures = env.store.erasures();
    let rec = erasures
        .get(job.id)
        .await?
        .ok_or_else(|| Error::Corrupt(format!("erasure {} has no record", job.id)))?;
    if rec.person.is_none() {
        return Err(Error::Corrupt(format!(
            "erasure {} has no identifiers left to erase",
            job.id
        )));
    }
    let mut report: Report = serde_json::from_value(rec.report.clone()).unwrap_or_default();
    for (store, path, entry) in erasures.objects(job.id).await? {
        if let Ok(entry) = serde_json::from_value(entry) {
            report.objects.insert((store, path), entry);
        }
    }
    let settled = erasures.settle(&rec).await?;
    let person = settled.person;
    let (mut from, watermark) = settled.inbox;
    let matcher = Matcher::new(&person, rec.window);
    let steps = 9u64;
    (env.progress)(0, steps);

    // Everything accepted before the request has been processed (and its
    // events of these people dropped) once processing passed the
    // watermark.
    let started = Instant::now();
    while let Some(waiting) = erasures
        .inbox_waiting(rec.tenant_id, (from, watermark))
        .await?
    {
        from = waiting;
        if started.elapsed() > PROCESSING_WAIT {
            return Err(Error::Conflict(format!(
                "processing has not reached the events accepted before erasure {} after {} s; \
                 it is run again",
                job.id,
                PROCESSING_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (env.progress)(1, steps);

    let mut found = None;
    for pass in 0..PASSES {
        // What each store took, for the log (operators size erasures by it).
        let mut took = [0u128; 5];
        let mut at = Instant::now();
        let mut lap = |i: usize| {
            took[i] = at.elapsed().as_millis();
            at = Instant::now();
        };
        erase_database(env, &rec, &person, &matcher, &mut report).await?;
        lap(0);
        (env.progress)(5, steps);
        erase_archives(env, &rec, &matcher, &mut report).await?;
        lap(1);
        (env.progress)(6, steps);
        erase_exports(env, &rec, &matcher, &mut report).await?;
        lap(2);
        (env.progress)(7, steps);
        erase_lake(env, &rec, &matcher, &mut report).await?;
        lap(3);
        (env.progress)(8, steps);
        let f = verify(env, &rec, &person, &matcher, (from, watermark)).await?;
        lap(4);
        let [database_ms, archives_ms, exports_ms, lake_ms, verify_ms] = took;
        info!(
            job = %job.id,
            pass,
            found = f.total(),
            database_ms,
            archives_ms,
            exports_ms,
            lake_ms,
            verify_ms,
            "erasure pass done"
        );
        if f.total() == 0 {
            found = Some(f);
            break;
        }
        found = Some(f);
    }
    let found = found.expect("at least one pass");
    if found.total() > 0 {
        return Err(Error::Conflict(format!(
            "erasure {}: the verification pass still finds {} records ({})",
            job.id,
            found.total(),
            found.stores_with_any().join(", ")
        )));
    }
    report.inbox.events_dropped = erasures.dropped(job.id).await?;
    erasures.save_report(job.id, &json(&report)).await?;
    (env.progress)(steps, steps);
    let certificate = certificate(env, &rec, &person, &report, &found);
    info!(
        job = %job.id,
        events = report.tracked_events.events_removed,
        archives = report.of(ARCHIVES).len(),
        lake_files = report.of(LAKE).len(),
        "erasure done"
    );
    Ok(certificate)
}

fn json<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("reports serialise")
}

/// The database's stores, each step with its report in its transaction.
async fn erase_database(
    env: &Env<'_>,
    rec: &ErasureRecord,
    person: &Person,
    matcher: &Matcher,
    report: &mut Report,
) -> Result<()> {
    let erasures = env.store.erasures();
    let (id, tenant) = (rec.id, rec.tenant_id);
    // Owed outbox rows first: a sink writing a batch of them is waited for.
    let started = Instant::now();
    loop {
        let mut next = report.clone();
        let scrub = erasures
            .cancel_outbox(id, tenant, matcher, (env.now)(), true, |s| {
                next.outbox.rows_cancelled += s.rows_cancelled;
                next.outbox.rows_rewritten += s.rows_rewritten;
                next.outbox.events_removed += s.events_removed;
                json(&next)
            })
            .await?;
        if !scrub.busy {
            if scrub.events_removed > 0 {
                *report = next;
            }
            break;
        }
        if started.elapsed() > BATCH_WAIT {
            return Err(Error::Conflict(format!(
                "a sink has held a batch with the people's events for over {} s",
                BATCH_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (env.progress)(2, 9);
    let mut next = report.clone();
    erasures
        .scrub_deliveries(id, tenant, person, matcher, true, |cancelled, scrubbed| {
            next.webhooks.deliveries_cancelled += cancelled;
            next.webhooks.payloads_scrubbed += scrubbed;
            json(&next)
        })
        .await?;
    *report = next;
    let mut next = report.clone();
    erasures
        .erase_quarantine(id, tenant, matcher, true, |n| {
            next.quarantine.events_dropped += n;
            json(&next)
        })
        .await?;
    *report = next;
    (env.progress)(3, 9);
    let mut next = report.clone();
    erasures
        .erase_events(id, tenant, person, rec.window, |by_month, traits| {
            for (month, n) in by_month {
                let label = format!("{:04}-{:02}", month.year, month.month);
                next.tracked_events.events_removed += n;
                *next.tracked_events.by_month.entry(label).or_default() += n;
            }
            next.contacts.traits_removed += traits;
            json(&next)
        })
        .await?;
    *report = next;
    (env.progress)(4, 9);
    if rec.window.is_whole() {
        let mut next = report.clone();
        erasures
            .erase_contacts(id, tenant, person, |contacts, identities| {
                next.contacts.contacts_removed += contacts;
                next.contacts.identities_removed += identities;
                json(&next)
            })
            .await?;
        *report = next;
    }
    Ok(())
}

/// Retention archives holding the people's rows, each written again
/// without them (new manifest, both read back and verified) before it
/// replaces the old one. A replacement a crash interrupted is finished
/// first.
async fn erase_archives(
    env: &Env<'_>,
    rec: &ErasureRecord,
    matcher: &Matcher,
    report: &mut Report,
) -> Result<()> {
    let tenant = rec.tenant_id;
    let drop = |line: &[u8]| archive_row_matches(tenant, matcher, line);
    for (path, manifest_path) in retention::archives(env.objects).await? {
        let stage = staged(rec.id, &path);
        let stage_manifest = staged(rec.id, &manifest_path);
        let before = report.object(ARCHIVES, &path).cloned();
        let pending = before.as_ref().is_some_and(|r| r.state == REPLACING);
        if !pending {
            let Some((removed, manifest)) = retention::rewrite_archive(
                env.objects,
                &path,
                &stage,
                &stage_manifest,
                rec.id,
                &drop,
            )
            .await?
            else {
                continue;
            };
            let prior = before.map_or(0, |r| r.events_removed);
            let entry = Rewritten {
                events_removed: prior + removed,
                rows: manifest.rows,
                sha256: Some(manifest.uncompressed_sha256.clone()),
                hmac: None,
                table_version: None,
                state: REPLACING.to_owned(),
            };
            record(env, rec.id, report, ARCHIVES, &path, entry).await?;
        }
        // The staged pair was verified; copying it over the old one is
        // safe to repeat. Removed data first, manifest last: a crash in
        // between leaves only the staged manifest, already copied.
        let (data, manifest) = (
            env.objects.exists(&stage).await?,
            env.objects.exists(&stage_manifest).await?,
        );
        if data && manifest {
            env.objects.copy(&stage, &path).await?;
            env.objects.copy(&stage_manifest, &manifest_path).await?;
            // The copies are whole or absent; their sizes say they landed.
            retention::check_copied(env.objects, &path, &manifest_path).await?;
        }
        if data {
            env.objects.delete(&stage).await?;
        }
        if manifest {
            env.objects.delete(&stage_manifest).await?;
        }
        replaced(env, rec.id, report, ARCHIVES, &path).await?;
        info!(job = %rec.id, archive = %path, "archive rewritten without the erased rows");
    }
    Ok(())
}

/// Whether an archive line (an archived row of any tenant) is the
/// people's: parsed only when its contact may be theirs.
fn archive_row_matches(tenant: TenantId, matcher: &Matcher, line: &[u8]) -> bool {
    matcher.may_match_line(line)
        && serde_json::from_slice::<Value>(line).is_ok_and(|row| {
            row.get("tenant_id")
                .and_then(Value::as_str)
                .is_some_and(|t| t == tenant.to_string())
                && matcher.matches_json(&row)
        })
}

/// Whether an export line (one of the tenant's events) is the people's.
fn export_line_matches(matcher: &Matcher, line: &[u8]) -> bool {
    matcher.may_match_line(line)
        && serde_json::from_slice::<Value>(line).is_ok_and(|doc| matcher.matches_json(&doc))
}

/// The tenant's completed exports holding the people's events: each result
/// written again without them, read back and checked against its new HMAC
/// before it replaces the old one; the export job's result says so.
async fn erase_exports(
    env: &Env<'_>,
    rec: &ErasureRecord,
    matcher: &Matcher,
    report: &mut Report,
) -> Result<()> {
    let erasures = env.store.erasures();
    for mut job in erasures
        .jobs(
            rec.tenant_id,
            JobKind::Export,
            Some(JobStatus::Completed),
            u32::MAX,
        )
        .await?
    {
        let Some(result) = job.result.clone() else {
            continue;
        };
        let Some(path) = result["path"].as_str().map(str::to_owned) else {
            continue;
        };
        let key = job.id.to_string();
        let stage = staged(rec.id, &path);
        let before = report.object(EXPORTS, &key).cloned();
        let pending = before.as_ref().is_some_and(|r| r.state == REPLACING);
        let new_result = if pending {
            // Staged and verified before a crash: its result is read again.
            export::staged_result(env.objects, env.keys, &job, &stage, &path).await?
        } else {
            let Some((removed, new_result)) =
                export::rewrite_result(env.objects, env.keys, &job, &stage, &path, &|line| {
                    export_line_matches(matcher, line)
                })
                .await?
            else {
                continue;
            };
            let entry = Rewritten {
                events_removed: before.map_or(0, |r| r.events_removed) + removed,
                rows: new_result["row_count"].as_u64().unwrap_or_default(),
                sha256: None,
                hmac: new_result["hmac"].as_str().map(str::to_owned),
                table_version: None,
                state: REPLACING.to_owned(),
            };
            record(env, rec.id, report, EXPORTS, &key, entry).await?;
            Some(new_result)
        };
        if let Some(mut new_result) = new_result {
            env.objects.copy(&stage, &path).await?;
            let mut by = result["erasures"].as_array().cloned().unwrap_or_default();
            if !by.contains(&json!(rec.id)) {
                by.push(json!(rec.id));
            }
            new_result["erasures"] = Value::Array(by);
            job.result = Some(new_result);
            erasures.rewrite_result(&job).await?;
            env.objects.delete(&stage).await?;
        }
        replaced(env, rec.id, report, EXPORTS, &key).await?;
        info!(job = %rec.id, export = %job.id, "export result rewritten without the erased events");
    }
    Ok(())
}

/// Every lake file of the tenant holding the people's events, written
/// again without them (the lake never shows them again, and never twice),
/// or removed when nothing else is left in it: the replacements staged
/// first, then put in place by one commit of the tenant's table, whose
/// version each file's record keeps. A commit that lost a file to another
/// (a compaction) starts the step again from the files as they are then.
async fn erase_lake(
    env: &Env<'_>,
    rec: &ErasureRecord,
    matcher: &Matcher,
    report: &mut Report,
) -> Result<()> {
    /// Commits lost to a concurrent one before the step gives up (the job
    /// is run again later).
    const CONFLICTS: usize = 8;
    let Some(lake) = env.lake else {
        return Ok(());
    };
    let mut conflicts = 0;
    loop {
        let listed = lake.files(rec.tenant_id).await?;
        let mut staged = Vec::new();
        for path in &listed {
            let before = report.object(LAKE, path).cloned();
            let Some(rewrite) = lake.without(path, matcher).await? else {
                if before.is_some_and(|r| r.state == REPLACING) {
                    replaced(env, rec.id, report, LAKE, path).await?;
                }
                continue;
            };
            // A replacement a crash interrupted is counted again from the
            // file; one done in an earlier pass adds to it.
            let prior = before
                .filter(|r| r.state == DONE)
                .map_or(0, |r| r.events_removed);
            let entry = Rewritten {
                events_removed: prior + rewrite.removed,
                rows: rewrite.kept,
                state: REPLACING.to_owned(),
                ..Rewritten::default()
            };
            record(env, rec.id, report, LAKE, path, entry).await?;
            staged.push(lake.stage(rec.id, path, rewrite.bytes).await?);
        }
        let version = match lake.swap(rec.tenant_id, &staged).await {
            Ok(version) => version,
            Err(Error::Conflict(why)) if conflicts < CONFLICTS => {
                conflicts += 1;
                info!(job = %rec.id, %why, "lake changed under the erasure; listing again");
                continue;
            }
            Err(e) => return Err(e),
        };
        for s in &staged {
            if let Some(r) = report.object(LAKE, &s.path) {
                let entry = Rewritten {
                    state: DONE.to_owned(),
                    table_version: version.or(r.table_version),
                    ..r.clone()
                };
                record(env, rec.id, report, LAKE, &s.path, entry).await?;
            }
        }
        // A file replaced by a run a crash interrupted after its commit:
        // gone now, its replacement in place.
        let gone: Vec<String> = report
            .objects
            .iter()
            .filter(|((store, path), r)| {
                store == LAKE && r.state == REPLACING && !listed.contains(path)
            })
            .map(|((_, path), _)| path.clone())
            .collect();
        for path in gone {
            replaced(env, rec.id, report, LAKE, &path).await?;
        }
        return Ok(());
    }
}

/// What the verification pass found, store by store.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Found {
    #[serde(flatten)]
    pub database: crate::store::Found,
    pub archives: u64,
    pub exports: u64,
    pub lake: u64,
}

impl Found {
    pub fn total(&self) -> u64 {
        self.database.total() + self.archives + self.exports + self.lake
    }

    fn stores_with_any(&self) -> Vec<String> {
        match json(self) {
            Value::Object(m) => m
                .into_iter()
                .filter(|(_, v)| v.as_u64().is_some_and(|n| n > 0))
                .map(|(k, _)| k)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The stores looked at, for the certificate.
    fn stores(&self, lake: bool) -> Vec<String> {
        match json(self) {
            Value::Object(m) => m
                .into_iter()
                .map(|(k, _)| k)
                .filter(|k| lake || k != "lake")
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// Looks for the people everywhere again, changing nothing.
async fn verify(
    env: &Env<'_>,
    rec: &ErasureRecord,
    person: &Person,
    matcher: &Matcher,
    inbox: (i64, i64),
) -> Result<Found> {
    let database = env
        .store
        .erasures()
        .search(rec.tenant_id, person, rec.window, inbox, (env.now)())
        .await?;
    let tenant = rec.tenant_id;
    let mut found = Found {
        database,
        ..Found::default()
    };
    for (path, _) in retention::archives(env.objects).await? {
        found.archives += retention::count_in_archive(env.objects, &path, &|line| {
            archive_row_matches(tenant, matcher, line)
        })
        .await?;
    }
    for job in env
        .store
        .erasures()
        .jobs(
            tenant,
            JobKind::Export,
            Some(JobStatus::Completed),
            u32::MAX,
        )
        .await?
    {
        found.exports += export::count_in_result(env.objects, env.keys, &job, &|line| {
            export_line_matches(matcher, line)
        })
        .await?;
    }
    if let Some(lake) = env.lake {
        for path in lake.files(tenant).await? {
            if let Some(r) = lake.without(&path, matcher).await? {
                found.lake += r.removed;
            }
        }
    }
    Ok(found)
}

/// The job's result: whom (hashes), what was removed store by store, what
/// the verification pass found (nothing), signed with the tenant's
/// external HMAC key over the certificate's JSON without `hmac` and
/// `integrity` (keys sorted, no spaces).
fn certificate(
    env: &Env<'_>,
    rec: &ErasureRecord,
    person: &Person,
    report: &Report,
    found: &Found,
) -> Value {
    let mut stores = json(report);
    // Objects as lists, without the bookkeeping state.
    let listed = |m: &BTreeMap<String, Rewritten>, key: &str| -> Value {
        Value::Array(
            m.iter()
                .map(|(k, r)| {
                    let mut v =
                        json!({ key: k, "events_removed": r.events_removed, "rows": r.rows });
                    if let Some(s) = &r.sha256 {
                        v["sha256"] = json!(s);
                    }
                    if let Some(h) = &r.hmac {
                        v["hmac"] = json!(h);
                    }
                    v
                })
                .collect(),
        )
    };
    let sum = |m: &BTreeMap<String, Rewritten>| m.values().map(|r| r.events_removed).sum::<u64>();
    let (archives, exports, files) = (report.of(ARCHIVES), report.of(EXPORTS), report.of(LAKE));
    stores["archives"] = json!({
        "objects_rewritten": archives.len(),
        "events_removed": sum(&archives),
        "objects": listed(&archives, "path"),
    });
    stores["exports"] = json!({
        "results_rewritten": exports.len(),
        "events_removed": sum(&exports),
        "jobs": listed(&exports, "job_id"),
    });
    // No lake (no sink keeping one is on): no `lake` member.
    if env.lake.is_some() {
        stores["lake"] = json!({
            "files_rewritten": files.values().filter(|r| r.rows > 0).count(),
            "files_removed": files.values().filter(|r| r.rows == 0).count(),
            "events_removed": sum(&files),
            // The version of the tenant's table from which on no readable
            // version holds the people (earlier ones name deleted files).
            "table_version": files.values().filter_map(|r| r.table_version).max(),
        });
    }
    let mut cert = json!({
        "request_id": rec.id,
        "tenant_id": rec.tenant_id,
        "subjects": person.subjects(),
        "suppressed": rec.suppress,
        "stores": stores,
        "verification": {
            "checked_at": ts((env.now)()),
            "found": found.total(),
            "stores": found.stores(env.lake.is_some()),
        },
    });
    if !rec.window.is_whole() {
        cert["window"] = json(&rec.window);
    }
    let signature = sign(env.keys, rec.tenant_id, &cert);
    cert["hmac"] = json!(signature);
    cert["integrity"] = json!({"algorithm": "HMAC-SHA256", "signature": signature});
    cert
}

/// HMAC-SHA256 (hex) of a certificate without its `hmac` and `integrity`,
/// as compact JSON with sorted keys, under the tenant's external key.
pub fn sign(keys: &Keys, tenant: TenantId, certificate: &Value) -> String {
    let mut unsigned = certificate.clone();
    if let Value::Object(m) = &mut unsigned {
        m.remove("hmac");
        m.remove("integrity");
    }
    // serde_json's maps are sorted; its output has no spaces.
    let text = serde_json::to_string(&unsigned).expect("JSON serialises");
    hmac_hex(&keys.tenant_hmac(tenant), &[text.as_bytes()])
}

/// Ends an erasure's job: its terminal event for `emit`, and, in the same
/// transaction, its holds lifted, its identifiers' values forgotten and —
/// when it completed — `core.contact.erased` for `announce_to`.
pub async fn finish(
    store: &Storage,
    job: &Job,
    node: NodeId,
    emit: &Emit,
    announce_to: &Emit,
) -> Result<bool> {
    let announce = match (&job.status, store.erasures().get(job.id).await?) {
        (JobStatus::Completed, Some(rec)) if announce_to.any() => {
            Some((erased_event(&rec, job), announce_to))
        }
        _ => None,
    };
    store.erasures().finish(job, node, emit, announce).await
}

/// `core.contact.erased`: the request and the SHA-256 of every identifier
/// it erased (never the identifiers).
fn erased_event(rec: &ErasureRecord, job: &Job) -> Entry {
    let at = job.finished_at.unwrap_or_else(Utc::now);
    let mut body = json!({
        "request_id": rec.id,
        "tenant_id": rec.tenant_id,
        "subjects": rec.subjects,
        "suppressed": rec.suppress,
        "erased_at": ts(at),
    });
    if !rec.window.is_whole() {
        body["window"] = json(&rec.window);
    }
    Entry {
        tenant_id: rec.tenant_id,
        topic: Topic::Core,
        routing_key: CONTACT_ERASED.to_owned(),
        ce_id: format!("fastack.contact.erased.{}", rec.id),
        subject: rec.id.to_string(),
        body: body.to_string(),
        record: None,
        job_id: None,
        created_at: at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked_whoever_makes_them() {
        let mut r = ErasureRequest::default();
        assert_eq!(r.check()[0].code, "required");
        r.people.user_ids = vec!["u-1".into(), String::new(), "a\u{0}".into()];
        let codes: Vec<&str> = r.check().iter().map(|e| e.code).collect();
        assert_eq!(codes, ["invalid_length", "invalid_character"]);
        r.people.user_ids = (0..=MAX_IDENTIFIERS).map(|i| format!("u-{i}")).collect();
        assert_eq!(r.check()[0].code, "too_many_identifiers");
        r.people.user_ids.truncate(MAX_IDENTIFIERS);
        assert!(r.check().is_empty());
        let t: DateTime<Utc> = "2026-11-01T00:00:00Z".parse().unwrap();
        r.window = Window {
            from: Some(t),
            to: Some(t),
        };
        assert_eq!(r.check()[0].field, "/to");
    }

    #[test]
    fn a_certificate_is_signed_over_its_sorted_compact_json() {
        let keys = Keys::from_root(&[7u8; 32]).unwrap();
        let tenant = TenantId::new();
        let cert = json!({"request_id": "r", "stores": {"b": 1, "a": 2}});
        let sig = sign(&keys, tenant, &cert);
        let mut signed = cert.clone();
        signed["hmac"] = json!(sig);
        signed["integrity"] = json!({"algorithm": "HMAC-SHA256", "signature": sig});
        assert_eq!(sign(&keys, tenant, &signed), sig);
        let text = r#"{"request_id":"r","stores":{"a":2,"b":1}}"#;
        assert_eq!(sig, hmac_hex(&keys.tenant_hmac(tenant), &[text.as_bytes()]));
    }
}
