//! Tests that return without checking what they are for, said and counted.
//!
//! A test that cannot run here (this CPU lacks its kernel's features, a model or a program is
//! not present) calls one of the functions below and returns. Each prints `skipped <test>:
//! <reason>` and, where `MONOGEN_SKIP_LOG` names a file, appends the reason and the test to it
//! (one line each, `reason<TAB>test`), so that `.ci/run` can count the skips by reason beside
//! cargo's own counts ([`summary`], the `test-summary` binary).
//!
//! A skip is checked before it is taken: a test may not skip for a CPU feature that
//! `/proc/cpuinfo` lists (its check asked the wrong question), nor, under CI (`CI=true`), for a
//! model or a program that `.ci/run` provides.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// The environment variable naming the file that skips are appended to.
pub const LOG_VARIABLE: &str = "MONOGEN_SKIP_LOG";

/// Skips `test` because this CPU lacks at least one of `features` (Rust `target_feature`
/// names), as the caller's detection found. Panics where every one of them is listed in
/// `/proc/cpuinfo`: a machine that has a test's features must run it. The one exception is
/// AMX, whose tiles Linux may refuse a process that the CPU would give them (the reason then
/// says so).
pub fn cpu(test: &str, features: &[&str]) {
    let reason = cpu_reason(test, features, cpu_flags().as_deref());
    record(test, &reason);
}

/// Skips `test` because the model folder `dir` is not present. Under CI (`CI=true`) a missing
/// model is a failure instead.
pub fn model(test: &str, dir: &Path) {
    assert!(
        !under_ci(),
        "{test}: model {} is missing (set MONOGEN_MODELS); under CI=true this is a failure",
        dir.display()
    );
    record(
        test,
        &format!(
            "model {} is not present (set MONOGEN_MODELS)",
            dir.file_name().unwrap_or_default().to_string_lossy()
        ),
    );
}

/// Skips `test` because `what` (a program or package that `.ci/run` installs) is missing here.
/// Under CI (`CI=true`) that is a failure instead.
pub fn tool(test: &str, what: &str) {
    assert!(
        !under_ci(),
        "{test}: {what} is missing; .ci/run installs it, so under CI=true this is a failure"
    );
    record(test, &format!("{what} is missing"));
}

/// Skips `test`, written for `arches` only, on another architecture.
pub fn arch(test: &str, arches: &str) {
    record(test, &format!("it is for {arches} only, not {}", std::env::consts::ARCH));
}

/// Skips `test` for a reason none of the above names; `reason` says why the test cannot check
/// anything on this machine.
pub fn because(test: &str, reason: &str) {
    record(test, reason);
}

fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Prints the skip and appends it to the log, if one is named.
fn record(test: &str, reason: &str) {
    eprintln!("skipped {test}: {reason}");
    let Some(path) = std::env::var_os(LOG_VARIABLE) else { return };
    append(Path::new(&path), test, reason);
}

/// Appends one `reason<TAB>test` line; tests run in parallel threads and processes, and one
/// write of a short line to a file opened for appending is not interleaved with another's.
fn append(path: &Path, test: &str, reason: &str) {
    let line = format!("{}\t{}\n", reason.replace(['\t', '\n'], " "), test.replace(['\t', '\n'], " "));
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    file.write_all(line.as_bytes()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// The feature flags of `/proc/cpuinfo`'s first processor, or `None` where there is none.
fn cpu_flags() -> Option<Vec<String>> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("flags"))?;
    Some(line.split_once(':')?.1.split_whitespace().map(str::to_string).collect())
}

/// The `/proc/cpuinfo` flag of a Rust `target_feature` name.
fn cpuinfo_flag(feature: &str) -> String {
    match feature {
        "sse3" => "pni".into(),
        "lzcnt" => "abm".into(),
        "avx512vnni" => "avx512_vnni".into(),
        "avx512bf16" => "avx512_bf16".into(),
        "avx512fp16" => "avx512_fp16".into(),
        "avxvnni" => "avx_vnni".into(),
        "avxifma" => "avx_ifma".into(),
        "avxvnniint8" => "avx_vnni_int8".into(),
        other => other.replace(['-', '.'], "_"),
    }
}

