//! Storage conformance: every operation of [`Storage`], called directly (no
//! HTTP, no actors), on embedded SQLite and on PostgreSQL. A backend is
//! complete when this module passes on it.
//!
//! What is checked is what the rest of fastack relies on: records read back
//! as written, the two idempotency fences, leases and claims that exactly
//! one of two concurrent callers wins, the terminal event of a job written
//! once, outbox rows owed to each consumer, webhook deliveries created once,
//! partition bookkeeping and quarantine.

use std::collections::HashSet;

use chrono::{DateTime, Duration, DurationRound, TimeZone, Utc};
use fastack_core::{
    Error,
    store::{
        DropOutcome, Emit, EventQuery, Fence, IngestRow, Month, OutboxRow, PartitionKey,
        ProcessOutcome, ProcessRequest, SinkName, Store, TimeRange, Topic, records_in,
    },
    validate::fingerprint,
};
use fastack_entities::{
    ApiKey, ApiKeyId, Attempt, ContactId, Delivery, DeliveryStatus, Endpoint, EndpointId, EventId,
    EventKind, IdentityKind, Job, JobId, JobKind, JobStatus, NewEvent, NodeId, Plan, Tenant,
    TenantId,
};
use futures::future::join_all;
use serde_json::{Map, Value, json};

use crate::helpers::{Backend, TestDb};

/// A store on a fresh database of the backend, migrated twice (migrations
/// are idempotent).
async fn fresh(backend: Backend) -> Option<(TestDb, Store)> {
    let db = TestDb::new(backend).await?;
    let store = db.store().await;
    store
        .migrate()
        .await
        .expect("migrating again changes nothing");
    assert_eq!(
        store.backend(),
        match backend {
            Backend::Sqlite => fastack_core::store::Backend::Sqlite,
            Backend::Postgres => fastack_core::store::Backend::Postgres,
        }
    );
    store.ping().await.expect("ping");
    Some((db, store))
}

macro_rules! conformance {
    ($($scenario:ident),* $(,)?) => {
        $(
            mod $scenario {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    if let Some((db, store)) = super::fresh($crate::helpers::Backend::Sqlite).await {
                        super::$scenario(&store).await;
                        db.drop_db().await;
                    }
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    if let Some((db, store)) = super::fresh($crate::helpers::Backend::Postgres).await {
                        super::$scenario(&store).await;
                        db.drop_db().await;
                    }
                }
            }
        )*
    };
}

conformance!(
    tenants_and_keys,
    ingest_fences,
    late_groups_commit_nothing,
    inbox_keeps_send_order,
    processed_rows_left_in_the_inbox_are_skipped,
    concurrent_rounds_store_each_event_once,
    chained_rounds_take_every_row_once,
    chained_rounds_see_quarantine_and_put_back,
    relaxed_commits_do_not_leak,
    leases,
    processing_and_identity,
    lease_lost_rolls_back,
    job_claims_and_terminal_event,
    outbox_claims_are_disjoint,
    sinks_owe_rows_independently,
    sinks_completing_at_once_clear_the_marker,
    webhook_fanout_and_deliveries,
    partitions_and_retention,
    quarantine_round_trip,
    tracking_plans_and_annotations,
    outbox_rows_are_announced,
    grouped_rows_carry_a_rounds_events,
);

/// Sinks as the node names them; storage knows only the fan-out (done in
/// the transaction that writes an event).
const AMQP: SinkName = SinkName("amqp");
const WEBHOOKS: SinkName = fastack_core::store::FAN_OUT;
/// A relayed sink besides AMQP.
const ARCHIVE: SinkName = SinkName("archive");
/// A sink no node has: a new sink needs no change below storage's API.
const AUDIT: SinkName = SinkName("audit");

/// Now, at the storage precision (microseconds).
fn now() -> DateTime<Utc> {
    Utc::now()
        .duration_trunc(Duration::microseconds(1))
        .expect("truncation")
}

async fn tenant(store: &Store, name: &str) -> Tenant {
    let t = Tenant {
        id: TenantId::new(),
        name: name.to_owned(),
        plan: Plan::Pro,
        retention_months: None,
        created_at: now(),
    };
    store.insert_tenant(&t).await.expect("insert tenant");
    t
}

fn track(key: &str, user: &str, at: DateTime<Utc>) -> NewEvent {
    let mut properties = Map::new();
    properties.insert("total".into(), json!(42.5));
    properties.insert("nested".into(), json!({"a": [1, "two", null]}));
    NewEvent {
        kind: EventKind::Track,
        event: Some("Order Completed".into()),
        user_id: Some(user.to_owned()),
        anonymous_id: None,
        properties,
        // The caller's offset is kept.
        occurred_at: at.with_timezone(&chrono::FixedOffset::east_opt(2 * 3600).unwrap()),
        idempotency_key: key.to_owned(),
        plan: None,
    }
}

fn identify(key: &str, user: &str, anon: &str, at: DateTime<Utc>) -> NewEvent {
    let mut traits = Map::new();
    traits.insert("plan".into(), json!("gold"));
    NewEvent {
        kind: EventKind::Identify,
        event: None,
        user_id: Some(user.to_owned()),
        anonymous_id: Some(anon.to_owned()),
        properties: traits,
        occurred_at: at.fixed_offset(),
        idempotency_key: key.to_owned(),
        plan: None,
    }
}

fn row(tenant: TenantId, ev: &NewEvent) -> IngestRow {
    IngestRow::new(tenant, ev.clone(), fingerprint(ev), now())
}

/// Accepts every row (the keep function of a group commit without
/// conflicts).
fn keep_all(f: &[Fence]) -> Vec<bool> {
    vec![true; f.len()]
}

/// A deadline no group commit of a test comes near.
fn later() -> std::time::Instant {
    std::time::Instant::now() + std::time::Duration::from_secs(60)
}

async fn accept(store: &Store, rows: &[IngestRow]) -> Vec<Fence> {
    store
        .commit_ingest(rows, &keep_all, later())
        .await
        .expect("commit ingest")
}

fn request(tenant: TenantId, node: NodeId, publish: bool) -> ProcessRequest {
    ProcessRequest {
        tenant_id: tenant,
        node_id: node,
        retention_class: 13,
        limit: 1000,
        now: Utc::now(),
        lease_ttl: Duration::seconds(30),
        tracked: if publish {
            Emit::to([AMQP])
        } else {
            Emit::default()
        },
        tracked_if_subscribed: Emit::to([WEBHOOKS]),
        after_seq: None,
        faults: Default::default(),
    }
}

