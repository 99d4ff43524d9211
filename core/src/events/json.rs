//! The front door's JSON rules, the same for every backend: a body parses
//! only if no object repeats a member name, and it is storable only if no
//! string (value or member name, at any depth) holds a NUL or a lone
//! surrogate and every number survives the trip through storage with its
//! value (a 64-bit integer, or a decimal an IEEE double keeps exactly).
//!
//! PostgreSQL refuses NUL in `text` and `jsonb`; SQLite would keep it. A
//! number such as `123456789012345678901234567890` would come back as
//! `1.2345678901234568e29`. Refusing both at the edge, with a JSON pointer
//! to the place, is what makes "accepted" mean "stored and returned as
//! sent" on both backends.

use std::fmt;

use serde::de::{self, Deserialize, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// What makes a string or number unstorable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unstorable {
    /// `\u0000` in a string or member name.
    Nul,
    /// A `\uD800`–`\uDFFF` escape without its pair.
    LoneSurrogate,
    /// A number whose value storage would change.
    InexactNumber,
}

impl Unstorable {
    /// The `code` of the field error.
    pub fn code(self) -> &'static str {
        match self {
            Unstorable::Nul | Unstorable::LoneSurrogate => "invalid_character",
            Unstorable::InexactNumber => "invalid_number",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Unstorable::Nul => "NUL (\\u0000) is not allowed in strings or member names",
            Unstorable::LoneSurrogate => {
                "a lone UTF-16 surrogate escape is not a character; send valid UTF-8"
            }
            Unstorable::InexactNumber => {
                "this number cannot be stored exactly (beyond a 64-bit integer or an IEEE double); send it as a string"
            }
        }
    }
}

/// One unstorable place, as a JSON pointer (RFC 6901) into the document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub pointer: String,
    pub problem: Unstorable,
}

/// Findings reported at most (a hostile body may have thousands).
pub const MAX_FINDINGS: usize = 20;

/// Parses a JSON document into a [`Value`], refusing repeated member names
/// anywhere (`{"role":"user","role":"admin"}` is an error naming `role`,
/// not a silent `admin`).
pub fn parse_strict(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = StrictSeed.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// [`parse_strict`] for a string slice (batch items).
pub fn parse_strict_str(s: &str) -> Result<Value, serde_json::Error> {
    parse_strict(s.as_bytes())
}

struct StrictSeed;

impl<'de> DeserializeSeed<'de> for StrictSeed {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        StrictSeed.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(v) = seq.next_element_seed(StrictSeed)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        use serde_json::map::Entry;
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(StrictSeed)?;
            match out.entry(key) {
                Entry::Vacant(slot) => {
                    slot.insert(value);
                }
                Entry::Occupied(taken) => {
                    return Err(de::Error::custom(format_args!(
                        "duplicate member name `{}`",
                        taken.key().escape_debug()
                    )));
                }
            }
        }
        Ok(Value::Object(out))
    }
}

/// A strictly parsed value (for `#[derive(Deserialize)]` envelopes).
pub struct StrictValue(pub Value);

impl<'de> Deserialize<'de> for StrictValue {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        StrictSeed.deserialize(d).map(StrictValue)
    }
}

/// Finds every place (up to [`MAX_FINDINGS`]) of a JSON text that storage
/// could not keep as sent. Reads the raw text, because a parsed number has
/// already lost its digits. A text that is not well-formed JSON yields what
/// was found before the fault (the parser then reports the syntax error).
pub fn unstorable(text: &[u8]) -> Vec<Finding> {
    let mut scanner = Scanner {
        text,
        pos: 0,
        path: Vec::new(),
        findings: Vec::new(),
    };
    scanner.value();
    scanner.findings
}

enum Segment {
    /// The raw (still escaped) bytes of a member name, without quotes.
    Key(std::ops::Range<usize>),
    Index(usize),
}

struct Scanner<'a> {
    text: &'a [u8],
    pos: usize,
    path: Vec<Segment>,
    findings: Vec<Finding>,
}

