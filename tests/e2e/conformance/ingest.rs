//! The group commit: its idempotency fence, its deadline, the inbox's send order.

use super::*;

conformance!(
    ingest_fences,
    late_groups_commit_nothing,
    inbox_keeps_send_order,
    relaxed_commits_do_not_leak
);

async fn ingest_fences(store: &Store) {
    let t = tenant(store, "t").await;
    let other = tenant(store, "other").await;
    let at = now();
    let a = row(t.id, &track("k-a", "u", at));
    let b = row(t.id, &track("k-b", "u", at));
    // The same key in another tenant is another key.
    let c = row(other.id, &track("k-a", "u", at));
    assert_eq!(
        accept(store, &[a.clone(), b.clone(), c.clone()]).await,
        vec![Fence::Fresh, Fence::Fresh, Fence::Fresh]
    );
    // Sent again (a new event id, as a retry gets): the key answers the
    // first event id and fingerprint.
    let again = row(t.id, &track("k-a", "u", at));
    assert_eq!(
        accept(store, &[again]).await,
        vec![Fence::Taken {
            event_id: a.event_id,
            fingerprint: a.fingerprint
        }]
    );
    // A row the keep function drops releases its key in the same
    // transaction; its neighbour stays.
    let dropped = row(t.id, &track("k-dropped", "u", at));
    let kept = row(t.id, &track("k-kept", "u", at));
    let fences = store
        .ingest()
        .commit(
            &[dropped.clone(), kept.clone()],
            &|f: &[Fence]| f.iter().enumerate().map(|(i, _)| i == 1).collect(),
            later(),
        )
        .await
        .unwrap();
    assert_eq!(fences, vec![Fence::Fresh, Fence::Fresh]);
    let retry = row(t.id, &track("k-dropped", "u", at));
    assert_eq!(
        accept(store, std::slice::from_ref(&retry)).await,
        vec![Fence::Fresh]
    );
    assert_eq!(
        accept(store, &[row(t.id, &track("k-kept", "u", at))]).await,
        vec![Fence::Taken {
            event_id: kept.event_id,
            fingerprint: kept.fingerprint
        }]
    );

    // A group meeting a key taken with other content: the keep function
    // sees the owner's fence and drops the whole group; the fresh key it
    // recorded on the way is released, nothing is queued.
    let fresh = row(t.id, &track("k-fresh", "u", at));
    let clash = row(t.id, &track("k-a", "someone else", at));
    let fences = store
        .ingest()
        .commit(
            &[fresh.clone(), clash],
            &|f: &[Fence]| {
                let clashes = f.iter().any(|f| matches!(f, Fence::Taken { .. }));
                vec![!clashes; f.len()]
            },
            later(),
        )
        .await
        .unwrap();
    assert_eq!(
        fences,
        vec![
            Fence::Fresh,
            Fence::Taken {
                event_id: a.event_id,
                fingerprint: a.fingerprint
            }
        ]
    );
    assert_eq!(
        store
            .ingest()
            .taken_keys(t.id, std::slice::from_ref(&fresh.idempotency_key))
            .await
            .unwrap(),
        vec![]
    );

    // Inbox: a, b, kept, retry for t; c for other.
    let (depth, oldest) = store.processing().inbox_stats().await.unwrap();
    assert_eq!(depth, 5);
    assert!(oldest.is_some());
    let backlog: HashSet<TenantId> = store
        .processing()
        .backlog_tenants(10)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(backlog, HashSet::from([t.id, other.id]));
    let out = process_all(store, t.id, false).await;
    assert_eq!(out.consumed, 4);
    assert_eq!(out.appended.len(), 4);
    assert_eq!(
        store.processing().backlog_tenants(10).await.unwrap(),
        vec![other.id]
    );
    assert_eq!(store.processing().inbox_stats().await.unwrap().0, 1);
    assert!(
        !store.processing().inbox_empty().await.unwrap(),
        "the other tenant's row still waits"
    );
    let ids: HashSet<EventId> = events(store, t.id, around(at))
        .await
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(
        ids,
        HashSet::from([a.event_id, b.event_id, kept.event_id, retry.event_id])
    );
}

