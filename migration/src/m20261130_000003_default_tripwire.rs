//! The DEFAULT partition of `tracked_events` must stay empty: rows land in
//! monthly partitions created before their first row. This constraint makes
//! the promise a tripwire — a row that would fall into DEFAULT (a missing or
//! just-dropped month) is refused with an error instead of silently landing
//! there, and the processor retries after re-creating its partition.
//! SQLite has no DEFAULT partition.
//!
//! Also the indexes retention needs to forget idempotency keys with their
//! events, and at most one active
//! retention job per partition (several nodes may schedule them).

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

// The trait's signature elides the manager's lifetime.
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        match manager.get_database_backend() {
            DbBackend::Postgres => {
                crate::run_all(
                    manager,
                    "ALTER TABLE tracked_events_default \
                     ADD CONSTRAINT tracked_events_default_stays_empty CHECK (false);\n\
                     CREATE INDEX idempotency_keys_expiry ON idempotency_keys (tenant_id, occurred_at);\n\
                     CREATE UNIQUE INDEX jobs_one_active_retention ON jobs ((params->>'partition')) \
                     WHERE kind = 'retention' AND status IN ('queued', 'processing')",
                )
                .await
            }
            _ => {
                crate::run_all(
                    manager,
                    "CREATE INDEX idempotency_keys_expiry ON idempotency_keys (tenant_id, occurred_at);\n\
                     CREATE UNIQUE INDEX jobs_one_active_retention ON jobs (json_extract(params, '$.partition')) \
                     WHERE kind = 'retention' AND status IN ('queued', 'processing')",
                )
                .await
            }
        }
    }
}
