//! Keys and cryptography.
//!
//! Two levels. The **master key** (`FASTACK_ENC_KEY`, or the embedded
//! node's `master-key` file; [`MasterKey`]) opens one thing: the store's
//! **root key**, kept in the store wrapped by it (AES-256-GCM under a key
//! derived from the master key), with a check value that names the master
//! key without revealing it (see `keyring`). A store first written by a
//! release without the root key took the master key itself as its root,
//! so every key it derived stays the same. Rotating the master key
//! re-wraps the root key; nothing derived from the root changes.
//!
//! Every key in use derives from the root key by HKDF-SHA256 with a
//! distinct `info` per purpose, so leaking one derived key (say, a
//! tenant's external HMAC key handed to a consumer) reveals nothing else:
//!
//! | purpose | info |
//! |---|---|
//! | encryption of stored objects | `fastack/v1/storage-encryption` |
//! | a tenant's external HMAC key (result HMACs) | `fastack/v1/external-hmac/tenant/<tenant id>` |
//! | the deployment's external HMAC key (AMQP signatures) | `fastack/v1/external-hmac/deployment` |
//! | webhook secrets at rest | `fastack/v1/webhook-secrets` |
//!
//! Stored objects are encrypted with AES-256-GCM in 64 KiB segments (the
//! STREAM construction: nonce = 7-byte random prefix ‖ 32-bit counter ‖
//! last-segment flag), so large exports never sit in memory whole and a
//! truncated object fails to decrypt.

use aes_gcm::{
    Aes256Gcm, Key, Nonce,
    aead::{Aead, KeyInit},
};
use base64::Engine;
use fastack_entities::TenantId;
use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use tracing::warn;

use crate::{
    config::Config,
    error::{Error, Result},
};

pub type HmacSha256 = Hmac<Sha256>;

const INFO_STORAGE: &[u8] = b"fastack/v1/storage-encryption";
const INFO_DEPLOYMENT_HMAC: &[u8] = b"fastack/v1/external-hmac/deployment";
const INFO_WEBHOOK_SECRETS: &[u8] = b"fastack/v1/webhook-secrets";
const INFO_CONSOLE: &[u8] = b"fastack/v1/console";
const TENANT_HMAC_PREFIX: &str = "fastack/v1/external-hmac/tenant/";
/// Of the master key: the key that wraps the root key, and the check value.
const INFO_WRAP: &[u8] = b"fastack/v1/master-key/wrap";
const INFO_CHECK: &[u8] = b"fastack/v1/master-key/check";
const ROOT_AAD: &[u8] = b"fastack root key v1";

/// The derived keys of a deployment.
#[derive(Clone)]
pub struct Keys {
    prk: Hkdf<Sha256>,
    storage: [u8; 32],
    deployment_hmac: [u8; 32],
    webhook_secrets: [u8; 32],
    console: [u8; 32],
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(..)")
    }
}

impl Keys {
    /// The keys derived from a store's root key.
    pub fn from_root(master: &[u8]) -> Result<Self> {
        if master.len() < 32 {
            return Err(Error::Config(
                "FASTACK_ENC_KEY must decode to at least 32 bytes".to_owned(),
            ));
        }
        let prk = Hkdf::<Sha256>::new(Some(b"fastack"), master);
        let derive = |info: &[u8]| {
            let mut out = [0u8; 32];
            prk.expand(info, &mut out)
                .expect("32 bytes is a valid HKDF length");
            out
        };
        Ok(Keys {
            storage: derive(INFO_STORAGE),
            deployment_hmac: derive(INFO_DEPLOYMENT_HMAC),
            webhook_secrets: derive(INFO_WEBHOOK_SECRETS),
            console: derive(INFO_CONSOLE),
            prk,
        })
    }

    /// The tenant's external HMAC key (verifies result HMACs).
    pub fn tenant_hmac(&self, tenant: TenantId) -> [u8; 32] {
        let mut out = [0u8; 32];
        self.prk
            .expand(format!("{TENANT_HMAC_PREFIX}{tenant}").as_bytes(), &mut out)
            .expect("32 bytes is a valid HKDF length");
        out
    }

