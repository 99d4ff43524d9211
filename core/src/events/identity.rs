//! Identity resolution, as a pure function over a snapshot of the tenant's
//! known identities. Storage loads the snapshot and applies the plan in the
//! processing transaction; keeping the rules here makes them testable
//! without a database.
//!
//! Rules, in event order:
//! - an unknown id creates an anonymous contact (the event is never dropped);
//! - an event carrying both ids attaches an unknown one to the known one's
//!   contact (both unknown: one new contact with both);
//! - `identify` with both ids known on different contacts merges the
//!   anonymous id's contact into the user id's contact, unless that contact
//!   already belongs to another user (a shared device): then only the event
//!   goes to the user's contact;
//! - `identify` traits are merged (shallow, last write wins) into the contact.

use std::collections::{HashMap, HashSet};

use fastack_entities::{ContactId, EventKind, IdentityKind, NewEvent};
use serde_json::{Map, Value};

/// What storage knows before the batch.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// identity → canonical contact.
    pub identities: HashMap<(IdentityKind, String), ContactId>,
    /// Known contacts that already carry a user id.
    pub contacts_with_user: HashSet<ContactId>,
    /// Current traits of known contacts that this batch touches.
    pub traits: HashMap<ContactId, Map<String, Value>>,
}

/// What storage must write.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// Per input event, the contact it belongs to.
    pub contact_of: Vec<ContactId>,
    /// Contacts created by this batch, with their initial traits.
    pub new_contacts: Vec<(ContactId, Map<String, Value>)>,
    /// Identity rows to insert or repoint.
    pub identities: Vec<(IdentityKind, String, ContactId)>,
    /// (merged, survivor): the merged contact and everything merged into it
    /// now points at the survivor.
    pub merges: Vec<(ContactId, ContactId)>,
    /// New traits of pre-existing contacts.
    pub traits: Vec<(ContactId, Map<String, Value>)>,
}

impl Plan {
    /// Every pre-existing contact whose traits the batch may change.
    pub fn needs_traits(events: &[&NewEvent], snapshot: &Snapshot) -> Vec<ContactId> {
        let mut out: HashSet<ContactId> = HashSet::new();
        for ev in events.iter().filter(|e| e.kind == EventKind::Identify) {
            for (kind, id) in ids(ev) {
                if let Some(c) = snapshot.identities.get(&(kind, id.to_owned())) {
                    out.insert(*c);
                }
            }
        }
        out.into_iter().collect()
    }
}

fn ids(ev: &NewEvent) -> impl Iterator<Item = (IdentityKind, &str)> {
    ev.user_id
        .as_deref()
        .map(|u| (IdentityKind::User, u))
        .into_iter()
        .chain(
            ev.anonymous_id
                .as_deref()
                .map(|a| (IdentityKind::Anonymous, a)),
        )
}

struct Resolver<'a> {
    snapshot: &'a Snapshot,
    identities: HashMap<(IdentityKind, String), ContactId>,
    redirect: HashMap<ContactId, ContactId>,
    new: Vec<ContactId>,
    has_user: HashSet<ContactId>,
    traits: HashMap<ContactId, Map<String, Value>>,
    touched_traits: Vec<ContactId>,
    plan: Plan,
}

