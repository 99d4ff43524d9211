//! The partition-key lint. `tracked_events` is partitioned by
//! `occurred_at`; a query of it without a time predicate scans every
//! partition. The storage layer makes such a query hard to write (reads go
//! through a query type that cannot be built without a time range); this
//! lint catches raw SQL that slips past it.
//!
//! Rule: every string literal (Rust `"…"` / `r#"…"#`, or a whole `.sql`
//! file) that reads, updates or deletes from the parent table
//! `tracked_events` must constrain `occurred_at` with a comparison
//! (`=`, `<`, `<=`, `>`, `>=`, `BETWEEN`, `= ANY`). Named partitions
//! (`tracked_events_y2026m11_r13`, `tracked_events_default`) are a time range
//! by themselves and are exempt, as are DDL and `INSERT INTO`.
//!
//! A deliberate exception carries `partition-key-lint: allow` on its line or
//! the line above, with a reason.

pub mod circles;

use std::{
    path::{Path, PathBuf},
    sync::LazyLock,
};

use regex::Regex;

/// A query without the partition key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub file: PathBuf,
    pub line: usize,
    pub sql: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: query of tracked_events without a time predicate on occurred_at: {}",
            self.file.display(),
            self.line,
            self.sql
        )
    }
}

static STRING: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r##"(?s)r#+"(.*?)"#+|r"([^"]*)"|"((?:[^"\\]|\\.)*)""##).expect("static regex")
});
static QUERIES_PARENT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b(from|join|update|delete\s+from)\s+tracked_events\b(?:[^_]|$)")
        .expect("static regex")
});
static TIME_PREDICATE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\boccurred_at\s*(<=|>=|<|>|=|between\b)|\)\s*(<=|>=|<|>)\s*\(")
        .expect("static regex")
});
static ROW_COMPARE_WITH_TIME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\([^()]*\boccurred_at\b[^()]*\)\s*(<=|>=|<|>)").expect("static regex")
});

const ALLOW: &str = "partition-key-lint: allow";

fn violates(sql: &str) -> bool {
    let one_line = sql.replace("\\\n", " ");
    if !QUERIES_PARENT.is_match(&one_line) {
        return false;
    }
    let timed = TIME_PREDICATE
        .find_iter(&one_line)
        .any(|m| m.as_str().to_ascii_lowercase().contains("occurred_at"))
        || ROW_COMPARE_WITH_TIME.is_match(&one_line);
    !timed
}

/// Lints one source text. `.sql` files are one statement list; anything
/// else is scanned for string literals.
pub fn lint_source(file: &Path, text: &str) -> Vec<Violation> {
    let lines: Vec<&str> = text.lines().collect();
    let allowed = |line: usize| {
        let at = |n: usize| lines.get(n).is_some_and(|l| l.contains(ALLOW));
        at(line.saturating_sub(1)) || (line >= 2 && at(line - 2))
    };
    let mut out = Vec::new();
    if file.extension().is_some_and(|e| e == "sql") {
        let mut offset = 0;
        for stmt in text.split(';') {
            let line =
                text[..offset].matches('\n').count() + 1 + stmt.len() - stmt.trim_start().len();
            if violates(stmt) && !allowed(line) {
                out.push(Violation {
                    file: file.to_owned(),
                    line: text[..offset + (stmt.len() - stmt.trim_start().len())]
                        .matches('\n')
                        .count()
                        + 1,
                    sql: stmt.split_whitespace().collect::<Vec<_>>().join(" "),
                });
            }
            offset += stmt.len() + 1;
        }
        return out;
    }
    for m in STRING.captures_iter(text) {
        let whole = m.get(0).expect("match");
        let body = m
            .get(1)
            .or(m.get(2))
            .or(m.get(3))
            .map_or("", |g| g.as_str());
        if violates(body) {
            let line = text[..whole.start()].matches('\n').count() + 1;
            if !allowed(line) {
                out.push(Violation {
                    file: file.to_owned(),
                    line,
                    sql: body.split_whitespace().collect::<Vec<_>>().join(" "),
                });
            }
        }
    }
    out
}

/// Lints every `.rs` and `.sql` file under `root`, skipping `target/`,
/// hidden directories, and the lint's own crate and fixtures (their bad
/// queries are on purpose).
pub fn lint_tree(root: &Path) -> std::io::Result<Vec<Violation>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.file_type()?.is_dir() {
                let own_crate = name == "lint"
                    && path.join("src/lib.rs").is_file()
                    && std::fs::read_to_string(path.join("Cargo.toml"))
                        .is_ok_and(|t| t.contains("name = \"fastack-lint\""));
                if name == "target"
                    || name.starts_with('.')
                    || name == "fixtures"
                    || name == "fastack-data"
                    || own_crate
                {
                    continue;
                }
                stack.push(path);
            } else if name.ends_with(".rs") || name.ends_with(".sql") {
                let text = std::fs::read_to_string(&path)?;
                out.extend(lint_source(&path, &text));
            }
        }
    }
    out.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lint(src: &str) -> Vec<Violation> {
        lint_source(Path::new("x.rs"), src)
    }

    #[test]
    fn queries_with_a_time_predicate_pass() {
        assert!(lint(r#"q("SELECT * FROM tracked_events WHERE tenant_id = $1 AND occurred_at >= $2 AND occurred_at < $3")"#).is_empty());
        assert!(
            lint(r#"q("SELECT count(*) FROM tracked_events WHERE occurred_at BETWEEN $1 AND $2")"#)
                .is_empty()
        );
        assert!(lint(r#"q("DELETE FROM tracked_events WHERE (occurred_at, id) > ($1, $2) AND occurred_at < $3")"#).is_empty());
    }

    #[test]
    fn a_query_by_contact_only_fails() {
        let v = lint("let sql = \"SELECT * FROM tracked_events WHERE contact_id = $1\";\n");
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].line, 1);
        let v = lint("q(r#\"UPDATE tracked_events\n SET event = 'x' WHERE id = $1\"#)");
        assert_eq!(v.len(), 1);
    }

    #[test]
    fn a_time_predicate_on_another_column_is_not_enough() {
        assert_eq!(
            lint(r#"q("SELECT * FROM tracked_events WHERE received_at >= $1")"#).len(),
            1
        );
    }

    #[test]
    fn partitions_ddl_and_inserts_are_exempt() {
        assert!(lint(r#"q("SELECT count(*) FROM tracked_events_y2026m11_r13")"#).is_empty());
        assert!(lint(r#"q("SELECT count(*) FROM tracked_events_default")"#).is_empty());
        assert!(lint(r#"q("INSERT INTO tracked_events (id) VALUES ($1)")"#).is_empty());
        assert!(lint(r#"q("CREATE TABLE x PARTITION OF tracked_events DEFAULT")"#).is_empty());
    }

    #[test]
    fn explicit_allow_is_honoured() {
        let src = "// partition-key-lint: allow (admin count over all time)\nq(\"SELECT count(*) FROM tracked_events\")";
        assert!(lint(src).is_empty());
    }

    #[test]
    fn sql_files_are_linted_per_statement() {
        let v = lint_source(
            Path::new("q.sql"),
            "SELECT 1;\nSELECT * FROM tracked_events WHERE occurred_at > now() - interval '1 day';\nSELECT * FROM tracked_events;\n",
        );
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].line, 3);
    }
}
