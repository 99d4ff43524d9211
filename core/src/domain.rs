//! The values the runtime and its front ends exchange, whatever stores
//! them: an accepted event's row and a taken idempotency key, a read of
//! events and its time range, what a replay did, and the people an erasure
//! names (identifiers and their hashes, a window of time, a suppression).
//! Storage keeps and reads them (`crate::store` names them in its
//! signatures, and adds what only it needs: a range's months, a key's
//! fence); it does not own them.

use std::{collections::HashSet, sync::Arc};

use chrono::{DateTime, Utc};
use fastack_entities::{ContactId, EventId, IdentityKind, JobId, NewEvent, TenantId};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

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

/// An idempotency key in use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TakenKey {
    pub key: String,
    pub event_id: EventId,
    pub fingerprint: [u8; 32],
}

/// What a replay did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replayed {
    /// Pending again, due now.
    Queued,
    /// Already pending (a first attempt, a retry or an earlier replay in
    /// flight): left alone, so a delivery is never replayed twice at once.
    AlreadyPending,
}

/// What an identifier names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubjectKind {
    UserId,
    AnonymousId,
    ContactId,
}

impl SubjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SubjectKind::UserId => "user_id",
            SubjectKind::AnonymousId => "anonymous_id",
            SubjectKind::ContactId => "contact_id",
        }
    }

    /// The kind of an identity (holds and suppressions keep identities).
    pub(crate) fn of(kind: IdentityKind) -> SubjectKind {
        match kind {
            IdentityKind::User => SubjectKind::UserId,
            IdentityKind::Anonymous => SubjectKind::AnonymousId,
        }
    }

    pub(crate) fn identity(self) -> Option<IdentityKind> {
        match self {
            SubjectKind::UserId => Some(IdentityKind::User),
            SubjectKind::AnonymousId => Some(IdentityKind::Anonymous),
            SubjectKind::ContactId => None,
        }
    }
}

/// An identifier as erasure records keep it: its kind and the hex SHA-256
/// of its value (UTF-8; a contact id in its hyphenated lowercase form).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Subject {
    pub kind: SubjectKind,
    pub sha256: String,
}

impl Subject {
    pub fn of(kind: SubjectKind, value: &str) -> Subject {
        Subject {
            kind,
            sha256: sha256_hex(value),
        }
    }
}

/// The hex SHA-256 of a text.
pub fn sha256_hex(value: &str) -> String {
    hex::encode(Sha256::digest(value.as_bytes()))
}

/// Whom an erasure covers, by value: every identifier and contact linked to
/// the people it names. Kept only while its job runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Person {
    #[serde(default)]
    pub user_ids: Vec<String>,
    #[serde(default)]
    pub anonymous_ids: Vec<String>,
    #[serde(default)]
    pub contact_ids: Vec<ContactId>,
}

impl Person {
    /// Sorted, without repeats.
    pub fn normalized(mut self) -> Person {
        for list in [&mut self.user_ids, &mut self.anonymous_ids] {
            list.sort_unstable();
            list.dedup();
        }
        self.contact_ids.sort_unstable();
        self.contact_ids.dedup();
        self
    }

    /// Identifiers and contacts in all.
    pub fn len(&self) -> usize {
        self.user_ids.len() + self.anonymous_ids.len() + self.contact_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// This person and `other`.
    pub fn union(&self, other: &Person) -> Person {
        let mut out = self.clone();
        out.user_ids.extend(other.user_ids.iter().cloned());
        out.anonymous_ids
            .extend(other.anonymous_ids.iter().cloned());
        out.contact_ids.extend(other.contact_ids.iter().copied());
        out.normalized()
    }

    /// The identities (user and anonymous ids), with their kind.
    pub fn identities(&self) -> impl Iterator<Item = (IdentityKind, &str)> {
        self.user_ids
            .iter()
            .map(|v| (IdentityKind::User, v.as_str()))
            .chain(
                self.anonymous_ids
                    .iter()
                    .map(|v| (IdentityKind::Anonymous, v.as_str())),
            )
    }

    /// Every identifier as a hash, sorted.
    pub fn subjects(&self) -> Vec<Subject> {
        let mut out: Vec<Subject> = self
            .identities()
            .map(|(kind, v)| Subject::of(SubjectKind::of(kind), v))
            .chain(
                self.contact_ids
                    .iter()
                    .map(|c| Subject::of(SubjectKind::ContactId, &c.to_string())),
            )
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// Events whose `occurred_at` is in `[from, to)`; an end left out is
/// open. The whole of time by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<DateTime<Utc>>,
}

impl Window {
    /// Whether it is the whole of time (the contact goes too).
    pub fn is_whole(&self) -> bool {
        self.from.is_none() && self.to.is_none()
    }

    pub fn contains(&self, t: DateTime<Utc>) -> bool {
        self.from.is_none_or(|f| t >= f) && self.to.is_none_or(|to| t < to)
    }

    /// `[start, end)` cut to the window; `None` when they do not meet.
    pub fn clamp(
        &self,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
        let from = self.from.map_or(start, |f| f.max(start));
        let to = self.to.map_or(end, |t| t.min(end));
        (from < to).then_some((from, to))
    }
}

/// A suppressed identifier.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Suppression {
    pub kind: SubjectKind,
    pub sha256: String,
    /// The erasure that set it.
    pub request_id: JobId,
    pub created_at: DateTime<Utc>,
    /// Events of the identifier processing dropped since.
    pub dropped: i64,
}

impl Person {
    pub(crate) fn contact_texts(&self) -> Vec<String> {
        self.contact_ids.iter().map(ContactId::to_string).collect()
    }

    pub(crate) fn contact_uuids(&self) -> Vec<uuid::Uuid> {
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
    pub fn matches_json(&self, doc: &serde_json::Value) -> bool {
        let text = |k: &str| doc.get(k).and_then(serde_json::Value::as_str);
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
