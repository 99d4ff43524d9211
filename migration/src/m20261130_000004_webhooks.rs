//! Webhook endpoints (secrets encrypted at rest), deliveries (one per event
//! and endpoint, durable retry schedule) and the attempt log; the outbox
//! gets its own claim for the webhook fan-out (independent of the relay's).

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

const POSTGRES: &str = r#"
CREATE TABLE webhook_endpoints (
    id uuid PRIMARY KEY,
    tenant_id uuid NOT NULL REFERENCES tenants (id),
    url text NOT NULL,
    events text NOT NULL,
    secret_enc bytea NOT NULL,
    previous_secret_enc bytea,
    previous_until timestamptz,
    enabled boolean NOT NULL,
    disabled_reason text,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE INDEX webhook_endpoints_tenant ON webhook_endpoints (tenant_id);
CREATE TABLE webhook_deliveries (
    id uuid PRIMARY KEY,
    endpoint_id uuid NOT NULL REFERENCES webhook_endpoints (id),
    tenant_id uuid NOT NULL,
    event_type text NOT NULL,
    ce_id text NOT NULL,
    body text NOT NULL,
    status text NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz,
    claimed_until timestamptz,
    created_at timestamptz NOT NULL,
    emitted_at timestamptz NOT NULL,
    last_attempt_at timestamptz,
    UNIQUE (endpoint_id, ce_id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_tenant ON webhook_deliveries (tenant_id, created_at DESC);
CREATE TABLE webhook_attempts (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id uuid NOT NULL,
    attempt integer NOT NULL,
    attempted_at timestamptz NOT NULL,
    status_code integer,
    error_kind text,
    latency_ms integer NOT NULL
);
CREATE INDEX webhook_attempts_delivery ON webhook_attempts (delivery_id, attempt);
ALTER TABLE outbox ADD COLUMN fanout_claimed_until timestamptz
"#;

const SQLITE: &str = r#"
CREATE TABLE webhook_endpoints (
    id BLOB PRIMARY KEY,
    tenant_id BLOB NOT NULL REFERENCES tenants (id),
    url TEXT NOT NULL,
    events TEXT NOT NULL,
    secret_enc BLOB NOT NULL,
    previous_secret_enc BLOB,
    previous_until INTEGER,
    enabled INTEGER NOT NULL,
    disabled_reason TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX webhook_endpoints_tenant ON webhook_endpoints (tenant_id);
CREATE TABLE webhook_deliveries (
    id BLOB PRIMARY KEY,
    endpoint_id BLOB NOT NULL REFERENCES webhook_endpoints (id),
    tenant_id BLOB NOT NULL,
    event_type TEXT NOT NULL,
    ce_id TEXT NOT NULL,
    body TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER,
    claimed_until INTEGER,
    created_at INTEGER NOT NULL,
    emitted_at INTEGER NOT NULL,
    last_attempt_at INTEGER,
    UNIQUE (endpoint_id, ce_id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_tenant ON webhook_deliveries (tenant_id, created_at DESC);
CREATE TABLE webhook_attempts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    delivery_id BLOB NOT NULL,
    attempt INTEGER NOT NULL,
    attempted_at INTEGER NOT NULL,
    status_code INTEGER,
    error_kind TEXT,
    latency_ms INTEGER NOT NULL
);
CREATE INDEX webhook_attempts_delivery ON webhook_attempts (delivery_id, attempt);
ALTER TABLE outbox ADD COLUMN fanout_claimed_until INTEGER
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
