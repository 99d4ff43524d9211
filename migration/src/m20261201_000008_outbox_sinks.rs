//! Outbound sinks as data: what an outbox row still owes moves from one
//! boolean and one claim column per consumer (`publish_pending`,
//! `fanout_pending`, …) to `outbox_sinks`, a row per (sink, outbox row)
//! with its own claim. A new sink is rows under a new name, not a column.
//! Rows owed at upgrade keep their claims and attempt counts.
//!
//! Written once for both backends with the schema builder; the column
//! types that differ (time) come from [`crate::column`].

use sea_orm_migration::prelude::*;

use crate::column;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum OutboxSinks {
    Table,
    Sink,
    OutboxId,
    ClaimedUntil,
    Attempts,
}

#[derive(DeriveIden)]
enum Outbox {
    Table,
    PublishPending,
    FanoutPending,
    ClaimedUntil,
    FanoutClaimedUntil,
    Attempts,
}

// The trait's signature elides the manager's lifetime.
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        manager
            .create_table(
                Table::create()
                    .table(OutboxSinks::Table)
                    .col(ColumnDef::new(OutboxSinks::Sink).text().not_null())
                    .col(
                        ColumnDef::new(OutboxSinks::OutboxId)
                            .big_integer()
                            .not_null(),
                    )
                    .col(column::time(backend, OutboxSinks::ClaimedUntil))
                    .col(
                        ColumnDef::new(OutboxSinks::Attempts)
                            .integer()
                            .not_null()
                            .default(0),
                    )
                    .primary_key(
                        Index::create()
                            .col(OutboxSinks::Sink)
                            .col(OutboxSinks::OutboxId),
                    )
                    .to_owned(),
            )
            .await?;
        // Completing a row asks whether any sink still owes it.
        manager
            .create_index(
                Index::create()
                    .name("outbox_sinks_row")
                    .table(OutboxSinks::Table)
                    .col(OutboxSinks::OutboxId)
                    .to_owned(),
            )
            .await?;
        let conn = manager.get_connection();
        conn.execute_unprepared(
            "INSERT INTO outbox_sinks (sink, outbox_id, claimed_until, attempts) \
             SELECT 'amqp', id, claimed_until, attempts FROM outbox WHERE publish_pending",
        )
        .await?;
        conn.execute_unprepared(
            "INSERT INTO outbox_sinks (sink, outbox_id, claimed_until) \
             SELECT 'webhooks', id, fanout_claimed_until FROM outbox WHERE fanout_pending",
        )
        .await?;
        for index in ["outbox_publish", "outbox_fanout"] {
            manager
                .drop_index(Index::drop().name(index).table(Outbox::Table).to_owned())
                .await?;
        }
        // One column per statement: SQLite alters one thing at a time.
        for column in [
            Outbox::PublishPending,
            Outbox::FanoutPending,
            Outbox::ClaimedUntil,
            Outbox::FanoutClaimedUntil,
            Outbox::Attempts,
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Outbox::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        crate::run_on_postgres(
            manager,
            &format!(
                "ALTER TABLE outbox_sinks SET ({})",
                crate::m20261130_000006_queue_vacuum::QUEUE_TABLE_OPTIONS
            ),
        )
        .await
    }
}
