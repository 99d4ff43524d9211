//! fastack's core: the rules and the storage, with no actors and no HTTP.
//!
//! - `events/`: what an event is and the rules it meets (validation, strict
//!   JSON, identity resolution); `taxonomy.rs`: tracking plans;
//! - `access/`: API keys and rate limits;
//! - `store/`: every transaction, one handle per record kind;
//! - `jobs/`: how a job ends, exports and retention; `erasure.rs`: erasures
//!   and suppressions;
//! - `wire/`: what leaves the node (webhook signatures, CloudEvents);
//! - `accounts/`: the operator's and the console's rules;
//! - `secrets/`: encryption and redaction; `keyring.rs`: the master key's
//!   check and rotation;
//! - `node/`: settings, logging, metrics, health, clock, faults, owner-only
//!   files, object storage; `backup.rs`: backups and restores; `delta.rs`:
//!   a Delta Lake table's log (the lake's commits).

pub mod access;
pub mod accounts;
pub mod backup;
pub mod delta;
pub mod domain;
pub mod erasure;
pub mod error;
pub mod events;
pub mod jobs;
pub mod keyring;
pub mod node;
pub mod secrets;
pub mod store;
pub mod taxonomy;
pub mod wire;

// Each module by its own name too, as the rest of the workspace names them.
pub use access::{auth, ratelimit};
pub use accounts::{admin, console};
pub use events::{identity, json, validate};
pub use jobs::{export, retention};
pub use node::{
    backoff, clock, config, faults, health, logging, metrics, objects, owner_only, settings,
};
pub use secrets::{crypto, redact};
pub use wire::{amqp, webhooks};

pub use config::Config;
pub use error::{Error, Result};

/// An error that knows how it looks to an HTTP client.
pub trait ServiceError {
    fn status_code(&self) -> u16;
    /// Stable machine-readable `code` of the problem document.
    fn error_code(&self) -> &'static str;
}
