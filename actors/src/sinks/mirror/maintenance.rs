//! The lake's upkeep, every `FASTACK_MIRROR_MAINTAIN_SECS` on every node
//! mirroring (a [`Periodic`] round): each tenant's table has its small
//! files of a date rewritten into files of about
//! `FASTACK_MIRROR_TARGET_FILE_MIB` by one commit that changes no data,
//! the files earlier versions removed deleted once
//! `FASTACK_MIRROR_REMOVED_RETENTION_HOURS` have passed, its log
//! checkpointed every `FASTACK_MIRROR_CHECKPOINT_EVERY` versions, and
//! versions older than `FASTACK_MIRROR_LOG_RETENTION_HOURS` and a
//! checkpoint deleted.
//!
//! Nodes race for the same tables safely: a compaction commits only if
//! every file it rewrote is still in the table (an erasure or another
//! node's compaction that removed one first wins, and this one's output is
//! deleted), so it never brings back rows an erasure removed.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use fastack_core::{
    delta::{Commit, DataFile, Snapshot, Table},
    metrics::CounterSpec,
    objects::Objects,
};
use parquet::{file::properties::WriterProperties, schema::types::Type};
use ractor::ActorProcessingErr;
use tracing::{info, warn};

use super::{MirrorSettings, encode, read_events, table_root_prefix, table_schema, writer};
use crate::{context::Ctx, periodic::Periodic};

/// Files compaction rewrote into fewer.
pub(super) const FILES_COMPACTED: CounterSpec = CounterSpec {
    name: "mirror_files_compacted",
    help: "small lake files compaction rewrote into larger ones",
};
/// Compactions that lost a file to another commit first and were dropped.
pub(super) const COMPACTIONS_ABANDONED: CounterSpec = CounterSpec {
    name: "mirror_compactions_abandoned",
    help: "compactions dropped because another commit (an erasure, another node) removed one of their files first",
};

/// The round's work; its settings are read from the node's configuration.
#[derive(Clone, Default)]
pub struct LakeMaintenance {
    /// The first round waits one interval: a node restarting in a loop
    /// does not rewrite the lake each time.
    started: bool,
}

#[async_trait]
impl Periodic for LakeMaintenance {
    const NAME: &'static str = "lake_maintenance";

    fn every(&self, ctx: &Ctx) -> Duration {
        ctx.config
            .sections
            .get::<MirrorSettings>()
            .map_or(Duration::from_secs(3600), |s| s.maintain_every)
    }

    async fn run(&mut self, ctx: &Ctx) -> Result<(), ActorProcessingErr> {
        if !std::mem::replace(&mut self.started, true) {
            return Ok(());
        }
        let Some(settings) = ctx.config.sections.get::<MirrorSettings>() else {
            return Ok(());
        };
        let Some(url) = settings.url.as_deref() else {
            return Ok(());
        };
        let objects = Objects::at(&ctx.config, url)?;
        for root in objects.dirs("").await? {
            let Some(tenant) = root.strip_prefix(table_root_prefix()) else {
                continue;
            };
            // One table's failure is logged; the others are still kept.
            if let Err(error) = maintain(ctx, &objects, settings, &root, tenant).await {
                warn!(table = %root, %error, "lake maintenance failed for a table");
            }
        }
        Ok(())
    }
}

/// What one table's round did.
#[derive(Debug, Default)]
pub(super) struct Done {
    pub compacted: usize,
    pub written: usize,
    pub abandoned: usize,
    pub deleted: usize,
    /// Versions and checkpoints of the log past its retention.
    pub log_deleted: usize,
}

async fn maintain(
    ctx: &Ctx,
    objects: &Objects,
    settings: &MirrorSettings,
    root: &str,
    tenant: &str,
) -> fastack_core::Result<()> {
    let now = ctx.clock.now();
    let done = compact(objects, settings, root, tenant, now).await?;
    if let Some(c) = ctx.metrics.counter(FILES_COMPACTED.name) {
        c.inc_by(done.compacted as u64);
    }
    if let Some(c) = ctx.metrics.counter(COMPACTIONS_ABANDONED.name) {
        c.inc_by(done.abandoned as u64);
    }
    if done.compacted + done.deleted + done.abandoned + done.log_deleted > 0 {
        info!(
            table = %root,
            compacted = done.compacted,
            written = done.written,
            abandoned = done.abandoned,
            deleted = done.deleted,
            log_deleted = done.log_deleted,
            "lake table kept"
        );
    }
    Ok(())
}

