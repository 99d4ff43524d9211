//! Who is asking and whether they may: the session cookie, the CSRF token
//! of every state-changing form, the same-origin check, owner-only actions,
//! and why not (a [`Fail`]; its page is drawn in `views`).

use fastack_core::console::{self, Role, Session, Token, User};
use fastack_entities::TenantId;
use poem::{Request, Response, http::StatusCode};
use tracing::error;

use crate::state::SharedState;

pub const SESSION_COOKIE: &str = "fastack_session";
/// The pre-sign-in cookie that the sign-in and set-password forms' CSRF
/// tokens are bound to.
pub const PRE_COOKIE: &str = "fastack_pre";

/// A form as submitted: its fields in order (a checkbox group repeats its
/// name).
pub type Fields = Vec<(String, String)>;

pub fn field<'a>(f: &'a Fields, name: &str) -> &'a str {
    f.iter()
        .find(|(k, _)| k == name)
        .map_or("", |(_, v)| v.as_str())
}

pub fn fields<'a>(f: &'a Fields, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    f.iter()
        .filter(move |(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A cookie of the request (the first of that name).
pub fn cookie<'a>(req: &'a Request, name: &str) -> Option<&'a str> {
    req.headers()
        .get_all("cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .filter(|v| !v.is_empty())
}

/// Sets a cookie on a response: never readable by scripts, never sent by
/// another site's requests, over TLS only when the console is served over
/// TLS. `max_age_secs` 0 with an empty value removes it.
pub fn set_cookie(
    resp: &mut Response,
    state: &SharedState,
    name: &str,
    value: &str,
    max_age_secs: i64,
) {
    let secure = if state.config.console_secure_cookies() {
        "; Secure"
    } else {
        ""
    };
    let set = format!(
        "{name}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age_secs}{secure}"
    );
    if let Ok(v) = set.parse() {
        resp.headers_mut().append("set-cookie", v);
    }
}

/// Why a request is not answered with its page.
#[derive(Debug)]
pub enum Fail {
    /// Not signed in (or the session ended): to the sign-in page.
    SignIn,
    Page {
        status: StatusCode,
        code: &'static str,
        message: String,
    },
}

impl Fail {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Fail::Page {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn not_found(what: &str) -> Self {
        Fail::new(
            StatusCode::NOT_FOUND,
            "not_found",
            if what == "page" {
                "There is no such page.".to_owned()
            } else {
                format!("Your account has no such {what}.")
            },
        )
    }
}

/// A lower layer's error, with the status and code it gives itself (as the
/// API's problem documents do); a server-side failure's details stay in
/// the log.
impl From<fastack_core::Error> for Fail {
    fn from(e: fastack_core::Error) -> Self {
        use fastack_core::ServiceError;
        let status =
            StatusCode::from_u16(e.status_code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            error!(error = %e, "console request failed");
            return Fail::new(
                status,
                e.error_code(),
                "something went wrong on our side; try again",
            );
        }
        Fail::new(status, e.error_code(), e.to_string())
    }
}

/// A signed-in request: the session and its forms' CSRF token.
pub struct Me {
    pub session: Session,
    pub csrf: String,
    key: [u8; 32],
    /// The page asked for (the navigation marks its section).
    pub path: String,
}

impl Me {
    pub fn user(&self) -> &User {
        &self.session.user
    }

    pub fn tenant(&self) -> TenantId {
        self.session.user.tenant_id
    }

    pub fn is_owner(&self) -> bool {
        self.session.user.role == Role::Owner
    }

    /// Refuses a viewer.
    pub fn owner(&self) -> Result<(), Fail> {
        if self.is_owner() {
            Ok(())
        } else {
            Err(Fail::new(
                StatusCode::FORBIDDEN,
                "owner_only",
                "only an owner of this account can do that; you are a viewer",
            ))
        }
    }

    /// Checks a submitted form's CSRF token (and that it came from a page of
    /// this console).
    pub fn form(&self, req: &Request, f: &Fields) -> Result<(), Fail> {
        same_origin(req)?;
        if console::csrf_ok(&self.key, &self.session.token, field(f, "csrf")) {
            Ok(())
        } else {
            Err(csrf_refused())
        }
    }
}

pub fn csrf_refused() -> Fail {
    Fail::new(
        StatusCode::FORBIDDEN,
        "csrf_failed",
        "this form is stale or did not come from this console; reload the page and try again",
    )
}

/// Browsers say where a form was submitted from: a page of another origin
/// is refused even before the token is looked at.
pub fn same_origin(req: &Request) -> Result<(), Fail> {
    if req
        .header("sec-fetch-site")
        .is_some_and(|s| s == "cross-site")
    {
        return Err(csrf_refused());
    }
    if let (Some(origin), Some(host)) = (req.header("origin"), req.header("host")) {
        let origin_host = origin.split_once("://").map_or(origin, |(_, h)| h);
        if origin == "null" || origin_host != host {
            return Err(csrf_refused());
        }
    }
    Ok(())
}

/// The session the request's cookie names, or [`Fail::SignIn`]. An API key
/// in an `Authorization` header is not looked at: it never opens the
/// console.
pub async fn me(state: &SharedState, req: &Request) -> Result<Me, Fail> {
    let token = cookie(req, SESSION_COOKIE).ok_or(Fail::SignIn)?;
    let token = Token::from_client(token);
    let session = state
        .runtime
        .console_session(&token)
        .await?
        .ok_or(Fail::SignIn)?;
    let key = state.runtime.keys().console_key();
    Ok(Me {
        csrf: console::csrf_token(&key, &session.token),
        session,
        key,
        path: req.uri().path().to_owned(),
    })
}
