//! Jobs, their pending-event marker, and the transactional outbox.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

const POSTGRES: &str = r#"
CREATE TABLE jobs (
    id uuid PRIMARY KEY,
    tenant_id uuid NOT NULL,
    kind text NOT NULL,
    status text NOT NULL,
    params jsonb NOT NULL,
    metadata jsonb NOT NULL,
    result jsonb,
    execution_time_ms bigint,
    created_at timestamptz NOT NULL,
    started_at timestamptz,
    finished_at timestamptz,
    claimed_by uuid,
    claim_expires_at timestamptz,
    attempts integer NOT NULL DEFAULT 0,
    event_pending boolean NOT NULL DEFAULT false,
    event_body text,
    repair_claimed_until timestamptz
);
CREATE INDEX jobs_tenant_created ON jobs (tenant_id, created_at DESC);
CREATE INDEX jobs_runnable ON jobs (created_at) WHERE status IN ('queued', 'processing');
CREATE INDEX jobs_event_pending ON jobs (finished_at) WHERE event_pending;
CREATE TABLE outbox (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id uuid NOT NULL,
    topic text NOT NULL,
    routing_key text NOT NULL,
    ce_id text NOT NULL,
    subject text NOT NULL,
    body text NOT NULL,
    job_id uuid,
    created_at timestamptz NOT NULL,
    publish_pending boolean NOT NULL,
    fanout_pending boolean NOT NULL,
    claimed_until timestamptz,
    attempts integer NOT NULL DEFAULT 0
);
CREATE INDEX outbox_publish ON outbox (id) WHERE publish_pending;
CREATE INDEX outbox_fanout ON outbox (id) WHERE fanout_pending;
CREATE INDEX outbox_job ON outbox (job_id) WHERE job_id IS NOT NULL
"#;

const SQLITE: &str = r#"
CREATE TABLE jobs (
    id BLOB PRIMARY KEY,
    tenant_id BLOB NOT NULL,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    params TEXT NOT NULL,
    metadata TEXT NOT NULL,
    result TEXT,
    execution_time_ms INTEGER,
    created_at INTEGER NOT NULL,
    started_at INTEGER,
    finished_at INTEGER,
    claimed_by BLOB,
    claim_expires_at INTEGER,
    attempts INTEGER NOT NULL DEFAULT 0,
    event_pending INTEGER NOT NULL DEFAULT 0,
    event_body TEXT,
    repair_claimed_until INTEGER
);
CREATE INDEX jobs_tenant_created ON jobs (tenant_id, created_at DESC);
CREATE INDEX jobs_runnable ON jobs (created_at) WHERE status IN ('queued', 'processing');
CREATE INDEX jobs_event_pending ON jobs (finished_at) WHERE event_pending;
CREATE TABLE outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id BLOB NOT NULL,
    topic TEXT NOT NULL,
    routing_key TEXT NOT NULL,
    ce_id TEXT NOT NULL,
    subject TEXT NOT NULL,
    body TEXT NOT NULL,
    job_id BLOB,
    created_at INTEGER NOT NULL,
    publish_pending INTEGER NOT NULL,
    fanout_pending INTEGER NOT NULL,
    claimed_until INTEGER,
    attempts INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX outbox_publish ON outbox (id) WHERE publish_pending;
CREATE INDEX outbox_fanout ON outbox (id) WHERE fanout_pending;
CREATE INDEX outbox_job ON outbox (job_id) WHERE job_id IS NOT NULL
"#;

// The trait's signature elides the manager's lifetime.
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        match manager.get_database_backend() {
            DbBackend::Postgres => crate::run_all(manager, POSTGRES).await,
            DbBackend::Sqlite => crate::run_all(manager, SQLITE).await,
            other => Err(DbErr::Migration(format!(
                "unsupported database backend {other:?}"
            ))),
        }
    }
}