/// Compacts every date of the table holding two or more files under the
/// target size, then deletes removed files past their retention and the
/// log's versions past its retention.
pub(super) async fn compact(
    objects: &Objects,
    settings: &MirrorSettings,
    root: &str,
    tenant: &str,
    now: DateTime<Utc>,
) -> fastack_core::Result<Done> {
    let table = super::tenant_table(objects, root.to_owned(), settings);
    let mut snapshot = table.snapshot().await?;
    let mut done = Done::default();
    if snapshot.version.is_none() {
        // No table yet: the mirror's next commit makes it.
        return Ok(done);
    }
    let target = u64::from(settings.target_file_mib) * 1024 * 1024;
    let (schema, props) = writer().map_err(fastack_core::Error::Storage)?;
    let table_schema = table_schema(&schema);
    for group in groups(&snapshot, target) {
        let n = group.len();
        let committed = compact_group(
            objects,
            &table,
            &mut snapshot,
            &group,
            tenant,
            (&schema, &props, &table_schema),
            now,
        )
        .await?;
        if committed {
            done.compacted += n;
            done.written += 1;
        } else {
            done.abandoned += 1;
        }
    }
    let keep =
        chrono::Duration::from_std(settings.removed_retention).unwrap_or(chrono::Duration::days(7));
    let expired: Vec<String> = snapshot
        .removed
        .iter()
        .filter(|(_, at)| DateTime::from_timestamp_millis(**at).is_some_and(|at| now - at > keep))
        .map(|(path, _)| path.clone())
        .collect();
    for path in expired {
        let path = format!("{root}/{path}");
        // Gone already: deleted by the erasure that removed it, or by
        // another node's round.
        if objects.exists(&path).await? {
            objects.delete(&path).await?;
            done.deleted += 1;
        }
    }
    let keep_log =
        chrono::Duration::from_std(settings.log_retention).unwrap_or(chrono::Duration::days(30));
    done.log_deleted = table.clean_log(now - keep_log).await?;
    Ok(done)
}

