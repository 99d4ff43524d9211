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

/// Which SQL a backend speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Postgres,
    Sqlite,
}

/// What a list parameter holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListKind {
    Uuid,
    Int,
    Text,
}

impl Dialect {
    /// `col` is one of the values of list parameter `$n`.
    pub fn in_list(self, col: &str, n: usize, kind: ListKind) -> String {
        match (self, kind) {
            (Dialect::Postgres, _) => format!("{col} = ANY(${n})"),
            (Dialect::Sqlite, ListKind::Uuid) => {
                format!("{col} IN (SELECT unhex(value) FROM json_each(${n}))")
            }
            (Dialect::Sqlite, _) => format!("{col} IN (SELECT value FROM json_each(${n}))"),
        }
    }

    /// List parameter `$n` as a table `q` of one column `v`: to join a
    /// table's key against, or to look each value up with a correlated
    /// subquery (the identity probe does: PostgreSQL, misled by a young
    /// table's statistics, plans `= ANY(list)` as a filter over a tenant's
    /// whole key range, and a join as a hash of it).
    pub fn list_rows(self, n: usize, kind: ListKind) -> String {
        match (self, kind) {
            (Dialect::Postgres, ListKind::Uuid) => format!("UNNEST(${n}::uuid[]) AS q(v)"),
            (Dialect::Postgres, ListKind::Int) => format!("UNNEST(${n}::int8[]) AS q(v)"),
            (Dialect::Postgres, ListKind::Text) => format!("UNNEST(${n}::text[]) AS q(v)"),
            (Dialect::Sqlite, ListKind::Uuid) => {
                format!("(SELECT unhex(value) AS v FROM json_each(${n})) AS q")
            }
            (Dialect::Sqlite, _) => format!("(SELECT value AS v FROM json_each(${n})) AS q"),
        }
    }

    /// The ids of the rows of `table` (a `tracked_events` table) that
    /// tenant `tenant` has among `pairs` of (`occurred_at`, `id`): one
    /// primary-key lookup per pair. On SQLite the list drives the join
    /// (`CROSS JOIN` fixes the order; as a row-value `IN` or a plain join
    /// it searched the key on its first two columns only, or put the table
    /// outside).
    pub fn stored_events(self, table: &str, tenant: Uuid, pairs: &[(DateTime<Utc>, Uuid)]) -> Q {
        match self {
            Dialect::Postgres => {
                let mut q = Q::new(format!(
                    "SELECT t.id FROM UNNEST($2::timestamptz[], $3::uuid[]) AS j(at, id) \
                     JOIN {table} t ON t.tenant_id = $1 AND t.occurred_at = j.at AND t.id = j.id"
                ))
                .bind(tenant);
                q.args
                    .push(Arg::Times(pairs.iter().map(|(at, _)| *at).collect()));
                q.args
                    .push(Arg::Uuids(pairs.iter().map(|(_, id)| *id).collect()));
                q
            }
            Dialect::Sqlite => Q::new(format!(
                "SELECT t.id FROM json_each($2) AS j CROSS JOIN {table} AS t \
                 ON t.tenant_id = $1 AND t.occurred_at = (j.value ->> 0) \
                 AND t.id = unhex(j.value ->> 1)"
            ))
            .bind(tenant)
            .bind({
                // `[[micros, "hex"], …]`, written directly: a round's list
                // holds up to thousands of pairs.
                use std::fmt::Write as _;
                let mut list = String::with_capacity(2 + pairs.len() * 56);
                list.push('[');
                for (n, (at, id)) in pairs.iter().enumerate() {
                    let sep = if n == 0 { "" } else { "," };
                    let _ = write!(list, "{sep}[{},\"{}\"]", at.timestamp_micros(), id.simple());
                }
                list.push(']');
                list
            }),
        }
    }

    /// `col` is one of the values `sub` (a one-column select) returns.
    /// PostgreSQL gets the values first (`ARRAY(…)`, an init plan) and
    /// probes the key index with them; as `IN (…)` it plans a hash join
    /// over a sequential scan of the whole table.
    pub fn in_subquery(self, col: &str, sub: &str) -> String {
        match self {
            Dialect::Postgres => format!("{col} = ANY(ARRAY({sub}))"),
            Dialect::Sqlite => format!("{col} IN ({sub})"),
        }
    }

    /// What follows a `tracked_events` table's name so a search by contact
    /// uses the contact index: SQLite's planner, without statistics, takes
    /// the primary key's month-wide range instead (every row of the month
    /// read for one person's); PostgreSQL picks the index by itself.
    pub fn by_contact(self, table: &str) -> String {
        match self {
            Dialect::Postgres => String::new(),
            Dialect::Sqlite => format!(" INDEXED BY {table}_contact"),
        }
    }

