//! Webhook deliveries: the fan-out, claims, attempts, replays.

use super::*;

conformance!(webhook_fanout_and_deliveries);

async fn webhook_fanout_and_deliveries(store: &Store) {
    let t = tenant(store, "t").await;
    let t0 = now();
    let endpoint = Endpoint {
        id: EndpointId::new(),
        tenant_id: t.id,
        url: "https://hooks.example.com/in".into(),
        events: vec!["core.event.tracked".into(), "job.completed".into()],
        enabled: true,
        disabled_reason: None,
        previous_secret_until: None,
        created_at: t0,
        updated_at: t0,
    };
    store
        .endpoints()
        .insert(&endpoint, b"sealed-secret-1")
        .await
        .unwrap();
    assert_eq!(
        store.endpoints().get(endpoint.id).await.unwrap(),
        Some(endpoint.clone())
    );
    assert_eq!(
        store.endpoints().list(Some(t.id)).await.unwrap(),
        vec![endpoint.clone()]
    );
    assert_eq!(store.endpoints().list(None).await.unwrap().len(), 1);
    assert!(
        store
            .endpoints()
            .subscribed(t.id, "core.event.tracked")
            .await
            .unwrap()
    );
    assert!(
        !store
            .endpoints()
            .subscribed(t.id, "job.failed")
            .await
            .unwrap()
    );

    // An endpoint of the same tenant that wants only job events.
    let jobs_only = Endpoint {
        id: EndpointId::new(),
        events: vec!["job.failed".into()],
        ..endpoint.clone()
    };
    store
        .endpoints()
        .insert(&jobs_only, b"sealed-secret-2")
        .await
        .unwrap();

    // Processing fans out in its own transaction, from the endpoints as
    // they are: the deliveries exist when it commits, and nothing is owed
    // to a relay (streaming off).
    let at = now();
    let rows: Vec<IngestRow> = (0..3)
        .map(|i| row(t.id, &track(&format!("k{i}"), "u", at)))
        .collect();
    accept(store, &rows).await;
    process_all(store, t.id, false).await;
    assert_eq!(store.outbox().depth(AMQP).await.unwrap(), 0);
    assert_eq!(store.outbox().depth(WEBHOOKS).await.unwrap(), 0);
    let claim_for = Duration::seconds(30);
    assert!(
        store
            .deliveries()
            .list(t.id, Some(jobs_only.id), None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    // The fan-out made again (the relay draining a row an earlier release
    // left owed to it) creates nothing new.
    let made: Vec<Delivery> = store
        .deliveries()
        .list(t.id, Some(endpoint.id), None, 10)
        .await
        .unwrap();
    let owed: Vec<OutboxRow> = made
        .iter()
        .map(|d| OutboxRow {
            id: 0,
            tenant_id: d.tenant_id,
            topic: Topic::Core,
            routing_key: d.event_type.clone(),
            ce_id: d.ce_id.clone(),
            subject: String::new(),
            body: "{}".into(),
            job_id: None,
            created_at: d.created_at,
        })
        .collect();
    store.deliveries().fan_out_rows(&owed, now()).await.unwrap();
    let listed = store
        .deliveries()
        .list(t.id, Some(endpoint.id), None, 10)
        .await
        .unwrap();
    assert_eq!(listed.len(), 3);
    assert!(
        listed
            .iter()
            .all(|d| d.status == DeliveryStatus::Pending && d.attempts.is_empty())
    );

    // A full endpoint's rows are left alone.
    assert!(
        store
            .deliveries()
            .claim_due(Utc::now(), claim_for, 10, &[endpoint.id])
            .await
            .unwrap()
            .is_empty()
    );
    // Due deliveries come with what an attempt needs, claimed once.
    let (da, db) = tokio::join!(
        store.deliveries().claim_due(Utc::now(), claim_for, 10, &[]),
        store.deliveries().claim_due(Utc::now(), claim_for, 10, &[])
    );
    let mut due = da.unwrap();
    due.extend(db.unwrap());
    assert_eq!(due.len(), 3);
    assert!(
        due.iter()
            .all(|d| d.secrets.current == b"sealed-secret-1" && d.attempts == 0)
    );
    assert_eq!(due[0].endpoint, endpoint);
    // One delivered, one retried later, one given back.
    let attempt = |n: u32, code: Option<u16>| Attempt {
        attempt: n,
        attempted_at: now(),
        status_code: code,
        error_kind: code.filter(|c| *c >= 300).map(|_| "http".to_owned()),
        latency_ms: 8,
    };
    let retry_at = now() + Duration::seconds(5);
    let record = |d: usize, code: u16, outcome| fastack_core::store::AttemptRecord {
        delivery: due[d].id,
        endpoint: endpoint.id,
        attempt: attempt(1, Some(code)),
        outcome,
    };
    store
        .deliveries()
        .record_attempts(&[
            record(0, 200, fastack_core::store::AttemptOutcome::Delivered),
            record(
                1,
                503,
                fastack_core::store::AttemptOutcome::Retry { at: retry_at },
            ),
        ])
        .await
        .unwrap();
    store.deliveries().release(&[due[2].id]).await.unwrap();
    let now_due = store
        .deliveries()
        .claim_due(Utc::now(), claim_for, 10, &[])
        .await
        .unwrap();
    assert_eq!(
        now_due.iter().map(|d| d.id).collect::<Vec<_>>(),
        vec![due[2].id]
    );
    let later = store
        .deliveries()
        .claim_due(retry_at + Duration::milliseconds(1), claim_for, 10, &[])
        .await
        .unwrap();
    assert_eq!(
        later.iter().map(|d| (d.id, d.attempts)).collect::<Vec<_>>(),
        vec![(due[1].id, 1)]
    );
    let listed = store.deliveries().list(t.id, None, None, 10).await.unwrap();
    let delivered = listed.iter().find(|d| d.id == due[0].id).unwrap();
    assert_eq!(delivered.status, DeliveryStatus::Delivered);
    assert_eq!(delivered.attempts.len(), 1);
    assert_eq!(delivered.attempts[0].status_code, Some(200));
    let retried = listed.iter().find(|d| d.id == due[1].id).unwrap();
    assert_eq!(retried.next_attempt_at, Some(retry_at));

    // Rotation keeps the old secret for a while.
    let until = now() + Duration::hours(24);
    assert!(
        store
            .endpoints()
            .rotate_secret(endpoint.id, b"sealed-secret-2", until, now())
            .await
            .unwrap()
    );
    assert!(
        !store
            .endpoints()
            .rotate_secret(EndpointId::new(), b"x", until, now())
            .await
            .unwrap()
    );
    let rotated = store.endpoints().get(endpoint.id).await.unwrap().unwrap();
    assert_eq!(rotated.previous_secret_until, Some(until));
    store
        .deliveries()
        .release(&[due[2].id, due[1].id])
        .await
        .unwrap();
    let due = store
        .deliveries()
        .claim_due(Utc::now() + Duration::minutes(1), claim_for, 10, &[])
        .await
        .unwrap();
    assert!(!due.is_empty());
    assert!(due.iter().all(|d| d.secrets.current == b"sealed-secret-2"
        && d.secrets.previous == Some((b"sealed-secret-1".to_vec(), until))));

    // Disabling fails what is pending and stops the fan-out.
    store
        .deliveries()
        .release(&due.iter().map(|d| d.id).collect::<Vec<_>>())
        .await
        .unwrap();
    assert!(
        store
            .deliveries()
            .set_endpoint_enabled(endpoint.id, false, Some("operator"), now())
            .await
            .unwrap()
    );
    let off = store.endpoints().get(endpoint.id).await.unwrap().unwrap();
    assert!(!off.enabled);
    assert_eq!(off.disabled_reason.as_deref(), Some("operator"));
    assert!(
        !store
            .endpoints()
            .subscribed(t.id, "core.event.tracked")
            .await
            .unwrap()
    );
    let listed = store.deliveries().list(t.id, None, None, 10).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .filter(|d| d.status == DeliveryStatus::Failed)
            .count(),
        2
    );
    assert!(
        store
            .deliveries()
            .claim_due(Utc::now() + Duration::hours(1), claim_for, 10, &[])
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .deliveries()
            .set_endpoint_enabled(endpoint.id, true, None, now())
            .await
            .unwrap()
    );
    assert!(
        store
            .endpoints()
            .get(endpoint.id)
            .await
            .unwrap()
            .unwrap()
            .enabled
    );

    // A job's terminal event taken only by the fan-out: its delivery
    // commits with the job's end, so nothing is left pending to repair.
    let j = ended_job(store, t.id, JobStatus::Completed, &Emit::to([WEBHOOKS])).await;
    assert!(!event_pending(store, &j).await);
    assert_eq!(store.outbox().depth(WEBHOOKS).await.unwrap(), 0);
    let of_job: Vec<Delivery> = store
        .deliveries()
        .list(t.id, Some(endpoint.id), None, 10)
        .await
        .unwrap()
        .into_iter()
        .filter(|d| d.event_type == "job.completed")
        .collect();
    assert_eq!(of_job.len(), 1);
    assert_eq!(of_job[0].ce_id, format!("fastack.job.completed.{}", j.id));
    assert!(
        store
            .jobs()
            .repair_pending_events(Utc::now(), claim_for, &Emit::to([WEBHOOKS]), 10)
            .await
            .unwrap()
            .is_empty()
    );
}
