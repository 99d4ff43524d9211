//! Contacts and their identities (`store.contacts()`): what processing
//! wrote, read back by id (merges followed), by identity and as a merge
//! family, one tenant's never another's.

use super::*;

conformance!(
    merges_are_followed_from_every_id,
    traits_merge_across_rounds,
    unknown_ids_and_other_tenants_find_nothing
);

/// Accepts the events and processes the tenant's whole inbox.
async fn process(store: &Store, tenant: TenantId, events: &[NewEvent]) {
    let rows: Vec<IngestRow> = events.iter().map(|e| row(tenant, e)).collect();
    accept(store, &rows).await;
    let out = process_all(store, tenant, false).await;
    assert_eq!(out.consumed, events.len());
}

fn anonymous_track(key: &str, anon: &str, at: DateTime<Utc>) -> NewEvent {
    let mut e = track(key, "ignored", at);
    e.user_id = None;
    e.anonymous_id = Some(anon.to_owned());
    e
}

/// Two contacts made in one round are merged by an identify in the next:
/// every id of either leads to the survivor, which lists the other as
/// merged and holds both identities.
async fn merges_are_followed_from_every_id(store: &Store) {
    let t = tenant(store, "contacts").await;
    let at = now() - Duration::minutes(5);
    process(
        store,
        t.id,
        &[
            anonymous_track("k1", "anon-1", at),
            track("k2", "user-1", at + Duration::seconds(1)),
        ],
    )
    .await;
    let contacts = store.contacts();
    let anon = contacts
        .find(t.id, IdentityKind::Anonymous, "anon-1")
        .await
        .unwrap()
        .expect("the anonymous visitor's contact");
    let user = contacts
        .find(t.id, IdentityKind::User, "user-1")
        .await
        .unwrap()
        .expect("the user's contact");
    assert_ne!(anon.id, user.id, "two people until an identify joins them");
    assert!(anon.merged_ids.is_empty() && user.merged_ids.is_empty());

    process(
        store,
        t.id,
        &[identify(
            "k3",
            "user-1",
            "anon-1",
            at + Duration::seconds(2),
        )],
    )
    .await;
    let survivor = contacts
        .find(t.id, IdentityKind::User, "user-1")
        .await
        .unwrap()
        .expect("the user's contact after the merge");
    let by_anon = contacts
        .find(t.id, IdentityKind::Anonymous, "anon-1")
        .await
        .unwrap()
        .expect("the visitor's contact after the merge");
    assert_eq!(
        survivor.id, by_anon.id,
        "both identities lead to one contact"
    );
    assert_eq!(survivor.user_ids, vec!["user-1".to_owned()]);
    assert_eq!(survivor.anonymous_ids, vec!["anon-1".to_owned()]);
    let merged: Vec<ContactId> = [anon.id, user.id]
        .into_iter()
        .filter(|id| *id != survivor.id)
        .collect();
    assert_eq!(
        survivor.merged_ids, merged,
        "the other contact is listed as merged"
    );
    for id in [anon.id, user.id] {
        let got = contacts
            .get(t.id, id)
            .await
            .unwrap()
            .expect("a merged id still resolves");
        assert_eq!(got.id, survivor.id, "{id} leads to the survivor");
        let family: HashSet<ContactId> = contacts
            .family(t.id, id)
            .await
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(family, HashSet::from([anon.id, user.id]));
    }
    // The events keep the contact they were stored with; the family finds
    // both.
    let stored = events(store, t.id, around(at)).await;
    let family: HashSet<ContactId> = contacts
        .family(t.id, survivor.id)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(stored.len(), 3);
    assert!(stored.iter().all(|e| family.contains(&e.contact_id)));
}

/// `identify` traits merge shallowly into the contact, the later write
/// winning, across rounds.
async fn traits_merge_across_rounds(store: &Store) {
    let t = tenant(store, "traits").await;
    let at = now() - Duration::minutes(5);
    process(store, t.id, &[identify("k1", "user-1", "anon-1", at)]).await;
    let mut later = identify("k2", "user-1", "anon-1", at + Duration::seconds(1));
    later.properties = Map::from_iter([
        ("plan".to_owned(), json!("platinum")),
        ("seats".to_owned(), json!(3)),
    ]);
    process(store, t.id, &[later]).await;
    let c = store
        .contacts()
        .find(t.id, IdentityKind::User, "user-1")
        .await
        .unwrap()
        .expect("contact");
    assert_eq!(c.traits.get("plan"), Some(&json!("platinum")));
    assert_eq!(c.traits.get("seats"), Some(&json!(3)));
    assert_eq!(c.traits.len(), 2);
    assert!(c.updated_at >= c.created_at);
}

/// Nothing is found for an id or identity nobody sent, and the same user
/// id in two tenants is two contacts, each found only in its tenant.
async fn unknown_ids_and_other_tenants_find_nothing(store: &Store) {
    let (a, b) = (tenant(store, "a").await, tenant(store, "b").await);
    let at = now() - Duration::minutes(5);
    process(store, a.id, &[track("k1", "user-1", at)]).await;
    process(store, b.id, &[track("k1", "user-1", at)]).await;
    let contacts = store.contacts();
    let in_a = contacts
        .find(a.id, IdentityKind::User, "user-1")
        .await
        .unwrap()
        .expect("a's contact");
    let in_b = contacts
        .find(b.id, IdentityKind::User, "user-1")
        .await
        .unwrap()
        .expect("b's contact");
    assert_ne!(in_a.id, in_b.id);
    assert!(contacts.get(b.id, in_a.id).await.unwrap().is_none());
    assert!(contacts.family(b.id, in_a.id).await.unwrap().is_empty());
    assert!(
        contacts
            .find(a.id, IdentityKind::User, "nobody")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        contacts
            .find(a.id, IdentityKind::Anonymous, "user-1")
            .await
            .unwrap()
            .is_none(),
        "a user id is not an anonymous id"
    );
    assert!(
        contacts
            .get(a.id, ContactId::new())
            .await
            .unwrap()
            .is_none()
    );
}
