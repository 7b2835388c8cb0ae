#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 60) on the stable toolchain: cargo-fuzz needs
# nightly flags, which RUSTC_BOOTSTRAP=1 allows. Starts from the corpus in fuzz/corpus/<target>
# (kept in the repository); new inputs go to target/fuzz-corpus/<target>, so the run does not
# change the repository. On a crash it copies the input into fuzz/regressions/<target>/, which
# tests/tests/fuzz_corpus.rs replays as an ordinary test (commit it with the fix), and exits
# non-zero.
#
# Usage: fuzz/run.sh [SECONDS]   (needs `cargo install cargo-fuzz`)
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="$PWD/../target/fuzz"
cargo fuzz build -O
for target in workload safetensors; do
    scratch="$CARGO_TARGET_DIR/../fuzz-corpus/$target"
    mkdir -p "$scratch"
    echo "fuzzing $target for ${seconds}s"
    log="$scratch.log"
    status=0
    cargo fuzz run -O "$target" "$scratch" "corpus/$target" -- \
        -max_total_time="$seconds" -dict="$target.dict" -max_len=4096 -print_final_stats=1 >"$log" 2>&1 ||
        status=$?
    grep -E "^(stat::number_of_executed_units|Done)|ERROR|panicked|SUMMARY" "$log" || true
    if [ "$status" -ne 0 ]; then
        tail -40 "$log"
        mkdir -p "regressions/$target"
        cp artifacts/"$target"/* "regressions/$target/" 2>/dev/null || true
        echo "fuzz target $target failed (exit $status); the input is in fuzz/regressions/$target/," \
            "which cargo test replays (tests/tests/fuzz_corpus.rs): fix the cause and commit it" >&2
        exit "$status"
    fi
done