    /// The deployment's external HMAC key (verifies AMQP message signatures).
    pub fn deployment_hmac(&self) -> [u8; 32] {
        self.deployment_hmac
    }

    pub fn storage_key(&self) -> [u8; 32] {
        self.storage
    }

    pub fn webhook_secrets_key(&self) -> [u8; 32] {
        self.webhook_secrets
    }

    /// Signs the account console's CSRF tokens.
    pub fn console_key(&self) -> [u8; 32] {
        self.console
    }
}

/// The master key: opens the store's root key, and nothing else.
#[derive(Clone)]
pub struct MasterKey {
    bytes: Vec<u8>,
    /// Where it came from, named in errors.
    source: KeySource,
}

/// Where a master key was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// `FASTACK_ENC_KEY`.
    Setting,
    /// The embedded node's key file (no `FASTACK_ENC_KEY`).
    File(std::path::PathBuf),
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MasterKey({})", self.names())
    }
}

impl MasterKey {
    /// A master key of `bytes` (at least 32).
    pub fn new(bytes: Vec<u8>, source: KeySource) -> Result<Self> {
        if bytes.len() < 32 {
            return Err(Error::Config(
                "FASTACK_ENC_KEY must decode to at least 32 bytes".to_owned(),
            ));
        }
        Ok(MasterKey { bytes, source })
    }

    /// A master key written as base64 (the setting's and the files' form).
    pub fn from_base64(text: &str, source: KeySource) -> Result<Self> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|e| Error::Config(format!("{} is not base64: {e}", source.name())))?;
        MasterKey::new(bytes, source)
    }

    /// A new random key.
    pub fn generate(source: KeySource) -> Self {
        let mut key = vec![0u8; 32];
        rand::rng().fill_bytes(&mut key);
        MasterKey { bytes: key, source }
    }

    /// The key as its files hold it.
    pub fn to_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.bytes)
    }

    /// Loads the master key from configuration; embedded mode generates one
    /// under the data dir on first start (with a warning) and keeps it.
    pub fn load(config: &Config) -> Result<Self> {
        if let Some(b64) = &config.enc_key {
            return MasterKey::from_base64(b64, KeySource::Setting);
        }
        if !config.is_embedded() {
            return Err(Error::Config(
                "FASTACK_ENC_KEY is required with PostgreSQL (base64, at least 32 bytes)"
                    .to_owned(),
            ));
        }
        let path = config.data_dir.join("master-key");
        let source = KeySource::File(path.clone());
        match std::fs::read_to_string(&path) {
            Ok(text) => MasterKey::from_base64(&text, source)
                .map_err(|e| Error::Corrupt(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = MasterKey::generate(source);
                crate::owner_only::write_secret(&path, &key.to_base64())?;
                warn!(path = %path.display(), "no FASTACK_ENC_KEY: generated a local master key; back it up, exports cannot be decrypted without it");
                Ok(key)
            }
            Err(e) => Err(Error::io(path.display().to_string(), e)),
        }
    }

    pub fn source(&self) -> &KeySource {
        &self.source
    }

    /// The same key, read from `source`.
    pub fn with_source(self, source: KeySource) -> Self {
        MasterKey { source, ..self }
    }

    /// What the key is called in errors: the setting, or its file.
    pub fn names(&self) -> String {
        self.source.name()
    }

    fn derive(&self, info: &[u8]) -> [u8; 32] {
        let mut out = [0u8; 32];
        Hkdf::<Sha256>::new(Some(b"fastack"), &self.bytes)
            .expand(info, &mut out)
            .expect("32 bytes is a valid HKDF length");
        out
    }

    /// Names this key without revealing it: hex of a value derived from it
    /// one way. Two keys have the same check value only if they are the
    /// same key.
    pub fn check_value(&self) -> String {
        hex::encode(self.derive(INFO_CHECK))
    }

    /// `root` sealed under this key: nonce ‖ AES-256-GCM ciphertext.
    pub fn wrap(&self, root: &[u8]) -> Vec<u8> {
        let cipher = Aes256Gcm::new(&Key::<Aes256Gcm>::from(self.derive(INFO_WRAP)));
        let mut nonce = [0u8; 12];
        rand::rng().fill_bytes(&mut nonce);
        let sealed = cipher
            .encrypt(
                &Nonce::from(nonce),
                aes_gcm::aead::Payload {
                    msg: root,
                    aad: ROOT_AAD,
                },
            )
            .expect("AES-GCM encryption of a short key cannot fail");
        [nonce.as_slice(), &sealed].concat()
    }

    /// The root key sealed by [`MasterKey::wrap`] under this key.
    pub fn unwrap(&self, wrapped: &[u8]) -> Result<Vec<u8>> {
        let bad =
            || Error::Corrupt("the stored root key does not open with the master key".to_owned());
        if wrapped.len() < 12 {
            return Err(bad());
        }
        let cipher = Aes256Gcm::new(&Key::<Aes256Gcm>::from(self.derive(INFO_WRAP)));
        let nonce: [u8; 12] = wrapped[..12].try_into().expect("12 bytes");
        cipher
            .decrypt(
                &Nonce::from(nonce),
                aes_gcm::aead::Payload {
                    msg: &wrapped[12..],
                    aad: ROOT_AAD,
                },
            )
            .map_err(|_| bad())
    }

    /// The key's own bytes, as a store's first root key (every key an
    /// earlier release derived came from them).
    pub fn as_first_root(&self) -> &[u8] {
        &self.bytes
    }
}

