//! Standard Webhooks: secrets, signatures, the receiver's `verify`, the
//! retry schedule, and which addresses an endpoint may point at.
//!
//! A receiver verifies a delivery in a few lines:
//!
//! ```
//! use fastack_core::webhooks::{sign, verify, Secret};
//! let secret = Secret::generate();
//! let (id, ts, body) = ("msg_1", 1_700_000_000, br#"{"job_id":"j-1"}"#);
//! let header = sign(&secret, id, ts, body);
//! let now = chrono::DateTime::from_timestamp(ts + 30, 0).unwrap();
//! assert!(verify(&secret.to_string(), id, &ts.to_string(), &header, body, now).is_ok());
//! ```

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aes_gcm::{
    Aes256Gcm, Key, Nonce,
    aead::{Aead, KeyInit},
};
use base64::Engine;
use chrono::{DateTime, Duration, Utc};
use hmac::Mac;
use rand::{Rng, RngCore};

use crate::{
    crypto::HmacSha256,
    error::{Error, Result},
};

pub const SECRET_PREFIX: &str = "whsec_";
/// Signatures older (or newer) than this are refused by [`verify`].
pub const TOLERANCE_SECS: i64 = 300;
/// Total attempts of a delivery: the first, then ~2 s and ~8 s later.
pub const MAX_ATTEMPTS: u32 = 3;
/// How long a rotated-out secret keeps signing alongside the new one.
pub const ROTATION_OVERLAP: Duration = Duration::hours(24);

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// A signing secret: `whsec_` + base64 of 32 random bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{SECRET_PREFIX}{}", B64.encode(&self.0))
    }
}

