//! The outbox: claims per sink, rows owed to each, grouped rows, notifications.

use super::*;

conformance!(
    outbox_claims_are_disjoint,
    sinks_owe_rows_independently,
    sinks_completing_at_once_clear_the_marker,
    outbox_rows_are_announced,
    grouped_rows_carry_a_rounds_events
);

async fn outbox_claims_are_disjoint(store: &Store) {
    let t = tenant(store, "t").await;
    let at = now();
    let rows: Vec<IngestRow> = (0..60)
        .map(|i| row(t.id, &track(&format!("k{i}"), "u", at)))
        .collect();
    accept(store, &rows).await;
    // Streaming on: every processed event owes the relay a row.
    let out = process_all(store, t.id, true).await;
    assert_eq!(out.appended.len(), 60);
    assert_eq!(store.outbox().depth(AMQP).await.unwrap(), 60);

    // Two relays claim at once, in small batches, until nothing is left.
    let claim = |store: Store| async move {
        let mut mine = Vec::new();
        loop {
            let rows = store
                .outbox()
                .claim(AMQP, Utc::now(), Duration::seconds(30), 7)
                .await
                .unwrap();
            if rows.is_empty() {
                return mine;
            }
            mine.extend(rows);
        }
    };
    let (a, b) = tokio::join!(claim(store.clone()), claim(store.clone()));
    let ids_a: HashSet<i64> = a.iter().map(|r| r.id).collect();
    let ids_b: HashSet<i64> = b.iter().map(|r| r.id).collect();
    assert!(ids_a.is_disjoint(&ids_b), "a row was claimed twice");
    assert_eq!(ids_a.len() + ids_b.len(), 60);
    let subjects: HashSet<String> = a.iter().chain(&b).map(|r| r.subject.clone()).collect();
    let expected: HashSet<String> = rows.iter().map(|r| r.event_id.to_string()).collect();
    assert_eq!(subjects, expected);
    for r in a.iter().chain(&b) {
        assert_eq!(r.topic, Topic::Core);
        assert_eq!(r.routing_key, "core.event.tracked");
        assert_eq!(r.tenant_id, t.id);
        let body: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(body["id"], json!(r.subject));
    }

    // Released rows are claimable again at once; completed rows are gone.
    let a_ids: Vec<i64> = ids_a.iter().copied().collect();
    store.outbox().release(AMQP, &a_ids).await.unwrap();
    let again = claim(store.clone()).await;
    assert_eq!(again.iter().map(|r| r.id).collect::<HashSet<_>>(), ids_a);
    // An expired claim is claimable again too.
    let expired = store
        .outbox()
        .claim(
            AMQP,
            Utc::now() + Duration::seconds(31),
            Duration::seconds(30),
            100,
        )
        .await
        .unwrap();
    assert_eq!(expired.len(), 60);
    let all: Vec<i64> = expired.iter().map(|r| r.id).collect();
    store.outbox().complete(AMQP, &all).await.unwrap();
    assert_eq!(store.outbox().depth(AMQP).await.unwrap(), 0);
    assert!(
        store
            .outbox()
            .claim(
                AMQP,
                Utc::now() + Duration::hours(1),
                Duration::seconds(30),
                100
            )
            .await
            .unwrap()
            .is_empty()
    );
}

