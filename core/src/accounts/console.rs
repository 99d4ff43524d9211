//! The account console's people and their sign-ins: users (owner or
//! viewer of one tenant), one-time links that set a password, sessions
//! kept in the database behind a random cookie token, and the rules of
//! signing in (argon2id passwords, a per-account lockout, idle and absolute
//! expiry, CSRF tokens bound to the session). Its rows are read and written
//! by `store::console` (`Storage::console`).
//!
//! Tokens (links, sessions) are 32 random bytes; only their SHA-256 is
//! stored, so a copy of the database signs no one in.

use std::fmt;

use argon2::{
    Argon2,
    password_hash::{PasswordHasher, PasswordVerifier, phc::PasswordHash},
};
use base64::Engine as _;
use chrono::{DateTime, Duration, Utc};
use fastack_entities::{
    TenantId, UserId,
    db::{Time, console_link, console_session, console_user, unsigned},
};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::{
    error::{Error, Result},
    store::Storage,
};

/// How long a one-time link stays valid.
pub const LINK_TTL: Duration = Duration::hours(24);
/// A session unused this long is over.
pub const SESSION_IDLE: Duration = Duration::hours(2);
/// A session is over this long after sign-in, however active.
pub const SESSION_ABSOLUTE: Duration = Duration::hours(12);
/// `last_seen_at` is written at most this often (not on every page).
const TOUCH_EVERY: Duration = Duration::seconds(60);
/// Failed sign-ins in a row that lock an account …
pub const MAX_FAILED_SIGNINS: u32 = 5;
/// … for this long.
pub const LOCKOUT: Duration = Duration::minutes(15);
pub const MIN_PASSWORD_CHARS: usize = 12;
const MAX_PASSWORD_CHARS: usize = 1024;

/// What a user may do in the console.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything the console offers for the tenant.
    Owner,
    /// Reads only: no endpoint changes, replays, keys or quarantine.
    Viewer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Viewer => "viewer",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "owner" => Ok(Role::Owner),
            "viewer" => Ok(Role::Viewer),
            other => Err(Error::Config(format!(
                "unknown role `{other}` (owner or viewer)"
            ))),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// A console user (never the password hash).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct User {
    pub id: UserId,
    pub tenant_id: TenantId,
    pub email: String,
    pub role: Role,
    /// Whether the one-time link was used to set a password.
    pub active: bool,
    pub created_at: DateTime<Utc>,
}

impl TryFrom<console_user::Model> for User {
    type Error = Error;

    fn try_from(m: console_user::Model) -> Result<Self> {
        Ok(User {
            id: m.id,
            tenant_id: m.tenant_id,
            email: m.email,
            role: Role::parse(&m.role).map_err(|e| Error::Corrupt(e.to_string()))?,
            active: m.password_hash.is_some(),
            created_at: m.created_at.0,
        })
    }
}

