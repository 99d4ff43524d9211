//! The group commit's idempotency fence, written once: record every row's
//! key (`ON CONFLICT DO NOTHING … RETURNING`), read back who owns the keys
//! that were taken, let the caller decide which fresh rows to keep (a batch
//! hitting a taken key with other content is dropped whole), release the
//! keys of dropped rows and queue the kept ones in the inbox — one
//! transaction. A backend may try a cheaper statement first (PostgreSQL's
//! plain insert when every key is new) and come here when a key exists.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::Instant,
};

use async_trait::async_trait;
use fastack_entities::{EventId, TenantId};
use uuid::Uuid;

use super::{
    IngestRow, TakenKey,
    db::{Col, Db, Dialect, ListKind, Q, Row, Tx},
};
use crate::error::{Error, Result};

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

impl TakenKey {
    /// What the fence says to a row meeting this key.
    pub fn fence(&self) -> Fence {
        Fence::Taken {
            event_id: self.event_id,
            fingerprint: self.fingerprint,
        }
    }
}

/// Which of `keys` the tenant already used (read [`taken_from`] each row).
pub(crate) fn taken_query(d: Dialect, tenant: Uuid, keys: Vec<String>) -> Q {
    Q::new(format!(
        "SELECT k.idempotency_key, k.event_id, k.fingerprint FROM {} \
         JOIN idempotency_keys k ON k.tenant_id = $1 AND k.idempotency_key = q.v",
        d.list_rows(2, ListKind::Text)
    ))
    .bind(tenant)
    .bind(keys)
}

/// A row of [`taken_query`]: the key, the event it answered, its content.
pub(crate) fn taken_from(r: &Row) -> Result<TakenKey> {
    taken(
        r.text("idempotency_key")?,
        r.uuid("event_id")?,
        &r.bytes("fingerprint")?,
    )
}

/// A taken key from its stored columns.
pub(crate) fn taken(key: String, event_id: Uuid, fingerprint: &[u8]) -> Result<TakenKey> {
    Ok(TakenKey {
        key,
        event_id: EventId(event_id),
        fingerprint: fingerprint
            .try_into()
            .map_err(|_| Error::Corrupt("fingerprint length".to_owned()))?,
    })
}

/// `rows` in the order their keys are recorded: concurrent group commits
/// lock keys in the same order and cannot deadlock.
pub(crate) fn lock_order(rows: &[IngestRow]) -> Vec<&IngestRow> {
    let mut sorted: Vec<&IngestRow> = rows.iter().collect();
    sorted
        .sort_by(|a, b| (a.tenant_id, &a.idempotency_key).cmp(&(b.tenant_id, &b.idempotency_key)));
    sorted
}

/// The keys of rows whose event did not record its key (someone else
/// owns it), per tenant.
pub(crate) fn taken_keys(
    rows: &[IngestRow],
    inserted: &HashSet<Uuid>,
) -> BTreeMap<Uuid, Vec<String>> {
    let mut taken: BTreeMap<Uuid, Vec<String>> = BTreeMap::new();
    for r in rows.iter().filter(|r| !inserted.contains(&r.event_id.0)) {
        taken
            .entry(r.tenant_id.0)
            .or_default()
            .push(r.idempotency_key.clone());
    }
    taken
}

/// Each row's fence (input order), from which events recorded their key
/// and who owns the others.
pub(crate) fn fences(
    rows: &[IngestRow],
    inserted: &HashSet<Uuid>,
    owners: &HashMap<(Uuid, String), Fence>,
) -> Result<Vec<Fence>> {
    rows.iter()
        .map(|r| {
            if inserted.contains(&r.event_id.0) {
                Ok(Fence::Fresh)
            } else {
                owners
                    .get(&(r.tenant_id.0, r.idempotency_key.clone()))
                    .cloned()
                    .ok_or_else(|| {
                        Error::Corrupt("idempotency key vanished during commit".to_owned())
                    })
            }
        })
        .collect()
}

/// What the caller's decision means: the rows to queue, and the keys
/// recorded by rows it dropped (to release, per tenant).
pub(crate) fn split<'a>(
    rows: &'a [IngestRow],
    fences: &[Fence],
    kept: &[bool],
) -> (Vec<&'a IngestRow>, BTreeMap<Uuid, Vec<String>>) {
    let mut dropped: BTreeMap<Uuid, Vec<String>> = BTreeMap::new();
    let mut queued: Vec<&IngestRow> = Vec::with_capacity(rows.len());
    for ((r, f), k) in rows.iter().zip(fences).zip(kept) {
        match (f, k) {
            (Fence::Fresh, true) => queued.push(r),
            (Fence::Fresh, false) => dropped
                .entry(r.tenant_id.0)
                .or_default()
                .push(r.idempotency_key.clone()),
            _ => {}
        }
    }
    (queued, dropped)
}

