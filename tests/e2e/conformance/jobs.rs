//! Jobs: claims and the terminal event written once.

use super::*;

conformance!(job_claims_and_terminal_event);

async fn job_claims_and_terminal_event(store: &Store) {
    let t = tenant(store, "t").await;
    let t0 = now();
    let first = job(t.id, JobKind::Export, t0 - Duration::seconds(2));
    let second = job(t.id, JobKind::Export, t0 - Duration::seconds(1));
    let retention = job(t.id, JobKind::Retention, t0);
    for j in [&first, &second, &retention] {
        store.jobs().insert(j).await.unwrap();
    }
    assert_eq!(
        store.jobs().get(t.id, first.id).await.unwrap(),
        Some(first.clone())
    );
    let other = tenant(store, "other").await;
    assert_eq!(store.jobs().get(other.id, first.id).await.unwrap(), None);
    assert_eq!(store.jobs().list(t.id, None, 10).await.unwrap().len(), 3);
    assert_eq!(
        store
            .jobs()
            .list(t.id, Some(JobStatus::Queued), 1)
            .await
            .unwrap()
            .len(),
        1
    );

    // Two nodes claim at once: the oldest export goes to exactly one, the
    // next to the other.
    let (n1, n2) = (NodeId::new(), NodeId::new());
    let claim_for = Duration::seconds(30);
    let claimed = join_all([
        store.jobs().claim(n1, t0, claim_for, Some(JobKind::Export)),
        store.jobs().claim(n2, t0, claim_for, Some(JobKind::Export)),
    ])
    .await;
    let claimed: Vec<Job> = claimed
        .into_iter()
        .map(|j| j.unwrap().expect("a job each"))
        .collect();
    let ids: HashSet<JobId> = claimed.iter().map(|j| j.id).collect();
    assert_eq!(ids, HashSet::from([first.id, second.id]));
    assert!(
        claimed
            .iter()
            .all(|j| j.status == JobStatus::Processing && j.attempts == 1)
    );
    assert!(
        store
            .jobs()
            .claim(n1, t0, claim_for, Some(JobKind::Export))
            .await
            .unwrap()
            .is_none()
    );
    let (mine, holder) = if claimed[0].id == first.id {
        (claimed[0].clone(), n1)
    } else {
        (claimed[1].clone(), n2)
    };
    let stranger = NodeId::new();
    assert!(
        store
            .jobs()
            .renew_claim(mine.id, holder, t0 + Duration::minutes(1))
            .await
            .unwrap()
    );
    assert!(
        !store
            .jobs()
            .renew_claim(mine.id, stranger, t0 + Duration::minutes(1))
            .await
            .unwrap()
    );

    // A claim that expired (its runner died) is taken over, attempts counted.
    let late = t0 + Duration::minutes(2);
    let taken = store
        .jobs()
        .claim(stranger, late, claim_for, Some(JobKind::Export))
        .await
        .unwrap()
        .expect("expired claims are runnable");
    assert_eq!(taken.attempts, 2);

    // The terminal state is written once, by the holder only, with its
    // event in the outbox.
    let mut done = taken.clone();
    done.status = JobStatus::Completed;
    done.result = Some(json!({"rows": 3}));
    done.execution_time_ms = Some(12);
    done.finished_at = Some(late);
    let emit = Emit::to([AMQP]);
    let holder_of_taken = stranger;
    let previous = if taken.id == first.id { n1 } else { n2 };
    assert!(!store.jobs().finish(&done, previous, &emit).await.unwrap());
    assert!(
        store
            .jobs()
            .finish(&done, holder_of_taken, &emit)
            .await
            .unwrap()
    );
    assert!(
        !store
            .jobs()
            .finish(&done, holder_of_taken, &emit)
            .await
            .unwrap()
    );
    let stored = store.jobs().get(t.id, done.id).await.unwrap().unwrap();
    assert_eq!(stored.status, JobStatus::Completed);
    assert!(stored.event_pending);
    assert_eq!(stored.document(), done.render());
    assert_eq!(
        store
            .jobs()
            .list(t.id, Some(JobStatus::Completed), 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(store.outbox().depth(AMQP).await.unwrap(), 1);
    let rows = store
        .outbox()
        .claim(AMQP, Utc::now(), claim_for, 10)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(r.topic, Topic::Job);
    assert_eq!(r.routing_key, "job.completed");
    assert_eq!(r.ce_id, format!("fastack.job.completed.{}", done.id));
    assert_eq!(r.job_id, Some(done.id));
    assert_eq!(r.body, done.render());
    // Not the fan-out's: it was not asked for.
    assert!(
        store
            .outbox()
            .claim(WEBHOOKS, Utc::now(), claim_for, 10)
            .await
            .unwrap()
            .is_empty()
    );
    // Published: the row leaves and the job's marker clears.
    store.outbox().complete(AMQP, &[r.id]).await.unwrap();
    assert_eq!(store.outbox().depth(AMQP).await.unwrap(), 0);
    assert!(
        !store
            .jobs()
            .get(t.id, done.id)
            .await
            .unwrap()
            .unwrap()
            .event_pending
    );
    // Nothing to repair.
    assert!(
        store
            .jobs()
            .repair_pending_events(Utc::now(), claim_for, &emit, 10)
            .await
            .unwrap()
            .is_empty()
    );

    // The retention job: kind filter, and its partition listed while active.
    let mut r_job = retention.clone();
    r_job.params = json!({"partition": "tracked_events_y2020m01_r13"});
    let r_job = Job {
        id: JobId::new(),
        ..r_job
    };
    store.jobs().insert(&r_job).await.unwrap();
    let active: HashSet<String> = store
        .jobs()
        .active_retention()
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert!(active.contains("tracked_events_y2020m01_r13"), "{active:?}");
    let claimed = store
        .jobs()
        .claim(n1, late, claim_for, Some(JobKind::Retention))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.kind, JobKind::Retention);
}
