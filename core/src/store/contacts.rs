//! Contacts and their identities (`contacts`, `contact_identities`): what
//! processing resolves a batch's identities against and writes (a
//! snapshot, then the plan [`identity::resolve`] made of it), the reads of
//! the tenant API (a contact by id, merges followed; by one of its
//! identities), and what an erasure resolves, counts, strips and deletes.
//! Every statement on the two tables is here.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use fastack_entities::{Contact, ContactId, EventKind, IdentityKind, NewEvent, TenantId};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::{
    Person,
    db::{Col, Db, Dialect, ListKind, Q, Tx, object},
    encoding::json_text,
    known_contacts::{Generation, KnownContacts},
};
use crate::{
    error::{Error, Result},
    identity::{self, Snapshot},
};

/// Contacts as processing left them (see the module doc).
#[derive(Clone, Copy)]
pub struct Contacts<'a> {
    pub(super) db: &'a Db,
}

impl Contacts<'_> {
    /// The contact `id` resolves to (merges followed to the survivor),
    /// with its identities and the contacts merged into it.
    async fn load(self, tenant: TenantId, id: ContactId) -> Result<Option<Contact>> {
        let mut current = id.0;
        // Chains are kept flat on merge; the bound protects against a cycle.
        for _ in 0..8 {
            let row = self
                .db
                .read_opt(
                    Q::new(
                        "SELECT id, merged_into, traits, created_at, updated_at FROM contacts \
                         WHERE tenant_id = $1 AND id = $2",
                    )
                    .bind(tenant.0)
                    .bind(current),
                )
                .await?;
            let Some(row) = row else { return Ok(None) };
            if let Some(next) = row.opt_uuid("merged_into")? {
                current = next;
                continue;
            }
            let identities = self
                .db
                .read(
                    Q::new(
                        "SELECT kind, value FROM contact_identities \
                         WHERE tenant_id = $1 AND contact_id = $2 ORDER BY kind, value",
                    )
                    .bind(tenant.0)
                    .bind(current),
                )
                .await?;
            let merged = self
                .db
                .read(
                    Q::new(
                        "SELECT id FROM contacts WHERE tenant_id = $1 AND merged_into = $2 ORDER BY id",
                    )
                    .bind(tenant.0)
                    .bind(current),
                )
                .await?;
            let mut user_ids = Vec::new();
            let mut anonymous_ids = Vec::new();
            for r in identities {
                let kind = r.int("kind")?;
                let value = r.text("value")?;
                match IdentityKind::from_i16(kind as i16) {
                    Some(IdentityKind::User) => user_ids.push(value),
                    Some(IdentityKind::Anonymous) => anonymous_ids.push(value),
                    None => return Err(Error::Corrupt(format!("identity kind {kind}"))),
                }
            }
            return Ok(Some(Contact {
                id: ContactId(current),
                user_ids,
                anonymous_ids,
                traits: object(row.json("traits")?),
                merged_ids: merged
                    .iter()
                    .map(|r| r.uuid("id").map(ContactId))
                    .collect::<Result<_>>()?,
                created_at: row.time("created_at")?,
                updated_at: row.time("updated_at")?,
            }));
        }
        Err(Error::Corrupt(format!(
            "merge chain of contact {id} too long"
        )))
    }

    /// The contact `id` resolves to (merges followed), with its identities.
    pub async fn get(self, tenant: TenantId, id: ContactId) -> Result<Option<Contact>> {
        self.load(tenant, id).await
    }

    /// The contact holding an identity (`user_id` or `anonymous_id`).
    pub async fn find(
        self,
        tenant: TenantId,
        kind: IdentityKind,
        value: &str,
    ) -> Result<Option<Contact>> {
        let row = self
            .db
            .read_opt(
                Q::new(
                    "SELECT contact_id FROM contact_identities \
                     WHERE tenant_id = $1 AND kind = $2 AND value = $3",
                )
                .bind(tenant.0)
                .bind(i64::from(kind.as_i16()))
                .bind(value),
            )
            .await?;
        match row {
            Some(r) => self.load(tenant, ContactId(r.uuid("contact_id")?)).await,
            None => Ok(None),
        }
    }

    /// The contact's canonical id and every contact merged into it.
    pub async fn family(self, tenant: TenantId, id: ContactId) -> Result<Vec<ContactId>> {
        let Some(contact) = self.load(tenant, id).await? else {
            return Ok(Vec::new());
        };
        let mut ids = vec![contact.id];
        ids.extend(contact.merged_ids);
        Ok(ids)
    }
}

