//! A statement and its values ([`Q`], [`Arg`]), and a row of either
//! backend read by column name ([`Row`]).

use super::*;

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
    pub(super) sql: Cow<'static, str>,
    pub(super) args: Vec<Arg>,
}

impl Q {
    /// Appends an argument already made (an array of instants, say).
    pub fn arg(mut self, a: Arg) -> Self {
        self.args.push(a);
        self
    }

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
    pub(super) fn sql(&self) -> AssertSqlSafe<Cow<'static, str>> {
        AssertSqlSafe(self.sql.clone())
    }

    pub(super) fn pg(&self) -> sqlx::query::Query<'_, Postgres, sqlx::postgres::PgArguments> {
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

    pub(super) fn lite(&self) -> sqlx::query::Query<'_, Sqlite, sqlx::sqlite::SqliteArguments> {
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
    use crate::store::db::dialect::bulk_rows;

    #[test]
    pub(super) fn bulk_inserts_per_dialect() {
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
