#!/usr/bin/env bash
# all-MiniLM-L6-v2 sentence embeddings: the committed crate monogen generated
# (generated/all-minilm-l6-v2-cpu-f32) against candle-transformers' BERT (CPU, from crates.io),
# on the same weights and token ids, in one process, interleaved round by round, with candle
# at 1 and then 2 threads (RAYON_NUM_THREADS). Each line prints both medians, their 10th and
# 90th percentiles, the cores each side kept busy (CPU time / wall time), the ratio, and the
# largest difference between the two sides' pooled vectors.
#
# The harness (bench/bert_vs_candle/) is kept out of the workspace, so the test suite never
# compiles candle; its first build takes a few minutes.
#
# Usage: bench/bert_vs_candle.sh [ROUNDS]   (MONOGEN_MODELS overrides ../shared/models)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-40}"
models="${MONOGEN_MODELS:-../shared/models}"
cargo run -q -p monogen -- check workloads/all-minilm-l6-v2-cpu-f32.toml >/dev/null || {
    echo "generated/all-minilm-l6-v2-cpu-f32 is stale: run monogen build first" >&2
    exit 1
}
export CARGO_TARGET_DIR="$PWD/target/bench-candle"
cargo build -q --release --manifest-path bench/bert_vs_candle/Cargo.toml
for threads in 1 2; do
    RAYON_NUM_THREADS=$threads "$CARGO_TARGET_DIR/release/bert-vs-candle" "$models/all-minilm-l6-v2" "$rounds"
done