/// How a round's identities were found (see [`snapshot`]).
#[derive(Debug, Default)]
pub(crate) struct Found {
    /// Identities found in the database and their contacts, for the node
    /// to learn once the round commits.
    pub(crate) fetched: Vec<(IdentityKind, String, ContactId)>,
    /// Distinct identities resolved from the node's known contacts.
    pub(crate) from_memory: usize,
    /// Distinct identities looked up in the database (found or not).
    pub(crate) looked_up: usize,
}

/// What identity resolution needs to know about a batch: the contacts of
/// its identities, which of them already carry a user id (merges), and
/// the traits of the contacts it may change. Identities the node's
/// [`KnownContacts`] hold are not looked up.
pub(crate) async fn snapshot(
    tx: &mut Tx<'_>,
    tenant: TenantId,
    events: &[&NewEvent],
    (known, generation): (&KnownContacts, Generation),
) -> Result<(Snapshot, Found)> {
    let d = tx.dialect();
    let mut snapshot = Snapshot::default();
    let mut found = Found::default();
    for kind in [IdentityKind::User, IdentityKind::Anonymous] {
        let mut values: Vec<&str> = events
            .iter()
            .filter_map(|e| match kind {
                IdentityKind::User => e.user_id.as_deref(),
                IdentityKind::Anonymous => e.anonymous_id.as_deref(),
            })
            .collect();
        values.sort_unstable();
        values.dedup();
        let mut unknown: Vec<String> = Vec::new();
        for v in values {
            match known.get(tenant, generation, kind, v) {
                Some(contact) => {
                    snapshot.identities.insert((kind, v.to_owned()), contact);
                    found.from_memory += 1;
                }
                None => unknown.push(v.to_owned()),
            }
        }
        found.looked_up += unknown.len();
        if unknown.is_empty() {
            continue;
        }
        // One primary-key lookup per value, whatever the statistics say: a
        // correlated subquery cannot be turned into a join, and a join is
        // what PostgreSQL picks on a young table (hashing every identity of
        // the tenant, or filtering them against the list).
        for r in tx
            .fetch(
                Q::new(format!(
                    "SELECT q.v AS value, \
                            (SELECT ci.contact_id FROM contact_identities ci \
                             WHERE ci.tenant_id = $1 AND ci.kind = $2 AND ci.value = q.v) \
                              AS contact_id \
                     FROM {}",
                    d.list_rows(3, ListKind::Text)
                ))
                .bind(tenant.0)
                .bind(i64::from(kind.as_i16()))
                .bind(unknown),
            )
            .await?
        {
            if let Some(contact) = r.opt_uuid("contact_id")? {
                let value = r.text("value")?;
                found
                    .fetched
                    .push((kind, value.clone(), ContactId(contact)));
                snapshot
                    .identities
                    .insert((kind, value), ContactId(contact));
            }
        }
    }
    let merging = events
        .iter()
        .any(|e| e.kind == EventKind::Identify && e.user_id.is_some() && e.anonymous_id.is_some());
    let mut known: Vec<Uuid> = snapshot.identities.values().map(|c| c.0).collect();
    known.sort_unstable();
    known.dedup();
    if merging && !known.is_empty() {
        for r in tx
            .fetch(
                Q::new(format!(
                    "SELECT DISTINCT contact_id FROM contact_identities \
                     WHERE tenant_id = $1 AND kind = 1 AND {}",
                    d.in_list("contact_id", 2, ListKind::Uuid)
                ))
                .bind(tenant.0)
                .bind(known.clone()),
            )
            .await?
        {
            snapshot
                .contacts_with_user
                .insert(ContactId(r.uuid("contact_id")?));
        }
    }
    let mut need: Vec<Uuid> = identity::Plan::needs_traits(events, &snapshot)
        .into_iter()
        .map(|c| c.0)
        .collect();
    if merging {
        // A merge may pull the merged contact's traits into the survivor.
        need.extend(known);
        need.sort_unstable();
        need.dedup();
    }
    if !need.is_empty() {
        for r in tx
            .fetch(
                Q::new(format!(
                    "SELECT id, traits FROM contacts WHERE tenant_id = $1 AND {}",
                    d.in_list("id", 2, ListKind::Uuid)
                ))
                .bind(tenant.0)
                .bind(need),
            )
            .await?
        {
            if let Value::Object(map) = r.json("traits")? {
                snapshot.traits.insert(ContactId(r.uuid("id")?), map);
            }
        }
    }
    Ok((snapshot, found))
}

