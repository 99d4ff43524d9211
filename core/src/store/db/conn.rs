//! The store's connections ([`Db`]: a PostgreSQL pool, or SQLite's writer
//! and readers) and transactions ([`Tx`]).

use super::*;

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
