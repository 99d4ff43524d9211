//! Rate limit headers on every answer, 429 with Retry-After past the limit
//! (in process on SQLite, in Redis on PostgreSQL).

use chrono::Utc;
use fastack_entities::Plan;

use crate::helpers::{TestApp, make_tenant, track};
use crate::on_both_backends;

on_both_backends!(headers_and_429);

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
        "\"tenant\";q=100;w=1, \"key\";q=5;w=1"
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
            .contains("q=50000")
    );
    app.cleanup().await;
}
