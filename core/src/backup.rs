//! Backups of an embedded node, taken while it serves, and their restore on
//! a new node (`fastack admin backup` / `restore`).
//!
//! A backup holds every file a node needs: both database files, each a
//! consistent snapshot written by SQLite's `VACUUM INTO` (a read
//! transaction: the node goes on accepting), the master key and the
//! bootstrap key, and the local object storage (export results, retention
//! archives), and the accept log's segments. The log is copied first, then
//! the inbox file, then the main one: an event accepted before the backup
//! began is then in the log's copy or, if its processing committed (and
//! its segment was dropped) before that copy was taken, in the main copy —
//! a segment is dropped only after the events in it are stored; an event
//! in both is processed once after a restore (the main copy's cursor says
//! it was). A half-written frame at the end of a copied segment is what a
//! crash leaves, and read as such. A manifest (`fastack-backup.json`) lists each file with
//! its size and SHA-256; a restore checks every one before anything is put
//! in place.
//!
//! On PostgreSQL the database is backed up by PostgreSQL's own means and
//! the master key is `FASTACK_ENC_KEY` (docs/operations.md).

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{
    config::Config,
    error::{Error, Result},
    objects::Objects,
};

/// The manifest's name, at the top of a backup.
pub const MANIFEST: &str = "fastack-backup.json";

/// The database files' names inside a backup (whatever their names on the
/// node: a restore puts them where the new node's settings say).
const MAIN_DB: &str = "fastack.db";
const INBOX_DB: &str = "fastack-inbox.db";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    /// The backup format (1).
    pub format: u32,
    pub created_at: DateTime<Utc>,
    /// The fastack release that took it.
    pub version: String,
    /// Where the master key is: `file` (in the backup) or `FASTACK_ENC_KEY`
    /// (not in it: keep that setting with the backup).
    pub master_key: String,
    /// Object storage that is not in the backup (set by
    /// `FASTACK_STORAGE_URL`): backed up by its own means.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects_elsewhere: Option<String>,
    pub files: Vec<FileEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileEntry {
    /// Relative to the backup's root (`/`-separated).
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

impl Manifest {
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }
}

/// Where a backup goes or comes from: a local directory, or object storage
/// (`s3://bucket/prefix`, `file:///dir`).
enum Place {
    Dir(PathBuf),
    Objects(Objects),
}

impl Place {
    fn parse(config: &Config, at: &str) -> Result<Place> {
        if at.starts_with("s3://") || at.starts_with("file://") {
            Ok(Place::Objects(Objects::at(config, at)?))
        } else {
            Ok(Place::Dir(PathBuf::from(at)))
        }
    }
}

fn embedded_only(config: &Config) -> Result<()> {
    if config.is_embedded() {
        return Ok(());
    }
    Err(Error::Config(
        "`fastack admin backup` and `restore` are for the embedded database; on PostgreSQL, \
         back up the database with its own tools (pg_dump, base backups, a provider's \
         snapshots) and keep FASTACK_ENC_KEY with it (docs/operations.md)"
            .to_owned(),
    ))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::io(path.display().to_string(), e)
}

/// SHA-256 and size of a file, read in chunks.
fn digest(path: &Path) -> Result<(u64, String)> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(io(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let got = f.read(&mut buf).map_err(io(path))?;
        if got == 0 {
            break;
        }
        h.update(&buf[..got]);
        n += got as u64;
    }
    Ok((n, hex::encode(h.finalize())))
}

/// A consistent copy of the SQLite database at `from`, written to `to`.
fn vacuum_into(from: &Path, to: &Path) -> Result<()> {
    use rusqlite::{Connection, OpenFlags};
    let conn = Connection::open_with_flags(
        from,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(30))?;
    conn.execute("VACUUM INTO ?1", [to.display().to_string()])?;
    crate::owner_only::restrict_file(to)
}

/// Every file under `dir`, as paths relative to it (sorted).
fn files_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).map_err(io(&d))? {
            let entry = entry.map_err(io(&d))?;
            let path = entry.path();
            let kind = entry.file_type().map_err(io(&path))?;
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() && !entry.file_name().to_string_lossy().starts_with(".") {
                // Hidden names are objects being written (see objects.rs).
                out.push(path.strip_prefix(dir).unwrap_or(&path).to_owned());
            }
        }
    }
    out.sort();
    Ok(out)
}

fn copy_private(from: &Path, to: &Path) -> Result<()> {
    if let Some(parent) = to.parent() {
        crate::owner_only::ensure_dir(parent)?;
    }
    std::fs::copy(from, to).map_err(io(from))?;
    crate::owner_only::restrict_file(to)
}

