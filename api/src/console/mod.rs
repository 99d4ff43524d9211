//! The account console (`FASTACK_CONSOLE_LISTEN`, off unless set): a
//! tenant's users sign in with a password (never an API key) to register
//! notification endpoints, see each delivery's attempts and replay them,
//! look at jobs, quarantine, API keys and the tracking plan, and forget
//! people (erasure requests, their certificates, suppressions). Pages are
//! rendered on the server; the console calls storage directly, never the
//! ingest API.

mod guard;
mod views;

use chrono::{DateTime, Utc};
use fastack_core::{
    console::{self, SESSION_ABSOLUTE, SignIn, Token},
    domain::{Replayed, Subject, SubjectKind},
    erasure::ErasureRequest,
    export,
    ratelimit::{ClientLimiter, Quota},
};
use fastack_entities::{ApiKeyId, DeliveryId, DeliveryStatus, EndpointId, EventId, JobId};
use guard::{Fail, Fields, Me, PRE_COOKIE, SESSION_COOKIE, field, fields, me, same_origin};
use poem::{
    Endpoint, EndpointExt, IntoResponse, Request, Response, Route, get, handler,
    http::StatusCode,
    post,
    web::{Data, Form, Path, Query, Redirect},
};
use serde::Deserialize;

use crate::state::SharedState;

type Page = Result<Response, Fail>;

/// The console application.
pub fn app(state: SharedState) -> impl Endpoint {
    // Sign-in attempts per client address on this node (the per-account
    // lockout is in the database).
    let limiter = std::sync::Arc::new(ClientLimiter::with_quota(Quota {
        rate_per_sec: 1,
        burst: 10,
    }));
    Route::new()
        .at("/", get(home))
        .at("/signin", get(sign_in_page).post(sign_in))
        .at("/setup", get(setup_page).post(setup))
        .at("/signout", post(sign_out))
        .at("/signout-everywhere", post(sign_out_everywhere))
        .at("/endpoints", get(endpoints).post(add_endpoint))
        .at("/endpoints/:id", get(endpoint))
        .at("/endpoints/:id/:action", post(endpoint_action))
        .at("/deliveries/:id/replay", post(replay))
        .at("/jobs", get(jobs))
        .at("/jobs/:id/result", get(job_result))
        .at("/quarantine", get(quarantine))
        .at("/quarantine/:event/:action", post(quarantine_action))
        .at("/keys", get(keys).post(create_key))
        .at("/keys/:id/revoke", post(revoke_key))
        .at("/plan", get(plan))
        .at("/privacy", get(privacy).post(request_erasure))
        .at("/privacy/suppressions/lift", post(lift_suppression))
        .at("/privacy/:id", get(erasure))
        .at("/privacy/:id/certificate", get(certificate))
        .at("/static/console.css", get(css))
        .at("/static/console.js", get(js))
        .at("/favicon.ico", get(no_icon))
        .data(state)
        .data(limiter)
        .around(|next, req| async move {
            let mut resp = match next.call(req).await {
                Ok(r) => r.into_response(),
                Err(e) => e.into_response(),
            };
            let h = resp.headers_mut();
            for (k, v) in [
                (
                    "content-security-policy",
                    "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; \
                     form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
                ),
                ("x-frame-options", "DENY"),
                ("x-content-type-options", "nosniff"),
                // Sign-in links carry their token in the URL: never sent
                // to another site (same-origin still lets forms say their
                // Origin, which the CSRF check reads).
                ("referrer-policy", "same-origin"),
                ("cache-control", "no-store"),
            ] {
                h.insert(k, poem::http::HeaderValue::from_static(v));
            }
            Ok(resp)
        })
}

fn page(markup: maud::Markup) -> Page {
    Ok(views::html(StatusCode::OK, markup))
}

fn see_other(to: &str) -> Page {
    Ok(Redirect::see_other(to).into_response())
}

fn id<T: std::str::FromStr>(raw: &str, what: &str) -> Result<T, Fail> {
    raw.parse().map_err(|_| Fail::not_found(what))
}

