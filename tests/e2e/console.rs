//! The account console over HTTP, as a browser would use it but without
//! one: one-time links, passwords and the lockout, sessions and their
//! expiry, CSRF, roles, tenant isolation, replays that keep their
//! `webhook-id`, and the operational notifications. (The browser suite in
//! `tests/console/` drives the same pages in Chromium.)

use std::{sync::Arc, time::Duration};

use chrono::Utc;
use fastack_core::{
    clock::{Clock, ManualClock},
    console::{self, Role},
};
use fastack_entities::{Plan, TenantId};
use serde_json::Value;

use crate::{
    helpers::{Backend, TestApp, TestDb, eventually, make_tenant, spawn_with},
    webhooks::{Receiver, Reply, deliveries, register, send, tweak, verify_independently},
};

const PASSWORD: &str = "correct horse battery staple";

/// A browser's view of the console: one cookie jar, forms with their
/// tokens.
struct Browser {
    base: String,
    http: reqwest::Client,
    cookies: Vec<(String, String)>,
}

struct Got {
    status: u16,
    location: String,
    body: String,
}

impl Got {
    /// The CSRF token of the first form on the page.
    fn csrf(&self) -> String {
        let at = self
            .body
            .find("name=\"csrf\" value=\"")
            .expect("a form with a csrf field");
        let rest = &self.body[at + 19..];
        rest[..rest.find('"').unwrap()].to_owned()
    }

    fn code(&self) -> String {
        let Some(at) = self.body.find("data-code=\"") else {
            return String::new();
        };
        let rest = &self.body[at + 11..];
        rest[..rest.find('"').unwrap()].to_owned()
    }
}

impl Browser {
    fn new(app: &TestApp) -> Browser {
        let addr = app
            .server
            .as_ref()
            .unwrap()
            .console_addr()
            .expect("console on");
        Browser {
            base: format!("http://{addr}"),
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            cookies: Vec::new(),
        }
    }

