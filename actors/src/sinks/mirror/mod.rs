//! The Parquet mirror: every `core.event.tracked` written to object storage
//! (`FASTACK_MIRROR_URL`, `s3://bucket/prefix` or `file:///path`) as
//! Parquet, Hive-partitioned by tenant and the UTC hour it occurred:
//! `tenant=<id>/date=YYYY-MM-DD/hour=HH/<batch>.parquet`, zstd-compressed,
//! typed columns ([`SCHEMA`]), for DuckDB, Polars, Spark, Trino or Athena
//! to query where it lies.
//!
//! Exactly once: rows come in named outbox batches (flushed when
//! `FASTACK_MIRROR_FLUSH_ROWS` are owed or the oldest has waited
//! `FASTACK_MIRROR_FLUSH_SECS`). A batch's files are named after it and
//! hold its rows in outbox order, so a batch written again — its node died
//! before recording it, or two nodes raced for it — replaces each file with
//! the same bytes. A failed upload gives the batch back and the link is
//! retried with backoff; the other sinks never wait for it.
//!
//! Backfill ([`MirrorBackfill`], the `backfill` job with `sink: mirror`): a
//! tenant's stored events of a time range that the mirror neither holds
//! nor owes, written hour by hour beside what the live mirror wrote.
//!
//! Everything about the mirror is declared here: its settings
//! ([`MirrorSettings`]), counters, backfill and lake (the files an erasure
//! reaches, and the `lake` dependency of `/readyz`).

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, DurationRound, Timelike, Utc};
use fastack_core::{
    Config,
    delta::{self, Checkpoints, Commit, DataFile, Outcome, Snapshot, Stats, Table},
    domain::Matcher,
    erasure,
    metrics::CounterSpec,
    objects::Objects,
    settings::{Extension, check, parse},
    store::{
        EventQuery, OutboxBatch, OutboxRow, SinkName, Storage, TimeRange, Topic, record_of,
        records_in,
    },
};
use fastack_entities::{EventId, Job, JobId, TenantId};
use futures::{StreamExt, TryStreamExt};
use parquet::{
    basic::{Compression, ZstdLevel},
    data_type::{ByteArray, ByteArrayType, Int64Type},
    file::{
        properties::{EnabledStatistics, WriterProperties},
        writer::SerializedFileWriter,
    },
    schema::{
        parser::parse_message_type,
        types::{ColumnPath, Type},
    },
};
use serde_json::{Value, json};
use tracing::{info, warn};

use super::{Backfill, BackfillRequest, Flush, Lake, Sent, Sink, Tracked};
use crate::{child::ChildSpec, context::Ctx, periodic::PeriodicActor};

mod maintenance;

use maintenance::LakeMaintenance;

fastack_core::settings! {
    /// The mirror's settings.
    pub struct MirrorSettings {
        /// the lake: every event in a Delta table per tenant, at `s3://bucket/prefix` (with the `FASTACK_S3_*` settings) or `file:///path`
        pub url: Option<String> = "FASTACK_MIRROR_URL" {
            default: "",
            shown: "(unset: mirror off)",
            parse: parse::optional_text,
            check: |url: &Option<String>| match url {
                Some(url) if !(url.starts_with("s3://") || url.starts_with("file://")) => Err(
                    "must start with s3:// (a bucket and prefix) or file:// (a directory)"
                        .to_owned(),
                ),
                _ => Ok(()),
            },
        },
        /// the mirror writes its next files once this many events wait
        pub flush_rows: u32 = "FASTACK_MIRROR_FLUSH_ROWS" {
            default: "100000",
            parse: parse::from_str,
            check: check::positive,
        },
        /// … or once the oldest waiting event has waited this long
        pub flush: Duration = "FASTACK_MIRROR_FLUSH_SECS" {
            default: "60",
            parse: parse::secs,
        },
        /// how often a node compacts the tables' small files and deletes the log versions and replaced files their retention lets go
        pub maintain_every: Duration = "FASTACK_MIRROR_MAINTAIN_SECS" {
            default: "3600",
            parse: parse::secs,
            check: check::positive,
        },
        /// compaction writes files of about this size (and leaves files over half of it alone)
        pub target_file_mib: u32 = "FASTACK_MIRROR_TARGET_FILE_MIB" {
            default: "128",
            parse: parse::from_str,
            check: check::positive,
        },
        /// a checkpoint of a table's log every this many versions (written by the commit that makes the version)
        pub checkpoint_every: u32 = "FASTACK_MIRROR_CHECKPOINT_EVERY" {
            default: "100",
            parse: parse::from_str,
            check: check::positive,
        },
        /// versions of the log older than this (and older than a checkpoint) are deleted: time travel reaches back this far
        pub log_retention: Duration = "FASTACK_MIRROR_LOG_RETENTION_HOURS" {
            default: "720",
            parse: parse::hours,
        },
        /// files a compaction removed are kept this long for readers of older versions, then deleted
        pub removed_retention: Duration = "FASTACK_MIRROR_REMOVED_RETENTION_HOURS" {
            default: "168",
            parse: parse::hours,
        },
    }
}

/// The lake's URL with this configuration (`None`: the mirror is off).
fn lake_url(config: &Config) -> Option<&str> {
    config.sections.get::<MirrorSettings>()?.url.as_deref()
}

/// The columns of every file. JSON documents are text (parse them with
/// `json_extract`, `from_json`, `json.loads`).
pub const SCHEMA: &str = "message event {
    REQUIRED BYTE_ARRAY id (STRING);
    REQUIRED BYTE_ARRAY tenant_id (STRING);
    REQUIRED BYTE_ARRAY type (STRING);
    OPTIONAL BYTE_ARRAY event (STRING);
    OPTIONAL BYTE_ARRAY user_id (STRING);
    OPTIONAL BYTE_ARRAY anonymous_id (STRING);
    REQUIRED BYTE_ARRAY contact_id (STRING);
    REQUIRED INT64 occurred_at (TIMESTAMP(MICROS,true));
    REQUIRED INT64 received_at (TIMESTAMP(MICROS,true));
    OPTIONAL INT64 plan_version;
    OPTIONAL BYTE_ARRAY properties (STRING);
    OPTIONAL BYTE_ARRAY traits (STRING);
    OPTIONAL BYTE_ARRAY schema_violations (STRING);
}";

/// Columns whose values rarely repeat: written without a dictionary.
const UNIQUE_COLUMNS: &[&str] = &["id", "occurred_at", "received_at", "properties", "traits"];

