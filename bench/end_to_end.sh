#!/usr/bin/env bash
# End-to-end speed of the default workload's crate (AVX2/FMA kernels, as resolution chose them)
# against the same workload resolved without CPU features (the scalar reference kernels).
# Both crates are built in release mode and run interleaved on the same model and prompt;
# the script prints medians of prefill and decode tokens/s and the ratios.
#
# Usage: bench/end_to_end.sh [ROUNDS]   (MONOGEN_MODELS overrides ../shared/models)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-15}"
models="${MONOGEN_MODELS:-../shared/models}"
work=target/bench-end-to-end
mkdir -p "$work"

# The scalar twin: the default workload with no CPU features and another name.
sed -e 's/^name = "stories260k-cpu-f32"/name = "stories260k-scalar-bench"/' \
    -e 's/^cpu_features = \[.*\]/cpu_features = []/' \
    workloads/stories260k-cpu-f32.toml > "$work/stories260k-scalar-bench.toml"
cargo run -q -p monogen -- build "$work/stories260k-scalar-bench.toml" --out "$work/stories260k-scalar-bench" --force

export CARGO_TARGET_DIR="$PWD/target/generated-crates"
for crate in generated/stories260k-cpu-f32 "$work/stories260k-scalar-bench"; do
    cargo build -q --release --manifest-path "$crate/Cargo.toml"
done
fast="$CARGO_TARGET_DIR/release/stories260k-cpu-f32"
slow="$CARGO_TARGET_DIR/release/stories260k-scalar-bench"
prompt="Once upon a time, there was a little girl named Lily. She loved to play outside in the park."
args=(--model "$models/stories260k" --prompt "$prompt" --max-tokens 200 --json)

for ((i = 0; i < rounds; i++)); do
    "$fast" "${args[@]}" >> "$work/fast.jsonl"
    "$slow" "${args[@]}" >> "$work/slow.jsonl"
done
python3 - "$work/fast.jsonl" "$work/slow.jsonl" <<'PY'
import json, statistics, sys
def load(path):
    rows = [json.loads(l) for l in open(path)]
    return {k: statistics.median(r[k] for r in rows) for k in ("prefill_tok_s", "decode_tok_s")}, len(rows)
fast, n = load(sys.argv[1])
slow, _ = load(sys.argv[2])
print(f"stories260k, {n} interleaved runs each, 200 new tokens after a 32-token prompt (medians)")
for key in ("prefill_tok_s", "decode_tok_s"):
    print(f"  {key:14} avx2-fma {fast[key]:10.0f}   scalar {slow[key]:10.0f}   ratio {fast[key] / slow[key]:.2f}x")
PY
rm -f "$work/fast.jsonl" "$work/slow.jsonl"
