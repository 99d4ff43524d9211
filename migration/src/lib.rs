//! Schema migrations for both storage backends. New migrations are written
//! once with sea-orm-migration's schema builder, taking the column types
//! that differ from [`column`]; the early ones carry exact SQL per backend
//! (they are kept as they ran: a migration never changes once released).
//!
//! Time-partitioned `tracked_events` partitions are created at run time by
//! the storage layer (they depend on the clock), never here.

pub use sea_orm_migration::prelude::*;

mod column;
mod m20261130_000001_init;
mod m20261130_000002_jobs_outbox;
mod m20261130_000003_default_tripwire;
mod m20261130_000004_webhooks;
mod m20261130_000005_ingest_fast_path;
mod m20261130_000006_queue_vacuum;
mod m20261201_000007_quarantine;
mod m20261201_000008_outbox_sinks;
mod m20261201_000009_tracking_plans;
mod m20261201_000010_console;
mod m20261201_000011_inbox_file;
mod m20261205_000012_outbox_batches;
mod m20261205_000013_outbox_events;
mod m20261205_000014_outbox_lz4;
mod m20261205_000015_privacy;
mod m20261206_000016_master_key;
mod m20261206_000017_accept_log;
mod m20261207_000018_lease_marks;

pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261130_000001_init::Migration),
            Box::new(m20261130_000002_jobs_outbox::Migration),
            Box::new(m20261130_000003_default_tripwire::Migration),
            Box::new(m20261130_000004_webhooks::Migration),
            Box::new(m20261130_000005_ingest_fast_path::Migration),
            Box::new(m20261130_000006_queue_vacuum::Migration),
            Box::new(m20261201_000007_quarantine::Migration),
            Box::new(m20261201_000008_outbox_sinks::Migration),
            Box::new(m20261201_000009_tracking_plans::Migration),
            Box::new(m20261201_000010_console::Migration),
            Box::new(m20261201_000011_inbox_file::Migration),
            Box::new(m20261205_000012_outbox_batches::Migration),
            Box::new(m20261205_000013_outbox_events::Migration),
            Box::new(m20261205_000014_outbox_lz4::Migration),
            Box::new(m20261205_000015_privacy::Migration),
            Box::new(m20261206_000016_master_key::Migration),
            Box::new(m20261206_000017_accept_log::Migration),
            Box::new(m20261207_000018_lease_marks::Migration),
        ]
    }
}

/// Applies this build's pending migrations — unless a newer release has
/// migrated the database already (a migration is applied that this build
/// does not know). Releases only add migrations, so this build's are all
/// applied then, and releases only expand the schema, so this build runs
/// on it: an older node that restarts in the middle of a rolling upgrade
/// starts instead of refusing. Returns the unknown migrations (empty when
/// this build migrated or had nothing to do).
pub async fn up(db: &sea_orm_migration::sea_orm::DatabaseConnection) -> Result<Vec<String>, DbErr> {
    let known: std::collections::HashSet<String> = Migrator::migrations()
        .iter()
        .map(|m| m.name().to_owned())
        .collect();
    let newer: Vec<String> = Migrator::get_migration_models(db)
        .await?
        .into_iter()
        .map(|m| m.version)
        .filter(|v| !known.contains(v))
        .collect();
    if newer.is_empty() {
        let pending: Vec<String> = Migrator::get_pending_migrations(db)
            .await?
            .iter()
            .map(|m| m.name().to_owned())
            .collect();
        Migrator::up(db, None).await?;
        // One line for the operator (sea-orm's own, one per migration,
        // are at debug).
        if let (Some(first), Some(last)) = (pending.first(), pending.last()) {
            tracing::info!(
                applied = pending.len(),
                %first,
                %last,
                "schema migrated"
            );
        }
    }
    Ok(newer)
}

/// Runs a list of statements, one at a time (SQLite's driver prepares one
/// statement per call).
pub(crate) async fn run_all(manager: &SchemaManager<'_>, sql: &str) -> Result<(), DbErr> {
    let conn = manager.get_connection();
    for stmt in sql.split(";\n").map(str::trim).filter(|s| !s.is_empty()) {
        conn.execute_unprepared(stmt).await?;
    }
    Ok(())
}

/// Like [`run_all`], on PostgreSQL only: for what SQLite does not need.
pub(crate) async fn run_on_postgres(manager: &SchemaManager<'_>, sql: &str) -> Result<(), DbErr> {
    match manager.get_database_backend() {
        sea_orm_migration::sea_orm::DbBackend::Postgres => run_all(manager, sql).await,
        _ => Ok(()),
    }
}
