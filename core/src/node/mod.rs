//! The node's own plumbing: settings and configuration, logging, metrics,
//! health, the clock, backoff, injected faults, owner-only files and object
//! storage.

pub mod backoff;
pub mod clock;
pub mod config;
pub mod faults;
pub mod health;
pub mod logging;
pub mod metrics;
pub mod objects;
pub mod owner_only;
pub mod settings;
