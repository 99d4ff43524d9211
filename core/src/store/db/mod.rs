//! The backend seam: one way to write a statement, bind its values and read
//! its rows on PostgreSQL and on SQLite, so each transaction is written
//! once. What differs between the two lives here and only here:
//!
//! - **values**: an instant is `timestamptz` on PostgreSQL and integer
//!   microseconds on SQLite; JSON is `jsonb` or text; ids are `uuid` or
//!   16-byte blobs (sqlx encodes a `Uuid` as either);
//! - **lists**: a list parameter is an array (`= ANY($1)`) on PostgreSQL and
//!   a JSON array unpacked with `json_each` on SQLite ([`Dialect::in_list`]);
//! - **claims**: `FOR UPDATE SKIP LOCKED` on PostgreSQL; SQLite has one
//!   writer, so a claim needs no row locks ([`Dialect::skip_locked`]);
//! - **pools**: SQLite reads go to a reader pool and writes to its single
//!   writer connection.
//!
//! Two ways to write a statement run here: [`Q`], SQL text with `$n`
//! placeholders (both backends accept them) for the hot path's tuned
//! statements, and sea-orm's backend-neutral queries over the records of
//! `fastack_entities::db` ([`Db`] is a sea-orm connection; [`Tx::run`] and
//! [`Tx::models`] take its queries inside a transaction). Both bind an
//! instant the same way, so a table can be read and written either way.
//!
//! In four layers: [`dialect`] (what the SQL looks like on each backend,
//! bulk inserts), [`statement`] (a statement's values and its rows),
//! [`conn`] (the pools and transactions) and [`orm`] (the pools as a
//! sea-orm connection). No table is named here: a statement of one table
//! lives with the records it reads or writes.

use std::{
    borrow::Cow,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use async_trait::async_trait;
use chrono::{DateTime, TimeZone, Utc};
use sea_orm::{
    ConnectionTrait, DbBackend, DbErr, ExecResult, FromQueryResult, QueryResult, QueryTrait,
    RuntimeErr, Statement,
};
use sea_query_sqlx::SqlxValues;
use serde_json::{Map, Value};
use sqlx::{
    AssertSqlSafe, PgPool, Postgres, Row as _, Sqlite, SqlitePool, Transaction, postgres::PgRow,
    sqlite::SqliteRow,
};
use uuid::Uuid;

use crate::error::{Error, Result};

mod conn;
mod dialect;
mod orm;
mod statement;

pub use conn::{Db, Tx, from_micros};
pub use dialect::{Col, Dialect, ListKind};
pub use statement::{Arg, Q, Row};

/// Stored models as domain values.
pub(crate) fn domain<M, T>(models: Vec<M>) -> Result<Vec<T>>
where
    T: TryFrom<M>,
    Error: From<T::Error>,
{
    models
        .into_iter()
        .map(|m| T::try_from(m).map_err(Error::from))
        .collect()
}

pub(crate) fn domain_opt<M, T>(model: Option<M>) -> Result<Option<T>>
where
    T: TryFrom<M>,
    Error: From<T::Error>,
{
    model
        .map(|m| T::try_from(m).map_err(Error::from))
        .transpose()
}

/// Rows per multi-row insert (SQLite binds at most 32,766 values to one
/// statement).
pub(crate) const ROWS_PER_INSERT: usize = 1_000;

/// A unique violation is a conflict with a readable message.
pub(crate) fn unique_as_conflict(err: Error, what: &str) -> Error {
    match &err {
        Error::Database(sqlx::Error::Database(db)) if db.is_unique_violation() => {
            Error::Conflict(format!("{what} already exists"))
        }
        _ => err,
    }
}

pub(crate) fn corrupt(e: impl std::fmt::Display) -> Error {
    Error::Corrupt(e.to_string())
}

pub(crate) fn u32_of(v: i64) -> u32 {
    v.clamp(0, i64::from(u32::MAX)) as u32
}

pub(crate) fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}
