//! Redaction of error messages that leave the node (`metadata.error.message`
//! of failed jobs). Four kinds of leak become `[redacted]`; the rest of the
//! text survives so the message stays actionable:
//!
//! 1. connection URIs (`postgres://user:pw@db:5432/x`, `s3://bucket/key`);
//! 2. the address operand of a network error (`dial tcp 10.0.0.7:5432: …`,
//!    `read tcp 10.0.0.1:5000->10.0.0.2:5432: …`, `connect to db.internal:5432`);
//! 3. the `Addr:` operand of a driver error (`{ Addr: mongo-0:27017, … }`);
//! 4. IPv4 literals anywhere.

use std::sync::LazyLock;

use regex::Regex;

pub const REDACTED: &str = "[redacted]";

static URI: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\w+://\S+").expect("static regex"));
static NET_OP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\b(dial|read|write|accept|listen|lookup|connect(?:ing)?(?: to)?)\s+((?:tcp|udp|unix|ip)[46]?\s+)?([^\s:,;]+(?::\d+)?(?:->[^\s:,;]+(?::\d+)?)?)",
    )
    .expect("static regex")
});
static ADDR: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(Addr:\s*)([^\s,}\]]+)").expect("static regex"));
static IPV4: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b").expect("static regex"));

/// Redacts the four kinds of leak from an error message.
pub fn redact(message: &str) -> String {
    let s = URI.replace_all(message, REDACTED);
    let s = NET_OP.replace_all(&s, |c: &regex::Captures<'_>| {
        let operand = &c[3];
        // Words like "connect: connection refused" are not addresses.
        if operand
            .chars()
            .any(|ch| ch.is_ascii_digit() || ch == '.' || ch == '[')
            || c.get(2).is_some()
        {
            format!(
                "{} {}{REDACTED}",
                &c[1],
                c.get(2).map_or("", |m| m.as_str())
            )
        } else {
            c[0].to_owned()
        }
    });
    let s = ADDR.replace_all(&s, |c: &regex::Captures<'_>| format!("{}{REDACTED}", &c[1]));
    let s = IPV4.replace_all(&s, REDACTED);
    s.into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_uris() {
        assert_eq!(
            redact("failed to connect to postgres://app:s3cret@db.internal:5432/prod: timeout"),
            "failed to connect to [redacted] timeout"
        );
        assert_eq!(
            redact("upload to s3://bucket/exports/x failed"),
            "upload to [redacted] failed"
        );
    }

    #[test]
    fn network_error_address_operands() {
        assert_eq!(
            redact("dial tcp db.internal:5432: connect: connection refused"),
            "dial tcp [redacted]: connect: connection refused"
        );
        assert_eq!(
            redact("read tcp 10.1.2.3:50432->10.9.8.7:5432: i/o timeout"),
            "read tcp [redacted]: i/o timeout"
        );
        assert_eq!(
            redact("error connecting to warehouse.corp:9000 after 3 attempts"),
            "error connecting to [redacted] after 3 attempts"
        );
        // Plain words after a verb stay.
        assert_eq!(
            redact("failed to read the export"),
            "failed to read the export"
        );
    }

    #[test]
    fn addr_operands() {
        assert_eq!(
            redact("server selection error: { Addr: mongo-0.mongo:27017, Type: Unknown }"),
            "server selection error: { Addr: [redacted], Type: Unknown }"
        );
    }

    #[test]
    fn ipv4_literals() {
        assert_eq!(
            redact("no route to host 192.168.1.20 (tried 10.0.0.1:443)"),
            "no route to host [redacted] (tried [redacted])"
        );
        assert_eq!(
            redact("exported 1.5 MB in 3 parts"),
            "exported 1.5 MB in 3 parts"
        );
    }
}
