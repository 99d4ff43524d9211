//! Leases and the processing transaction: the second fence, identity, rounds that run at once or one after another.

use super::*;

conformance!(
    leases,
    processing_and_identity,
    processed_rows_are_not_taken_again,
    concurrent_rounds_store_each_event_once,
    chained_rounds_take_every_row_once,
    lease_lost_rolls_back
);

async fn leases(store: &Store) {
    let t = tenant(store, "t").await;
    let (n1, n2) = (NodeId::new(), NodeId::new());
    let ttl = Duration::seconds(10);
    let t0 = now();
    // Two nodes at once: exactly one holds it.
    let won = join_all([
        store.processing().try_lease(t.id, n1, t0, ttl),
        store.processing().try_lease(t.id, n2, t0, ttl),
    ])
    .await;
    let won: Vec<bool> = won.into_iter().map(Result::unwrap).collect();
    assert_eq!(won.iter().filter(|w| **w).count(), 1, "{won:?}");
    let (holder, other) = if won[0] { (n1, n2) } else { (n2, n1) };
    // The holder renews; the other cannot take it before it expires ...
    assert!(
        store
            .processing()
            .try_lease(t.id, holder, t0 + Duration::seconds(5), ttl)
            .await
            .unwrap()
    );
    assert!(
        !store
            .processing()
            .try_lease(t.id, other, t0 + Duration::seconds(14), ttl)
            .await
            .unwrap()
    );
    // ... and takes it once it has.
    assert!(
        store
            .processing()
            .try_lease(t.id, other, t0 + Duration::seconds(16), ttl)
            .await
            .unwrap()
    );
    assert!(
        !store
            .processing()
            .try_lease(t.id, holder, t0 + Duration::seconds(16), ttl)
            .await
            .unwrap()
    );
    // Releasing someone else's lease does nothing; releasing one's own
    // frees it at once.
    store
        .processing()
        .release_lease(t.id, holder)
        .await
        .unwrap();
    assert!(
        !store
            .processing()
            .try_lease(t.id, holder, t0 + Duration::seconds(17), ttl)
            .await
            .unwrap()
    );
    store.processing().release_lease(t.id, other).await.unwrap();
    assert!(
        store
            .processing()
            .try_lease(t.id, holder, t0 + Duration::seconds(17), ttl)
            .await
            .unwrap()
    );
}

