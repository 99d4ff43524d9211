//! Keeping secrets secret: encryption under keys derived from the master
//! key, and redaction of what is logged. (The master key's check and
//! rotation over the store is `keyring.rs`.)

pub mod crypto;
pub mod redact;