impl Resolver<'_> {
    fn canonical(&self, mut c: ContactId) -> ContactId {
        while let Some(next) = self.redirect.get(&c) {
            c = *next;
        }
        c
    }

    fn lookup(&self, kind: IdentityKind, value: &str) -> Option<ContactId> {
        let key = (kind, value.to_owned());
        self.identities
            .get(&key)
            .or_else(|| self.snapshot.identities.get(&key))
            .map(|c| self.canonical(*c))
    }

    fn bind(&mut self, kind: IdentityKind, value: &str, contact: ContactId) {
        self.identities.insert((kind, value.to_owned()), contact);
        self.plan.identities.push((kind, value.to_owned(), contact));
        if kind == IdentityKind::User {
            self.has_user.insert(contact);
        }
    }

    fn create(&mut self) -> ContactId {
        let c = ContactId::new();
        self.new.push(c);
        c
    }

    fn has_user(&self, c: ContactId) -> bool {
        self.has_user.contains(&c) || self.snapshot.contacts_with_user.contains(&c)
    }

    fn traits_mut(&mut self, c: ContactId) -> &mut Map<String, Value> {
        // `traits` gains a contact only here, so its first entry is its
        // first touch (a search of `touched_traits` per call was n² a round).
        if !self.traits.contains_key(&c) {
            let current = self.snapshot.traits.get(&c).cloned().unwrap_or_default();
            self.traits.insert(c, current);
            self.touched_traits.push(c);
        }
        self.traits.get_mut(&c).expect("inserted above")
    }

    fn merge(&mut self, merged: ContactId, survivor: ContactId) {
        self.redirect.insert(merged, survivor);
        self.plan.merges.push((merged, survivor));
        // Identities bound in this batch follow the survivor (storage repoints
        // the stored ones).
        for contact in self.identities.values_mut() {
            if *contact == merged {
                *contact = survivor;
            }
        }
        if self.has_user.contains(&merged) {
            self.has_user.insert(survivor);
        }
        // The survivor's traits win over the merged contact's.
        let loser = self
            .traits
            .remove(&merged)
            .or_else(|| self.snapshot.traits.get(&merged).cloned())
            .unwrap_or_default();
        let target = self.traits_mut(survivor);
        for (k, v) in loser {
            target.entry(k).or_insert(v);
        }
    }

    fn resolve(&mut self, ev: &NewEvent) -> ContactId {
        let user = ev.user_id.as_deref();
        let anon = ev.anonymous_id.as_deref();
        let known_user = user.and_then(|u| self.lookup(IdentityKind::User, u));
        let known_anon = anon.and_then(|a| self.lookup(IdentityKind::Anonymous, a));
        let contact = match (known_user, known_anon) {
            (Some(u), None) => {
                if let Some(a) = anon {
                    self.bind(IdentityKind::Anonymous, a, u);
                }
                u
            }
            (None, Some(a)) => {
                if let Some(u) = user {
                    self.bind(IdentityKind::User, u, a);
                }
                a
            }
            (None, None) => {
                let c = self.create();
                if let Some(u) = user {
                    self.bind(IdentityKind::User, u, c);
                }
                if let Some(a) = anon {
                    self.bind(IdentityKind::Anonymous, a, c);
                }
                c
            }
            (Some(u), Some(a)) if u == a => u,
            (Some(u), Some(a)) => {
                if ev.kind == EventKind::Identify && !self.has_user(a) {
                    self.merge(a, u);
                }
                u
            }
        };
        if ev.kind == EventKind::Identify && !ev.properties.is_empty() {
            let traits = self.traits_mut(contact);
            for (k, v) in &ev.properties {
                traits.insert(k.clone(), v.clone());
            }
        }
        contact
    }
}

