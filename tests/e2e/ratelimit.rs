//! Rate limit headers on every answer, 429 with Retry-After past the limit
//! (in process on SQLite, in Redis on PostgreSQL).

use std::sync::Arc;

use chrono::Utc;
use fastack_core::{
    metrics::Metrics,
    ratelimit::{Quota, RedisLimiter},
};
use fastack_entities::{Plan, TenantId};
use uuid::Uuid;

use crate::helpers::{TestApp, make_tenant, redis_or_skip, redis_url, track};
use crate::on_both_backends;

on_both_backends!(headers_and_429);

/// Two nodes leasing tokens from one Redis budget under a flood of
/// concurrent requests: together they let through exactly the burst (plus
/// what drips back meanwhile), and leases and remembered refusals keep the
/// round trips far below one per request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_leases_share_one_budget_across_nodes() {
    // A quick check first: the connection manager retries for seconds.
    if !redis_or_skip() {
        return;
    }
    let prefix = format!("t{}", Uuid::new_v4().simple());
    let metrics = Metrics::new();
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let limiter =
            RedisLimiter::connect(&redis_url(), &prefix, metrics.ratelimit_round_trips.clone())
                .await
                .expect("connect to Redis");
        nodes.push(Arc::new(limiter));
    }
    let tenant = TenantId::new();
    let quota = Quota {
        rate_per_sec: 1,
        burst: 300,
    };
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..800 {
        let node = nodes[i % 2].clone();
        tasks.spawn(async move { node.check(tenant, quota, None).await.unwrap() });
    }
    let mut allowed = 0;
    let mut refused = 0;
    while let Some(d) = tasks.join_next().await {
        let d = d.unwrap();
        if d.allowed {
            allowed += 1;
        } else {
            refused += 1;
            assert!(d.retry_after_secs >= 1, "{d:?}");
            assert_eq!(d.policies[0].remaining, 0, "{d:?}");
        }
    }
    assert!(
        (300..=303).contains(&allowed),
        "allowed {allowed} of a burst of 300"
    );
    assert_eq!(allowed + refused, 800);
    let trips = metrics.ratelimit_round_trips.get();
    assert!(trips < 200, "{trips} round trips for 800 decisions");
}

async fn headers_and_429(app: TestApp) {
    // A key limited to 5 requests/s on a free tenant (100/s, burst 200).
    let t = make_tenant(&app.store, "tiny", Plan::Free, Some(5)).await;
    let now = Utc::now();
    let first = app
        .post("/v1/core/track", &t.key, &track("rl-0", "u", now))
        .await;
    assert_eq!(first.status, 202);
    assert_eq!(
        first.headers["ratelimit-policy"].to_str().unwrap(),
        "\"tenant\";q=200;w=2, \"key\";q=5;w=1"
    );
    let state = first.headers["ratelimit"].to_str().unwrap().to_owned();
    assert!(
        state.starts_with("\"tenant\";r=199;t=1, \"key\";r=4;t="),
        "{state}"
    );

    let mut refused = None;
    for i in 1..20 {
        let a = app
            .post(
                "/v1/core/track",
                &t.key,
                &track(&format!("rl-{i}"), "u", now),
            )
            .await;
        if a.status == 429 {
            refused = Some(a);
            break;
        }
        assert_eq!(a.status, 202);
        assert!(a.headers.contains_key("ratelimit"));
    }
    let refused = refused.expect("the key limit refuses within 20 quick requests");
    assert_eq!(refused.body["code"], "rate_limited");
    let retry: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry));
    assert!(refused.headers.contains_key("ratelimit-policy"));
    assert!(
        refused.headers["ratelimit"]
            .to_str()
            .unwrap()
            .contains("\"key\";r=0")
    );

    // Reads count too and carry the headers; other tenants are unaffected.
    let r = app
        .get(
            "/v1/core/events?from=2026-01-01T00:00:00Z&to=2027-01-01T00:00:00Z",
            &app.t.key,
        )
        .await;
    assert_eq!(r.status, 200);
    assert!(
        r.headers["ratelimit-policy"]
            .to_str()
            .unwrap()
            .contains("\"tenant\";q=100000;w=2")
    );
    app.cleanup().await;
}

/// Parses `"name";k=v;k=v, …` into (name, {k: v}).
fn structured(header: &str) -> Vec<(String, std::collections::HashMap<String, u64>)> {
    header
        .split(", ")
        .map(|item| {
            let mut parts = item.split(';');
            let name = parts.next().unwrap().trim_matches('"').to_owned();
            let params = parts
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap();
                    (k.to_owned(), v.parse().unwrap())
                })
                .collect();
            (name, params)
        })
        .collect()
}

/// For every plan and a key limit, the policy describes the burst
/// (`q` = burst over `w` seconds at the plan's rate) and the remaining
/// count never exceeds the quota, on the first request of an idle tenant
/// and after some.
async fn remaining_never_exceeds_the_quota(app: TestApp) {
    let now = Utc::now();
    for (plan, key_rps) in [
        (Plan::Free, None),
        (Plan::Pro, None),
        (Plan::Enterprise, None),
        (Plan::Pro, Some(7)),
    ] {
        let t = make_tenant(&app.store, &format!("q-{plan}-{key_rps:?}"), plan, key_rps).await;
        let limits = fastack_entities::PlanLimits::default_for(plan);
        for i in 0..3 {
            let a = app
                .post(
                    "/v1/core/track",
                    &t.key,
                    &track(&format!("q-{i}"), "u", now),
                )
                .await;
            assert_eq!(a.status, 202);
            let policy = structured(a.headers["ratelimit-policy"].to_str().unwrap());
            let state = structured(a.headers["ratelimit"].to_str().unwrap());
            assert_eq!(policy.len(), state.len());
            for ((name, p), (sname, s)) in policy.iter().zip(&state) {
                assert_eq!(name, sname);
                assert!(
                    s["r"] <= p["q"],
                    "{plan} {name}: r={} > q={}",
                    s["r"],
                    p["q"]
                );
                let (burst, rate) = match name.as_str() {
                    "tenant" => (limits.burst, limits.rate_per_sec),
                    _ => (key_rps.unwrap(), key_rps.unwrap()),
                };
                assert_eq!(p["q"], u64::from(burst), "{plan} {name}");
                assert_eq!(p["w"], u64::from(burst.div_ceil(rate)), "{plan} {name}");
            }
        }
    }
    app.cleanup().await;
}

crate::on_both_backends!(remaining_never_exceeds_the_quota);
