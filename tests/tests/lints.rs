//! Every committed crate passes clippy's default lints with no warning (`-D warnings`, all
//! targets), as a hand-written crate would: the templates, the code the generator writes and
//! the kernels it copies are linted where they end up, in the crate a user commits. (.ci/run
//! lints the workspace itself.)

use std::process::Command;

use monogen_tests::{generated_target_dir, workspace_root};

#[test]
fn committed_crates_pass_clippy() {
    let version = Command::new(env!("CARGO")).args(["clippy", "--version"]).output();
    assert!(
        version.is_ok_and(|out| out.status.success()),
        "clippy is not installed: `rustup component add clippy`"
    );
    let generated = workspace_root().join("generated");
    let mut crates: Vec<_> = std::fs::read_dir(&generated)
        .expect("generated/ is readable")
        .flatten()
        .map(|entry| entry.path())
        .filter(|dir| dir.join("Cargo.toml").is_file())
        .collect();
    crates.sort();
    assert!(crates.len() >= 10, "expected the committed crates in {}", generated.display());

    let mut failures = Vec::new();
    for dir in &crates {
        // Into the target directory that the other tests' generated crates share, so that
        // the dependencies are checked once.
        let out = Command::new(env!("CARGO"))
            .args(["clippy", "--quiet", "--all-targets", "--manifest-path"])
            .arg(dir.join("Cargo.toml"))
            .args(["--", "-D", "warnings"])
            .env("CARGO_TARGET_DIR", generated_target_dir())
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .output()
            .expect("cargo runs");
        if !out.status.success() {
            failures.push(format!("{}:\n{}", dir.display(), String::from_utf8_lossy(&out.stderr)));
        }
    }
    assert!(failures.is_empty(), "clippy found warnings:\n\n{}", failures.join("\n"));
}
