//! The console's pages, server-rendered with maud (escaped by default).
//! Every form that changes something carries the session's CSRF token;
//! controls a viewer may not use are not shown to them (and refused if
//! submitted anyway).

use std::collections::HashMap;

use chrono::{DateTime, SecondsFormat, Utc};
use fastack_core::console::User;
use fastack_core::domain::Suppression;
use fastack_entities::{
    ApiKey, Delivery, DeliveryStatus, Endpoint, EndpointId, Job, JobKind, JobStatus, PlanVersion,
    QuarantinedEvent, webhook::EVENT_TYPES,
};
use maud::{DOCTYPE, Markup, html};
use poem::{IntoResponse, Response, http::StatusCode, web::Redirect};
use serde_json::Value;

use super::guard::{Fail, Me};

/// A refusal as the browser sees it: to the sign-in page, or a page that
/// says why.
impl IntoResponse for Fail {
    fn into_response(self) -> Response {
        match self {
            Fail::SignIn => Redirect::see_other("/signin").into_response(),
            Fail::Page {
                status,
                code,
                message,
            } => html(status, error_page(status, code, &message)),
        }
    }
}

impl From<Fail> for poem::Error {
    fn from(f: Fail) -> Self {
        poem::Error::from_response(f.into_response())
    }
}

/// A page as a response: HTML, never cached (pages show secrets once).
pub fn html(status: StatusCode, page: Markup) -> Response {
    Response::builder()
        .status(status)
        .content_type("text/html; charset=utf-8")
        .body(page.into_string())
}

fn when(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
        .replace('T', " ")
        .replace('Z', " UTC")
}

/// The frame of every page: navigation for a signed-in user.
fn layout(title: &str, me: Option<&Me>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · fastack console" }
                link rel="stylesheet" href="/static/console.css";
                script src="/static/console.js" defer {}
            }
            body {
                a.skip href="#main" { "Skip to content" }
                header {
                    span.brand { "fastack" }
                    @if let Some(me) = me {
                        nav aria-label="Console" {
                            @for (href, label, owners) in SECTIONS {
                                @if !owners || me.is_owner() {
                                    a href=(href) aria-current=[in_section(&me.path, href).then_some("page")] { (label) }
                                }
                            }
                        }
                        div.who {
                            span { (me.user().email) " (" (me.user().role) ")" }
                            form method="post" action="/signout" {
                                (csrf(me))
                                button.link type="submit" { "Sign out" }
                            }
                            form method="post" action="/signout-everywhere" {
                                (csrf(me))
                                button.link type="submit" title="End every session of this account, on every device" { "Sign out everywhere" }
                            }
                        }
                    }
                }
                main #main tabindex="-1" {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// The console's sections: where, what the navigation calls it, owners only.
const SECTIONS: [(&str, &str, bool); 6] = [
    ("/endpoints", "Notifications", false),
    ("/jobs", "Jobs", false),
    ("/quarantine", "Quarantine", true),
    ("/keys", "API keys", true),
    ("/plan", "Tracking plan", false),
    ("/privacy", "Privacy", true),
];

/// Whether `path` is the section `href` or a page inside it.
fn in_section(path: &str, href: &str) -> bool {
    path == href
        || path
            .strip_prefix(href)
            .is_some_and(|rest| rest.starts_with('/'))
}

fn csrf(me: &Me) -> Markup {
    html! { input type="hidden" name="csrf" value=(me.csrf); }
}

fn notice(text: Option<&str>) -> Markup {
    html! {
        @if let Some(t) = text {
            p.notice role="status" { (t) }
        }
    }
}

/// A page for what could not be done, in the words of the person using the
/// console: what happened and what they can do (the operator's detail is
/// in the server log). The navigation stays, so nobody is stranded.
pub fn error_page(status: StatusCode, code: &str, message: &str) -> Markup {
    let (title, next) = match status.as_u16() {
        400 | 422 => (
            "Please check what you entered",
            "Go back, correct it and send it again.",
        ),
        401 => ("Please sign in", "Your session has ended; sign in again."),
        403 => (
            "Not allowed",
            "An owner of your account can do this, or ask your fastack operator.",
        ),
        404 => (
            "Not found",
            "It may have been deleted, or the link is out of date.",
        ),
        409 => ("Not possible right now", "Wait a moment and try again."),
        429 => ("Too many attempts", "Wait a moment and try again."),
        _ => (
            "Something went wrong",
            "Try again in a moment; if it keeps happening, tell your fastack operator.",
        ),
    };
    layout(
        title,
        None,
        html! {
            p.error role="alert" data-code=(code) { (message) }
            p { (next) }
            nav.back aria-label="Console" {
                @for (href, label, _) in SECTIONS {
                    a href=(href) { (label) }
                }
            }
        },
    )
}

/// What a delivery attempt's error kind means, for the delivery log.
fn error_words(kind: &str) -> &'static str {
    match kind {
        "refused_address" => "not sent: the address is on a private network",
        "timeout" => "no answer within 10 s",
        "connect" => "could not connect",
        "http_status" => "the receiver answered an error",
        "request" => "the request failed",
        _ => "failed",
    }
}

