//! The embedded backend's write-ahead logs under load.

use super::*;

/// The embedded store copies committed WAL pages into both of its files in
/// the background, so no commit has to: the rows reach each database file
/// (read here ignoring the WAL) while nothing but the writers' small
/// commits ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_pages_reach_the_files_in_the_background() {
    use sqlx::{Connection, SqliteConnection, sqlite::SqliteConnectOptions};
    let (db, store) = fresh(Backend::Sqlite)
        .await
        .expect("sqlite needs no service");
    let t = tenant(&store, "t").await;
    let at = now();
    let rows: Vec<IngestRow> = (0..200)
        .map(|i| row(t.id, &track(&format!("w{i}"), "u", at)))
        .collect();
    accept(&store, &rows).await;
    process_all(&store, t.id, false).await;
    let events = format!(
        "SELECT count(*) FROM {}",
        PartitionKey {
            month: Month::of(at),
            retention_class: 13,
        }
        .table_name()
    );
    // `immutable`: the file alone, without its WAL.
    let in_file = |file: &'static str, sql: String| {
        let path = db.dir.path().join(file);
        async move {
            let options = SqliteConnectOptions::new()
                .filename(path)
                .read_only(true)
                .immutable(true);
            let mut conn = SqliteConnection::connect_with(&options).await.ok()?;
            let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(&mut conn)
                .await
                .ok()?;
            Some(n)
        }
    };
    crate::helpers::eventually(
        "the processed events in fastack.db itself",
        std::time::Duration::from_secs(10),
        || async { (in_file("fastack.db", events.clone()).await == Some(200)).then_some(()) },
    )
    .await;
    crate::helpers::eventually(
        "the idempotency keys in fastack-inbox.db itself",
        std::time::Duration::from_secs(10),
        || async {
            (in_file(
                "fastack-inbox.db",
                "SELECT count(*) FROM idempotency_keys".to_owned(),
            )
            .await
                == Some(200))
            .then_some(())
        },
    )
    .await;
    drop(store);
    db.drop_db().await;
}

/// Under a steady stream of group commits the inbox file's WAL starts over
/// instead of growing by every commit's pages (it grew for as long as a
/// load lasted, a few hundred MB a minute): its writer thread finishes each
/// checkpoint between two commits, so the next one begins with every frame
/// copied and writes the WAL from its head again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_wal_starts_over_under_a_steady_load() {
    use std::time::{Duration, Instant};
    let (db, store) = fresh(Backend::Sqlite)
        .await
        .expect("sqlite needs no service");
    let t = tenant(&store, "t").await;
    let at = now();
    let pad = json!("x".repeat(2000));
    let load = Duration::from_secs(2);
    let started = Instant::now();
    // Two committers, as the server keeps two group commits in flight: the
    // file's writer is never idle for long.
    let committer = |name: &'static str| {
        let (store, pad) = (&store, pad.clone());
        async move {
            let mut commits = 0u64;
            while started.elapsed() < load {
                let rows: Vec<IngestRow> = (0..8)
                    .map(|i| {
                        let mut ev = track(&format!("{name}-{commits}-{i}"), "u", at);
                        ev.properties.insert("pad".into(), pad.clone());
                        row(t.id, &ev)
                    })
                    .collect();
                accept(store, &rows).await;
                commits += 1;
            }
            commits
        }
    };
    let (a, b) = tokio::join!(committer("a"), committer("b"));
    // The WAL header's checkpoint sequence number (bytes 12..16, big
    // endian) counts the times the WAL started over; a checkpoint every
    // 200 ms makes about ten in two seconds.
    let header = std::fs::read(db.dir.path().join("fastack-inbox.db-wal"))
        .expect("the inbox file has a WAL");
    let restarts = u32::from_be_bytes(header[12..16].try_into().expect("a WAL header"));
    assert!(
        restarts >= 3,
        "the inbox WAL started over {restarts} times in {} commits over {load:?} ({} bytes)",
        a + b,
        header.len()
    );
    drop(store);
    db.drop_db().await;
}