    /// Member `member` of the JSON object in text column `col`, as text
    /// (`NULL` when the column holds no JSON object: a scrubbed payload).
    pub fn json_member(self, col: &str, member: &str) -> String {
        match self {
            Dialect::Postgres => {
                format!("(CASE WHEN {col} LIKE '{{%' THEN ({col})::jsonb ->> '{member}' END)")
            }
            Dialect::Sqlite => {
                format!("(CASE WHEN json_valid({col}) THEN json_extract({col}, '$.{member}') END)")
            }
        }
    }

    /// A notification on `channel`, sent when the transaction commits
    /// (PostgreSQL's `NOTIFY`); SQLite is one process, it has no one to
    /// tell.
    pub fn notify(self, channel: &'static str) -> Option<Q> {
        match self {
            Dialect::Postgres => Some(Q::new(format!("NOTIFY {channel}"))),
            Dialect::Sqlite => None,
        }
    }

    /// Row locks on `of` (a table or alias) for the inner select of a
    /// claim, so several nodes claim different rows.
    pub fn skip_locked(self, of: &str) -> String {
        match self {
            Dialect::Postgres => format!(" FOR UPDATE OF {of} SKIP LOCKED"),
            Dialect::Sqlite => String::new(),
        }
    }

    /// Row locks for a select whose rows the transaction goes on to change
    /// depending on what other transactions do to them. SQLite needs none:
    /// a transaction that writes holds the only write lock.
    pub fn lock(self) -> &'static str {
        match self {
            Dialect::Postgres => " FOR UPDATE",
            Dialect::Sqlite => "",
        }
    }
}

/// One column of a bulk insert: a value per row.
#[derive(Clone, Debug)]
pub enum Col {
    Uuid(Vec<Uuid>),
    OptUuid(Vec<Option<Uuid>>),
    Time(Vec<DateTime<Utc>>),
    Text(Vec<String>),
    OptText(Vec<Option<String>>),
    Int(Vec<i64>),
    Bytes(Vec<Vec<u8>>),
    /// JSON text, stored as `jsonb` on PostgreSQL.
    Json(Vec<String>),
    OptJson(Vec<Option<String>>),
}

impl Col {
    fn len(&self) -> usize {
        match self {
            Col::Uuid(v) => v.len(),
            Col::OptUuid(v) => v.len(),
            Col::Time(v) => v.len(),
            Col::Text(v) | Col::Json(v) => v.len(),
            Col::OptText(v) | Col::OptJson(v) => v.len(),
            Col::Int(v) => v.len(),
            Col::Bytes(v) => v.len(),
        }
    }

    /// The array parameter and the select expression of column `n`.
    fn pg(self, n: usize) -> (Arg, String) {
        match self {
            Col::Uuid(v) => (Arg::Uuids(v), format!("${n}::uuid[]")),
            Col::OptUuid(v) => (Arg::OptUuids(v), format!("${n}::uuid[]")),
            Col::Time(v) => (Arg::Times(v), format!("${n}::timestamptz[]")),
            Col::Text(v) => (Arg::Texts(v), format!("${n}::text[]")),
            Col::OptText(v) => (Arg::OptTexts(v), format!("${n}::text[]")),
            Col::Int(v) => (Arg::Ints(v), format!("${n}::int8[]")),
            Col::Bytes(v) => (Arg::ByteLists(v), format!("${n}::bytea[]")),
            Col::Json(v) => (Arg::Texts(v), format!("${n}::text[]")),
            Col::OptJson(v) => (Arg::OptTexts(v), format!("${n}::text[]")),
        }
    }

    /// Row `i` as a single value.
    fn at(&self, i: usize) -> Arg {
        match self {
            Col::Uuid(v) => Arg::Uuid(Some(v[i])),
            Col::OptUuid(v) => Arg::Uuid(v[i]),
            Col::Time(v) => Arg::Time(Some(v[i])),
            Col::Text(v) | Col::Json(v) => Arg::Text(Some(v[i].clone())),
            Col::OptText(v) | Col::OptJson(v) => Arg::Text(v[i].clone()),
            Col::Int(v) => Arg::Int(Some(v[i])),
            Col::Bytes(v) => Arg::Bytes(Some(v[i].clone())),
        }
    }
}

/// Values SQLite binds to one statement at most (its limit is 32,766).
const MAX_PARAMS: usize = 30_000;
/// Rows of one SQLite bulk insert at most.
const MAX_BULK_ROWS: usize = 512;

