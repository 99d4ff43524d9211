//! Partitions and retention.

use super::*;

conformance!(partitions_and_retention);

async fn partitions_and_retention(store: &Store) {
    let t = tenant(store, "t").await;
    // Two old months and this one.
    let old = Utc.with_ymd_and_hms(2024, 1, 15, 12, 0, 0).unwrap();
    let older = Utc.with_ymd_and_hms(2023, 12, 31, 23, 59, 59).unwrap();
    let keys = [
        PartitionKey {
            month: Month::of(old),
            retention_class: 13,
        },
        PartitionKey {
            month: Month::of(older),
            retention_class: 13,
        },
    ];
    store.partitions().ensure(&keys).await.unwrap();
    store.partitions().ensure(&keys).await.unwrap();
    let rows: Vec<IngestRow> = (0..5)
        .map(|i| {
            row(
                t.id,
                &track(&format!("old{i}"), "u", old + Duration::seconds(i)),
            )
        })
        .chain([row(t.id, &track("older", "u", older))])
        .collect();
    accept(store, &rows).await;
    process_all(store, t.id, false).await;

    let parts = store.partitions().list(true).await.unwrap();
    let find = |k: &PartitionKey| parts.iter().find(|p| p.key == *k).cloned();
    let jan = find(&keys[0]).expect("the January partition is listed");
    assert_eq!(jan.rows, 5);
    assert_eq!(jan.table, "tracked_events_y2024m01_r13");
    assert_eq!(
        (jan.from, jan.to),
        (keys[0].month.start(), keys[0].month.end())
    );
    assert_eq!(find(&keys[1]).unwrap().rows, 1);
    assert!(
        store
            .partitions()
            .list(false)
            .await
            .unwrap()
            .iter()
            .all(|p| p.rows == -1)
    );
    assert_eq!(store.partitions().rows(keys[0]).await.unwrap(), Some(5));
    let never = PartitionKey {
        month: Month {
            year: 2001,
            month: 1,
        },
        retention_class: 13,
    };
    assert_eq!(store.partitions().rows(never).await.unwrap(), None);

    // A partition reads back page by page, in key order, every column.
    let mut cursor = None;
    let mut read = Vec::new();
    loop {
        let page = store.partitions().read(keys[0], cursor, 2).await.unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 2);
        cursor = Some(page.last().unwrap().0);
        read.extend(page.into_iter().map(|(_, r)| r));
    }
    assert_eq!(read.len(), 5);
    let ids: Vec<EventId> = read.iter().map(|r| r.id).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted);
    assert!(read.iter().all(|r| r.tenant_id == t.id
        && r.kind == "track"
        && r.retention_class == 13
        && r.idempotency_key.starts_with("old")
        && r.properties["total"] == json!(42.5)));
    assert!(
        read[0].occurred_at.ends_with("+02:00"),
        "{}",
        read[0].occurred_at
    );

    // Dropping needs the archived count; a changed count keeps the table.
    assert_eq!(
        store.partitions().drop(keys[0], 4).await.unwrap(),
        DropOutcome::RowsChanged { rows: 5 }
    );
    assert_eq!(store.partitions().rows(keys[0]).await.unwrap(), Some(5));
    assert_eq!(
        store.partitions().drop(keys[0], 5).await.unwrap(),
        DropOutcome::Dropped
    );
    assert_eq!(store.partitions().rows(keys[0]).await.unwrap(), None);
    // A table already gone: done if its archive was empty, changed if not.
    assert_eq!(
        store.partitions().drop(keys[0], 0).await.unwrap(),
        DropOutcome::Dropped
    );
    assert_eq!(
        store.partitions().drop(keys[0], 5).await.unwrap(),
        DropOutcome::RowsChanged { rows: 0 }
    );
    assert!(
        store
            .partitions()
            .list(false)
            .await
            .unwrap()
            .iter()
            .all(|p| p.key != keys[0])
    );
    assert_eq!(
        store
            .events()
            .count(
                t.id,
                TimeRange::new(keys[0].month.start(), keys[0].month.end()).unwrap()
            )
            .await
            .unwrap(),
        0
    );

    // Their idempotency keys go with them (the December one stays).
    let pruned = store
        .partitions()
        .prune_idempotency(&[t.id], keys[0].month.end())
        .await
        .unwrap();
    assert!(pruned >= 5, "pruned {pruned}");
    assert_eq!(
        accept(store, &[row(t.id, &track("old0", "u", old))]).await,
        vec![Fence::Fresh]
    );
    // Neither backend records processed ids any more (the inbox delete is
    // PostgreSQL's second fence, the stored event the embedded store's):
    // pruning finds only what earlier releases left, here nothing.
    let forgotten = store
        .partitions()
        .prune_processed(Utc::now() + Duration::days(1))
        .await
        .unwrap();
    assert_eq!(forgotten, 0);
}