/// Columns of JSON text: no statistics.
const JSON_COLUMNS: &[&str] = &["properties", "traits", "schema_violations"];

/// Rows per row group: readers skip and parallelise by row group.
const ROW_GROUP_ROWS: usize = 128 * 1024;
/// Uploads of one batch in flight at once.
const UPLOADS: usize = 8;

pub struct MirrorSink {
    url: String,
    flush: Flush,
    objects: Option<Objects>,
    schema: Arc<Type>,
    props: Arc<WriterProperties>,
    /// The tables' schema as the Delta log states it.
    table_schema: String,
    /// Each tenant's table as this node last read or committed it.
    tables: HashMap<TenantId, Snapshot>,
    settings: MirrorSettings,
}

/// Events written to the lake (a batch written again counts again).
const EVENTS_WRITTEN: CounterSpec = CounterSpec {
    name: "mirror_events_written",
    help: "events written to the Parquet mirror (a batch written again counts again)",
};
/// Parquet files written to the lake.
const FILES_WRITTEN: CounterSpec = CounterSpec {
    name: "mirror_files_written",
    help: "Parquet files the mirror wrote",
};
/// Versions of a tenant's table another writer created first.
const COMMIT_RACES: CounterSpec = CounterSpec {
    name: "mirror_commit_races",
    help: "table commits that lost the race for a version to another writer and were made again",
};

#[async_trait]
impl Sink for MirrorSink {
    const NAME: SinkName = SinkName("mirror");
    const JOBS: bool = false;
    const TRACKED: Tracked = Tracked::Every;
    const GROUPED: bool = true;
    const COUNTERS: &'static [CounterSpec] = &[
        EVENTS_WRITTEN,
        FILES_WRITTEN,
        COMMIT_RACES,
        maintenance::FILES_COMPACTED,
        maintenance::COMPACTIONS_ABANDONED,
    ];
    const SETTINGS: Option<Extension> = Some(Extension::of::<MirrorSettings>());
    const BACKFILL: Option<&'static dyn Backfill> = Some(&MirrorBackfill);

    /// With `FASTACK_MIRROR_URL` set.
    fn on(config: &Config) -> bool {
        lake_url(config).is_some()
    }

    fn open(ctx: &Ctx) -> Option<Self> {
        let settings = ctx.config.sections.get::<MirrorSettings>()?;
        let url = settings.url.clone()?;
        let (schema, props) = match writer() {
            Ok(writer) => writer,
            Err(error) => {
                warn!(%error, "the mirror cannot set up its Parquet writer; mirror off");
                return None;
            }
        };
        Some(MirrorSink {
            url,
            flush: Flush {
                rows: settings.flush_rows,
                age: settings.flush,
            },
            objects: None,
            table_schema: table_schema(&schema),
            schema,
            props,
            tables: HashMap::new(),
            settings: settings.clone(),
        })
    }

    /// The lake's upkeep: compaction, checkpoints, retention.
    fn workers() -> Vec<ChildSpec> {
        vec![PeriodicActor::<LakeMaintenance>::child(
            LakeMaintenance::default(),
        )]
    }

    fn lake(config: &Config) -> Option<fastack_core::Result<Lake>> {
        let url = lake_url(config)?;
        let settings = config.sections.get::<MirrorSettings>()?.clone();
        Some(Objects::at(config, url).and_then(|objects| {
            let (schema, props) = writer().map_err(fastack_core::Error::Storage)?;
            Ok(Lake {
                objects: objects.clone(),
                settings: "FASTACK_MIRROR_URL, FASTACK_S3_ENDPOINT, FASTACK_S3_REGION, \
                           FASTACK_S3_ACCESS_KEY_ID, FASTACK_S3_SECRET_ACCESS_KEY",
                files: Box::new(MirrorLake {
                    objects,
                    settings,
                    table_schema: table_schema(&schema),
                    schema,
                    props,
                }),
            })
        }))
    }

    fn interval(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn batches(&self) -> Option<Flush> {
        Some(self.flush)
    }

    async fn connect(&mut self, ctx: &Ctx) -> Result<(), String> {
        let objects = Objects::at(&ctx.config, &self.url).map_err(|e| e.to_string())?;
        // Two nodes committing one version would lose a commit.
        delta::check_conditional_put(&objects)
            .await
            .map_err(|e| format!("{e}; the mirror does not write to FASTACK_MIRROR_URL"))?;
        info!(location = %objects.location, "mirror writing delta tables");
        self.objects = Some(objects);
        Ok(())
    }

    async fn send(&mut self, ctx: &Ctx, rows: &[OutboxRow]) -> Sent {
        // Not reached: a batching sink is sent batches. Written as a batch
        // without a name would be unsafe, so the rows go back.
        warn!(rows = rows.len(), "mirror offered rows outside a batch");
        let _ = ctx;
        Sent {
            retry: rows.iter().map(|r| r.id).collect(),
            ..Sent::default()
        }
    }

    async fn send_batch(&mut self, ctx: &Ctx, batch: &OutboxBatch) -> Sent {
        let ids: Vec<i64> = batch.rows.iter().map(|r| r.id).collect();
        let Some(objects) = self.objects.clone() else {
            return Sent {
                retry: ids,
                down: Some("not connected".to_owned()),
                ..Sent::default()
            };
        };
        let files = match encode_batch(&batch.name, &batch.rows, &self.schema, &self.props) {
            Ok(files) => files,
            Err(why) => {
                warn!(batch = %batch.name, %why, "mirror cannot encode a batch; it is offered again");
                return Sent {
                    retry: ids,
                    down: Some(why),
                    ..Sent::default()
                };
            }
        };
        let events: usize = files.iter().map(|f| f.rows).sum();
        let count = files.len();
        let mut tables: BTreeMap<TenantId, Vec<DataFile>> = BTreeMap::new();
        for file in &files {
            tables
                .entry(file.tenant)
                .or_default()
                .push(file.entry.clone());
        }
        let uploaded = futures::stream::iter(files)
            .map(|file| {
                let objects = objects.clone();
                async move { objects.put(&file.path, file.bytes).await }
            })
            .buffer_unordered(UPLOADS)
            .try_collect::<Vec<()>>()
            .await;
        let uploaded = match uploaded {
            Ok(_) => self.commit(ctx, &objects, &batch.name, &tables).await,
            Err(error) => Err(format!("upload failed: {error}")),
        };
        match uploaded {
            Ok(()) => {
                if let Some(c) = ctx.metrics.counter(EVENTS_WRITTEN.name) {
                    c.inc_by(events as u64);
                }
                if let Some(c) = ctx.metrics.counter(FILES_WRITTEN.name) {
                    c.inc_by(count as u64);
                }
                Sent {
                    done: ids,
                    ..Sent::default()
                }
            }
            Err(down) => Sent {
                retry: ids,
                down: Some(down),
                ..Sent::default()
            },
        }
    }
}