pub fn sign_in(csrf: &str, error: Option<&str>) -> Markup {
    layout(
        "Sign in",
        None,
        html! {
            @if let Some(e) = error { p.error role="alert" { (e) } }
            form.card method="post" action="/signin" {
                input type="hidden" name="csrf" value=(csrf);
                label for="email" { "Email" }
                input #email type="email" name="email" autocomplete="username" required autofocus;
                label for="password" { "Password" }
                input #password type="password" name="password" autocomplete="current-password" required;
                button type="submit" { "Sign in" }
            }
            p.hint { "No password yet, or forgot it? Ask your fastack operator for a sign-in link." }
        },
    )
}

pub fn set_password(csrf: &str, token: &str, user: &User, error: Option<&str>) -> Markup {
    layout(
        "Set your password",
        None,
        html! {
            p { "Signing in as " strong { (user.email) } "." }
            @if let Some(e) = error { p.error role="alert" { (e) } }
            form.card method="post" action="/setup" {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="token" value=(token);
                // For password managers: whose password this is.
                input type="email" name="username" value=(user.email) autocomplete="username" readonly hidden;
                label for="password" { "New password (at least 12 characters)" }
                input #password type="password" name="password" minlength="12" autocomplete="new-password" required autofocus;
                label for="confirm" { "Repeat it" }
                input #confirm type="password" name="confirm" minlength="12" autocomplete="new-password" required;
                button type="submit" { "Set password and sign in" }
            }
        },
    )
}

fn status_badge(s: DeliveryStatus) -> Markup {
    html! { span class={"badge " (s.as_str())} { (s.as_str()) } }
}

pub fn endpoints(
    me: &Me,
    list: &[Endpoint],
    last: &HashMap<EndpointId, DeliveryStatus>,
    note: Option<&str>,
    refused: Option<&str>,
    entered: Option<&str>,
) -> Markup {
    layout(
        "Notifications",
        Some(me),
        html! {
            (notice(note))
            p { "Where fastack sends your events. Each delivery is signed (Standard Webhooks) with the endpoint's secret." }
            @if list.is_empty() {
                p.empty { "No endpoint yet." }
            } @else {
                div.scroll { table {
                    thead { tr { th scope="col" { "URL" } th scope="col" { "Events" } th scope="col" { "State" } th scope="col" { "Last delivery" } } }
                    tbody {
                        @for e in list {
                            tr {
                                td data-label="URL" { a href={"/endpoints/" (e.id)} { (e.url) } }
                                td data-label="Events" { (e.events.join(", ")) }
                                td data-label="State" { @if e.enabled { "enabled" } @else { "disabled" @if let Some(r) = &e.disabled_reason { br; small { (r) } } } }
                                td data-label="Last delivery" { @match last.get(&e.id) { Some(s) => (status_badge(*s)), None => "none yet" } }
                            }
                        }
                    }
                } }
            }
            @if me.is_owner() {
                h2 { "Add an endpoint" }
                form.card method="post" action="/endpoints" {
                    (csrf(me))
                    @if let Some(e) = refused { p.error role="alert" data-code="invalid_endpoint" { (e) } }
                    label for="url" { "URL" }
                    input #url type="url" name="url" placeholder="https://hooks.example.com/fastack" value=[entered] required aria-describedby="url-hint";
                    small #url-hint .hint { "An address your receiver answers on from the internet; https:// is recommended (http:// is accepted)." }
                    fieldset {
                        legend { "Events" }
                        @for t in EVENT_TYPES {
                            label.check {
                                input type="checkbox" name="events" value=(t) checked[t.starts_with("job.")];
                                " " (t)
                            }
                        }
                    }
                    button type="submit" { "Add endpoint" }
                }
            }
        },
    )
}

