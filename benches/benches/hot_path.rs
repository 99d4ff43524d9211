//! Per-request hot pieces of the accept path, each alone: validation, the
//! idempotency fingerprint and cache check, the API-key lookup, the rate
//! limit decision, and the signatures of outgoing events.

use std::{hint::black_box, sync::Arc, time::Duration};

use criterion::{Criterion, criterion_group, criterion_main};
use fastack_benches::typical_track;
use fastack_core::{
    amqp,
    auth::{KeyCache, hash_key},
    ratelimit::{LocalCells, Quota},
    validate::{ValidationContext, batch_items, event_from_json, fingerprint, validate_event},
    webhooks,
};
use fastack_entities::{ApiKeyId, EventId, EventKind};

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
    // The whole edge rule: storable-text scan, strict parse (no repeated
    // member names), validation.
    c.bench_function("edge_rule_track", |b| {
        b.iter(|| {
            let mut errors = Vec::new();
            black_box(event_from_json(
                black_box(&body),
                Some(EventKind::Track),
                None,
                &ctx(),
                &mut errors,
            ))
        })
    });
    c.bench_function("unstorable_scan_track", |b| {
        b.iter(|| black_box(fastack_core::json::unstorable(black_box(&body))))
    });
    let items: Vec<serde_json::Value> = (0..100)
        .map(|i| {
            let mut t = typical_track();
            t["type"] = serde_json::json!("track");
            t["idempotency_key"] = serde_json::json!(format!("k-{i}"));
            t
        })
        .collect();
    let batch = serde_json::to_vec(&serde_json::json!({ "batch": items })).expect("json");
    c.bench_function("batch_envelope_100", |b| {
        b.iter(|| black_box(batch_items(black_box(&batch)).expect("envelope").len()))
    });
    c.bench_function("edge_rule_batch_100", |b| {
        b.iter(|| {
            let mut errors = Vec::new();
            let raw = batch_items(black_box(&batch)).expect("envelope");
            for (i, item) in raw.iter().enumerate() {
                black_box(
                    event_from_json(item.get().as_bytes(), None, Some(i), &ctx(), &mut errors)
                        .expect("json"),
                );
            }
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

    // The front door's duplicate check: the tenant's bounded key cache.
    let cache: quick_cache::sync::Cache<String, (EventId, [u8; 32])> =
        quick_cache::sync::Cache::new(10_000);
    for i in 0..10_000 {
        cache.insert(format!("key-{i}"), (EventId::new(), [0u8; 32]));
    }
    c.bench_function("idempotency_cache_check", |b| {
        let mut i = 0u32;
        b.iter(|| {
            i = (i + 7919) % 20_000;
            black_box(cache.get(format!("key-{i}").as_str()))
        })
    });
}

fn keys(c: &mut Criterion) {
    let secret = fastack_core::auth::generate_key().secret;
    c.bench_function("api_key_hash", |b| {
        b.iter(|| black_box(hash_key(black_box(&secret))))
    });

    // A cached lookup through the real KeyCache (SQLite behind it).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let (cache, secret) = rt.block_on(async {
        let config = fastack_core::Config::from_vars([(
            "FASTACK_DATA_DIR".to_owned(),
            dir.path().display().to_string(),
        )])
        .expect("config");
        let store = fastack_core::store::open(&config).await.expect("store");
        let tenant = fastack_core::admin::create_tenant(
            store.as_ref(),
            "bench",
            fastack_entities::Plan::Pro,
            None,
        )
        .await
        .expect("tenant");
        let key = fastack_core::admin::create_key(store.as_ref(), tenant.id, None)
            .await
            .expect("key");
        let cache = Arc::new(KeyCache::new(store, Duration::from_secs(3600)));
        cache.authenticate(&key.secret).await.expect("lookup");
        (cache, key.secret)
    });
    c.bench_function("api_key_lookup_cached", |b| {
        b.iter(|| {
            black_box(
                rt.block_on(cache.authenticate(black_box(&secret)))
                    .expect("lookup"),
            )
        })
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
    // The `RateLimit-Policy` and `RateLimit` values every answer carries.
    let decision = cells.check(tenant, Some(key));
    c.bench_function("rate_limit_header_values", |b| {
        b.iter(|| black_box(black_box(&decision).header_values()))
    });
}

fn signatures(c: &mut Criterion) {
    let body = serde_json::to_vec(&typical_track()).expect("json");
    let secret = webhooks::Secret::generate();
    c.bench_function("webhook_signature", |b| {
        b.iter(|| {
            black_box(webhooks::sign(
                &secret,
                "msg_01a22b60",
                1_764_500_000,
                black_box(&body),
            ))
        })
    });
    let key = [7u8; 32];
    c.bench_function("amqp_message_signature", |b| {
        b.iter(|| {
            black_box(amqp::sign(
                &key,
                1_764_500_000,
                "01a22b60-a992-7452-962f-edaff53b5f50",
                "01a22b60-b188-73bd-8897-d8bc6e31c17a",
                "fastack.job.events",
                "job.completed",
                black_box(&body),
            ))
        })
    });
}

/// A tracking plan check: a typical 10-property event against a 20-property
/// schema with formats and enums (the plan compiled once, as a node keeps
/// it), conforming and breaking three keywords; and no plan at all.
fn tracking_plan(c: &mut Criterion) {
    use fastack_core::taxonomy::CompiledPlan;
    use serde_json::json;
    let mut props = serde_json::Map::new();
    for i in 0..10 {
        props.insert(
            format!("extra_{i}"),
            json!({"type": "string", "maxLength": 64}),
        );
    }
    props.insert(
        "order_id".into(),
        json!({"type": "string", "format": "uuid"}),
    );
    props.insert("email".into(), json!({"type": "string", "format": "email"}));
    props.insert(
        "currency".into(),
        json!({"enum": ["EUR", "USD", "GBP", "JPY"]}),
    );
    props.insert("total".into(), json!({"type": "number", "minimum": 0}));
    props.insert(
        "items".into(),
        json!({"type": "integer", "minimum": 1, "maximum": 1000}),
    );
    props.insert("coupon".into(), json!({"type": ["string", "null"]}));
    props.insert("channel".into(), json!({"enum": ["web", "ios", "android"]}));
    props.insert(
        "placed_at".into(),
        json!({"type": "string", "format": "date-time"}),
    );
    props.insert("gift".into(), json!({"type": "boolean"}));
    props.insert(
        "country".into(),
        json!({"type": "string", "pattern": "^[A-Z]{2}$"}),
    );
    let plan = CompiledPlan::compile(
        1,
        &json!({"events": {"Order Completed": {
            "type": "object",
            "properties": props,
            "required": ["order_id", "total", "currency"],
        }}}),
    )
    .expect("plan compiles");
    let event = |over: serde_json::Value| {
        let mut p = json!({
            "order_id": "01a22b60-a992-7452-962f-edaff53b5f50",
            "email": "ana@example.com",
            "currency": "EUR",
            "total": 42.5,
            "items": 3,
            "coupon": null,
            "channel": "web",
            "placed_at": "2026-11-30T12:00:00Z",
            "gift": false,
            "country": "ES",
        });
        for (k, v) in over.as_object().expect("object") {
            p[k] = v.clone();
        }
        fastack_entities::NewEvent {
            kind: EventKind::Track,
            event: Some("Order Completed".into()),
            user_id: Some("u1".into()),
            anonymous_id: None,
            properties: p.as_object().cloned().expect("object"),
            occurred_at: ctx().now.fixed_offset(),
            idempotency_key: "k".into(),
            plan: None,
        }
    };
    let mut good = event(json!({}));
    c.bench_function("tracking_plan_check_conforming", |b| {
        b.iter(|| black_box(plan.check(black_box(&mut good))))
    });
    let mut bad = event(json!({"email": "nope", "currency": "XXX", "total": -1}));
    c.bench_function("tracking_plan_check_3_violations", |b| {
        b.iter(|| black_box(plan.check(black_box(&mut bad))))
    });
    let plans = fastack_core::taxonomy::Plans::default();
    let tenant = fastack_entities::TenantId::new();
    c.bench_function("tracking_plan_lookup_none", |b| {
        b.iter(|| black_box(plans.get(black_box(tenant))))
    });
}

/// The event JSON processing renders for every event a sink takes
/// (`core.event.tracked`): borrowed fields written in key order, against
/// the rendering it replaced (the event copied into a `StoredEvent`, then
/// a JSON object built key by key, properties copied again).
fn tracked_body(c: &mut Criterion) {
    use fastack_entities::{ContactId, StoredEvent};
    use serde_json::{Map, Value, json};
    let track = typical_track();
    let ev = StoredEvent {
        id: EventId::new(),
        kind: EventKind::Track,
        event: Some("Order Completed".into()),
        contact_id: ContactId::new(),
        user_id: Some("user-4821".into()),
        anonymous_id: track["anonymous_id"].as_str().map(str::to_owned),
        properties: track["properties"]
            .as_object()
            .cloned()
            .expect("properties"),
        occurred_at: "2026-11-30T09:15:00.123+01:00".parse().expect("timestamp"),
        received_at: "2026-11-30T08:15:00.5Z".parse().expect("timestamp"),
        plan: None,
    };
    c.bench_function("tracked_body_borrowed", |b| {
        b.iter(|| fastack_core::store::tracked_body(black_box(&ev)))
    });
    c.bench_function("tracked_body_copied_value_tree (before)", |b| {
        b.iter(|| {
            let ev: StoredEvent = black_box(&ev).clone();
            let mut m = Map::new();
            m.insert("id".into(), json!(ev.id));
            m.insert("type".into(), json!(ev.kind.as_str()));
            m.insert("event".into(), json!(ev.event));
            m.insert("contact_id".into(), json!(ev.contact_id));
            m.insert("user_id".into(), json!(ev.user_id));
            m.insert("anonymous_id".into(), json!(ev.anonymous_id));
            m.insert("properties".into(), Value::Object(ev.properties.clone()));
            let at = ev
                .occurred_at
                .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
            m.insert("occurred_at".into(), json!(at));
            let at = ev
                .received_at
                .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
            m.insert("received_at".into(), json!(at));
            Value::Object(m).to_string()
        })
    });
}

criterion_group!(
    hot_path,
    validation,
    keys,
    rate_limit,
    signatures,
    tracking_plan,
    tracked_body
);
criterion_main!(hot_path);
