//! What an event is and the rules it meets: validation at the front door
//! (one rule for every backend), strict JSON, and identity resolution in
//! processing. (The tracking plan's check is `taxonomy.rs`, which also
//! installs plans.)

pub mod identity;
pub mod json;
pub mod validate;