/// How many rows the next SQLite bulk insert takes of `left`: `cap`
/// (a power of two) while that many are left, then the largest power of
/// two that fits. A table's inserts then have at most ten texts, each
/// parsed and compiled once and then reused from the connection's
/// statement cache; with a text for every row count SQLite compiled most
/// processing rounds' inserts anew (14 % of the writer thread's time under
/// `track` load, benches/HISTORY.md).
fn bulk_rows(left: usize, cap: usize) -> usize {
    if left >= cap { cap } else { 1 << left.ilog2() }
}

impl Dialect {
    /// `INSERT INTO table (columns) … suffix` for every row: one statement
    /// of arrays on PostgreSQL (`UNNEST`: the text never changes with the
    /// row count, so it is prepared once), `VALUES` tuples on SQLite in
    /// statements of a power of two rows each ([`bulk_rows`], so that their
    /// texts repeat). `suffix` is an `ON CONFLICT` or `RETURNING` clause.
    pub fn insert(self, table: &str, columns: &[(&str, Col)], suffix: &str) -> Vec<Q> {
        let rows = columns.first().map_or(0, |(_, c)| c.len());
        if rows == 0 {
            return Vec::new();
        }
        let names: Vec<&str> = columns.iter().map(|(n, _)| *n).collect();
        let names = names.join(", ");
        match self {
            Dialect::Postgres => {
                let mut args = Vec::with_capacity(columns.len());
                let mut arrays = Vec::with_capacity(columns.len());
                let mut select = Vec::with_capacity(columns.len());
                for (i, (_, col)) in columns.iter().enumerate() {
                    let json = matches!(col, Col::Json(_) | Col::OptJson(_));
                    let (arg, array) = col.clone().pg(i + 1);
                    args.push(arg);
                    arrays.push(array);
                    select.push(if json {
                        format!("c{i}::jsonb")
                    } else {
                        format!("c{i}")
                    });
                }
                let aliases: Vec<String> = (0..columns.len()).map(|i| format!("c{i}")).collect();
                let mut q = Q::new(format!(
                    "INSERT INTO {table} ({names}) SELECT {} FROM UNNEST({}) AS x({}) {suffix}",
                    select.join(", "),
                    arrays.join(", "),
                    aliases.join(", ")
                ));
                q.args = args;
                vec![q]
            }
            Dialect::Sqlite => {
                let per = (MAX_PARAMS / columns.len().max(1)).clamp(1, MAX_BULK_ROWS);
                let cap = 1 << per.ilog2();
                let mut out = Vec::new();
                let mut start = 0;
                while start < rows {
                    let n = bulk_rows(rows - start, cap);
                    let mut tuples = String::with_capacity(n * columns.len() * 4);
                    for r in 0..n {
                        tuples.push_str(if r == 0 { "(" } else { ", (" });
                        for c in 0..columns.len() {
                            if c > 0 {
                                tuples.push_str(", ");
                            }
                            tuples.push('?');
                        }
                        tuples.push(')');
                    }
                    let mut q = Q::new(format!(
                        "INSERT INTO {table} ({names}) VALUES {tuples} {suffix}"
                    ));
                    for r in start..start + n {
                        for (_, col) in columns {
                            q.args.push(col.at(r));
                        }
                    }
                    out.push(q);
                    start += n;
                }
                out
            }
        }
    }
}

/// One bound value.
#[derive(Clone, Debug)]
pub enum Arg {
    Uuid(Option<Uuid>),
    Time(Option<DateTime<Utc>>),
    Text(Option<String>),
    Int(Option<i64>),
    Bool(bool),
    Bytes(Option<Vec<u8>>),
    Json(Option<Value>),
    Uuids(Vec<Uuid>),
    Ints(Vec<i64>),
    Texts(Vec<String>),
    /// Columns of a bulk insert, as arrays (PostgreSQL only).
    OptUuids(Vec<Option<Uuid>>),
    Times(Vec<DateTime<Utc>>),
    OptTexts(Vec<Option<String>>),
    ByteLists(Vec<Vec<u8>>),
}

macro_rules! arg_from {
    ($t:ty, $v:ident, $conv:expr) => {
        impl From<$t> for Arg {
            fn from(v: $t) -> Arg {
                let $v = v;
                $conv
            }
        }
    };
}

