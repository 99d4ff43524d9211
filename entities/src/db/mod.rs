//! The plain records as sea-orm entities: one module a table, read and
//! written with sea-orm's backend-neutral queries by the store. Each
//! `Model` is the row as stored; `TryFrom<Model>` gives the domain type the
//! rest of the code uses (a stored value that does not parse is
//! [`Corrupt`], never a panic).
//!
//! The hot path's tables (idempotency keys, inbox, events, contacts, the
//! outbox) are not here: their statements are hand-tuned per backend.

pub mod api_key;
pub mod console_link;
pub mod console_session;
pub mod console_user;
pub mod job;
pub mod master_key;
pub mod quarantine;
pub mod tenant;
mod time;
pub mod tracking_plan;
pub mod webhook_attempt;
pub mod webhook_delivery;
pub mod webhook_endpoint;

pub use time::Time;

/// A stored value that the domain type does not accept.
#[derive(Debug, thiserror::Error)]
#[error("stored {what} is invalid: {detail}")]
pub struct Corrupt {
    pub what: &'static str,
    pub detail: String,
}

impl Corrupt {
    pub(crate) fn of(what: &'static str) -> impl Fn(String) -> Corrupt {
        move |detail| Corrupt { what, detail }
    }
}

/// A count or limit stored as a signed integer, read back unsigned.
pub fn unsigned(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

/// An unsigned count stored in a signed integer column.
pub fn signed(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}
