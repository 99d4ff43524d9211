//! Known contacts: the identities this node's processing has resolved,
//! kept in memory between rounds, so a round looks up in the database only
//! the identities it has not met (a `track` of a known user reads nothing).
//!
//! An entry is true for as long as only this node writes the tenant's
//! contacts. Every lease write of a node sets `tenant_leases.renewed_from`
//! to the expiry it replaces, and every erasure counts
//! `tenant_leases.contacts_gen` up; so a lease write that finds the expiry
//! this node wrote last and the count it saw last proves that no other node
//! processed the tenant (a takeover, a round, even an older release's,
//! changes the expiry) and no erasure deleted contacts since. Any other
//! finding drops the tenant's entries before the round reads them. A merge
//! this node commits is followed by redirecting the merged contact, as the
//! database repoints its identities.

use std::{
    collections::HashMap,
    hash::{Hash, Hasher},
    sync::atomic::{AtomicU64, Ordering},
};

use chrono::{DateTime, Utc};
use fastack_entities::{ContactId, IdentityKind, TenantId};
use parking_lot::Mutex;

/// A tenant's redirects are dropped with its entries past this many
/// merges (a chain longer than the cache is worth following).
const REDIRECTS_KEPT: usize = 50_000;

/// What a lease write of this node found and left on the tenant's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeaseMark {
    /// The expiry the write replaced (`None`: the row was inserted).
    pub(crate) renewed_from: Option<DateTime<Utc>>,
    /// The expiry it wrote, as stored.
    pub(crate) expires_at: DateTime<Utc>,
    /// The tenant's erasure count.
    pub(crate) contacts_gen: i64,
}

/// The entries of one tenant that are still true: they carry this
/// generation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Generation(u64);

#[derive(Debug)]
struct Tenant {
    generation: u64,
    /// The expiry this node wrote last and the erasure count it saw.
    expires_at: DateTime<Utc>,
    contacts_gen: i64,
    /// merged contact → the contact it was merged into.
    redirect: HashMap<ContactId, ContactId>,
}

#[derive(Debug, PartialEq, Eq)]
struct Key {
    tenant: TenantId,
    generation: u64,
    kind: IdentityKind,
    value: Box<str>,
}

/// A [`Key`] borrowed, to look one up without allocating; hashed alike.
struct Probe<'a> {
    tenant: TenantId,
    generation: u64,
    kind: IdentityKind,
    value: &'a str,
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        (self.tenant, self.generation, self.kind, &*self.value).hash(h);
    }
}

impl Hash for Probe<'_> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        (self.tenant, self.generation, self.kind, self.value).hash(h);
    }
}

impl quick_cache::Equivalent<Key> for Probe<'_> {
    fn equivalent(&self, key: &Key) -> bool {
        self.tenant == key.tenant
            && self.generation == key.generation
            && self.kind == key.kind
            && self.value == &*key.value
    }
}

/// The node's known contacts (see the module doc).
#[derive(Debug)]
pub struct KnownContacts {
    /// `None`: kept nowhere (a capacity of 0).
    ids: Option<quick_cache::sync::Cache<Key, ContactId>>,
    tenants: Mutex<HashMap<TenantId, Tenant>>,
    generations: AtomicU64,
}

impl KnownContacts {
    /// At most `capacity` identities, over every tenant (0: none kept).
    pub fn new(capacity: usize) -> Self {
        KnownContacts {
            ids: (capacity > 0).then(|| quick_cache::sync::Cache::new(capacity)),
            tenants: Mutex::new(HashMap::new()),
            generations: AtomicU64::new(0),
        }
    }

    /// Called with what each lease write of this node found: the entries
    /// of the tenant that are still true (all of them when the write found
    /// this node's own mark, none otherwise). Processing reads with the
    /// generation its own lease renewal returned here.
    pub(crate) fn leased(&self, tenant: TenantId, mark: &LeaseMark) -> Generation {
        let mut tenants = self.tenants.lock();
        let kept = tenants.get_mut(&tenant).filter(|t| {
            mark.renewed_from == Some(t.expires_at) && mark.contacts_gen == t.contacts_gen
        });
        if let Some(t) = kept {
            t.expires_at = mark.expires_at;
            return Generation(t.generation);
        }
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        tenants.insert(
            tenant,
            Tenant {
                generation,
                expires_at: mark.expires_at,
                contacts_gen: mark.contacts_gen,
                redirect: HashMap::new(),
            },
        );
        Generation(generation)
    }

    /// The contact an identity of the tenant resolves to, if known.
    pub(crate) fn get(
        &self,
        tenant: TenantId,
        generation: Generation,
        kind: IdentityKind,
        value: &str,
    ) -> Option<ContactId> {
        let ids = self.ids.as_ref()?;
        let found = ids.get(&Probe {
            tenant,
            generation: generation.0,
            kind,
            value,
        })?;
        let tenants = self.tenants.lock();
        let t = tenants.get(&tenant)?;
        if t.generation != generation.0 {
            return None;
        }
        Some(canonical(&t.redirect, found))
    }