arg_from!(Uuid, v, Arg::Uuid(Some(v)));
arg_from!(Option<Uuid>, v, Arg::Uuid(v));
arg_from!(DateTime<Utc>, v, Arg::Time(Some(v)));
arg_from!(Option<DateTime<Utc>>, v, Arg::Time(v));
arg_from!(String, v, Arg::Text(Some(v)));
arg_from!(&str, v, Arg::Text(Some(v.to_owned())));
arg_from!(&String, v, Arg::Text(Some(v.clone())));
arg_from!(Option<String>, v, Arg::Text(v));
arg_from!(Option<&str>, v, Arg::Text(v.map(str::to_owned)));
arg_from!(i64, v, Arg::Int(Some(v)));
arg_from!(Option<i64>, v, Arg::Int(v));
arg_from!(i32, v, Arg::Int(Some(i64::from(v))));
arg_from!(u32, v, Arg::Int(Some(i64::from(v))));
arg_from!(Option<u32>, v, Arg::Int(v.map(i64::from)));
arg_from!(bool, v, Arg::Bool(v));
arg_from!(&[u8], v, Arg::Bytes(Some(v.to_vec())));
arg_from!(Vec<u8>, v, Arg::Bytes(Some(v)));
arg_from!(Option<Vec<u8>>, v, Arg::Bytes(v));
arg_from!(Value, v, Arg::Json(Some(v)));
arg_from!(Option<Value>, v, Arg::Json(v));
arg_from!(Vec<Uuid>, v, Arg::Uuids(v));
arg_from!(Vec<i64>, v, Arg::Ints(v));
arg_from!(Vec<String>, v, Arg::Texts(v));

/// A statement and its values.
#[derive(Clone, Debug)]
pub struct Q {
    sql: Cow<'static, str>,
    args: Vec<Arg>,
}

impl Q {
    pub fn new(sql: impl Into<Cow<'static, str>>) -> Self {
        Q {
            sql: sql.into(),
            args: Vec::new(),
        }
    }

    /// Binds the next `$n`.
    pub fn bind(mut self, v: impl Into<Arg>) -> Self {
        self.args.push(v.into());
        self
    }

    /// A static statement is passed as is; a built one is copied.
    fn sql(&self) -> AssertSqlSafe<Cow<'static, str>> {
        AssertSqlSafe(self.sql.clone())
    }

    fn pg(&self) -> sqlx::query::Query<'_, Postgres, sqlx::postgres::PgArguments> {
        let mut q = sqlx::query(self.sql());
        for a in &self.args {
            q = match a {
                Arg::Uuid(v) => q.bind(*v),
                Arg::Time(v) => q.bind(*v),
                Arg::Text(v) => q.bind(v.clone()),
                Arg::Int(v) => q.bind(*v),
                Arg::Bool(v) => q.bind(*v),
                Arg::Bytes(v) => q.bind(v.clone()),
                Arg::Json(v) => q.bind(v.clone()),
                Arg::Uuids(v) => q.bind(v.clone()),
                Arg::Ints(v) => q.bind(v.clone()),
                Arg::Texts(v) => q.bind(v.clone()),
                Arg::OptUuids(v) => q.bind(v.clone()),
                Arg::Times(v) => q.bind(v.clone()),
                Arg::OptTexts(v) => q.bind(v.clone()),
                Arg::ByteLists(v) => q.bind(v.clone()),
            };
        }
        q
    }

    fn lite(&self) -> sqlx::query::Query<'_, Sqlite, sqlx::sqlite::SqliteArguments> {
        let mut q = sqlx::query(self.sql());
        for a in &self.args {
            q = match a {
                Arg::Uuid(v) => q.bind(*v),
                Arg::Time(v) => q.bind(v.map(|t| t.timestamp_micros())),
                Arg::Text(v) => q.bind(v.clone()),
                Arg::Int(v) => q.bind(*v),
                Arg::Bool(v) => q.bind(*v),
                Arg::Bytes(v) => q.bind(v.clone()),
                Arg::Json(v) => q.bind(v.as_ref().map(Value::to_string)),
                Arg::Uuids(v) => q.bind(
                    Value::from(
                        v.iter()
                            .map(|u| Value::from(u.simple().to_string()))
                            .collect::<Vec<_>>(),
                    )
                    .to_string(),
                ),
                Arg::Ints(v) => q.bind(Value::from(v.clone()).to_string()),
                Arg::Texts(v) => q.bind(Value::from(v.clone()).to_string()),
                Arg::OptUuids(_) | Arg::Times(_) | Arg::OptTexts(_) | Arg::ByteLists(_) => {
                    unreachable!("array parameters are PostgreSQL's; SQLite inserts VALUES rows")
                }
            };
        }
        q
    }
}

/// A row of either backend, read by column name.
pub enum Row {
    Pg(PgRow),
    Lite(SqliteRow),
}

impl Row {
    pub fn uuid(&self, col: &str) -> Result<Uuid> {
        Ok(match self {
            Row::Pg(r) => r.try_get(col)?,
            Row::Lite(r) => r.try_get(col)?,
        })
    }

