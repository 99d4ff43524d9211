//! The lint as CI runs it: the binary fails on a file with a bad query and
//! passes on the code base.

use std::process::Command;

fn lint(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fastack-lint"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("run fastack-lint")
}

#[test]
fn a_file_with_a_bad_query_fails_the_lint() {
    let out = lint(&["lint/tests/fixtures/bad_query.rs"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad_query.rs:3"), "{stderr}");
    assert!(stderr.contains("without a time predicate"), "{stderr}");
}

#[test]
fn the_code_base_passes_the_lint() {
    let out = lint(&["."]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
