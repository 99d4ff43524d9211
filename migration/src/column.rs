//! Column types that differ between the backends, for migrations written
//! once with the schema builder. SQLite keeps times as INTEGER microseconds
//! since the epoch (UTC) and uuids as 16-byte BLOBs; PostgreSQL uses
//! `timestamptz` and `uuid`.

use sea_orm_migration::{prelude::*, sea_orm::DbBackend};

/// A nullable point in time.
pub fn time(backend: DbBackend, name: impl IntoIden) -> ColumnDef {
    let mut col = ColumnDef::new(name);
    match backend {
        DbBackend::Postgres => col.timestamp_with_time_zone(),
        _ => col.big_integer(),
    };
    col.null();
    col
}

/// A uuid that must be there.
pub fn id(backend: DbBackend, name: impl IntoIden) -> ColumnDef {
    let mut col = ColumnDef::new(name);
    match backend {
        DbBackend::Postgres => col.uuid(),
        _ => col.blob(),
    };
    col.not_null();
    col
}

/// A nullable JSON document (`jsonb` on PostgreSQL, text on SQLite).
pub fn json(backend: DbBackend, name: impl IntoIden) -> ColumnDef {
    let mut col = ColumnDef::new(name);
    match backend {
        DbBackend::Postgres => col.json_binary(),
        _ => col.text(),
    };
    col.null();
    col
}