#[derive(Deserialize, Default)]
struct Notice {
    notice: Option<String>,
    n: Option<u64>,
    status: Option<String>,
}

impl Notice {
    /// Only fixed texts are shown: nothing from the URL reaches the page.
    fn text(&self) -> Option<String> {
        let n = self.n.unwrap_or(0);
        Some(match self.notice.as_deref()? {
            "replayed" => "Delivery queued again; it keeps its webhook-id.".to_owned(),
            "already_pending" => {
                "That delivery is already pending; it was left as it is.".to_owned()
            }
            "replayed_failed" => format!("{n} failed deliveries queued again."),
            "test_sent" => {
                "Test message queued (event type webhook.test); it shows below once sent."
                    .to_owned()
            }
            "enabled" => "Endpoint enabled.".to_owned(),
            "disabled" => "Endpoint disabled.".to_owned(),
            "deleted" => "Endpoint deleted.".to_owned(),
            "retried" => "Event put back in line.".to_owned(),
            "dropped" => "Event dropped.".to_owned(),
            "revoked" => "Key revoked.".to_owned(),
            "lifted" => {
                "Suppression lifted: that identifier's events are processed again from now on."
                    .to_owned()
            }
            _ => return None,
        })
    }
}

#[handler]
async fn css() -> Response {
    Response::builder()
        .content_type("text/css; charset=utf-8")
        .body(views::CSS)
}

#[handler]
async fn js() -> Response {
    Response::builder()
        .content_type("text/javascript; charset=utf-8")
        .body(views::JS)
}

#[handler]
async fn no_icon() -> StatusCode {
    StatusCode::NO_CONTENT
}

#[handler]
async fn home(req: &Request, state: Data<&SharedState>) -> Page {
    me(&state, req).await?;
    see_other("/endpoints")
}

// --- signing in ---------------------------------------------------------

/// A page shown before sign-in, with its pre-sign-in cookie (kept if the
/// browser has one) and the form token bound to it.
fn anonymous(
    state: &SharedState,
    req: &Request,
    status: StatusCode,
    render: impl FnOnce(&str) -> maud::Markup,
) -> Response {
    let cookie = guard::cookie(req, PRE_COOKIE)
        .map(str::to_owned)
        .unwrap_or_else(console::random_cookie);
    let csrf = console::anonymous_csrf(&state.runtime.keys().console_key(), &cookie);
    let mut resp = views::html(status, render(&csrf));
    guard::set_cookie(&mut resp, state, PRE_COOKIE, &cookie, 3600);
    resp
}

fn anonymous_form(state: &SharedState, req: &Request, f: &Fields) -> Result<(), Fail> {
    same_origin(req)?;
    let cookie = guard::cookie(req, PRE_COOKIE).unwrap_or_default();
    if !cookie.is_empty()
        && console::anonymous_csrf_ok(
            &state.runtime.keys().console_key(),
            cookie,
            field(f, "csrf"),
        )
    {
        Ok(())
    } else {
        Err(guard::csrf_refused())
    }
}

/// Signs the user in: a new session and its cookie, then to the console.
async fn signed_in_as(state: &SharedState, user: console::User) -> Page {
    let session = state.runtime.open_console_session(user).await?;
    let mut resp = Redirect::see_other("/endpoints").into_response();
    guard::set_cookie(
        &mut resp,
        state,
        SESSION_COOKIE,
        session.token.as_str(),
        SESSION_ABSOLUTE.num_seconds(),
    );
    Ok(resp)
}

#[handler]
async fn sign_in_page(req: &Request, state: Data<&SharedState>) -> Response {
    anonymous(&state, req, StatusCode::OK, |csrf| {
        views::sign_in(csrf, None)
    })
}