/// Takes the tenant's processing lease for a new node.
async fn take_lease(store: &Store, tenant: TenantId) -> NodeId {
    let node = NodeId::new();
    assert!(
        store
            .try_lease(tenant, node, Utc::now(), Duration::seconds(30))
            .await
            .unwrap()
    );
    node
}

/// Takes the lease and processes the tenant's whole inbox.
async fn process_all(store: &Store, tenant: TenantId, publish: bool) -> ProcessOutcome {
    let node = take_lease(store, tenant).await;
    let out = store
        .process_batch(&request(tenant, node, publish))
        .await
        .expect("process");
    store
        .consume_inbox(tenant, &out.to_consume)
        .await
        .expect("consume");
    store.release_lease(tenant, node).await.unwrap();
    out
}

fn around(t: DateTime<Utc>) -> TimeRange {
    TimeRange::new(t - Duration::days(1), t + Duration::days(1)).unwrap()
}

async fn events(
    store: &Store,
    tenant: TenantId,
    range: TimeRange,
) -> Vec<fastack_entities::StoredEvent> {
    store
        .query_events(&EventQuery {
            tenant_id: tenant,
            range,
            contact_ids: None,
            event: None,
            after: None,
            limit: 1000,
        })
        .await
        .expect("query events")
}

// --- scenarios ---------------------------------------------------------------