/// Resolves every event of a batch, in order.
pub fn resolve(events: &[&NewEvent], snapshot: &Snapshot) -> Plan {
    // Sized for the batch: most events bind an identity, and growing the
    // maps by doubling rehashed them several times per round.
    let mut r = Resolver {
        snapshot,
        identities: HashMap::with_capacity(events.len()),
        redirect: HashMap::new(),
        new: Vec::new(),
        has_user: HashSet::with_capacity(events.len()),
        traits: HashMap::new(),
        touched_traits: Vec::new(),
        plan: Plan::default(),
    };
    let mut contact_of: Vec<ContactId> = events.iter().map(|ev| r.resolve(ev)).collect();
    // Looked up once per event below: a set, or a round creating n
    // contacts costs n² comparisons.
    let is_new: HashSet<ContactId> = r.new.iter().copied().collect();
    // A contact merged later in the batch: earlier events keep their contact
    // id (the read side follows merges), but identities must not point at it.
    for c in contact_of.iter_mut() {
        if is_new.contains(c) && r.redirect.contains_key(c) {
            // Never stored as a separate contact if created and merged in the
            // same batch: move its events to the survivor.
            *c = r.canonical(*c);
        }
    }
    let merged_new: HashSet<ContactId> = r
        .new
        .iter()
        .filter(|c| r.redirect.contains_key(c))
        .copied()
        .collect();
    let mut plan = std::mem::take(&mut r.plan);
    plan.contact_of = contact_of;
    plan.merges
        .retain(|(merged, _)| !merged_new.contains(merged));
    // Identity rows: the final binding of each identity, once.
    let mut seen = HashSet::with_capacity(plan.identities.len());
    let mut identities = Vec::with_capacity(plan.identities.len());
    for (kind, value, _) in plan.identities.iter().rev() {
        if seen.insert((*kind, value.clone())) {
            let c = r.identities[&(*kind, value.clone())];
            identities.push((*kind, value.clone(), r.canonical(c)));
        }
    }
    identities.reverse();
    plan.identities = identities;
    for c in &r.new {
        if !merged_new.contains(c) {
            let traits = r.traits.get(c).cloned().unwrap_or_default();
            plan.new_contacts.push((*c, traits));
        }
    }
    for c in r.touched_traits {
        if !is_new.contains(&c) && !r.redirect.contains_key(&c) {
            plan.traits
                .push((c, r.traits.get(&c).cloned().unwrap_or_default()));
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(kind: EventKind, user: Option<&str>, anon: Option<&str>, traits: Value) -> NewEvent {
        NewEvent {
            kind,
            event: (kind == EventKind::Track).then(|| "e".to_owned()),
            user_id: user.map(str::to_owned),
            anonymous_id: anon.map(str::to_owned),
            properties: traits.as_object().cloned().unwrap_or_default(),
            occurred_at: "2026-11-30T10:00:00Z".parse().unwrap(),
            idempotency_key: "k".to_owned(),
            plan: None,
        }
    }

    #[test]
    fn unknown_ids_create_contacts_and_repeat_ids_reuse_them() {
        let a = ev(EventKind::Track, None, Some("anon-1"), json!({}));
        let b = ev(EventKind::Track, None, Some("anon-1"), json!({}));
        let c = ev(EventKind::Track, Some("u-1"), None, json!({}));
        let plan = resolve(&[&a, &b, &c], &Snapshot::default());
        assert_eq!(plan.contact_of[0], plan.contact_of[1]);
        assert_ne!(plan.contact_of[0], plan.contact_of[2]);
        assert_eq!(plan.new_contacts.len(), 2);
        assert_eq!(plan.identities.len(), 2);
        assert!(plan.merges.is_empty());
    }

    #[test]
    fn identify_merges_anonymous_contact_into_user_contact() {
        let anon_c = ContactId::new();
        let user_c = ContactId::new();
        let mut snap = Snapshot::default();
        snap.identities
            .insert((IdentityKind::Anonymous, "a".into()), anon_c);
        snap.identities
            .insert((IdentityKind::User, "u".into()), user_c);
        snap.contacts_with_user.insert(user_c);
        snap.traits.insert(
            anon_c,
            json!({"seen": 1, "plan": "old"})
                .as_object()
                .cloned()
                .unwrap(),
        );
        snap.traits
            .insert(user_c, json!({"plan": "pro"}).as_object().cloned().unwrap());
        let id = ev(
            EventKind::Identify,
            Some("u"),
            Some("a"),
            json!({"email": "x@y"}),
        );
        let after = ev(EventKind::Track, None, Some("a"), json!({}));
        let plan = resolve(&[&id, &after], &snap);
        assert_eq!(plan.merges, vec![(anon_c, user_c)]);
        assert_eq!(plan.contact_of, vec![user_c, user_c]);
        let (c, traits) = &plan.traits[0];
        assert_eq!(*c, user_c);
        assert_eq!(traits["plan"], "pro");
        assert_eq!(traits["seen"], 1);
        assert_eq!(traits["email"], "x@y");
    }

    #[test]
    fn shared_device_does_not_merge_two_users() {
        let c1 = ContactId::new();
        let c2 = ContactId::new();
        let mut snap = Snapshot::default();
        snap.identities
            .insert((IdentityKind::Anonymous, "device".into()), c1);
        snap.identities
            .insert((IdentityKind::User, "alice".into()), c1);
        snap.identities
            .insert((IdentityKind::User, "bob".into()), c2);
        snap.contacts_with_user.extend([c1, c2]);
        let id = ev(EventKind::Identify, Some("bob"), Some("device"), json!({}));
        let plan = resolve(&[&id], &snap);
        assert!(plan.merges.is_empty());
        assert_eq!(plan.contact_of, vec![c2]);
    }

    #[test]
    fn new_contacts_merged_in_the_same_batch_are_never_written() {
        let a = ev(EventKind::Track, None, Some("a"), json!({}));
        let u = ev(EventKind::Track, Some("u"), None, json!({}));
        let id = ev(EventKind::Identify, Some("u"), Some("a"), json!({"n": 1}));
        let plan = resolve(&[&a, &u, &id], &Snapshot::default());
        assert_eq!(plan.new_contacts.len(), 1);
        let survivor = plan.new_contacts[0].0;
        assert_eq!(plan.contact_of, vec![survivor, survivor, survivor]);
        assert!(plan.merges.is_empty());
        assert_eq!(plan.new_contacts[0].1["n"], 1);
        assert!(plan.identities.iter().all(|(_, _, c)| *c == survivor));
    }

    #[test]
    fn track_with_both_ids_links_without_merging() {
        let plan = resolve(
            &[&ev(EventKind::Track, Some("u"), Some("a"), json!({}))],
            &Snapshot::default(),
        );
        assert_eq!(plan.new_contacts.len(), 1);
        assert_eq!(plan.identities.len(), 2);
    }
}
