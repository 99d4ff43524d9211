//! Per-request hot pieces of the accept path, each alone.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use fastack_benches::typical_track;
use fastack_core::{
    auth::hash_key,
    ratelimit::{LocalCells, Quota},
    validate::{ValidationContext, fingerprint, validate_event},
};
use fastack_entities::{ApiKeyId, EventKind};

fn ctx() -> ValidationContext {
    ValidationContext {
        now: "2026-11-30T12:00:00Z".parse().expect("timestamp"),
        retention_months: 13,
    }
}

fn validation(c: &mut Criterion) {
    let body = serde_json::to_vec(&typical_track()).expect("json");
    c.bench_function("parse_and_validate_track", |b| {
        b.iter(|| {
            let value: serde_json::Value = serde_json::from_slice(black_box(&body)).expect("json");
            let mut errors = Vec::new();
            black_box(validate_event(
                value,
                Some(EventKind::Track),
                None,
                &ctx(),
                &mut errors,
            ))
        })
    });
    let mut errors = Vec::new();
    let ev = validate_event(
        typical_track(),
        Some(EventKind::Track),
        None,
        &ctx(),
        &mut errors,
    )
    .expect("valid");
    c.bench_function("idempotency_fingerprint", |b| {
        b.iter(|| black_box(fingerprint(black_box(&ev))))
    });
}

fn keys(c: &mut Criterion) {
    let secret = fastack_core::auth::generate_key().secret;
    c.bench_function("api_key_hash", |b| {
        b.iter(|| black_box(hash_key(black_box(&secret))))
    });
}

fn rate_limit(c: &mut Criterion) {
    let cells = LocalCells::default();
    let tenant = Quota {
        rate_per_sec: 50_000,
        burst: 100_000,
    };
    let key = (
        ApiKeyId::new(),
        Quota {
            rate_per_sec: 10_000,
            burst: 10_000,
        },
    );
    c.bench_function("rate_limit_decision_local", |b| {
        b.iter(|| black_box(cells.check(tenant, Some(key))))
    });
}

criterion_group!(hot_path, validation, keys, rate_limit);
criterion_main!(hot_path);