#[handler]
async fn sign_in(
    req: &Request,
    state: Data<&SharedState>,
    limiter: Data<&std::sync::Arc<ClientLimiter>>,
    Form(f): Form<Fields>,
) -> Page {
    anonymous_form(&state, req, &f)?;
    if let Some(ip) = req.remote_addr().as_socket_addr().map(|a| a.ip())
        && let Some(after) = limiter.charge(ip)
    {
        return Ok(anonymous(
            &state,
            req,
            StatusCode::TOO_MANY_REQUESTS,
            |csrf| {
                views::sign_in(
                    csrf,
                    Some(&format!(
                        "Too many sign-in attempts from your address; wait {after} s."
                    )),
                )
            },
        ));
    }
    match state
        .runtime
        .console_sign_in(field(&f, "email"), field(&f, "password"))
        .await?
    {
        SignIn::Ok(user) => signed_in_as(&state, user).await,
        SignIn::Refused => Ok(anonymous(&state, req, StatusCode::UNAUTHORIZED, |csrf| {
            views::sign_in(csrf, Some("The email or the password is wrong."))
        })),
        SignIn::Locked { until } => Ok(anonymous(
            &state,
            req,
            StatusCode::TOO_MANY_REQUESTS,
            |csrf| {
                views::sign_in(
                    csrf,
                    Some(&format!(
                        "Too many failed sign-ins: this account is locked until {} UTC.",
                        until.format("%H:%M")
                    )),
                )
            },
        )),
    }
}

#[derive(Deserialize)]
struct SetupQuery {
    token: Option<String>,
}

fn link_refused() -> Fail {
    Fail::new(
        StatusCode::NOT_FOUND,
        "link_invalid",
        "this sign-in link is invalid, used or expired; ask your operator for a new one",
    )
}

#[handler]
async fn setup_page(req: &Request, state: Data<&SharedState>, Query(q): Query<SetupQuery>) -> Page {
    let token = Token::from_client(q.token.as_deref().unwrap_or_default());
    let user = state
        .runtime
        .console_link_user(&token)
        .await?
        .ok_or_else(link_refused)?;
    Ok(anonymous(&state, req, StatusCode::OK, |csrf| {
        views::set_password(csrf, token.as_str(), &user, None)
    }))
}

#[handler]
async fn setup(req: &Request, state: Data<&SharedState>, Form(f): Form<Fields>) -> Page {
    anonymous_form(&state, req, &f)?;
    let token = Token::from_client(field(&f, "token"));
    let user = state
        .runtime
        .console_link_user(&token)
        .await?
        .ok_or_else(link_refused)?;
    let (password, confirm) = (field(&f, "password"), field(&f, "confirm"));
    let problem = if password != confirm {
        Some("The two passwords differ.".to_owned())
    } else {
        console::check_password(password).err().map(|e| match e {
            fastack_core::Error::Config(m) => m,
            other => other.to_string(),
        })
    };
    if let Some(problem) = problem {
        return Ok(anonymous(
            &state,
            req,
            StatusCode::UNPROCESSABLE_ENTITY,
            |csrf| views::set_password(csrf, token.as_str(), &user, Some(&problem)),
        ));
    }
    let user = state.runtime.redeem_console_link(&token, password).await?;
    signed_in_as(&state, user).await
}

fn signed_out(state: &SharedState) -> Page {
    let mut resp = Redirect::see_other("/signin").into_response();
    guard::set_cookie(&mut resp, state, SESSION_COOKIE, "", 0);
    Ok(resp)
}

#[handler]
async fn sign_out(req: &Request, state: Data<&SharedState>, Form(f): Form<Fields>) -> Page {
    let me = me(&state, req).await?;
    me.form(req, &f)?;
    state.runtime.console_sign_out(&me.session.token).await?;
    signed_out(&state)
}

#[handler]
async fn sign_out_everywhere(
    req: &Request,
    state: Data<&SharedState>,
    Form(f): Form<Fields>,
) -> Page {
    let me = me(&state, req).await?;
    me.form(req, &f)?;
    state
        .runtime
        .console_sign_out_everywhere(me.user().id)
        .await?;
    signed_out(&state)
}

