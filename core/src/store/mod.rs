//! Storage: every SQL statement of fastack lives under this module. The
//! [`Storage`] is read and written through handles, one module each, named
//! for the records they hold ([`Storage::tenants`], [`Storage::jobs`],
//! [`Storage::outbox`], …); each statement is written once for both backends
//! over [`db`], and what depends on a backend's storage layout (the group
//! commit, the processing transaction, monthly partitions, pruning) is its
//! [`Engine`]: `postgres.rs` and `sqlite.rs`.
//!
//! `tracked_events` can only be read through [`EventQuery`], which cannot be
//! built without a time range: the partition key is part of the type.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use fastack_entities::{ContactId, EventId, NewEvent, StoredEvent, TenantId};

use crate::{
    config::Config,
    error::{Error, Result},
};

pub mod console;
pub mod contacts;
pub(crate) mod db;
pub mod deliveries;
mod emit;
mod encoding;
pub mod endpoints;
mod engine;
pub mod erasures;
mod event_record;
pub mod events;
pub mod ingest;
pub mod jobs;
pub mod keys;
mod known_contacts;
pub mod master_key;
pub mod outbox;
pub mod partitions;
pub mod plans;
pub mod postgres;
pub mod processing;
pub mod quarantine;
pub mod sqlite;
pub mod tenants;
pub mod waiting;

pub use console::ConsoleRecords;
pub use contacts::Contacts;
pub use db::Db;
pub use deliveries::{
    AttemptOutcome, AttemptRecord, Deliveries, DueDelivery, NewDelivery, SealedSecrets,
};
pub use endpoints::Endpoints;
pub(crate) use engine::Engine;
pub use events::Events;
pub use ingest::{Fence, Ingest, KeepFn};
pub use jobs::{Jobs, job_event};
pub use keys::{KeyRecord, Keys};
pub use known_contacts::KnownContacts;
pub use master_key::{MasterKeyRecord, MasterKeys};
pub use outbox::{Emit, FAN_OUT, Outbox, OutboxBatch, OutboxRow, Owed, SinkName, Topic};
pub use partitions::{
    ArchiveCursor, ArchiveRow, DropOutcome, Month, PartitionInfo, PartitionKey, Partitions,
};
pub use plans::Plans;
pub(crate) use processing::TRACKED_SUBSCRIBED;
pub use processing::{ProcessOutcome, ProcessRequest, Processing};
pub use quarantine::Quarantine;
pub use tenants::Tenants;
// The domain's values, where storage's signatures name them.
pub use crate::domain::{
    EventQuery, IngestRow, Person, Replayed, Subject, SubjectKind, Suppression, TakenKey,
    TimeRange, Window, sha256_hex,
};
pub(crate) use encoding::{annotations, decode_payload, plan_of};
pub use encoding::{archive_row, tracked_body, v7_floor};
pub use erasures::{ErasureRecord, Erasures, Found, OutboxScrub};
pub use event_record::{EventRecord, record_of, records_in};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

pub type Store = Arc<Storage>;

/// The store: one connection (a pool, or SQLite's writer and readers) and
/// the backend's [`Engine`], read and written through handles named for
/// what they hold. A handle is a borrowed view, free to make: a new record
/// kind is a module here with a handle like these.
#[derive(Debug)]
pub struct Storage {
    db: Db,
    engine: Box<dyn Engine>,
    /// Processing's identities, kept between rounds ([`known_contacts`]).
    known: KnownContacts,
}

impl Storage {
    pub(crate) fn new(db: Db, engine: Box<dyn Engine>, known: KnownContacts) -> Self {
        Storage { db, engine, known }
    }

    pub fn backend(&self) -> Backend {
        match self.db.dialect() {
            db::Dialect::Postgres => Backend::Postgres,
            db::Dialect::Sqlite => Backend::Sqlite,
        }
    }

    /// Cheap round trip for readiness.
    pub async fn ping(&self) -> Result<()> {
        self.db.read_one(db::Q::new("SELECT 1")).await.map(drop)
    }

    /// Applies pending migrations.
    pub async fn migrate(&self) -> Result<()> {
        self.engine.migrate().await
    }

    /// The connection itself, for tests that inspect its session settings;
    /// nothing else reads or writes through it.
    #[doc(hidden)]
    pub fn connection_for_tests(&self) -> &Db {
        &self.db
    }

