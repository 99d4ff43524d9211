//! Tracking plans: `tracking_plans` keeps every version of every tenant's
//! plan (a removal is a version without a document), and each stored event
//! gains `annotations`, what the plan said of it at acceptance (the version
//! and, in flag mode, its violations); NULL for events without a plan.
//!
//! Written once with the schema builder. `tracked_events` is one
//! partitioned table on PostgreSQL (the column reaches every partition) and
//! one table per month on SQLite, each altered here; new months are created
//! with the column by the storage layer.

use sea_orm_migration::{prelude::*, sea_orm::DbBackend};

use crate::column;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum TrackingPlans {
    Table,
    TenantId,
    Version,
    Document,
    InstalledAt,
}

#[derive(DeriveIden)]
enum TrackedEvents {
    Annotations,
}

// The trait's signature elides the manager's lifetime.
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        let mut installed_at = column::time(backend, TrackingPlans::InstalledAt);
        installed_at.not_null();
        manager
            .create_table(
                Table::create()
                    .table(TrackingPlans::Table)
                    .col(column::id(backend, TrackingPlans::TenantId))
                    .col(ColumnDef::new(TrackingPlans::Version).integer().not_null())
                    .col(ColumnDef::new(TrackingPlans::Document).text().null())
                    .col(installed_at)
                    .primary_key(
                        Index::create()
                            .col(TrackingPlans::TenantId)
                            .col(TrackingPlans::Version),
                    )
                    .to_owned(),
            )
            .await?;
        let tables = match backend {
            DbBackend::Postgres => vec!["tracked_events".to_owned()],
            _ => {
                let rows = manager
                    .get_connection()
                    .query_all_raw(sea_orm_migration::sea_orm::Statement::from_string(
                        backend,
                        "SELECT name FROM sqlite_master WHERE type = 'table' \
                         AND name LIKE 'tracked_events_y%'",
                    ))
                    .await?;
                rows.iter()
                    .map(|r| r.try_get::<String>("", "name"))
                    .collect::<Result<_, _>>()?
            }
        };
        for table in tables {
            manager
                .alter_table(
                    Table::alter()
                        .table(Alias::new(table))
                        .add_column(column::json(backend, TrackedEvents::Annotations))
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