/// The reason of a skip for lack of CPU features, given `/proc/cpuinfo`'s flags (`None`: not
/// known, so the caller's detection stands).
fn cpu_reason(test: &str, features: &[&str], flags: Option<&[String]>) -> String {
    let Some(flags) = flags else {
        return format!("this CPU lacks one of {}", features.join(", "));
    };
    let lacking: Vec<&str> =
        features.iter().copied().filter(|f| !flags.iter().any(|flag| *flag == cpuinfo_flag(f))).collect();
    if !lacking.is_empty() {
        return format!("this CPU lacks {}", lacking.join(", "));
    }
    assert!(
        features.iter().any(|f| f.starts_with("amx")),
        "{test} would skip for lack of one of {}, but /proc/cpuinfo lists every one: a test must run on a machine that has its features",
        features.join(", ")
    );
    "Linux refuses this process the AMX tiles the CPU has".into()
}

/// Counts from cargo's test output and a skip log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Tests that passed and did what they are for.
    pub passed: usize,
    pub failed: usize,
    pub ignored: usize,
    /// Tests that passed by returning early: each reason with its count.
    pub skipped: BTreeMap<String, usize>,
}

impl Counts {
    /// Adds up the `test result:` lines of cargo's output and the lines of a skip log. A
    /// skipped test is counted by cargo as passed; here it is moved from passed to skipped.
    pub fn read(output: &str, log: &str) -> Self {
        let mut counts = Counts::default();
        for line in output.lines().filter_map(|l| l.trim().strip_prefix("test result: ")) {
            let figure = |word: &str| -> usize {
                line.split([';', '.'])
                    .filter_map(|part| part.trim().strip_suffix(word))
                    .find_map(|n| n.trim().parse().ok())
                    .unwrap_or(0)
            };
            counts.passed += figure(" passed");
            counts.failed += figure(" failed");
            counts.ignored += figure(" ignored");
        }
        for line in log.lines().filter(|l| !l.trim().is_empty()) {
            let reason = line.split('\t').next().unwrap_or(line);
            *counts.skipped.entry(reason.to_string()).or_default() += 1;
        }
        let skipped: usize = counts.skipped.values().sum();
        counts.passed = counts.passed.saturating_sub(skipped);
        counts
    }

    /// One line: `tests: N passed, N failed, N ignored, N skipped (N: reason; ...)`.
    pub fn line(&self) -> String {
        let skipped: usize = self.skipped.values().sum();
        let mut line = format!(
            "tests: {} passed, {} failed, {} ignored, {skipped} skipped",
            self.passed, self.failed, self.ignored
        );
        if skipped > 0 {
            let reasons: Vec<String> =
                self.skipped.iter().map(|(reason, n)| format!("{n}: {reason}")).collect();
            line += &format!(" ({})", reasons.join("; "));
        }
        line
    }
}

/// Where the tests skipped for `reason` last ran in full: `tests/full-runs.txt`'s lines that
/// name one of the CPU features it lacks, or, for another reason, whose key (an environment
/// variable that runs the tests, e.g. `MONOGEN_LARGE`) the reason names.
pub fn last_full_runs(reason: &str, runs: &str) -> Vec<String> {
    let keys: Vec<&str> = match reason.strip_prefix("this CPU lacks ") {
        Some(lacking) => lacking.split(", ").map(|f| f.trim_start_matches("one of ")).collect(),
        None => reason
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("MONOGEN_"))
            .collect(),
    };
    runs.lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .filter(|l| {
            let features = l.split(':').next().unwrap_or_default();
            features.split_whitespace().any(|f| keys.contains(&f))
        })
        .map(str::to_string)
        .collect()
}