// --- notifications ------------------------------------------------------

#[handler]
async fn endpoints(req: &Request, state: Data<&SharedState>, Query(q): Query<Notice>) -> Page {
    let me = me(&state, req).await?;
    let list = state.runtime.list_webhooks(me.tenant()).await?;
    let last = state.runtime.latest_delivery_status(me.tenant()).await?;
    page(views::endpoints(
        &me,
        &list,
        &last,
        q.text().as_deref(),
        None,
        None,
    ))
}

/// The words a tenant's user reads when an address is refused; the
/// operator's detail (which setting allows it) goes to the log.
fn refused_for_user(detail: &str) -> String {
    if detail.contains("not globally routable") {
        "fastack cannot send to this address: it is on a private or local network. \
         Use an address your receiver answers on from the internet."
            .to_owned()
    } else {
        // The other refusals are about the URL itself and name no setting.
        format!("This address cannot be used: {detail}.")
    }
}

#[handler]
async fn add_endpoint(req: &Request, state: Data<&SharedState>, Form(f): Form<Fields>) -> Page {
    let me = owner_form(&state, req, &f).await?;
    let events: Vec<&str> = fields(&f, "events").collect();
    if events.is_empty() {
        return Err(Fail::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_endpoint",
            "choose at least one event type",
        ));
    }
    let added = state
        .runtime
        .add_webhook(me.tenant(), field(&f, "url"), Some(&events.join(",")))
        .await;
    let created = match added {
        Ok(created) => created,
        Err(fastack_core::Error::InvalidEndpoint(detail)) => {
            tracing::info!(tenant = %me.tenant(), %detail, "an endpoint address was refused in the console");
            // The same page again, the address kept, the reason at the form.
            let list = state.runtime.list_webhooks(me.tenant()).await?;
            let last = state.runtime.latest_delivery_status(me.tenant()).await?;
            return Ok(views::html(
                StatusCode::UNPROCESSABLE_ENTITY,
                views::endpoints(
                    &me,
                    &list,
                    &last,
                    None,
                    Some(&refused_for_user(&detail)),
                    Some(field(&f, "url")),
                ),
            ));
        }
        Err(e) => return Err(e.into()),
    };
    page(views::secret_shown(
        &me,
        &created.endpoint,
        &created.secret,
        false,
        created.warning.as_deref(),
    ))
}

#[handler]
async fn endpoint(
    req: &Request,
    state: Data<&SharedState>,
    Path(raw): Path<String>,
    Query(q): Query<Notice>,
) -> Page {
    let me = me(&state, req).await?;
    let id: EndpointId = id(&raw, "endpoint")?;
    let e = state.runtime.webhook(me.tenant(), id).await?;
    let filter: Option<DeliveryStatus> = match q.status.as_deref() {
        None | Some("") => None,
        Some(s) => Some(s.parse().map_err(|m: String| {
            Fail::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_input", m)
        })?),
    };
    let list = state
        .runtime
        .list_deliveries(me.tenant(), Some(id), filter, 200)
        .await?;
    page(views::endpoint(&me, &e, &list, filter, q.text().as_deref()))
}