/// Rewrites one group of files as one file and commits the swap on top of
/// `snapshot`: `false` when another commit removed one of the files first
/// (an erasure, another node's compaction), the new file then deleted.
async fn compact_group(
    objects: &Objects,
    table: &Table<'_>,
    snapshot: &mut Snapshot,
    group: &[DataFile],
    tenant: &str,
    (schema, props, table_schema): (&Arc<Type>, &Arc<WriterProperties>, &str),
    now: DateTime<Utc>,
) -> fastack_core::Result<bool> {
    let root = table.root();
    let mut events = Vec::new();
    for file in group {
        let bytes = objects.get(&format!("{root}/{}", file.path)).await?;
        let (_, mut rows) = read_events(bytes, &[])
            .map_err(|e| fastack_core::Error::Corrupt(format!("{root}/{}: {e}", file.path)))?;
        events.append(&mut rows);
    }
    let date = group[0].date.clone();
    let bytes = encode(tenant, &events, schema, props)
        .map_err(|e| fastack_core::Error::Storage(e.to_string()))?;
    let path = format!(
        "date={date}/compacted-{}.parquet",
        uuid::Uuid::now_v7().simple()
    );
    let start = DateTime::parse_from_rfc3339(&format!("{date}T00:00:00Z"))
        .map(|d| d.with_timezone(&Utc))
        .unwrap_or(now);
    let file = super::data_file(path.clone(), start, &events, bytes.len());
    objects.put(&format!("{root}/{path}"), bytes).await?;
    let commit = Commit {
        operation: "OPTIMIZE",
        add: vec![file],
        remove: group.iter().map(|f| f.path.clone()).collect(),
        rearranged: true,
        ..Commit::default()
    };
    match table
        .commit(snapshot, &commit, table_schema, now, &|| {})
        .await
    {
        Ok(_) => Ok(true),
        Err(fastack_core::Error::Conflict(why)) => {
            info!(table = %root, %why, "compaction lost a file to another commit; dropped");
            objects.delete(&format!("{root}/{path}")).await?;
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// The files to compact, a group per new file: per date, the files under
/// half the target size, oldest path first, gathered until the next would
/// pass the target; a group of one is left alone.
fn groups(snapshot: &Snapshot, target: u64) -> Vec<Vec<DataFile>> {
    let mut by_date: BTreeMap<&str, Vec<&DataFile>> = BTreeMap::new();
    for file in snapshot.files.values() {
        if file.size < target / 2 {
            by_date.entry(&file.date).or_default().push(file);
        }
    }
    let mut out = Vec::new();
    for files in by_date.into_values() {
        let (mut group, mut size) = (Vec::new(), 0);
        for file in files {
            if !group.is_empty() && size + file.size > target {
                out.push(std::mem::take(&mut group));
                size = 0;
            }
            size += file.size;
            group.push(file.clone());
        }
        out.push(group);
    }
    out.retain(|g| g.len() > 1);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, date: &str, size: u64) -> DataFile {
        DataFile {
            path: path.to_owned(),
            date: date.to_owned(),
            size,
            stats: None,
        }
    }

    /// The compaction read two files; an erasure removed one before the
    /// compaction committed: the compaction is dropped, its file deleted,
    /// and the erased file's rows do not come back.
    #[tokio::test]
    async fn a_compaction_that_lost_a_file_to_an_erasure_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let objects = Objects::at(
            &fastack_core::Config::default(),
            &format!("file://{}", dir.path().display()),
        )
        .unwrap();
        let (schema, props) = writer().unwrap();
        let tenant = uuid::Uuid::nil().to_string();
        let table = Table::new(&objects, format!("tenant={tenant}"));
        let mut snapshot = Snapshot::default();
        let none = || {};
        for (batch, at) in [
            ("b1", "2026-12-05T07:00:00Z"),
            ("b2", "2026-12-05T08:00:00Z"),
        ] {
            let rows = [super::super::tests::row(1, at)];
            let files = super::super::encode_batch(batch, &rows, &schema, &props).unwrap();
            for file in &files {
                objects.put(&file.path, file.bytes.clone()).await.unwrap();
            }
            let commit = Commit {
                operation: "WRITE",
                add: files.iter().map(|f| f.entry.clone()).collect(),
                ..Commit::default()
            };
            table
                .commit(&mut snapshot, &commit, "{}", Utc::now(), &none)
                .await
                .unwrap();
        }
        let read = snapshot.clone();
        let group = groups(&read, 1 << 30).remove(0);
        assert_eq!(group.len(), 2);
        let erased = Commit {
            operation: "DELETE",
            remove: vec!["date=2026-12-05/hour=07/b1.parquet".to_owned()],
            ..Commit::default()
        };
        table
            .commit(&mut snapshot, &erased, "{}", Utc::now(), &none)
            .await
            .unwrap();
        let mut stale = read;
        let committed = compact_group(
            &objects,
            &table,
            &mut stale,
            &group,
            &tenant,
            (&schema, &props, "{}"),
            Utc::now(),
        )
        .await
        .unwrap();
        assert!(!committed);
        let now = table.snapshot().await.unwrap();
        assert_eq!(
            now.files.keys().collect::<Vec<_>>(),
            ["date=2026-12-05/hour=08/b2.parquet"]
        );
        let left = objects.list("").await.unwrap();
        assert!(!left.iter().any(|p| p.contains("compacted-")), "{left:?}");
    }

    #[test]
    fn small_files_of_a_date_are_grouped_up_to_the_target() {
        let mut snapshot = Snapshot::default();
        for f in [
            file("a", "2026-12-01", 40),
            file("b", "2026-12-01", 40),
            file("c", "2026-12-01", 40),
            file("big", "2026-12-01", 90),
            file("d", "2026-12-02", 10),
            file("e", "2026-12-03", 10),
            file("f", "2026-12-03", 10),
        ] {
            snapshot.files.insert(f.path.clone(), f);
        }
        let paths: Vec<Vec<String>> = groups(&snapshot, 100)
            .into_iter()
            .map(|g| g.into_iter().map(|f| f.path).collect())
            .collect();
        // 40 + 40 fit 100, the third starts a group of one (left alone);
        // a date with one small file is left alone; the large file too.
        assert_eq!(paths, vec![vec!["a", "b"], vec!["e", "f"]]);
    }
}
