//! The account console's records: its users, their one-time links and
//! their sign-ins; and when each API key was last used. Written once with
//! the schema builder.

use sea_orm_migration::prelude::*;

use crate::column;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum ConsoleUsers {
    Table,
    Id,
    TenantId,
    Email,
    Role,
    PasswordHash,
    FailedSignins,
    LockedUntil,
    CreatedAt,
}

#[derive(DeriveIden)]
enum ApiKeys {
    Table,
    LastUsedAt,
}

#[derive(DeriveIden)]
enum ConsoleLinks {
    Table,
    TokenHash,
    UserId,
    ExpiresAt,
    UsedAt,
}

#[derive(DeriveIden)]
enum ConsoleSessions {
    Table,
    TokenHash,
    UserId,
    CreatedAt,
    LastSeenAt,
    ExpiresAt,
}

fn required(mut col: ColumnDef) -> ColumnDef {
    col.not_null();
    col
}

// The trait's signature elides the manager's lifetime.
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let b = manager.get_database_backend();
        manager
            .create_table(
                Table::create()
                    .table(ConsoleUsers::Table)
                    .col(column::id(b, ConsoleUsers::Id).primary_key())
                    .col(column::id(b, ConsoleUsers::TenantId))
                    .col(
                        ColumnDef::new(ConsoleUsers::Email)
                            .text()
                            .not_null()
                            .unique_key(),
                    )
                    .col(ColumnDef::new(ConsoleUsers::Role).text().not_null())
                    .col(ColumnDef::new(ConsoleUsers::PasswordHash).text().null())
                    .col(
                        ColumnDef::new(ConsoleUsers::FailedSignins)
                            .integer()
                            .not_null()
                            .default(0),
                    )
                    .col(column::time(b, ConsoleUsers::LockedUntil))
                    .col(required(column::time(b, ConsoleUsers::CreatedAt)))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("console_users_by_tenant")
                    .table(ConsoleUsers::Table)
                    .col(ConsoleUsers::TenantId)
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(ConsoleLinks::Table)
                    .col(
                        ColumnDef::new(ConsoleLinks::TokenHash)
                            .blob()
                            .not_null()
                            .primary_key(),
                    )
                    .col(column::id(b, ConsoleLinks::UserId))
                    .col(required(column::time(b, ConsoleLinks::ExpiresAt)))
                    .col(column::time(b, ConsoleLinks::UsedAt))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(ConsoleSessions::Table)
                    .col(
                        ColumnDef::new(ConsoleSessions::TokenHash)
                            .blob()
                            .not_null()
                            .primary_key(),
                    )
                    .col(column::id(b, ConsoleSessions::UserId))
                    .col(required(column::time(b, ConsoleSessions::CreatedAt)))
                    .col(required(column::time(b, ConsoleSessions::LastSeenAt)))
                    .col(required(column::time(b, ConsoleSessions::ExpiresAt)))
                    .to_owned(),
            )
            .await?;
        // The console's key list shows when each key was last used.
        manager
            .alter_table(
                Table::alter()
                    .table(ApiKeys::Table)
                    .add_column(column::time(b, ApiKeys::LastUsedAt))
                    .to_owned(),
            )
            .await?;
        // Sign-out everywhere deletes a user's sessions by user.
        manager
            .create_index(
                Index::create()
                    .name("console_sessions_by_user")
                    .table(ConsoleSessions::Table)
                    .col(ConsoleSessions::UserId)
                    .to_owned(),
            )
            .await?;
        Ok(())
    }
}