/// A row owed to three sinks stays until the last completes it; each sink
/// claims, releases and completes on its own; the job's event marker clears
/// only when no sink owes its row; a sink that never completes keeps it.
async fn sinks_owe_rows_independently(store: &Store) {
    let t = tenant(store, "t").await;
    let t0 = now();
    store
        .jobs()
        .insert(&job(t.id, JobKind::Export, t0))
        .await
        .unwrap();
    let node = NodeId::new();
    let claim_for = Duration::seconds(30);
    let mut j = store
        .jobs()
        .claim(node, t0, claim_for, None)
        .await
        .unwrap()
        .unwrap();
    j.status = JobStatus::Failed;
    j.finished_at = Some(t0);
    let emit = Emit::to([AMQP, ARCHIVE, AUDIT]);
    assert!(store.jobs().finish(&j, node, &emit).await.unwrap());
    for sink in [AMQP, ARCHIVE, AUDIT] {
        assert_eq!(store.outbox().depth(sink).await.unwrap(), 1, "{sink}");
    }
    // Every sink claims the same row; a claim by one blocks only that one.
    let claimed: Vec<Vec<i64>> = join_all([AMQP, ARCHIVE, AUDIT].map(|sink| async move {
        store
            .outbox()
            .claim(sink, Utc::now(), claim_for, 10)
            .await
            .unwrap()
            .iter()
            .map(|r| r.id)
            .collect()
    }))
    .await;
    assert!(
        claimed
            .iter()
            .all(|ids| ids.len() == 1 && ids == &claimed[0])
    );
    let id = claimed[0][0];
    assert!(
        store
            .outbox()
            .claim(AMQP, Utc::now(), claim_for, 10)
            .await
            .unwrap()
            .is_empty()
    );
    store.outbox().release(AMQP, &[id]).await.unwrap();
    assert_eq!(
        store
            .outbox()
            .claim(AMQP, Utc::now(), claim_for, 10)
            .await
            .unwrap()
            .len(),
        1
    );

    store.outbox().complete(AMQP, &[id]).await.unwrap();
    store.outbox().complete(ARCHIVE, &[id]).await.unwrap();
    assert_eq!(store.outbox().depth(AMQP).await.unwrap(), 0);
    assert_eq!(store.outbox().depth(AUDIT).await.unwrap(), 1);
    assert!(
        store
            .jobs()
            .get(t.id, j.id)
            .await
            .unwrap()
            .unwrap()
            .event_pending
    );
    // Completing twice changes nothing.
    store.outbox().complete(AMQP, &[id]).await.unwrap();
    assert_eq!(store.outbox().depth(AUDIT).await.unwrap(), 1);
    let late = store
        .outbox()
        .claim(AUDIT, Utc::now() + Duration::minutes(1), claim_for, 10)
        .await
        .unwrap();
    assert_eq!(late.len(), 1);
    assert_eq!(late[0].routing_key, "job.failed");
    store.outbox().complete(AUDIT, &[id]).await.unwrap();
    assert!(
        !store
            .jobs()
            .get(t.id, j.id)
            .await
            .unwrap()
            .unwrap()
            .event_pending
    );
    for sink in [AMQP, ARCHIVE, AUDIT] {
        assert_eq!(store.outbox().depth(sink).await.unwrap(), 0, "{sink}");
    }
    // Nothing written when no sink takes the event.
    let quiet = ended_job(store, t.id, JobStatus::Failed, &Emit::default()).await;
    assert!(!event_pending(store, &quiet).await);
    assert_eq!(store.outbox().depth(AUDIT).await.unwrap(), 0);
}

/// Every sink of a job's terminal event completing it at the same moment
/// (each node's relays wake on the same signal): the last one to commit
/// must see the others' and clear the marker, or the event is stuck with
/// the repairer blind to it.
async fn sinks_completing_at_once_clear_the_marker(store: &Store) {
    let t = tenant(store, "t").await;
    let node = NodeId::new();
    let claim_for = Duration::seconds(30);
    let sinks = [AMQP, ARCHIVE, AUDIT];
    for _ in 0..10 {
        let t0 = now();
        store
            .jobs()
            .insert(&job(t.id, JobKind::Export, t0))
            .await
            .unwrap();
        let mut j = store
            .jobs()
            .claim(node, t0, claim_for, None)
            .await
            .unwrap()
            .unwrap();
        j.status = JobStatus::Completed;
        j.finished_at = Some(t0);
        assert!(
            store
                .jobs()
                .finish(&j, node, &Emit::to(sinks))
                .await
                .unwrap()
        );
        let claimed = join_all(sinks.map(|sink| async move {
            let rows = store
                .outbox()
                .claim(sink, Utc::now(), claim_for, 10)
                .await
                .unwrap();
            (sink, rows.iter().map(|r| r.id).collect::<Vec<_>>())
        }))
        .await;
        join_all(
            claimed
                .iter()
                .map(|(sink, ids)| store.outbox().complete(*sink, ids)),
        )
        .await
        .into_iter()
        .collect::<fastack_core::Result<Vec<()>>>()
        .unwrap();
        let after = store.jobs().get(t.id, j.id).await.unwrap().unwrap();
        assert!(!after.event_pending, "job {} stays pending", j.id);
    }
}

