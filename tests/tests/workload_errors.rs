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
        let text = std::fs::read_to_string(dir.join("workload.toml")).unwrap();
        let rendered = match WorkloadSource::from_text("workload.toml", &text).parse() {
            Ok(_) => "(accepted)\n".to_string(),
            Err(diagnostics) => diagnostics.iter().map(|d| d.render()).collect::<Vec<_>>().join("\n") + "\n",
        };
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
