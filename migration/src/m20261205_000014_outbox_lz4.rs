//! Outbox bodies compressed with LZ4 on PostgreSQL. A grouped row holds a
//! whole round of events (tens of kilobytes), so every such row is
//! compressed when it is written and decompressed when its batch is read;
//! LZ4 does both at about twice the speed of the default (pglz), for
//! slightly larger rows. Only rows written from now on are affected; a
//! server built without LZ4 (or older than PostgreSQL 14) keeps pglz, as
//! this is a matter of speed, not of what is stored. SQLite is unchanged.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend};

#[derive(DeriveMigrationName)]
pub struct Migration;

// The trait's signature elides the manager's lifetime.
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        manager
            .get_connection()
            .execute_unprepared(
                "DO $$ BEGIN \
                   EXECUTE 'ALTER TABLE outbox ALTER COLUMN body SET COMPRESSION lz4'; \
                 EXCEPTION WHEN feature_not_supported OR syntax_error \
                   OR invalid_parameter_value THEN NULL; \
                 END $$",
            )
            .await
            .map(drop)
    }
}
