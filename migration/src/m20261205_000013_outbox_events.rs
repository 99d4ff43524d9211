//! Grouped outbox rows: a sink that only ever reads its rows back in
//! batches (the Parquet mirror) is owed one row per writing transaction,
//! its events' bodies one after another, instead of one row per event.
//! `events` says how many events a row carries, so a batch can be sized
//! and a backlog counted in events. Rows of other sinks carry one. Expand
//! only: a previous release writes rows without it (one event each).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum OutboxSinks {
    Table,
    Events,
}

// The trait's signature elides the manager's lifetime.
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(OutboxSinks::Table)
                    .add_column(
                        ColumnDef::new(OutboxSinks::Events)
                            .integer()
                            .not_null()
                            .default(1),
                    )
                    .to_owned(),
            )
            .await
    }
}
