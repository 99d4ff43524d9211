//! The embedded files' upkeep: every connection attaches the inbox file,
//! a task checkpoints both files' WALs off the commits' path, and the
//! writer's pool puts back the durability a relaxed transaction lowered.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration as StdDuration,
};

use sqlx::{
    AssertSqlSafe, SqliteConnection,
    sqlite::{SqliteConnectOptions, SqlitePoolOptions},
};

use super::{INBOX_SCHEMA, WAL_SIZE_LIMIT};
use crate::{backoff::Backoff, error::Error};

/// Attaches the inbox file to a new connection, with the main file's
/// durability (a 202's rows are in it). A commit checkpoints by itself only
/// past [`AUTOCHECKPOINT_BACKSTOP`] WAL pages: [`spawn_checkpointer`] does it.
pub(super) async fn attach_inbox(conn: &mut SqliteConnection, file: &str) -> sqlx::Result<()> {
    sqlx::query(AssertSqlSafe(format!(
        "ATTACH DATABASE $1 AS {INBOX_SCHEMA}"
    )))
    .bind(file)
    .execute(&mut *conn)
    .await?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "PRAGMA {INBOX_SCHEMA}.journal_mode = WAL; PRAGMA {INBOX_SCHEMA}.synchronous = FULL; \
         PRAGMA wal_autocheckpoint = {AUTOCHECKPOINT_BACKSTOP}"
    )))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// How often the checkpointer copies committed WAL pages into the files.
const CHECKPOINT_EVERY: StdDuration = StdDuration::from_millis(200);

/// Free space on the database's disk under which the store keeps its WALs
/// small: the checkpointer truncates both WALs at every round and a
/// processing round takes at most [`LOW_DISK_ROUND`] rows. Above it a WAL
/// may grow to [`WAL_SIZE_LIMIT`] while a backlog drains; below it that
/// growth could fill the disk again right after space came back (a full
/// disk's backlog drained in large rounds grew the inbox WAL by 50 MB in
/// two seconds and the disk was full again), and recovery would need more
/// free space than the disk had.
const LOW_DISK: u64 = 2 * WAL_SIZE_LIMIT as u64;

/// Rows per processing round while the disk is low.
pub(super) const LOW_DISK_ROUND: u32 = 100;
/// A commit runs a checkpoint itself only past this many WAL pages (about
/// 400 MiB): the backstop should the checkpointer stop or fall behind.
pub(super) const AUTOCHECKPOINT_BACKSTOP: u32 = 100_000;

/// Copies committed pages from both files' WALs into the files every
/// [`CHECKPOINT_EVERY`], so that no commit has to. With SQLite's default
/// the commit that takes a WAL past 1,000 pages runs one, fsyncs included:
/// 13 % of the server's CPU while processing drained a backlog, and a stall
/// for whichever delivery or processing round was in that commit.
///
/// The main file's writer pauses between processing rounds, which lets its
/// WAL start over (19–35 MB under load); one that grew meanwhile (a
/// backlog keeps the writer busy) is cut back to [`WAL_SIZE_LIMIT`] when it
/// next starts over. The inbox file is written only when rows move into the
/// log. PASSIVE: a reader in the middle of a read keeps the pages it may
/// still need, copied next time; TRUNCATE while the disk is low. A failure
/// (logged) does not stop the task: it reconnects after a capped backoff
/// (100 ms doubling, at most 1 s), and the writers' own checkpoints past
/// the backstop cover the gap.
pub(super) fn spawn_checkpointer(
    options: SqliteConnectOptions,
    inbox_file: String,
    main_file: PathBuf,
    low_disk: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    use sqlx::Connection;
    tokio::spawn(async move {
        // Capped low: after a full disk the next checkpoint is what gives
        // the WALs' space back.
        let mut backoff = Backoff::new(StdDuration::from_millis(100), StdDuration::from_secs(1));
        let mut tick = tokio::time::interval(CHECKPOINT_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut own: Option<SqliteConnection> = None;
        let dir = main_file
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_owned();
        loop {
            tick.tick().await;
            let low = crate::health::free_bytes(&dir).is_ok_and(|free| free < LOW_DISK);
            if low_disk.swap(low, Ordering::AcqRel) != low {
                if low {
                    tracing::warn!(
                        dir = %dir.display(),
                        "little free space on the database's disk: WALs truncated at every \
                         checkpoint, processing in small rounds"
                    );
                } else {
                    tracing::info!(dir = %dir.display(), "free space back on the database's disk");
                }
            }
            let mode = if low { "TRUNCATE" } else { "PASSIVE" };
            let round = async {
                let conn = match &mut own {
                    Some(conn) => conn,
                    None => {
                        let mut conn = SqliteConnection::connect_with(&options).await?;
                        attach_inbox(&mut conn, &inbox_file).await?;
                        own.insert(conn)
                    }
                };
                for schema in ["main", INBOX_SCHEMA] {
                    sqlx::query(AssertSqlSafe(format!(
                        "PRAGMA {schema}.wal_checkpoint({mode})"
                    )))
                    .execute(&mut *conn)
                    .await?;
                }
                Ok::<(), Error>(())
            };
            match round.await {
                Ok(()) => backoff.started(),
                Err(error) => {
                    own = None;
                    let wait = backoff.next_delay();
                    tracing::warn!(
                        %error,
                        failures = backoff.attempts(),
                        retry_in_ms = wait.as_millis() as u64,
                        "wal checkpointer failed; reconnecting"
                    );
                    tokio::time::sleep(wait).await;
                }
            }
        }
    })
}

/// A writer pool that sets `synchronous = FULL` back before handing out a
/// connection `Db::begin_relaxed` relaxed. A connection that cannot take it
/// (one a failed commit left inside its transaction: SQLite keeps a
/// transaction open when `COMMIT` fails with `SQLITE_FULL`) is closed
/// rather than handed out, and the pool opens a fresh one.
pub(super) fn resets_sync(
    options: SqlitePoolOptions,
    relaxed: Arc<AtomicBool>,
) -> SqlitePoolOptions {
    options.before_acquire(move |conn, _| {
        let relaxed = relaxed.clone();
        Box::pin(async move {
            if relaxed.swap(false, Ordering::AcqRel)
                && let Err(error) = sqlx::query("PRAGMA main.synchronous = FULL")
                    .execute(&mut *conn)
                    .await
            {
                tracing::debug!(%error, "writer connection left unusable; replacing it");
                return Ok(false);
            }
            Ok(true)
        })
    })
}
