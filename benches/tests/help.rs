//! The load tool's `--help` describes every flag (it is a package of its
//! own, beside the server).

#[test]
fn the_load_tool_describes_every_flag() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fastack-bench"))
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("--server <PATH>"), "{text}");
    let options = text.split("Options:").nth(1).unwrap_or_default();
    let lines: Vec<&str> = options.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let Some(flag) = line.trim_start().strip_prefix("--") else {
            continue;
        };
        let flag = flag.split_whitespace().next().unwrap_or_default();
        if flag == "help" {
            continue;
        }
        // Clap puts the help on the flag's line or on the next one.
        let described = line.trim().len() > flag.len() + 12
            || lines
                .get(i + 1)
                .is_some_and(|next| !next.trim().is_empty() && !next.trim().starts_with('-'));
        assert!(described, "--{flag} has no help:\n{text}");
    }
}
