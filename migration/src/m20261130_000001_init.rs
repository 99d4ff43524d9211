//! The initial schema: tenants and keys, the durable ingest path
//! (idempotency keys, inbox, processed fence), contacts and the partitioned
//! `tracked_events`, and per-tenant processing leases.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

const POSTGRES: &str = r#"
CREATE TABLE tenants (
    id uuid PRIMARY KEY,
    name text NOT NULL UNIQUE,
    plan text NOT NULL,
    retention_months integer,
    created_at timestamptz NOT NULL
);
CREATE TABLE api_keys (
    id uuid PRIMARY KEY,
    tenant_id uuid NOT NULL REFERENCES tenants (id),
    key_hash bytea NOT NULL UNIQUE,
    prefix text NOT NULL,
    rate_limit_rps integer,
    created_at timestamptz NOT NULL,
    revoked_at timestamptz
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id);
CREATE TABLE idempotency_keys (
    tenant_id uuid NOT NULL,
    idempotency_key text NOT NULL,
    event_id uuid NOT NULL,
    fingerprint bytea NOT NULL,
    occurred_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, idempotency_key)
);
CREATE TABLE inbox (
    seq bigint GENERATED ALWAYS AS IDENTITY,
    tenant_id uuid NOT NULL,
    event_id uuid NOT NULL,
    payload text NOT NULL,
    received_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, seq)
);
CREATE TABLE processed_jobs (
    event_id uuid PRIMARY KEY,
    tenant_id uuid NOT NULL,
    processed_at timestamptz NOT NULL
);
CREATE TABLE contacts (
    id uuid PRIMARY KEY,
    tenant_id uuid NOT NULL,
    merged_into uuid,
    traits jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE INDEX contacts_merged_into ON contacts (merged_into) WHERE merged_into IS NOT NULL;
CREATE TABLE contact_identities (
    tenant_id uuid NOT NULL,
    kind smallint NOT NULL,
    value text NOT NULL,
    contact_id uuid NOT NULL,
    PRIMARY KEY (tenant_id, kind, value)
);
CREATE INDEX contact_identities_contact ON contact_identities (contact_id);
CREATE TABLE tracked_events (
    tenant_id uuid NOT NULL,
    occurred_at timestamptz NOT NULL,
    id uuid NOT NULL,
    retention_class smallint NOT NULL,
    kind text NOT NULL,
    event text,
    contact_id uuid NOT NULL,
    user_id text,
    anonymous_id text,
    properties jsonb NOT NULL,
    occurred_offset_s integer NOT NULL,
    received_at timestamptz NOT NULL,
    idempotency_key text NOT NULL,
    PRIMARY KEY (tenant_id, occurred_at, id, retention_class)
) PARTITION BY RANGE (occurred_at);
CREATE INDEX tracked_events_contact ON tracked_events (tenant_id, contact_id, occurred_at);
CREATE TABLE tracked_events_default PARTITION OF tracked_events DEFAULT;
CREATE TABLE tenant_leases (
    tenant_id uuid PRIMARY KEY,
    node_id uuid NOT NULL,
    expires_at timestamptz NOT NULL
)
"#;

// SQLite: uuids are 16-byte blobs, timestamps are integer microseconds since
// the epoch (sortable and comparable), JSON is text. `tracked_events` is one
// table per month and retention class, created by the storage layer.
const SQLITE: &str = r#"
CREATE TABLE tenants (
    id BLOB PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    plan TEXT NOT NULL,
    retention_months INTEGER,
    created_at INTEGER NOT NULL
);
CREATE TABLE api_keys (
    id BLOB PRIMARY KEY,
    tenant_id BLOB NOT NULL REFERENCES tenants (id),
    key_hash BLOB NOT NULL UNIQUE,
    prefix TEXT NOT NULL,
    rate_limit_rps INTEGER,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id);
CREATE TABLE idempotency_keys (
    tenant_id BLOB NOT NULL,
    idempotency_key TEXT NOT NULL,
    event_id BLOB NOT NULL,
    fingerprint BLOB NOT NULL,
    occurred_at INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, idempotency_key)
) WITHOUT ROWID;
CREATE TABLE inbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id BLOB NOT NULL,
    event_id BLOB NOT NULL,
    payload TEXT NOT NULL,
    received_at INTEGER NOT NULL
);
CREATE INDEX inbox_tenant_seq ON inbox (tenant_id, seq);
CREATE TABLE processed_jobs (
    event_id BLOB PRIMARY KEY,
    tenant_id BLOB NOT NULL,
    processed_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE contacts (
    id BLOB PRIMARY KEY,
    tenant_id BLOB NOT NULL,
    merged_into BLOB,
    traits TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX contacts_merged_into ON contacts (merged_into) WHERE merged_into IS NOT NULL;
CREATE TABLE contact_identities (
    tenant_id BLOB NOT NULL,
    kind INTEGER NOT NULL,
    value TEXT NOT NULL,
    contact_id BLOB NOT NULL,
    PRIMARY KEY (tenant_id, kind, value)
) WITHOUT ROWID;
CREATE INDEX contact_identities_contact ON contact_identities (contact_id);
CREATE TABLE tenant_leases (
    tenant_id BLOB PRIMARY KEY,
    node_id BLOB NOT NULL,
    expires_at INTEGER NOT NULL
)
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
