//! Identity resolution as the user sees it through the read API.

use std::time::Duration;

use chrono::Utc;
use serde_json::json;

use crate::helpers::{Backend, TestApp, eventually, urlenc};
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

    // A stranger's event, which no person filter may list.
    let d = app
        .post("/v1/core/track", &key, &json!({"event": "Viewed", "user_id": "bea", "occurred_at": at(4), "idempotency_key": "b1"}))
        .await;
    assert_eq!(d.status, 202);
    eventually("bea's event", Duration::from_secs(15), || async {
        (app.events(&key, &from, &to, "").await.len() == 5).then_some(())
    })
    .await;
    // By either of her ids: all four, whichever id each was sent under.
    let ids = |evs: &[serde_json::Value]| -> Vec<String> {
        evs.iter()
            .map(|e| e["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let by_user = app.events(&key, &from, &to, "&user_id=ana").await;
    let by_device = app.events(&key, &from, &to, "&anonymous_id=device-9").await;
    assert_eq!(ids(&by_user), ids(&evs));
    assert_eq!(ids(&by_device), ids(&evs));
    let bea = app.events(&key, &from, &to, "&user_id=bea").await;
    assert_eq!(ids(&bea), vec![d.body["id"].as_str().unwrap().to_owned()]);
    // With the event filter and the time window, as always.
    let paid = app
        .events(&key, &from, &to, "&user_id=ana&event=Paid")
        .await;
    assert_eq!(paid.len(), 1);
    let early = app
        .events(&key, &from, &at(1), "&anonymous_id=device-9")
        .await;
    assert_eq!(ids(&early), ids(&evs[..1]));
    assert!(
        app.events(&key, &from, &to, "&user_id=nobody")
            .await
            .is_empty()
    );
    let window = format!("from={}&to={}", urlenc(&from), urlenc(&to));
    let both = app
        .get(
            &format!("/v1/core/events?{window}&user_id=ana&anonymous_id=device-9"),
            &key,
        )
        .await;
    assert_eq!(both.status, 400, "{}", both.body);
    assert_eq!(both.body["code"], "invalid_query");
    let empty = app
        .get(&format!("/v1/core/events?{window}&user_id="), &key)
        .await;
    assert_eq!(empty.status, 400, "{}", empty.body);
    assert_eq!(empty.body["errors"][0]["field"], "user_id");

    // A parameter the operation does not name is refused, never ignored.
    let typo = app
        .get(&format!("/v1/core/events?{window}&limt=1"), &key)
        .await;
    assert_eq!(typo.status, 400, "{}", typo.body);
    assert_eq!(typo.body["code"], "invalid_query");
    assert_eq!(typo.body["errors"][0]["field"], "limt");
    assert_eq!(typo.body["errors"][0]["code"], "unknown_parameter");
    assert!(
        typo.body["detail"]
            .as_str()
            .unwrap()
            .contains("did you mean `limit`?"),
        "{}",
        typo.body
    );
    let contact = app.get("/v1/core/contacts?userid=ana", &key).await;
    assert_eq!(contact.status, 400, "{}", contact.body);
    assert!(
        contact.body["detail"]
            .as_str()
            .unwrap()
            .contains("did you mean `user_id`?"),
        "{}",
        contact.body
    );
    let jobs = app.get("/v1/core/jobs?state=failed", &key).await;
    assert_eq!(jobs.status, 400, "{}", jobs.body);
    assert_eq!(jobs.body["errors"][0]["field"], "state");
    let track = app
        .post(
            "/v1/core/track?debug=1",
            &key,
            &json!({"event": "Viewed", "user_id": "bea", "occurred_at": at(5), "idempotency_key": "b2"}),
        )
        .await;
    assert_eq!(track.status, 400, "{}", track.body);
    assert!(
        track.body["detail"]
            .as_str()
            .unwrap()
            .contains("takes no query parameters"),
        "{}",
        track.body
    );
    // Nothing of the refused track was kept.
    assert_eq!(app.events(&key, &from, &to, "&user_id=bea").await.len(), 1);
    app.cleanup().await;
}

on_both_backends!(a_merge_made_elsewhere_is_followed);
/// A node keeps the contacts it resolved in memory between rounds; when
/// another node held the tenant meanwhile and merged two of them, the node
/// that takes the tenant back resolves from what the database says, not
/// from what it remembered.
async fn a_merge_made_elsewhere_is_followed(app: TestApp) {
    use sea_orm::ConnectionTrait;
    let key = app.t.key.clone();
    let t0 = Utc::now() - chrono::Duration::minutes(10);
    let at = |m: i64| (t0 + chrono::Duration::minutes(m)).to_rfc3339();
    let send = |id: &str, who: serde_json::Value, m: i64| {
        let mut body = json!({"event": "Viewed", "occurred_at": at(m), "idempotency_key": id});
        body.as_object_mut()
            .unwrap()
            .extend(who.as_object().unwrap().clone());
        body
    };
    let contact_of = |query: &'static str| {
        let (app, key) = (&app, &key);
        async move {
            eventually(query, Duration::from_secs(15), || async {
                let c = app.get(&format!("/v1/core/contacts?{query}"), key).await;
                (c.status == 200).then(|| c.body["id"].as_str().unwrap().to_owned())
            })
            .await
        }
    };
    for (id, who, m) in [
        ("m1", json!({"user_id": "cleo"}), 0),
        ("m2", json!({"anonymous_id": "tablet-3"}), 1),
    ] {
        let a = app.post("/v1/core/track", &key, &send(id, who, m)).await;
        assert_eq!(a.status, 202, "{}", a.body);
    }
    let user = contact_of("user_id=cleo").await;
    let device = contact_of("anonymous_id=tablet-3").await;
    assert_ne!(user, device);

    // Another node takes the tenant and merges the device into her (what
    // its processing of an `identify` writes), then stops.
    crate::helpers::lease(&app, true).await;
    let id = |u: &str| match app.db.backend {
        Backend::Postgres => format!("'{u}'"),
        Backend::Sqlite => format!("x'{}'", u.replace('-', "")),
    };
    let db = app.store.connection_for_tests();
    for sql in [
        format!(
            "UPDATE contact_identities SET contact_id = {} WHERE contact_id = {}",
            id(&user),
            id(&device)
        ),
        format!(
            "UPDATE contacts SET merged_into = {} WHERE id = {}",
            id(&user),
            id(&device)
        ),
    ] {
        assert_eq!(
            db.execute_unprepared(&sql).await.unwrap().rows_affected(),
            1
        );
    }
    crate::helpers::lease(&app, false).await;

    // The device's next event is hers.
    let a = app
        .post(
            "/v1/core/track",
            &key,
            &send("m3", json!({"anonymous_id": "tablet-3"}), 2),
        )
        .await;
    assert_eq!(a.status, 202, "{}", a.body);
    let from = (t0 - chrono::Duration::hours(1)).to_rfc3339();
    let to = (Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let third = eventually("the third event", Duration::from_secs(15), || async {
        app.events(&key, &from, &to, "")
            .await
            .into_iter()
            .find(|e| e["id"] == a.body["id"])
    })
    .await;
    assert_eq!(third["contact_id"], user.as_str(), "{third}");
    app.cleanup().await;
}
