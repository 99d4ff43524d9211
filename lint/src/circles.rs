//! The import-circle lint: no file of a crate names an item of a file that
//! names an item of it, directly or around a longer loop, and no module
//! (a directory of files) does either with its sibling modules. A circle
//! means neither side can be read, changed or replaced on its own.
//!
//! A file depends on another when it names an item defined there through a
//! `crate::`/`super::`/`self::` path (in a `use` or in an expression). A name
//! re-exported by a parent module (`pub use records::*` in `mod.rs`) is
//! followed to the file that defines it. Tests (`#[cfg(test)] mod tests`)
//! and comments are not read.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::{Path, PathBuf},
    sync::LazyLock,
};

use regex::Regex;

/// A module path inside one crate (`["store", "outbox"]`); the crate root
/// is empty.
type ModPath = Vec<String>;

/// Files (or modules) that reach each other, in one crate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Circle {
    pub krate: String,
    /// `store/outbox` for a file; a module for a circle between modules.
    pub members: Vec<String>,
}

impl std::fmt::Display for Circle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: import circle between {}",
            self.krate,
            self.members.join(", ")
        )
    }
}

static DEF: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?m)^\s*pub(?:\([^)]*\))?\s+(?:async\s+)?(?:unsafe\s+)?(?:fn|struct|enum|trait|type|const|static|mod)\s+([A-Za-z_][A-Za-z0-9_]*)",
    )
    .expect("static regex")
});
static TESTS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?s)#\[cfg\(test\)\]\s*mod tests \{.*").expect("static regex"));
static COMMENT: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"//[^\n]*").expect("static regex"));
static USE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\buse\s+([^;]+);").expect("static regex"));
static PATH: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b((?:crate|super)(?:::[A-Za-z_][A-Za-z0-9_]*)+)").expect("static regex")
});

/// The circles of every crate under `root` (each directory with a
/// `Cargo.toml` and a `src/`).
pub fn circles_in_tree(root: &Path) -> std::io::Result<Vec<Circle>> {
    let mut out = Vec::new();
    let mut crates = vec![root.to_path_buf()];
    for entry in std::fs::read_dir(root)? {
        let path = entry?.path();
        if path.join("Cargo.toml").is_file() {
            crates.push(path);
        }
    }
    crates.sort();
    for dir in crates {
        let src = dir.join("src");
        if !src.is_dir() {
            continue;
        }
        let name = dir
            .file_name()
            .map_or_else(|| "root".to_owned(), |n| n.to_string_lossy().into_owned());
        let mut files = Vec::new();
        collect(&src, &mut files)?;
        let mut sources = BTreeMap::new();
        for f in files {
            sources.insert(mod_path(&src, &f), std::fs::read_to_string(&f)?);
        }
        out.extend(circles_of(&name, &sources));
    }
    Ok(out)
}

/// The circles of one crate, from its files' module paths and their text.
pub fn circles_of(krate: &str, sources: &BTreeMap<ModPath, String>) -> Vec<Circle> {
    let texts: BTreeMap<&ModPath, String> = sources
        .iter()
        .map(|(m, text)| {
            (
                m,
                COMMENT
                    .replace_all(&TESTS.replace(text, ""), "")
                    .into_owned(),
            )
        })
        .collect();
    let mut defs: HashMap<String, BTreeSet<ModPath>> = HashMap::new();
    for (m, text) in &texts {
        for c in DEF.captures_iter(text) {
            defs.entry(c[1].to_owned())
                .or_default()
                .insert((*m).clone());
        }
    }
    let mut edges: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (m, text) in &texts {
        let mut paths: Vec<Vec<String>> = Vec::new();
        for u in USE.captures_iter(text) {
            paths.extend(flatten(&u[1]));
        }
        for p in PATH.captures_iter(text) {
            paths.push(p[1].split("::").map(str::to_owned).collect());
        }
        let from = edges.entry((*m).clone()).or_default();
        for p in paths {
            let Some(target) = resolve(m, &p, sources, &defs) else {
                continue;
            };
            // A file's own module, its ancestors (`super::X` re-exported
            // by a parent) and the crate root are not dependencies.
            if target.is_empty() || m.starts_with(&target) {
                continue;
            }
            from.insert(target);
        }
    }
    let files = components(&edges);
    let mut out: Vec<Circle> = files
        .iter()
        .map(|c| Circle {
            krate: krate.to_owned(),
            members: c.iter().map(|m| m.join("/")).collect(),
        })
        .collect();
    // The same between modules: an edge between two files is one between
    // the children of their closest common module that hold them.
    let mut lifted: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (a, bs) in &edges {
        for b in bs {
            let k = a.iter().zip(b).take_while(|(x, y)| x == y).count();
            if k >= a.len() || k >= b.len() {
                continue;
            }
            let (x, y) = (a[..=k].to_vec(), b[..=k].to_vec());
            lifted.entry(y.clone()).or_default();
            lifted.entry(x).or_default().insert(y);
        }
    }
    // Two sibling files are also two modules: their circle is told once.
    for c in components(&lifted)
        .into_iter()
        .filter(|c| !files.contains(c))
    {
        out.push(Circle {
            krate: krate.to_owned(),
            members: c
                .iter()
                .map(|m| format!("{}/ (module)", m.join("/")))
                .collect(),
        });
    }
    out
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

fn is_dir_mod(file: &Path) -> bool {
    matches!(
        file.file_name().and_then(|n| n.to_str()),
        Some("mod.rs" | "lib.rs" | "main.rs")
    )
}

fn mod_path(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: ModPath = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if is_dir_mod(file) {
        parts.pop();
    }
    parts
}

/// The paths a `use` tree names (`a::{b, c::{d}}` → `a::b`, `a::c::d`).
fn flatten(tree: &str) -> Vec<Vec<String>> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let mut out = Vec::new();
    walk(&[], &tree, &mut out);
    out
}

