//! What a node depends on and how each dependency is doing: the database,
//! object storage (exports and archives), the lake (the storage of a sink
//! that keeps files of events), a sink's link (RabbitMQ), Redis and the data directory's disk. Each has a
//! state (`up`, `warning`, `down`), since when, when it was last checked,
//! and its last error. The checks at start, the dependency watch and the
//! sinks (which see a broker's answers first) write it; `/readyz` shows it
//! and `fastack_dependency_up` exports it. A dependency going down never
//! stops ingestion: the outbox and the inbox keep what it owes.

use std::{collections::BTreeMap, path::Path, time::Duration};

use chrono::{DateTime, Utc};
use parking_lot::RwLock;
use prometheus_client::metrics::{family::Family, gauge::Gauge};
use serde::Serialize;

use crate::{
    error::{Error, Result},
    metrics::{DependencyLabels, Metrics},
    objects::Objects,
};

/// How long one check may take before it counts as failed.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Free space under which the data directory's disk shows a warning.
pub const LOW_DISK_BYTES: u64 = 256 * 1024 * 1024;

/// A dependency of a node, by the name `/readyz` and the metric use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dependency {
    Database,
    ObjectStorage,
    /// With the settings that point at it (the sink keeping it says).
    Lake(&'static str),
    /// A sink's link (a broker), as the sink declares it.
    Link {
        name: &'static str,
        settings: &'static str,
    },
    Redis,
    Disk,
}

impl Dependency {
    pub fn name(self) -> &'static str {
        match self {
            Dependency::Database => "database",
            Dependency::ObjectStorage => "object_storage",
            Dependency::Lake(_) => "lake",
            Dependency::Link { name, .. } => name,
            Dependency::Redis => "redis",
            Dependency::Disk => "disk",
        }
    }

    /// The settings that point at it: named by every error about it.
    pub fn settings(self) -> &'static str {
        match self {
            Dependency::Database => {
                "FASTACK_DATABASE_URL, or FASTACK_DATA_DIR for the embedded one"
            }
            Dependency::ObjectStorage => {
                "FASTACK_STORAGE_URL, FASTACK_S3_ENDPOINT, FASTACK_S3_REGION, \
                 FASTACK_S3_ACCESS_KEY_ID, FASTACK_S3_SECRET_ACCESS_KEY"
            }
            Dependency::Lake(settings) => settings,
            Dependency::Link { settings, .. } => settings,
            Dependency::Redis => "FASTACK_REDIS_URL",
            Dependency::Disk => "FASTACK_DATA_DIR",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Up,
    /// Working, with something the operator should know (nothing bound to
    /// an exchange, a disk running low).
    Warning,
    Down,
}

/// One dependency as `/readyz` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct Status {
    pub state: State,
    /// When it entered this state.
    pub since: DateTime<Utc>,
    pub checked_at: DateTime<Utc>,
    /// What it is (a location without credentials, free bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The last failure or warning, kept after it recovers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// The node's dependencies and their states.
#[derive(Debug)]
pub struct Health {
    deps: RwLock<BTreeMap<Dependency, Status>>,
    up: Family<DependencyLabels, Gauge>,
    free: Gauge,
}

impl Health {
    pub fn new(metrics: &Metrics) -> Self {
        Health {
            deps: RwLock::default(),
            up: metrics.dependency_up.clone(),
            free: metrics.data_dir_free_bytes.clone(),
        }
    }

    /// The data directory's free space, for the metric.
    pub fn free_bytes(&self, free: u64) {
        self.free.set(i64::try_from(free).unwrap_or(i64::MAX));
    }

    /// Records a check's outcome; says so in the log when the state changes.
    pub fn set(
        &self,
        dep: Dependency,
        state: State,
        detail: Option<String>,
        error: Option<String>,
    ) {
        let now = Utc::now();
        let mut deps = self.deps.write();
        let before = deps.get(&dep).map(|s| s.state);
        let entry = deps.entry(dep).or_insert_with(|| Status {
            state,
            since: now,
            checked_at: now,
            detail: None,
            last_error: None,
        });
        if before.is_some_and(|b| b != state) {
            entry.since = now;
        }
        entry.state = state;
        entry.checked_at = now;
        if detail.is_some() {
            entry.detail = detail;
        }
        if error.is_some() {
            entry.last_error = error.clone();
        }
        drop(deps);
        self.up
            .get_or_create(&DependencyLabels {
                dependency: dep.name(),
            })
            .set(i64::from(state != State::Down));
        let name = dep.name();
        let settings = dep.settings();
        let error = error.unwrap_or_default();
        match (before, state) {
            (Some(b), s) if b == s => {}
            (_, State::Down) => {
                tracing::warn!(dependency = name, settings, %error, "dependency down")
            }
            (_, State::Warning) => {
                tracing::warn!(dependency = name, settings, warning = %error, "dependency warning")
            }
            (Some(_), State::Up) => tracing::info!(dependency = name, "dependency back up"),
            (None, State::Up) => {}
        }
    }

    pub fn up(&self, dep: Dependency, detail: Option<String>) {
        self.set(dep, State::Up, detail, None);
    }

    pub fn down(&self, dep: Dependency, error: impl std::fmt::Display) {
        self.set(dep, State::Down, None, Some(error.to_string()));
    }

    pub fn warning(&self, dep: Dependency, warning: impl std::fmt::Display) {
        self.set(dep, State::Warning, None, Some(warning.to_string()));
    }

    /// Every dependency this node has, by name.
    pub fn snapshot(&self) -> BTreeMap<&'static str, Status> {
        self.deps
            .read()
            .iter()
            .map(|(d, s)| (d.name(), s.clone()))
            .collect()
    }

    /// Whether a dependency other than the database is down.
    pub fn degraded(&self) -> bool {
        self.deps.read().values().any(|s| s.state == State::Down)
    }
}

/// Writes, reads back and deletes a small object: the storage is there,
/// the credentials hold and the bucket takes writes.
pub async fn probe_objects(objects: &Objects, node: &str) -> Result<()> {
    let path = format!(".fastack/probe-{node}");
    let body = format!("fastack probe {}", Utc::now().to_rfc3339()).into_bytes();
    let check = async {
        objects.put(&path, body.clone()).await?;
        let back = objects.get(&path).await?;
        if back.as_ref() != body.as_slice() {
            return Err(Error::Storage(
                "the probe object read back differs from what was written".to_owned(),
            ));
        }
        objects.delete(&path).await?;
        objects.remove_empty_dir(".fastack");
        Ok(())
    };
    match tokio::time::timeout(CHECK_TIMEOUT, check).await {
        Ok(r) => r,
        Err(_) => Err(Error::Deadline("object storage")),
    }
}

/// Free bytes on the disk holding `dir` (its nearest existing ancestor).
pub fn free_bytes(dir: &Path) -> Result<u64> {
    let mut at = dir;
    while !at.exists() {
        at = at.parent().unwrap_or(Path::new("."));
        if at.as_os_str().is_empty() {
            at = Path::new(".");
        }
    }
    let st = rustix::fs::statvfs(at).map_err(|e| Error::io(at.display().to_string(), e.into()))?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// A failed check at start: the message names the dependency, where it is
/// and the settings that point at it.
pub fn unusable(dep: Dependency, location: &str, error: impl std::fmt::Display) -> Error {
    Error::Dependency {
        dependency: dep.name(),
        location: location.to_owned(),
        settings: dep.settings(),
        error: error.to_string(),
    }
}

/// A URL as logs and `/readyz` may show it: without user and password.
pub fn without_credentials(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string()
        }
        Err(_) => "(an unparsable URL)".to_owned(),
    }
}