/// Writes what identity resolution decided.
pub(crate) async fn apply(
    tx: &mut Tx<'_>,
    tenant: TenantId,
    plan: &identity::Plan,
    now: DateTime<Utc>,
) -> Result<()> {
    let d = tx.dialect();
    let k = plan.new_contacts.len();
    tx.insert(
        d.insert(
            "contacts",
            &[
                (
                    "id",
                    Col::Uuid(plan.new_contacts.iter().map(|(c, _)| c.0).collect()),
                ),
                ("tenant_id", Col::Uuid(vec![tenant.0; k])),
                ("merged_into", Col::OptUuid(vec![None; k])),
                (
                    "traits",
                    Col::Json(
                        plan.new_contacts
                            .iter()
                            .map(|(_, t)| json_text(t))
                            .collect(),
                    ),
                ),
                ("created_at", Col::Time(vec![now; k])),
                ("updated_at", Col::Time(vec![now; k])),
            ],
            "",
        ),
    )
    .await?;
    let k = plan.identities.len();
    tx.insert(
        d.insert(
            "contact_identities",
            &[
                ("tenant_id", Col::Uuid(vec![tenant.0; k])),
                (
                    "kind",
                    Col::Int(
                        plan.identities
                            .iter()
                            .map(|(kind, _, _)| i64::from(kind.as_i16()))
                            .collect(),
                    ),
                ),
                (
                    "value",
                    Col::Text(plan.identities.iter().map(|(_, v, _)| v.clone()).collect()),
                ),
                (
                    "contact_id",
                    Col::Uuid(plan.identities.iter().map(|(_, _, c)| c.0).collect()),
                ),
            ],
            "ON CONFLICT (tenant_id, kind, value) DO UPDATE SET contact_id = excluded.contact_id",
        ),
    )
    .await?;
    for (merged, survivor) in &plan.merges {
        tx.execute(
            Q::new(
                "UPDATE contact_identities SET contact_id = $3 WHERE tenant_id = $1 AND contact_id = $2",
            )
            .bind(tenant.0)
            .bind(merged.0)
            .bind(survivor.0),
        )
        .await?;
        tx.execute(
            Q::new(
                "UPDATE contacts SET merged_into = $3, updated_at = $4 \
                 WHERE tenant_id = $1 AND (id = $2 OR merged_into = $2)",
            )
            .bind(tenant.0)
            .bind(merged.0)
            .bind(survivor.0)
            .bind(now),
        )
        .await?;
    }
    if plan.traits.is_empty() {
        return Ok(());
    }
    if d == Dialect::Postgres {
        // One statement for the batch instead of a round trip per contact.
        let ids: Vec<Uuid> = plan.traits.iter().map(|(c, _)| c.0).collect();
        let traits: Vec<String> = plan.traits.iter().map(|(_, t)| json_text(t)).collect();
        tx.execute(
            Q::new(
                "UPDATE contacts SET traits = x.traits::jsonb, updated_at = $3 \
                 FROM UNNEST($1::uuid[], $2::text[]) AS x(id, traits) \
                 WHERE contacts.id = x.id AND contacts.tenant_id = $4",
            )
            .bind(ids)
            .bind(traits)
            .bind(now)
            .bind(tenant.0),
        )
        .await?;
        return Ok(());
    }
    for (contact, traits) in &plan.traits {
        tx.execute(
            Q::new(
                "UPDATE contacts SET traits = $3, updated_at = $4 WHERE tenant_id = $1 AND id = $2",
            )
            .bind(tenant.0)
            .bind(contact.0)
            .bind(Value::Object(traits.clone()))
            .bind(now),
        )
        .await?;
    }
    Ok(())
}

