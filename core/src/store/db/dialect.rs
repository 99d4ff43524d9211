//! What SQL each backend speaks: list parameters, claims, JSON members,
//! notifications, and bulk inserts in statements of a few sizes.

use super::*;

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
    pub(super) fn len(&self) -> usize {
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
    pub(super) fn pg(self, n: usize) -> (Arg, String) {
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
    pub(super) fn at(&self, i: usize) -> Arg {
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
pub(super) const MAX_PARAMS: usize = 30_000;
/// Rows of one SQLite bulk insert at most.
pub(super) const MAX_BULK_ROWS: usize = 512;

/// How many rows the next SQLite bulk insert takes of `left`: `cap`
/// (a power of two) while that many are left, then the largest power of
/// two that fits. A table's inserts then have at most ten texts, each
/// parsed and compiled once and then reused from the connection's
/// statement cache; with a text for every row count SQLite compiled most
/// processing rounds' inserts anew (14 % of the writer thread's time under
/// `track` load, benches/HISTORY.md).
pub(super) fn bulk_rows(left: usize, cap: usize) -> usize {
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