    pub fn opt_uuid(&self, col: &str) -> Result<Option<Uuid>> {
        Ok(match self {
            Row::Pg(r) => r.try_get(col)?,
            Row::Lite(r) => r.try_get(col)?,
        })
    }

    pub fn time(&self, col: &str) -> Result<DateTime<Utc>> {
        self.opt_time(col)?
            .ok_or_else(|| Error::Corrupt(format!("{col} is null")))
    }

    pub fn opt_time(&self, col: &str) -> Result<Option<DateTime<Utc>>> {
        match self {
            Row::Pg(r) => Ok(r.try_get(col)?),
            Row::Lite(r) => r
                .try_get::<Option<i64>, _>(col)?
                .map(from_micros)
                .transpose(),
        }
    }

    /// A text column that must not be NULL (SQLite's driver would read a
    /// NULL as an empty string; both backends call it corrupt instead).
    pub fn text(&self, col: &str) -> Result<String> {
        self.opt_text(col)?
            .ok_or_else(|| Error::Corrupt(format!("{col} is null")))
    }

    pub fn opt_text(&self, col: &str) -> Result<Option<String>> {
        Ok(match self {
            Row::Pg(r) => r.try_get(col)?,
            Row::Lite(r) => r.try_get(col)?,
        })
    }

    /// An integer column of any width.
    pub fn int(&self, col: &str) -> Result<i64> {
        self.opt_int(col)?
            .ok_or_else(|| Error::Corrupt(format!("{col} is null")))
    }

    pub fn opt_int(&self, col: &str) -> Result<Option<i64>> {
        match self {
            Row::Lite(r) => Ok(r.try_get(col)?),
            Row::Pg(r) => {
                use sqlx::{Column, TypeInfo};
                let width = r
                    .columns()
                    .iter()
                    .find(|c| c.name() == col)
                    .map(|c| c.type_info().name().to_owned())
                    .unwrap_or_default();
                Ok(match width.as_str() {
                    "INT2" => r.try_get::<Option<i16>, _>(col)?.map(i64::from),
                    "INT4" => r.try_get::<Option<i32>, _>(col)?.map(i64::from),
                    _ => r.try_get(col)?,
                })
            }
        }
    }

    pub fn bytes(&self, col: &str) -> Result<Vec<u8>> {
        Ok(match self {
            Row::Pg(r) => r.try_get(col)?,
            Row::Lite(r) => r.try_get(col)?,
        })
    }

    pub fn bool(&self, col: &str) -> Result<bool> {
        Ok(match self {
            Row::Pg(r) => r.try_get(col)?,
            Row::Lite(r) => r.try_get(col)?,
        })
    }

    pub fn json(&self, col: &str) -> Result<Value> {
        Ok(self.opt_json(col)?.unwrap_or(Value::Null))
    }