impl Secret {
    pub fn generate() -> Self {
        let mut bytes = vec![0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        Secret(bytes)
    }

    pub fn parse(s: &str) -> Result<Self> {
        let raw = s.strip_prefix(SECRET_PREFIX).unwrap_or(s);
        B64.decode(raw)
            .map(Secret)
            .map_err(|_| Error::Config("a webhook secret is whsec_ followed by base64".to_owned()))
    }

    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// Encrypted for storage (AES-256-GCM, random nonce prepended).
    pub fn seal(&self, key: &[u8; 32]) -> Vec<u8> {
        let cipher = Aes256Gcm::new(&Key::<Aes256Gcm>::from(*key));
        let mut nonce = [0u8; 12];
        rand::rng().fill_bytes(&mut nonce);
        let mut out = nonce.to_vec();
        out.extend(
            cipher
                .encrypt(&Nonce::from(nonce), self.0.as_slice())
                .expect("AES-GCM encryption of 32 bytes cannot fail"),
        );
        out
    }

    pub fn open(key: &[u8; 32], sealed: &[u8]) -> Result<Self> {
        if sealed.len() < 12 {
            return Err(Error::Corrupt("sealed webhook secret too short".to_owned()));
        }
        let cipher = Aes256Gcm::new(&Key::<Aes256Gcm>::from(*key));
        let nonce: [u8; 12] = sealed[..12].try_into().expect("12 bytes");
        cipher
            .decrypt(&Nonce::from(nonce), &sealed[12..])
            .map(Secret)
            .map_err(|_| {
                Error::Corrupt(
                    "webhook secret does not decrypt (wrong FASTACK_ENC_KEY?)".to_owned(),
                )
            })
    }
}

/// `v1,<base64 HMAC-SHA256(secret, id.timestamp.body)>`
pub fn sign(secret: &Secret, id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = HmacSha256::new_from_slice(secret.bytes()).expect("HMAC takes any key length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", B64.encode(mac.finalize().into_bytes()))
}

/// The `webhook-signature` header: one signature per active secret,
/// space-separated (two during a rotation).
pub fn signature_header(secrets: &[Secret], id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets
        .iter()
        .map(|s| sign(s, id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What a receiver runs: the timestamp is within five minutes, and one of
/// the `v1` signatures matches (constant-time) over the raw body bytes.
pub fn verify(
    secret: &str,
    id: &str,
    timestamp: &str,
    signatures: &str,
    body: &[u8],
    now: DateTime<Utc>,
) -> Result<()> {
    let secret = Secret::parse(secret)?;
    let ts: i64 = timestamp
        .trim()
        .parse()
        .map_err(|_| Error::Signature("webhook-timestamp is not a number"))?;
    if (now.timestamp() - ts).abs() > TOLERANCE_SECS {
        return Err(Error::Signature("webhook-timestamp outside 5 minutes"));
    }
    for candidate in signatures.split_whitespace() {
        let Some(b64) = candidate.strip_prefix("v1,") else {
            continue;
        };
        let Ok(sig) = B64.decode(b64) else { continue };
        let mut mac =
            HmacSha256::new_from_slice(secret.bytes()).expect("HMAC takes any key length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(ts.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        if mac.verify_slice(&sig).is_ok() {
            return Ok(());
        }
    }
    Err(Error::Signature("no webhook signature matches"))
}

/// When the next attempt is due after `attempt` failed (1-based), or `None`
/// when it was the last: ~2 s after the first, ~8 s after the second, with
/// ±10 % jitter so retries of many deliveries do not synchronise.
pub fn retry_delay(attempt: u32) -> Option<Duration> {
    let base_ms: i64 = match attempt {
        1 => 2_000,
        2 => 8_000,
        _ => return None,
    };
    let jitter = rand::rng().random_range(-base_ms / 10..=base_ms / 10);
    Some(Duration::milliseconds(base_ms + jitter))
}

/// Addresses a webhook must not reach (SSRF): loopback, private,
/// link-local (cloud metadata lives there), shared, unspecified, multicast.
pub fn is_forbidden(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return forbidden_v4(v4);
            }
            let seg0 = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (seg0 & 0xfe00) == 0xfc00 // unique local (includes fd00:ec2::254)
                || (seg0 & 0xffc0) == 0xfe80 // link-local
                || v6 == Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0xa9fe, 0xa9fe)
        }
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || o[0] == 0
        || (o[0] == 100 && (o[1] & 0xc0) == 64) // 100.64.0.0/10 shared
        || (o[0] == 192 && o[1] == 0 && o[2] == 0) // IETF protocol assignments
}

/// Checks an endpoint URL at registration: http(s) only, and (unless
/// private targets are allowed) every address its host resolves to must be
/// public. Returns the normalised URL.
pub async fn check_url(url: &str, allow_private: bool) -> Result<String> {
    let parsed = url::Url::parse(url.trim())
        .map_err(|e| Error::Config(format!("endpoint URL is not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(Error::Config(
            "endpoint URL must be http or https".to_owned(),
        ));
    }
    let host = parsed
        .host_str()
        .ok_or_else(|| Error::Config("endpoint URL has no host".to_owned()))?
        .trim_matches(|c| c == '[' || c == ']')
        .to_owned();
    if !allow_private {
        let port = parsed.port_or_known_default().unwrap_or(443);
        let addrs: Vec<IpAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => tokio::net::lookup_host((host.as_str(), port))
                .await
                .map_err(|e| Error::Config(format!("endpoint host {host} does not resolve: {e}")))?
                .map(|a| a.ip())
                .collect(),
        };
        if addrs.is_empty() || addrs.iter().any(|ip| is_forbidden(*ip)) {
            return Err(Error::Config(format!(
                "endpoint host {host} resolves to a loopback, private or link-local address; \
                 set FASTACK_WEBHOOK_ALLOW_PRIVATE=true to allow it"
            )));
        }
    }
    Ok(parsed.to_string())
}

