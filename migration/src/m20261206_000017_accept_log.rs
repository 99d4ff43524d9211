//! The embedded store's accept log (SQLite only; PostgreSQL is unchanged):
//! an accepted event is written once, to the log files under the data
//! directory, and processing records its idempotency key beside the event
//! in the main file. So `idempotency_keys` moves from the inbox file back
//! into the main file (every key kept), and two tables come: `log_cursors`,
//! each tenant's last log record processed (written by the processing
//! transaction: the second fence), and `log_failures`, the failed attempts
//! at a log record (what `inbox.attempts` counts for an inbox row). The
//! inbox table stays: rows an earlier release accepted and a quarantined
//! event put back wait there until the node moves them into the log.

use sea_orm_migration::{
    prelude::*,
    sea_orm::{DbBackend, Statement},
};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Schema name of the attached inbox file.
const INBOX_SCHEMA: &str = "inbox_db";

const STATEMENTS: [&str; 4] = [
    "CREATE TABLE IF NOT EXISTS main.idempotency_keys (
        tenant_id BLOB NOT NULL,
        idempotency_key TEXT NOT NULL,
        event_id BLOB NOT NULL,
        fingerprint BLOB NOT NULL,
        occurred_at INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (tenant_id, idempotency_key)
    ) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS main.idempotency_keys_expiry \
     ON idempotency_keys (tenant_id, occurred_at)",
    "CREATE TABLE IF NOT EXISTS main.log_cursors (
        tenant_id BLOB PRIMARY KEY,
        seq INTEGER NOT NULL
    ) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS main.log_failures (
        tenant_id BLOB NOT NULL,
        seq INTEGER NOT NULL,
        attempts INTEGER NOT NULL,
        last_error TEXT,
        PRIMARY KEY (tenant_id, seq)
    ) WITHOUT ROWID",
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
        for sql in STATEMENTS {
            conn.execute_unprepared(sql).await?;
        }
        let in_inbox = conn
            .query_one_raw(Statement::from_string(
                DbBackend::Sqlite,
                format!(
                    "SELECT count(*) FROM {INBOX_SCHEMA}.sqlite_master \
                     WHERE type = 'table' AND name = 'idempotency_keys'"
                ),
            ))
            .await?
            .ok_or_else(|| DbErr::Migration("count returned no row".to_owned()))?
            .try_get_by_index::<i64>(0)?;
        if in_inbox > 0 {
            let columns =
                "tenant_id, idempotency_key, event_id, fingerprint, occurred_at, created_at";
            conn.execute_unprepared(&format!(
                "INSERT OR IGNORE INTO main.idempotency_keys ({columns}) \
                 SELECT {columns} FROM {INBOX_SCHEMA}.idempotency_keys"
            ))
            .await?;
            conn.execute_unprepared(&format!("DROP TABLE {INBOX_SCHEMA}.idempotency_keys"))
                .await?;
        }
        Ok(())
    }
}
