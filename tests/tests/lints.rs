//! Every committed crate passes clippy's default lints with no warning (`-D warnings`, all
//! targets), as a hand-written crate would: the templates, the code the generator writes and
//! the kernels it copies are linted where they end up, in the crate a user commits. (.ci/run
//! lints the workspace itself.)
//!
//! Crates whose manifests ask for the same dependencies, with the same features, are linted
//! together: copies of them become the members of one scratch workspace, which one `cargo
//! clippy` checks on every core. A workspace unifies the features of its members' dependencies,
//! and theirs are the same, so each crate is checked against exactly what it asks for, as it
//! would be alone. A crate with a path dependency (a draft model's crate inside it), or with a
//! manifest no other crate shares, is linted where it is. One crate after another, this test
//! took 156 s of `.ci/run`'s half hour.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use monogen_tests::{clippy, workspace_root};

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

    // The crates by what their manifests ask of cargo beyond their names.
    let mut groups: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for dir in &crates {
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("a readable manifest");
        let key = if manifest.contains("path = ") { dir.display().to_string() } else { requests(&manifest) };
        groups.entry(key).or_default().push(dir.clone());
    }

    let scratch = workspace_root().join("target").join("lint-workspaces");
    let _ = std::fs::remove_dir_all(&scratch);
    let mut failures = Vec::new();
    for (i, members) in groups.values().enumerate() {
        let (manifest, what) = if let [alone] = &members[..] {
            (alone.join("Cargo.toml"), alone.display().to_string())
        } else {
            let names: Vec<String> = members.iter().map(|dir| file_name(dir)).collect();
            (workspace_of(&scratch.join(format!("group-{i}")), members), names.join(", "))
        };
        // Into the target directory that the other tests' generated crates share, so that
        // the dependencies are checked once.
        let out = clippy(&manifest);
        if !out.status.success() {
            failures.push(format!(
                "{what} ({}):\n{}",
                manifest.display(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "clippy found warnings (in copies of the crates under {}, where several share a workspace):\n\n{}",
        scratch.display(),
        failures.join("\n")
    );
}

/// The manifest without its `[package]` and `[[bin]]` tables (which name the crate) and its
/// comments: the dependencies, features and profiles it asks for.
fn requests(manifest: &str) -> String {
    tables_without(manifest, &["[package]", "[[bin]]"])
}

/// The lines of `manifest` outside the tables whose headers start with one of `headers`, and
/// that are not comments.
fn tables_without(manifest: &str, headers: &[&str]) -> String {
    let mut kept = String::new();
    let mut skipping = false;
    for line in manifest.lines() {
        if line.starts_with('[') {
            skipping = headers.iter().any(|h| line.starts_with(h));
        }
        if !skipping && !line.trim_start().starts_with('#') {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

/// Writes a workspace at `root` whose members are copies of `members` (their files, with their
/// manifests' own `[workspace]` and profiles left out, which only a workspace's root may hold),
/// and returns its manifest.
fn workspace_of(root: &Path, members: &[PathBuf]) -> PathBuf {
    let mut names = Vec::new();
    for dir in members {
        let name = file_name(dir);
        let copy = root.join(&name);
        copy_tree(dir, &copy);
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        std::fs::write(copy.join("Cargo.toml"), tables_without(&manifest, &["[workspace]", "[profile"]))
            .unwrap();
        names.push(format!("{name:?}"));
    }
    let manifest = root.join("Cargo.toml");
    let text = format!("[workspace]\nresolver = \"3\"\nmembers = [{}]\n", names.join(", "));
    std::fs::write(&manifest, text).unwrap();
    manifest
}

fn file_name(dir: &Path) -> String {
    dir.file_name().expect("a crate folder").to_string_lossy().into_owned()
}

/// Copies the files under `from` to `to`, leaving out a `target` folder a build left there.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() {
            if entry.file_name() != "target" {
                copy_tree(&path, &to.join(entry.file_name()));
            }
        } else {
            std::fs::copy(&path, to.join(entry.file_name())).unwrap();
        }
    }
}
