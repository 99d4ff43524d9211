//! fastack's HTTP surface: the tenant API (`/v1/core/…`), ops endpoints,
//! the OpenAPI spec and docs, the admin listener, the account console, and
//! node start/stop.

pub mod admin;
pub mod allow;
pub mod body;
pub mod console;
pub mod dto;
pub mod erasures;
pub mod exports;
pub mod front_door;
pub mod gate;
pub mod ingest;
pub mod listener;
pub mod problem;
pub mod routes;
pub mod server;
pub mod spec;
pub mod state;

pub use server::{Server, StartOptions, openapi_json, start};

/// The release, as the OpenAPI documents and `/healthz` give it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Failures of the node itself (start-up, listener), as opposed to error
/// answers to requests ([`problem::ApiError`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Core(#[from] fastack_core::Error),
    #[error(transparent)]
    Actors(#[from] fastack_actors::Error),
    #[error("cannot listen on {addr} (set by {setting})")]
    Bind {
        addr: std::net::SocketAddr,
        /// The setting that moves the listener elsewhere.
        setting: &'static str,
        #[source]
        source: std::io::Error,
    },
}