impl MirrorSink {
    /// Adds a batch's files to their tenants' tables, a commit per table
    /// carrying the batch's name as its transaction: a batch written again
    /// (its node died before completing it, two nodes raced for it) adds
    /// nothing a second time.
    async fn commit(
        &mut self,
        ctx: &Ctx,
        objects: &Objects,
        batch: &str,
        tables: &BTreeMap<TenantId, Vec<DataFile>>,
    ) -> Result<(), String> {
        let races = ctx.metrics.counter(COMMIT_RACES.name);
        let on_race = || {
            if let Some(c) = &races {
                c.inc();
            }
        };
        for (tenant, files) in tables {
            let table = tenant_table(objects, table_root(*tenant), &self.settings);
            let snapshot = match self.tables.get_mut(tenant) {
                Some(snapshot) => snapshot,
                None => {
                    let mut read = table.snapshot().await.map_err(|e| e.to_string())?;
                    ensure_table(
                        objects,
                        *tenant,
                        &mut read,
                        &self.table_schema,
                        ctx.clock.now(),
                    )
                    .await
                    .map_err(|e| format!("creating tenant {tenant}'s table: {e}"))?;
                    self.tables.entry(*tenant).or_insert(read)
                }
            };
            let commit = Commit {
                operation: "WRITE",
                add: files.clone(),
                transaction: Some(format!("fastack-mirror-{batch}")),
                ..Commit::default()
            };
            let outcome = table
                .commit(
                    snapshot,
                    &commit,
                    &self.table_schema,
                    ctx.clock.now(),
                    &on_race,
                )
                .await;
            match outcome {
                Ok(Outcome::Committed(_) | Outcome::AlreadyCommitted) => {}
                Err(e) => {
                    // Read afresh next time: the cached version may be behind.
                    self.tables.remove(tenant);
                    return Err(format!("commit to tenant {tenant}'s table failed: {e}"));
                }
            }
        }
        Ok(())
    }
}

/// A tenant's table: `tenant=<id>` under the lake's root.
fn table_root(tenant: TenantId) -> String {
    format!("{}{tenant}", table_root_prefix())
}

/// A tenant's table at `root`, its commits checkpointing the log as the
/// settings say.
fn tenant_table<'o>(objects: &'o Objects, root: String, settings: &MirrorSettings) -> Table<'o> {
    Table::new(objects, root).with_checkpoints(Checkpoints {
        every: u64::from(settings.checkpoint_every),
        // A removed file is deleted by the first round past its retention:
        // named until then, and a round more.
        keep_removed: settings.removed_retention + settings.maintain_every * 2,
        // Far longer than a batch can wait to be written again.
        keep_transactions: settings.log_retention,
    })
}

/// What every table's root starts with.
fn table_root_prefix() -> &'static str {
    "tenant="
}

/// Whether a path under the lake is a data file: not a table's log or
/// checkpoint, nor a staged upload.
fn is_data_file(path: &str) -> bool {
    path.ends_with(".parquet")
        && !path
            .split('/')
            .any(|part| part.starts_with('_') || part.starts_with('.'))
}

/// Creates the tenant's table if it has none yet, with every data file
/// already under its root: a lake written by a release before tables (its
/// `hour=` files), and files of batches written and not yet committed
/// (committed again later under the same path: one file). Another writer
/// creating it first is as good.
async fn ensure_table(
    objects: &Objects,
    tenant: TenantId,
    snapshot: &mut Snapshot,
    schema: &str,
    now: DateTime<Utc>,
) -> fastack_core::Result<()> {
    if snapshot.version.is_some() {
        return Ok(());
    }
    let root = table_root(tenant);
    let mut imports = Vec::new();
    for object in objects.list_meta(&root).await? {
        let Some(rel) = object.path.strip_prefix(&format!("{root}/")) else {
            continue;
        };
        let size = object.size;
        let date = rel.split('/').find_map(|part| part.strip_prefix("date="));
        if let (true, Some(date)) = (is_data_file(rel), date) {
            imports.push(DataFile {
                path: rel.to_owned(),
                date: date.to_owned(),
                size,
                stats: None,
            });
        }
    }
    let commit = Commit {
        operation: "CREATE TABLE",
        imports,
        ..Commit::default()
    };
    Table::new(objects, root)
        .commit(snapshot, &commit, schema, now, &|| {})
        .await?;
    Ok(())
}

/// The table's schema in Delta's JSON: the files' columns, and the date
/// they are partitioned by.
fn table_schema(schema: &Type) -> String {
    use parquet::basic::{LogicalType, Type as Physical};
    let mut fields: Vec<Value> = schema
        .get_fields()
        .iter()
        .map(|f| {
            let ty = match (f.get_physical_type(), f.get_basic_info().logical_type_ref()) {
                (Physical::INT64, Some(LogicalType::Timestamp { .. })) => "timestamp",
                (Physical::INT64, _) => "long",
                _ => "string",
            };
            json!({ "name": f.name(), "type": ty, "nullable": f.is_optional(), "metadata": {} })
        })
        .collect();
    fields.push(
        json!({ "name": delta::PARTITION, "type": "date", "nullable": true, "metadata": {} }),
    );
    json!({ "type": "struct", "fields": fields }).to_string()
}

/// The files' schema and writer properties, the same for the live mirror
/// and the backfill.
fn writer() -> Result<(Arc<Type>, Arc<WriterProperties>), String> {
    let schema = parse_message_type(SCHEMA).map_err(|e| e.to_string())?;
    // Level 1: on the mirror's own files faster than the default 3 and no
    // larger (benches/HISTORY.md, "the mirror's files by codec").
    let mut props = WriterProperties::builder().set_compression(Compression::ZSTD(
        ZstdLevel::try_new(1).map_err(|e| e.to_string())?,
    ));
    // A dictionary only where values repeat: one built for ids, times
    // and properties is abandoned once it outgrows its page, after hashing
    // every value into it.
    for unique in UNIQUE_COLUMNS {
        props = props.set_column_dictionary_enabled(ColumnPath::from(*unique), false);
    }
    // A JSON document's least and greatest text tell a reader nothing.
    for json in JSON_COLUMNS {
        props =
            props.set_column_statistics_enabled(ColumnPath::from(*json), EnabledStatistics::None);
    }
    let props = props
        // The same bytes for the same rows, whichever node writes them.
        .set_created_by(format!("fastack {}", env!("CARGO_PKG_VERSION")))
        .build();
    Ok((Arc::new(schema), Arc::new(props)))
}