/// What an owner does to one of the tenant's endpoints
/// (`POST /endpoints/{id}/{action}`).
#[handler]
async fn endpoint_action(
    req: &Request,
    state: Data<&SharedState>,
    Path((raw, action)): Path<(String, String)>,
    Form(f): Form<Fields>,
) -> Page {
    let me = owner_form(&state, req, &f).await?;
    let id: EndpointId = id(&raw, "endpoint")?;
    state.runtime.webhook(me.tenant(), id).await?;
    let notice = match action.as_str() {
        "rotate" => {
            let created = state.runtime.rotate_webhook_secret(id).await?;
            return page(views::secret_shown(
                &me,
                &created.endpoint,
                &created.secret,
                true,
                None,
            ));
        }
        "enable" => {
            state.runtime.set_webhook_enabled(id, true, None).await?;
            "enabled".to_owned()
        }
        "disable" => {
            let reason = format!("disabled in the console by {}", me.user().email);
            state
                .runtime
                .set_webhook_enabled(id, false, Some(&reason))
                .await?;
            "disabled".to_owned()
        }
        "delete" => {
            state.runtime.delete_webhook(me.tenant(), id).await?;
            return see_other("/endpoints?notice=deleted");
        }
        "test" => {
            state.runtime.send_test_webhook(me.tenant(), id).await?;
            "test_sent".to_owned()
        }
        "replay-failed" => {
            let since = parse_since(field(&f, "since"))?;
            let n = state
                .runtime
                .replay_failed_since(me.tenant(), id, since)
                .await?;
            format!("replayed_failed&n={n}")
        }
        _ => return Err(Fail::not_found("page")),
    };
    see_other(&format!(
        "/endpoints/{id}?notice={notice}{}",
        keep_filter(&f)
    ))
}

/// The delivery log's status filter a form carried, to return to it.
fn keep_filter(f: &Fields) -> String {
    match field(f, "status").parse::<DeliveryStatus>() {
        Ok(s) => format!("&status={}", s.as_str()),
        Err(_) => String::new(),
    }
}

/// A time as the console shows them (see [`admin::parse_time`]).
fn parse_since(raw: &str) -> Result<DateTime<Utc>, Fail> {
    fastack_core::admin::parse_time(raw).map_err(|e| {
        Fail::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
            e.to_string(),
        )
    })
}

#[handler]
async fn replay(
    req: &Request,
    state: Data<&SharedState>,
    Path(raw): Path<String>,
    Form(f): Form<Fields>,
) -> Page {
    let me = owner_form(&state, req, &f).await?;
    let id: DeliveryId = id(&raw, "delivery")?;
    let (outcome, back_to) = state.runtime.replay_delivery(me.tenant(), id).await?;
    let notice = match outcome {
        Replayed::Queued => "replayed",
        Replayed::AlreadyPending => "already_pending",
    };
    see_other(&format!(
        "/endpoints/{back_to}?notice={notice}{}",
        keep_filter(&f)
    ))
}

// --- jobs, quarantine, keys, plan -----------------------------------------

#[handler]
async fn jobs(req: &Request, state: Data<&SharedState>) -> Page {
    let me = me(&state, req).await?;
    let list = state.runtime.list_jobs(me.tenant(), None, 100).await?;
    page(views::jobs(&me, &list))
}

#[handler]
async fn job_result(req: &Request, state: Data<&SharedState>, Path(raw): Path<String>) -> Page {
    let me = me(&state, req).await?;
    let id: JobId = id(&raw, "job")?;
    let job = state
        .runtime
        .job(me.tenant(), id)
        .await?
        .ok_or_else(|| Fail::not_found("job"))?;
    let result = export::downloadable(&job)
        .map_err(|m| Fail::new(StatusCode::CONFLICT, "job_not_completed", m))?;
    let body = state.runtime.export_result(&job, result).await?;
    Ok(Response::builder()
        .content_type("application/x-ndjson")
        .header(
            "content-disposition",
            format!("attachment; filename=\"export-{}.ndjson\"", job.id),
        )
        .body(body))
}

async fn owner(state: &SharedState, req: &Request) -> Result<Me, Fail> {
    let me = me(state, req).await?;
    me.owner()?;
    Ok(me)
}

/// A form an owner submitted, from a page of this console.
async fn owner_form(state: &SharedState, req: &Request, f: &Fields) -> Result<Me, Fail> {
    let me = me(state, req).await?;
    me.form(req, f)?;
    me.owner()?;
    Ok(me)
}

#[handler]
async fn quarantine(req: &Request, state: Data<&SharedState>, Query(q): Query<Notice>) -> Page {
    let me = owner(&state, req).await?;
    let list = state.runtime.list_quarantine(me.tenant(), 200).await?;
    page(views::quarantine(&me, &list, q.text().as_deref()))
}

