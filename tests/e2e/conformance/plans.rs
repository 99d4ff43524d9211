//! Tracking plans and the annotations they leave on events.

use super::*;

conformance!(tracking_plans_and_annotations);

async fn tracking_plans_and_annotations(store: &Store) {
    let a = tenant(store, "acme").await;
    let b = tenant(store, "bolt").await;
    assert!(store.plans().version(a.id, None).await.unwrap().is_none());
    assert!(store.plans().latest_versions().await.unwrap().is_empty());

    // Versions count up per tenant; concurrent installs get distinct ones.
    let doc = json!({"events": {"E": {"type": "object"}}});
    let at = now();
    assert_eq!(
        store.plans().install(a.id, Some(&doc), at).await.unwrap(),
        1
    );
    let installs = join_all((0..4).map(|_| store.plans().install(a.id, Some(&doc), at))).await;
    let mut versions: Vec<u32> = installs.into_iter().map(|v| v.unwrap()).collect();
    versions.sort_unstable();
    assert_eq!(versions, [2, 3, 4, 5]);
    assert_eq!(
        store.plans().install(b.id, Some(&doc), at).await.unwrap(),
        1
    );
    assert_eq!(
        store.plans().install(a.id, None, at).await.unwrap(),
        6,
        "a removal is a version"
    );

    let latest = store.plans().version(a.id, None).await.unwrap().unwrap();
    assert_eq!((latest.version, latest.document), (6, None));
    let first = store.plans().version(a.id, Some(1)).await.unwrap().unwrap();
    assert_eq!(first.document, Some(doc.clone()));
    assert_eq!(first.installed_at, at);
    assert!(
        store
            .plans()
            .version(a.id, Some(99))
            .await
            .unwrap()
            .is_none()
    );
    let history = store.plans().history(a.id).await.unwrap();
    assert_eq!(
        history.iter().map(|p| p.version).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );
    let mut latest = store.plans().latest_versions().await.unwrap();
    latest.sort_by_key(|(t, _)| (*t == b.id, *t));
    assert_eq!(latest, [(a.id, 6), (b.id, 1)]);

    // Taken keys: which of a list the tenant used, with the event and its
    // fingerprint; another tenant's keys are not seen.
    let t0 = now();
    let mut ev = track("k-plan-1", "u1", t0);
    ev.plan = Some(fastack_entities::PlanCheck {
        plan_version: 4,
        schema_violations: vec![fastack_entities::SchemaViolation {
            field: "/properties/total".into(),
            code: "type".into(),
            message: "42.5 is not of type \"string\"".into(),
        }],
    });
    let r = row(a.id, &ev);
    accept(store, std::slice::from_ref(&r)).await;
    let taken = store
        .ingest()
        .taken_keys(a.id, &["k-plan-1".into(), "k-unused".into()])
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].key, "k-plan-1");
    assert_eq!(taken[0].event_id, r.event_id);
    assert_eq!(taken[0].fingerprint, r.fingerprint);
    assert!(
        store
            .ingest()
            .taken_keys(b.id, &["k-plan-1".into()])
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .ingest()
            .taken_keys(a.id, &[])
            .await
            .unwrap()
            .is_empty()
    );

    // What the plan said is stored with the event and read back.
    process_all(store, a.id, false).await;
    let stored = events(store, a.id, around(t0)).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].plan, ev.plan);
    let plain = track("k-plan-2", "u1", t0);
    accept(store, &[row(a.id, &plain)]).await;
    process_all(store, a.id, false).await;
    let stored = events(store, a.id, around(t0)).await;
    assert!(stored.iter().any(|e| e.plan.is_none()));
}