/// One Parquet file of a batch.
struct File {
    /// Under the lake's root.
    path: String,
    bytes: Vec<u8>,
    rows: usize,
    tenant: TenantId,
    /// As its tenant's table lists it.
    entry: DataFile,
}

/// An event as a row of the files: its texts as the Parquet writer takes
/// them, each a view of the outbox row's body (no copy per field).
struct Event {
    id: ByteArray,
    kind: ByteArray,
    event: Option<ByteArray>,
    user_id: Option<ByteArray>,
    anonymous_id: Option<ByteArray>,
    contact_id: ByteArray,
    occurred_at: DateTime<Utc>,
    received_at: DateTime<Utc>,
    plan_version: Option<i64>,
    properties: Option<ByteArray>,
    traits: Option<ByteArray>,
    schema_violations: Option<ByteArray>,
}

impl Event {
    fn id(&self) -> &str {
        self.id.as_utf8().unwrap_or_default()
    }
}

/// The events a row carries (a grouped row carries several).
fn events_of(row: &OutboxRow) -> impl Iterator<Item = Result<Event, String>> + '_ {
    events_in(&row.body).map(move |event| event.map_err(|e| format!("outbox row {}: {e}", row.id)))
}

/// The events of a body of records (a row's, or the backfill's), each
/// text a view of one copy of the body rather than a copy of its own.
fn events_in(text: &str) -> impl Iterator<Item = Result<Event, String>> + '_ {
    let bytes = Bytes::copy_from_slice(text.as_bytes());
    let view = move |value: Cow<'_, str>| match value {
        Cow::Borrowed(part) => (part.as_ptr() as usize)
            .checked_sub(text.as_ptr() as usize)
            .and_then(|at| bytes.get(at..at.checked_add(part.len())?).map(|_| at))
            .map_or_else(
                || ByteArray::from(part.as_bytes()),
                |at| ByteArray::from(bytes.slice(at..at + part.len())),
            ),
        // Unescaped from a row written before records.
        Cow::Owned(part) => ByteArray::from(part.into_bytes()),
    };
    records_in(text).map(move |record| {
        let r = record.map_err(|e| e.to_string())?;
        let opt = |value: Option<Cow<'_, str>>| value.map(&view);
        Ok(Event {
            id: view(r.id),
            kind: view(r.kind),
            event: opt(r.event),
            user_id: opt(r.user_id),
            anonymous_id: opt(r.anonymous_id),
            contact_id: view(r.contact_id),
            occurred_at: r.occurred_at,
            received_at: r.received_at,
            plan_version: r.plan_version,
            properties: opt(r.properties),
            traits: opt(r.traits),
            schema_violations: opt(r.schema_violations),
        })
    })
}

/// The batch's files: one per tenant and hour, rows in outbox order.
fn encode_batch(
    name: &str,
    rows: &[OutboxRow],
    schema: &Arc<Type>,
    props: &Arc<WriterProperties>,
) -> Result<Vec<File>, String> {
    // By tenant and hour since the epoch: the directory is named once a
    // file, not once an event.
    let mut parts: BTreeMap<(TenantId, i64), Vec<Event>> = BTreeMap::new();
    for row in rows.iter().filter(|r| r.topic == Topic::Core) {
        for event in events_of(row) {
            let event = event?;
            parts
                .entry((
                    row.tenant_id,
                    event.occurred_at.timestamp().div_euclid(3600),
                ))
                .or_default()
                .push(event);
        }
    }
    parts
        .into_iter()
        .map(|((tenant_id, hour), events)| {
            let tenant = tenant_id.to_string();
            let start = DateTime::from_timestamp(hour * 3600, 0).unwrap_or_default();
            let dir = hour_dir(&tenant, start);
            let bytes =
                encode(&tenant, &events, schema, props).map_err(|e| format!("{dir}: {e}"))?;
            let rel = format!("{}/{name}.parquet", partition_dir(start));
            Ok(File {
                path: format!("{}/{rel}", table_root(tenant_id)),
                rows: events.len(),
                tenant: tenant_id,
                entry: data_file(rel, start, &events, bytes.len()),
                bytes,
            })
        })
        .collect()
}

/// The directory of a tenant's hour: `tenant=T/date=YYYY-MM-DD/hour=HH`.
fn hour_dir(tenant: &str, at: DateTime<Utc>) -> String {
    format!("tenant={tenant}/{}", partition_dir(at))
}

/// An hour's directory in its tenant's table: `date=YYYY-MM-DD/hour=HH`.
fn partition_dir(at: DateTime<Utc>) -> String {
    format!("date={}/hour={:02}", at.format("%Y-%m-%d"), at.hour())
}

/// A file of `events` (one tenant's, of the hour starting at `hour`) as
/// its table lists it: statistics on the times only, which identify no one.
fn data_file(path: String, hour: DateTime<Utc>, events: &[Event], size: usize) -> DataFile {
    let range = |at: fn(&Event) -> DateTime<Utc>| {
        let least = events.iter().map(at).min().unwrap_or(hour);
        let greatest = events.iter().map(at).max().unwrap_or(hour);
        (least, greatest)
    };
    let (occurred_min, occurred_max) = range(|e| e.occurred_at);
    let (received_min, received_max) = range(|e| e.received_at);
    DataFile {
        path,
        date: hour.format("%Y-%m-%d").to_string(),
        size: size as u64,
        stats: Some(Stats {
            rows: events.len() as u64,
            times: vec![
                ("occurred_at", occurred_min, occurred_max),
                ("received_at", received_min, received_max),
            ],
        }),
    }
}

/// Events read per page while backfilling.
const BACKFILL_PAGE: u32 = 5_000;
/// Rows per backfill file.
const BACKFILL_FILE_ROWS: usize = 500_000;

