//! Tenant isolation: one tenant's key never reads another's data.

use std::time::Duration;

use chrono::Utc;
use fastack_entities::Plan;

use crate::helpers::{TestApp, eventually, make_tenant, track};
use crate::on_both_backends;

on_both_backends!(tenant_a_never_sees_tenant_b);

async fn tenant_a_never_sees_tenant_b(app: TestApp) {
    let b = make_tenant(&app.store, "globex", Plan::Pro, None).await;
    let now = Utc::now();
    // Both tenants use the same idempotency key and user id: no clash.
    let a1 = app
        .post(
            "/v1/core/track",
            &app.t.key,
            &track("same-key", "same-user", now),
        )
        .await;
    let b1 = app
        .post(
            "/v1/core/track",
            &b.key,
            &track("same-key", "same-user", now),
        )
        .await;
    assert_eq!(a1.status, 202);
    assert_eq!(b1.status, 202);
    assert_eq!(b1.body["duplicate"], false, "keys are per tenant");
    assert_ne!(a1.body["id"], b1.body["id"]);

    let from = (now - chrono::Duration::hours(1)).to_rfc3339();
    let to = (now + chrono::Duration::hours(1)).to_rfc3339();
    let a_events = eventually("tenant A's event", Duration::from_secs(15), || async {
        let e = app.events(&app.t.key, &from, &to, "").await;
        (e.len() == 1).then_some(e)
    })
    .await;
    let b_events = eventually("tenant B's event", Duration::from_secs(15), || async {
        let e = app.events(&b.key, &from, &to, "").await;
        (e.len() == 1).then_some(e)
    })
    .await;
    assert_eq!(a_events[0]["id"], a1.body["id"]);
    assert_eq!(b_events[0]["id"], b1.body["id"]);

    let a_contact = a_events[0]["contact_id"].as_str().unwrap();
    let b_contact = b_events[0]["contact_id"].as_str().unwrap();
    assert_ne!(a_contact, b_contact);
    let cross = app
        .get(&format!("/v1/core/contacts/{a_contact}"), &b.key)
        .await;
    assert_eq!(cross.status, 404);
    assert_eq!(cross.body["code"], "not_found");
    let own = app
        .get(&format!("/v1/core/contacts/{a_contact}"), &app.t.key)
        .await;
    assert_eq!(own.status, 200);
    // B filtering by A's contact id sees nothing.
    let leak = app
        .events(&b.key, &from, &to, &format!("&contact_id={a_contact}"))
        .await;
    assert!(leak.is_empty());
    app.cleanup().await;
}