impl KeySource {
    fn name(&self) -> String {
        match self {
            KeySource::Setting => "FASTACK_ENC_KEY".to_owned(),
            KeySource::File(path) => format!(
                "the master key file {} (FASTACK_ENC_KEY unset)",
                path.display()
            ),
        }
    }
}

pub fn hmac_hex(key: &[u8], parts: &[&[u8]]) -> String {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    for p in parts {
        mac.update(p);
    }
    hex::encode(mac.finalize().into_bytes())
}

/// Constant-time check of a hex HMAC.
pub fn hmac_verify_hex(key: &[u8], parts: &[&[u8]], expected_hex: &str) -> bool {
    let Ok(expected) = hex::decode(expected_hex) else {
        return false;
    };
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    for p in parts {
        mac.update(p);
    }
    mac.verify_slice(&expected).is_ok()
}

const MAGIC: &[u8; 6] = b"FSTK1\0";
pub const SEGMENT: usize = 64 * 1024;
const TAG: usize = 16;

fn nonce(prefix: &[u8; 7], counter: u32, last: bool) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[..7].copy_from_slice(prefix);
    n[7..11].copy_from_slice(&counter.to_be_bytes());
    n[11] = u8::from(last);
    n
}

/// Streaming encryptor: feed plaintext, collect ciphertext.
pub struct Encryptor {
    cipher: Aes256Gcm,
    prefix: [u8; 7],
    counter: u32,
    pending: Vec<u8>,
    out: Vec<u8>,
}

impl Encryptor {
    pub fn new(key: &[u8; 32]) -> Self {
        let mut prefix = [0u8; 7];
        rand::rng().fill_bytes(&mut prefix);
        let mut out = Vec::with_capacity(SEGMENT + 64);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&prefix);
        Encryptor {
            cipher: Aes256Gcm::new(&Key::<Aes256Gcm>::from(*key)),
            prefix,
            counter: 0,
            pending: Vec::with_capacity(SEGMENT),
            out,
        }
    }

    fn seal(&mut self, last: bool) {
        let n = nonce(&self.prefix, self.counter, last);
        let ct = self
            .cipher
            .encrypt(&Nonce::from(n), self.pending.as_slice())
            .expect("AES-GCM encryption of a bounded segment cannot fail");
        self.out.extend_from_slice(&(ct.len() as u32).to_be_bytes());
        self.out.extend_from_slice(&ct);
        self.pending.clear();
        self.counter += 1;
    }

    pub fn update(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let room = SEGMENT - self.pending.len();
            let take = room.min(data.len());
            self.pending.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.pending.len() == SEGMENT {
                self.seal(false);
            }
        }
    }

    /// Ciphertext produced so far (drained).
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.seal(true);
        self.out
    }
}