/// Everyone `asked` names, with every identifier and contact linked to
/// them: each identifier's contact, merges followed to the survivor, the
/// survivor's whole family (the contacts merged into it) and every
/// identity of the family.
pub(crate) async fn resolve(tx: &mut Tx<'_>, tenant: TenantId, asked: &Person) -> Result<Person> {
    let d = tx.dialect();
    let mut named: HashSet<Uuid> = asked.contact_ids.iter().map(|c| c.0).collect();
    for (kind, values) in [
        (IdentityKind::User, &asked.user_ids),
        (IdentityKind::Anonymous, &asked.anonymous_ids),
    ] {
        if values.is_empty() {
            continue;
        }
        for r in tx
            .fetch(
                Q::new(format!(
                    "SELECT contact_id FROM contact_identities WHERE tenant_id = $1 AND kind = $2 AND {}",
                    d.in_list("value", 3, ListKind::Text)
                ))
                .bind(tenant.0)
                .bind(i64::from(kind.as_i16()))
                .bind(values.clone()),
            )
            .await?
        {
            named.insert(r.uuid("contact_id")?);
        }
    }
    let mut out = asked.clone();
    if named.is_empty() {
        return Ok(out.normalized());
    }
    let named: Vec<Uuid> = named.into_iter().collect();
    let mut roots: HashSet<Uuid> = HashSet::new();
    for r in tx
        .fetch(
            Q::new(format!(
                "SELECT id, merged_into FROM contacts WHERE tenant_id = $1 AND {}",
                d.in_list("id", 2, ListKind::Uuid)
            ))
            .bind(tenant.0)
            .bind(named),
        )
        .await?
    {
        roots.insert(r.opt_uuid("merged_into")?.unwrap_or(r.uuid("id")?));
    }
    let roots: Vec<Uuid> = roots.into_iter().collect();
    let mut family: Vec<Uuid> = roots.clone();
    for r in tx
        .fetch(
            Q::new(format!(
                "SELECT id FROM contacts WHERE tenant_id = $1 AND ({} OR {})",
                d.in_list("id", 2, ListKind::Uuid),
                d.in_list("merged_into", 2, ListKind::Uuid)
            ))
            .bind(tenant.0)
            .bind(roots),
        )
        .await?
    {
        family.push(r.uuid("id")?);
    }
    for r in tx
        .fetch(
            Q::new(format!(
                "SELECT kind, value FROM contact_identities WHERE tenant_id = $1 AND {}",
                d.in_list("contact_id", 2, ListKind::Uuid)
            ))
            .bind(tenant.0)
            .bind(family.clone()),
        )
        .await?
    {
        let value = r.text("value")?;
        match i16::try_from(r.int("kind")?)
            .ok()
            .and_then(IdentityKind::from_i16)
        {
            Some(IdentityKind::User) => out.user_ids.push(value),
            Some(IdentityKind::Anonymous) => out.anonymous_ids.push(value),
            None => {}
        }
    }
    out.contact_ids.extend(family.into_iter().map(ContactId));
    Ok(out.normalized())
}