/// A one-time link's token, shown once.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    fn generate() -> Self {
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        Token(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
    }

    pub fn from_client(raw: &str) -> Self {
        Token(raw.trim().to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn hash(&self) -> Vec<u8> {
        Sha256::digest(self.0.as_bytes()).to_vec()
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token([redacted])")
    }
}

fn normalise_email(email: &str) -> Result<String> {
    let e = email.trim().to_lowercase();
    let ok = (3..=254).contains(&e.len())
        && !e.chars().any(char::is_whitespace)
        && e.split('@').count() == 2
        && e.split('@').all(|p| !p.is_empty());
    if ok {
        Ok(e)
    } else {
        Err(Error::Config(format!(
            "`{}` is not an email address",
            email.trim()
        )))
    }
}

/// Creates a user of `tenant` and the one-time link that sets their
/// password.
pub async fn create_user(
    store: &Storage,
    tenant: TenantId,
    email: &str,
    role: Role,
    now: DateTime<Utc>,
) -> Result<(User, Token)> {
    let email = normalise_email(email)?;
    let row = console_user::Model {
        id: UserId::new(),
        tenant_id: tenant,
        email: email.clone(),
        role: role.as_str().to_owned(),
        password_hash: None,
        failed_signins: 0,
        locked_until: None,
        created_at: Time(now),
    };
    store.console().insert_user(row.clone()).await?;
    let token = new_link(store, row.id, now).await?;
    Ok((row.try_into()?, token))
}

/// A new one-time link for an existing user (a forgotten password); the
/// user's sessions end.
pub async fn reset_user(store: &Storage, email: &str, now: DateTime<Utc>) -> Result<(User, Token)> {
    let user = find_user(store, email).await?.ok_or(Error::NotFound {
        what: "console user",
    })?;
    sign_out_everywhere(store, user.id).await?;
    let token = new_link(store, user.id, now).await?;
    Ok((user.try_into()?, token))
}

async fn new_link(store: &Storage, user: UserId, now: DateTime<Utc>) -> Result<Token> {
    let token = Token::generate();
    store
        .console()
        .insert_link(console_link::Model {
            token_hash: token.hash(),
            user_id: user,
            expires_at: Time(now + LINK_TTL),
            used_at: None,
        })
        .await?;
    Ok(token)
}

async fn find_user(store: &Storage, email: &str) -> Result<Option<console_user::Model>> {
    let Ok(email) = normalise_email(email) else {
        return Ok(None);
    };
    store.console().user_by_email(&email).await
}

pub async fn get_user(store: &Storage, id: UserId) -> Result<Option<User>> {
    store
        .console()
        .user(id)
        .await?
        .map(User::try_from)
        .transpose()
}

pub async fn list_users(store: &Storage, tenant: Option<TenantId>) -> Result<Vec<User>> {
    store
        .console()
        .users(tenant)
        .await?
        .into_iter()
        .map(User::try_from)
        .collect()
}

pub async fn remove_user(store: &Storage, email: &str) -> Result<User> {
    let user = find_user(store, email).await?.ok_or(Error::NotFound {
        what: "console user",
    })?;
    sign_out_everywhere(store, user.id).await?;
    store.console().delete_user(user.id).await?;
    user.try_into()
}

/// The user a one-time link is for, while it is unused and unexpired.
pub async fn link_user(store: &Storage, token: &Token, now: DateTime<Utc>) -> Result<Option<User>> {
    let Some(link) = store.console().link(token.hash()).await? else {
        return Ok(None);
    };
    if link.used_at.is_some() || link.expires_at.0 <= now {
        return Ok(None);
    }
    get_user(store, link.user_id).await
}

/// Why a password is refused.
pub fn check_password(password: &str) -> Result<()> {
    let n = password.chars().count();
    if n < MIN_PASSWORD_CHARS {
        return Err(Error::Config(format!(
            "the password must be at least {MIN_PASSWORD_CHARS} characters"
        )));
    }
    if n > MAX_PASSWORD_CHARS {
        return Err(Error::Config(format!(
            "the password must be at most {MAX_PASSWORD_CHARS} characters"
        )));
    }
    Ok(())
}

/// Uses a one-time link: sets the password and returns the user. A link
/// works once: of two concurrent uses, one finds it used.
pub async fn redeem_link(
    store: &Storage,
    token: &Token,
    password: &str,
    now: DateTime<Utc>,
) -> Result<User> {
    check_password(password)?;
    let spent = || Error::NotFound {
        what: "valid sign-in link",
    };
    let user = link_user(store, token, now).await?.ok_or_else(spent)?;
    let hash = hash_password(password.to_owned()).await?;
    if !store.console().use_link(token.hash(), now).await? {
        return Err(spent());
    }
    store.console().set_password(user.id, hash).await?;
    // A new password ends every earlier sign-in.
    sign_out_everywhere(store, user.id).await?;
    Ok(User {
        active: true,
        ..user
    })
}

/// How a sign-in attempt ended.
#[derive(Debug)]
pub enum SignIn {
    Ok(User),
    /// Unknown email, no password set yet, or a wrong password: the same
    /// answer for each, so the form tells nothing about who has an account.
    Refused,
    /// Too many failures in a row; try again after this.
    Locked {
        until: DateTime<Utc>,
    },
}

/// Checks an email and password, counting failures against the account.
pub async fn sign_in(
    store: &Storage,
    email: &str,
    password: &str,
    now: DateTime<Utc>,
) -> Result<SignIn> {
    let found = find_user(store, email).await?;
    let stored = found.as_ref().and_then(|u| u.password_hash.clone());
    // Unknown accounts cost the same KDF run as known ones.
    let matches = verify_password(password.to_owned(), stored.unwrap_or_else(dummy_hash)).await;
    let Some(user) = found else {
        return Ok(SignIn::Refused);
    };
    if let Some(until) = user.locked_until
        && until.0 > now
    {
        return Ok(SignIn::Locked { until: until.0 });
    }
    if matches && user.password_hash.is_some() {
        if user.failed_signins != 0 || user.locked_until.is_some() {
            store.console().clear_failures(user.id).await?;
        }
        return Ok(SignIn::Ok(user.try_into()?));
    }
    let failures = unsigned(user.failed_signins) + 1;
    let lock = (failures >= MAX_FAILED_SIGNINS).then(|| now + LOCKOUT);
    store.console().count_failure(user.id, lock).await?;
    Ok(match lock {
        Some(until) => SignIn::Locked { until },
        None => SignIn::Refused,
    })
}

/// A signed-in session: the cookie's token, shown to the browser only.
#[derive(Clone, Debug)]
pub struct Session {
    pub token: Token,
    pub user: User,
    pub expires_at: DateTime<Utc>,
}

pub async fn open_session(store: &Storage, user: User, now: DateTime<Utc>) -> Result<Session> {
    let token = Token::generate();
    let expires_at = now + SESSION_ABSOLUTE;
    store
        .console()
        .insert_session(console_session::Model {
            token_hash: token.hash(),
            user_id: user.id,
            created_at: Time(now),
            last_seen_at: Time(now),
            expires_at: Time(expires_at),
        })
        .await?;
    Ok(Session {
        token,
        user,
        expires_at,
    })
}

/// The session a cookie names, while neither idle nor past its absolute
/// end; an expired one is deleted.
pub async fn session(
    store: &Storage,
    token: &Token,
    now: DateTime<Utc>,
) -> Result<Option<Session>> {
    let Some(row) = store.console().session(token.hash()).await? else {
        return Ok(None);
    };
    if row.expires_at.0 <= now || row.last_seen_at.0 + SESSION_IDLE <= now {
        sign_out(store, token).await?;
        return Ok(None);
    }
    let Some(user) = get_user(store, row.user_id).await? else {
        return Ok(None);
    };
    if now - row.last_seen_at.0 >= TOUCH_EVERY {
        store.console().touch_session(token.hash(), now).await?;
    }
    Ok(Some(Session {
        token: token.clone(),
        user,
        expires_at: row.expires_at.0,
    }))
}

pub async fn sign_out(store: &Storage, token: &Token) -> Result<()> {
    store.console().delete_session(token.hash()).await
}

/// Ends every session of a user.
pub async fn sign_out_everywhere(store: &Storage, user: UserId) -> Result<u64> {
    store.console().delete_sessions_of(user).await
}

/// The CSRF token of a session's forms: bound to the session (an HMAC of
/// its token under the deployment's console key), so a page of another
/// site can neither read nor forge it.
pub fn csrf_token(key: &[u8; 32], session: &Token) -> String {
    crate::crypto::hmac_hex(key, &[b"csrf/", session.as_str().as_bytes()])
}

/// Whether a submitted form's CSRF token is the session's (constant time).
pub fn csrf_ok(key: &[u8; 32], session: &Token, submitted: &str) -> bool {
    crate::crypto::hmac_verify_hex(key, &[b"csrf/", session.as_str().as_bytes()], submitted)
}

/// The forms shown before sign-in carry a token bound to a random cookie
/// of their own (double submit, signed): a foreign page cannot make a
/// browser sign in to an account of its choosing.
pub fn anonymous_csrf(key: &[u8; 32], cookie: &str) -> String {
    crate::crypto::hmac_hex(key, &[b"pre/", cookie.as_bytes()])
}

pub fn anonymous_csrf_ok(key: &[u8; 32], cookie: &str, submitted: &str) -> bool {
    crate::crypto::hmac_verify_hex(key, &[b"pre/", cookie.as_bytes()], submitted)
}

/// A random value for the pre-sign-in cookie.
pub fn random_cookie() -> String {
    Token::generate().0
}

/// argon2id with the crate's defaults (19 MiB, 2 passes: OWASP's
/// recommendation), off the async threads.
pub async fn hash_password(password: String) -> Result<String> {
    tokio::task::spawn_blocking(move || {
        Argon2::default()
            .hash_password(password.as_bytes())
            .map(|h| h.to_string())
            .map_err(|e| Error::Config(format!("password hashing failed: {e}")))
    })
    .await
    .map_err(|e| Error::Config(format!("password hashing failed: {e}")))?
}

async fn verify_password(password: String, phc: String) -> bool {
    tokio::task::spawn_blocking(move || {
        PasswordHash::new(&phc).is_ok_and(|h| {
            Argon2::default()
                .verify_password(password.as_bytes(), &h)
                .is_ok()
        })
    })
    .await
    .unwrap_or(false)
}

/// A hash no password matches, verified for unknown accounts so their
/// answer takes as long as a known one's.
fn dummy_hash() -> String {
    static DUMMY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DUMMY
        .get_or_init(|| {
            Argon2::default()
                .hash_password(Token::generate().0.as_bytes())
                .map(|h| h.to_string())
                .unwrap_or_default()
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csrf_tokens_are_bound_to_their_session() {
        let key = [7u8; 32];
        let a = Token::generate();
        let b = Token::generate();
        let t = csrf_token(&key, &a);
        assert!(csrf_ok(&key, &a, &t));
        assert!(!csrf_ok(&key, &b, &t), "another session's token is refused");
        assert!(!csrf_ok(&[8u8; 32], &a, &t), "another deployment's key");
        assert!(!csrf_ok(&key, &a, ""));
        assert!(!csrf_ok(&key, &a, "not hex"));
        let pre = random_cookie();
        let f = anonymous_csrf(&key, &pre);
        assert!(anonymous_csrf_ok(&key, &pre, &f));
        assert!(!anonymous_csrf_ok(&key, &random_cookie(), &f));
        assert!(
            !anonymous_csrf_ok(&key, &pre, &t),
            "a session token is not a pre-sign-in one"
        );
    }

    #[test]
    fn passwords_and_emails_are_checked() {
        assert!(check_password("short").is_err());
        assert!(check_password("twelve chars").is_ok());
        assert!(check_password(&"x".repeat(2000)).is_err());
        assert_eq!(
            normalise_email(" Ada@Example.COM ").unwrap(),
            "ada@example.com"
        );
        for bad in ["", "no-at", "two@@at", "@x", "x@", "sp ace@x.y"] {
            assert!(normalise_email(bad).is_err(), "{bad}");
        }
        assert_eq!(Role::parse("viewer").unwrap(), Role::Viewer);
        assert!(Role::parse("admin").is_err());
    }

    #[tokio::test]
    async fn passwords_verify_only_themselves() {
        let h = hash_password("correct horse battery".to_owned())
            .await
            .unwrap();
        assert!(h.starts_with("$argon2id$"), "{h}");
        assert!(verify_password("correct horse battery".to_owned(), h.clone()).await);
        assert!(!verify_password("correct horse batterY".to_owned(), h).await);
        assert!(!verify_password("anything".to_owned(), dummy_hash()).await);
    }

    #[test]
    fn tokens_never_print() {
        let t = Token::generate();
        assert!(!format!("{t:?}").contains(t.as_str()));
        assert_eq!(t.as_str().len(), 43);
    }
}