/// Writes the job's tenant's stored events of `[from, to)` (its params)
/// that the mirror neither holds nor owes, hour by hour, as
/// `backfill-<job>-<attempt>-<n>.parquet` beside the live files, and adds
/// them to the tenant's table in one commit at the end (the job and
/// attempt its transaction). Per hour it reads the stored events, then
/// what the mirror owes, then the table: an event a live batch completes
/// in between was committed before it was completed, so it is in a file of
/// the table; an event still owed is left to the live mirror. A file
/// outside the table (what a stopped run wrote) is not counted as holding
/// anything. `progress(hours done, hours)`.
///
/// With `rewrite` (whole hours: the range is widened to the hours it
/// touches) the hour's files are replaced instead: it lists them first,
/// then reads the stored events, what the mirror owes and the table,
/// writes every stored event except those still owed and those in files
/// of the table that appeared since the first list, and the commit removes
/// the first list's files except those holding an owed event (a live
/// batch's, written and not yet recorded); they are deleted after it, as
/// are files the table does not hold. A file the table lists that is gone
/// leaves the table, its events written again. Readers see the hours as
/// they were until the commit, as the backfill leaves them after it.
pub struct MirrorBackfill;

#[async_trait]
impl Backfill for MirrorBackfill {
    fn unit(&self) -> &'static str {
        "hours"
    }

    async fn run(
        &self,
        store: &Storage,
        config: &Config,
        job: &Job,
        request: &BackfillRequest,
        progress: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<Value, String> {
        let url = lake_url(config).ok_or("the mirror is off: set FASTACK_MIRROR_URL")?;
        let objects = Objects::at(config, url).map_err(|e| e.to_string())?;
        let BackfillRequest {
            tenant,
            range,
            rewrite,
        } = request.clone();
        let (schema, props) = writer()?;
        let first = range
            .from
            .duration_trunc(chrono::Duration::hours(1))
            .map_err(|e| e.to_string())?;
        let hours = (range.to - first).num_hours() as u64 + 1;
        let tenant_text = tenant.to_string();
        let settings = config
            .sections
            .get::<MirrorSettings>()
            .ok_or("the mirror is off: set FASTACK_MIRROR_URL")?;
        let table = tenant_table(&objects, table_root(tenant), settings);
        let schema_json = table_schema(&schema);
        // One snapshot, brought up to date (only the versions since) at
        // each hour. A lake from before tables: its files are the table first.
        let mut snapshot = table.snapshot().await.map_err(|e| e.to_string())?;
        ensure_table(&objects, tenant, &mut snapshot, &schema_json, Utc::now())
            .await
            .map_err(|e| e.to_string())?;
        let in_table = |snapshot: &Snapshot, path: &str| {
            path.strip_prefix(&format!("{}/", table_root(tenant)))
                .is_some_and(|rel| snapshot.files.contains_key(rel))
        };
        let (mut written, mut held, mut replaced) = (0u64, 0u64, 0u64);
        // One commit at the end: readers see the hours as they were, or
        // as the backfill leaves them, never both.
        let (mut add, mut remove, mut stale_objects) = (Vec::new(), Vec::new(), Vec::new());
        for h in 0..hours {
            progress(h, hours);
            let start = first + chrono::Duration::hours(h as i64);
            let end = start + chrono::Duration::hours(1);
            let Some(hour) = (if rewrite {
                TimeRange::new(start, end)
            } else {
                TimeRange::new(start.max(range.from), end.min(range.to))
            }) else {
                continue;
            };
            let dir = hour_dir(&tenant_text, start);
            let before: Vec<String> = if rewrite {
                files_in(&objects, &dir).await?
            } else {
                Vec::new()
            };
            let stored = read_hour(store, tenant, hour).await?;
            if stored.is_empty() && before.is_empty() {
                continue;
            }
            let owed = owed_ids(store, tenant).await?;
            // The table read after what is owed: a batch completed since
            // the owed read was committed before it.
            table
                .update(&mut snapshot)
                .await
                .map_err(|e| e.to_string())?;
            let now_read = &snapshot;
            // Ids the table holds or the live mirror will write: not
            // written here. A file outside the table (a batch written and
            // not yet committed, what a stopped run left) adds none: its
            // batch's events are owed.
            let mut mirrored = HashSet::new();
            let (mut stale, mut stale_ids) = (Vec::new(), HashSet::new());
            let listed = files_in(&objects, &dir).await?;
            // A file the table lists that is gone (lost, deleted by hand)
            // leaves the table: its events are written again.
            let hour_prefix = format!("{}/", partition_dir(start));
            for rel in now_read.files.keys() {
                let path = format!("{}/{rel}", table_root(tenant));
                if rel.starts_with(&hour_prefix) && !listed.contains(&path) {
                    remove.push(path);
                }
            }
            for path in listed {
                let live = in_table(now_read, &path);
                if !live && !before.contains(&path) {
                    continue;
                }
                let ids = ids_in(&objects, &path).await?;
                if before.contains(&path) && ids.is_disjoint(&owed) {
                    if live {
                        remove.push(path.clone());
                    }
                    stale.push(path);
                    stale_ids.extend(ids);
                } else if live {
                    mirrored.extend(ids);
                }
            }
            // The mirror may be the only copy left (retention dropped the
            // partition): a rewrite never deletes what it cannot write again.
            let kept: HashSet<&str> = stored.iter().map(Event::id).collect();
            let lost = stale_ids
                .iter()
                .filter(|id| !kept.contains(id.as_str()))
                .count();
            if lost > 0 {
                return Err(format!(
                    "{dir} holds {lost} events storage no longer has (dropped by retention?): \
                     not rewritten"
                ));
            }
            let (todo, have): (Vec<Event>, Vec<Event>) = stored
                .into_iter()
                .partition(|e| !owed.contains(e.id()) && !mirrored.contains(e.id()));
            held += have.len() as u64;
            for (n, chunk) in todo.chunks(BACKFILL_FILE_ROWS).enumerate() {
                let bytes = encode(&tenant_text, chunk, &schema, &props)
                    .map_err(|e| format!("{dir}: {e}"))?;
                let rel = format!(
                    "{}/backfill-{}-{}-{n}.parquet",
                    partition_dir(start),
                    job.id,
                    job.attempts
                );
                add.push(data_file(rel.clone(), start, chunk, bytes.len()));
                objects
                    .put(&format!("{}/{rel}", table_root(tenant)), bytes)
                    .await
                    .map_err(|e| e.to_string())?;
                written += chunk.len() as u64;
            }
            stale_objects.extend(stale);
        }
        let files = add.len() as u64;
        let root = format!("{}/", table_root(tenant));
        if !add.is_empty() || !remove.is_empty() {
            let commit = Commit {
                operation: if rewrite { "REPLACE" } else { "WRITE" },
                add,
                remove: remove
                    .iter()
                    .filter_map(|p| p.strip_prefix(&root).map(str::to_owned))
                    .collect(),
                transaction: Some(format!("fastack-backfill-{}-{}", job.id, job.attempts)),
                ..Commit::default()
            };
            table
                .commit(&mut snapshot, &commit, &schema_json, Utc::now(), &|| {})
                .await
                .map_err(|e| e.to_string())?;
        }
        // Removed from the table by the commit above, or never in it.
        for path in stale_objects {
            objects.delete(&path).await.map_err(|e| e.to_string())?;
            replaced += 1;
        }
        progress(hours, hours);
        Ok(json!({
            "from": range.from.to_rfc3339(),
            "to": range.to.to_rfc3339(),
            "hours": hours,
            "events_written": written,
            "already_mirrored": held,
            "files": files,
            "files_replaced": replaced,
            "rewrite": rewrite,
            "location": objects.location,
        }))
    }

    fn summary(&self, r: &Value) -> String {
        format!(
            "{} events written in {} files, {} already in the mirror, {} files replaced ({} hours, {})",
            r["events_written"],
            r["files"],
            r["already_mirrored"],
            r["files_replaced"],
            r["hours"],
            r["location"]
        )
    }
}