/// The page that shows a signing secret, once.
pub fn secret_shown(
    me: &Me,
    endpoint: &Endpoint,
    secret: &str,
    rotated: bool,
    warning: Option<&str>,
) -> Markup {
    layout(
        if rotated {
            "New signing secret"
        } else {
            "Endpoint added"
        },
        Some(me),
        html! {
            p { "Endpoint " code { (endpoint.url) } }
            p.warning role="alert" {
                strong { "Copy this secret now: it is shown only once." }
                @if rotated { " The previous secret keeps signing alongside it for 24 hours, so you can switch your receiver without losing deliveries." }
            }
            @if let Some(w) = warning { p.warning { (w) } }
            label for="secret" { "Signing secret" }
            div.copy {
                input #secret type="text" readonly value=(secret) data-secret;
                button type="button" data-copy="secret" { "Copy" }
            }
            p { a href={"/endpoints/" (endpoint.id)} { "Go to the endpoint" } }
        },
    )
}

pub fn endpoint(
    me: &Me,
    e: &Endpoint,
    deliveries: &[Delivery],
    filter: Option<DeliveryStatus>,
    note: Option<&str>,
) -> Markup {
    layout(
        "Endpoint",
        Some(me),
        html! {
            (notice(note))
            dl.facts {
                dt { "URL" } dd { code { (e.url) } }
                dt { "Events" } dd { (e.events.join(", ")) }
                dt { "State" } dd { @if e.enabled { "enabled" } @else { "disabled" @if let Some(r) = &e.disabled_reason { " — " (r) } } }
                @if let Some(until) = &e.previous_secret_until {
                    dt { "Previous secret" } dd { "signs too until " (when(until)) }
                }
            }
            @if me.is_owner() {
                div.actions {
                    form method="post" action={"/endpoints/" (e.id) "/rotate"} { (csrf(me)) button type="submit" { "Rotate secret" } }
                    @if e.enabled {
                        form method="post" action={"/endpoints/" (e.id) "/test"} { (csrf(me)) button type="submit" { "Send test message" } }
                        form method="post" action={"/endpoints/" (e.id) "/disable"} { (csrf(me)) button type="submit" { "Disable" } }
                    } @else {
                        form method="post" action={"/endpoints/" (e.id) "/enable"} { (csrf(me)) button type="submit" { "Enable" } }
                    }
                    form method="post" action={"/endpoints/" (e.id) "/delete"} data-confirm="Delete this endpoint and its delivery log?" { (csrf(me)) button.danger type="submit" { "Delete" } }
                }
                form.card.inline method="post" action={"/endpoints/" (e.id) "/replay-failed"} {
                    (csrf(me))
                    @if let Some(s) = filter { input type="hidden" name="status" value=(s.as_str()); }
                    label for="since" { "Replay all failed deliveries since (UTC)" }
                    input #since type="text" name="since" required placeholder="2026-12-01 09:30:00 UTC"
                        pattern=r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(:\d{2})?( UTC|Z)?" aria-describedby="since-hint";
                    small #since-hint .hint { "As the times below: YYYY-MM-DD HH:MM[:SS] UTC." }
                    button type="submit" { "Replay failed" }
                }
            }
            h2 { "Deliveries" }
            nav.filters aria-label="Filter deliveries" {
                a href={"/endpoints/" (e.id)} aria-current=[filter.is_none().then_some("page")] { "All" }
                @for s in [DeliveryStatus::Pending, DeliveryStatus::Delivered, DeliveryStatus::Failed] {
                    a href={"/endpoints/" (e.id) "?status=" (s.as_str())} aria-current=[(filter == Some(s)).then_some("page")] { (s.as_str()) }
                }
            }
            @if deliveries.is_empty() {
                p.empty { "No delivery" @if let Some(s) = filter { " " (s.as_str()) } "." }
            } @else {
                div.scroll { table.log {
                    thead { tr {
                        th scope="col" { "Created" } th scope="col" { "Event" } th scope="col" { "Status" }
                        th scope="col" { "Attempts (time · HTTP status · latency · error)" } th scope="col" { span.sr { "Actions" } }
                    } }
                    tbody {
                        @for d in deliveries {
                            tr data-delivery=(d.id) data-status=(d.status.as_str()) {
                                td data-label="Created" { (when(&d.created_at)) br; small.mono { (d.webhook_id) } }
                                td data-label="Event" { (d.event_type) }
                                td data-label="Status" { (status_badge(d.status)) }
                                td data-label="Attempts" {
                                    @if d.attempts.is_empty() { "none yet" }
                                    ol.attempts {
                                        @for a in &d.attempts {
                                            li {
                                                (when(&a.attempted_at)) " · "
                                                @match a.status_code { Some(c) => (c), None => "no answer" }
                                                " · " (a.latency_ms) " ms"
                                                @if let Some(k) = &a.error_kind { " · " span data-error-kind=(k) title=(k) { (error_words(k)) } }
                                            }
                                        }
                                    }
                                }
                                td {
                                    @if me.is_owner() && d.status != DeliveryStatus::Pending && e.enabled {
                                        form method="post" action={"/deliveries/" (d.id) "/replay"} {
                                            (csrf(me))
                                            @if let Some(s) = filter { input type="hidden" name="status" value=(s.as_str()); }
                                            button type="submit" { "Replay" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                } }
            }
        },
    )
}

pub fn jobs(me: &Me, list: &[Job]) -> Markup {
    layout(
        "Jobs",
        Some(me),
        html! {
            @if list.is_empty() {
                p.empty { "No job yet. Exports are started through the API." }
            } @else {
                div.scroll { table {
                    thead { tr { th scope="col" { "Created" } th scope="col" { "Kind" } th scope="col" { "Status" } th scope="col" { "Finished" } th scope="col" { "Result" } } }
                    tbody {
                        @for j in list {
                            tr data-job=(j.id) {
                                td data-label="Created" { (when(&j.created_at)) br; small.mono { (j.id) } }
                                td data-label="Kind" { (j.kind.as_str()) }
                                td data-label="Status" { span class={"badge " (j.status.as_str())} { (j.status.as_str()) } }
                                td data-label="Finished" { @if let Some(f) = &j.finished_at { (when(f)) } }
                                td data-label="Result" {
                                    @if j.kind == JobKind::Erasure {
                                        a href={"/privacy/" (j.id)} { "Certificate" }
                                    } @else if j.result.is_some() && j.status.as_str() == "completed" {
                                        a href={"/jobs/" (j.id) "/result"} download { "Download" }
                                    } @else if let Some(e) = j.metadata.get("error") {
                                        small { (e.get("message").and_then(|m| m.as_str()).unwrap_or("failed")) }
                                    }
                                }
                            }
                        }
                    }
                } }
            }
        },
    )
}

pub fn quarantine(me: &Me, list: &[QuarantinedEvent], note: Option<&str>) -> Markup {
    layout(
        "Quarantine",
        Some(me),
        html! {
            (notice(note))
            p { "Accepted events that failed processing repeatedly. Retry puts one back in line (it keeps its event id); drop deletes it." }
            @if list.is_empty() {
                p.empty { "Nothing in quarantine." }
            } @else {
                div.scroll { table {
                    thead { tr { th scope="col" { "Event" } th scope="col" { "Received" } th scope="col" { "Error" } th scope="col" { "Attempts" } th scope="col" { span.sr { "Actions" } } } }
                    tbody {
                        @for q in list {
                            tr {
                                td.mono data-label="Event" { (q.event_id) }
                                td data-label="Received" { (when(&q.received_at)) }
                                td data-label="Error" { (q.error) }
                                td data-label="Attempts" { (q.attempts) }
                                td.actions {
                                    form method="post" action={"/quarantine/" (q.event_id) "/retry"} { (csrf(me)) button type="submit" { "Retry" } }
                                    form method="post" action={"/quarantine/" (q.event_id) "/drop"} data-confirm="Drop this event for good?" { (csrf(me)) button.danger type="submit" { "Drop" } }
                                }
                            }
                        }
                    }
                } }
            }
        },
    )
}

/// Forgetting people: the request form, the requests with their state, the
/// suppressions (by hash: the values are not kept).
pub fn privacy(
    me: &Me,
    requests: &[Job],
    suppressions: &[Suppression],
    note: Option<&str>,
    refused: Option<&str>,
) -> Markup {
    layout(
        "Privacy",
        Some(me),
        html! {
            (notice(note))
            p { "Erase people from every store fastack keeps: their events in every month, their contact and identities, retention archives, stored exports, the Parquet lake, events still owed to webhooks or RabbitMQ, stored webhook payloads and quarantine. Each request ends with a signed certificate. Copies already delivered to your own systems are yours to delete; the " code { "core.contact.erased" } " notification tells them." }
            h2 { "Request an erasure" }
            @if let Some(r) = refused {
                p.error role="alert" { (r) }
            }
            form.card method="post" action="/privacy" data-confirm="Erase these people from every store? This cannot be undone." {
                (csrf(me))
                label for="user_ids" { "User ids" small { " (one per line)" } }
                textarea #user_ids name="user_ids" rows="3" {}
                label for="anonymous_ids" { "Anonymous ids" small { " (one per line)" } }
                textarea #anonymous_ids name="anonymous_ids" rows="2" {}
                label for="contact_ids" { "Contact ids" small { " (one per line)" } }
                textarea #contact_ids name="contact_ids" rows="2" {}
                fieldset {
                    legend { "Only what was sent in a window (optional; the contact then stays)" }
                    label for="from" { "From" }
                    input #from name="from" type="text" placeholder="2026-12-01T10:00:00Z";
                    label for="to" { "To" }
                    input #to name="to" type="text" placeholder="2026-12-01T10:10:00Z";
                }
                label.check { input name="suppress" type="checkbox"; " Also drop their future events (suppress)" }
                button.danger type="submit" { "Erase" }
            }
            h2 { "Requests" }
            @if requests.is_empty() {
                p.empty { "No erasure requested yet." }
            } @else {
                div.scroll { table {
                    thead { tr { th scope="col" { "Requested" } th scope="col" { "Identifiers" } th scope="col" { "Status" } th scope="col" { "Events removed" } th scope="col" { span.sr { "Certificate" } } } }
                    tbody {
                        @for j in requests {
                            @let doc: Value = serde_json::from_str(&j.document()).unwrap_or_default();
                            tr data-erasure=(j.id) {
                                td data-label="Requested" { (when(&j.created_at)) br; small.mono { (j.id) } }
                                td data-label="Identifiers" { (j.params["identifiers"]) @if j.params["suppress"] == true { " · suppressed" } }
                                td data-label="Status" { span class={"badge " (j.status.as_str())} { (j.status.as_str()) } }
                                td data-label="Events removed" { @if j.status == JobStatus::Completed { (doc["result"]["stores"]["tracked_events"]["events_removed"]) } }
                                td { a href={"/privacy/" (j.id)} { "Details" } }
                            }
                        }
                    }
                } }
            }
            h2 { "Suppressions" }
            p { "Identifiers whose new events are accepted and then dropped, never stored or sent. Only their SHA-256 is kept." }
            @if suppressions.is_empty() {
                p.empty { "Nothing is suppressed." }
            } @else {
                div.scroll { table {
                    thead { tr { th scope="col" { "Kind" } th scope="col" { "SHA-256" } th scope="col" { "Since" } th scope="col" { "Dropped" } th scope="col" { span.sr { "Actions" } } } }
                    tbody {
                        @for s in suppressions {
                            tr {
                                td data-label="Kind" { (s.kind.as_str()) }
                                td.mono data-label="SHA-256" { (s.sha256) }
                                td data-label="Since" { (when(&s.created_at)) }
                                td data-label="Dropped" { (s.dropped) }
                                td.actions {
                                    form method="post" action="/privacy/suppressions/lift" data-confirm="Lift this suppression? Its events will be processed again." {
                                        (csrf(me))
                                        input type="hidden" name="kind" value=(s.kind.as_str());
                                        input type="hidden" name="sha256" value=(s.sha256);
                                        button type="submit" { "Lift" }
                                    }
                                }
                            }
                        }
                    }
                } }
            }
        },
    )
}

/// One erasure: its state, and once completed its certificate store by
/// store, the verification pass and the signature.
pub fn erasure(me: &Me, job: &Job) -> Markup {
    let doc: Value = serde_json::from_str(&job.document()).unwrap_or_default();
    let cert = &doc["result"];
    let stores = &cert["stores"];
    let rows: [(&str, Value); 9] = [
        (
            "Events (tracked_events)",
            stores["tracked_events"]["events_removed"].clone(),
        ),
        (
            "Events dropped from the inbox",
            stores["inbox"]["events_dropped"].clone(),
        ),
        ("Contacts", stores["contacts"]["contacts_removed"].clone()),
        (
            "Identities",
            stores["contacts"]["identities_removed"].clone(),
        ),
        (
            "Quarantined events",
            stores["quarantine"]["events_dropped"].clone(),
        ),
        (
            "Outbox rows not sent",
            stores["outbox"]["rows_cancelled"].clone(),
        ),
        (
            "Webhook payloads scrubbed",
            stores["webhooks"]["payloads_scrubbed"].clone(),
        ),
        (
            "Archives rewritten",
            stores["archives"]["objects_rewritten"].clone(),
        ),
        (
            "Lake files rewritten",
            stores["lake"]["files_rewritten"].clone(),
        ),
    ];
    layout(
        "Erasure",
        Some(me),
        html! {
            p { "Request " span.mono { (job.id) } ", " (when(&job.created_at)) ": "
                span class={"badge " (job.status.as_str())} { (job.status.as_str()) } }
            @match job.status {
                JobStatus::Completed => {
                    div.scroll { table {
                        thead { tr { th scope="col" { "Store" } th scope="col" { "Removed" } } }
                        tbody {
                            @for (what, n) in &rows {
                                tr { td data-label="Store" { (what) } td data-label="Removed" { @if n.is_null() { "—" } @else { (n) } } }
                            }
                            tr { td data-label="Store" { "Export results rewritten" } td data-label="Removed" { (stores["exports"]["results_rewritten"]) } }
                        }
                    } }
                    p { "Verification: every store looked at again at " (cert["verification"]["checked_at"].as_str().unwrap_or_default()) " found "
                        strong { (cert["verification"]["found"]) } " records of these people." }
                    p { "Signed with your account's external HMAC key: " span.mono { (cert["hmac"].as_str().unwrap_or_default()) } }
                    p { a href={"/privacy/" (job.id) "/certificate"} download { "Download the certificate (JSON)" } }
                }
                JobStatus::Failed => {
                    p.error { (doc["metadata"]["error"]["message"].as_str().unwrap_or("failed")) }
                }
                _ => {
                    p { "Running: reload this page to see its certificate once it completes." }
                }
            }
            p { a href="/privacy" { "Back to Privacy" } }
        },
    )
}

pub fn keys(me: &Me, list: &[ApiKey], created: Option<&str>, note: Option<&str>) -> Markup {
    layout(
        "API keys",
        Some(me),
        html! {
            (notice(note))
            @if let Some(secret) = created {
                p.warning role="alert" { strong { "Copy this key now: it is shown only once." } }
                label for="secret" { "New API key" }
                div.copy {
                    input #secret type="text" readonly value=(secret) data-secret;
                    button type="button" data-copy="secret" { "Copy" }
                }
            }
            div.scroll { table {
                thead { tr { th scope="col" { "Prefix" } th scope="col" { "Created" } th scope="col" { "Last used" } th scope="col" { "State" } th scope="col" { span.sr { "Actions" } } } }
                tbody {
                    @for k in list {
                        tr {
                            td.mono data-label="Prefix" { (k.prefix) "…" }
                            td data-label="Created" { (when(&k.created_at)) }
                            td data-label="Last used" { @match &k.last_used_at { Some(t) => (when(t)), None => "never" } }
                            td data-label="State" { @match &k.revoked_at { Some(t) => { "revoked " (when(t)) }, None => "active" } }
                            td { @if k.revoked_at.is_none() {
                                form method="post" action={"/keys/" (k.id) "/revoke"} data-confirm="Revoke this key? Requests with it will be refused." { (csrf(me)) button.danger type="submit" { "Revoke" } }
                            } }
                        }
                    }
                }
            } }
            form method="post" action="/keys" { (csrf(me)) button type="submit" { "Create a key" } }
        },
    )
}

pub fn plan(me: &Me, current: Option<&PlanVersion>, history: &[PlanVersion]) -> Markup {
    layout(
        "Tracking plan",
        Some(me),
        html! {
            @match current.and_then(|p| p.document.as_ref().map(|d| (p, d))) {
                Some((p, doc)) => {
                    p { "Version " (p.version) ", installed " (when(&p.installed_at)) ". Your operator installs and changes it." }
                    pre.doc { (serde_json::to_string_pretty(doc).unwrap_or_default()) }
                }
                None => p.empty { "No tracking plan is in force: every event is accepted as sent." }
            }
            @if !history.is_empty() {
                h2 { "History" }
                table {
                    thead { tr { th scope="col" { "Version" } th scope="col" { "Installed" } th scope="col" { "Change" } } }
                    tbody { @for v in history.iter().rev() {
                        tr { td { (v.version) } td { (when(&v.installed_at)) } td { @if v.document.is_some() { "installed" } @else { "removed" } } }
                    } }
                }
            }
        },
    )
}

/// The stylesheet and the one small script (copy buttons, confirmations);
/// every page works without the script.
pub const CSS: &str = include_str!("console.css");
pub const JS: &str = include_str!("console.js");