/// Deeper than this the scan stops (the parser refuses such a document:
/// serde_json's own limit is 128), so a hostile body cannot exhaust the
/// stack.
const MAX_DEPTH: usize = 128;

impl Scanner<'_> {
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.text.get(self.pos) {
            self.pos += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).copied()
    }

    fn report(&mut self, problem: Unstorable, member: Option<std::ops::Range<usize>>) {
        if self.findings.len() >= MAX_FINDINGS {
            return;
        }
        let mut pointer = String::new();
        for segment in &self.path {
            pointer.push('/');
            match segment {
                Segment::Key(range) => {
                    pointer.push_str(&pointer_token(&unescape_lossy(&self.text[range.clone()])))
                }
                Segment::Index(i) => pointer.push_str(&i.to_string()),
            }
        }
        if let Some(range) = member {
            pointer.push('/');
            pointer.push_str(&pointer_token(&unescape_lossy(&self.text[range])));
        }
        self.findings.push(Finding { pointer, problem });
    }

    /// Returns false when the text is not well-formed here (or too deep).
    fn value(&mut self) -> bool {
        if self.path.len() > MAX_DEPTH {
            return false;
        }
        self.skip_ws();
        match self.peek() {
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => match self.string() {
                Some((_, problems)) => {
                    for p in problems.into_iter().flatten() {
                        self.report(p, None);
                    }
                    true
                }
                None => false,
            },
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            _ => false,
        }
    }

    fn literal(&mut self, word: &[u8]) -> bool {
        if self.text[self.pos..].starts_with(word) {
            self.pos += word.len();
            true
        } else {
            false
        }
    }

    fn object(&mut self) -> bool {
        self.pos += 1;
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return true;
        }
        loop {
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return false;
            }
            let Some((range, problems)) = self.string() else {
                return false;
            };
            for p in problems.into_iter().flatten() {
                // A bad member name: the pointer names the member itself.
                self.report(p, Some(range.clone()));
            }
            self.skip_ws();
            if self.peek() != Some(b':') {
                return false;
            }
            self.pos += 1;
            self.path.push(Segment::Key(range));
            let ok = self.value();
            self.path.pop();
            if !ok {
                return false;
            }
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return true;
                }
                _ => return false,
            }
        }
    }

    fn array(&mut self) -> bool {
        self.pos += 1;
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return true;
        }
        let mut index = 0;
        loop {
            self.path.push(Segment::Index(index));
            let ok = self.value();
            self.path.pop();
            if !ok {
                return false;
            }
            self.skip_ws();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    index += 1;
                }
                Some(b']') => {
                    self.pos += 1;
                    return true;
                }
                _ => return false,
            }
        }
    }

    /// Skips a string; returns the range of its contents and what is
    /// wrong in it (at most one of each kind).
    fn string(&mut self) -> Option<(std::ops::Range<usize>, [Option<Unstorable>; 2])> {
        let start = self.pos + 1;
        let mut i = start;
        let mut nul = false;
        let mut lone = false;
        loop {
            let at = i + memchr::memchr2(b'"', b'\\', self.text.get(i..)?)?;
            if self.text[at] == b'"' {
                self.pos = at + 1;
                let problems = [
                    nul.then_some(Unstorable::Nul),
                    lone.then_some(Unstorable::LoneSurrogate),
                ];
                return Some((start..at, problems));
            }
            match self.text.get(at + 1)? {
                b'u' => {
                    let unit = hex4(self.text.get(at + 2..at + 6)?)?;
                    i = at + 6;
                    match unit {
                        0 => nul = true,
                        0xD800..=0xDBFF => {
                            let low = self
                                .text
                                .get(i..i + 6)
                                .filter(|s| s.starts_with(b"\\u"))
                                .and_then(|s| hex4(&s[2..]));
                            if matches!(low, Some(0xDC00..=0xDFFF)) {
                                i += 6;
                            } else {
                                lone = true;
                            }
                        }
                        0xDC00..=0xDFFF => lone = true,
                        _ => {}
                    }
                }
                _ => i = at + 2,
            }
        }
    }

    fn number(&mut self) -> bool {
        let start = self.pos;
        let mut end = start;
        while let Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') = self.text.get(end) {
            end += 1;
        }
        self.pos = end;
        let Ok(text) = std::str::from_utf8(&self.text[start..end]) else {
            return false;
        };
        if !is_number_syntax(text) {
            return false;
        }
        if !number_is_exact(text) {
            self.report(Unstorable::InexactNumber, None);
        }
        true
    }
}

