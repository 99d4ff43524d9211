//! The store's pools as a sea-orm connection, with SQLite's values and
//! pools as the seam wants them.

use super::*;

/// A sea-orm statement as SQLite stores its values: an instant is integer
/// microseconds there (see `fastack_entities::db::Time`).
pub(super) fn for_sqlite(mut stmt: Statement) -> Statement {
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
pub(super) fn sqlx_query<DB: sqlx::Database>(
    s: &Statement,
) -> sqlx::query::Query<'_, DB, SqlxValues>
where
    SqlxValues: sqlx::IntoArguments<DB>,
{
    sqlx::query_with(
        AssertSqlSafe(s.sql.as_str()),
        SqlxValues(s.values.clone().unwrap_or(sea_orm::Values(Vec::new()))),
    )
}

pub(super) fn exec_err(e: sqlx::Error) -> DbErr {
    DbErr::Exec(RuntimeErr::SqlxError(e.into()))
}

pub(super) fn query_err(e: sqlx::Error) -> DbErr {
    DbErr::Query(RuntimeErr::SqlxError(e.into()))
}

impl Db {
    pub(super) fn backend(&self) -> DbBackend {
        match self {
            Db::Pg(_) => DbBackend::Postgres,
            Db::Lite { .. } => DbBackend::Sqlite,
        }
    }

    /// SQLite's pool for a statement: a plain `SELECT` reads from the
    /// reader pool; anything else (a write, `RETURNING`) goes to the writer.
    pub(super) fn lite_pool<'a>(
        writer: &'a SqlitePool,
        reader: &'a SqlitePool,
        sql: &str,
    ) -> &'a SqlitePool {
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
    pub(super) fn build(&self, q: &impl QueryTrait) -> Statement {
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