    pub fn opt_json(&self, col: &str) -> Result<Option<Value>> {
        match self {
            Row::Pg(r) => Ok(r.try_get(col)?),
            Row::Lite(r) => r
                .try_get::<Option<String>, _>(col)?
                .map(|t| {
                    serde_json::from_str(&t)
                        .map_err(|e| Error::Corrupt(format!("{col} is not JSON: {e}")))
                })
                .transpose(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_inserts_per_dialect() {
        let cols = [
            ("a", Col::Uuid(vec![Uuid::nil(), Uuid::max()])),
            ("b", Col::Json(vec!["{}".into(), "[]".into()])),
        ];
        let pg = Dialect::Postgres.insert("t", &cols, "RETURNING a");
        assert_eq!(pg.len(), 1);
        assert_eq!(
            pg[0].sql,
            "INSERT INTO t (a, b) SELECT c0, c1::jsonb FROM UNNEST($1::uuid[], $2::text[]) AS x(c0, c1) RETURNING a"
        );
        let lite = Dialect::Sqlite.insert("t", &cols, "");
        assert_eq!(
            lite[0].sql.trim(),
            "INSERT INTO t (a, b) VALUES (?, ?), (?, ?)"
        );
        assert_eq!(lite[0].args.len(), 4);
        // Many rows: statements of a power of two rows, at most 512 and
        // under SQLite's parameter limit, every row once and in order.
        let many = [("a", Col::Int((0..1_300).collect()))];
        let split = Dialect::Sqlite.insert("t", &many, "");
        let sizes: Vec<usize> = split.iter().map(|q| q.args.len()).collect();
        assert_eq!(sizes, [512, 512, 256, 16, 4]);
        let values: Vec<i64> = split
            .iter()
            .flat_map(|q| &q.args)
            .map(|a| match a {
                Arg::Int(Some(v)) => *v,
                other => panic!("unexpected argument {other:?}"),
            })
            .collect();
        assert_eq!(values, (0..1_300).collect::<Vec<i64>>());
        let wide: Vec<(&str, Col)> = (0..100)
            .map(|_| ("a", Col::Int((0..1_000).collect())))
            .collect();
        let sizes: Vec<usize> = Dialect::Sqlite
            .insert("t", &wide, "")
            .iter()
            .map(|q| q.args.len() / 100)
            .collect();
        assert_eq!(sizes, [256, 256, 256, 128, 64, 32, 8]);
        assert_eq!(bulk_rows(1, 512), 1);
        assert_eq!(bulk_rows(511, 512), 256);
        assert!(
            Dialect::Sqlite
                .insert("t", &[("a", Col::Int(vec![]))], "")
                .is_empty()
        );
        assert_eq!(
            Dialect::Sqlite.in_list("id", 2, ListKind::Uuid),
            "id IN (SELECT unhex(value) FROM json_each($2))"
        );
    }
}

/// An instant stored as integer microseconds (SQLite).
pub fn from_micros(v: i64) -> Result<DateTime<Utc>> {
    Utc.timestamp_micros(v)
        .single()
        .ok_or_else(|| Error::Corrupt(format!("timestamp {v}")))
}

/// The connections of a store.
#[derive(Clone, Debug)]
pub enum Db {
    Pg(PgPool),
    /// One writer connection; readers in a pool of their own. `relaxed`
    /// says the writer was last left not syncing its commits; the writer
    /// pool sets it back before handing it out again.
    Lite {
        writer: SqlitePool,
        reader: SqlitePool,
        relaxed: Arc<AtomicBool>,
    },
}

impl Db {
    pub fn dialect(&self) -> Dialect {
        match self {
            Db::Pg(_) => Dialect::Postgres,
            Db::Lite { .. } => Dialect::Sqlite,
        }
    }

    /// A read (on SQLite, from the reader pool).
    pub async fn read(&self, q: Q) -> Result<Vec<Row>> {
        Ok(match self {
            Db::Pg(p) => q
                .pg()
                .fetch_all(p)
                .await?
                .into_iter()
                .map(Row::Pg)
                .collect(),
            Db::Lite { reader, .. } => q
                .lite()
                .fetch_all(reader)
                .await?
                .into_iter()
                .map(Row::Lite)
                .collect(),
        })
    }

    pub async fn read_opt(&self, q: Q) -> Result<Option<Row>> {
        Ok(match self {
            Db::Pg(p) => q.pg().fetch_optional(p).await?.map(Row::Pg),
            Db::Lite { reader, .. } => q.lite().fetch_optional(reader).await?.map(Row::Lite),
        })
    }

    pub async fn read_one(&self, q: Q) -> Result<Row> {
        Ok(match self {
            Db::Pg(p) => Row::Pg(q.pg().fetch_one(p).await?),
            Db::Lite { reader, .. } => Row::Lite(q.lite().fetch_one(reader).await?),
        })
    }

    /// A write outside a transaction whose `RETURNING` gives at most one
    /// row. On SQLite the statement runs to its end: its implicit commit
    /// happens there, and a commit that fails (a full disk) must fail the
    /// call. Stopping at the first row, as `fetch_optional` does, returned
    /// the row of a write that never committed: a lease reported taken
    /// that processing then found expired, round after round.
    pub async fn write_opt(&self, q: Q) -> Result<Option<Row>> {
        Ok(match self {
            Db::Pg(p) => q.pg().fetch_optional(p).await?.map(Row::Pg),
            Db::Lite { writer, .. } => q
                .lite()
                .fetch_all(writer)
                .await?
                .into_iter()
                .next()
                .map(Row::Lite),
        })
    }

    /// A write; the rows it affected.
    pub async fn execute(&self, q: Q) -> Result<u64> {
        Ok(match self {
            Db::Pg(p) => q.pg().execute(p).await?.rows_affected(),
            Db::Lite { writer, .. } => q.lite().execute(writer).await?.rows_affected(),
        })
    }

    pub async fn begin(&self) -> Result<Tx<'static>> {
        Ok(match self {
            Db::Pg(p) => Tx::Pg(p.begin().await?),
            Db::Lite { writer, .. } => Tx::Lite(writer.begin().await?),
        })
    }

    /// A transaction whose commit need not wait for the disk, for steps a
    /// crash can only make happen again — claims, the webhook fan-out,
    /// attempt records — and never one whose commit answers a client or
    /// lets another file's rows go (on PostgreSQL `synchronous_commit =
    /// off`: the WAL writer flushes it moments later; on SQLite
    /// `synchronous = NORMAL`: the next synced commit of the same WAL makes
    /// it durable with itself).
    pub async fn begin_relaxed(&self) -> Result<Tx<'static>> {
        Ok(match self {
            Db::Pg(p) => {
                let mut tx = p.begin().await?;
                sqlx::query("SET LOCAL synchronous_commit = off")
                    .execute(&mut *tx)
                    .await?;
                Tx::Pg(tx)
            }
            Db::Lite {
                writer, relaxed, ..
            } => {
                // The level cannot change inside a transaction: it is set
                // before this one, and the flag has the writer's pool set
                // it back before the connection is next handed out
                // (`sqlite.rs`, `resets_sync`).
                let mut conn = writer.acquire().await?;
                relaxed.store(true, Ordering::Release);
                sqlx::query("PRAGMA main.synchronous = NORMAL")
                    .execute(&mut *conn)
                    .await?;
                Tx::Lite(Transaction::begin(conn, None).await?)
            }
        })
    }
}

/// A transaction of either backend (on SQLite, on the writer). It may own
/// its connection (`'static`) or borrow one the caller prepared.
pub enum Tx<'c> {
    Pg(Transaction<'c, Postgres>),
    Lite(Transaction<'c, Sqlite>),
}

impl Tx<'_> {
    pub fn dialect(&self) -> Dialect {
        match self {
            Tx::Pg(_) => Dialect::Postgres,
            Tx::Lite(_) => Dialect::Sqlite,
        }
    }

    /// Runs the statements of [`Dialect::insert`], returning what they
    /// return.
    pub async fn insert(&mut self, statements: Vec<Q>) -> Result<Vec<Row>> {
        let mut rows = Vec::new();
        for q in statements {
            rows.extend(self.fetch(q).await?);
        }
        Ok(rows)
    }

    pub async fn fetch(&mut self, q: Q) -> Result<Vec<Row>> {
        Ok(match self {
            Tx::Pg(t) => q
                .pg()
                .fetch_all(&mut **t)
                .await?
                .into_iter()
                .map(Row::Pg)
                .collect(),
            Tx::Lite(t) => q
                .lite()
                .fetch_all(&mut **t)
                .await?
                .into_iter()
                .map(Row::Lite)
                .collect(),
        })
    }

    pub async fn fetch_opt(&mut self, q: Q) -> Result<Option<Row>> {
        Ok(match self {
            Tx::Pg(t) => q.pg().fetch_optional(&mut **t).await?.map(Row::Pg),
            Tx::Lite(t) => q.lite().fetch_optional(&mut **t).await?.map(Row::Lite),
        })
    }

    pub async fn execute(&mut self, q: Q) -> Result<u64> {
        Ok(match self {
            Tx::Pg(t) => q.pg().execute(&mut **t).await?.rows_affected(),
            Tx::Lite(t) => q.lite().execute(&mut **t).await?.rows_affected(),
        })
    }

    pub async fn commit(self) -> Result<()> {
        match self {
            Tx::Pg(t) => t.commit().await?,
            Tx::Lite(t) => t.commit().await?,
        }
        Ok(())
    }
}

/// A sea-orm statement as SQLite stores its values: an instant is integer
/// microseconds there (see `fastack_entities::db::Time`).
fn for_sqlite(mut stmt: Statement) -> Statement {
    if let Some(values) = &mut stmt.values {
        for v in &mut values.0 {
            if let sea_orm::Value::ChronoDateTimeUtc(t) = v {
                *v = sea_orm::Value::BigInt(t.map(|t| t.timestamp_micros()));
            }
        }
    }
    stmt
}

/// A sea-orm statement as a sqlx query of either backend.
fn sqlx_query<DB: sqlx::Database>(s: &Statement) -> sqlx::query::Query<'_, DB, SqlxValues>
where
    SqlxValues: sqlx::IntoArguments<DB>,
{
    sqlx::query_with(
        AssertSqlSafe(s.sql.as_str()),
        SqlxValues(s.values.clone().unwrap_or(sea_orm::Values(Vec::new()))),
    )
}

fn exec_err(e: sqlx::Error) -> DbErr {
    DbErr::Exec(RuntimeErr::SqlxError(e.into()))
}

fn query_err(e: sqlx::Error) -> DbErr {
    DbErr::Query(RuntimeErr::SqlxError(e.into()))
}

impl Db {
    fn backend(&self) -> DbBackend {
        match self {
            Db::Pg(_) => DbBackend::Postgres,
            Db::Lite { .. } => DbBackend::Sqlite,
        }
    }

