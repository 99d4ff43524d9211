//! API keys: generation, hashing, and the front door's key cache.
//!
//! A key is `fsk_` + 40 random base62 characters (about 238 bits), so a plain
//! SHA-256 is the right storage hash (no stretching needed for random
//! secrets). The cache trusts a lookup for `ttl` (default 2 s): a revoked key
//! stops working within that bound, and a hot key costs one database read
//! per `ttl`, shared by concurrent requests.
//!
//! Only valid keys enter that cache: a flood of random keys cannot evict the
//! keys in use. Unknown and revoked keys are remembered for a second in a
//! small cache of their own, so repeating one costs no database read.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use fastack_entities::{ApiKeyId, Tenant};
use rand::Rng;
use sha2::{Digest, Sha256};

use crate::{error::Result, store::Store};

pub const KEY_PREFIX: &str = "fsk_";
/// Characters of a key kept in clear after [`KEY_PREFIX`] (its display
/// prefix, as `key list` prints it).
pub const DISPLAY_CHARS: usize = 8;
const KEY_CHARS: usize = 40;
const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A freshly generated key: the secret is shown once and never stored.
pub struct NewKey {
    pub secret: String,
    pub hash: [u8; 32],
    /// Enough of the key to recognise it in listings (`fsk_AbCdEf12`).
    pub prefix: String,
}

pub fn generate_key() -> NewKey {
    let mut rng = rand::rng();
    let mut secret = String::with_capacity(KEY_PREFIX.len() + KEY_CHARS);
    secret.push_str(KEY_PREFIX);
    for _ in 0..KEY_CHARS {
        secret.push(ALPHABET[rng.random_range(0..ALPHABET.len())] as char);
    }
    let hash = hash_key(&secret);
    let prefix = secret[..KEY_PREFIX.len() + DISPLAY_CHARS].to_owned();
    NewKey {
        secret,
        hash,
        prefix,
    }
}

pub fn hash_key(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Who a valid key belongs to and what it may do.
#[derive(Clone, Debug)]
pub struct Principal {
    pub key_id: ApiKeyId,
    pub tenant: Tenant,
    pub key_rate_limit: Option<u32>,
}

#[derive(Clone)]
struct Cached {
    fetched: Instant,
    principal: Arc<Principal>,
}

/// How long an unknown or revoked key is answered without a lookup.
const NEGATIVE_TTL: Duration = Duration::from_secs(1);

pub struct KeyCache {
    store: Store,
    ttl: Duration,
    cache: quick_cache::sync::Cache<[u8; 32], Cached>,
    /// Keys that were unknown or revoked, and when that was looked up.
    unknown: quick_cache::sync::Cache<[u8; 32], Instant>,
    /// Database lookups made (each also records the key's last use).
    lookups: AtomicU64,
}

impl std::fmt::Debug for KeyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyCache").field("ttl", &self.ttl).finish()
    }
}

impl KeyCache {
    pub fn new(store: Store, ttl: Duration) -> Self {
        KeyCache {
            store,
            ttl,
            cache: quick_cache::sync::Cache::new(100_000),
            unknown: quick_cache::sync::Cache::new(10_000),
            lookups: AtomicU64::new(0),
        }
    }

    /// Database lookups made so far.
    pub fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::Relaxed)
    }

    /// The principal of a secret when the cache knows it: `Some(None)` for
    /// a key known to be unknown or revoked, `None` when a lookup is due.
    pub fn cached(&self, secret: &str) -> Option<Option<Arc<Principal>>> {
        if !secret.starts_with(KEY_PREFIX) || secret.len() > 128 {
            return Some(None);
        }
        let hash = hash_key(secret);
        if let Some(hit) = self.cache.get(&hash)
            && hit.fetched.elapsed() < self.ttl
        {
            return Some(Some(hit.principal));
        }
        if let Some(at) = self.unknown.get(&hash)
            && at.elapsed() < NEGATIVE_TTL
        {
            return Some(None);
        }
        None
    }

    /// Records that a key was used, off the request's path (a lookup happens
    /// once per key per cache lifetime, so this is one small write each).
    fn touch(&self, id: ApiKeyId) {
        let store = self.store.clone();
        tokio::spawn(async move {
            let done = store.keys().touch(id, chrono::Utc::now()).await;
            if let Err(error) = done {
                tracing::debug!(%error, key = %id, "could not record the key's last use");
            }
        });
    }

    /// The principal of a bearer secret, or `None` when the key is unknown
    /// or revoked. Concurrent lookups of one key share one database read.
    pub async fn authenticate(&self, secret: &str) -> Result<Option<Arc<Principal>>> {
        if let Some(known) = self.cached(secret) {
            return Ok(known);
        }
        let hash = hash_key(secret);
        let guard = loop {
            match self.cache.get_value_or_guard_async(&hash).await {
                Ok(hit) if hit.fetched.elapsed() < self.ttl => return Ok(Some(hit.principal)),
                // Expired: drop it — unless a concurrent request already put
                // a fresh one in its place, so that every request in flight
                // when the entry expired does not look the key up again
                // (measured: about 120 lookups, each with its last-use
                // write, per expiry at 32 connections).
                Ok(stale) => {
                    self.cache.remove_if(&hash, |c| c.fetched == stale.fetched);
                }
                Err(guard) => break guard,
            }
        };
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let record = self.store.keys().lookup(&hash).await?;
        let principal = record.and_then(|r| {
            r.key.revoked_at.is_none().then(|| {
                Arc::new(Principal {
                    key_id: r.key.id,
                    tenant: r.tenant,
                    key_rate_limit: r.key.rate_limit_rps,
                })
            })
        });
        match &principal {
            Some(p) => {
                self.touch(p.key_id);
                let _ = guard.insert(Cached {
                    fetched: Instant::now(),
                    principal: p.clone(),
                });
            }
            // Dropping the guard inserts nothing: only valid keys are cached.
            None => self.unknown.insert(hash, Instant::now()),
        }
        Ok(principal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_prefixed_and_hash_stably() {
        let a = generate_key();
        let b = generate_key();
        assert_ne!(a.secret, b.secret);
        assert!(a.secret.starts_with("fsk_"));
        assert_eq!(a.secret.len(), 44);
        assert!(a.secret.starts_with(&a.prefix));
        assert_eq!(hash_key(&a.secret), a.hash);
        assert_ne!(a.hash, b.hash);
    }
}