/// JSON's number grammar: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
fn is_number_syntax(text: &str) -> bool {
    let b = text.as_bytes();
    let mut i = usize::from(b.first() == Some(&b'-'));
    let digits = |i: &mut usize| {
        let start = *i;
        while b.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i - start
    };
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => {
            digits(&mut i);
        }
        _ => return false,
    }
    if b.get(i) == Some(&b'.') {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

fn hex4(s: &[u8]) -> Option<u16> {
    let s = std::str::from_utf8(s.get(..4)?).ok()?;
    u16::from_str_radix(s, 16).ok()
}

/// A member name's text, unescaped, with unpaired surrogates replaced.
fn unescape_lossy(raw: &[u8]) -> String {
    let mut quoted = Vec::with_capacity(raw.len() + 2);
    quoted.push(b'"');
    quoted.extend_from_slice(raw);
    quoted.push(b'"');
    serde_json::from_slice::<String>(&quoted)
        .unwrap_or_else(|_| String::from_utf8_lossy(raw).replace("\\u", "u"))
}

/// Whether storage keeps this JSON number's value: integers that fit 64
/// bits are kept as integers; anything else as an IEEE double, so the
/// decimal must be one a double represents exactly enough to print back
/// the same value (`0.1` yes, `123456789012345678901234567890` no).
pub fn number_is_exact(text: &str) -> bool {
    // Any decimal of at most 15 significant digits comes back from a
    // double unchanged (DBL_DIG), within the double's exponent range.
    let mantissa = text.split(['e', 'E']).next().unwrap_or(text);
    let significant = mantissa
        .bytes()
        .skip_while(|b| matches!(b, b'-' | b'0' | b'.'))
        .filter(u8::is_ascii_digit)
        .count();
    let small_exponent = text
        .split_once(['e', 'E'])
        .is_none_or(|(_, e)| e.trim_start_matches(['+', '-']).len() <= 2);
    if significant <= 15 && small_exponent {
        return true;
    }
    let integer = !text.contains(['.', 'e', 'E']);
    if integer {
        let digits = text.trim_start_matches('-');
        if digits.len() <= 15 || text.parse::<i64>().is_ok() || text.parse::<u64>().is_ok() {
            return true;
        }
    }
    let Ok(v) = text.parse::<f64>() else {
        return false;
    };
    if !v.is_finite() {
        return false;
    }
    decimal_parts(text) == decimal_parts(&format!("{v:e}"))
}

/// `(negative, significant digits, exponent of the last digit)`, with zero
/// as `(false, "", 0)`: two texts with equal parts are the same number.
fn decimal_parts(text: &str) -> (bool, String, i64) {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text),
    };
    let (mantissa, exp) = match rest.find(['e', 'E']) {
        Some(i) => (&rest[..i], rest[i + 1..].parse::<i64>().unwrap_or(0)),
        None => (rest, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let mut digits: String = int.chars().chain(frac.chars()).collect();
    let mut exponent = exp - frac.len() as i64;
    while digits.ends_with('0') {
        digits.pop();
        exponent += 1;
    }
    let digits = digits.trim_start_matches('0').to_owned();
    if digits.is_empty() {
        return (false, String::new(), 0);
    }
    (negative, digits, exponent)
}

/// Escapes one reference token of a JSON pointer (RFC 6901).
pub fn pointer_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(text: &str) -> Vec<(String, Unstorable)> {
        unstorable(text.as_bytes())
            .into_iter()
            .map(|f| (f.pointer, f.problem))
            .collect()
    }

    #[test]
    fn duplicates_are_refused_at_any_depth_and_named() {
        let err = parse_strict(br#"{"event":"a","event":"b"}"#).unwrap_err();
        assert!(
            err.to_string().contains("duplicate member name `event`"),
            "{err}"
        );
        let err = parse_strict(br#"{"p":[{"x":{"role":"user","role":"admin"}}]}"#).unwrap_err();
        assert!(err.to_string().contains("`role`"), "{err}");
        let v = parse_strict(br#"{"a":{"b":[1,2.5,"x",null,true]},"c":{}}"#).unwrap();
        assert_eq!(v["a"]["b"][1], 2.5);
        assert!(parse_strict(b"{} x").is_err());
    }

    #[test]
    fn nul_and_lone_surrogates_are_found_with_pointers() {
        assert_eq!(found(r#"{"a":"x","b":[1,"y"]}"#), vec![]);
        assert_eq!(
            found(r#"{"user_id":"u\u0000","p":{"a/b":["ok","x\u0000"]}}"#),
            vec![
                ("/user_id".to_owned(), Unstorable::Nul),
                ("/p/a~1b/1".to_owned(), Unstorable::Nul)
            ]
        );
        // A member name with NUL: the pointer names that member.
        assert_eq!(
            found(r#"{"properties":{"k\u0000":1}}"#),
            vec![("/properties/k\u{0}".to_owned(), Unstorable::Nul)]
        );
        assert_eq!(
            found(r#"{"a":"\ud800x","b":"\udc00","c":"\ud83d\ude00"}"#),
            vec![
                ("/a".to_owned(), Unstorable::LoneSurrogate),
                ("/b".to_owned(), Unstorable::LoneSurrogate)
            ]
        );
        // An escaped backslash followed by `u0000` is text, not NUL.
        assert_eq!(found(r#"{"a":"\\u0000"}"#), vec![]);
        assert_eq!(found(r#"{"a~b":{"c":"\u0000"}}"#)[0].0, "/a~0b/c");
    }

    #[test]
    fn numbers_are_kept_by_value_or_refused() {
        for ok in [
            "0",
            "-0",
            "1",
            "1.0",
            "1e2",
            "0.1",
            "-2.5e-3",
            "123456789012345",
            "18446744073709551615",
            "-9223372036854775808",
            "1e20",
            "100000000000000000000",
            "1.7976931348623157e308",
            "5e-324",
            "3.141592653589793",
        ] {
            assert!(number_is_exact(ok), "{ok}");
        }
        for bad in [
            "123456789012345678901234567890",
            "18446744073709551616",
            "-9223372036854775809",
            "3.14159265358979323846",
            "1e400",
            "1e-400",
            "0.10000000000000000001",
        ] {
            assert!(!number_is_exact(bad), "{bad}");
        }
        assert_eq!(
            found(r#"{"properties":{"big":123456789012345678901234567890,"ok":[1.5]}}"#),
            vec![("/properties/big".to_owned(), Unstorable::InexactNumber)]
        );
    }

    #[test]
    fn malformed_numbers_and_deep_nesting_stop_the_scan_without_findings() {
        for bad in [
            "{\"a\":1e}",
            "{\"a\":-0.}",
            "{\"a\":01}",
            "{\"a\":1.5e+}",
            "[--1]",
        ] {
            assert!(found(bad).is_empty(), "{bad}");
        }
        let deep = format!("{}\"\\u0000\"{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(unstorable(deep.as_bytes()).is_empty());
        assert!(is_number_syntax("-0.5e-7") && is_number_syntax("10") && !is_number_syntax("1."));
    }

    #[test]
    fn findings_are_bounded_and_malformed_text_stops_the_scan() {
        let body = format!("[{}]", vec![r#""\u0000""#; 100].join(","));
        assert_eq!(unstorable(body.as_bytes()).len(), MAX_FINDINGS);
        assert_eq!(found(r#"{"a":"\u0000", oops"#).len(), 1);
        assert!(found(r#"{"a": tru"#).is_empty());
    }
}
