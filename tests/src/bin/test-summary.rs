//! `test-summary CARGO_OUTPUT SKIP_LOG FULL_RUNS`: the line `.ci/run` ends with, counting the
//! tests that passed, failed, were ignored and were skipped (by reason), and where the tests
//! skipped for lack of CPU features last ran in full (`monogen_tests::skip::summary`). A skip
//! log that does not exist reads as empty: no test skipped.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [output, log, runs] = args.as_slice() else {
        eprintln!("usage: test-summary CARGO_OUTPUT SKIP_LOG FULL_RUNS");
        std::process::exit(2);
    };
    let read = |path: &str| {
        std::fs::read_to_string(path).unwrap_or_else(|e| {
            eprintln!("test-summary: {path}: {e}");
            std::process::exit(2);
        })
    };
    let log = std::fs::read_to_string(log).unwrap_or_default();
    print!("{}", monogen_tests::skip::summary(&read(output), &log, &read(runs)));
}