    fn cookie_header(&self) -> String {
        self.cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    async fn keep(&mut self, resp: reqwest::Response) -> Got {
        for v in resp.headers().get_all("set-cookie") {
            let v = v.to_str().unwrap();
            let pair = v.split(';').next().unwrap();
            let (k, val) = pair.split_once('=').unwrap();
            assert!(
                v.contains("HttpOnly") && v.contains("SameSite=Strict"),
                "{v}"
            );
            self.cookies.retain(|(name, _)| name != k);
            if !val.is_empty() && !v.contains("Max-Age=0") {
                self.cookies.push((k.to_owned(), val.to_owned()));
            }
        }
        Got {
            status: resp.status().as_u16(),
            location: resp
                .headers()
                .get("location")
                .map(|l| l.to_str().unwrap().to_owned())
                .unwrap_or_default(),
            body: resp.text().await.unwrap(),
        }
    }

    async fn get(&mut self, path: &str) -> Got {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .header("cookie", self.cookie_header())
            .send()
            .await
            .unwrap();
        self.keep(resp).await
    }

    async fn post(&mut self, path: &str, form: &[(&str, &str)]) -> Got {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .header("cookie", self.cookie_header())
            .form(form)
            .send()
            .await
            .unwrap();
        self.keep(resp).await
    }

    /// Uses a one-time link to set the password; signed in afterwards.
    async fn accept_link(&mut self, token: &str) -> Got {
        let page = self.get(&format!("/setup?token={token}")).await;
        assert_eq!(page.status, 200, "{}", page.body);
        self.post(
            "/setup",
            &[
                ("csrf", &page.csrf()),
                ("token", token),
                ("password", PASSWORD),
                ("confirm", PASSWORD),
            ],
        )
        .await
    }

    async fn sign_in(&mut self, email: &str, password: &str) -> Got {
        let page = self.get("/signin").await;
        self.post(
            "/signin",
            &[
                ("csrf", &page.csrf()),
                ("email", email),
                ("password", password),
            ],
        )
        .await
    }
}

fn console_on(c: &mut fastack_core::Config) {
    tweak(c);
    c.console_listen = Some("127.0.0.1:0".parse().unwrap());
}

async fn console_app(backend: Backend) -> Option<TestApp> {
    let db = Arc::new(TestDb::new(backend).await?);
    Some(spawn_with(db, fastack_api::StartOptions::default(), console_on).await)
}

/// A signed-in browser for a new user of `tenant`.
async fn signed_in(app: &TestApp, tenant: TenantId, email: &str, role: Role) -> Browser {
    let (_, token) = console::create_user(app.store.as_ref(), tenant, email, role, Utc::now())
        .await
        .unwrap();
    let mut b = Browser::new(app);
    let done = b.accept_link(token.as_str()).await;
    assert_eq!(done.status, 303, "{}", done.body);
    assert_eq!(done.location, "/endpoints");
    b
}

async fn link_sign_in_and_lockout(backend: Backend) {
    let Some(app) = console_app(backend).await else {
        return;
    };
    let (user, token) = console::create_user(
        app.store.as_ref(),
        app.t.tenant.id,
        "Ada@Example.com",
        Role::Owner,
        Utc::now(),
    )
    .await
    .unwrap();
    assert_eq!(user.email, "ada@example.com");
    assert!(!user.active);
    // The same email twice is a conflict.
    assert!(
        console::create_user(
            app.store.as_ref(),
            app.t.tenant.id,
            "ada@example.com",
            Role::Viewer,
            Utc::now()
        )
        .await
        .is_err()
    );

    let mut b = Browser::new(&app);
    // Nothing without a session: to the sign-in page.
    let home = b.get("/endpoints").await;
    assert_eq!((home.status, home.location.as_str()), (303, "/signin"));

    // The link's form refuses a short password and differing ones.
    let page = b.get(&format!("/setup?token={}", token.as_str())).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("ada@example.com"));
    let short = b
        .post(
            "/setup",
            &[
                ("csrf", &page.csrf()),
                ("token", token.as_str()),
                ("password", "short"),
                ("confirm", "short"),
            ],
        )
        .await;
    assert_eq!(short.status, 422, "{}", short.body);
    let differ = b
        .post(
            "/setup",
            &[
                ("csrf", &page.csrf()),
                ("token", token.as_str()),
                ("password", PASSWORD),
                ("confirm", "something else entirely"),
            ],
        )
        .await;
    assert_eq!(differ.status, 422);
    // Used once, it signs in …
    let done = b.accept_link(token.as_str()).await;
    assert_eq!(done.status, 303, "{}", done.body);
    let home = b.get("/endpoints").await;
    assert_eq!(home.status, 200);
    assert!(home.body.contains("ada@example.com (owner)"));
    // … and never again.
    let mut other = Browser::new(&app);
    let again = other.get(&format!("/setup?token={}", token.as_str())).await;
    assert_eq!(again.status, 404);
    assert_eq!(again.code(), "link_invalid");

    // Signing out ends this session only.
    let mut second = Browser::new(&app);
    assert_eq!(
        second.sign_in("ADA@example.com", PASSWORD).await.status,
        303
    );
    let out = b.post("/signout", &[("csrf", &home.csrf())]).await;
    assert_eq!((out.status, out.location.as_str()), (303, "/signin"));
    assert_eq!(b.get("/endpoints").await.status, 303);
    assert_eq!(second.get("/endpoints").await.status, 200);

    // A wrong password is refused like an unknown account …
    let wrong = b
        .sign_in("ada@example.com", "not the password at all")
        .await;
    assert_eq!(wrong.status, 401);
    let unknown = b.sign_in("nobody@example.com", PASSWORD).await;
    assert_eq!(unknown.status, 401);
    assert_eq!(
        wrong.body.replace(&wrong.csrf(), ""),
        unknown.body.replace(&unknown.csrf(), ""),
        "the same page for a wrong password and an unknown account"
    );
    // … and five in a row lock the account, even against the right one.
    for _ in 0..3 {
        assert_eq!(
            b.sign_in("ada@example.com", "wrong wrong wrong")
                .await
                .status,
            401
        );
    }
    let fifth = b.sign_in("ada@example.com", "wrong wrong wrong").await;
    assert_eq!(fifth.status, 429, "the fifth failure locks");
    let locked = b.sign_in("ada@example.com", PASSWORD).await;
    assert_eq!(locked.status, 429, "{}", locked.body);
    assert!(locked.body.contains("locked until"));

