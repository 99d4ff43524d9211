//! Batches in the outbox: a sink that writes files (the Parquet mirror)
//! claims owed rows as a named batch. The name is set once, with the claim
//! that takes the rows, and never changes: a batch whose claim expired (its
//! node died between writing a file and recording it) is claimed again
//! whole, so its file is written again under the same name with the same
//! rows. Rows of other sinks leave it empty. Expand only: a previous
//! release reads and writes the table without knowing the column.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum OutboxSinks {
    Table,
    Sink,
    Batch,
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
                    .add_column(ColumnDef::new(OutboxSinks::Batch).text().null())
                    .to_owned(),
            )
            .await?;
        // A relay looks for a batch to take again by sink and name.
        manager
            .create_index(
                Index::create()
                    .name("outbox_sinks_batch")
                    .table(OutboxSinks::Table)
                    .col(OutboxSinks::Sink)
                    .col(OutboxSinks::Batch)
                    .to_owned(),
            )
            .await
    }
}
