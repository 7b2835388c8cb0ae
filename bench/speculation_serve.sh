#!/usr/bin/env bash
# A server's throughput with prompt lookup against the same server without it, at the
# stories110M shape in f32 on synthetic weights: workloads/stories110m-serve-cpu-f32.toml and a
# copy with a [speculation] table, generated side by side under target/spec-bench/serve/ (outside
# generated/), built in release, and each served in turn on a loopback port to
# bench/serve_load.py's closed loop (streamed, greedy, random prompt ids: random weights then
# decode one repeated token, where prompt lookup drafts well). Two rounds, alternating the
# servers; each server stops after its round. /metrics gives the drafted and kept tokens.
#
# Usage: bench/speculation_serve.sh [CONCURRENCY] [REQUESTS]   (default 1,4,16 and 16)
set -euo pipefail
cd "$(dirname "$0")/.."
levels="${1:-1,4,16}"
requests="${2:-16}"
out=target/spec-bench/serve
mkdir -p "$out"
cp workloads/stories110m-serve-cpu-f32.toml "$out/plain.toml"
{
    sed -e 's/^name = "stories110m-serve-cpu-f32"/name = "stories110m-serve-cpu-f32-lookup"/' \
        workloads/stories110m-serve-cpu-f32.toml
    printf '\n[speculation]\nspeculator = "prompt-lookup"\ndraft_tokens = 4\n'
} >"$out/lookup.toml"
cargo build --quiet --release -p monogen
monogen=target/release/monogen
rm -rf "$out/stories110m-serve-cpu-f32" "$out/stories110m-serve-cpu-f32-lookup"
"$monogen" build "$out/plain.toml" --out "$out/stories110m-serve-cpu-f32" >/dev/null
"$monogen" build "$out/lookup.toml" --out "$out/stories110m-serve-cpu-f32-lookup" >/dev/null
[ -f "$out/model/model.safetensors" ] || "$monogen" synth-weights "$out/plain.toml" --out "$out/model" >/dev/null
for name in stories110m-serve-cpu-f32 stories110m-serve-cpu-f32-lookup; do
    CARGO_TARGET_DIR="$PWD/$out/target" cargo build --quiet --release --manifest-path "$out/$name/Cargo.toml"
done
server=
trap '[ -n "$server" ] && kill $server 2>/dev/null || true' EXIT
for round in 1 2; do
    for name in stories110m-serve-cpu-f32 stories110m-serve-cpu-f32-lookup; do
        "$out/target/release/$name" serve --model "$out/model" --port 0 >"$out/serve.log" 2>&1 &
        server=$!
        for _ in $(seq 300); do
            grep -q '^listening on ' "$out/serve.log" && break
            sleep 0.1
        done
        url=$(sed -n 's/^listening on //p' "$out/serve.log")
        python3 bench/serve_load.py --url "$url" --model "$name" --label "$name" --concurrency "$levels" \
            --requests "$requests" --prompt-len 64 --max-tokens 64 | tail -n +2
        if [[ $name == *lookup ]]; then
            curl -s "$url/metrics" | grep '^monogen_speculation_' | sed "s/^/    round $round: /"
        fi
        kill "$server"
        wait "$server" 2>/dev/null || true
        server=
    done
done
