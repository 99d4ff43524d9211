//! Storage conformance: every operation of every handle of the
//! `Storage`, called directly (no HTTP, no actors), on embedded SQLite and
//! on PostgreSQL, one file per handle. A backend is complete when this
//! module passes on it.
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

mod contacts;
mod deliveries;
mod erasures;
mod ingest;
mod jobs;
mod outbox;
mod partitions;
mod plans;
mod processing;
mod quarantine;
mod sqlite;
mod tenants;

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
    store.tenants().insert(&t).await.expect("insert tenant");
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
        .ingest()
        .commit(rows, &keep_all, later())
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
            .processing()
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
        .processing()
        .run(&request(tenant, node, publish))
        .await
        .expect("process");
    store
        .processing()
        .release_lease(tenant, node)
        .await
        .unwrap();
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
        .events()
        .query(&EventQuery {
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

/// A job of `tenant` claimed by a node and ended with `status`, its event
/// written for the sinks of `emit` (no other job of the store pending).
async fn ended_job(store: &Store, tenant: TenantId, status: JobStatus, emit: &Emit) -> Job {
    let t0 = now();
    store
        .jobs()
        .insert(&job(tenant, JobKind::Export, t0))
        .await
        .unwrap();
    let node = NodeId::new();
    let mut j = store
        .jobs()
        .claim(node, t0, Duration::seconds(30), None)
        .await
        .unwrap()
        .expect("the job just queued");
    j.status = status;
    j.finished_at = Some(t0);
    assert!(store.jobs().finish(&j, node, emit).await.unwrap());
    j
}

/// Whether the job's terminal event is still marked pending.
async fn event_pending(store: &Store, j: &Job) -> bool {
    store
        .jobs()
        .get(j.tenant_id, j.id)
        .await
        .unwrap()
        .expect("the job")
        .event_pending
}

/// Claims the queued erasure `id` for a new node, as a job runner does.
async fn claim_erasure(store: &Store, id: JobId) -> (Job, NodeId) {
    let node = NodeId::new();
    let job = store
        .jobs()
        .claim(
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
