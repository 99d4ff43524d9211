//! A backend's engine: everything it does its own way, as the handles
//! that need it declare it ([`IngestEngine`], [`ProcessingEngine`],
//! [`WaitingEngine`], [`EventsEngine`], [`PartitionsEngine`]), and its
//! schema migrations.
//! `postgres.rs` and `sqlite.rs` implement it; the handles see only their
//! own part.

use async_trait::async_trait;

use super::{
    events::EventsEngine, ingest::IngestEngine, partitions::PartitionsEngine,
    processing::ProcessingEngine, waiting::WaitingEngine,
};
use crate::error::Result;

/// What a backend does its own way: the storage layout of events (monthly
/// partitions), the hot path's bulk statements, schema migrations.
#[async_trait]
pub(crate) trait Engine:
    IngestEngine
    + ProcessingEngine
    + WaitingEngine
    + EventsEngine
    + PartitionsEngine
    + std::fmt::Debug
    + 'static
{
    /// Applies pending migrations.
    async fn migrate(&self) -> Result<()>;
}