/// Retry (back in line, same event id) or drop a quarantined event.
#[handler]
async fn quarantine_action(
    req: &Request,
    state: Data<&SharedState>,
    Path((raw, action)): Path<(String, String)>,
    Form(f): Form<Fields>,
) -> Page {
    let me = owner_form(&state, req, &f).await?;
    let event: EventId = id(&raw, "quarantined event")?;
    match action.as_str() {
        "retry" => {
            state.runtime.retry_quarantined(me.tenant(), event).await?;
            see_other("/quarantine?notice=retried")
        }
        "drop" => {
            state.runtime.drop_quarantined(me.tenant(), event).await?;
            see_other("/quarantine?notice=dropped")
        }
        _ => Err(Fail::not_found("page")),
    }
}

#[handler]
async fn keys(req: &Request, state: Data<&SharedState>, Query(q): Query<Notice>) -> Page {
    let me = owner(&state, req).await?;
    let list = state.runtime.list_keys(me.tenant()).await?;
    page(views::keys(&me, &list, None, q.text().as_deref()))
}

#[handler]
async fn create_key(req: &Request, state: Data<&SharedState>, Form(f): Form<Fields>) -> Page {
    let me = owner_form(&state, req, &f).await?;
    let created = state.runtime.create_key(me.tenant(), None).await?;
    let list = state.runtime.list_keys(me.tenant()).await?;
    page(views::keys(&me, &list, Some(&created.secret), None))
}

#[handler]
async fn revoke_key(
    req: &Request,
    state: Data<&SharedState>,
    Path(raw): Path<String>,
    Form(f): Form<Fields>,
) -> Page {
    let me = owner_form(&state, req, &f).await?;
    let id: ApiKeyId = id(&raw, "api key")?;
    if !state
        .runtime
        .list_keys(me.tenant())
        .await?
        .iter()
        .any(|k| k.id == id)
    {
        return Err(Fail::not_found("api key"));
    }
    state.runtime.revoke_key(id).await?;
    see_other("/keys?notice=revoked")
}

// --- privacy ----------------------------------------------------------------

#[handler]
async fn privacy(req: &Request, state: Data<&SharedState>, Query(q): Query<Notice>) -> Page {
    let me = owner(&state, req).await?;
    privacy_page(&state, &me, StatusCode::OK, q.text().as_deref(), None).await
}

async fn privacy_page(
    state: &SharedState,
    me: &Me,
    status: StatusCode,
    note: Option<&str>,
    refused: Option<&str>,
) -> Page {
    let requests = state.runtime.erasure_requests(me.tenant(), 100).await?;
    let suppressions = state.runtime.suppressions(me.tenant(), None, 500).await?;
    Ok(views::html(
        status,
        views::privacy(me, &requests, &suppressions, note, refused),
    ))
}

