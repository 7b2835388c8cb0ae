#!/usr/bin/env bash
# Time to first token of a request whose 512-token prefix the server's prefix cache holds,
# against the same request cold (bench/prefix_ttft.py), at the stories110M shape in f32 on
# synthetic weights: a copy of workloads/stories110m-serve-cpu-f32.toml with
# `shared_prefix_len = 512`, generated, built in release and served on a loopback port, all
# under target/prefix-bench/ (outside generated/). The server stops at the end.
#
# Usage: bench/prefix_ttft.sh [ROUNDS]   (default 8)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-8}"
out=target/prefix-bench
mkdir -p "$out"
sed -e 's/^name = "stories110m-serve-cpu-f32"/name = "stories110m-prefix-cpu-f32"/' \
    -e 's/^max_seq_len = 1024$/max_seq_len = 1024\nshared_prefix_len = 512/' \
    workloads/stories110m-serve-cpu-f32.toml >"$out/workload.toml"
grep -q '^shared_prefix_len = 512$' "$out/workload.toml"
cargo build --quiet --release -p monogen
monogen=target/release/monogen
"$monogen" build "$out/workload.toml" --out "$out/crate" --force
[ -f "$out/model/model.safetensors" ] || "$monogen" synth-weights "$out/workload.toml" --out "$out/model"
CARGO_TARGET_DIR="$PWD/$out/target" cargo build --quiet --release --manifest-path "$out/crate/Cargo.toml"
"$out/target/release/stories110m-prefix-cpu-f32" serve --model "$out/model" --port 0 >"$out/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 100); do
    grep -q '^listening on ' "$out/serve.log" && break
    sleep 0.1
done
url=$(sed -n 's/^listening on //p' "$out/serve.log")
python3 bench/prefix_ttft.py --url "$url" --model stories110m-prefix-cpu-f32 --rounds "$rounds"
