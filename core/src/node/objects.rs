//! Object storage for export results and retention archives: a local
//! directory in embedded mode (`<data dir>/objects`), a local path
//! (`file:///…`), or an S3-compatible bucket (`s3://bucket/prefix` with the
//! `FASTACK_S3_*` settings).

use std::sync::Arc;

use bytes::Bytes;
use object_store::{
    BackoffConfig, ObjectStore, PutMode, PutOptions, PutPayload, RetryConfig, aws::AmazonS3Builder,
    buffered::BufWriter, local::LocalFileSystem, path::Path as ObjectPath, prefix::PrefixStore,
};
use tokio::io::AsyncWriteExt;

use crate::{
    config::Config,
    error::{Error, Result},
};

/// Alters bytes on their way to storage (fault injection in tests: a
/// corrupted upload must be caught by verification).
pub type WriteFault = Arc<dyn Fn(&mut Vec<u8>) + Send + Sync>;

/// An object as a listing gives it.
#[derive(Clone, Debug)]
pub struct ObjectInfo {
    pub path: String,
    pub size: u64,
    pub modified: chrono::DateTime<chrono::Utc>,
}

#[derive(Clone)]
pub struct Objects {
    store: Arc<dyn ObjectStore>,
    /// Where, for logs (no credentials).
    pub location: String,
    fault: Option<WriteFault>,
    /// The directory of local storage: objects written there are made
    /// owner-only (object_store creates files with the process umask).
    local_root: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Objects")
            .field("location", &self.location)
            .finish()
    }
}

fn storage_err(e: object_store::Error) -> Error {
    Error::Storage(e.to_string())
}

fn local(path: &std::path::Path) -> Result<Objects> {
    crate::owner_only::ensure_dir(path)?;
    let store = LocalFileSystem::new_with_prefix(path).map_err(storage_err)?;
    Ok(Objects {
        store: Arc::new(store),
        location: path.display().to_string(),
        fault: None,
        local_root: Some(path.to_owned()),
    })
}

/// Says where object storage credentials come from when the settings give
/// none (once per location): the operator did not choose that source.
fn say_credential_source(config: &Config, location: &str) {
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    if let Ok(mut said) = SAID.lock() {
        if said.iter().any(|l| l == location) {
            return;
        }
        said.push(location.to_owned());
    }
    let has = |name: &str| config.s3.aws_environment.0.iter().any(|(k, _)| k == name);
    let source = [
        ("AWS_ACCESS_KEY_ID", "an access key"),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", "a web identity token"),
        (
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "the container's credentials",
        ),
    ]
    .into_iter()
    .find(|(name, _)| has(name));
    match source {
        Some((variable, what)) => tracing::info!(
            location,
            variable,
            "no FASTACK_S3_ACCESS_KEY_ID / FASTACK_S3_SECRET_ACCESS_KEY: object storage \
             credentials from the environment ({what})"
        ),
        // The S3 client's last resort; off a cloud instance it fails.
        None => tracing::warn!(
            location,
            "no FASTACK_S3_ACCESS_KEY_ID / FASTACK_S3_SECRET_ACCESS_KEY and no AWS_* \
             credentials in the environment: object storage asks the instance metadata \
             service (169.254.169.254) for credentials"
        ),
    }
}

/// Makes a local object owner-only once written.
fn restrict(local_root: Option<&std::path::Path>, path: &str) -> Result<()> {
    match local_root {
        Some(root) => crate::owner_only::restrict_file(&root.join(path)),
        None => Ok(()),
    }
}

impl Objects {
    /// Where exports and archives go (`FASTACK_STORAGE_URL`, else the
    /// data directory).
    pub fn from_config(config: &Config) -> Result<Self> {
        match config.storage_url.as_deref() {
            None => local(&config.data_dir.join("objects")),
            Some(url) => Self::at(config, url),
        }
    }