async fn processing_and_identity(store: &Store) {
    let t = tenant(store, "t").await;
    let at = now() - Duration::minutes(5);
    // An anonymous visitor tracks, then identifies as a known user.
    let mut anon_track = track("k1", "ignored", at);
    anon_track.user_id = None;
    anon_track.anonymous_id = Some("anon-1".into());
    let user_track = track("k2", "user-1", at + Duration::seconds(1));
    let ident = identify("k3", "user-1", "anon-1", at + Duration::seconds(2));
    let rows = [
        row(t.id, &anon_track),
        row(t.id, &user_track),
        row(t.id, &ident),
    ];
    accept(store, &rows).await;
    let out = process_all(store, t.id, false).await;
    assert_eq!(out.consumed, 3);
    assert_eq!(out.appended.len(), 3);
    assert_eq!(out.already_processed, 0);
    assert_eq!(out.received.len(), 3);
    assert!(out.last_seq.is_some());

    // Nothing left: a second transaction consumes nothing.
    let again = process_all(store, t.id, false).await;
    assert_eq!(again.consumed, 0);

    let stored = events(store, t.id, around(at)).await;
    assert_eq!(stored.len(), 3);
    let first = stored.iter().find(|e| e.id == rows[1].event_id).unwrap();
    assert_eq!(first.kind, EventKind::Track);
    assert_eq!(first.event.as_deref(), Some("Order Completed"));
    assert_eq!(first.properties, user_track.properties);
    // Same instant, the caller's offset.
    assert_eq!(first.occurred_at, user_track.occurred_at);
    assert_eq!(first.occurred_at.offset().local_minus_utc(), 7200);
    assert_eq!(first.user_id.as_deref(), Some("user-1"));
    assert_eq!(first.anonymous_id, None);
    assert_eq!(
        store.events().count(t.id, around(at)).await.unwrap(),
        3,
        "count agrees with the read"
    );
    // Another tenant sees nothing; a range that misses sees nothing.
    let other = tenant(store, "other").await;
    assert!(events(store, other.id, around(at)).await.is_empty());
    let later = TimeRange::new(at + Duration::days(2), at + Duration::days(3)).unwrap();
    assert!(events(store, t.id, later).await.is_empty());

    // Identity: both ids lead to one contact, which holds the traits and
    // the contact the anonymous visitor had.
    let by_user = store
        .contacts()
        .find(t.id, IdentityKind::User, "user-1")
        .await
        .unwrap()
        .expect("contact by user id");
    let by_anon = store
        .contacts()
        .find(t.id, IdentityKind::Anonymous, "anon-1")
        .await
        .unwrap()
        .expect("contact by anonymous id");
    assert_eq!(by_user.id, by_anon.id);
    assert_eq!(by_user.user_ids, vec!["user-1".to_owned()]);
    assert_eq!(by_user.anonymous_ids, vec!["anon-1".to_owned()]);
    assert_eq!(by_user.traits.get("plan"), Some(&json!("gold")));
    assert_eq!(
        store
            .contacts()
            .get(t.id, by_user.id)
            .await
            .unwrap()
            .map(|c| c.id),
        Some(by_user.id)
    );
    assert!(
        store
            .contacts()
            .get(other.id, by_user.id)
            .await
            .unwrap()
            .is_none()
    );
    let family: HashSet<ContactId> = store
        .contacts()
        .family(t.id, by_user.id)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let on_events: HashSet<ContactId> = stored.iter().map(|e| e.contact_id).collect();
    assert!(family.contains(&by_user.id));
    assert!(
        on_events.is_subset(&family),
        "every event's contact is in the family: {on_events:?} ⊄ {family:?}"
    );
    // A read by contact finds the anonymous visitor's event too.
    let mine = store
        .events()
        .query(&EventQuery {
            tenant_id: t.id,
            range: around(at),
            contact_ids: Some(family.iter().copied().collect()),
            event: Some("Order Completed".into()),
            after: None,
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(mine.len(), 2);
    // Pages resume strictly after (occurred_at, id), in that order.
    let page1 = store
        .events()
        .query(&EventQuery {
            tenant_id: t.id,
            range: around(at),
            contact_ids: None,
            event: None,
            after: None,
            limit: 2,
        })
        .await
        .unwrap();
    assert_eq!(page1.len(), 2);
    let last = page1.last().unwrap();
    let page2 = store
        .events()
        .query(&EventQuery {
            tenant_id: t.id,
            range: around(at),
            contact_ids: None,
            event: None,
            after: Some((last.occurred_at.with_timezone(&Utc), last.id)),
            limit: 2,
        })
        .await
        .unwrap();
    assert_eq!(page2.len(), 1);
    assert!(page1.iter().all(|e| e.id != page2[0].id));
}

/// A round processed is not taken again: a second round finds nothing,
/// the event is stored once and nothing waits.
async fn processed_rows_are_not_taken_again(store: &Store) {
    let t = tenant(store, "t").await;
    let at = now();
    accept(store, &[row(t.id, &track("k", "u", at))]).await;
    let node = take_lease(store, t.id).await;
    let first = store
        .processing()
        .run(&request(t.id, node, false))
        .await
        .unwrap();
    assert_eq!(first.appended.len(), 1);
    let again = store
        .processing()
        .run(&request(t.id, node, false))
        .await
        .unwrap();
    assert!(again.appended.is_empty(), "{again:?}");
    assert_eq!(again.consumed, 0);
    assert_eq!(store.processing().inbox_stats().await.unwrap().0, 0);
    assert!(store.processing().inbox_empty().await.unwrap());
    assert_eq!(store.events().count(t.id, around(at)).await.unwrap(), 1);
}

/// Two processing rounds of one tenant at once (one node's drain and its
/// tick, say), each taking rows in small batches until none are left:
/// every event is stored exactly once and the inbox ends empty.
async fn concurrent_rounds_store_each_event_once(store: &Store) {
    let t = tenant(store, "t").await;
    let at = now();
    let rows: Vec<IngestRow> = (0..300)
        .map(|i| row(t.id, &track(&format!("k{i}"), &format!("u{}", i % 7), at)))
        .collect();
    accept(store, &rows).await;
    let node = take_lease(store, t.id).await;
    let round = |store: Store| async move {
        let mut appended = Vec::new();
        loop {
            let mut req = request(t.id, node, false);
            req.limit = 40;
            // The round that lost the race to the other's commit is told
            // so (the embedded log's cursor moved under it) and goes on.
            let out = match store.processing().run(&req).await {
                Ok(out) => out,
                Err(Error::LeaseLost) => continue,
                Err(e) => panic!("process: {e}"),
            };
            if out.consumed == 0 {
                return appended;
            }
            appended.extend(out.appended.into_iter().map(|(id, _)| id));
        }
    };
    let (a, b) = tokio::join!(round(store.clone()), round(store.clone()));
    assert_eq!(
        a.len() + b.len(),
        300,
        "each event appended by one round only"
    );
    let ids: HashSet<EventId> = a.into_iter().chain(b).collect();
    assert_eq!(ids.len(), 300);
    assert_eq!(store.events().count(t.id, around(at)).await.unwrap(), 300);
    assert!(store.processing().inbox_empty().await.unwrap());
}

/// Rounds chained by `after_seq`, as the processor's drain runs them (the
/// embedded store reads each full round's successor while it writes): the
/// tenant's inbox drained three times, with new rows accepted after each
/// drain. Every event is taken once, in accept order, and a drain that ends
/// (a round with no rows) has left none behind.
async fn chained_rounds_take_every_row_once(store: &Store) {
    let t = tenant(store, "t").await;
    let at = now();
    let node = take_lease(store, t.id).await;
    let (mut sent, mut appended, mut after) = (Vec::new(), Vec::new(), None);
    for drain in 0..3 {
        // A multiple of the round size: each drain's last full round reads
        // ahead into an empty inbox.
        let rows: Vec<IngestRow> = (0..80)
            .map(|i| {
                let key = format!("k{drain}-{i}");
                row(t.id, &track(&key, &format!("u{}", i % 7), at))
            })
            .collect();
        accept(store, &rows).await;
        sent.extend(rows.iter().map(|r| r.event_id));
        loop {
            let mut req = request(t.id, node, false);
            req.limit = 40;
            req.after_seq = after;
            let out = store.processing().run(&req).await.expect("process");
            if out.consumed == 0 {
                break;
            }
            appended.extend(out.appended.iter().map(|(id, _)| *id));
            after = out.last_seq.or(after);
        }
        assert_eq!(appended, sent, "drain {drain}");
    }
    assert!(store.processing().inbox_empty().await.unwrap());
}

/// A transaction whose lease was taken by another node commits nothing;
/// the inbox row is still there for the new holder, who appends it once.
async fn lease_lost_rolls_back(store: &Store) {
    let t = tenant(store, "t").await;
    let at = now();
    let r = row(t.id, &track("k", "u", at));
    accept(store, std::slice::from_ref(&r)).await;
    let (old, new) = (NodeId::new(), NodeId::new());
    let t0 = Utc::now();
    assert!(
        store
            .processing()
            .try_lease(t.id, old, t0 - Duration::seconds(60), Duration::seconds(1))
            .await
            .unwrap()
    );
    assert!(
        store
            .processing()
            .try_lease(t.id, new, t0, Duration::seconds(30))
            .await
            .unwrap()
    );
    assert!(matches!(
        store.processing().run(&request(t.id, old, false)).await,
        Err(Error::LeaseLost)
    ));
    assert_eq!(store.processing().inbox_stats().await.unwrap().0, 1);
    let out = store
        .processing()
        .run(&request(t.id, new, false))
        .await
        .unwrap();
    assert_eq!(out.appended.len(), 1);
    assert_eq!(store.events().count(t.id, around(at)).await.unwrap(), 1);
    // Without any lease there is no processing either.
    store.processing().release_lease(t.id, new).await.unwrap();
    accept(store, &[row(t.id, &track("k2", "u", at))]).await;
    assert!(matches!(
        store.processing().run(&request(t.id, new, false)).await,
        Err(Error::LeaseLost)
    ));
}