fn walk(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
    for part in split_top(tree) {
        let part = part.split(" as ").next().unwrap_or(part);
        if let Some((head, inner)) = part.split_once('{') {
            let mut p = prefix.to_vec();
            p.extend(
                head.split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            );
            walk(&p, inner.strip_suffix('}').unwrap_or(inner), out);
        } else if !part.is_empty() {
            let mut p = prefix.to_vec();
            p.extend(
                part.split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            );
            out.push(p);
        }
    }
}

fn split_top(s: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// The file a path names, from file `cur`.
fn resolve(
    cur: &ModPath,
    path: &[String],
    sources: &BTreeMap<ModPath, String>,
    defs: &HashMap<String, BTreeSet<ModPath>>,
) -> Option<ModPath> {
    // `self` is the file's own module, `super` its parent (a directory's
    // module is its own path: `mod.rs` of `store` is `store`).
    let (mut m, mut rest): (ModPath, &[String]) = match path.first()?.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (cur.clone(), &path[1..]),
        "super" => {
            let mut m = cur.clone();
            m.pop();
            let mut rest = &path[1..];
            while rest.first().is_some_and(|s| s == "super") {
                m.pop();
                rest = &rest[1..];
            }
            (m, rest)
        }
        _ => return None,
    };
    while let Some(next) = rest.first() {
        let mut deeper = m.clone();
        deeper.push(next.clone());
        if !sources.contains_key(&deeper) {
            break;
        }
        m = deeper;
        rest = &rest[1..];
    }
    let Some(name) = rest.first() else {
        return Some(m);
    };
    // An item re-exported by `m`: the file under `m` that defines it.
    let under: Vec<&ModPath> = defs
        .get(name)
        .map(|d| d.iter().filter(|d| d.starts_with(&m)).collect())
        .unwrap_or_default();
    if under.iter().any(|d| **d == m) {
        return Some(m);
    }
    under
        .into_iter()
        .min_by_key(|d| d.len())
        .cloned()
        .or(Some(m))
}

/// Strongly connected components of more than one node (Tarjan).
fn components(edges: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    struct State<'a> {
        edges: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: HashMap<&'a ModPath, usize>,
        low: HashMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on: BTreeSet<&'a ModPath>,
        next: usize,
        out: Vec<Vec<ModPath>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a ModPath) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on.insert(v);
        let edges = s.edges;
        for w in edges.get(v).into_iter().flatten() {
            let Some((w, _)) = edges.get_key_value(w) else {
                continue;
            };
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        edges,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn krate(files: &[(&str, &str)]) -> BTreeMap<ModPath, String> {
        files
            .iter()
            .map(|(p, text)| {
                let path = if p.is_empty() {
                    Vec::new()
                } else {
                    p.split('/').map(str::to_owned).collect()
                };
                (path, (*text).to_owned())
            })
            .collect()
    }

    #[test]
    fn a_circle_through_a_reexport_is_found() {
        let files = krate(&[
            ("", "pub mod store;"),
            (
                "store",
                "mod outbox; mod deliveries; pub use outbox::Row; pub use deliveries::fan_out;",
            ),
            ("store/outbox", "use super::fan_out;\npub struct Row;"),
            ("store/deliveries", "use super::Row;\npub fn fan_out() {}"),
        ]);
        let found = circles_of("core", &files);
        assert_eq!(
            found,
            vec![Circle {
                krate: "core".into(),
                members: vec!["store/deliveries".into(), "store/outbox".into()],
            }]
        );
    }

    #[test]
    fn one_way_and_tests_and_comments_are_not_circles() {
        let files = krate(&[
            ("", "pub mod a; pub mod b;"),
            ("a", "use crate::b::B;\npub struct A;"),
            (
                "b",
                "// crate::a::A is mentioned here only\npub struct B;\n#[cfg(test)]\nmod tests { use crate::a::A; }",
            ),
        ]);
        assert!(circles_of("x", &files).is_empty());
    }

    #[test]
    fn modules_that_reach_each_other_are_found() {
        let files = krate(&[
            ("", "pub mod relay; pub mod sinks;"),
            ("relay", "use crate::sinks::sink::Sink;\npub struct Relay;"),
            ("sinks", "pub mod sink; use crate::relay::Relay;"),
            ("sinks/sink", "pub trait Sink {}"),
        ]);
        let found = circles_of("actors", &files);
        assert_eq!(found.len(), 1);
        assert_eq!(
            found[0].members,
            vec!["relay/ (module)".to_owned(), "sinks/ (module)".to_owned()]
        );
    }
}
