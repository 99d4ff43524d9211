//! Autovacuum settings for the queue tables. `inbox` and `outbox` take an
//! insert and a delete per event, so at the default thresholds (20 % of
//! the table dead) their heaps and key indexes fill with dead rows that
//! every read of the queue has to step over. Vacuuming them after a fixed
//! number of dead rows keeps them near the size of their backlog. The
//! vacuum keeps PostgreSQL's default throttling: unthrottled (cost delay 0)
//! it stalled the front door (open-loop p99 88 ms in one of two runs).
//! It applies only where autovacuum runs, which is PostgreSQL's default;
//! SQLite frees deleted rows itself.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// The storage parameters given to each queue table.
pub(crate) const QUEUE_TABLE_OPTIONS: &str =
    "autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000";

// The trait's signature elides the manager's lifetime.
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        crate::run_on_postgres(
            manager,
            &format!(
                "ALTER TABLE inbox SET ({QUEUE_TABLE_OPTIONS});\n\
                 ALTER TABLE outbox SET ({QUEUE_TABLE_OPTIONS});"
            ),
        )
        .await
    }
}