    /// SQLite's pool for a statement: a plain `SELECT` reads from the
    /// reader pool; anything else (a write, `RETURNING`) goes to the writer.
    fn lite_pool<'a>(writer: &'a SqlitePool, reader: &'a SqlitePool, sql: &str) -> &'a SqlitePool {
        if sql.trim_start().starts_with("SELECT") {
            reader
        } else {
            writer
        }
    }
}

/// sea-orm runs its queries on the store's pools (`.one(&db)`,
/// `.exec(&db)`), with SQLite's values and pools as the seam wants them.
#[async_trait]
impl ConnectionTrait for Db {
    fn get_database_backend(&self) -> DbBackend {
        self.backend()
    }

    async fn execute_raw(&self, stmt: Statement) -> Result<ExecResult, DbErr> {
        match self {
            Db::Pg(p) => sqlx_query::<Postgres>(&stmt)
                .execute(p)
                .await
                .map(Into::into)
                .map_err(exec_err),
            Db::Lite { writer, .. } => {
                let stmt = for_sqlite(stmt);
                sqlx_query::<Sqlite>(&stmt)
                    .execute(writer)
                    .await
                    .map(Into::into)
                    .map_err(exec_err)
            }
        }
    }

    async fn execute_unprepared(&self, sql: &str) -> Result<ExecResult, DbErr> {
        let sql = AssertSqlSafe(sql.to_owned());
        match self {
            Db::Pg(p) => sqlx::raw_sql(sql).execute(p).await.map(Into::into),
            Db::Lite { writer, .. } => sqlx::raw_sql(sql).execute(writer).await.map(Into::into),
        }
        .map_err(exec_err)
    }

