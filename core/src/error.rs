//! The core crate's one error type. Each variant knows the HTTP status and
//! the stable problem `code` it maps to, so the API layer never guesses.

use crate::ServiceError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Shown with the SQLSTATE, constraint and table when the database
    /// answered (never the statement's values), else with what failed.
    #[error("database error: {}", describe_sqlx(.0))]
    Database(#[from] sqlx::Error),
    /// The embedded group commit's own connection (see
    /// `store::sqlite_inbox`); SQLite's messages carry no row values.
    #[error("database error: {0}")]
    Embedded(#[from] rusqlite::Error),
    #[error("migration failed")]
    Migration(#[source] sea_orm::DbErr),
    /// What sea-orm said when it was not the database answering (a value
    /// it could not convert, a record it expected).
    #[error("database error: {0}")]
    Orm(#[source] sea_orm::DbErr),
    #[error("redis error")]
    Redis(#[from] redis::RedisError),
    #[error("i/o error on {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A command-line tool found no embedded database where the
    /// configuration points (it never creates one by accident).
    #[error(
        "no fastack database at {path}: run the command where the server runs, or point \
         FASTACK_DATA_DIR (or FASTACK_DATABASE_URL) at the server's data; `fastack migrate` \
         creates an empty one there"
    )]
    NoDatabase { path: String },
    /// A dependency failed its check at start (see [`crate::health`]).
    #[error("cannot use the {dependency} at {location} (check {settings}): {error}")]
    Dependency {
        dependency: &'static str,
        location: String,
        settings: &'static str,
        error: String,
    },
    /// A webhook endpoint refused at registration (its URL or events).
    #[error("endpoint refused: {0}")]
    InvalidEndpoint(String),
    /// A tracking plan refused at installation (its shape or a schema).
    #[error("tracking plan refused: {0}")]
    InvalidPlan(String),
    /// A value a person typed that does not parse (a time, say).
    #[error("{0}")]
    InvalidInput(String),
    #[error("{what} not found")]
    NotFound { what: &'static str },
    #[error("{0}")]
    Conflict(String),
    #[error("processing lease for the tenant was lost")]
    LeaseLost,
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("service is shutting down")]
    ShuttingDown,
    /// A dependency did not answer within the time the caller had: nothing
    /// was done (a write that might still land carries a guard that makes
    /// it a no-op once this deadline has passed).
    #[error("{0} did not answer in time")]
    Deadline(&'static str),
    #[error("storage: {0}")]
    Storage(String),
    #[error("{0}")]
    Protocol(String),
    #[error("message signature rejected: {0}")]
    Signature(&'static str),
    #[error("amqp error")]
    Amqp(#[from] lapin::Error),
    /// A fault injected by a test (see [`crate::faults`]); never raised in
    /// production.
    #[error("injected fault: {0}")]
    Injected(String),
}

/// sea-orm carries the driver's error: kept as [`Error::Database`] so a
/// refusal is told from an outage the same way for both ways of querying.
impl From<sea_orm::DbErr> for Error {
    fn from(e: sea_orm::DbErr) -> Self {
        use sea_orm::{DbErr, RuntimeErr};
        match e {
            DbErr::Exec(RuntimeErr::SqlxError(s))
            | DbErr::Query(RuntimeErr::SqlxError(s))
            | DbErr::Conn(RuntimeErr::SqlxError(s)) => match std::sync::Arc::try_unwrap(s) {
                Ok(e) => Error::Database(e),
                Err(s) => Error::Orm(DbErr::Query(RuntimeErr::SqlxError(s))),
            },
            DbErr::Type(m) | DbErr::Json(m) => Error::Corrupt(m),
            DbErr::TryIntoErr { from, into, source } => {
                Error::Corrupt(format!("{from} into {into}: {source}"))
            }
            other => Error::Orm(other),
        }
    }
}

impl From<std::convert::Infallible> for Error {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}

impl From<fastack_entities::db::Corrupt> for Error {
    fn from(e: fastack_entities::db::Corrupt) -> Self {
        Error::Corrupt(e.to_string())
    }
}

/// What a sqlx error says, without bound values: SQLSTATE, constraint,
/// table and the server's message (PostgreSQL puts row values in its
/// `detail`, which is left out).
pub fn describe_sqlx(err: &sqlx::Error) -> String {
    match err {
        sqlx::Error::Database(db) => {
            let mut out = format!("[{}] {}", db.code().unwrap_or_default(), db.message());
            if let Some(c) = db.constraint() {
                out.push_str(&format!(" (constraint {c})"));
            }
            if let Some(t) = db.table() {
                out.push_str(&format!(" (table {t})"));
            }
            out
        }
        other => other.to_string(),
    }
}

impl Error {
    pub fn io(path: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// Whether the database refused the statement because of the values in
    /// it (a constraint, a value it cannot store) rather than because it is
    /// unreachable or busy: the same rows would fail the same way again, so
    /// they belong to one request or one event, not to everyone.
    pub fn is_refusal(&self) -> bool {
        match self {
            Error::Database(sqlx::Error::Database(db)) => {
                use sqlx::error::ErrorKind;
                let code = db.code();
                let code = code.as_deref().unwrap_or_default();
                match db.kind() {
                    ErrorKind::UniqueViolation
                    | ErrorKind::ForeignKeyViolation
                    | ErrorKind::NotNullViolation
                    | ErrorKind::CheckViolation => true,
                    // PostgreSQL SQLSTATE (always five characters): class
                    // 22 (data exception), 23 (integrity constraint).
                    _ if code.len() == 5 => code.starts_with("22") || code.starts_with("23"),
                    // SQLite result codes (at most four digits): the primary
                    // code is the low byte; CONSTRAINT, TOOBIG, MISMATCH, RANGE.
                    _ => code
                        .parse::<u32>()
                        .is_ok_and(|n| matches!(n & 0xff, 19 | 18 | 20 | 25)),
                }
            }
            Error::Database(sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_)) => true,
            Error::Embedded(rusqlite::Error::SqliteFailure(e, _)) => {
                matches!(e.extended_code & 0xff, 19 | 18 | 20 | 25)
            }
            Error::Embedded(
                rusqlite::Error::ToSqlConversionFailure(_)
                | rusqlite::Error::FromSqlConversionFailure(..)
                | rusqlite::Error::IntegralValueOutOfRange(..),
            ) => true,
            Error::Corrupt(_) | Error::Injected(_) => true,
            _ => false,
        }
    }
}

impl ServiceError for Error {
    fn status_code(&self) -> u16 {
        match self {
            Error::NotFound { .. } => 404,
            Error::Conflict(_) => 409,
            Error::InvalidEndpoint(_) | Error::InvalidPlan(_) | Error::InvalidInput(_) => 422,
            Error::Config(_) | Error::NoDatabase { .. } => 500,
            Error::Corrupt(_) | Error::Protocol(_) | Error::Injected(_) => 500,
            Error::Signature(_) => 401,
            Error::Orm(_) => 500,
            Error::Database(_)
            | Error::Embedded(_)
            | Error::Migration(_)
            | Error::Redis(_)
            | Error::Io { .. }
            | Error::LeaseLost
            | Error::Storage(_)
            | Error::Amqp(_)
            | Error::Deadline(_)
            | Error::Dependency { .. }
            | Error::ShuttingDown => 503,
        }
    }

    fn error_code(&self) -> &'static str {
        match self {
            Error::NotFound { .. } => "not_found",
            Error::Conflict(_) => "conflict",
            Error::InvalidEndpoint(_) => "invalid_endpoint",
            Error::InvalidPlan(_) => "invalid_plan",
            Error::InvalidInput(_) => "invalid_request",
            Error::Config(_)
            | Error::NoDatabase { .. }
            | Error::Corrupt(_)
            | Error::Orm(_)
            | Error::Protocol(_)
            | Error::Injected(_) => "internal",
            Error::Signature(_) => "invalid_signature",
            _ => "unavailable",
        }
    }
}