/// The summary `.ci/run` ends with: for each reason a test skipped, where those tests last
/// ran in full, then the count line.
pub fn summary(output: &str, log: &str, runs: &str) -> String {
    let counts = Counts::read(output, log);
    let mut text = String::new();
    for reason in counts.skipped.keys() {
        for run in last_full_runs(reason, runs) {
            text += &format!("  skipped for \"{reason}\"; they last ran in full: {run}\n");
        }
    }
    text + &counts.line() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(list: &str) -> Vec<String> {
        list.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn a_skip_names_the_features_cpuinfo_lacks() {
        let have = flags("fma avx2 avx512f avx512_vnni f16c");
        let reason = cpu_reason("t", &["avx512f", "avx512vnni", "avxvnni"], Some(&have));
        assert_eq!(reason, "this CPU lacks avxvnni");
        let reason = cpu_reason("t", &["avx512f", "amx-tile", "amx-bf16"], Some(&have));
        assert_eq!(reason, "this CPU lacks amx-tile, amx-bf16");
    }

    #[test]
    #[should_panic(expected = "a test must run on a machine that has its features")]
    fn a_test_may_not_skip_for_features_this_cpu_has() {
        let have = flags("fma avx2 avx512f avx512_vnni f16c");
        cpu_reason("t", &["avx2", "fma", "avx512vnni"], Some(&have));
    }

    #[test]
    fn a_skip_finds_where_its_tests_last_ran_in_full() {
        let runs = "# comment\navx512f avx512bw: machine A\nMONOGEN_LARGE: machine B\n";
        assert_eq!(last_full_runs("this CPU lacks avx512bw", runs), ["avx512f avx512bw: machine A"]);
        assert_eq!(
            last_full_runs("they run only with MONOGEN_LARGE=1 (big)", runs),
            ["MONOGEN_LARGE: machine B"]
        );
        assert!(last_full_runs("model x is not present (set MONOGEN_MODELS)", runs).is_empty());
    }

    #[test]
    fn amx_listed_but_refused_is_a_reason_of_its_own() {
        let have = flags("avx512f amx_tile amx_bf16");
        let reason = cpu_reason("t", &["avx512f", "amx-tile", "amx-bf16"], Some(&have));
        assert_eq!(reason, "Linux refuses this process the AMX tiles the CPU has");
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    #[should_panic(expected = "a test must run on a machine that has its features")]
    fn this_machine_cannot_skip_for_sse2() {
        cpu("sse2 test", &["sse2"]);
    }

    #[test]
    fn skips_are_appended_and_counted_by_reason() {
        let dir = std::env::temp_dir().join(format!("monogen-skip-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("skips.log");
        let _ = std::fs::remove_file(&log);
        append(&log, "a", "this CPU lacks amx-tile");
        append(&log, "b", "this CPU lacks amx-tile");
        append(&log, "c\twith a tab", "model x is not present");
        let log_text = std::fs::read_to_string(&log).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let output = "\
running 3 tests
test result: ok. 40 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 1.00s
test result: FAILED. 7 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.5s
";
        let counts = Counts::read(output, &log_text);
        assert_eq!((counts.passed, counts.failed, counts.ignored), (44, 1, 2));
        assert_eq!(counts.skipped["this CPU lacks amx-tile"], 2);
        assert_eq!(counts.skipped["model x is not present"], 1);
        assert_eq!(
            counts.line(),
            "tests: 44 passed, 1 failed, 2 ignored, 3 skipped (1: model x is not present; 2: this CPU lacks amx-tile)"
        );
        let runs =
            "# comment\namx-tile amx-bf16: intel-xeon-2c, 2026-12-05\navxvnni: intel-xeon-2c, 2026-12-05\n";
        let summary = summary(output, &log_text, runs);
        assert!(
            summary.contains("they last ran in full: amx-tile amx-bf16: intel-xeon-2c, 2026-12-05"),
            "{summary}"
        );
        assert!(!summary.contains("avxvnni:"), "{summary}");
        assert!(
            summary.ends_with("3 skipped (1: model x is not present; 2: this CPU lacks amx-tile)\n"),
            "{summary}"
        );
    }
}
