//! Keys and cryptography.
//!
//! Every key derives from the master key (`FASTACK_ENC_KEY`) by HKDF-SHA256
//! with a distinct `info` per purpose, so leaking one derived key (say, a
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
    pub fn from_master(master: &[u8]) -> Result<Self> {
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

    /// Loads the master key from configuration; embedded mode generates one
    /// under the data dir on first start (with a warning) and keeps it.
    pub fn load(config: &Config) -> Result<Self> {
        if let Some(b64) = &config.enc_key {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|e| Error::Config(format!("FASTACK_ENC_KEY is not base64: {e}")))?;
            return Keys::from_master(&bytes);
        }
        if !config.is_embedded() {
            return Err(Error::Config(
                "FASTACK_ENC_KEY is required with PostgreSQL (base64, at least 32 bytes)"
                    .to_owned(),
            ));
        }
        let path = config.data_dir.join("master-key");
        let bytes = match std::fs::read_to_string(&path) {
            Ok(text) => base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .map_err(|e| Error::Corrupt(format!("{}: {e}", path.display())))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut key = [0u8; 32];
                rand::rng().fill_bytes(&mut key);
                crate::private::write_secret(
                    &path,
                    &base64::engine::general_purpose::STANDARD.encode(key),
                )?;
                warn!(path = %path.display(), "no FASTACK_ENC_KEY: generated a local master key; back it up, exports cannot be decrypted without it");
                key.to_vec()
            }
            Err(e) => return Err(Error::io(path.display().to_string(), e)),
        };
        Keys::from_master(&bytes)
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
        Keys::from_master(&[7u8; 32]).unwrap()
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
        assert!(Keys::from_master(&[1u8; 16]).is_err());
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