    // A new link (forgotten password) ends every session and unlocks.
    let (_, fresh) = console::reset_user(app.store.as_ref(), "ada@example.com", Utc::now())
        .await
        .unwrap();
    assert_eq!(
        second.get("/endpoints").await.status,
        303,
        "signed out everywhere"
    );
    assert_eq!(b.accept_link(fresh.as_str()).await.status, 303);
    assert_eq!(b.get("/endpoints").await.status, 200);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_link_works_once_and_wrong_passwords_lock_the_account() {
    link_sign_in_and_lockout(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_link_works_once_and_wrong_passwords_lock_the_account() {
    link_sign_in_and_lockout(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forms_need_the_sessions_token_and_this_origin() {
    let Some(app) = console_app(Backend::Sqlite).await else {
        return;
    };
    let mut b = signed_in(&app, app.t.tenant.id, "owner@acme.test", Role::Owner).await;
    let mut other = signed_in(&app, app.t.tenant.id, "other@acme.test", Role::Owner).await;
    let page = b.get("/keys").await;
    let theirs = other.get("/keys").await.csrf();
    for (token, why) in [
        ("", "no token"),
        ("00ff", "a forged token"),
        (theirs.as_str(), "another session's token"),
    ] {
        let r = b.post("/keys", &[("csrf", token)]).await;
        assert_eq!(
            (r.status, r.code()),
            (403, "csrf_failed".to_owned()),
            "{why}"
        );
    }
    // The right token from another site's page is refused too.
    let cross = b
        .http
        .post(format!("{}/keys", b.base))
        .header("cookie", b.cookie_header())
        .header("origin", "https://evil.example")
        .form(&[("csrf", page.csrf())])
        .send()
        .await
        .unwrap();
    assert_eq!(cross.status().as_u16(), 403);
    assert_eq!(
        app.store.keys().list(app.t.tenant.id).await.unwrap().len(),
        1,
        "no key made"
    );
    let made = b.post("/keys", &[("csrf", &page.csrf())]).await;
    assert_eq!(made.status, 200, "{}", made.body);
    assert!(made.body.contains("shown only once"));
    assert_eq!(
        app.store.keys().list(app.t.tenant.id).await.unwrap().len(),
        2
    );

    // The sign-in form is bound to its own cookie: a form posted from
    // elsewhere (no cookie) cannot sign a browser in.
    let mut fresh = Browser::new(&app);
    let r = fresh
        .post(
            "/signin",
            &[
                ("csrf", "deadbeef"),
                ("email", "owner@acme.test"),
                ("password", PASSWORD),
            ],
        )
        .await;
    assert_eq!(r.status, 403);
    // Every page says: no framing, no referrer, no caching, scripts from here.
    let resp = reqwest::get(format!("{}/signin", fresh.base))
        .await
        .unwrap();
    let h = resp.headers();
    assert_eq!(h["x-frame-options"], "DENY");
    assert_eq!(h["referrer-policy"], "same-origin");
    assert_eq!(h["cache-control"], "no-store");
    assert!(
        h["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("frame-ancestors 'none'")
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_sees_only_their_tenant_and_a_viewer_changes_nothing() {
    let Some(app) = console_app(Backend::Sqlite).await else {
        return;
    };
    let rx = Receiver::start(&[Reply::Status(500), Reply::Status(500), Reply::Status(500)]).await;
    let (acme_ep, _) = register(&app, &rx.url(), &["core.event.tracked"]).await;
    let other = make_tenant(&app.store, "globex", Plan::Pro, None).await;
    let mut b = signed_in(&app, other.tenant.id, "owner@globex.test", Role::Owner).await;
    let page = b.get("/endpoints").await;
    assert!(
        !page.body.contains(&acme_ep),
        "another tenant's endpoint is not listed"
    );
    let r = b.get(&format!("/endpoints/{acme_ep}")).await;
    assert_eq!(r.status, 404, "another tenant's endpoint is not found");
    for action in ["rotate", "disable", "delete", "replay-failed"] {
        let r = b
            .post(
                &format!("/endpoints/{acme_ep}/{action}"),
                &[("csrf", &page.csrf()), ("since", "2026-01-01T00:00")],
            )
            .await;
        assert_eq!(r.status, 404, "{action}");
    }
    send(&app, "c-1").await;
    let d = eventually("a delivery", Duration::from_secs(10), || async {
        deliveries(&app, &acme_ep).await.into_iter().next()
    })
    .await;
    let id = d["id"].as_str().unwrap();
    let r = b
        .post(
            &format!("/deliveries/{id}/replay"),
            &[("csrf", &page.csrf())],
        )
        .await;
    assert_eq!(r.status, 404);
    let acme_key = app.store.keys().list(app.t.tenant.id).await.unwrap()[0].id;
    let r = b
        .post(
            &format!("/keys/{acme_key}/revoke"),
            &[("csrf", &page.csrf())],
        )
        .await;
    assert_eq!(r.status, 404);
    assert!(
        app.store.keys().list(app.t.tenant.id).await.unwrap()[0]
            .revoked_at
            .is_none()
    );
    let ep = app
        .store
        .endpoints()
        .get(acme_ep.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(ep.enabled, "untouched");

    // A viewer of acme reads the endpoint and its log, changes nothing.
    let mut v = signed_in(&app, app.t.tenant.id, "viewer@acme.test", Role::Viewer).await;
    let list = v.get("/endpoints").await;
    assert_eq!(list.status, 200);
    assert!(list.body.contains(&acme_ep));
    assert!(
        !list.body.contains("Add an endpoint"),
        "no add form for a viewer"
    );
    let detail = v.get(&format!("/endpoints/{acme_ep}")).await;
    assert_eq!(detail.status, 200);
    assert!(
        !detail.body.contains("Replay"),
        "no replay controls for a viewer"
    );
    let csrf = list.csrf();
    let add = v
        .post(
            "/endpoints",
            &[
                ("csrf", &csrf),
                ("url", &rx.url()),
                ("events", "job.completed"),
            ],
        )
        .await;
    assert_eq!((add.status, add.code()), (403, "owner_only".to_owned()));
    let r = v
        .post(&format!("/deliveries/{id}/replay"), &[("csrf", &csrf)])
        .await;
    assert_eq!(r.status, 403);
    for page in ["/keys", "/quarantine"] {
        assert_eq!(v.get(page).await.status, 403, "{page}");
    }
    assert_eq!(
        app.store
            .endpoints()
            .list(Some(app.t.tenant.id))
            .await
            .unwrap()
            .len(),
        1
    );

    // An API key never opens the console, a console cookie never calls the
    // API.
    let with_key = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(format!("{}/endpoints", v.base))
        .bearer_auth(&app.t.key)
        .send()
        .await
        .unwrap();
    assert_eq!(with_key.status().as_u16(), 303);
    let api = app
        .http
        .get(app.url("/v1/core/jobs"))
        .header("cookie", v.cookie_header())
        .send()
        .await
        .unwrap();
    assert_eq!(api.status().as_u16(), 401);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_end_when_idle_or_old_and_everywhere_at_once() {
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let clock = ManualClock::new(Utc::now());
    let options = fastack_api::StartOptions {
        clock: clock.clone(),
        ..Default::default()
    };
    let app = spawn_with(Arc::new(db), options, console_on).await;
    let (_, token) = console::create_user(
        app.store.as_ref(),
        app.t.tenant.id,
        "ada@acme.test",
        Role::Owner,
        clock.now(),
    )
    .await
    .unwrap();
    let mut a = Browser::new(&app);
    assert_eq!(a.accept_link(token.as_str()).await.status, 303);
    // Active every hour, it lasts past the idle limit …
    for _ in 0..3 {
        clock.advance(chrono::Duration::minutes(61));
        assert_eq!(a.get("/endpoints").await.status, 200);
    }
    // … but an idle one ends after two hours …
    clock.advance(chrono::Duration::minutes(121));
    assert_eq!(a.get("/endpoints").await.status, 303);
    // … and an active one at twelve hours.
    assert_eq!(a.sign_in("ada@acme.test", PASSWORD).await.status, 303);
    for _ in 0..11 {
        clock.advance(chrono::Duration::minutes(60));
        assert_eq!(a.get("/endpoints").await.status, 200);
    }
    clock.advance(chrono::Duration::minutes(61));
    assert_eq!(a.get("/endpoints").await.status, 303);

    // Sign out everywhere ends every browser's session.
    let mut b = Browser::new(&app);
    assert_eq!(a.sign_in("ada@acme.test", PASSWORD).await.status, 303);
    assert_eq!(b.sign_in("ada@acme.test", PASSWORD).await.status, 303);
    let page = a.get("/endpoints").await;
    let out = a
        .post("/signout-everywhere", &[("csrf", &page.csrf())])
        .await;
    assert_eq!(out.status, 303);
    assert_eq!(b.get("/endpoints").await.status, 303);
    assert_eq!(a.get("/endpoints").await.status, 303);
    app.cleanup().await;
}

fn body(hit: &crate::webhooks::Hit) -> Value {
    serde_json::from_slice(&hit.body).unwrap()
}

async fn replay_and_notifications(backend: Backend) {
    let Some(app) = console_app(backend).await else {
        return;
    };
    // Three failures exhaust the first delivery; then the receiver is fixed.
    let rx = Receiver::start(&[Reply::Status(500), Reply::Status(500), Reply::Status(500)]).await;
    let ops = Receiver::start(&[]).await;
    let (_, ops_secret) = register(
        &app,
        &ops.url(),
        &["endpoint.disabled", "delivery.exhausted"],
    )
    .await;
    let mut b = signed_in(&app, app.t.tenant.id, "ada@acme.test", Role::Owner).await;
    let page = b.get("/endpoints").await;
    let added = b
        .post(
            "/endpoints",
            &[
                ("csrf", &page.csrf()),
                ("url", &rx.url()),
                ("events", "core.event.tracked"),
            ],
        )
        .await;
    assert_eq!(added.status, 200, "{}", added.body);
    let secret = {
        let at = added.body.find("whsec_").expect("the secret is shown");
        added.body[at..at + added.body[at..].find('"').unwrap()].to_owned()
    };
    let endpoint = app
        .store
        .endpoints()
        .list(Some(app.t.tenant.id))
        .await
        .unwrap();
    let endpoint = endpoint.iter().find(|e| e.url == rx.url()).unwrap().id;
    // The secret is shown once: the endpoint's page does not have it.
    let detail = b.get(&format!("/endpoints/{endpoint}")).await;
    assert!(!detail.body.contains(&secret));

    send(&app, "r-1").await;
    rx.wait_hits(3, Duration::from_secs(25)).await;
    let failed = eventually("the delivery fails", Duration::from_secs(10), || async {
        let d = deliveries(&app, &endpoint.to_string()).await;
        (d.first().is_some_and(|d| d["status"] == "failed")).then(|| d[0].clone())
    })
    .await;
    let webhook_id = failed["webhook_id"].as_str().unwrap().to_owned();
    // The operations endpoint heard about it, signed like every delivery.
    let note = ops.wait_hits(1, Duration::from_secs(10)).await;
    verify_independently(&ops_secret, &note[0]);
    assert_eq!(note[0].header("webhook-event"), "delivery.exhausted");
    let n = body(&note[0]);
    assert_eq!(n["webhook_id"], webhook_id.as_str());
    assert_eq!(n["endpoint_id"], endpoint.to_string());
    assert_eq!(n["attempts"], 3);
    assert_eq!(n["last_status_code"], 500);

    // The log filters by status, and a replay sends the same webhook-id.
    let log = b.get(&format!("/endpoints/{endpoint}?status=failed")).await;
    assert!(log.body.contains(&webhook_id), "{}", log.body);
    let none = b
        .get(&format!("/endpoints/{endpoint}?status=delivered"))
        .await;
    assert!(!none.body.contains(&webhook_id));
    let id = failed["id"].as_str().unwrap();
    // The replayed attempt is held open by the receiver, so the delivery is
    // certainly still in flight when it is replayed again.
    rx.script(&[Reply::Hang(Duration::from_millis(1500))]);
    let r = b
        .post(
            &format!("/deliveries/{id}/replay"),
            &[("csrf", &log.csrf())],
        )
        .await;
    assert_eq!(r.status, 303);
    assert!(r.location.contains("notice=replayed"), "{}", r.location);
    let hits = rx.wait_hits(4, Duration::from_secs(10)).await;
    assert_eq!(hits[3].header("webhook-id"), webhook_id);
    // A second replay while the first is in flight does nothing.
    let again = b
        .post(
            &format!("/deliveries/{id}/replay"),
            &[("csrf", &log.csrf())],
        )
        .await;
    assert!(
        again.location.contains("already_pending"),
        "{}",
        again.location
    );
    verify_independently(&secret, &hits[3]);
    eventually(
        "the replay is recorded",
        Duration::from_secs(10),
        || async {
            let d = deliveries(&app, &endpoint.to_string()).await;
            (d[0]["status"] == "delivered").then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rx.hits().len(), 4, "replayed once");

    // "All failed since": two more fail, both come back with their ids.
    rx.script(&[Reply::Status(500); 6]);
    let since = Utc::now() - chrono::Duration::seconds(1);
    send(&app, "r-2").await;
    send(&app, "r-3").await;
    rx.wait_hits(10, Duration::from_secs(30)).await;
    let failed: Vec<String> = eventually("both fail", Duration::from_secs(10), || async {
        let d = deliveries(&app, &endpoint.to_string()).await;
        let f: Vec<String> = d
            .iter()
            .filter(|d| d["status"] == "failed")
            .map(|d| d["webhook_id"].as_str().unwrap().to_owned())
            .collect();
        (f.len() == 2).then_some(f)
    })
    .await;
    let page = b.get(&format!("/endpoints/{endpoint}")).await;
    let r = b
        .post(
            &format!("/endpoints/{endpoint}/replay-failed"),
            &[
                ("csrf", &page.csrf()),
                ("since", &since.format("%Y-%m-%dT%H:%M:%S").to_string()),
            ],
        )
        .await;
    assert_eq!(r.status, 303);
    assert!(r.location.contains("n=2"), "{}", r.location);
    let hits = rx.wait_hits(12, Duration::from_secs(10)).await;
    let mut replayed: Vec<String> = hits[10..].iter().map(|h| h.header("webhook-id")).collect();
    replayed.sort();
    let mut expected = failed.clone();
    expected.sort();
    assert_eq!(replayed, expected);

    // Disabling in the console tells the operations endpoint too.
    let before = ops.hits().len();
    let page = b.get(&format!("/endpoints/{endpoint}")).await;
    let r = b
        .post(
            &format!("/endpoints/{endpoint}/disable"),
            &[("csrf", &page.csrf())],
        )
        .await;
    assert_eq!(r.status, 303);
    let hits = ops.wait_hits(before + 1, Duration::from_secs(10)).await;
    let last = hits.last().unwrap();
    assert_eq!(last.header("webhook-event"), "endpoint.disabled");
    let n = body(last);
    assert_eq!(n["endpoint_id"], endpoint.to_string());
    assert!(n["reason"].as_str().unwrap().contains("ada@acme.test"));
    // A disabled endpoint is not replayed to.
    let r = b
        .post(
            &format!("/deliveries/{id}/replay"),
            &[("csrf", &page.csrf())],
        )
        .await;
    assert_eq!(r.status, 409);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_replays_keep_their_webhook_id_and_trouble_is_notified() {
    replay_and_notifications(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_replays_keep_their_webhook_id_and_trouble_is_notified() {
    replay_and_notifications(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_endpoint_is_announced_once() {
    let Some(app) = console_app(Backend::Sqlite).await else {
        return;
    };
    let gone = Receiver::start(&[Reply::Status(410); 4]).await;
    let ops = Receiver::start(&[]).await;
    let (gone_id, _) = register(&app, &gone.url(), &["core.event.tracked"]).await;
    register(
        &app,
        &ops.url(),
        &["endpoint.disabled", "delivery.exhausted"],
    )
    .await;
    send(&app, "g-1").await;
    send(&app, "g-2").await;
    let hits = ops.wait_hits(1, Duration::from_secs(10)).await;
    assert_eq!(hits[0].header("webhook-event"), "endpoint.disabled");
    let n = body(&hits[0]);
    assert_eq!(n["endpoint_id"], gone_id.as_str());
    assert!(n["reason"].as_str().unwrap().contains("410"), "{n}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        ops.hits().len(),
        1,
        "one notice, no delivery.exhausted for a retired endpoint"
    );
    app.cleanup().await;
}

/// An owner retries one quarantined event (readable afterwards under its
/// id) and drops the other; a viewer's quarantine page is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_retries_and_drops_quarantined_events() {
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let faults = fastack_core::faults::Faults::new();
    let options = fastack_api::StartOptions {
        faults: faults.clone(),
        ..Default::default()
    };
    let app = spawn_with(Arc::new(db), options, console_on).await;
    faults.fail_processing_of("poison-a");
    faults.fail_processing_of("poison-b");
    let now = Utc::now();
    let mut ids = Vec::new();
    for key in ["poison-a", "poison-b"] {
        let a = app
            .post(
                "/v1/core/track",
                &app.t.key,
                &crate::helpers::track(key, "u", now),
            )
            .await;
        assert_eq!(a.status, 202, "{}", a.body);
        ids.push(a.body["id"].as_str().unwrap().to_owned());
    }
    let mut b = signed_in(&app, app.t.tenant.id, "ada@acme.test", Role::Owner).await;
    eventually("both in quarantine", Duration::from_secs(30), || async {
        let tenant = app.t.tenant.id;
        (app.store.quarantine().list(tenant, 10).await.unwrap().len() == 2).then_some(())
    })
    .await;
    let page = b.get("/quarantine").await;
    assert_eq!(page.status, 200);
    assert!(
        ids.iter().all(|id| page.body.contains(id.as_str())),
        "both listed"
    );
    faults.clear();
    let r = b
        .post(
            &format!("/quarantine/{}/retry", ids[0]),
            &[("csrf", &page.csrf())],
        )
        .await;
    assert_eq!(
        (r.status, r.location.as_str()),
        (303, "/quarantine?notice=retried")
    );
    let r = b
        .post(
            &format!("/quarantine/{}/drop", ids[1]),
            &[("csrf", &page.csrf())],
        )
        .await;
    assert_eq!(r.status, 303);
    let from = (now - chrono::Duration::hours(1)).to_rfc3339();
    let to = (now + chrono::Duration::hours(1)).to_rfc3339();
    eventually(
        "the retried event readable",
        Duration::from_secs(30),
        || async {
            let events = app.events(&app.t.key, &from, &to, "").await;
            events
                .iter()
                .any(|e| e["id"] == ids[0].as_str())
                .then_some(())
        },
    )
    .await;
    assert!(
        app.store
            .quarantine()
            .list(app.t.tenant.id, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let events = app.events(&app.t.key, &from, &to, "").await;
    assert!(
        !events.iter().any(|e| e["id"] == ids[1].as_str()),
        "the dropped one is gone"
    );
    let mut v = signed_in(&app, app.t.tenant.id, "viewer@acme.test", Role::Viewer).await;
    assert_eq!(v.get("/quarantine").await.status, 403);
    app.cleanup().await;
}

/// The console speaks to the tenant's user: a refused address comes back on
/// the same page, the address kept, in words without the operator's
/// settings (those go to the log); error pages say what happened and what
/// to do, keep the navigation, and the navigation marks where one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_speaks_to_the_tenants_user() {
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    let app = spawn_with(Arc::new(db), fastack_api::StartOptions::default(), |c| {
        console_on(c);
        crate::webhooks::allow_private(c, false);
    })
    .await;
    let mut b = signed_in(&app, app.t.tenant.id, "owner@acme.test", Role::Owner).await;
    let page = b.get("/endpoints").await;
    assert!(
        page.body
            .contains(r#"<a href="/endpoints" aria-current="page">Notifications</a>"#),
        "{}",
        page.body
    );
    assert!(page.body.contains(r#"<a href="/jobs">Jobs</a>"#));
    let url = "http://127.0.0.1:9/hooks";
    let r = b
        .post(
            "/endpoints",
            &[
                ("csrf", &page.csrf()),
                ("url", url),
                ("events", "job.completed"),
            ],
        )
        .await;
    assert_eq!(r.status, 422);
    assert_eq!(r.code(), "invalid_endpoint");
    assert!(
        r.body
            .contains("fastack cannot send to this address: it is on a private or local network"),
        "{}",
        r.body
    );
    assert!(
        !r.body.contains("FASTACK_"),
        "an operator's setting shown to a user"
    );
    assert!(!r.body.contains("Unprocessable Entity"));
    assert!(
        r.body.contains(&format!(r#"value="{url}""#)),
        "the address is kept"
    );
    assert!(
        r.body.contains(r#"aria-current="page""#),
        "the navigation stays"
    );
    // An error page: the user's words, the way on.
    let r = b.get("/endpoints/not-an-id").await;
    assert_eq!(r.status, 404);
    assert!(
        r.body
            .contains("<title>Not found · fastack console</title>"),
        "{}",
        r.body
    );
    assert!(r.body.contains("It may have been deleted"));
    assert!(r.body.contains(r#"<a href="/plan">Tracking plan</a>"#));
    // A page inside a section marks the section.
    let r = b.get("/keys").await;
    assert!(
        r.body
            .contains(r#"<a href="/keys" aria-current="page">API keys</a>"#)
    );
    // On a phone a row is a card: each cell carries its column's name.
    assert!(r.body.contains(r#"data-label="Prefix""#), "{}", r.body);
    app.cleanup().await;
}

/// An owner erases a person from the Privacy page (a refused form says
/// why), reads the certificate and downloads it, and lifts the
/// suppression the erasure set; a viewer is refused the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_forgets_a_person_from_the_privacy_page() {
    let Some(app) = console_app(Backend::Sqlite).await else {
        return;
    };
    let now = Utc::now();
    let a = app
        .post(
            "/v1/core/track",
            &app.t.key,
            &crate::helpers::track("priv-1", "u-priv", now),
        )
        .await;
    assert_eq!(a.status, 202, "{}", a.body);
    let from = (now - chrono::Duration::hours(1)).to_rfc3339();
    let to = (now + chrono::Duration::hours(1)).to_rfc3339();
    eventually("the event readable", Duration::from_secs(30), || async {
        (app.events(&app.t.key, &from, &to, "").await.len() == 1).then_some(())
    })
    .await;
    let mut b = signed_in(&app, app.t.tenant.id, "dpo@acme.test", Role::Owner).await;
    let page = b.get("/privacy").await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("Request an erasure"));
    let refused = b.post("/privacy", &[("csrf", &page.csrf())]).await;
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert!(
        refused.body.contains("name at least one person"),
        "{}",
        refused.body
    );
    let r = b
        .post(
            "/privacy",
            &[
                ("csrf", &page.csrf()),
                ("user_ids", "u-priv\n"),
                ("suppress", "on"),
            ],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.body);
    assert!(r.location.starts_with("/privacy/"), "{}", r.location);
    let at = r.location.clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let done = loop {
        let p = b.get(&at).await;
        if p.body.contains("Download the certificate") {
            break p;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no certificate: {}",
            p.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(done.body.contains("Verification"), "{}", done.body);
    let file = b.get(&format!("{at}/certificate")).await;
    assert_eq!(file.status, 200);
    let doc: Value = serde_json::from_str(&file.body).unwrap();
    assert_eq!(doc["kind"], "erasure");
    assert_eq!(doc["metadata"]["requested_by"], "dpo@acme.test");
    assert_eq!(
        doc["result"]["stores"]["tracked_events"]["events_removed"],
        1
    );
    assert!(app.events(&app.t.key, &from, &to, "").await.is_empty());
    // The suppression it set, shown by hash and lifted.
    let page = b.get("/privacy").await;
    let hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"u-priv"));
    assert!(page.body.contains(&hash), "{}", page.body);
    assert!(!page.body.contains("u-priv"));
    let r = b
        .post(
            "/privacy/suppressions/lift",
            &[
                ("csrf", &page.csrf()),
                ("kind", "user_id"),
                ("sha256", &hash),
            ],
        )
        .await;
    assert_eq!(
        (r.status, r.location.as_str()),
        (303, "/privacy?notice=lifted")
    );
    assert!(
        b.get("/privacy")
            .await
            .body
            .contains("Nothing is suppressed.")
    );
    let mut v = signed_in(&app, app.t.tenant.id, "viewer@acme.test", Role::Viewer).await;
    assert_eq!(v.get("/privacy").await.status, 403);
    app.cleanup().await;
}
