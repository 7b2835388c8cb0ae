#!/usr/bin/env bash
# all-MiniLM-L6-v2 sentence embeddings: the committed crates monogen generated
# (generated/all-minilm-l6-v2-cpu-{f32,bf16,int8}, 2 threads) and their 1-thread twins
# (the same workloads with `threads = 1`, generated under target/bench-bert/) against
# candle-transformers' BERT (CPU, f32, from crates.io) at RAYON_NUM_THREADS=1 and 2, on the
# same weights and token ids, each side in a process of its own, the sides alternating. Each
# line prints a side's median, its 10th and 90th percentiles, the cores it kept busy (CPU time
# / wall time), candle's time at the same thread count over its time, and the largest
# difference between its pooled vectors and candle's.
#
# The harness (bench/bert_vs_candle/) is kept out of the workspace, so the test suite never
# compiles candle; its first build takes a few minutes.
#
# Usage: bench/bert_vs_candle.sh [ROUNDS]   (MONOGEN_MODELS overrides ../shared/models)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-20}"
models="${MONOGEN_MODELS:-../shared/models}"
for dtype in f32 bf16 int8; do
    cargo run -q -p monogen -- check "workloads/all-minilm-l6-v2-cpu-$dtype.toml" >/dev/null || {
        echo "generated/all-minilm-l6-v2-cpu-$dtype is stale: run monogen build first" >&2
        exit 1
    }
done
# The 1-thread twins, which the harness's Cargo.toml finds under target/bench-bert/crates/.
work="$PWD/target/bench-bert"
mkdir -p "$work/crates"
for dtype in f32 bf16 int8; do
    name="all-minilm-l6-v2-cpu-$dtype"
    sed -e "s/^name = \"$name\"/name = \"$name-t1\"/" -e 's/^threads = .*/threads = 1/' \
        -e '/^hardware = /d' "workloads/$name.toml" > "$work/$name-t1.toml"
    cargo run -q -p monogen -- build "$work/$name-t1.toml" --out "$work/crates/$name-t1" >/dev/null
done
export CARGO_TARGET_DIR="$PWD/target/bench-candle"
cargo build -q --release --manifest-path bench/bert_vs_candle/Cargo.toml
"$CARGO_TARGET_DIR/release/bert-vs-candle" "$models/all-minilm-l6-v2" "$rounds"
