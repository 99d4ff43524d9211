//! fastack's core: configuration, storage, validation, identity resolution,
//! rate limits, API keys and metrics. No actors and no HTTP here.

pub mod admin;
pub mod amqp;
pub mod auth;
pub mod backoff;
pub mod backup;
pub mod clock;
pub mod config;
pub mod console;
pub mod crypto;
pub mod domain;
pub mod erasure;
pub mod error;
pub mod export;
pub mod faults;
pub mod health;
pub mod identity;
pub mod jobs;
pub mod json;
pub mod keyring;
pub mod logging;
pub mod metrics;
pub mod objects;
pub mod private;
pub mod ratelimit;
pub mod redact;
pub mod retention;
pub mod settings;
pub mod store;
pub mod taxonomy;
pub mod validate;
pub mod webhooks;

pub use config::Config;
pub use error::{Error, Result};

/// An error that knows how it looks to an HTTP client.
pub trait ServiceError {
    fn status_code(&self) -> u16;
    /// Stable machine-readable `code` of the problem document.
    fn error_code(&self) -> &'static str;
}
