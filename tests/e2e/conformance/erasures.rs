//! Erasures: holds, suppressions and an erasure's work on the database.

use super::*;

conformance!(erasure_holds_and_suppressions);

/// Erasure holds and suppressions: processing drops held and suppressed
/// identifiers' events (counted), the erasure's statements remove the
/// person's events partition by partition, their contacts and identities,
/// the verification search finds nothing left and nobody else's events
/// go; ending the erasure lifts its hold but not a suppression, which
/// lifting ends.
async fn erasure_holds_and_suppressions(store: &Store) {
    use fastack_core::store::{Person, Subject, SubjectKind, Window};
    let a = tenant(store, "erase-a").await;
    let b = tenant(store, "erase-b").await;
    let t = now() - Duration::days(40);
    let later = now() - Duration::hours(1);
    accept(
        store,
        &[
            row(a.id, &track("a-1", "u-1", t)),
            row(a.id, &identify("a-2", "u-1", "a-1", t)),
            row(a.id, &track("a-3", "u-1", later)),
            row(a.id, &track("a-4", "u-2", later)),
            row(b.id, &track("b-1", "u-1", later)),
        ],
    )
    .await;
    process_all(store, a.id, false).await;
    process_all(store, b.id, false).await;
    let asked = Person {
        user_ids: vec!["u-1".into()],
        ..Person::default()
    };
    let job = Job::queued(a.id, JobKind::Erasure, json!({}), Map::new(), now());
    let rec = store
        .erasures()
        .request(&job, &asked, Window::default(), false)
        .await
        .unwrap();
    let person = rec.person.clone().unwrap();
    assert_eq!(person.anonymous_ids, ["a-1"], "linked identifiers resolved");
    assert_eq!(person.contact_ids.len(), 1);
    // Held: accepted now, dropped by processing (the neighbour's is kept).
    accept(
        store,
        &[
            row(a.id, &track("a-5", "u-1", later)),
            row(a.id, &track("a-6", "u-2", later)),
        ],
    )
    .await;
    let out = process_all(store, a.id, false).await;
    assert_eq!((out.held, out.appended.len()), (1, 1));
    assert_eq!(store.erasures().dropped(job.id).await.unwrap(), 1);
    let settled = store.erasures().settle(&rec).await.unwrap();
    assert_eq!(settled.person, person);
    assert_eq!(
        store
            .erasures()
            .inbox_waiting(a.id, settled.inbox)
            .await
            .unwrap(),
        None,
        "processed: nothing accepted before the request waits"
    );
    let removed = store
        .erasures()
        .erase_events(job.id, a.id, &person, Window::default(), |_, _| json!({}))
        .await
        .unwrap();
    assert_eq!(removed.len(), 2, "two months of the person's events");
    assert_eq!(removed.values().sum::<u64>(), 3);
    store
        .erasures()
        .erase_contacts(
            job.id,
            a.id,
            &person,
            |c, i| json!({"contacts": c, "identities": i}),
        )
        .await
        .unwrap();
    let found = store
        .erasures()
        .search(a.id, &person, Window::default(), settled.inbox, now())
        .await
        .unwrap();
    assert_eq!(found.total(), 0, "{found:?}");
    let left = events(
        store,
        a.id,
        TimeRange::new(t - Duration::days(1), now()).unwrap(),
    )
    .await;
    assert_eq!(left.len(), 2);
    assert!(left.iter().all(|e| e.user_id.as_deref() == Some("u-2")));
    assert_eq!(
        events(store, b.id, around(later)).await.len(),
        1,
        "another tenant's u-1"
    );
    assert!(
        store
            .contacts()
            .find(a.id, IdentityKind::User, "u-1")
            .await
            .unwrap()
            .is_none()
    );
    // Its end lifts the hold: the person's next event is stored.
    let (mut claimed, node) = claim_erasure(store, job.id).await;
    fastack_core::jobs::conclude(
        &mut claimed,
        Ok(json!({})),
        now(),
        std::time::Duration::ZERO,
    );
    assert!(
        fastack_core::erasure::finish(
            store.as_ref(),
            &claimed,
            node,
            &Emit::default(),
            &Emit::default()
        )
        .await
        .unwrap()
    );
    assert!(
        store
            .erasures()
            .get(job.id)
            .await
            .unwrap()
            .unwrap()
            .person
            .is_none()
    );
    accept(store, &[row(a.id, &track("a-7", "u-1", later))]).await;
    let out = process_all(store, a.id, false).await;
    assert_eq!((out.held, out.appended.len()), (0, 1));

    // A suppression outlives its erasure, until lifted.
    let asked = Person {
        user_ids: vec!["u-2".into()],
        ..Person::default()
    };
    let job = Job::queued(a.id, JobKind::Erasure, json!({}), Map::new(), now());
    store
        .erasures()
        .request(&job, &asked, Window::default(), true)
        .await
        .unwrap();
    let (mut claimed, node) = claim_erasure(store, job.id).await;
    fastack_core::jobs::conclude(
        &mut claimed,
        Ok(json!({})),
        now(),
        std::time::Duration::ZERO,
    );
    fastack_core::erasure::finish(
        store.as_ref(),
        &claimed,
        node,
        &Emit::default(),
        &Emit::default(),
    )
    .await
    .unwrap();
    accept(store, &[row(a.id, &track("a-8", "u-2", later))]).await;
    let out = process_all(store, a.id, false).await;
    assert_eq!((out.suppressed, out.appended.len()), (1, 0));
    let subject = Subject::of(SubjectKind::UserId, "u-2");
    let listed = store
        .erasures()
        .suppressions(a.id, Some(&subject), 10)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].dropped, listed[0].request_id), (1, job.id));
    assert!(
        store
            .erasures()
            .suppressions(b.id, None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.erasures().lift(a.id, &subject).await.unwrap());
    assert!(!store.erasures().lift(a.id, &subject).await.unwrap());
    accept(store, &[row(a.id, &track("a-9", "u-2", later))]).await;
    let out = process_all(store, a.id, false).await;
    assert_eq!((out.suppressed, out.appended.len()), (0, 1));
}