/// The mirror's files as an erasure reaches them: each of a tenant's files
/// holding a person's events is written again under its own name without
/// them (the same schema and writer properties), or deleted when nothing
/// else is left in it.
pub struct MirrorLake {
    objects: Objects,
    settings: MirrorSettings,
    schema: Arc<Type>,
    props: Arc<WriterProperties>,
    table_schema: String,
}

/// The columns an erasure decides by.
const WHO: &str = "message event {
    REQUIRED BYTE_ARRAY id (STRING);
    OPTIONAL BYTE_ARRAY user_id (STRING);
    OPTIONAL BYTE_ARRAY anonymous_id (STRING);
    REQUIRED BYTE_ARRAY contact_id (STRING);
    REQUIRED INT64 occurred_at (TIMESTAMP(MICROS,true));
}";

#[async_trait]
impl erasure::Lake for MirrorLake {
    async fn files(&self, tenant: TenantId) -> fastack_core::Result<Vec<String>> {
        files_in(&self.objects, &format!("tenant={tenant}"))
            .await
            .map_err(fastack_core::Error::Storage)
    }

    async fn without(
        &self,
        path: &str,
        matcher: &Matcher,
    ) -> fastack_core::Result<Option<erasure::LakeRewrite>> {
        let bytes = self.objects.get(path).await?;
        // Who first (five columns): most files hold none of the people.
        let theirs = |bytes: Bytes| -> Result<Vec<bool>, String> {
            use parquet::file::reader::{FileReader, SerializedFileReader};
            let who = parse_message_type(WHO).map_err(|e| e.to_string())?;
            let reader = SerializedFileReader::new(bytes).map_err(|e| e.to_string())?;
            let mut out = Vec::new();
            for row in reader.get_row_iter(Some(who)).map_err(|e| e.to_string())? {
                let row = row.map_err(|e| e.to_string())?;
                let f = fields(&row);
                out.push(matcher.matches(
                    f.text("contact_id"),
                    f.text("user_id"),
                    f.text("anonymous_id"),
                    f.micros("occurred_at").unwrap_or_default(),
                ));
            }
            Ok(out)
        };
        let corrupt = |e: String| fastack_core::Error::Corrupt(format!("{path}: {e}"));
        let picked = theirs(bytes.clone()).map_err(corrupt)?;
        let removed = picked.iter().filter(|p| **p).count() as u64;
        if removed == 0 {
            return Ok(None);
        }
        let (tenant, kept) = read_events(bytes, &picked).map_err(corrupt)?;
        let n = kept.len() as u64;
        let bytes = if kept.is_empty() {
            None
        } else {
            Some(
                encode(&tenant, &kept, &self.schema, &self.props)
                    .map_err(|e| corrupt(e.to_string()))?,
            )
        };
        Ok(Some(erasure::LakeRewrite {
            removed,
            kept: n,
            bytes,
        }))
    }

    /// The replacement beside the file: `<name>.erased-<job>.parquet`.
    async fn stage(
        &self,
        job: JobId,
        path: &str,
        bytes: Option<Vec<u8>>,
    ) -> fastack_core::Result<erasure::LakeStaged> {
        let Some(bytes) = bytes else {
            return Ok(erasure::LakeStaged {
                path: path.to_owned(),
                new: None,
                size: 0,
            });
        };
        let stem = path.strip_suffix(".parquet").unwrap_or(path);
        // A file replaced before by another erasure: one suffix, not two.
        let stem = stem.split_once(".erased-").map_or(stem, |(s, _)| s);
        let new = format!("{stem}.erased-{}.parquet", job.0.simple());
        let size = bytes.len() as u64;
        self.objects.put(&new, bytes).await?;
        Ok(erasure::LakeStaged {
            path: path.to_owned(),
            new: Some(new),
            size,
        })
    }

    /// The table's files replaced by one commit (each removed, its
    /// replacement added), then deleted: no version left readable holds
    /// the person (an older version names files that are gone). A file a
    /// version already removed is deleted. A file outside the table (a
    /// batch written and not yet committed) is replaced in place, as the
    /// batch will commit it under its own name.
    async fn swap(
        &self,
        tenant: TenantId,
        staged: &[erasure::LakeStaged],
    ) -> fastack_core::Result<Option<u64>> {
        let root = table_root(tenant);
        let table = tenant_table(&self.objects, root.clone(), &self.settings);
        let mut snapshot = table.snapshot().await?;
        ensure_table(
            &self.objects,
            tenant,
            &mut snapshot,
            &self.table_schema,
            Utc::now(),
        )
        .await?;
        let rel = |path: &str| {
            path.strip_prefix(&format!("{root}/"))
                .unwrap_or(path)
                .to_owned()
        };
        let mut commit = Commit {
            operation: "DELETE",
            ..Commit::default()
        };
        let mut deletes = Vec::new();
        for s in staged {
            let old = rel(&s.path);
            match snapshot.files.get(&old) {
                Some(file) => {
                    commit.remove.push(old.clone());
                    if let Some(new) = &s.new {
                        commit.add.push(DataFile {
                            path: rel(new),
                            date: file.date.clone(),
                            size: s.size,
                            stats: None,
                        });
                    }
                    deletes.push(s.path.clone());
                }
                None if snapshot.removed.contains_key(&old) => {
                    deletes.extend([Some(s.path.clone()), s.new.clone()].into_iter().flatten());
                }
                None => match &s.new {
                    Some(new) => {
                        self.objects.copy(new, &s.path).await?;
                        deletes.push(new.clone());
                    }
                    None => deletes.push(s.path.clone()),
                },
            }
        }
        let version = if commit.remove.is_empty() {
            None
        } else {
            match table
                .commit(
                    &mut snapshot,
                    &commit,
                    &self.table_schema,
                    Utc::now(),
                    &|| {},
                )
                .await?
            {
                Outcome::Committed(v) => Some(v),
                Outcome::AlreadyCommitted => None,
            }
        };
        for path in deletes {
            self.objects.delete(&path).await?;
        }
        Ok(version)
    }
}