/// Parses `--events` (comma-separated), defaulting to the job events.
pub fn parse_events(events: Option<&str>) -> Result<Vec<String>> {
    let list: Vec<String> = match events {
        None => fastack_entities::webhook::DEFAULT_EVENTS
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
        Some(s) => s
            .split(',')
            .map(|e| e.trim().to_owned())
            .filter(|e| !e.is_empty())
            .collect(),
    };
    if list.is_empty() {
        return Err(Error::Config(
            "subscribe to at least one event type".to_owned(),
        ));
    }
    for e in &list {
        if !fastack_entities::webhook::EVENT_TYPES.contains(&e.as_str()) {
            return Err(Error::Config(format!(
                "unknown event type `{e}` (expected job.completed, job.failed, core.event.tracked)"
            )));
        }
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_and_verify_with_rotation() {
        let old = Secret::generate();
        let new = Secret::generate();
        let now = Utc::now();
        let ts = now.timestamp();
        let header = signature_header(&[new.clone(), old.clone()], "msg_1", ts, b"{}");
        assert_eq!(header.split(' ').count(), 2);
        assert!(
            verify(
                &new.to_string(),
                "msg_1",
                &ts.to_string(),
                &header,
                b"{}",
                now
            )
            .is_ok()
        );
        assert!(
            verify(
                &old.to_string(),
                "msg_1",
                &ts.to_string(),
                &header,
                b"{}",
                now
            )
            .is_ok()
        );
        let other = Secret::generate();
        assert!(
            verify(
                &other.to_string(),
                "msg_1",
                &ts.to_string(),
                &header,
                b"{}",
                now
            )
            .is_err()
        );
        // Raw bytes: a re-serialised body does not verify.
        assert!(
            verify(
                &new.to_string(),
                "msg_1",
                &ts.to_string(),
                &header,
                b"{ }",
                now
            )
            .is_err()
        );
        // Replays older than five minutes are refused.
        let later = now + Duration::seconds(301);
        assert!(
            verify(
                &new.to_string(),
                "msg_1",
                &ts.to_string(),
                &header,
                b"{}",
                later
            )
            .is_err()
        );
    }

    #[test]
    fn secrets_seal_and_parse() {
        let key = [3u8; 32];
        let s = Secret::generate();
        let text = s.to_string();
        assert!(text.starts_with("whsec_"));
        assert_eq!(Secret::parse(&text).unwrap(), s);
        assert_eq!(Secret::open(&key, &s.seal(&key)).unwrap(), s);
        assert!(Secret::open(&[4u8; 32], &s.seal(&key)).is_err());
    }

    #[test]
    fn retry_schedule_is_two_then_eight_seconds() {
        let d1 = retry_delay(1).unwrap().num_milliseconds();
        let d2 = retry_delay(2).unwrap().num_milliseconds();
        assert!((1_800..=2_200).contains(&d1));
        assert!((7_200..=8_800).contains(&d2));
        assert_eq!(retry_delay(3), None);
    }

    #[test]
    fn forbidden_addresses() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fe80::1",
            "fd00:ec2::254",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_forbidden(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["93.184.216.34", "2606:4700::1111", "8.8.8.8"] {
            assert!(!is_forbidden(ip.parse().unwrap()), "{ip}");
        }
    }

    #[tokio::test]
    async fn urls_are_checked_at_registration() {
        assert!(check_url("ftp://example.com/x", true).await.is_err());
        assert!(check_url("not a url", true).await.is_err());
        assert!(
            check_url("http://127.0.0.1:9000/hook", false)
                .await
                .is_err()
        );
        assert!(
            check_url("http://169.254.169.254/latest/meta-data", false)
                .await
                .is_err()
        );
        assert!(check_url("http://[::1]/x", false).await.is_err());
        assert!(check_url("http://localhost:8080/x", false).await.is_err());
        assert_eq!(
            check_url("http://127.0.0.1:9000/hook", true).await.unwrap(),
            "http://127.0.0.1:9000/hook"
        );
    }

    #[test]
    fn events_default_and_validate() {
        assert_eq!(
            parse_events(None).unwrap(),
            vec!["job.completed", "job.failed"]
        );
        assert_eq!(
            parse_events(Some("core.event.tracked")).unwrap(),
            vec!["core.event.tracked"]
        );
        assert!(parse_events(Some("job.started")).is_err());
    }
}
