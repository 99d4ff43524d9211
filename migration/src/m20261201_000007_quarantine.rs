//! Quarantine: an inbox row that fails processing again and again moves to
//! `quarantine` (with its error and attempt count) instead of stalling its
//! tenant. The inbox keeps each row's failed attempts and last error, so
//! the count survives restarts and node takeovers.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

const POSTGRES: &str = r#"
ALTER TABLE inbox ADD COLUMN attempts integer NOT NULL DEFAULT 0;
ALTER TABLE inbox ADD COLUMN last_error text;
CREATE TABLE quarantine (
    tenant_id uuid NOT NULL,
    event_id uuid NOT NULL,
    payload text NOT NULL,
    received_at timestamptz NOT NULL,
    error text NOT NULL,
    attempts integer NOT NULL,
    quarantined_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, event_id)
);
"#;

const SQLITE: &str = r#"
ALTER TABLE inbox ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE inbox ADD COLUMN last_error TEXT;
CREATE TABLE quarantine (
    tenant_id BLOB NOT NULL,
    event_id BLOB NOT NULL,
    payload TEXT NOT NULL,
    received_at INTEGER NOT NULL,
    error TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    quarantined_at INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, event_id)
) WITHOUT ROWID;
"#;

// The trait's signature elides the manager's lifetime.
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        match manager.get_database_backend() {
            DbBackend::Postgres => crate::run_all(manager, POSTGRES).await,
            DbBackend::Sqlite => crate::run_all(manager, SQLITE).await,
            other => Err(DbErr::Migration(format!(
                "unsupported database backend {other:?}"
            ))),
        }
    }
}