    /// The storage at `url`: `s3://bucket/prefix` (with the `FASTACK_S3_*`
    /// settings), `file:///path`, or a local path.
    pub fn at(config: &Config, url: &str) -> Result<Self> {
        if let Some(path) = url.strip_prefix("file://") {
            return local(std::path::Path::new(path));
        }
        let Some(rest) = url.strip_prefix("s3://") else {
            return local(std::path::Path::new(url));
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        // Bounded retries: a dead endpoint fails the job in seconds,
        // not after object_store's default three minutes.
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: std::time::Duration::from_millis(100),
                max_backoff: std::time::Duration::from_secs(5),
                base: 2.0,
            },
            max_retries: 4,
            retry_timeout: std::time::Duration::from_secs(60),
        };
        let mut b = AmazonS3Builder::new();
        // The environment's chain first; the settings below win over it.
        for (key, value) in &config.s3.aws_environment.0 {
            if let Ok(k) = key.to_ascii_lowercase().parse() {
                b = b.with_config(k, value);
            }
        }
        let mut b = b.with_bucket_name(bucket).with_retry(retry);
        if let Some(endpoint) = &config.s3.endpoint {
            b = b
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"));
        }
        if let Some(region) = &config.s3.region {
            b = b.with_region(region);
        }
        if let (Some(id), Some(secret)) = (&config.s3.access_key_id, &config.s3.secret_access_key) {
            b = b.with_access_key_id(id).with_secret_access_key(secret);
        } else {
            say_credential_source(config, &format!("s3://{bucket}/{prefix}"));
        }
        let s3 = b.build().map_err(storage_err)?;
        let store: Arc<dyn ObjectStore> = if prefix.is_empty() {
            Arc::new(s3)
        } else {
            Arc::new(PrefixStore::new(s3, prefix))
        };
        Ok(Objects {
            store,
            location: format!("s3://{bucket}/{prefix}"),
            fault: None,
            local_root: None,
        })
    }

    /// The same storage, with every written chunk passed through `fault`.
    pub fn with_write_fault(mut self, fault: WriteFault) -> Self {
        self.fault = Some(fault);
        self
    }

    /// Stores an object whole: readers see the old one or the new one.
    pub async fn put(&self, path: &str, mut bytes: Vec<u8>) -> Result<()> {
        if let Some(f) = &self.fault {
            f(&mut bytes);
        }
        if let Some(root) = &self.local_root {
            return put_local(root, path, bytes).await;
        }
        self.store
            .put(&ObjectPath::from(path), PutPayload::from(bytes))
            .await
            .map_err(storage_err)?;
        Ok(())
    }

    /// Stores an object only if none exists at `path`: `false` when one
    /// does (nothing is written then). Two writers racing for one path:
    /// exactly one gets `true`. On S3 a conditional put (`If-None-Match:
    /// *`); on a local disk a hard link, which fails on an existing name.
    pub async fn put_new(&self, path: &str, mut bytes: Vec<u8>) -> Result<bool> {
        if let Some(f) = &self.fault {
            f(&mut bytes);
        }
        if let Some(root) = &self.local_root {
            return put_local_new(root, path, bytes).await;
        }
        let opts = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match self
            .store
            .put_opts(&ObjectPath::from(path), PutPayload::from(bytes), opts)
            .await
        {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(storage_err(e)),
        }
    }

    /// The object, or `None` where there is none.
    pub async fn get_opt(&self, path: &str) -> Result<Option<Bytes>> {
        match self.store.get(&ObjectPath::from(path)).await {
            Ok(got) => got.bytes().await.map(Some).map_err(storage_err),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(storage_err(e)),
        }
    }

    pub async fn get(&self, path: &str) -> Result<Bytes> {
        let got = self
            .store
            .get(&ObjectPath::from(path))
            .await
            .map_err(storage_err)?;
        got.bytes().await.map_err(storage_err)
    }

    /// The object as a stream of chunks (large archives are verified
    /// without holding them in memory).
    pub async fn get_stream(
        &self,
        path: &str,
    ) -> Result<impl futures::Stream<Item = Result<Bytes>> + Send + use<>> {
        use futures::StreamExt;
        let got = self
            .store
            .get(&ObjectPath::from(path))
            .await
            .map_err(storage_err)?;
        Ok(got.into_stream().map(|c| c.map_err(storage_err)))
    }

    /// The paths of every object under `prefix` (a directory, without its
    /// trailing slash).
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        Ok(self
            .list_meta(prefix)
            .await?
            .into_iter()
            .map(|o| o.path)
            .collect())
    }

    /// [`Objects::list`] with each object's size and last change.
    pub async fn list_meta(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        use futures::TryStreamExt;
        let prefix = ObjectPath::from(prefix);
        let mut listed: Vec<ObjectInfo> = self
            .store
            .list(Some(&prefix))
            .map_ok(|meta| ObjectInfo {
                path: meta.location.to_string(),
                size: meta.size,
                modified: meta.last_modified,
            })
            .try_collect()
            .await
            .map_err(storage_err)?;
        listed.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(listed)
    }

    /// The directories directly under `prefix` (`""`: the top), as
    /// paths.
    pub async fn dirs(&self, prefix: &str) -> Result<Vec<String>> {
        let prefix = (!prefix.is_empty()).then(|| ObjectPath::from(prefix));
        let listed = self
            .store
            .list_with_delimiter(prefix.as_ref())
            .await
            .map_err(storage_err)?;
        let mut dirs: Vec<String> = listed
            .common_prefixes
            .into_iter()
            .map(|p| p.to_string())
            .collect();
        dirs.sort();
        Ok(dirs)
    }

    /// Whether an object exists.
    pub async fn exists(&self, path: &str) -> Result<bool> {
        match self.store.head(&ObjectPath::from(path)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(storage_err(e)),
        }
    }

    /// An object's size in bytes.
    pub async fn size(&self, path: &str) -> Result<u64> {
        self.store
            .head(&ObjectPath::from(path))
            .await
            .map(|meta| meta.size)
            .map_err(storage_err)
    }

    /// Copies an object over another (the destination is replaced whole:
    /// readers see the old object or the new one).
    pub async fn copy(&self, from: &str, to: &str) -> Result<()> {
        self.store
            .copy(&ObjectPath::from(from), &ObjectPath::from(to))
            .await
            .map_err(storage_err)?;
        restrict(self.local_root.as_deref(), to)
    }

    /// Deletes an object; one already gone is no error (as on S3).
    pub async fn delete(&self, path: &str) -> Result<()> {
        match self.store.delete(&ObjectPath::from(path)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(storage_err(e)),
        }
    }

    /// Removes the directory `dir` of local storage if it is empty (object
    /// storage has no directories; a local one keeps them after their last
    /// file goes, where readers listing the tree meet them).
    pub fn remove_empty_dir(&self, dir: &str) {
        if let Some(root) = &self.local_root {
            let _ = std::fs::remove_dir(root.join(dir));
        }
    }

    /// A streaming upload (multipart beyond a few MiB).
    pub fn writer(&self, path: &str) -> ObjectWriter {
        ObjectWriter {
            inner: BufWriter::new(self.store.clone(), ObjectPath::from(path)),
            fault: self.fault.clone(),
            local: self.local_root.as_ref().map(|r| r.join(path)),
        }
    }
}

