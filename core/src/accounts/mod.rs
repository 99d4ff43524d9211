//! The operator's and the account console's rules: tenants, keys, plans
//! and endpoints as an operator manages them; console users and sessions.

pub mod admin;
pub mod console;
