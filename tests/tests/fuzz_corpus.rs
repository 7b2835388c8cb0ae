//! What fuzzing found stays found: every input of the committed corpus (`fuzz/corpus/<target>/`)
//! and every regression input (`fuzz/regressions/<target>/`, where `fuzz/run.sh` copies each
//! crash it finds) runs here through the code its fuzz target calls, as an ordinary test, and
//! must return (a value or an error) without a panic. The workload corpus must use every key
//! that docs/workload.md documents, so that the fuzzer starts from each table and key.

use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use monogen::workload::WorkloadSource;
use monogen_tests::workspace_root;

/// The files of `fuzz/corpus/<target>` and `fuzz/regressions/<target>` (which may not exist).
fn inputs(target: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for folder in ["corpus", "regressions"] {
        let dir = workspace_root().join("fuzz").join(folder).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            assert!(folder == "regressions", "{} is missing", dir.display());
            continue;
        };
        files.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_file()));
    }
    files.sort();
    files
}

/// Runs `body` on every input of `target`; fails naming each input that panicked.
fn replay(target: &str, body: impl Fn(&Path, &[u8])) {
    let files = inputs(target);
    assert!(!files.is_empty(), "no inputs for fuzz target {target}");
    let panicked: Vec<String> = files
        .iter()
        .filter(|path| {
            let data = std::fs::read(path).unwrap();
            catch_unwind(AssertUnwindSafe(|| body(path, &data))).is_err()
        })
        .map(|path| path.display().to_string())
        .collect();
    assert!(panicked.is_empty(), "fuzz target {target} panics on: {panicked:#?}");
    eprintln!("{target}: {} inputs replayed", files.len());
}

/// The body of fuzz/fuzz_targets/workload.rs.
fn parse_workload(_: &Path, data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Err(diagnostics) = WorkloadSource::from_text("fuzz.toml", text).parse() {
        for d in diagnostics {
            let _ = d.render();
            let _ = d.render_styled();
        }
    }
}

/// The body of fuzz/fuzz_targets/safetensors.rs.
fn load_weights(path: &Path, data: &[u8]) {
    let temp = tempfile::tempdir().unwrap();
    let file = temp.path().join(path.file_name().unwrap());
    std::fs::write(&file, data).unwrap();
    let _ = stories260k_cpu_f32::weights::Weights::load(&file);
}

#[test]
fn every_workload_input_parses_or_is_rejected_without_a_panic() {
    replay("workload", parse_workload);
}

#[test]
fn every_safetensors_input_loads_or_is_rejected_without_a_panic() {
    replay("safetensors", load_weights);
}

/// A panicking body is caught and named: the replay can fail.
#[test]
#[should_panic(expected = "fuzz target workload panics on")]
fn a_panicking_input_fails_the_replay() {
    replay("workload", |path, _| assert!(!path.to_string_lossy().contains("syntax-error")));
}

/// The keys in the first column of docs/workload.md's tables.
fn documented_keys() -> BTreeSet<String> {
    let text = std::fs::read_to_string(workspace_root().join("docs/workload.md")).unwrap();
    let mut keys = BTreeSet::new();
    for line in text.lines().filter(|l| l.starts_with("| `")) {
        let first = line.split('|').nth(1).unwrap_or_default();
        keys.extend(first.split('`').skip(1).step_by(2).map(str::to_string));
    }
    keys
}

#[test]
fn the_workload_corpus_uses_every_documented_key() {
    let keys = documented_keys();
    assert!(keys.len() >= 40 && keys.contains("batch_wait_ms") && keys.contains("qkv_bias"), "{keys:?}");
    let corpus: Vec<String> = inputs("workload")
        .iter()
        .map(|p| String::from_utf8_lossy(&std::fs::read(p).unwrap()).into_owned())
        .collect();
    let uses = |key: &str| {
        corpus.iter().any(|text| {
            text.lines().any(|line| {
                let line = line.trim_start().trim_start_matches('{');
                line.starts_with(&format!("{key} ="))
                    || line.contains(&format!(", {key} ="))
                    || line.contains(&format!("{{ {key} ="))
            })
        })
    };
    let missing: Vec<&String> = keys.iter().filter(|k| !uses(k)).collect();
    assert!(missing.is_empty(), "no workload in fuzz/corpus/workload sets {missing:?}");
}