    /// Tenants ([`tenants`]).
    pub fn tenants(&self) -> Tenants<'_> {
        Tenants { db: &self.db }
    }

    /// API keys ([`keys`]).
    pub fn keys(&self) -> Keys<'_> {
        Keys { db: &self.db }
    }

    /// The master key's record ([`master_key`]).
    pub fn master_key(&self) -> MasterKeys<'_> {
        MasterKeys { db: &self.db }
    }

    /// Tracking plan versions ([`plans`]).
    pub fn plans(&self) -> Plans<'_> {
        Plans { db: &self.db }
    }

    /// The group commit and its idempotency fence ([`ingest`]).
    pub fn ingest(&self) -> Ingest<'_> {
        Ingest {
            db: &self.db,
            engine: self.engine.as_ref(),
        }
    }

    /// Leases, the inbox's backlog, the processing transaction
    /// ([`processing`]).
    pub fn processing(&self) -> Processing<'_> {
        Processing {
            db: &self.db,
            engine: self.engine.as_ref(),
            waiting: self.engine.as_ref(),
            known: &self.known,
        }
    }

    /// Inbox rows processing could not take ([`quarantine`]).
    pub fn quarantine(&self) -> Quarantine<'_> {
        Quarantine {
            db: &self.db,
            waiting: self.engine.as_ref(),
        }
    }

    /// Contacts and their identities ([`contacts`]).
    pub fn contacts(&self) -> Contacts<'_> {
        Contacts { db: &self.db }
    }

    /// Events as processing wrote them ([`events`]).
    pub fn events(&self) -> Events<'_> {
        Events {
            engine: self.engine.as_ref(),
        }
    }

    /// Jobs, their claims and their terminal events ([`jobs`]).
    pub fn jobs(&self) -> Jobs<'_> {
        Jobs { db: &self.db }
    }

    /// The outbox as its sinks see it ([`outbox`]).
    pub fn outbox(&self) -> Outbox<'_> {
        Outbox { db: &self.db }
    }

    /// Partitions of `tracked_events`, retention and pruning
    /// ([`partitions`]).
    pub fn partitions(&self) -> Partitions<'_> {
        Partitions {
            db: &self.db,
            engine: self.engine.as_ref(),
        }
    }

    /// Webhook endpoints ([`endpoints`]).
    pub fn endpoints(&self) -> Endpoints<'_> {
        Endpoints { db: &self.db }
    }

    /// Webhook deliveries: the dispatcher's claims and attempts, and what
    /// people do with deliveries ([`deliveries`]).
    pub fn deliveries(&self) -> Deliveries<'_> {
        Deliveries { db: &self.db }
    }

    /// The account console's users, links and sessions ([`console`]).
    pub fn console(&self) -> ConsoleRecords<'_> {
        ConsoleRecords { db: &self.db }
    }

    /// Erasure requests, their holds and suppressions, and an erasure's
    /// work on the database ([`erasures`]).
    pub fn erasures(&self) -> Erasures<'_> {
        Erasures {
            db: &self.db,
            engine: self.engine.as_ref(),
            waiting: self.engine.as_ref(),
        }
    }
}

/// Opens the store the configuration names and applies migrations.
pub async fn open(config: &Config) -> Result<Store> {
    let known = KnownContacts::new(config.contacts_cached);
    let store: Store = match &config.database_url {
        Some(url) if url.starts_with("postgres") => {
            let pg = postgres::PgStore::connect(url).await?;
            Arc::new(Storage::new(Db::Pg(pg.pool().clone()), Box::new(pg), known))
        }
        _ => {
            let lite =
                sqlite::SqliteStore::open(&config.sqlite_path(), config.sqlite_cache_mib).await?;
            Arc::new(Storage::new(lite.db(), Box::new(lite), known))
        }
    };
    store.migrate().await?;
    Ok(store)
}

/// The embedded database the configuration names, or where it was looked
/// for ([`Error::NoDatabase`]).
pub fn embedded_exists(config: &Config) -> Result<std::path::PathBuf> {
    let path = config.sqlite_path();
    if path.exists() {
        return Ok(path);
    }
    let shown = std::path::absolute(&path).unwrap_or(path);
    Err(Error::NoDatabase {
        path: shown.display().to_string(),
    })
}

/// Says so when a newer release migrated the database past this build
/// (see `fastack_migration::up`): the node runs on the expanded schema.
pub(crate) fn newer_schema(unknown: Vec<String>) {
    if !unknown.is_empty() {
        tracing::warn!(
            migrations = ?unknown,
            "the database was migrated by a newer release; running on its schema (releases only expand it)"
        );
    }
}
