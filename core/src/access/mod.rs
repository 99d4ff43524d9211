//! Who may send and how fast: API keys (hashed, cached) and the rate
//! limits per tenant, key and client address.

pub mod auth;
pub mod ratelimit;
