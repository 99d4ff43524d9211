//! The core crate's one error type. Each variant knows the HTTP status and
//! the stable problem `code` it maps to, so the API layer never guesses.

use crate::ServiceError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database error")]
    Database(#[from] sqlx::Error),
    #[error("migration failed")]
    Migration(#[from] sea_orm::DbErr),
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
    #[error("object storage: {0}")]
    Storage(String),
    #[error("{0}")]
    Protocol(String),
    #[error("message signature rejected: {0}")]
    Signature(&'static str),
    #[error("amqp error")]
    Amqp(#[from] lapin::Error),
}

impl Error {
    pub fn io(path: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

impl ServiceError for Error {
    fn status_code(&self) -> u16 {
        match self {
            Error::NotFound { .. } => 404,
            Error::Conflict(_) => 409,
            Error::Config(_) => 500,
            Error::Corrupt(_) | Error::Protocol(_) => 500,
            Error::Signature(_) => 401,
            Error::Database(_)
            | Error::Migration(_)
            | Error::Redis(_)
            | Error::Io { .. }
            | Error::LeaseLost
            | Error::Storage(_)
            | Error::Amqp(_)
            | Error::ShuttingDown => 503,
        }
    }

    fn error_code(&self) -> &'static str {
        match self {
            Error::NotFound { .. } => "not_found",
            Error::Conflict(_) => "conflict",
            Error::Config(_) | Error::Corrupt(_) | Error::Protocol(_) => "internal",
            Error::Signature(_) => "invalid_signature",
            _ => "unavailable",
        }
    }
}
