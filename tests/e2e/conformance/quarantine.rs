//! Inbox rows that fail: counted, quarantined, put back.

use super::*;

conformance!(
    chained_rounds_see_quarantine_and_put_back,
    quarantine_round_trip
);

/// Rounds chained by `after_seq` while an event leaves the inbox for
/// quarantine and comes back: the quarantined row is not taken again, the
/// one put back is (the embedded store takes chained rounds from memory,
/// so this is what says its memory follows the file).
async fn chained_rounds_see_quarantine_and_put_back(store: &Store) {
    let t = tenant(store, "t").await;
    let at = now();
    let node = take_lease(store, t.id).await;
    let rows: Vec<IngestRow> = ["a", "b", "c"]
        .iter()
        .map(|k| row(t.id, &track(k, "u", at)))
        .collect();
    accept(store, &rows).await;
    let round = |after: Option<i64>| {
        let mut req = request(t.id, node, false);
        req.limit = 1;
        req.after_seq = after;
        req
    };
    let first = store.processing().run(&round(None)).await.unwrap();
    assert_eq!(first.appended.len(), 1);
    assert_eq!(first.appended[0].0, rows[0].event_id);
    // `b` fails for good and leaves the inbox.
    let (seq_b, id_b) = store
        .quarantine()
        .next_inbox_row(t.id, first.last_seq)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(id_b, rows[1].event_id);
    store
        .quarantine()
        .record_failure(t.id, seq_b, "boom")
        .await
        .unwrap();
    assert!(
        store
            .quarantine()
            .take(t.id, seq_b, at)
            .await
            .unwrap()
            .is_some()
    );
    let second = store
        .processing()
        .run(&round(first.last_seq))
        .await
        .unwrap();
    assert_eq!(
        second
            .appended
            .iter()
            .map(|(id, _)| *id)
            .collect::<Vec<_>>(),
        vec![rows[2].event_id],
        "the quarantined row is not taken"
    );
    // Put back, it comes after `c` and the next chained round takes it.
    assert!(store.quarantine().retry(t.id, id_b).await.unwrap());
    let third = store
        .processing()
        .run(&round(second.last_seq))
        .await
        .unwrap();
    assert_eq!(
        third.appended.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        vec![id_b],
        "the event put back is taken"
    );
    assert!(store.processing().inbox_empty().await.unwrap());
    assert_eq!(store.events().count(t.id, around(at)).await.unwrap(), 3);
}

async fn quarantine_round_trip(store: &Store) {
    let t = tenant(store, "t").await;
    let at = now();
    let poison = row(t.id, &track("poison", "u", at));
    let fine = row(t.id, &track("fine", "u", at));
    accept(store, &[poison.clone(), fine.clone()]).await;
    let (seq, id) = store
        .quarantine()
        .next_inbox_row(t.id, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(id, poison.event_id);
    let (next_seq, next_id) = store
        .quarantine()
        .next_inbox_row(t.id, Some(seq))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next_id, fine.event_id);
    assert!(next_seq > seq);
    assert!(
        store
            .quarantine()
            .next_inbox_row(t.id, Some(next_seq))
            .await
            .unwrap()
            .is_none()
    );

    assert_eq!(
        store
            .quarantine()
            .record_failure(t.id, seq, "boom 1")
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .quarantine()
            .record_failure(t.id, seq, "boom 2")
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        store
            .quarantine()
            .record_failure(t.id, 999_999, "gone")
            .await
            .unwrap(),
        0
    );
    let q = store
        .quarantine()
        .take(t.id, seq, at)
        .await
        .unwrap()
        .expect("moved");
    assert_eq!(q.event_id, poison.event_id);
    assert_eq!((q.attempts, q.error.as_str()), (2, "boom 2"));
    assert_eq!(
        q.payload,
        serde_json::from_str::<Value>(&poison.payload).unwrap()
    );
    assert!(
        store
            .quarantine()
            .take(t.id, seq, at)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        store.quarantine().list(t.id, 10).await.unwrap(),
        vec![q.clone()]
    );
    assert_eq!(
        store.quarantine().get(t.id, q.event_id).await.unwrap(),
        Some(q.clone())
    );
    let other = tenant(store, "other").await;
    assert!(
        store
            .quarantine()
            .get(other.id, q.event_id)
            .await
            .unwrap()
            .is_none()
    );

    // The tenant's other event goes on.
    let out = process_all(store, t.id, false).await;
    assert_eq!(
        out.appended.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        vec![fine.event_id]
    );

    // Retry puts it back under the same id, behind an event accepted
    // since; it is still the oldest waiting, and processing appends both.
    let newer = IngestRow::new(
        t.id,
        track("newer", "u", at),
        fingerprint(&track("newer", "u", at)),
        poison.received_at + chrono::Duration::minutes(5),
    );
    accept(store, std::slice::from_ref(&newer)).await;
    assert!(store.quarantine().retry(t.id, q.event_id).await.unwrap());
    assert!(!store.quarantine().retry(t.id, q.event_id).await.unwrap());
    assert!(store.quarantine().list(t.id, 10).await.unwrap().is_empty());
    let (depth, oldest) = store.processing().inbox_stats().await.unwrap();
    assert_eq!(depth, 2);
    assert_eq!(
        oldest.map(|o| o.timestamp_micros()),
        Some(poison.received_at.timestamp_micros()),
        "the put-back event is the oldest waiting"
    );
    let out = process_all(store, t.id, false).await;
    assert_eq!(
        out.appended.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        vec![newer.event_id, poison.event_id]
    );

    // Drop discards for good.
    let doomed = row(t.id, &track("doomed", "u", at));
    accept(store, std::slice::from_ref(&doomed)).await;
    let (seq, _) = store
        .quarantine()
        .next_inbox_row(t.id, None)
        .await
        .unwrap()
        .unwrap();
    store
        .quarantine()
        .record_failure(t.id, seq, "bad")
        .await
        .unwrap();
    store
        .quarantine()
        .take(t.id, seq, at)
        .await
        .unwrap()
        .unwrap();
    assert!(
        store
            .quarantine()
            .discard(t.id, doomed.event_id)
            .await
            .unwrap()
    );
    assert!(
        !store
            .quarantine()
            .discard(t.id, doomed.event_id)
            .await
            .unwrap()
    );
    assert!(store.quarantine().list(t.id, 10).await.unwrap().is_empty());
    assert_eq!(store.processing().inbox_stats().await.unwrap().0, 0);
}