/// A group that reaches the store after its deadline (its requests were
/// answered 503) stores nothing: no key taken, no inbox row — whether its
/// keys are all new (PostgreSQL's one-statement path, refused by the
/// server's clock) or some are taken (the transaction).
async fn late_groups_commit_nothing(store: &Store) {
    let t = tenant(store, "t").await;
    let at = now();
    let past = std::time::Instant::now() - std::time::Duration::from_millis(5);
    let fresh = row(t.id, &track("late-a", "u", at));
    let late = store
        .ingest()
        .commit(std::slice::from_ref(&fresh), &keep_all, past)
        .await;
    assert!(matches!(late, Err(Error::Deadline(_))), "{late:?}");
    assert_eq!(
        store
            .ingest()
            .taken_keys(t.id, std::slice::from_ref(&fresh.idempotency_key))
            .await
            .unwrap(),
        vec![]
    );
    assert_eq!(store.processing().inbox_stats().await.unwrap().0, 0);

    let first = row(t.id, &track("late-b", "u", at));
    assert_eq!(
        accept(store, std::slice::from_ref(&first)).await,
        vec![Fence::Fresh]
    );
    let mixed = [
        row(t.id, &track("late-b", "u", at)),
        row(t.id, &track("late-c", "u", at)),
    ];
    let late = store.ingest().commit(&mixed, &keep_all, past).await;
    assert!(matches!(late, Err(Error::Deadline(_))), "{late:?}");
    assert_eq!(
        store
            .ingest()
            .taken_keys(t.id, &["late-c".to_owned()])
            .await
            .unwrap(),
        vec![]
    );
    assert_eq!(store.processing().inbox_stats().await.unwrap().0, 1);
    // In time, the same group goes through.
    assert_eq!(
        accept(store, &mixed).await,
        vec![
            Fence::Taken {
                event_id: first.event_id,
                fingerprint: first.fingerprint
            },
            Fence::Fresh
        ]
    );
}

/// Inbox rows are numbered in the order they were sent, whichever way the
/// group commit went (all keys new, or some taken): processing follows it.
async fn inbox_keeps_send_order(store: &Store) {
    let t = tenant(store, "t").await;
    let at = now();
    let fresh: Vec<IngestRow> = ["k-z", "k-a", "k-m"]
        .iter()
        .map(|k| row(t.id, &track(k, "u", at)))
        .collect();
    accept(store, &fresh).await;
    let mixed: Vec<IngestRow> = ["k-y", "k-a", "k-b"]
        .iter()
        .map(|k| row(t.id, &track(k, "u", at)))
        .collect();
    let fences = accept(store, &mixed).await;
    assert!(matches!(fences[1], Fence::Taken { .. }));
    let mut order = Vec::new();
    let mut after = None;
    while let Some((seq, id)) = store
        .quarantine()
        .next_inbox_row(t.id, after)
        .await
        .unwrap()
    {
        order.push(id);
        after = Some(seq);
    }
    let sent: Vec<EventId> = fresh
        .iter()
        .chain([&mixed[0], &mixed[2]])
        .map(|r| r.event_id)
        .collect();
    assert_eq!(order, sent);
}

/// A relaxed commit (an outbox claim: a crash only repeats it) does not
/// leave the writer relaxed: the next write on it — a processing commit, a
/// record — waits for the disk again.
async fn relaxed_commits_do_not_leak(store: &Store) {
    use sea_orm::{ConnectionTrait, DbBackend, Statement};
    store
        .outbox()
        .claim(AMQP, Utc::now(), Duration::seconds(30), 10)
        .await
        .unwrap();
    let db = store.connection_for_tests();
    let backend = db.get_database_backend();
    let sql = match backend {
        DbBackend::Postgres => "SHOW synchronous_commit",
        _ => "PRAGMA main.synchronous",
    };
    let row = db
        .query_one_raw(Statement::from_string(backend, sql))
        .await
        .unwrap()
        .unwrap();
    match backend {
        DbBackend::Postgres => assert_eq!(row.try_get_by_index::<String>(0).unwrap(), "on"),
        // 2 is FULL.
        _ => assert_eq!(row.try_get_by_index::<i64>(0).unwrap(), 2),
    }
}
