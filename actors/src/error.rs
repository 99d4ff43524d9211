//! The actors crate's one error type.

use fastack_core::ServiceError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Core(#[from] fastack_core::Error),
    #[error("failed to start actor {actor}")]
    Spawn {
        actor: &'static str,
        #[source]
        source: ractor::SpawnErr,
    },
    #[error("{actor} is not running")]
    Unavailable { actor: &'static str },
}

impl ServiceError for Error {
    fn status_code(&self) -> u16 {
        match self {
            Error::Core(e) => e.status_code(),
            Error::Spawn { .. } | Error::Unavailable { .. } => 503,
        }
    }

    fn error_code(&self) -> &'static str {
        match self {
            Error::Core(e) => e.error_code(),
            Error::Spawn { .. } | Error::Unavailable { .. } => "unavailable",
        }
    }
}
