//! The embedded backend's files: its accept log read back after a restart
//! and dropped as processing passes it, and its write-ahead logs.

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
        "the idempotency keys, written beside the events, in fastack.db itself",
        std::time::Duration::from_secs(10),
        || async {
            (in_file(
                "fastack.db",
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

/// The accept log read back by a new store on the same files (a restart):
/// events processed before are not taken again, those waiting are, once;
/// every key accepted is still taken, whether its event was processed or
/// waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_is_read_back_after_a_restart() {
    let (db, store) = fresh(Backend::Sqlite)
        .await
        .expect("sqlite needs no service");
    let t = tenant(&store, "t").await;
    let at = now();
    let rows: Vec<IngestRow> = (0..100)
        .map(|i| row(t.id, &track(&format!("r{i}"), "u", at)))
        .collect();
    accept(&store, &rows).await;
    let node = take_lease(&store, t.id).await;
    let mut req = request(t.id, node, false);
    req.limit = 60;
    let first = store.processing().run(&req).await.expect("process");
    assert_eq!(first.appended.len(), 60);
    store.processing().release_lease(t.id, node).await.unwrap();
    drop(store);

    let store = db.store().await;
    assert_eq!(store.processing().inbox_stats().await.unwrap().0, 40);
    // Keys of processed and of waiting events alike: duplicates.
    let again: Vec<IngestRow> = [&rows[3], &rows[90]]
        .iter()
        .map(|r| row(t.id, &track(&r.idempotency_key, "u", at)))
        .collect();
    let fences = accept(&store, &again).await;
    assert_eq!(
        fences,
        [&rows[3], &rows[90]]
            .iter()
            .map(|r| Fence::Taken {
                event_id: r.event_id,
                fingerprint: r.fingerprint
            })
            .collect::<Vec<_>>()
    );
    let node = take_lease(&store, t.id).await;
    let rest = store
        .processing()
        .run(&request(t.id, node, false))
        .await
        .expect("process");
    assert_eq!(rest.appended.len(), 40);
    let ids: HashSet<EventId> = first
        .appended
        .iter()
        .chain(&rest.appended)
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(ids, rows.iter().map(|r| r.event_id).collect());
    assert!(store.processing().inbox_empty().await.unwrap());
    assert_eq!(store.events().count(t.id, around(at)).await.unwrap(), 100);
    drop(store);
    db.drop_db().await;
}

/// Under a steady stream of group commits and processing rounds the log
/// keeps the segment being written, the spare and what processing has not
/// passed: segments are dropped whole as it passes them, never an event at
/// a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_drops_segments_processing_passed() {
    let (db, store) = fresh(Backend::Sqlite)
        .await
        .expect("sqlite needs no service");
    let t = tenant(&store, "t").await;
    let at = now();
    let pad = json!("x".repeat(8000));
    let node = take_lease(&store, t.id).await;
    let mut sent = 0usize;
    let mut stored = 0usize;
    let log_dir = db.dir.path().join("log");
    let mut most = 0;
    // About 8 kB an event: enough for four 8 MiB segments.
    while sent * 8000 < 4 * 8 * 1024 * 1024 {
        let rows: Vec<IngestRow> = (0..200)
            .map(|i| {
                let mut ev = track(&format!("s{sent}-{i}"), "u", at);
                ev.properties.insert("pad".into(), pad.clone());
                row(t.id, &ev)
            })
            .collect();
        accept(&store, &rows).await;
        sent += rows.len();
        let out = store
            .processing()
            .run(&request(t.id, node, false))
            .await
            .expect("process");
        stored += out.appended.len();
        let segments = std::fs::read_dir(&log_dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
            .count();
        most = most.max(segments);
    }
    assert_eq!(stored, sent);
    // The current segment, the spare, and one the last round just left.
    assert!(most <= 3, "{most} segment files at once");
    drop(store);
    db.drop_db().await;
}
