#!/usr/bin/env bash
# int4 decoding at a LLaMA benchmark shape (default TinyLlama-1.1B) against its floor and
# against the int8 crate, side by side: the committed crates generated/<shape>-bench-cpu-int4
# and generated/<shape>-bench-cpu-int8 (AVX-512 VNNI kernels; a CPU without AVX-512 gets both
# generated under target/ for x86-64-v3, the AVX2 kernels), each a release build, on the same
# synthetic bfloat16 checkpoint (`monogen synth-weights`), which each quantizes at load. Each
# round reads the machine's bandwidth, runs both binaries in turn (64 new tokens after a
# 128-token prompt) and reads the bandwidth again (bench/floor.py): the int4 crate's
# floor / measured uses the bytes it reads per token (16 bytes, a binary16 scale and a binary16
# minimum per 32 weights: bench/weight_bytes.py int4); the int8 crate's figure on that line is
# against the same int4 floor, so it is the int8 crate's speed as a share of the int4 floor, and
# the ratio of the two decode speeds is the int4 crate's speed-up. Keep the machine otherwise
# idle. Writes under target/bench-int4.
#
# Usage: bench/int4_decode.sh [ROUNDS] [SHAPE]   (default 5 tinyllama; SHAPE stories15m,
#        stories110m or tinyllama)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-5}"
shape="${2:-tinyllama}"
work="$PWD/target/bench-int4"
mkdir -p "$work"
monogen() { cargo run -q --release -p monogen -- "$@"; }
CARGO_TARGET_DIR="$PWD/target/bench-peaks" cargo build -q --release --manifest-path bench/peaks/Cargo.toml
v3=()
grep -qw avx512f /proc/cpuinfo || v3=(-e "s/^cpu_features = .*/$(grep '^cpu_features' workloads/stories260k-cpu-f32.toml)/")
binaries=()
for dtype in int4 int8; do
    name="$shape-bench-cpu-$dtype"
    monogen check "workloads/$name.toml" >/dev/null || {
        echo "generated/$name is stale: run monogen build first" >&2
        exit 1
    }
    crate="generated/$name"
    if [ ${#v3[@]} -gt 0 ]; then
        sed -e "s/^name = \"$name\"/name = \"$name-v3\"/" "${v3[@]}" "workloads/$name.toml" > "$work/$name-v3.toml"
        monogen build "$work/$name-v3.toml" --out "$work/crates/$name-v3" >/dev/null
        crate="$work/crates/$name-v3"
        name="$name-v3"
    fi
    CARGO_TARGET_DIR="$work/target" cargo build -q --release --manifest-path "$crate/Cargo.toml"
    binaries+=("$work/target/release/$name")
done
model="$work/models/$shape"
[ -f "$model/model.safetensors" ] || monogen synth-weights "workloads/$shape-bench-cpu-int4.toml" --out "$model" >/dev/null
# The builds' dirty pages are written back before the timed runs.
sync
python3 bench/floor.py --rounds "$rounds" --threads 2 "$model" int4 "${binaries[@]}"
