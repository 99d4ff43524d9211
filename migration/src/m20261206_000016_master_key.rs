//! `master_key`: one row saying which master key (`FASTACK_ENC_KEY`) the
//! store is written with — a check value derived from it, never the key —
//! and the store's root key wrapped by it, from which every other key
//! derives. A node checks its master key against the row at start; a
//! rotation re-wraps the root key under a new master key. Written once
//! with the schema builder.

use sea_orm_migration::prelude::*;

use crate::column;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum MasterKey {
    Table,
    Id,
    CheckValue,
    WrappedRoot,
    CreatedAt,
    RotatedAt,
}

// The trait's signature elides the manager's lifetime.
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        let mut created_at = column::time(backend, MasterKey::CreatedAt);
        created_at.not_null();
        manager
            .create_table(
                Table::create()
                    .table(MasterKey::Table)
                    .if_not_exists()
                    // One row: id 1.
                    .col(
                        ColumnDef::new(MasterKey::Id)
                            .integer()
                            .not_null()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(MasterKey::CheckValue).text().not_null())
                    .col(ColumnDef::new(MasterKey::WrappedRoot).blob().not_null())
                    .col(created_at)
                    .col(column::time(backend, MasterKey::RotatedAt))
                    .to_owned(),
            )
            .await
    }
}