/// An erasure requested from the form: identifiers one per line, the same
/// rules as the API's; the request names who asked in its metadata.
#[handler]
async fn request_erasure(req: &Request, state: Data<&SharedState>, Form(f): Form<Fields>) -> Page {
    let me = owner_form(&state, req, &f).await?;
    let lines = |name: &str| -> Vec<String> {
        field(&f, name)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let mut problems = Vec::new();
    let mut contact_ids = Vec::new();
    for c in lines("contact_ids") {
        match c.parse() {
            Ok(id) => contact_ids.push(fastack_entities::ContactId(id)),
            Err(_) => problems.push(format!("{c:?} is not a contact id")),
        }
    }
    let mut instant = |name: &str| {
        let text = field(&f, name).trim();
        if text.is_empty() {
            return None;
        }
        let parsed = fastack_core::validate::parse_timestamp(text);
        if parsed.is_none() {
            problems.push(format!(
                "`{name}` must be a time with its offset, e.g. 2026-12-01T10:00:00Z"
            ));
        }
        parsed.map(|t| t.with_timezone(&Utc))
    };
    let window = fastack_core::domain::Window {
        from: instant("from"),
        to: instant("to"),
    };
    let request = ErasureRequest {
        people: fastack_core::domain::Person {
            user_ids: lines("user_ids"),
            anonymous_ids: lines("anonymous_ids"),
            contact_ids,
        },
        window,
        suppress: field(&f, "suppress") == "on",
    };
    if problems.is_empty() {
        problems = request.check().into_iter().map(|p| p.message).collect();
    }
    if !problems.is_empty() {
        return privacy_page(
            &state,
            &me,
            StatusCode::UNPROCESSABLE_ENTITY,
            None,
            Some(&problems.join("; ")),
        )
        .await;
    }
    let mut metadata = serde_json::Map::new();
    metadata.insert("requested_by".to_owned(), me.user().email.clone().into());
    metadata.insert("via".to_owned(), "console".into());
    let job = state
        .runtime
        .request_erasure(me.tenant(), &request, metadata)
        .await?;
    see_other(&format!("/privacy/{}", job.id))
}

async fn erasure_job(
    state: &SharedState,
    me: &Me,
    raw: &str,
) -> Result<fastack_entities::Job, Fail> {
    let id: JobId = id(raw, "erasure")?;
    state
        .runtime
        .job(me.tenant(), id)
        .await?
        .filter(|j| j.kind == fastack_entities::JobKind::Erasure)
        .ok_or_else(|| Fail::not_found("erasure"))
}

#[handler]
async fn erasure(req: &Request, state: Data<&SharedState>, Path(raw): Path<String>) -> Page {
    let me = owner(&state, req).await?;
    let job = erasure_job(&state, &me, &raw).await?;
    page(views::erasure(&me, &job))
}

/// The job document, certificate included, as a file to keep.
#[handler]
async fn certificate(req: &Request, state: Data<&SharedState>, Path(raw): Path<String>) -> Page {
    let me = owner(&state, req).await?;
    let job = erasure_job(&state, &me, &raw).await?;
    Ok(Response::builder()
        .content_type("application/json")
        .header(
            "content-disposition",
            format!("attachment; filename=\"erasure-{}.json\"", job.id),
        )
        .body(job.document()))
}

/// Lifts a suppression shown on the page (by its hash).
#[handler]
async fn lift_suppression(req: &Request, state: Data<&SharedState>, Form(f): Form<Fields>) -> Page {
    let me = owner_form(&state, req, &f).await?;
    let kind = match field(&f, "kind") {
        "user_id" => SubjectKind::UserId,
        "anonymous_id" => SubjectKind::AnonymousId,
        _ => return Err(Fail::not_found("suppression")),
    };
    let subject = Subject {
        kind,
        sha256: field(&f, "sha256").to_owned(),
    };
    if !state
        .runtime
        .lift_suppression(me.tenant(), &subject)
        .await?
    {
        return Err(Fail::not_found("suppression"));
    }
    see_other("/privacy?notice=lifted")
}

#[handler]
async fn plan(req: &Request, state: Data<&SharedState>) -> Page {
    let me = me(&state, req).await?;
    let current = state.runtime.plan_version(me.tenant(), None).await?;
    let history = state.runtime.plan_history(me.tenant()).await?;
    page(views::plan(&me, current.as_ref(), &history))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_since_takes_the_browser_and_rfc3339_forms() {
        let a = parse_since("2026-12-01T09:30").unwrap();
        let b = parse_since("2026-12-01T09:30:00").unwrap();
        let c = parse_since("2026-12-01T10:30:00+01:00").unwrap();
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert!(parse_since("yesterday").is_err());
    }

    #[test]
    fn notices_are_fixed_texts() {
        let n = Notice {
            notice: Some("<script>".to_owned()),
            ..Notice::default()
        };
        assert_eq!(n.text(), None);
        let n = Notice {
            notice: Some("replayed_failed".to_owned()),
            n: Some(3),
            status: None,
        };
        assert_eq!(n.text().unwrap(), "3 failed deliveries queued again.");
    }
}