    async fn query_one_raw(&self, stmt: Statement) -> Result<Option<QueryResult>, DbErr> {
        match self {
            Db::Pg(p) => sqlx_query::<Postgres>(&stmt)
                .fetch_optional(p)
                .await
                .map(|r| r.map(Into::into)),
            Db::Lite { writer, reader, .. } => {
                let stmt = for_sqlite(stmt);
                let pool = Db::lite_pool(writer, reader, &stmt.sql);
                // A write runs to its end, so a failed implicit commit
                // fails the call (see `Db::write_opt`).
                sqlx_query::<Sqlite>(&stmt)
                    .fetch_all(pool)
                    .await
                    .map(|rows| rows.into_iter().next().map(Into::into))
            }
        }
        .map_err(query_err)
    }

    async fn query_all_raw(&self, stmt: Statement) -> Result<Vec<QueryResult>, DbErr> {
        match self {
            Db::Pg(p) => sqlx_query::<Postgres>(&stmt)
                .fetch_all(p)
                .await
                .map(|rows| rows.into_iter().map(Into::into).collect()),
            Db::Lite { writer, reader, .. } => {
                let stmt = for_sqlite(stmt);
                let pool = Db::lite_pool(writer, reader, &stmt.sql);
                sqlx_query::<Sqlite>(&stmt)
                    .fetch_all(pool)
                    .await
                    .map(|rows| rows.into_iter().map(Into::into).collect())
            }
        }
        .map_err(query_err)
    }
}

impl Tx<'_> {
    fn build(&self, q: &impl QueryTrait) -> Statement {
        match self {
            Tx::Pg(_) => q.build(DbBackend::Postgres),
            Tx::Lite(_) => for_sqlite(q.build(DbBackend::Sqlite)),
        }
    }

    /// Runs a sea-orm query in the transaction; the rows it affected.
    pub async fn run(&mut self, q: &impl QueryTrait) -> Result<u64> {
        let stmt = self.build(q);
        Ok(match self {
            Tx::Pg(t) => sqlx_query::<Postgres>(&stmt)
                .execute(&mut **t)
                .await?
                .rows_affected(),
            Tx::Lite(t) => sqlx_query::<Sqlite>(&stmt)
                .execute(&mut **t)
                .await?
                .rows_affected(),
        })
    }

    /// Runs a sea-orm query in the transaction and reads its rows as `M`.
    pub async fn models<M: FromQueryResult>(&mut self, q: &impl QueryTrait) -> Result<Vec<M>> {
        let stmt = self.build(q);
        let rows: Vec<QueryResult> = match self {
            Tx::Pg(t) => sqlx_query::<Postgres>(&stmt)
                .fetch_all(&mut **t)
                .await?
                .into_iter()
                .map(Into::into)
                .collect(),
            Tx::Lite(t) => sqlx_query::<Sqlite>(&stmt)
                .fetch_all(&mut **t)
                .await?
                .into_iter()
                .map(Into::into)
                .collect(),
        };
        rows.iter()
            .map(|r| M::from_query_result(r, "").map_err(Error::from))
            .collect()
    }
}

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
