//! The embedded store's group commit alone: a group of 16 fresh `track`
//! rows (the size a closed loop of 32 connections makes) recorded and
//! queued through `Storage::commit_ingest`, synced to disk, on a store in a
//! temporary directory. With the disk's sync in every iteration this is
//! the latency a 202 waits for, not a CPU figure.

use std::{hint::black_box, sync::atomic::AtomicU64, sync::atomic::Ordering};

use chrono::Utc;
use criterion::{Criterion, criterion_group, criterion_main};
use fastack_benches::typical_track;
use fastack_core::{
    config::Config,
    store::{Fence, IngestRow},
    validate::{ValidationContext, event_from_json, fingerprint},
};
use fastack_entities::{EventId, EventKind, TenantId};

const GROUP: usize = 16;

fn keep_all(f: &[Fence]) -> Vec<bool> {
    vec![true; f.len()]
}

fn group_commit(c: &mut Criterion) {
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
    let ctx = ValidationContext {
        now: Utc::now(),
        retention_months: 13,
    };
    let body = serde_json::to_vec(&typical_track()).expect("json");
    let mut errors = Vec::new();
    let ev = event_from_json(&body, Some(EventKind::Track), None, &ctx, &mut errors)
        .expect("parsed")
        .expect("valid event");
    let payload = serde_json::to_string(&ev).expect("json");
    let tenant = TenantId::new();
    let next = AtomicU64::new(0);
    let group = || -> Vec<IngestRow> {
        (0..GROUP)
            .map(|_| IngestRow {
                tenant_id: tenant,
                idempotency_key: format!("key-{}", next.fetch_add(1, Ordering::Relaxed)),
                event_id: EventId::new(),
                fingerprint: fingerprint(&ev),
                occurred_at: ev.occurred_at.with_timezone(&Utc),
                received_at: Utc::now(),
                payload: payload.clone(),
            })
            .collect()
    };
    c.bench_function("embedded_group_commit_16", |b| {
        b.iter_batched(
            group,
            |rows| {
                rt.block_on(store.commit_ingest(black_box(&rows), &keep_all))
                    .expect("commit")
            },
            criterion::BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, group_commit);
criterion_main!(benches);