/// Outbox rows committed on one connection (node) are announced to every
/// listener; SQLite, one process, has no announcements.
async fn outbox_rows_are_announced(store: &Store) {
    let listened = store.outbox().notifications().await.unwrap();
    if store.backend() == fastack_core::store::Backend::Sqlite {
        assert!(listened.is_none());
        return;
    }
    let mut rx = listened.expect("PostgreSQL announces outbox rows");
    let t = tenant(store, "acme").await;
    // Processing without a sink writes no outbox row: nothing is announced.
    accept(store, &[row(t.id, &track("k-quiet", "u1", now()))]).await;
    process_all(store, t.id, false).await;
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(300), rx.recv())
            .await
            .is_err()
    );
    accept(store, &[row(t.id, &track("k-loud", "u1", now()))]).await;
    let out = process_all(store, t.id, true).await;
    assert_eq!(out.outboxed, 1);
    tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv())
        .await
        .expect("announced when the transaction committed")
        .expect("the listener runs");
}

/// A grouped sink (the mirror) is owed one row per processing round, its
/// events one after another, while a sink beside it is owed one row per
/// event; its batches are sized in events, and its depth counts events.
async fn grouped_rows_carry_a_rounds_events(store: &Store) {
    let t = tenant(store, "t").await;
    let t0 = now();
    let emit = Emit::to([AMQP, ARCHIVE]).grouping([ARCHIVE]);
    let mut rounds: Vec<Vec<String>> = Vec::new();
    for (round, n) in [(0, 5), (1, 3)] {
        let rows: Vec<IngestRow> = (0..n)
            .map(|i| row(t.id, &track(&format!("k{round}-{i}"), "u1", t0)))
            .collect();
        accept(store, &rows).await;
        let node = take_lease(store, t.id).await;
        let mut req = request(t.id, node, false);
        req.tracked = emit.clone();
        let out = store.processing().run(&req).await.expect("process");
        store.processing().release_lease(t.id, node).await.unwrap();
        // The grouped row wakes no relay: its sink flushes on a timer.
        assert_eq!(out.outboxed, n, "the per-event sink's rows");
        rounds.push(out.appended.iter().map(|(id, _)| id.to_string()).collect());
    }
    assert_eq!(store.outbox().depth(AMQP).await.unwrap(), 8);
    assert_eq!(store.outbox().depth(ARCHIVE).await.unwrap(), 8);
    let ids_of = |rows: &[OutboxRow]| -> Vec<Vec<String>> {
        rows.iter()
            .map(|r| {
                records_in(&r.body)
                    .map(|e| e.unwrap().id.into_owned())
                    .collect()
            })
            .collect()
    };
    let owed = store.outbox().owed_rows(ARCHIVE, t.id).await.unwrap();
    assert_eq!(ids_of(&owed), rounds);
    // Counted in events, up to what was asked (the row past it included).
    assert_eq!(store.outbox().owed(ARCHIVE, 2).await.unwrap().events, 5);
    assert_eq!(store.outbox().owed(ARCHIVE, 100).await.unwrap().events, 8);

    // A batch of up to 6 events takes the first round only; the next takes
    // the second even though it asks for fewer events than it holds.
    let claim_for = Duration::seconds(30);
    let first = store
        .outbox()
        .claim_batch(ARCHIVE, Utc::now(), claim_for, Some(6))
        .await
        .unwrap()
        .expect("a batch");
    assert_eq!(ids_of(&first.rows), rounds[..1]);
    let second = store
        .outbox()
        .claim_batch(ARCHIVE, Utc::now(), claim_for, Some(1))
        .await
        .unwrap()
        .expect("a batch");
    assert_eq!(ids_of(&second.rows), rounds[1..]);
    let done: Vec<i64> = first
        .rows
        .iter()
        .chain(&second.rows)
        .map(|r| r.id)
        .collect();
    store.outbox().complete(ARCHIVE, &done).await.unwrap();
    assert_eq!(store.outbox().depth(ARCHIVE).await.unwrap(), 0);
    // The per-event sink still owes its own rows, one event each.
    let single = store
        .outbox()
        .claim(AMQP, Utc::now(), claim_for, 100)
        .await
        .unwrap();
    assert_eq!(single.len(), 8);
    assert!(
        single
            .iter()
            .all(|r| serde_json::from_str::<Value>(&r.body).is_ok_and(|e| e["id"].is_string()))
    );
}
