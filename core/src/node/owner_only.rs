//! Local files that hold personal data or secrets (the embedded database
//! and its WAL, the master key, the bootstrap key, local objects) are the
//! owner's alone: directories 0700, files 0600. An existing directory that
//! others can read is left as it is, with a warning at start.

use std::path::Path;

use tracing::warn;

use crate::error::{Error, Result};

/// Creates `path` (and missing parents) owner-only; warns when it already
/// exists with group or other permissions.
pub fn ensure_dir(path: &Path) -> Result<()> {
    let io = |e| Error::io(path.display().to_string(), e);
    if path.is_dir() {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path).map_err(io)?.permissions().mode() & 0o777;
            if mode & 0o077 != 0 && first_warning_for(path) {
                warn!(
                    path = %path.display(),
                    mode = format!("{mode:o}"),
                    "the data directory is open to other local users; `chmod 700` it"
                );
            }
        }
        return Ok(());
    }
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(path).map_err(io)
}

/// Whether this process has not yet warned about `path`: several parts
/// open the data directory at start, one warning says it.
#[cfg(unix)]
fn first_warning_for(path: &Path) -> bool {
    use std::{collections::HashSet, path::PathBuf, sync::Mutex};
    static WARNED: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);
    let key = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    warned.get_or_insert_with(HashSet::new).insert(key)
}

/// Makes an existing file owner-only.
pub fn restrict_file(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::io(path.display().to_string(), e))?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// Creates an empty owner-only file if there is none (SQLite creates its
/// `-wal` and `-shm` files with the database file's permissions).
pub fn create_file(path: &Path) -> Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options
        .open(path)
        .map(drop)
        .map_err(|e| Error::io(path.display().to_string(), e))
}

/// Creates (or opens) an owner-only file for reading and writing.
pub fn create_file_rw(path: &Path) -> Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options
        .open(path)
        .map_err(|e| Error::io(path.display().to_string(), e))
}

/// Writes a secret to a file readable by its owner only (and syncs it).
pub fn write_secret(path: &Path, contents: &str) -> Result<()> {
    use std::io::Write;
    let io = |e| Error::io(path.display().to_string(), e);
    if let Some(dir) = path.parent() {
        ensure_dir(dir)?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path).map_err(io)?;
    file.write_all(format!("{contents}\n").as_bytes())
        .map_err(io)?;
    file.sync_all().map_err(io)?;
    // A file that existed before keeps its mode on open: set it.
    restrict_file(path)
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn directories_and_files_are_owner_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        ensure_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        let key = dir.join("key");
        std::fs::write(&key, "old").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_secret(&key, "secret").unwrap();
        assert_eq!(mode(&key), 0o600);
        assert_eq!(std::fs::read_to_string(&key).unwrap(), "secret\n");
        let db = dir.join("db");
        create_file(&db).unwrap();
        assert_eq!(mode(&db), 0o600);
    }
}
