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

/// Whether a webhook may not reach `ip` (SSRF guard). An allow-list: only
/// globally routable unicast addresses pass. IPv6 forms that carry an IPv4
/// address (mapped, translated, compatible, NAT64, 6to4, Teredo) are judged
/// by the IPv4 address they carry.
pub fn is_forbidden(ip: IpAddr) -> bool {
    !is_global_unicast(ip)
}

/// Globally routable unicast: not loopback, private, shared, link-local,
/// site-local, unique-local, documentation, benchmarking, reserved,
/// multicast, broadcast or unspecified.
pub fn is_global_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => global_v4(v4),
        IpAddr::V6(v6) => global_v6(v6),
    }
}

fn global_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(a == 0 // "this network"
        || a == 10
        || a == 127
        || (a == 100 && (b & 0xc0) == 64) // 100.64.0.0/10 shared (CGNAT)
        || (a == 169 && b == 254) // link-local, cloud metadata
        || (a == 172 && (b & 0xf0) == 16)
        || (a == 192 && b == 168)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2) // TEST-NET-1
        || (a == 192 && b == 88 && c == 99) // 6to4 relay anycast
        || (a == 198 && (b & 0xfe) == 18) // 198.18.0.0/15 benchmarking
        || (a == 198 && b == 51 && c == 100) // TEST-NET-2
        || (a == 203 && b == 0 && c == 113) // TEST-NET-3
        || a >= 224) // multicast 224/4, reserved 240/4, broadcast
}

/// The IPv4 address an IPv6 address carries, for the forms that carry one.
/// Teredo carries two (server and client); both must be global.
fn embedded_v4(ip: Ipv6Addr) -> Option<Vec<Ipv4Addr>> {
    let s = ip.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        // ::ffff:a.b.c.d (mapped) and ::ffff:0:a.b.c.d (translated)
        [0, 0, 0, 0, 0, 0xffff, _, _] | [0, 0, 0, 0, 0xffff, 0, _, _] => Some(vec![low]),
        // ::a.b.c.d (compatible, deprecated); :: and ::1 are not IPv4
        [0, 0, 0, 0, 0, 0, hi, lo] if (hi, lo) > (0, 1) => Some(vec![low]),
        // NAT64: 64:ff9b::/96 and the local-use 64:ff9b:1::/48
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] | [0x64, 0xff9b, 1, ..] => Some(vec![low]),
        // 6to4: 2002:AABB:CCDD::/48 carries AA.BB.CC.DD
        [0x2002, hi, lo, ..] => Some(vec![Ipv4Addr::new(
            (hi >> 8) as u8,
            hi as u8,
            (lo >> 8) as u8,
            lo as u8,
        )]),
        // Teredo: 2001:0::/32, server in bits 32..64, client inverted last
        [0x2001, 0, hi, lo, ..] => Some(vec![
            Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8),
            Ipv4Addr::from(!u32::from(low)),
        ]),
        _ => None,
    }
}

fn global_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4s) = embedded_v4(ip) {
        return v4s.into_iter().all(global_v4);
    }
    let s = ip.segments();
    // Global unicast is 2000::/3; everything else (loopback, unspecified,
    // ULA fc00::/7, link-local fe80::/10, site-local fec0::/10, multicast,
    // discard 100::/64) is not.
    let protocol_assignments = s[0] == 0x2001 && s[1] < 0x0200; // 2001::/23, benchmarking
    let documentation = (s[0] == 0x2001 && s[1] == 0x0db8) || (s[0] == 0x3fff && s[1] < 0x1000);
    (s[0] & 0xe000) == 0x2000 && !protocol_assignments && !documentation
}

/// An endpoint URL as checked at registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedUrl {
    /// Normalised.
    pub url: String,
    /// The host did not resolve at registration. Accepted: the connect-time
    /// check decides at every delivery (a name may be created after its
    /// endpoint), and the operator is told.
    pub unresolved: bool,
}

/// Checks an endpoint URL at registration: http(s) only, and (unless
/// private targets are allowed) an IP literal or every address the host
/// resolves to now must be globally routable. A host that does not resolve
/// is accepted with a note: deliveries check the address again at connect
/// time, whatever the name resolves to then.
pub async fn check_url(url: &str, allow_private: bool) -> Result<CheckedUrl> {
    let refused = |m: String| Error::InvalidEndpoint(m);
    let parsed =
        url::Url::parse(url.trim()).map_err(|e| refused(format!("the URL is not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(refused("the URL must be http or https".to_owned()));
    }
    let host = parsed
        .host_str()
        .ok_or_else(|| refused("the URL has no host".to_owned()))?
        .trim_matches(|c| c == '[' || c == ']')
        .to_owned();
    let mut unresolved = false;
    if !allow_private {
        let port = parsed.port_or_known_default().unwrap_or(443);
        let addrs: Vec<IpAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => match tokio::net::lookup_host((host.as_str(), port)).await {
                Ok(found) => found.map(|a| a.ip()).collect(),
                Err(_) => {
                    unresolved = true;
                    Vec::new()
                }
            },
        };
        if addrs.iter().any(|ip| is_forbidden(*ip)) {
            return Err(refused(format!(
                "{host} is or resolves to an address that is not globally routable \
                 (loopback, private, link-local, reserved…); set FASTACK_WEBHOOK_ALLOW_PRIVATE=true \
                 where this command runs and on the server to allow it"
            )));
        }
    }
    Ok(CheckedUrl {
        url: parsed.to_string(),
        unresolved,
    })
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
        return Err(Error::InvalidEndpoint(
            "subscribe to at least one event type".to_owned(),
        ));
    }
    for e in &list {
        if !fastack_entities::webhook::EVENT_TYPES.contains(&e.as_str()) {
            return Err(Error::InvalidEndpoint(format!(
                "unknown event type `{e}` (expected one of {})",
                fastack_entities::webhook::EVENT_TYPES.join(", ")
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
    fn only_global_unicast_addresses_are_allowed() {
        for ip in [
            // IPv4 special-purpose space
            "0.0.0.0",
            "0.1.2.3",
            "10.1.2.3",
            "100.64.0.1",
            "100.127.255.254",
            "127.0.0.1",
            "127.255.255.255",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "192.88.99.1",
            "192.168.1.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            // IPv6 special-purpose space
            "::",
            "::1",
            "100::1",
            "fc00::1",
            "fd00:ec2::254",
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "2001:2::1",
            "2001:db8::1",
            "3fff::1",
            // IPv6 forms carrying a forbidden IPv4 address
            "::ffff:127.0.0.1",
            "::ffff:0:127.0.0.1",
            "::127.0.0.1",
            "::169.254.169.254",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::a00:1",
            "2002:7f00:1::",
            "2002:a00:1::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
        ] {
            assert!(is_forbidden(ip.parse().unwrap()), "{ip} must be refused");
        }
        for ip in [
            "93.184.216.34",
            "8.8.8.8",
            "1.1.1.1",
            "100.128.0.1",
            "172.32.0.1",
            "198.20.0.1",
            "2606:4700::1111",
            "2a00:1450:4001:82a::200e",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(!is_forbidden(ip.parse().unwrap()), "{ip} must be allowed");
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
            check_url("http://127.0.0.1:9000/hook", true)
                .await
                .unwrap()
                .url,
            "http://127.0.0.1:9000/hook"
        );
        // A name that does not resolve (yet) is accepted, and said so.
        let later = check_url("https://hooks.acme.example/fastack", false)
            .await
            .unwrap();
        assert!(later.unresolved);
        assert!(matches!(
            check_url("ftp://x", false).await,
            Err(Error::InvalidEndpoint(_))
        ));
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