async fn tenants_and_keys(store: &Store) {
    let a = tenant(store, "acme").await;
    let b = tenant(store, "globex").await;
    assert_eq!(store.get_tenant(a.id).await.unwrap(), Some(a.clone()));
    assert_eq!(
        store.find_tenant_by_name("globex").await.unwrap(),
        Some(b.clone())
    );
    assert_eq!(store.find_tenant_by_name("nobody").await.unwrap(), None);
    assert_eq!(
        store.list_tenants().await.unwrap(),
        vec![a.clone(), b.clone()]
    );
    // Names are unique: a typed conflict, not a database error.
    let dup = Tenant {
        id: TenantId::new(),
        ..a.clone()
    };
    assert!(matches!(
        store.insert_tenant(&dup).await,
        Err(Error::Conflict(_))
    ));

    assert!(
        store
            .update_tenant_plan(a.id, Plan::Enterprise, Some(36))
            .await
            .unwrap()
    );
    assert!(
        !store
            .update_tenant_plan(TenantId::new(), Plan::Free, None)
            .await
            .unwrap()
    );
    let a = store.get_tenant(a.id).await.unwrap().unwrap();
    assert_eq!((a.plan, a.retention_months), (Plan::Enterprise, Some(36)));

    let key = ApiKey {
        last_used_at: None,
        id: ApiKeyId::new(),
        tenant_id: a.id,
        prefix: "fk_live_abcd".into(),
        rate_limit_rps: Some(250),
        created_at: now(),
        revoked_at: None,
    };
    let hash = [7u8; 32];
    store.insert_api_key(&key, &hash).await.unwrap();
    let found = store
        .lookup_api_key(&hash)
        .await
        .unwrap()
        .expect("key found by hash");
    assert_eq!(found.key, key);
    assert_eq!(found.tenant, a);
    assert!(store.lookup_api_key(&[8u8; 32]).await.unwrap().is_none());
    assert_eq!(store.list_api_keys(a.id).await.unwrap(), vec![key.clone()]);
    assert!(store.list_api_keys(b.id).await.unwrap().is_empty());

    let at = now();
    assert!(store.revoke_api_key(key.id, at).await.unwrap());
    assert!(!store.revoke_api_key(ApiKeyId::new(), at).await.unwrap());
    let revoked = store.lookup_api_key(&hash).await.unwrap().unwrap();
    assert_eq!(revoked.key.revoked_at, Some(at));
}

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
        .commit_ingest(
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
        .commit_ingest(
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
            .taken_keys(t.id, std::slice::from_ref(&fresh.idempotency_key))
            .await
            .unwrap(),
        vec![]
    );

    // Inbox: a, b, kept, retry for t; c for other.
    let (depth, oldest) = store.inbox_stats().await.unwrap();
    assert_eq!(depth, 5);
    assert!(oldest.is_some());
    let backlog: HashSet<TenantId> = store
        .backlog_tenants(10)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(backlog, HashSet::from([t.id, other.id]));
    let out = process_all(store, t.id, false).await;
    assert_eq!(out.consumed, 4);
    assert_eq!(out.appended.len(), 4);
    assert_eq!(store.backlog_tenants(10).await.unwrap(), vec![other.id]);
    assert_eq!(store.inbox_stats().await.unwrap().0, 1);
    assert!(
        !store.inbox_empty().await.unwrap(),
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
        .commit_ingest(std::slice::from_ref(&fresh), &keep_all, past)
        .await;
    assert!(matches!(late, Err(Error::Deadline(_))), "{late:?}");
    assert_eq!(
        store
            .taken_keys(t.id, std::slice::from_ref(&fresh.idempotency_key))
            .await
            .unwrap(),
        vec![]
    );
    assert_eq!(store.inbox_stats().await.unwrap().0, 0);

    let first = row(t.id, &track("late-b", "u", at));
    assert_eq!(
        accept(store, std::slice::from_ref(&first)).await,
        vec![Fence::Fresh]
    );
    let mixed = [
        row(t.id, &track("late-b", "u", at)),
        row(t.id, &track("late-c", "u", at)),
    ];
    let late = store.commit_ingest(&mixed, &keep_all, past).await;
    assert!(matches!(late, Err(Error::Deadline(_))), "{late:?}");
    assert_eq!(
        store
            .taken_keys(t.id, &["late-c".to_owned()])
            .await
            .unwrap(),
        vec![]
    );
    assert_eq!(store.inbox_stats().await.unwrap().0, 1);
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
    while let Some((seq, id)) = store.next_inbox_row(t.id, after).await.unwrap() {
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

async fn leases(store: &Store) {
    let t = tenant(store, "t").await;
    let (n1, n2) = (NodeId::new(), NodeId::new());
    let ttl = Duration::seconds(10);
    let t0 = now();
    // Two nodes at once: exactly one holds it.
    let won = join_all([
        store.try_lease(t.id, n1, t0, ttl),
        store.try_lease(t.id, n2, t0, ttl),
    ])
    .await;
    let won: Vec<bool> = won.into_iter().map(Result::unwrap).collect();
    assert_eq!(won.iter().filter(|w| **w).count(), 1, "{won:?}");
    let (holder, other) = if won[0] { (n1, n2) } else { (n2, n1) };
    // The holder renews; the other cannot take it before it expires ...
    assert!(
        store
            .try_lease(t.id, holder, t0 + Duration::seconds(5), ttl)
            .await
            .unwrap()
    );
    assert!(
        !store
            .try_lease(t.id, other, t0 + Duration::seconds(14), ttl)
            .await
            .unwrap()
    );
    // ... and takes it once it has.
    assert!(
        store
            .try_lease(t.id, other, t0 + Duration::seconds(16), ttl)
            .await
            .unwrap()
    );
    assert!(
        !store
            .try_lease(t.id, holder, t0 + Duration::seconds(16), ttl)
            .await
            .unwrap()
    );
    // Releasing someone else's lease does nothing; releasing one's own
    // frees it at once.
    store.release_lease(t.id, holder).await.unwrap();
    assert!(
        !store
            .try_lease(t.id, holder, t0 + Duration::seconds(17), ttl)
            .await
            .unwrap()
    );
    store.release_lease(t.id, other).await.unwrap();
    assert!(
        store
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
        store.count_events(t.id, around(at)).await.unwrap(),
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
        .find_contact(t.id, IdentityKind::User, "user-1")
        .await
        .unwrap()
        .expect("contact by user id");
    let by_anon = store
        .find_contact(t.id, IdentityKind::Anonymous, "anon-1")
        .await
        .unwrap()
        .expect("contact by anonymous id");
    assert_eq!(by_user.id, by_anon.id);
    assert_eq!(by_user.user_ids, vec!["user-1".to_owned()]);
    assert_eq!(by_user.anonymous_ids, vec!["anon-1".to_owned()]);
    assert_eq!(by_user.traits.get("plan"), Some(&json!("gold")));
    assert_eq!(
        store
            .get_contact(t.id, by_user.id)
            .await
            .unwrap()
            .map(|c| c.id),
        Some(by_user.id)
    );
    assert!(
        store
            .get_contact(other.id, by_user.id)
            .await
            .unwrap()
            .is_none()
    );
    let family: HashSet<ContactId> = store
        .contact_family(t.id, by_user.id)
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
        .query_events(&EventQuery {
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
        .query_events(&EventQuery {
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
        .query_events(&EventQuery {
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

/// A crash between a processing commit and the delete of its inbox rows
/// (where the inbox is deleted afterwards): the rows are read again and
/// skipped by the second fence, the event is stored once.
async fn processed_rows_left_in_the_inbox_are_skipped(store: &Store) {
    let t = tenant(store, "t").await;
    let at = now();
    accept(store, &[row(t.id, &track("k", "u", at))]).await;
    let node = take_lease(store, t.id).await;
    let first = store
        .process_batch(&request(t.id, node, false))
        .await
        .unwrap();
    assert_eq!(first.appended.len(), 1);
    // The delete is never made: what a restarted processor reads.
    let again = store
        .process_batch(&request(t.id, node, false))
        .await
        .unwrap();
    assert!(again.appended.is_empty(), "{again:?}");
    assert_eq!(again.consumed, first.to_consume.len());
    assert_eq!(again.already_processed, first.to_consume.len());
    store.consume_inbox(t.id, &again.to_consume).await.unwrap();
    assert_eq!(store.inbox_stats().await.unwrap().0, 0);
    assert!(store.inbox_empty().await.unwrap());
    assert_eq!(store.count_events(t.id, around(at)).await.unwrap(), 1);
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
            let out = store.process_batch(&req).await.expect("process");
            store.consume_inbox(t.id, &out.to_consume).await.unwrap();
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
    assert_eq!(store.count_events(t.id, around(at)).await.unwrap(), 300);
    assert!(store.inbox_empty().await.unwrap());
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
            let out = store.process_batch(&req).await.expect("process");
            store.consume_inbox(t.id, &out.to_consume).await.unwrap();
            if out.consumed == 0 {
                break;
            }
            appended.extend(out.appended.iter().map(|(id, _)| *id));
            after = out.last_seq.or(after);
        }
        assert_eq!(appended, sent, "drain {drain}");
    }
    assert!(store.inbox_empty().await.unwrap());
}

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
    let first = store.process_batch(&round(None)).await.unwrap();
    assert_eq!(first.appended.len(), 1);
    assert_eq!(first.appended[0].0, rows[0].event_id);
    store.consume_inbox(t.id, &first.to_consume).await.unwrap();
    // `b` fails for good and leaves the inbox.
    let (seq_b, id_b) = store
        .next_inbox_row(t.id, first.last_seq)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(id_b, rows[1].event_id);
    store
        .record_process_failure(t.id, seq_b, "boom")
        .await
        .unwrap();
    assert!(store.quarantine(t.id, seq_b, at).await.unwrap().is_some());
    let second = store.process_batch(&round(first.last_seq)).await.unwrap();
    assert_eq!(
        second
            .appended
            .iter()
            .map(|(id, _)| *id)
            .collect::<Vec<_>>(),
        vec![rows[2].event_id],
        "the quarantined row is not taken"
    );
    store.consume_inbox(t.id, &second.to_consume).await.unwrap();
    // Put back, it comes after `c` and the next chained round takes it.
    assert!(store.retry_quarantined(t.id, id_b).await.unwrap());
    let third = store.process_batch(&round(second.last_seq)).await.unwrap();
    assert_eq!(
        third.appended.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        vec![id_b],
        "the event put back is taken"
    );
    store.consume_inbox(t.id, &third.to_consume).await.unwrap();
    assert!(store.inbox_empty().await.unwrap());
    assert_eq!(store.count_events(t.id, around(at)).await.unwrap(), 3);
}

/// A relaxed commit (an outbox claim: a crash only repeats it) does not
/// leave the writer relaxed: the next write on it — a processing commit, a
/// record — waits for the disk again.
async fn relaxed_commits_do_not_leak(store: &Store) {
    use sea_orm::{ConnectionTrait, DbBackend, Statement};
    store
        .claim_outbox(AMQP, Utc::now(), Duration::seconds(30), 10)
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
            .try_lease(t.id, old, t0 - Duration::seconds(60), Duration::seconds(1))
            .await
            .unwrap()
    );
    assert!(
        store
            .try_lease(t.id, new, t0, Duration::seconds(30))
            .await
            .unwrap()
    );
    assert!(matches!(
        store.process_batch(&request(t.id, old, false)).await,
        Err(Error::LeaseLost)
    ));
    assert_eq!(store.inbox_stats().await.unwrap().0, 1);
    let out = store
        .process_batch(&request(t.id, new, false))
        .await
        .unwrap();
    assert_eq!(out.appended.len(), 1);
    store.consume_inbox(t.id, &out.to_consume).await.unwrap();
    assert_eq!(store.count_events(t.id, around(at)).await.unwrap(), 1);
    // Without any lease there is no processing either.
    store.release_lease(t.id, new).await.unwrap();
    accept(store, &[row(t.id, &track("k2", "u", at))]).await;
    assert!(matches!(
        store.process_batch(&request(t.id, new, false)).await,
        Err(Error::LeaseLost)
    ));
}

fn job(tenant: TenantId, kind: JobKind, created_at: DateTime<Utc>) -> Job {
    let mut metadata = Map::new();
    metadata.insert("requested_by".into(), json!("conformance"));
    Job {
        id: JobId::new(),
        tenant_id: tenant,
        kind,
        status: JobStatus::Queued,
        params: json!({"from": "2026-01-01T00:00:00Z", "to": "2026-02-01T00:00:00Z"}),
        metadata,
        result: None,
        execution_time_ms: None,
        created_at,
        finished_at: None,
        event_body: None,
        event_pending: false,
        attempts: 0,
    }
}

async fn job_claims_and_terminal_event(store: &Store) {
    let t = tenant(store, "t").await;
    let t0 = now();
    let first = job(t.id, JobKind::Export, t0 - Duration::seconds(2));
    let second = job(t.id, JobKind::Export, t0 - Duration::seconds(1));
    let retention = job(t.id, JobKind::Retention, t0);
    for j in [&first, &second, &retention] {
        store.insert_job(j).await.unwrap();
    }
    assert_eq!(
        store.get_job(t.id, first.id).await.unwrap(),
        Some(first.clone())
    );
    let other = tenant(store, "other").await;
    assert_eq!(store.get_job(other.id, first.id).await.unwrap(), None);
    assert_eq!(store.list_jobs(t.id, None, 10).await.unwrap().len(), 3);
    assert_eq!(
        store
            .list_jobs(t.id, Some(JobStatus::Queued), 1)
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
        store.claim_job(n1, t0, claim_for, Some(JobKind::Export)),
        store.claim_job(n2, t0, claim_for, Some(JobKind::Export)),
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
            .claim_job(n1, t0, claim_for, Some(JobKind::Export))
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
            .renew_job_claim(mine.id, holder, t0 + Duration::minutes(1))
            .await
            .unwrap()
    );
    assert!(
        !store
            .renew_job_claim(mine.id, stranger, t0 + Duration::minutes(1))
            .await
            .unwrap()
    );

    // A claim that expired (its runner died) is taken over, attempts counted.
    let late = t0 + Duration::minutes(2);
    let taken = store
        .claim_job(stranger, late, claim_for, Some(JobKind::Export))
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
    assert!(!store.finish_job(&done, previous, &emit).await.unwrap());
    assert!(
        store
            .finish_job(&done, holder_of_taken, &emit)
            .await
            .unwrap()
    );
    assert!(
        !store
            .finish_job(&done, holder_of_taken, &emit)
            .await
            .unwrap()
    );
    let stored = store.get_job(t.id, done.id).await.unwrap().unwrap();
    assert_eq!(stored.status, JobStatus::Completed);
    assert!(stored.event_pending);
    assert_eq!(stored.document(), done.render());
    assert_eq!(
        store
            .list_jobs(t.id, Some(JobStatus::Completed), 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(store.outbox_depth(AMQP).await.unwrap(), 1);
    let rows = store
        .claim_outbox(AMQP, Utc::now(), claim_for, 10)
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
            .claim_outbox(WEBHOOKS, Utc::now(), claim_for, 10)
            .await
            .unwrap()
            .is_empty()
    );
    // Published: the row leaves and the job's marker clears.
    store.complete_outbox(AMQP, &[r.id]).await.unwrap();
    assert_eq!(store.outbox_depth(AMQP).await.unwrap(), 0);
    assert!(
        !store
            .get_job(t.id, done.id)
            .await
            .unwrap()
            .unwrap()
            .event_pending
    );
    // Nothing to repair.
    assert!(
        store
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
    store.insert_job(&r_job).await.unwrap();
    let active: HashSet<String> = store
        .active_retention_jobs()
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert!(active.contains("tracked_events_y2020m01_r13"), "{active:?}");
    let claimed = store
        .claim_job(n1, late, claim_for, Some(JobKind::Retention))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.kind, JobKind::Retention);
}

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
    assert_eq!(store.outbox_depth(AMQP).await.unwrap(), 60);

    // Two relays claim at once, in small batches, until nothing is left.
    let claim = |store: Store| async move {
        let mut mine = Vec::new();
        loop {
            let rows = store
                .claim_outbox(AMQP, Utc::now(), Duration::seconds(30), 7)
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
    store.release_outbox(AMQP, &a_ids).await.unwrap();
    let again = claim(store.clone()).await;
    assert_eq!(again.iter().map(|r| r.id).collect::<HashSet<_>>(), ids_a);
    // An expired claim is claimable again too.
    let expired = store
        .claim_outbox(
            AMQP,
            Utc::now() + Duration::seconds(31),
            Duration::seconds(30),
            100,
        )
        .await
        .unwrap();
    assert_eq!(expired.len(), 60);
    let all: Vec<i64> = expired.iter().map(|r| r.id).collect();
    store.complete_outbox(AMQP, &all).await.unwrap();
    assert_eq!(store.outbox_depth(AMQP).await.unwrap(), 0);
    assert!(
        store
            .claim_outbox(
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
        .insert_job(&job(t.id, JobKind::Export, t0))
        .await
        .unwrap();
    let node = NodeId::new();
    let claim_for = Duration::seconds(30);
    let mut j = store
        .claim_job(node, t0, claim_for, None)
        .await
        .unwrap()
        .unwrap();
    j.status = JobStatus::Failed;
    j.finished_at = Some(t0);
    let emit = Emit::to([AMQP, ARCHIVE, AUDIT]);
    assert!(store.finish_job(&j, node, &emit).await.unwrap());
    for sink in [AMQP, ARCHIVE, AUDIT] {
        assert_eq!(store.outbox_depth(sink).await.unwrap(), 1, "{sink}");
    }
    // Every sink claims the same row; a claim by one blocks only that one.
    let claimed: Vec<Vec<i64>> = join_all([AMQP, ARCHIVE, AUDIT].map(|sink| async move {
        store
            .claim_outbox(sink, Utc::now(), claim_for, 10)
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
            .claim_outbox(AMQP, Utc::now(), claim_for, 10)
            .await
            .unwrap()
            .is_empty()
    );
    store.release_outbox(AMQP, &[id]).await.unwrap();
    assert_eq!(
        store
            .claim_outbox(AMQP, Utc::now(), claim_for, 10)
            .await
            .unwrap()
            .len(),
        1
    );

    store.complete_outbox(AMQP, &[id]).await.unwrap();
    store.complete_outbox(ARCHIVE, &[id]).await.unwrap();
    assert_eq!(store.outbox_depth(AMQP).await.unwrap(), 0);
    assert_eq!(store.outbox_depth(AUDIT).await.unwrap(), 1);
    assert!(
        store
            .get_job(t.id, j.id)
            .await
            .unwrap()
            .unwrap()
            .event_pending
    );
    // Completing twice changes nothing.
    store.complete_outbox(AMQP, &[id]).await.unwrap();
    assert_eq!(store.outbox_depth(AUDIT).await.unwrap(), 1);
    let late = store
        .claim_outbox(AUDIT, Utc::now() + Duration::minutes(1), claim_for, 10)
        .await
        .unwrap();
    assert_eq!(late.len(), 1);
    assert_eq!(late[0].routing_key, "job.failed");
    store.complete_outbox(AUDIT, &[id]).await.unwrap();
    assert!(
        !store
            .get_job(t.id, j.id)
            .await
            .unwrap()
            .unwrap()
            .event_pending
    );
    for sink in [AMQP, ARCHIVE, AUDIT] {
        assert_eq!(store.outbox_depth(sink).await.unwrap(), 0, "{sink}");
    }
    // Nothing written when no sink takes the event.
    let quiet = ended_job(store, t.id, JobStatus::Failed, &Emit::default()).await;
    assert!(!event_pending(store, &quiet).await);
    assert_eq!(store.outbox_depth(AUDIT).await.unwrap(), 0);
}

/// A job of `tenant` claimed by a node and ended with `status`, its event
/// written for the sinks of `emit` (no other job of the store pending).
async fn ended_job(store: &Store, tenant: TenantId, status: JobStatus, emit: &Emit) -> Job {
    let t0 = now();
    store
        .insert_job(&job(tenant, JobKind::Export, t0))
        .await
        .unwrap();
    let node = NodeId::new();
    let mut j = store
        .claim_job(node, t0, Duration::seconds(30), None)
        .await
        .unwrap()
        .expect("the job just queued");
    j.status = status;
    j.finished_at = Some(t0);
    assert!(store.finish_job(&j, node, emit).await.unwrap());
    j
}

/// Whether the job's terminal event is still marked pending.
async fn event_pending(store: &Store, j: &Job) -> bool {
    store
        .get_job(j.tenant_id, j.id)
        .await
        .unwrap()
        .expect("the job")
        .event_pending
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
            .insert_job(&job(t.id, JobKind::Export, t0))
            .await
            .unwrap();
        let mut j = store
            .claim_job(node, t0, claim_for, None)
            .await
            .unwrap()
            .unwrap();
        j.status = JobStatus::Completed;
        j.finished_at = Some(t0);
        assert!(store.finish_job(&j, node, &Emit::to(sinks)).await.unwrap());
        let claimed = join_all(sinks.map(|sink| async move {
            let rows = store
                .claim_outbox(sink, Utc::now(), claim_for, 10)
                .await
                .unwrap();
            (sink, rows.iter().map(|r| r.id).collect::<Vec<_>>())
        }))
        .await;
        join_all(
            claimed
                .iter()
                .map(|(sink, ids)| store.complete_outbox(*sink, ids)),
        )
        .await
        .into_iter()
        .collect::<fastack_core::Result<Vec<()>>>()
        .unwrap();
        let after = store.get_job(t.id, j.id).await.unwrap().unwrap();
        assert!(!after.event_pending, "job {} stays pending", j.id);
    }
}

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
        .insert_endpoint(&endpoint, b"sealed-secret-1")
        .await
        .unwrap();
    assert_eq!(
        store.get_endpoint(endpoint.id).await.unwrap(),
        Some(endpoint.clone())
    );
    assert_eq!(
        store.list_endpoints(Some(t.id)).await.unwrap(),
        vec![endpoint.clone()]
    );
    assert_eq!(store.list_endpoints(None).await.unwrap().len(), 1);
    assert!(
        store
            .tenant_subscribes(t.id, "core.event.tracked")
            .await
            .unwrap()
    );
    assert!(!store.tenant_subscribes(t.id, "job.failed").await.unwrap());

    // An endpoint of the same tenant that wants only job events.
    let jobs_only = Endpoint {
        id: EndpointId::new(),
        events: vec!["job.failed".into()],
        ..endpoint.clone()
    };
    store
        .insert_endpoint(&jobs_only, b"sealed-secret-2")
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
    assert_eq!(store.outbox_depth(AMQP).await.unwrap(), 0);
    assert_eq!(store.outbox_depth(WEBHOOKS).await.unwrap(), 0);
    let claim_for = Duration::seconds(30);
    assert!(
        store
            .list_deliveries(t.id, Some(jobs_only.id), None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    // The fan-out made again (the relay draining a row an earlier release
    // left owed to it) creates nothing new.
    let made: Vec<Delivery> = store
        .list_deliveries(t.id, Some(endpoint.id), None, 10)
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
        .list_deliveries(t.id, Some(endpoint.id), None, 10)
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
            .claim_deliveries(Utc::now(), claim_for, 10, &[endpoint.id])
            .await
            .unwrap()
            .is_empty()
    );
    // Due deliveries come with what an attempt needs, claimed once.
    let (da, db) = tokio::join!(
        store.claim_deliveries(Utc::now(), claim_for, 10, &[]),
        store.claim_deliveries(Utc::now(), claim_for, 10, &[])
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
    store.release_deliveries(&[due[2].id]).await.unwrap();
    let now_due = store
        .claim_deliveries(Utc::now(), claim_for, 10, &[])
        .await
        .unwrap();
    assert_eq!(
        now_due.iter().map(|d| d.id).collect::<Vec<_>>(),
        vec![due[2].id]
    );
    let later = store
        .claim_deliveries(retry_at + Duration::milliseconds(1), claim_for, 10, &[])
        .await
        .unwrap();
    assert_eq!(
        later.iter().map(|d| (d.id, d.attempts)).collect::<Vec<_>>(),
        vec![(due[1].id, 1)]
    );
    let listed = store.list_deliveries(t.id, None, None, 10).await.unwrap();
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
            .rotate_endpoint_secret(endpoint.id, b"sealed-secret-2", until, now())
            .await
            .unwrap()
    );
    assert!(
        !store
            .rotate_endpoint_secret(EndpointId::new(), b"x", until, now())
            .await
            .unwrap()
    );
    let rotated = store.get_endpoint(endpoint.id).await.unwrap().unwrap();
    assert_eq!(rotated.previous_secret_until, Some(until));
    store
        .release_deliveries(&[due[2].id, due[1].id])
        .await
        .unwrap();
    let due = store
        .claim_deliveries(Utc::now() + Duration::minutes(1), claim_for, 10, &[])
        .await
        .unwrap();
    assert!(!due.is_empty());
    assert!(due.iter().all(|d| d.secrets.current == b"sealed-secret-2"
        && d.secrets.previous == Some((b"sealed-secret-1".to_vec(), until))));

    // Disabling fails what is pending and stops the fan-out.
    store
        .release_deliveries(&due.iter().map(|d| d.id).collect::<Vec<_>>())
        .await
        .unwrap();
    assert!(
        store
            .set_endpoint_enabled(endpoint.id, false, Some("operator"), now())
            .await
            .unwrap()
    );
    let off = store.get_endpoint(endpoint.id).await.unwrap().unwrap();
    assert!(!off.enabled);
    assert_eq!(off.disabled_reason.as_deref(), Some("operator"));
    assert!(
        !store
            .tenant_subscribes(t.id, "core.event.tracked")
            .await
            .unwrap()
    );
    let listed = store.list_deliveries(t.id, None, None, 10).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .filter(|d| d.status == DeliveryStatus::Failed)
            .count(),
        2
    );
    assert!(
        store
            .claim_deliveries(Utc::now() + Duration::hours(1), claim_for, 10, &[])
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .set_endpoint_enabled(endpoint.id, true, None, now())
            .await
            .unwrap()
    );
    assert!(
        store
            .get_endpoint(endpoint.id)
            .await
            .unwrap()
            .unwrap()
            .enabled
    );

    // A job's terminal event taken only by the fan-out: its delivery
    // commits with the job's end, so nothing is left pending to repair.
    let j = ended_job(store, t.id, JobStatus::Completed, &Emit::to([WEBHOOKS])).await;
    assert!(!event_pending(store, &j).await);
    assert_eq!(store.outbox_depth(WEBHOOKS).await.unwrap(), 0);
    let of_job: Vec<Delivery> = store
        .list_deliveries(t.id, Some(endpoint.id), None, 10)
        .await
        .unwrap()
        .into_iter()
        .filter(|d| d.event_type == "job.completed")
        .collect();
    assert_eq!(of_job.len(), 1);
    assert_eq!(of_job[0].ce_id, format!("fastack.job.completed.{}", j.id));
    assert!(
        store
            .repair_pending_events(Utc::now(), claim_for, &Emit::to([WEBHOOKS]), 10)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn partitions_and_retention(store: &Store) {
    let t = tenant(store, "t").await;
    // Two old months and this one.
    let old = Utc.with_ymd_and_hms(2024, 1, 15, 12, 0, 0).unwrap();
    let older = Utc.with_ymd_and_hms(2023, 12, 31, 23, 59, 59).unwrap();
    let keys = [
        PartitionKey {
            month: Month::of(old),
            retention_class: 13,
        },
        PartitionKey {
            month: Month::of(older),
            retention_class: 13,
        },
    ];
    store.ensure_partitions(&keys).await.unwrap();
    store.ensure_partitions(&keys).await.unwrap();
    let rows: Vec<IngestRow> = (0..5)
        .map(|i| {
            row(
                t.id,
                &track(&format!("old{i}"), "u", old + Duration::seconds(i)),
            )
        })
        .chain([row(t.id, &track("older", "u", older))])
        .collect();
    accept(store, &rows).await;
    process_all(store, t.id, false).await;

    let parts = store.list_partitions(true).await.unwrap();
    let find = |k: &PartitionKey| parts.iter().find(|p| p.key == *k).cloned();
    let jan = find(&keys[0]).expect("the January partition is listed");
    assert_eq!(jan.rows, 5);
    assert_eq!(jan.table, "tracked_events_y2024m01_r13");
    assert_eq!(
        (jan.from, jan.to),
        (keys[0].month.start(), keys[0].month.end())
    );
    assert_eq!(find(&keys[1]).unwrap().rows, 1);
    assert!(
        store
            .list_partitions(false)
            .await
            .unwrap()
            .iter()
            .all(|p| p.rows == -1)
    );
    assert_eq!(store.partition_rows(keys[0]).await.unwrap(), Some(5));
    let never = PartitionKey {
        month: Month {
            year: 2001,
            month: 1,
        },
        retention_class: 13,
    };
    assert_eq!(store.partition_rows(never).await.unwrap(), None);

    // A partition reads back page by page, in key order, every column.
    let mut cursor = None;
    let mut read = Vec::new();
    loop {
        let page = store.read_partition(keys[0], cursor, 2).await.unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 2);
        cursor = Some(page.last().unwrap().0);
        read.extend(page.into_iter().map(|(_, r)| r));
    }
    assert_eq!(read.len(), 5);
    let ids: Vec<EventId> = read.iter().map(|r| r.id).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted);
    assert!(read.iter().all(|r| r.tenant_id == t.id
        && r.kind == "track"
        && r.retention_class == 13
        && r.idempotency_key.starts_with("old")
        && r.properties["total"] == json!(42.5)));
    assert!(
        read[0].occurred_at.ends_with("+02:00"),
        "{}",
        read[0].occurred_at
    );

    // Dropping needs the archived count; a changed count keeps the table.
    assert_eq!(
        store.drop_partition(keys[0], 4).await.unwrap(),
        DropOutcome::RowsChanged { rows: 5 }
    );
    assert_eq!(store.partition_rows(keys[0]).await.unwrap(), Some(5));
    assert_eq!(
        store.drop_partition(keys[0], 5).await.unwrap(),
        DropOutcome::Dropped
    );
    assert_eq!(store.partition_rows(keys[0]).await.unwrap(), None);
    // A table already gone: done if its archive was empty, changed if not.
    assert_eq!(
        store.drop_partition(keys[0], 0).await.unwrap(),
        DropOutcome::Dropped
    );
    assert_eq!(
        store.drop_partition(keys[0], 5).await.unwrap(),
        DropOutcome::RowsChanged { rows: 0 }
    );
    assert!(
        store
            .list_partitions(false)
            .await
            .unwrap()
            .iter()
            .all(|p| p.key != keys[0])
    );
    assert_eq!(
        store
            .count_events(
                t.id,
                TimeRange::new(keys[0].month.start(), keys[0].month.end()).unwrap()
            )
            .await
            .unwrap(),
        0
    );

    // Their idempotency keys go with them (the December one stays).
    let pruned = store
        .prune_idempotency(&[t.id], keys[0].month.end())
        .await
        .unwrap();
    assert!(pruned >= 5, "pruned {pruned}");
    assert_eq!(
        accept(store, &[row(t.id, &track("old0", "u", old))]).await,
        vec![Fence::Fresh]
    );
    // Neither backend records processed ids any more (the inbox delete is
    // PostgreSQL's second fence, the stored event the embedded store's):
    // pruning finds only what earlier releases left, here nothing.
    let forgotten = store
        .prune_processed(Utc::now() + Duration::days(1))
        .await
        .unwrap();
    assert_eq!(forgotten, 0);
}

async fn quarantine_round_trip(store: &Store) {
    let t = tenant(store, "t").await;
    let at = now();
    let poison = row(t.id, &track("poison", "u", at));
    let fine = row(t.id, &track("fine", "u", at));
    accept(store, &[poison.clone(), fine.clone()]).await;
    let (seq, id) = store.next_inbox_row(t.id, None).await.unwrap().unwrap();
    assert_eq!(id, poison.event_id);
    let (next_seq, next_id) = store
        .next_inbox_row(t.id, Some(seq))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next_id, fine.event_id);
    assert!(next_seq > seq);
    assert!(
        store
            .next_inbox_row(t.id, Some(next_seq))
            .await
            .unwrap()
            .is_none()
    );

    assert_eq!(
        store
            .record_process_failure(t.id, seq, "boom 1")
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .record_process_failure(t.id, seq, "boom 2")
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        store
            .record_process_failure(t.id, 999_999, "gone")
            .await
            .unwrap(),
        0
    );
    let q = store
        .quarantine(t.id, seq, at)
        .await
        .unwrap()
        .expect("moved");
    assert_eq!(q.event_id, poison.event_id);
    assert_eq!((q.attempts, q.error.as_str()), (2, "boom 2"));
    assert_eq!(
        q.payload,
        serde_json::from_str::<Value>(&poison.payload).unwrap()
    );
    assert!(store.quarantine(t.id, seq, at).await.unwrap().is_none());
    assert_eq!(
        store.list_quarantine(t.id, 10).await.unwrap(),
        vec![q.clone()]
    );
    assert_eq!(
        store.get_quarantined(t.id, q.event_id).await.unwrap(),
        Some(q.clone())
    );
    let other = tenant(store, "other").await;
    assert!(
        store
            .get_quarantined(other.id, q.event_id)
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

    // Retry puts it back under the same id; processing appends it.
    assert!(store.retry_quarantined(t.id, q.event_id).await.unwrap());
    assert!(!store.retry_quarantined(t.id, q.event_id).await.unwrap());
    assert!(store.list_quarantine(t.id, 10).await.unwrap().is_empty());
    let out = process_all(store, t.id, false).await;
    assert_eq!(
        out.appended.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        vec![poison.event_id]
    );

    // Drop discards for good.
    let doomed = row(t.id, &track("doomed", "u", at));
    accept(store, std::slice::from_ref(&doomed)).await;
    let (seq, _) = store.next_inbox_row(t.id, None).await.unwrap().unwrap();
    store
        .record_process_failure(t.id, seq, "bad")
        .await
        .unwrap();
    store.quarantine(t.id, seq, at).await.unwrap().unwrap();
    assert!(store.drop_quarantined(t.id, doomed.event_id).await.unwrap());
    assert!(!store.drop_quarantined(t.id, doomed.event_id).await.unwrap());
    assert!(store.list_quarantine(t.id, 10).await.unwrap().is_empty());
    assert_eq!(store.inbox_stats().await.unwrap().0, 0);
}

async fn tracking_plans_and_annotations(store: &Store) {
    let a = tenant(store, "acme").await;
    let b = tenant(store, "bolt").await;
    assert!(store.plan_version(a.id, None).await.unwrap().is_none());
    assert!(store.latest_plan_versions().await.unwrap().is_empty());

    // Versions count up per tenant; concurrent installs get distinct ones.
    let doc = json!({"events": {"E": {"type": "object"}}});
    let at = now();
    assert_eq!(store.install_plan(a.id, Some(&doc), at).await.unwrap(), 1);
    let installs = join_all((0..4).map(|_| store.install_plan(a.id, Some(&doc), at))).await;
    let mut versions: Vec<u32> = installs.into_iter().map(|v| v.unwrap()).collect();
    versions.sort_unstable();
    assert_eq!(versions, [2, 3, 4, 5]);
    assert_eq!(store.install_plan(b.id, Some(&doc), at).await.unwrap(), 1);
    assert_eq!(
        store.install_plan(a.id, None, at).await.unwrap(),
        6,
        "a removal is a version"
    );

    let latest = store.plan_version(a.id, None).await.unwrap().unwrap();
    assert_eq!((latest.version, latest.document), (6, None));
    let first = store.plan_version(a.id, Some(1)).await.unwrap().unwrap();
    assert_eq!(first.document, Some(doc.clone()));
    assert_eq!(first.installed_at, at);
    assert!(store.plan_version(a.id, Some(99)).await.unwrap().is_none());
    let history = store.plan_history(a.id).await.unwrap();
    assert_eq!(
        history.iter().map(|p| p.version).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );
    let mut latest = store.latest_plan_versions().await.unwrap();
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
        .taken_keys(a.id, &["k-plan-1".into(), "k-unused".into()])
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].key, "k-plan-1");
    assert_eq!(taken[0].event_id, r.event_id);
    assert_eq!(taken[0].fingerprint, r.fingerprint);
    assert!(
        store
            .taken_keys(b.id, &["k-plan-1".into()])
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.taken_keys(a.id, &[]).await.unwrap().is_empty());

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

/// Outbox rows committed on one connection (node) are announced to every
/// listener; SQLite, one process, has no announcements.
async fn outbox_rows_are_announced(store: &Store) {
    let listened = store.outbox_notifications().await.unwrap();
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

/// The embedded store copies committed WAL pages into both of its files in
/// the background, so no commit has to: the rows reach each database file
/// (read here ignoring the WAL) while nothing but the writers' small
/// commits ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_pages_reach_the_files_in_the_background() {
    use sqlx::{Connection, SqliteConnection, sqlite::SqliteConnectOptions};
    let (db, store) = fresh(Backend::Sqlite)
        .await
        .expect("sqlite needs no service");
    let t = tenant(&store, "t").await;
    let at = now();
    let rows: Vec<IngestRow> = (0..200)
        .map(|i| row(t.id, &track(&format!("w{i}"), "u", at)))
        .collect();
    accept(&store, &rows).await;
    process_all(&store, t.id, false).await;
    let events = format!(
        "SELECT count(*) FROM {}",
        PartitionKey {
            month: Month::of(at),
            retention_class: 13,
        }
        .table_name()
    );
    // `immutable`: the file alone, without its WAL.
    let in_file = |file: &'static str, sql: String| {
        let path = db.dir.path().join(file);
        async move {
            let options = SqliteConnectOptions::new()
                .filename(path)
                .read_only(true)
                .immutable(true);
            let mut conn = SqliteConnection::connect_with(&options).await.ok()?;
            let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(&mut conn)
                .await
                .ok()?;
            Some(n)
        }
    };
    crate::helpers::eventually(
        "the processed events in fastack.db itself",
        std::time::Duration::from_secs(10),
        || async { (in_file("fastack.db", events.clone()).await == Some(200)).then_some(()) },
    )
    .await;
    crate::helpers::eventually(
        "the idempotency keys in fastack-inbox.db itself",
        std::time::Duration::from_secs(10),
        || async {
            (in_file(
                "fastack-inbox.db",
                "SELECT count(*) FROM idempotency_keys".to_owned(),
            )
            .await
                == Some(200))
            .then_some(())
        },
    )
    .await;
    drop(store);
    db.drop_db().await;
}

/// Under a steady stream of group commits the inbox file's WAL starts over
/// instead of growing by every commit's pages (it grew for as long as a
/// load lasted, a few hundred MB a minute): its writer thread finishes each
/// checkpoint between two commits, so the next one begins with every frame
/// copied and writes the WAL from its head again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_wal_starts_over_under_a_steady_load() {
    use std::time::{Duration, Instant};
    let (db, store) = fresh(Backend::Sqlite)
        .await
        .expect("sqlite needs no service");
    let t = tenant(&store, "t").await;
    let at = now();
    let pad = json!("x".repeat(2000));
    let load = Duration::from_secs(2);
    let started = Instant::now();
    // Two committers, as the server keeps two group commits in flight: the
    // file's writer is never idle for long.
    let committer = |name: &'static str| {
        let (store, pad) = (&store, pad.clone());
        async move {
            let mut commits = 0u64;
            while started.elapsed() < load {
                let rows: Vec<IngestRow> = (0..8)
                    .map(|i| {
                        let mut ev = track(&format!("{name}-{commits}-{i}"), "u", at);
                        ev.properties.insert("pad".into(), pad.clone());
                        row(t.id, &ev)
                    })
                    .collect();
                accept(store, &rows).await;
                commits += 1;
            }
            commits
        }
    };
    let (a, b) = tokio::join!(committer("a"), committer("b"));
    // The WAL header's checkpoint sequence number (bytes 12..16, big
    // endian) counts the times the WAL started over; a checkpoint every
    // 200 ms makes about ten in two seconds.
    let header = std::fs::read(db.dir.path().join("fastack-inbox.db-wal"))
        .expect("the inbox file has a WAL");
    let restarts = u32::from_be_bytes(header[12..16].try_into().expect("a WAL header"));
    assert!(
        restarts >= 3,
        "the inbox WAL started over {restarts} times in {} commits over {load:?} ({} bytes)",
        a + b,
        header.len()
    );
    drop(store);
    db.drop_db().await;
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
        let out = store.process_batch(&req).await.expect("process");
        store.consume_inbox(t.id, &out.to_consume).await.unwrap();
        store.release_lease(t.id, node).await.unwrap();
        // The grouped row wakes no relay: its sink flushes on a timer.
        assert_eq!(out.outboxed, n, "the per-event sink's rows");
        rounds.push(out.appended.iter().map(|(id, _)| id.to_string()).collect());
    }
    assert_eq!(store.outbox_depth(AMQP).await.unwrap(), 8);
    assert_eq!(store.outbox_depth(ARCHIVE).await.unwrap(), 8);
    let ids_of = |rows: &[OutboxRow]| -> Vec<Vec<String>> {
        rows.iter()
            .map(|r| {
                records_in(&r.body)
                    .map(|e| e.unwrap().id.into_owned())
                    .collect()
            })
            .collect()
    };
    let owed = store.outbox_owed_rows(ARCHIVE, t.id).await.unwrap();
    assert_eq!(ids_of(&owed), rounds);
    // Counted in events, up to what was asked (the row past it included).
    assert_eq!(store.outbox_owed(ARCHIVE, 2).await.unwrap().events, 5);
    assert_eq!(store.outbox_owed(ARCHIVE, 100).await.unwrap().events, 8);

    // A batch of up to 6 events takes the first round only; the next takes
    // the second even though it asks for fewer events than it holds.
    let claim_for = Duration::seconds(30);
    let first = store
        .claim_outbox_batch(ARCHIVE, Utc::now(), claim_for, Some(6))
        .await
        .unwrap()
        .expect("a batch");
    assert_eq!(ids_of(&first.rows), rounds[..1]);
    let second = store
        .claim_outbox_batch(ARCHIVE, Utc::now(), claim_for, Some(1))
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
    store.complete_outbox(ARCHIVE, &done).await.unwrap();
    assert_eq!(store.outbox_depth(ARCHIVE).await.unwrap(), 0);
    // The per-event sink still owes its own rows, one event each.
    let single = store
        .claim_outbox(AMQP, Utc::now(), claim_for, 100)
        .await
        .unwrap();
    assert_eq!(single.len(), 8);
    assert!(
        single
            .iter()
            .all(|r| serde_json::from_str::<Value>(&r.body).is_ok_and(|e| e["id"].is_string()))
    );
}

/// Claims the queued erasure `id` for a new node, as a job runner does.
async fn claim_erasure(store: &Store, id: JobId) -> (Job, NodeId) {
    let node = NodeId::new();
    let job = store
        .claim_job(
            node,
            Utc::now(),
            Duration::seconds(30),
            Some(JobKind::Erasure),
        )
        .await
        .unwrap()
        .expect("the erasure is claimable");
    assert_eq!(job.id, id);
    (job, node)
}

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
            .find_contact(a.id, IdentityKind::User, "u-1")
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

conformance!(erasure_holds_and_suppressions);