/// A row's fields by name.
struct Fields<'r>(Vec<(&'r String, &'r parquet::record::Field)>);

fn fields(row: &parquet::record::Row) -> Fields<'_> {
    Fields(row.get_column_iter().collect())
}

impl Fields<'_> {
    fn get(&self, name: &str) -> Option<&parquet::record::Field> {
        self.0.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
    }

    fn text(&self, name: &str) -> Option<&str> {
        match self.get(name)? {
            parquet::record::Field::Str(s) => Some(s),
            _ => None,
        }
    }

    fn long(&self, name: &str) -> Option<i64> {
        match self.get(name)? {
            parquet::record::Field::Long(v) | parquet::record::Field::TimestampMicros(v) => {
                Some(*v)
            }
            _ => None,
        }
    }

    fn micros(&self, name: &str) -> Option<DateTime<Utc>> {
        self.long(name).and_then(DateTime::from_timestamp_micros)
    }
}

/// The events of a file (its tenant and the rows not `picked`; rows past
/// the end of `picked` are kept), as the mirror writes them.
fn read_events(bytes: Bytes, picked: &[bool]) -> Result<(String, Vec<Event>), String> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let reader = SerializedFileReader::new(bytes).map_err(|e| e.to_string())?;
    let (mut tenant, mut kept) = (String::new(), Vec::new());
    let rows = reader.get_row_iter(None).map_err(|e| e.to_string())?;
    for (n, row) in rows.enumerate() {
        let row = row.map_err(|e| e.to_string())?;
        let theirs = picked.get(n).unwrap_or(&false);
        let f = fields(&row);
        if tenant.is_empty() {
            tenant = f.text("tenant_id").unwrap_or_default().to_owned();
        }
        if *theirs {
            continue;
        }
        let text = |name: &str| f.text(name).map(ByteArray::from);
        let required = |name: &str| text(name).ok_or_else(|| format!("a row has no {name}"));
        kept.push(Event {
            id: required("id")?,
            kind: required("type")?,
            event: text("event"),
            user_id: text("user_id"),
            anonymous_id: text("anonymous_id"),
            contact_id: required("contact_id")?,
            occurred_at: f.micros("occurred_at").ok_or("a row has no occurred_at")?,
            received_at: f.micros("received_at").ok_or("a row has no received_at")?,
            plan_version: f.long("plan_version"),
            properties: text("properties"),
            traits: text("traits"),
            schema_violations: text("schema_violations"),
        });
    }
    Ok((tenant, kept))
}

/// The ids of the tenant's events the live mirror still owes: it is going
/// to write them, so the backfill must not.
async fn owed_ids(store: &Storage, tenant: TenantId) -> Result<HashSet<String>, String> {
    let mut ids = HashSet::new();
    for row in store
        .outbox()
        .owed_rows(MirrorSink::NAME, tenant)
        .await
        .map_err(|e| e.to_string())?
    {
        for record in records_in(&row.body) {
            let record = record.map_err(|e| format!("outbox row {}: {e}", row.id))?;
            ids.insert(record.id.into_owned());
        }
    }
    Ok(ids)
}

/// The tenant's stored events of one hour, as mirror rows.
async fn read_hour(
    store: &Storage,
    tenant: TenantId,
    range: TimeRange,
) -> Result<Vec<Event>, String> {
    let mut out = Vec::new();
    let mut after: Option<(DateTime<Utc>, EventId)> = None;
    loop {
        let page = store
            .events()
            .query(&EventQuery {
                tenant_id: tenant,
                range,
                contact_ids: None,
                event: None,
                after,
                limit: BACKFILL_PAGE,
            })
            .await
            .map_err(|e| e.to_string())?;
        // Through the records the live mirror reads: one mapping.
        let records: String = page.iter().map(record_of).collect();
        for event in events_in(&records) {
            out.push(event?);
        }
        match page.last() {
            Some(last) if page.len() == BACKFILL_PAGE as usize => {
                after = Some((last.occurred_at.with_timezone(&Utc), last.id));
            }
            _ => return Ok(out),
        }
    }
}

/// The Parquet files of a directory.
async fn files_in(objects: &Objects, dir: &str) -> Result<Vec<String>, String> {
    Ok(objects
        .list(dir)
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|p| is_data_file(p))
        .collect())
}

/// The event ids in one Parquet file.
async fn ids_in(objects: &Objects, path: &str) -> Result<HashSet<String>, String> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::RowAccessor;
    let projection = parse_message_type("message event { REQUIRED BYTE_ARRAY id (STRING); }")
        .map_err(|e| e.to_string())?;
    let mut ids = HashSet::new();
    let bytes = objects.get(path).await.map_err(|e| e.to_string())?;
    let reader = SerializedFileReader::new(bytes).map_err(|e| format!("{path}: {e}"))?;
    let rows = reader
        .get_row_iter(Some(projection))
        .map_err(|e| format!("{path}: {e}"))?;
    for row in rows {
        let row = row.map_err(|e| format!("{path}: {e}"))?;
        ids.insert(
            row.get_string(0)
                .map_err(|e| format!("{path}: {e}"))?
                .clone(),
        );
    }
    Ok(ids)
}

/// The values present and the definition level of each row.
fn optional<'a>(values: impl Iterator<Item = Option<&'a ByteArray>>) -> (Vec<ByteArray>, Vec<i16>) {
    let mut present = Vec::new();
    let mut levels = Vec::new();
    for v in values {
        levels.push(i16::from(v.is_some()));
        if let Some(v) = v {
            present.push(v.clone());
        }
    }
    (present, levels)
}

