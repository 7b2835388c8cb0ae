#!/usr/bin/env bash
# Decode speed with prompt lookup against plain decoding, at batch 1 (bench/speculation.py):
# - stories260k, the real model: generated/stories260k-cpu-f32-lookup against
#   generated/stories260k-cpu-f32, on text that repeats itself and on text that does not;
# - the stories110M shape in f32 on synthetic weights: a copy of
#   workloads/stories110m-bench-cpu-f32.toml with a [speculation] table, generated under
#   target/spec-bench/ (outside generated/), against the same workload without it, generated
#   beside it. Random weights decode
#   greedily into a repeated token (where prompt lookup drafts well), and sample at temperature 1
#   text that never recurs (where it drafts nothing).
# Every crate is built in release under target/spec-bench/.
#
# Usage: bench/speculation.sh [ROUNDS]   (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-5}"
out=target/spec-bench
mkdir -p "$out"
# Both twins are generated here, from no earlier crate: a committed crate's kernels keep their
# place against an equal measurement (the incumbent rule), which a new crate's need not, and
# kernels that add in another order would make sampled runs depart at near-ties.
cp workloads/stories110m-bench-cpu-f32.toml "$out/stories110m-plain.toml"
{
    sed -e 's/^name = "stories110m-bench-cpu-f32"/name = "stories110m-bench-cpu-f32-lookup"/' \
        workloads/stories110m-bench-cpu-f32.toml
    printf '\n[speculation]\nspeculator = "prompt-lookup"\ndraft_tokens = 4\n'
} >"$out/stories110m-lookup.toml"
cargo build --quiet --release -p monogen
monogen=target/release/monogen
rm -rf "$out/stories110m-bench-cpu-f32" "$out/stories110m-bench-cpu-f32-lookup"
"$monogen" build "$out/stories110m-plain.toml" --out "$out/stories110m-bench-cpu-f32" >/dev/null
"$monogen" build "$out/stories110m-lookup.toml" --out "$out/stories110m-bench-cpu-f32-lookup" >/dev/null
cmp <(grep -A1 '^interface = "[a-z_]*"$' "$out/stories110m-bench-cpu-f32/monogen.lock") \
    <(grep -A1 '^interface = "[a-z_]*"$' "$out/stories110m-bench-cpu-f32-lookup/monogen.lock" | head -n -3)
[ -f "$out/model110m/model.safetensors" ] ||
    "$monogen" synth-weights workloads/stories110m-bench-cpu-f32.toml --out "$out/model110m" >/dev/null
for dir in generated/stories260k-cpu-f32 generated/stories260k-cpu-f32-lookup \
    "$out/stories110m-bench-cpu-f32" "$out/stories110m-bench-cpu-f32-lookup"; do
    CARGO_TARGET_DIR="$PWD/$out/target" cargo build --quiet --release --manifest-path "$dir/Cargo.toml"
done
models="${MONOGEN_MODELS:-$PWD/../shared/models}"
python3 bench/speculation.py --bin "$out/target/release" --stories260k "$models/stories260k" \
    --stories110m "$out/model110m" --rounds "$rounds"
