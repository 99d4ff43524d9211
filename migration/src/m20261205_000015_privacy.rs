//! Erasure and suppression: `erasures` (one row per request: whom it covers,
//! its window, what it removed so far), `erasure_holds` (the identifiers a
//! running erasure covers: processing drops their events, within the
//! erasure's window, until it ends) and `suppressions` (identifiers whose
//! events processing drops until the suppression is lifted), and
//! `erasure_objects` (each object an erasure rewrote). Identifiers
//! are kept as the hex SHA-256 of their value in the last two; the request
//! keeps its identifiers only while its job runs. Written once with the
//! schema builder.

use sea_orm_migration::prelude::*;

use crate::column;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Erasures {
    Table,
    Id,
    TenantId,
    Request,
    Subjects,
    Report,
    Suppress,
    WindowFrom,
    WindowTo,
    Watermark,
    CreatedAt,
}

#[derive(DeriveIden)]
enum ErasureHolds {
    Table,
    TenantId,
    Kind,
    Sha256,
    RequestId,
    Dropped,
}

#[derive(DeriveIden)]
enum ErasureObjects {
    Table,
    RequestId,
    Store,
    Path,
    Entry,
}

#[derive(DeriveIden)]
enum Suppressions {
    Table,
    TenantId,
    Kind,
    Sha256,
    RequestId,
    CreatedAt,
    Dropped,
}

fn required(mut col: ColumnDef) -> ColumnDef {
    col.not_null();
    col
}

fn counter(name: impl IntoIden) -> ColumnDef {
    let mut col = ColumnDef::new(name);
    col.big_integer().not_null().default(0);
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
                    .table(Erasures::Table)
                    .col(column::id(b, Erasures::Id).primary_key())
                    .col(column::id(b, Erasures::TenantId))
                    .col(column::json(b, Erasures::Request))
                    .col(required(column::json(b, Erasures::Subjects)))
                    .col(required(column::json(b, Erasures::Report)))
                    .col(ColumnDef::new(Erasures::Suppress).boolean().not_null())
                    .col(column::time(b, Erasures::WindowFrom))
                    .col(column::time(b, Erasures::WindowTo))
                    .col(ColumnDef::new(Erasures::Watermark).big_integer().null())
                    .col(required(column::time(b, Erasures::CreatedAt)))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(ErasureHolds::Table)
                    .col(column::id(b, ErasureHolds::TenantId))
                    .col(
                        ColumnDef::new(ErasureHolds::Kind)
                            .small_integer()
                            .not_null(),
                    )
                    .col(ColumnDef::new(ErasureHolds::Sha256).text().not_null())
                    .col(column::id(b, ErasureHolds::RequestId))
                    .col(counter(ErasureHolds::Dropped))
                    .primary_key(
                        Index::create()
                            .col(ErasureHolds::TenantId)
                            .col(ErasureHolds::Kind)
                            .col(ErasureHolds::Sha256)
                            .col(ErasureHolds::RequestId),
                    )
                    .to_owned(),
            )
            .await?;
        // An erasure's end removes its holds by request.
        manager
            .create_index(
                Index::create()
                    .name("erasure_holds_by_request")
                    .table(ErasureHolds::Table)
                    .col(ErasureHolds::RequestId)
                    .to_owned(),
            )
            .await?;
        // What an erasure did to each object it rewrote (an archive, an
        // export result, a lake file), recorded before the object is
        // replaced.
        manager
            .create_table(
                Table::create()
                    .table(ErasureObjects::Table)
                    .col(column::id(b, ErasureObjects::RequestId))
                    .col(ColumnDef::new(ErasureObjects::Store).text().not_null())
                    .col(ColumnDef::new(ErasureObjects::Path).text().not_null())
                    .col(required(column::json(b, ErasureObjects::Entry)))
                    .primary_key(
                        Index::create()
                            .col(ErasureObjects::RequestId)
                            .col(ErasureObjects::Store)
                            .col(ErasureObjects::Path),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(Suppressions::Table)
                    .col(column::id(b, Suppressions::TenantId))
                    .col(
                        ColumnDef::new(Suppressions::Kind)
                            .small_integer()
                            .not_null(),
                    )
                    .col(ColumnDef::new(Suppressions::Sha256).text().not_null())
                    .col(column::id(b, Suppressions::RequestId))
                    .col(required(column::time(b, Suppressions::CreatedAt)))
                    .col(counter(Suppressions::Dropped))
                    .primary_key(
                        Index::create()
                            .col(Suppressions::TenantId)
                            .col(Suppressions::Kind)
                            .col(Suppressions::Sha256),
                    )
                    .to_owned(),
            )
            .await?;
        Ok(())
    }
}