/// A local object written beside its place under a hidden name (owner-only,
/// synced) and renamed into it. object_store's own staging name (`<file>#N`)
/// is not hidden: a process killed while writing left it where Parquet and
/// Hive readers list the directory, and they failed on the truncated file;
/// readers skip names starting with `.`.
async fn put_local(root: &std::path::Path, path: &str, bytes: Vec<u8>) -> Result<()> {
    let dest = root.join(path);
    let io = |e| Error::io(dest.display().to_string(), e);
    let dir = dest
        .parent()
        .ok_or_else(|| Error::Storage(format!("{path} names no file")))?
        .to_owned();
    let name = dest
        .file_name()
        .ok_or_else(|| Error::Storage(format!("{path} names no file")))?
        .to_string_lossy()
        .into_owned();
    let staged = dir.join(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()));
    let (dest2, staged2) = (dest.clone(), staged.clone());
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        use std::io::Write;
        std::fs::create_dir_all(&dir)?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&staged2)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        }
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&staged2, &dest2)
    })
    .await
    .map_err(|e| Error::Storage(format!("writing {path}: {e}")))?
    .map_err(|e| {
        let _ = std::fs::remove_file(&staged);
        io(e)
    })
}

/// A local object written under a hidden name and linked into place only
/// if nothing is there yet; `false` when something is.
async fn put_local_new(root: &std::path::Path, path: &str, bytes: Vec<u8>) -> Result<bool> {
    let dest = root.join(path);
    let dir = dest
        .parent()
        .ok_or_else(|| Error::Storage(format!("{path} names no file")))?
        .to_owned();
    let staged = dir.join(format!(".new.{}.tmp", uuid::Uuid::new_v4().simple()));
    let dest2 = dest.clone();
    tokio::task::spawn_blocking(move || -> std::io::Result<bool> {
        use std::io::Write;
        std::fs::create_dir_all(&dir)?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&staged)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        }
        let linked = f
            .write_all(&bytes)
            .and_then(|()| f.sync_all())
            .and_then(|()| std::fs::hard_link(&staged, &dest2));
        let _ = std::fs::remove_file(&staged);
        match linked {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    })
    .await
    .map_err(|e| Error::Storage(format!("writing {path}: {e}")))?
    .map_err(|e| Error::io(dest.display().to_string(), e))
}

pub struct ObjectWriter {
    inner: BufWriter,
    fault: Option<WriteFault>,
    /// The file being written, on local storage.
    local: Option<std::path::PathBuf>,
}

impl ObjectWriter {
    pub async fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let result = match &self.fault {
            None => self.inner.write_all(bytes).await,
            Some(f) => {
                let mut altered = bytes.to_vec();
                f(&mut altered);
                self.inner.write_all(&altered).await
            }
        };
        result.map_err(|e| Error::Storage(e.to_string()))
    }

    /// Completes the upload; the object exists only after this.
    pub async fn finish(mut self) -> Result<()> {
        self.inner
            .shutdown()
            .await
            .map_err(|e| Error::Storage(e.to_string()))?;
        match &self.local {
            Some(file) => crate::owner_only::restrict_file(file),
            None => Ok(()),
        }
    }

    pub async fn abort(mut self) {
        let _ = self.inner.abort().await;
    }
}
