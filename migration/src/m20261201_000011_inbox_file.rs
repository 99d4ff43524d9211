//! The embedded store's front-door tables move to a file of their own.
//!
//! On SQLite, `idempotency_keys` and `inbox` leave the main file for the
//! inbox file the store attaches to every connection (schema `inbox_db`),
//! so the 202's group commits and the processing that follows them write
//! different files through different writers. Rows move with their tables:
//! an event accepted by the previous release and not yet processed is
//! processed after the upgrade. PostgreSQL is unchanged.
//!
//! SQLite runs a migration without a transaction: each statement below
//! commits on its own, in an order that never drops a table before its rows
//! are in the new one, and every statement can run again after a crash.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend, Statement};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// The schema name the store attaches the inbox file under.
const INBOX_SCHEMA: &str = "inbox_db";

/// Each table as it stands after the earlier migrations, its indexes, and
/// its columns.
const TABLES: [(&str, &str, &str, &str); 2] = [
    (
        "idempotency_keys",
        "CREATE TABLE IF NOT EXISTS inbox_db.idempotency_keys (
            tenant_id BLOB NOT NULL,
            idempotency_key TEXT NOT NULL,
            event_id BLOB NOT NULL,
            fingerprint BLOB NOT NULL,
            occurred_at INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            PRIMARY KEY (tenant_id, idempotency_key)
        ) WITHOUT ROWID",
        "CREATE INDEX IF NOT EXISTS inbox_db.idempotency_keys_expiry \
         ON idempotency_keys (tenant_id, occurred_at)",
        "tenant_id, idempotency_key, event_id, fingerprint, occurred_at, created_at",
    ),
    (
        "inbox",
        "CREATE TABLE IF NOT EXISTS inbox_db.inbox (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            tenant_id BLOB NOT NULL,
            event_id BLOB NOT NULL,
            payload TEXT NOT NULL,
            received_at INTEGER NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            last_error TEXT
        )",
        "CREATE INDEX IF NOT EXISTS inbox_db.inbox_tenant_seq ON inbox (tenant_id, seq)",
        "seq, tenant_id, event_id, payload, received_at, attempts, last_error",
    ),
];

// The trait's signature elides the manager's lifetime.
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Sqlite {
            return Ok(());
        }
        let conn = manager.get_connection();
        let count = |sql: String| async move {
            let row = conn
                .query_one_raw(Statement::from_string(DbBackend::Sqlite, sql))
                .await?
                .ok_or_else(|| DbErr::Migration("count returned no row".to_owned()))?;
            row.try_get_by_index::<i64>(0)
        };
        if count(format!(
            "SELECT count(*) FROM pragma_database_list WHERE name = '{INBOX_SCHEMA}'"
        ))
        .await?
            == 0
        {
            return Err(DbErr::Migration(format!(
                "the embedded database is migrated by fastack itself, which attaches the \
                 inbox file as `{INBOX_SCHEMA}`; run `fastack migrate` instead"
            )));
        }
        for (table, create, index, columns) in TABLES {
            let in_main = count(format!(
                "SELECT count(*) FROM main.sqlite_master WHERE type = 'table' AND name = '{table}'"
            ))
            .await?;
            conn.execute_unprepared(create).await?;
            conn.execute_unprepared(index).await?;
            if in_main == 0 {
                continue;
            }
            conn.execute_unprepared(&format!(
                "INSERT OR IGNORE INTO {INBOX_SCHEMA}.{table} ({columns}) \
                 SELECT {columns} FROM main.{table}"
            ))
            .await?;
            conn.execute_unprepared(&format!("DROP TABLE main.{table}"))
                .await?;
        }
        Ok(())
    }
}