/// A file of one tenant's events.
fn encode(
    tenant: &str,
    events: &[Event],
    schema: &Arc<Type>,
    props: &Arc<WriterProperties>,
) -> parquet::errors::Result<Vec<u8>> {
    let mut writer = SerializedFileWriter::new(Vec::new(), schema.clone(), props.clone())?;
    for group in events.chunks(ROW_GROUP_ROWS) {
        let mut rg = writer.next_row_group()?;
        let text = |f: fn(&Event) -> &ByteArray| -> Vec<ByteArray> {
            group.iter().map(|e| f(e).clone()).collect()
        };
        let opt = |f: fn(&Event) -> Option<&ByteArray>| optional(group.iter().map(f));
        let micros = |f: fn(&Event) -> DateTime<Utc>| -> Vec<i64> {
            group.iter().map(|e| f(e).timestamp_micros()).collect()
        };
        let mut column = 0;
        while let Some(mut col) = rg.next_column()? {
            match column {
                0 => write_bytes(&mut col, &text(|e| &e.id), None)?,
                1 => write_bytes(&mut col, &vec![ByteArray::from(tenant); group.len()], None)?,
                2 => write_bytes(&mut col, &text(|e| &e.kind), None)?,
                3 => write_opt(&mut col, opt(|e| e.event.as_ref()))?,
                4 => write_opt(&mut col, opt(|e| e.user_id.as_ref()))?,
                5 => write_opt(&mut col, opt(|e| e.anonymous_id.as_ref()))?,
                6 => write_bytes(&mut col, &text(|e| &e.contact_id), None)?,
                7 => {
                    col.typed::<Int64Type>()
                        .write_batch(&micros(|e| e.occurred_at), None, None)?;
                }
                8 => {
                    col.typed::<Int64Type>()
                        .write_batch(&micros(|e| e.received_at), None, None)?;
                }
                9 => {
                    let present: Vec<i64> = group.iter().filter_map(|e| e.plan_version).collect();
                    let levels: Vec<i16> = group
                        .iter()
                        .map(|e| i16::from(e.plan_version.is_some()))
                        .collect();
                    col.typed::<Int64Type>()
                        .write_batch(&present, Some(&levels), None)?;
                }
                10 => write_opt(&mut col, opt(|e| e.properties.as_ref()))?,
                11 => write_opt(&mut col, opt(|e| e.traits.as_ref()))?,
                12 => write_opt(&mut col, opt(|e| e.schema_violations.as_ref()))?,
                _ => {
                    return Err(parquet::errors::ParquetError::General(format!(
                        "the schema has a column {column} the mirror does not write"
                    )));
                }
            }
            col.close()?;
            column += 1;
        }
        rg.close()?;
    }
    writer.into_inner()
}

fn write_bytes(
    col: &mut parquet::file::writer::SerializedColumnWriter<'_>,
    values: &[ByteArray],
    levels: Option<&[i16]>,
) -> parquet::errors::Result<()> {
    col.typed::<ByteArrayType>()
        .write_batch(values, levels, None)
        .map(drop)
}

fn write_opt(
    col: &mut parquet::file::writer::SerializedColumnWriter<'_>,
    (values, levels): (Vec<ByteArray>, Vec<i16>),
) -> parquet::errors::Result<()> {
    write_bytes(col, &values, Some(&levels))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastack_entities::TenantId;

    pub(super) fn row(id: i64, occurred: &str) -> OutboxRow {
        OutboxRow {
            id,
            tenant_id: TenantId(uuid::Uuid::nil()),
            topic: Topic::Core,
            routing_key: "core.event.tracked".into(),
            ce_id: format!("fastack.event.tracked.{id}"),
            subject: id.to_string(),
            body: format!(
                r#"{{"id":"e{id}","type":"track","event":"Order Completed","contact_id":"c1",
                    "user_id":"u1","properties":{{"total":{id}}},"occurred_at":"{occurred}",
                    "received_at":"2026-12-05T10:00:00Z","plan_version":3}}"#
            ),
            job_id: None,
            created_at: Utc::now(),
        }
    }

    fn setup() -> (Arc<Type>, Arc<WriterProperties>) {
        writer().unwrap()
    }

    #[test]
    fn a_batch_is_one_file_per_tenant_hour_and_the_same_bytes_twice() {
        let (schema, props) = setup();
        // 09:59 at +02:00 is 07:59 UTC: the hour is UTC.
        let rows = vec![
            row(1, "2026-12-05T09:59:00+02:00"),
            row(2, "2026-12-05T08:00:00Z"),
            row(3, "2026-12-05T07:30:00Z"),
        ];
        let files = encode_batch("b1", &rows, &schema, &props).unwrap();
        let paths: Vec<(&str, usize)> = files.iter().map(|f| (f.path.as_str(), f.rows)).collect();
        let tenant = uuid::Uuid::nil();
        assert_eq!(
            paths,
            vec![
                (
                    format!("tenant={tenant}/date=2026-12-05/hour=07/b1.parquet").as_str(),
                    2
                ),
                (
                    format!("tenant={tenant}/date=2026-12-05/hour=08/b1.parquet").as_str(),
                    1
                ),
            ]
        );
        assert!(files[0].bytes.starts_with(b"PAR1"));
        let again = encode_batch("b1", &rows, &schema, &props).unwrap();
        assert_eq!(files[0].bytes, again[0].bytes);
    }

    fn stored(occurred: &str) -> fastack_entities::StoredEvent {
        fastack_entities::StoredEvent {
            id: EventId::new(),
            kind: fastack_entities::EventKind::Track,
            event: Some("Order Completed".into()),
            contact_id: fastack_entities::ContactId::new(),
            user_id: None,
            anonymous_id: Some("a1".into()),
            properties: serde_json::Map::new(),
            occurred_at: DateTime::parse_from_rfc3339(occurred).unwrap(),
            received_at: Utc::now(),
            plan: None,
        }
    }

    #[test]
    fn a_grouped_row_is_all_its_events() {
        let (schema, props) = setup();
        let mut grouped = row(1, "2026-12-05T07:10:00Z");
        grouped.body = record_of(&stored("2026-12-05T07:10:00Z"))
            + &record_of(&stored("2026-12-05T08:20:00+01:00"));
        let files = encode_batch(
            "b1",
            &[grouped, row(3, "2026-12-05T08:00:00Z")],
            &schema,
            &props,
        )
        .unwrap();
        let rows: Vec<usize> = files.iter().map(|f| f.rows).collect();
        assert_eq!(rows, vec![2, 1]);
    }

    #[test]
    fn a_body_that_is_not_an_event_is_an_error_not_a_row() {
        let (schema, props) = setup();
        let mut bad = row(1, "2026-12-05T07:30:00Z");
        bad.body = "{}".into();
        let err = encode_batch("b1", &[bad], &schema, &props)
            .err()
            .expect("refused");
        assert!(err.contains("outbox row 1"), "{err}");
    }
}