    /// What a committed round found and wrote: identities as the database
    /// holds them now, and merges (merged, survivor) whose identities the
    /// database repointed.
    pub(crate) fn learn<'a>(
        &self,
        tenant: TenantId,
        generation: Generation,
        identities: impl IntoIterator<Item = (IdentityKind, &'a str, ContactId)>,
        merges: &[(ContactId, ContactId)],
    ) {
        let Some(ids) = &self.ids else { return };
        {
            let mut tenants = self.tenants.lock();
            let Some(t) = tenants
                .get_mut(&tenant)
                .filter(|t| t.generation == generation.0)
            else {
                return;
            };
            if t.redirect.len() + merges.len() > REDIRECTS_KEPT {
                // Start the tenant over: its entries are left to age out.
                tenants.remove(&tenant);
                return;
            }
            for (merged, survivor) in merges {
                t.redirect.insert(*merged, *survivor);
            }
        }
        for (kind, value, contact) in identities {
            ids.insert(
                Key {
                    tenant,
                    generation: generation.0,
                    kind,
                    value: value.into(),
                },
                contact,
            );
        }
    }
}

fn canonical(redirect: &HashMap<ContactId, ContactId>, mut c: ContactId) -> ContactId {
    // Bounded: a redirect is only ever added from a contact to a newer
    // survivor, but a bound costs nothing.
    for _ in 0..64 {
        match redirect.get(&c) {
            Some(next) => c = *next,
            None => break,
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(from: Option<i64>, to: i64, erasures: i64) -> LeaseMark {
        let at = |s| DateTime::<Utc>::from_timestamp(s, 0).unwrap();
        LeaseMark {
            renewed_from: from.map(at),
            expires_at: at(to),
            contacts_gen: erasures,
        }
    }

    #[test]
    fn entries_hold_while_only_this_node_writes_the_lease() {
        let known = KnownContacts::new(100);
        let t = TenantId::new();
        let c = ContactId::new();
        let g = known.leased(t, &mark(None, 10, 0));
        known.learn(t, g, [(IdentityKind::User, "u-1", c)], &[]);
        assert_eq!(known.get(t, g, IdentityKind::User, "u-1"), Some(c));
        assert_eq!(known.get(t, g, IdentityKind::Anonymous, "u-1"), None);
        // The node's own renewal: still true.
        let g = known.leased(t, &mark(Some(10), 20, 0));
        assert_eq!(known.get(t, g, IdentityKind::User, "u-1"), Some(c));
        // Another tenant's entries are its own.
        let other = TenantId::new();
        let g2 = known.leased(other, &mark(None, 20, 0));
        assert_eq!(known.get(other, g2, IdentityKind::User, "u-1"), None);
    }

    #[test]
    fn another_writer_or_an_erasure_drops_the_tenant() {
        let known = KnownContacts::new(100);
        let t = TenantId::new();
        let c = ContactId::new();
        let g = known.leased(t, &mark(None, 10, 0));
        known.learn(t, g, [(IdentityKind::User, "u-1", c)], &[]);
        // Another node wrote the lease since (its expiry, not ours).
        let g = known.leased(t, &mark(Some(15), 30, 0));
        assert_eq!(known.get(t, g, IdentityKind::User, "u-1"), None);
        known.learn(t, g, [(IdentityKind::User, "u-1", c)], &[]);
        // An erasure counted up.
        let g = known.leased(t, &mark(Some(30), 40, 1));
        assert_eq!(known.get(t, g, IdentityKind::User, "u-1"), None);
        // The row deleted and inserted again (a release, then a take).
        known.learn(t, g, [(IdentityKind::User, "u-1", c)], &[]);
        let g = known.leased(t, &mark(None, 50, 1));
        assert_eq!(known.get(t, g, IdentityKind::User, "u-1"), None);
        // A stale generation's reader finds nothing either.
        let old = Generation(g.0 - 1);
        assert_eq!(known.get(t, old, IdentityKind::User, "u-1"), None);
    }

    #[test]
    fn a_merge_redirects_the_merged_contacts_identities() {
        let known = KnownContacts::new(100);
        let t = TenantId::new();
        let (anon, user) = (ContactId::new(), ContactId::new());
        let g = known.leased(t, &mark(None, 10, 0));
        known.learn(
            t,
            g,
            [
                (IdentityKind::Anonymous, "a-1", anon),
                (IdentityKind::User, "u-1", user),
            ],
            &[],
        );
        known.learn(t, g, [], &[(anon, user)]);
        assert_eq!(known.get(t, g, IdentityKind::Anonymous, "a-1"), Some(user));
        assert_eq!(known.get(t, g, IdentityKind::User, "u-1"), Some(user));
    }

    #[test]
    fn a_capacity_of_zero_keeps_nothing() {
        let known = KnownContacts::new(0);
        let t = TenantId::new();
        let g = known.leased(t, &mark(None, 10, 0));
        known.learn(t, g, [(IdentityKind::User, "u-1", ContactId::new())], &[]);
        assert_eq!(known.get(t, g, IdentityKind::User, "u-1"), None);
    }
}