/// Commits `rows` in `tx` and returns the fence of each (input order).
pub(crate) async fn commit(
    mut tx: Tx<'_>,
    rows: &[IngestRow],
    keep: KeepFn<'_>,
) -> Result<Vec<Fence>> {
    let d = tx.dialect();
    let sorted = lock_order(rows);
    let inserted: HashSet<Uuid> = tx
        .insert(d.insert(
            "idempotency_keys",
            &[
                (
                    "tenant_id",
                    Col::Uuid(sorted.iter().map(|r| r.tenant_id.0).collect()),
                ),
                (
                    "idempotency_key",
                    Col::Text(sorted.iter().map(|r| r.idempotency_key.clone()).collect()),
                ),
                (
                    "event_id",
                    Col::Uuid(sorted.iter().map(|r| r.event_id.0).collect()),
                ),
                (
                    "fingerprint",
                    Col::Bytes(sorted.iter().map(|r| r.fingerprint.to_vec()).collect()),
                ),
                (
                    "occurred_at",
                    Col::Time(sorted.iter().map(|r| r.occurred_at).collect()),
                ),
                (
                    "created_at",
                    Col::Time(sorted.iter().map(|r| r.received_at).collect()),
                ),
            ],
            "ON CONFLICT DO NOTHING RETURNING event_id",
        ))
        .await?
        .iter()
        .map(|r| r.uuid("event_id"))
        .collect::<Result<_>>()?;

    // Keys already taken: by which event, with which content.
    let mut owners: HashMap<(Uuid, String), Fence> = HashMap::new();
    for (tenant, keys) in taken_keys(rows, &inserted) {
        for row in tx.fetch(taken_query(d, tenant, keys)).await? {
            let t = taken_from(&row)?;
            let fence = t.fence();
            owners.insert((tenant, t.key), fence);
        }
    }
    let fences = fences(rows, &inserted, &owners)?;
    let kept = keep(&fences);
    let (queued, dropped) = split(rows, &fences, &kept);
    for (tenant, keys) in dropped {
        tx.execute(
            Q::new(format!(
                "DELETE FROM idempotency_keys WHERE tenant_id = $1 AND {}",
                d.in_list("idempotency_key", 2, ListKind::Text)
            ))
            .bind(tenant)
            .bind(keys),
        )
        .await?;
    }
    tx.insert(d.insert(
        "inbox",
        &[
            (
                "tenant_id",
                Col::Uuid(queued.iter().map(|r| r.tenant_id.0).collect()),
            ),
            (
                "event_id",
                Col::Uuid(queued.iter().map(|r| r.event_id.0).collect()),
            ),
            (
                "payload",
                Col::Text(queued.iter().map(|r| r.payload.clone()).collect()),
            ),
            (
                "received_at",
                Col::Time(queued.iter().map(|r| r.received_at).collect()),
            ),
        ],
        "",
    ))
    .await?;
    tx.commit().await?;
    Ok(fences)
}

/// The group commit as a backend runs it (it may try a cheaper statement
/// before [`commit`]).
#[async_trait]
pub(crate) trait IngestEngine: Send + Sync {
    /// See [`Ingest::commit`].
    async fn commit_ingest(
        &self,
        rows: &[IngestRow],
        keep: KeepFn<'_>,
        deadline: Instant,
    ) -> Result<Vec<Fence>>;

    /// See [`Ingest::taken_keys`]: by default, `idempotency_keys`, where the
    /// group commit records every key.
    async fn taken_keys(
        &self,
        db: &Db,
        tenant: TenantId,
        keys: &[String],
    ) -> Result<Vec<TakenKey>> {
        db.read(taken_query(db.dialect(), tenant.0, keys.to_vec()))
            .await?
            .iter()
            .map(taken_from)
            .collect()
    }
}

/// The group commit and the keys it fenced (see the module doc).
#[derive(Clone, Copy)]
pub struct Ingest<'a> {
    pub(super) db: &'a Db,
    pub(super) engine: &'a dyn IngestEngine,
}

impl Ingest<'_> {
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
    pub async fn commit(
        self,
        rows: &[IngestRow],
        keep: KeepFn<'_>,
        deadline: Instant,
    ) -> Result<Vec<Fence>> {
        self.engine.commit_ingest(rows, keep, deadline).await
    }

    /// Which of `keys` the tenant already used: the event each answered and
    /// its fingerprint.
    pub async fn taken_keys(self, tenant: TenantId, keys: &[String]) -> Result<Vec<TakenKey>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.engine.taken_keys(self.db, tenant, keys).await
    }
}
