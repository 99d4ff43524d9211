//! The embedded store's two writers, each alone, on a store in a temporary
//! directory:
//!
//! - the group commit: 16 fresh `track` rows (the size a closed loop of 32
//!   connections makes) recorded and queued through
//!   `store.ingest().commit`, synced to disk. With the disk's sync in every
//!   iteration this is the latency a 202 waits for, not a CPU figure;
//! - a processing round: 2,000 queued `track` rows of 500 users taken
//!   through `store.processing().run` (identity, `tracked_events`, synced
//!   commit) and deleted from the inbox (`consume_inbox`): the time per
//!   round divided by 2,000 is what the processor spends per event;
//! - the same with a round size that changes every iteration (1,000 to
//!   1,999 rows, 1,499.5 on average), as rounds under load do: what a
//!   statement text per row count cost shows here, not in a round of a
//!   size that repeats.

use std::{hint::black_box, sync::atomic::AtomicU64, sync::atomic::Ordering};

use chrono::Utc;
use criterion::{Criterion, criterion_group, criterion_main};
use fastack_benches::typical_track;
use fastack_core::{
    admin,
    config::Config,
    store::{Fence, IngestRow, ProcessRequest, Storage, Store},
    validate::{ValidationContext, event_from_json, fingerprint},
};
use fastack_entities::{EventKind, NewEvent, NodeId, Plan, TenantId};

const GROUP: usize = 16;

fn keep_all(f: &[Fence]) -> Vec<bool> {
    vec![true; f.len()]
}

/// A runtime and an embedded store in a temporary directory (kept while
/// the benchmark runs).
fn embedded() -> (tokio::runtime::Runtime, tempfile::TempDir, Store) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = Config {
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    };
    let store = rt
        .block_on(fastack_core::store::open(&config))
        .expect("embedded store");
    (rt, dir, store)
}

/// The load tool's typical `track`, validated as the front door does.
fn typical_event() -> NewEvent {
    let ctx = ValidationContext {
        now: Utc::now(),
        retention_months: 13,
    };
    let body = serde_json::to_vec(&typical_track()).expect("json");
    let mut errors = Vec::new();
    event_from_json(&body, Some(EventKind::Track), None, &ctx, &mut errors)
        .expect("parsed")
        .expect("valid event")
}

fn group_commit(c: &mut Criterion) {
    let (rt, _dir, store) = embedded();
    let ev = typical_event();
    let tenant = TenantId::new();
    let next = AtomicU64::new(0);
    let group = || -> Vec<IngestRow> {
        (0..GROUP)
            .map(|_| {
                let mut ev = ev.clone();
                ev.idempotency_key = format!("key-{}", next.fetch_add(1, Ordering::Relaxed));
                let fp = fingerprint(&ev);
                IngestRow::new(tenant, ev, fp, Utc::now())
            })
            .collect()
    };
    c.bench_function("embedded_group_commit_16", |b| {
        b.iter_batched(
            group,
            |rows| {
                rt.block_on(store.ingest().commit(black_box(&rows), &keep_all, far()))
                    .expect("commit")
            },
            criterion::BatchSize::SmallInput,
        )
    });
}

/// Rows of one processing round.
const ROUND: usize = 2_000;

fn process_round(c: &mut Criterion) {
    let (rt, _dir, store) = embedded();
    let tenant = rt
        .block_on(admin::create_tenant(
            store.as_ref(),
            "bench",
            Plan::Enterprise,
            None,
        ))
        .expect("tenant")
        .id;
    let node = NodeId::new();
    let ev = typical_event();
    let next = AtomicU64::new(0);
    // A round's rows queued (not timed): 500 users, as a shop's traffic
    // repeats its customers.
    let queue = |size: usize| {
        let rows: Vec<IngestRow> = (0..size)
            .map(|_| {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let mut ev = ev.clone();
                ev.user_id = Some(format!("user-{}", n % 500));
                ev.idempotency_key = format!("key-{n}");
                let fp = fingerprint(&ev);
                IngestRow::new(tenant, ev, fp, Utc::now())
            })
            .collect();
        rt.block_on(store.ingest().commit(&rows, &keep_all, far()))
            .expect("queued");
        size
    };
    let round = async |store: &Storage, size: usize| {
        let now = Utc::now();
        assert!(
            store
                .processing()
                .try_lease(tenant, node, now, chrono::Duration::seconds(60))
                .await
                .expect("lease")
        );
        let req = ProcessRequest {
            tenant_id: tenant,
            node_id: node,
            retention_class: 13,
            limit: size as u32,
            now,
            lease_ttl: chrono::Duration::seconds(60),
            tracked: Default::default(),
            tracked_if_subscribed: Default::default(),
            after_seq: None,
            faults: Default::default(),
        };
        let out = store.processing().run(&req).await.expect("processed");
        assert_eq!(out.appended.len(), size);
    };
    let mut group = c.benchmark_group("embedded_process_round");
    group.sample_size(20);
    group.bench_function("2000_track", |b| {
        b.iter_batched(
            || queue(ROUND),
            |size| rt.block_on(round(store.as_ref(), size)),
            criterion::BatchSize::PerIteration,
        )
    });
    let sizes = AtomicU64::new(0);
    group.bench_function("1000_to_1999_track", |b| {
        b.iter_batched(
            // A size not seen in the last thousand rounds.
            || queue(1_000 + (sizes.fetch_add(389, Ordering::Relaxed) % 1_000) as usize),
            |size| rt.block_on(round(store.as_ref(), size)),
            criterion::BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, group_commit, process_round);
criterion_main!(benches);

/// A deadline no benchmarked commit comes near.
fn far() -> std::time::Instant {
    std::time::Instant::now() + std::time::Duration::from_secs(3600)
}
