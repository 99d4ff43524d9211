//! Identity resolution as the user sees it through the read API.

use std::time::Duration;

use chrono::Utc;
use serde_json::json;

use crate::helpers::{TestApp, eventually, urlenc};
use crate::on_both_backends;

on_both_backends!(unknown_ids_become_contacts_and_identify_merges);

async fn unknown_ids_become_contacts_and_identify_merges(app: TestApp) {
    let key = app.t.key.clone();
    let t0 = Utc::now() - chrono::Duration::minutes(10);
    let at = |m: i64| (t0 + chrono::Duration::minutes(m)).to_rfc3339();

    // An anonymous visitor browses: a contact is created, not dropped.
    let a = app
        .post("/v1/core/track", &key, &json!({"event": "Viewed", "anonymous_id": "device-9", "occurred_at": at(0), "idempotency_key": "v1", "properties": {}}))
        .await;
    assert_eq!(a.status, 202);
    // A known user acts elsewhere.
    let b = app
        .post("/v1/core/track", &key, &json!({"event": "Paid", "user_id": "ana", "occurred_at": at(1), "idempotency_key": "p1"}))
        .await;
    assert_eq!(b.status, 202);
    let anon_contact = eventually("anonymous contact", Duration::from_secs(15), || async {
        let c = app
            .get("/v1/core/contacts?anonymous_id=device-9", &key)
            .await;
        (c.status == 200).then(|| c.body["id"].as_str().unwrap().to_owned())
    })
    .await;
    let user_contact = eventually("user contact", Duration::from_secs(15), || async {
        let c = app.get("/v1/core/contacts?user_id=ana", &key).await;
        (c.status == 200).then(|| c.body["id"].as_str().unwrap().to_owned())
    })
    .await;
    assert_ne!(anon_contact, user_contact);

    // She logs in on that device: identify links both ids, merging.
    let i = app
        .post("/v1/core/identify", &key, &json!({"user_id": "ana", "anonymous_id": "device-9", "traits": {"email": "ana@example.com"}, "occurred_at": at(2), "idempotency_key": "id1"}))
        .await;
    assert_eq!(i.status, 202, "{}", i.body);
    let merged = eventually("the merge", Duration::from_secs(15), || async {
        let c = app
            .get("/v1/core/contacts?anonymous_id=device-9", &key)
            .await;
        (c.status == 200 && c.body["id"] == user_contact.as_str()).then_some(c.body)
    })
    .await;
    assert_eq!(merged["user_ids"], json!(["ana"]));
    assert_eq!(merged["anonymous_ids"], json!(["device-9"]));
    assert_eq!(merged["traits"]["email"], "ana@example.com");
    assert_eq!(merged["merged_ids"], json!([anon_contact]));
    // The merged contact's id answers the survivor.
    let old = app
        .get(&format!("/v1/core/contacts/{anon_contact}"), &key)
        .await;
    assert_eq!(old.status, 200);
    assert_eq!(old.body["id"], user_contact.as_str());

    // Later anonymous activity on that device belongs to her.
    let c = app
        .post("/v1/core/track", &key, &json!({"event": "Viewed", "anonymous_id": "device-9", "occurred_at": at(3), "idempotency_key": "v2"}))
        .await;
    assert_eq!(c.status, 202);
    let from = (t0 - chrono::Duration::hours(1)).to_rfc3339();
    let to = (Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let evs = eventually("all four events", Duration::from_secs(15), || async {
        let evs = app
            .events(&key, &from, &to, &format!("&contact_id={user_contact}"))
            .await;
        (evs.len() == 4).then_some(evs)
    })
    .await;
    let names: Vec<&str> = evs.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["track", "track", "identify", "track"]);
    assert_eq!(evs[2]["traits"]["email"], "ana@example.com");
    assert_eq!(evs[3]["contact_id"], user_contact.as_str());
    let only_paid = app.events(&key, &from, &to, "&event=Paid").await;
    assert_eq!(only_paid.len(), 1);
    let _ = urlenc("");
    app.cleanup().await;
}