/// Decrypts a whole object written by [`Encryptor`].
pub fn decrypt(key: &[u8; 32], data: &[u8]) -> Result<Vec<u8>> {
    let bad = |why: &str| Error::Corrupt(format!("encrypted object: {why}"));
    if data.len() < MAGIC.len() + 7 || &data[..MAGIC.len()] != MAGIC {
        return Err(bad("unknown format"));
    }
    let mut prefix = [0u8; 7];
    prefix.copy_from_slice(&data[MAGIC.len()..MAGIC.len() + 7]);
    let cipher = Aes256Gcm::new(&Key::<Aes256Gcm>::from(*key));
    let mut rest = &data[MAGIC.len() + 7..];
    let mut out = Vec::with_capacity(rest.len());
    let mut counter = 0u32;
    loop {
        if rest.len() < 4 {
            return Err(bad("truncated"));
        }
        let len = u32::from_be_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        rest = &rest[4..];
        if !(TAG..=SEGMENT + TAG).contains(&len) || rest.len() < len {
            return Err(bad("truncated"));
        }
        let last = rest.len() == len;
        let n = nonce(&prefix, counter, last);
        let pt = cipher
            .decrypt(&Nonce::from(n), &rest[..len])
            .map_err(|_| bad("authentication failed"))?;
        out.extend_from_slice(&pt);
        rest = &rest[len..];
        counter += 1;
        if last {
            return Ok(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        Keys::from_root(&[7u8; 32]).unwrap()
    }

    #[test]
    fn derived_keys_differ_per_purpose_and_tenant() {
        let k = keys();
        let t1 = TenantId::new();
        let t2 = TenantId::new();
        assert_ne!(k.tenant_hmac(t1), k.tenant_hmac(t2));
        assert_eq!(k.tenant_hmac(t1), keys().tenant_hmac(t1));
        assert_ne!(k.storage_key(), k.deployment_hmac());
        assert_ne!(k.deployment_hmac(), k.webhook_secrets_key());
        assert!(Keys::from_root(&[1u8; 16]).is_err());
    }

    #[test]
    fn stream_encryption_round_trips_and_detects_tampering() {
        let key = keys().storage_key();
        for size in [0usize, 10, SEGMENT, SEGMENT + 1, 3 * SEGMENT + 17] {
            let plain: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            let mut enc = Encryptor::new(&key);
            for chunk in plain.chunks(1000) {
                enc.update(chunk);
            }
            let mut ct = enc.take_output();
            let tail = enc.finish();
            ct.extend_from_slice(&tail);
            assert_eq!(decrypt(&key, &ct).unwrap(), plain, "size {size}");
            if size > SEGMENT {
                // Dropping the last segment is detected.
                let first_len = u32::from_be_bytes(ct[13..17].try_into().unwrap()) as usize;
                assert!(decrypt(&key, &ct[..17 + first_len]).is_err());
            }
            let mut flipped = ct.clone();
            let last = flipped.len() - 1;
            flipped[last] ^= 1;
            assert!(decrypt(&key, &flipped).is_err());
        }
    }

    #[test]
    fn hmac_hex_verifies_in_constant_time() {
        let sig = hmac_hex(b"k", &[b"a", b"b"]);
        assert_eq!(sig, hmac_hex(b"k", &[b"ab"]));
        assert!(hmac_verify_hex(b"k", &[b"ab"], &sig));
        assert!(!hmac_verify_hex(b"k", &[b"ac"], &sig));
        assert!(!hmac_verify_hex(b"k", &[b"ab"], "zz"));
    }
}
