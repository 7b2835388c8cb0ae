#!/usr/bin/env bash
# Runs fuzz targets for SECONDS each (default 60) on the stable toolchain: cargo-fuzz needs
# nightly flags, which RUSTC_BOOTSTRAP=1 allows. Starts from the corpus in fuzz/corpus/<target>
# (kept in the repository; the weight loaders also from fuzz/corpus/safetensors, the model files
# they share); new inputs go to target/fuzz-corpus/<target>, so the run does not change the
# repository. On a crash it copies the input into fuzz/regressions/<target>/, which
# tests/tests/fuzz_corpus.rs replays as an ordinary test (commit it with the fix), and exits
# non-zero. Prints each target's executions and coverage (libFuzzer's final statistics).
#
# Usage: fuzz/run.sh [SECONDS] [TARGET...]   (every target when none is named;
#        needs `cargo install cargo-fuzz`)
# The targets are built optimised (`cargo fuzz build -O`), with AddressSanitizer; FUZZ_DEV=1
# builds them unoptimised instead (`--dev`, in half the time, for about a fifth of the
# executions a second), as `.ci/run`'s short smoke run does.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
shift || true
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    targets=(workload safetensors int8_weights int4_weights bf16_weights packed_weights bert_weights tokenizer chat_template http)
fi
export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="$PWD/../target/fuzz"
profile=-O
[ "${FUZZ_DEV:-0}" = 1 ] && profile=--dev
cargo fuzz build "$profile"
for target in "${targets[@]}"; do
    scratch="$CARGO_TARGET_DIR/../fuzz-corpus/$target"
    mkdir -p "$scratch"
    seeds=("corpus/$target")
    case "$target" in
        *_weights) seeds+=(corpus/safetensors) ;;
    esac
    # Workloads are short texts; model files need room for a header of every tensor.
    max_len=16384
    [ "$target" = workload ] && max_len=4096
    options=(-max_total_time="$seconds" -max_len="$max_len" -print_final_stats=1)
    if [ -f "$target.dict" ]; then
        options+=(-dict="$target.dict")
    fi
    echo "fuzzing $target for ${seconds}s"
    log="$scratch.log"
    status=0
    cargo fuzz run "$profile" "$target" "$scratch" "${seeds[@]}" -- "${options[@]}" >"$log" 2>&1 || status=$?
    grep -E "^(stat::number_of_executed_units|Done)|(INITED|DONE) +cov:|ERROR|panicked|SUMMARY" "$log" || true
    if [ "$status" -ne 0 ]; then
        tail -40 "$log"
        mkdir -p "regressions/$target"
        cp artifacts/"$target"/* "regressions/$target/" 2>/dev/null || true
        echo "fuzz target $target failed (exit $status); the input is in fuzz/regressions/$target/," \
            "which cargo test replays (tests/tests/fuzz_corpus.rs): fix the cause and commit it" >&2
        exit "$status"
    fi
done