/// Writes a backup of the embedded node the configuration names to `to` (a
/// directory that does not exist or is empty, or object storage), while
/// the node serves.
pub async fn backup(config: &Config, to: &str) -> Result<Manifest> {
    embedded_only(config)?;
    let main = crate::store::embedded_exists(config)?;
    let inbox = crate::store::sqlite::inbox_path(&main);
    let place = Place::parse(config, to)?;
    let staging = match &place {
        Place::Dir(dir) => {
            if dir.exists() && std::fs::read_dir(dir).map_err(io(dir))?.next().is_some() {
                return Err(Error::Config(format!(
                    "{} is not empty: a backup goes to a new directory",
                    dir.display()
                )));
            }
            dir.clone()
        }
        Place::Objects(_) => {
            std::env::temp_dir().join(format!("fastack-backup-{}", uuid::Uuid::new_v4().simple()))
        }
    };
    crate::owner_only::ensure_dir(&staging)?;
    let result = stage(config, &main, &inbox, &staging).await;
    let manifest = match (result, &place) {
        (Ok(m), Place::Dir(_)) => m,
        (Ok(m), Place::Objects(objects)) => {
            let uploaded = upload(&staging, &m, objects).await;
            let _ = std::fs::remove_dir_all(&staging);
            uploaded?;
            m
        }
        (Err(e), _) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    Ok(manifest)
}

/// Writes every file of the backup under `staging`, the manifest last.
async fn stage(config: &Config, main: &Path, inbox: &Path, staging: &Path) -> Result<Manifest> {
    let created_at = Utc::now();
    // The log first, then the inbox, then the main file (see the module
    // docs).
    let log_dir = main
        .parent()
        .unwrap_or(Path::new("."))
        .join(crate::store::sqlite::accept_log::DIR);
    for (first, path) in crate::store::sqlite::accept_log::segments(&log_dir)? {
        let to = staging
            .join(crate::store::sqlite::accept_log::DIR)
            .join(path.file_name().unwrap_or_default());
        match copy_private(&path, &to) {
            Ok(()) => {}
            // Dropped meanwhile: its events were stored before.
            Err(_) if !path.exists() => {
                tracing::debug!(segment = first, "log segment dropped while backing up");
            }
            Err(e) => return Err(e),
        }
    }
    let (inbox, main) = (inbox.to_owned(), main.to_owned());
    let (to_inbox, to_main) = (staging.join(INBOX_DB), staging.join(MAIN_DB));
    tokio::task::spawn_blocking(move || -> Result<()> {
        if inbox.exists() {
            vacuum_into(&inbox, &to_inbox)?;
        }
        vacuum_into(&main, &to_main)
    })
    .await
    .map_err(|e| Error::Storage(format!("backup thread: {e}")))??;

    let master_key = if config.enc_key.is_some() {
        "FASTACK_ENC_KEY"
    } else {
        copy_private(
            &config.data_dir.join("master-key"),
            &staging.join("master-key"),
        )?;
        "file"
    };
    let bootstrap = config.data_dir.join("bootstrap-key");
    if bootstrap.exists() {
        copy_private(&bootstrap, &staging.join("bootstrap-key"))?;
    }
    let objects_elsewhere = match &config.storage_url {
        Some(url) => Some(url.clone()),
        None => {
            let root = config.data_dir.join("objects");
            if root.is_dir() {
                for rel in files_under(&root)? {
                    copy_private(&root.join(&rel), &staging.join("objects").join(&rel))?;
                }
            }
            None
        }
    };
    let mut files = Vec::new();
    for rel in files_under(staging)? {
        let (bytes, sha256) = digest(&staging.join(&rel))?;
        files.push(FileEntry {
            path: rel.to_string_lossy().replace('\\', "/"),
            bytes,
            sha256,
        });
    }
    let manifest = Manifest {
        format: 1,
        created_at,
        version: env!("CARGO_PKG_VERSION").to_owned(),
        master_key: master_key.to_owned(),
        objects_elsewhere,
        files,
    };
    let text = serde_json::to_string_pretty(&manifest)
        .map_err(|e| Error::Corrupt(format!("backup manifest: {e}")))?;
    crate::owner_only::write_secret(&staging.join(MANIFEST), &text)?;
    Ok(manifest)
}

async fn upload(staging: &Path, manifest: &Manifest, objects: &Objects) -> Result<()> {
    use tokio::io::AsyncReadExt;
    // The manifest last: a backup whose manifest is there is whole.
    for f in &manifest.files {
        let path = staging.join(&f.path);
        let mut file = tokio::fs::File::open(&path).await.map_err(io(&path))?;
        let mut w = objects.writer(&f.path);
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file.read(&mut buf).await.map_err(io(&path))?;
            if n == 0 {
                break;
            }
            w.write(&buf[..n]).await?;
        }
        w.finish().await?;
    }
    let text = std::fs::read(staging.join(MANIFEST)).map_err(io(staging))?;
    objects.put(MANIFEST, text).await
}

