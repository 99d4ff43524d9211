//! The store's keys: the master key checked against the store, the root
//! key unwrapped with it, and a rotation of the master key (see `crypto`
//! for the two levels).
//!
//! A store records which master key it is written with (a check value,
//! never the key) the first time a node or a tool opens it. From then on a
//! different master key is refused at start, naming the setting, instead
//! of being accepted and failing later on every export and webhook secret.
//! A store written by a release without the record takes the key it is
//! opened with only if that key opens what the store already holds (a
//! webhook secret).

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};

use crate::{
    config::Config,
    crypto::{KeySource, Keys, MasterKey},
    error::{Error, Result},
    store::Storage,
    webhooks::Secret,
};

/// The keys of `store`, opened with the master key the configuration
/// names (finishing a rotation of the embedded key file that stopped
/// between its steps).
pub async fn open(store: &Storage, config: &Config, now: DateTime<Utc>) -> Result<Keys> {
    let master = MasterKey::load(config)?;
    let pending = match master.source() {
        KeySource::File(path) => read_pending(path)?,
        KeySource::Setting => None,
    };
    unlock(store, master, pending, now).await
}

/// The keys of `store`, opened with `master` (or with `pending`, the key
/// file a rotation was writing, when the store already moved to it).
async fn unlock(
    store: &Storage,
    master: MasterKey,
    pending: Option<MasterKey>,
    now: DateTime<Utc>,
) -> Result<Keys> {
    let record = match store.master_key().get().await? {
        Some(record) => record,
        None => {
            // A store written before the record: every key so far derived
            // from the master key itself.
            let keys = Keys::from_root(master.as_first_root())?;
            if let Some(sealed) = store.endpoints().any_sealed_secret().await?
                && Secret::open(&keys.webhook_secrets_key(), &sealed).is_err()
            {
                return Err(refused(&master));
            }
            let wrapped = master.wrap(master.as_first_root());
            store
                .master_key()
                .record_first(&master.check_value(), wrapped, now)
                .await?
        }
    };
    let master = if record.check_value == master.check_value() {
        if let Some(p) = &pending {
            // The rotation stopped before the store moved: its new key
            // was never in force.
            discard_pending(p)?;
        }
        master
    } else {
        match pending {
            Some(p) if record.check_value == p.check_value() => adopt_pending(p)?,
            _ => return Err(refused(&master)),
        }
    };
    Keys::from_root(&master.unwrap(&record.wrapped_root)?)
}

/// The refusal of a master key the store was not written with.
fn refused(master: &MasterKey) -> Error {
    Error::Config(format!(
        "{} is not the master key this store was written with (its check value differs \
         from the one the store recorded): start with the key the store was written with; \
         to change keys, rotate them with `fastack keys rotate`",
        master.names()
    ))
}

/// Rotates the master key: the root key, unwrapped with `current`, is
/// wrapped with `new` in one write that happens only while the store still
/// names `current`. Every key derived from the root stays the same
/// (external HMAC keys, webhook secrets, exports); from then on the store
/// opens with `new` only.
pub async fn rotate(
    store: &Storage,
    current: &MasterKey,
    new: &MasterKey,
    now: DateTime<Utc>,
) -> Result<()> {
    if current.check_value() == new.check_value() {
        return Err(Error::InvalidInput(
            "the new master key is the current one".to_owned(),
        ));
    }
    let record = match store.master_key().get().await? {
        Some(r) => r,
        None => {
            // Record the current key first (a store not opened since the
            // upgrade), checked as a start would.
            unlock(store, current.clone(), None, now).await?;
            store
                .master_key()
                .get()
                .await?
                .ok_or_else(|| Error::Corrupt("the master key's record vanished".to_owned()))?
        }
    };
    if record.check_value != current.check_value() {
        return Err(refused(current));
    }
    let root = current.unwrap(&record.wrapped_root)?;
    let moved = store
        .master_key()
        .rewrap(
            &current.check_value(),
            &new.check_value(),
            new.wrap(&root),
            now,
        )
        .await?;
    if !moved {
        return Err(Error::Conflict(
            "the master key changed meanwhile (another rotation?); nothing was changed".to_owned(),
        ));
    }
    Ok(())
}

/// Rotates the embedded node's key file: a new key is written beside it
/// (`master-key.next`), the store moves to it, then it replaces the file.
/// A rotation stopped between two steps is finished or undone by the next
/// [`open`]. Returns the new key.
pub async fn rotate_key_file(
    store: &Storage,
    current: &MasterKey,
    now: DateTime<Utc>,
) -> Result<MasterKey> {
    let KeySource::File(path) = current.source() else {
        return Err(Error::InvalidInput(
            "FASTACK_ENC_KEY is set: give the new key with --new-key-file".to_owned(),
        ));
    };
    let next_path = pending_path(path);
    let new = MasterKey::generate(KeySource::File(next_path.clone()));
    crate::owner_only::write_secret(&next_path, &new.to_base64())?;
    rotate(store, current, &new, now).await?;
    adopt_pending(new)
}

fn pending_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".next");
    PathBuf::from(name)
}

/// The key file a rotation was writing, if one was left.
fn read_pending(path: &Path) -> Result<Option<MasterKey>> {
    let next = pending_path(path);
    match std::fs::read_to_string(&next) {
        Ok(text) => Ok(MasterKey::from_base64(&text, KeySource::File(next)).ok()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(next.display().to_string(), e)),
    }
}

/// The pending key file replaces the key file (the store moved to it).
fn adopt_pending(pending: MasterKey) -> Result<MasterKey> {
    let KeySource::File(next) = pending.source() else {
        return Ok(pending);
    };
    let path = next.with_extension("");
    std::fs::rename(next, &path).map_err(|e| Error::io(path.display().to_string(), e))?;
    tracing::info!(path = %path.display(), "master key file replaced by the rotated key");
    Ok(pending.with_source(KeySource::File(path)))
}

fn discard_pending(pending: &MasterKey) -> Result<()> {
    if let KeySource::File(next) = pending.source() {
        std::fs::remove_file(next).map_err(|e| Error::io(next.display().to_string(), e))?;
    }
    Ok(())
}