/// Deletes the person's contacts and identities: how many of each.
pub(crate) async fn erase(
    tx: &mut Tx<'_>,
    tenant: TenantId,
    person: &Person,
) -> Result<(u64, u64)> {
    let d = tx.dialect();
    // Nodes holding the tenant's contacts in memory drop them at their next
    // lease write ([`KnownContacts`]). First, as a processing transaction
    // takes the lease row first too.
    tx.execute(
        Q::new("UPDATE tenant_leases SET contacts_gen = contacts_gen + 1 WHERE tenant_id = $1")
            .bind(tenant.0),
    )
    .await?;
    let identities = tx
        .execute(
            Q::new(format!(
                "DELETE FROM contact_identities WHERE tenant_id = $1 AND ({} OR (kind = 1 AND {}) \
                 OR (kind = 2 AND {}))",
                d.in_list("contact_id", 2, ListKind::Uuid),
                d.in_list("value", 3, ListKind::Text),
                d.in_list("value", 4, ListKind::Text),
            ))
            .bind(tenant.0)
            .bind(person.contact_uuids())
            .bind(person.user_ids.clone())
            .bind(person.anonymous_ids.clone()),
        )
        .await?;
    let contacts = tx
        .execute(
            Q::new(format!(
                "DELETE FROM contacts WHERE tenant_id = $1 AND {}",
                d.in_list("id", 2, ListKind::Uuid)
            ))
            .bind(tenant.0)
            .bind(person.contact_uuids()),
        )
        .await?;
    Ok((contacts, identities))
}

/// How many of the person's contacts and identities are left (an
/// erasure's verification).
pub(crate) async fn count(db: &Db, tenant: TenantId, person: &Person) -> Result<(u64, u64)> {
    let d = db.dialect();
    let contacts = db
        .read_one(
            Q::new(format!(
                "SELECT COUNT(*) AS n FROM contacts WHERE tenant_id = $1 AND {}",
                d.in_list("id", 2, ListKind::Uuid)
            ))
            .bind(tenant.0)
            .bind(person.contact_uuids()),
        )
        .await?
        .int("n")? as u64;
    let identities = db
        .read_one(
            Q::new(format!(
                "SELECT COUNT(*) AS n FROM contact_identities WHERE tenant_id = $1 \
                 AND ({} OR (kind = 1 AND {}) OR (kind = 2 AND {}))",
                d.in_list("contact_id", 2, ListKind::Uuid),
                d.in_list("value", 3, ListKind::Text),
                d.in_list("value", 4, ListKind::Text),
            ))
            .bind(tenant.0)
            .bind(person.contact_uuids())
            .bind(person.user_ids.clone())
            .bind(person.anonymous_ids.clone()),
        )
        .await?
        .int("n")? as u64;
    Ok((contacts, identities))
}

/// Contacts' ids, what they were merged into and their traits.
pub(crate) async fn traits_of(
    tx: &mut Tx<'_>,
    tenant: TenantId,
    ids: Vec<Uuid>,
) -> Result<Vec<(Uuid, Option<Uuid>, Map<String, Value>)>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let d = tx.dialect();
    let mut out = Vec::new();
    for r in tx
        .fetch(
            Q::new(format!(
                "SELECT id, merged_into, traits FROM contacts WHERE tenant_id = $1 AND {}",
                d.in_list("id", 2, ListKind::Uuid)
            ))
            .bind(tenant.0)
            .bind(ids),
        )
        .await?
    {
        let t = match r.json("traits")? {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        out.push((r.uuid("id")?, r.opt_uuid("merged_into")?, t));
    }
    Ok(out)
}

/// Replaces a contact's traits.
pub(crate) async fn set_traits(
    tx: &mut Tx<'_>,
    tenant: TenantId,
    id: Uuid,
    traits: Map<String, Value>,
) -> Result<()> {
    tx.execute(
        Q::new("UPDATE contacts SET traits = $3 WHERE tenant_id = $1 AND id = $2")
            .bind(tenant.0)
            .bind(id)
            .bind(Value::Object(traits)),
    )
    .await?;
    Ok(())
}
