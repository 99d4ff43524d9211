//! `fastack-lint [ROOT…]`: fails (exit 1) when a query of `tracked_events`
//! lacks a time predicate on `occurred_at`, or when files or modules of a
//! crate import from each other in a circle (`fastack_lint::circles`). Run
//! by `.ci/run`.

use std::{path::PathBuf, process::ExitCode};

fn main() -> ExitCode {
    let roots: Vec<PathBuf> = match std::env::args_os()
        .skip(1)
        .map(PathBuf::from)
        .collect::<Vec<_>>()
    {
        r if r.is_empty() => vec![PathBuf::from(".")],
        r => r,
    };
    let mut violations = Vec::new();
    for root in &roots {
        let found = if root.is_dir() {
            fastack_lint::lint_tree(root)
        } else {
            std::fs::read_to_string(root).map(|text| fastack_lint::lint_source(root, &text))
        };
        match found {
            Ok(v) => violations.extend(v),
            Err(e) => {
                eprintln!("fastack-lint: cannot read {}: {e}", root.display());
                return ExitCode::from(2);
            }
        }
    }
    for v in &violations {
        eprintln!("{v}");
    }
    let mut circles = Vec::new();
    for root in roots.iter().filter(|r| r.join("Cargo.toml").is_file()) {
        match fastack_lint::circles::circles_in_tree(root) {
            Ok(c) => circles.extend(c),
            Err(e) => {
                eprintln!("fastack-lint: cannot read {}: {e}", root.display());
                return ExitCode::from(2);
            }
        }
    }
    for c in &circles {
        eprintln!("{c}");
    }
    if violations.is_empty() {
        println!("partition-key lint: ok");
    } else {
        eprintln!("partition-key lint: {} violation(s)", violations.len());
    }
    if circles.is_empty() {
        println!("import circles: none");
    } else {
        eprintln!("import circles: {}", circles.len());
    }
    if violations.is_empty() && circles.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
