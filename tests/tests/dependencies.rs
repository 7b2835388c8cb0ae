//! A generated crate depends only on what its resolved choices need: every dependency its
//! Cargo.toml declares is used by its sources (a crate that does not serve declares no HTTP
//! stack, one whose matmul is not `gemm-crate` no `gemm`), and the crates that serve declare the
//! server's.

use std::collections::BTreeSet;
use std::path::Path;

use monogen_tests::workspace_root;

/// The names of the `[dependencies]` table of a Cargo.toml (as the generator writes it: one
/// `name = ...` line each).
fn dependencies(manifest: &str) -> BTreeSet<String> {
    manifest
        .lines()
        .skip_while(|line| line.trim() != "[dependencies]")
        .skip(1)
        .take_while(|line| !line.starts_with('['))
        .filter_map(|line| line.split_once('=').map(|(name, _)| name.trim().to_string()))
        .filter(|name| !name.is_empty() && !name.starts_with('#'))
        .collect()
}

/// Every Rust source under `dir`, concatenated.
fn sources(dir: &Path) -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            text.push_str(&sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            text.push_str(&std::fs::read_to_string(&path).unwrap());
            text.push('\n');
        }
    }
    text
}

/// Whether `source` uses the crate `name` (as Rust spells it: `-` becomes `_`).
fn uses(source: &str, name: &str) -> bool {
    let ident = name.replace('-', "_");
    source
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .any(|word| word.strip_prefix("::").unwrap_or(word).starts_with(&format!("{ident}::")))
}

#[test]
fn every_dependency_of_a_committed_crate_is_used() {
    let generated = workspace_root().join("generated");
    let mut crates: Vec<_> = std::fs::read_dir(&generated)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|dir| dir.join("Cargo.toml").is_file())
        .collect();
    crates.sort();
    assert!(crates.len() >= 10, "expected the committed crates in {}", generated.display());
    let mut problems = Vec::new();
    let mut servers = 0;
    for dir in &crates {
        let declared = dependencies(&std::fs::read_to_string(dir.join("Cargo.toml")).unwrap());
        let source = sources(&dir.join("src"));
        for name in &declared {
            if !uses(&source, name) {
                problems.push(format!("{}: depends on `{name}`, which no source uses", dir.display()));
            }
        }
        let serves = source.contains("pub mod serve;");
        servers += usize::from(serves);
        for server in ["axum", "tokio"] {
            if serves != declared.contains(server) {
                problems.push(format!(
                    "{}: serves: {serves}, depends on `{server}`: {}",
                    dir.display(),
                    !serves
                ));
            }
        }
    }
    assert!(servers >= 2, "expected committed crates that serve");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn an_unused_dependency_is_caught() {
    let manifest =
        "[package]\nname = \"x\"\n\n[dependencies]\nserde = \"1\"\ngemm = \"0.18\"\nfutures-util = \"0.3\"\n";
    let declared = dependencies(manifest);
    let source = "use serde::Deserialize;\nfn f() { futures_util::stream::empty::<u8>(); }\n";
    let unused: Vec<&String> = declared.iter().filter(|d| !uses(source, d)).collect();
    assert_eq!(unused, ["gemm"]);
}