/// Brings the backup at `from` back as the embedded node the configuration
/// names: its data directory must hold no database. Every file is fetched
/// beside its place and checked against the manifest before any is put in
/// place.
pub async fn restore(config: &Config, from: &str) -> Result<Manifest> {
    embedded_only(config)?;
    let main = config.sqlite_path();
    if main.exists() {
        return Err(Error::Config(format!(
            "a database is already at {}: restore into a new data directory \
             (FASTACK_DATA_DIR)",
            main.display()
        )));
    }
    let place = Place::parse(config, from)?;
    let manifest: Manifest = {
        let text = match &place {
            Place::Dir(dir) => {
                let path = dir.join(MANIFEST);
                std::fs::read(&path).map_err(io(&path))?
            }
            Place::Objects(o) => o.get(MANIFEST).await?.to_vec(),
        };
        serde_json::from_slice(&text)
            .map_err(|e| Error::Corrupt(format!("{from}/{MANIFEST}: {e}")))?
    };
    if manifest.format != 1 {
        return Err(Error::Config(format!(
            "backup format {} is newer than this release reads (1)",
            manifest.format
        )));
    }
    if manifest.master_key == "FASTACK_ENC_KEY" && config.enc_key.is_none() {
        return Err(Error::Config(
            "the backup's master key is FASTACK_ENC_KEY (it is not in the backup): set it as \
             the backed-up node had it"
                .to_owned(),
        ));
    }
    crate::owner_only::ensure_dir(&config.data_dir)?;
    let incoming = config
        .data_dir
        .join(format!(".restore-{}", uuid::Uuid::new_v4().simple()));
    crate::owner_only::ensure_dir(&incoming)?;
    let fetched = fetch(&place, &manifest, &incoming).await;
    if let Err(e) = fetched {
        let _ = std::fs::remove_dir_all(&incoming);
        return Err(e);
    }
    // Everything checked: into place.
    let target = |rel: &str| -> PathBuf {
        match rel {
            MAIN_DB => main.clone(),
            INBOX_DB => crate::store::sqlite::inbox_path(&main),
            other => config.data_dir.join(other),
        }
    };
    for f in &manifest.files {
        let to = target(&f.path);
        if let Some(parent) = to.parent() {
            crate::owner_only::ensure_dir(parent)?;
        }
        let from = incoming.join(&f.path);
        std::fs::rename(&from, &to).map_err(io(&from))?;
    }
    let _ = std::fs::remove_dir_all(&incoming);
    Ok(manifest)
}

async fn fetch(place: &Place, manifest: &Manifest, incoming: &Path) -> Result<()> {
    use futures::StreamExt;
    use tokio::io::AsyncWriteExt;
    for f in &manifest.files {
        if f.path
            .split('/')
            .any(|part| part == ".." || part.is_empty())
        {
            return Err(Error::Corrupt(format!(
                "backup names a file outside it: {}",
                f.path
            )));
        }
        let to = incoming.join(&f.path);
        if let Some(parent) = to.parent() {
            crate::owner_only::ensure_dir(parent)?;
        }
        match place {
            Place::Dir(dir) => {
                let from = dir.join(&f.path);
                std::fs::copy(&from, &to).map_err(io(&from))?;
            }
            Place::Objects(o) => {
                let mut out = tokio::fs::File::create(&to).await.map_err(io(&to))?;
                let mut chunks = o.get_stream(&f.path).await?;
                while let Some(chunk) = chunks.next().await {
                    out.write_all(&chunk?).await.map_err(io(&to))?;
                }
                out.sync_all().await.map_err(io(&to))?;
            }
        }
        crate::owner_only::restrict_file(&to)?;
        let (bytes, sha256) = digest(&to)?;
        if bytes != f.bytes || sha256 != f.sha256 {
            return Err(Error::Corrupt(format!(
                "{} in the backup is not what its manifest says ({bytes} bytes, SHA-256 \
                 {sha256}; expected {} bytes, {})",
                f.path, f.bytes, f.sha256
            )));
        }
    }
    Ok(())
}
