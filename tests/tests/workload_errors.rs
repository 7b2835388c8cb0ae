//! Snapshot tests of workload diagnostics: every folder of tests/cases/ holds a
//! `workload.toml` and the `expected.err` that monogen prints for it.
//! `MONOGEN_BLESS=1 cargo test -p monogen-tests --test workload_errors` rewrites the snapshots.

use monogen::workload::WorkloadSource;
use monogen_tests::workspace_root;

#[test]
fn workload_diagnostics_match_their_snapshots() {
    let cases = workspace_root().join("tests/cases");
    let bless = std::env::var("MONOGEN_BLESS").is_ok_and(|v| v == "1");
    let mut dirs: Vec<_> =
        std::fs::read_dir(&cases).unwrap().flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    dirs.sort();
    assert!(dirs.len() >= 15, "expected the workload error cases under {}", cases.display());
    let mut failures = Vec::new();
    for dir in dirs {
        // Read from disk as `monogen` reads it, so that unreadable, binary and huge files
        // take the same path; messages name the file relative to its case folder.
        let parsed =
            WorkloadSource::read(&dir.join("workload.toml")).map_err(|d| vec![d]).and_then(|s| s.parse());
        let rendered = match parsed {
            Ok(_) => "(accepted)\n".to_string(),
            Err(diagnostics) => diagnostics.iter().map(|d| d.render()).collect::<Vec<_>>().join("\n") + "\n",
        };
        let rendered = rendered.replace(&format!("{}/", dir.display()), "");
        let expected_path = dir.join("expected.err");
        if bless {
            std::fs::write(&expected_path, &rendered).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if rendered != expected {
            failures.push(format!("{}:\n--- expected\n{expected}--- got\n{rendered}", dir.display()));
        }
        assert!(!rendered.contains("(accepted)"), "{}: a bad workload was accepted", dir.display());
    }
    assert!(failures.is_empty(), "{}\n(rerun with MONOGEN_BLESS=1 to accept)", failures.join("\n"));
}

#[test]
fn a_huge_file_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.toml");
    let line = "# padding\n".repeat(200_000);
    std::fs::write(&path, line).unwrap();
    let e = WorkloadSource::read(&path).err().unwrap().render();
    assert!(
        e.contains("workload file is 2000000 bytes; a workload is a small TOML file (at most 1048576 bytes)"),
        "{e}"
    );
    let e = WorkloadSource::read(dir.path()).err().unwrap().render();
    assert!(e.contains("expected a workload file, found a directory"), "{e}");
    let e = WorkloadSource::read(&dir.path().join("missing.toml")).err().unwrap().render();
    assert!(e.contains("cannot read workload file"), "{e}");
}
