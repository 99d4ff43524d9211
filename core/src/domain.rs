//! The values the runtime and its front ends exchange, whatever stores
//! them: an accepted event's row and a taken idempotency key, a read of
//! events and its time range, what a replay did, and the people an erasure
//! names (identifiers and their hashes, a window of time, a suppression).
//! Storage keeps and reads them (`crate::store` names them in its
//! signatures, and adds what only it needs: a range's months, a key's
//! fence); it does not own them.

use std::sync::Arc;

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
