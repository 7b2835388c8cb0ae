#!/usr/bin/env bash
# The serving frontier: a generated server and llama.cpp's llama-server side by side, on the same
# synthetic weights and the same requests, at closed-loop concurrency 1 to 32 (bench/serve_load.py),
# plus the single-sequence decode step of the same crate's command line, measured in the same run.
#
# Usage: LLAMA_SERVER=/path/to/llama-server LLAMA_CPP=/path/to/llama.cpp \
#            bench/serve_frontier.sh [WORKLOAD ...]
#   WORKLOAD: stories15m-serve-cpu-f32 (default), stories110m-serve-cpu-f32, stories110m-serve-cpu-bf16
#   LLAMA_SERVER: llama.cpp's server, built from the llama.cpp inside PyPI's llama-cpp-python
#     source distribution (vendor/llama.cpp), in a scratch folder outside the repository:
#       cmake -S vendor/llama.cpp -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON
#       cmake --build build -j 2 --target llama-server
#     Without it, only the generated server runs.
#   LLAMA_CPP: that llama.cpp folder, whose convert_hf_to_gguf.py converts the weights
#     (bench/synth_gguf.py; needs sentencepiece, protobuf, torch, transformers).
#   SCRATCH (default ../scratch/serve-frontier): synthetic weights, GGUF files, build output.
#   REQUESTS (default 64), PROMPT_LEN (64), MAX_TOKENS (64), CONCURRENCY (1,2,4,8,16,32).
# Writes bench/serve_frontier.jsonl (this run's figures; OUT=FILE elsewhere) and
# bench/serve_frontier-<workload>.svg. Servers listen
# on 127.0.0.1 and are stopped when the script ends.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SCRATCH=${SCRATCH:-$ROOT/../scratch/serve-frontier}
REQUESTS=${REQUESTS:-64}
PROMPT_LEN=${PROMPT_LEN:-64}
MAX_TOKENS=${MAX_TOKENS:-64}
CONCURRENCY=${CONCURRENCY:-1,2,4,8,16,32}
OUT=${OUT:-$ROOT/bench/serve_frontier.jsonl}
WORKLOADS=("$@")
[ ${#WORKLOADS[@]} -gt 0 ] || WORKLOADS=(stories15m-serve-cpu-f32)
mkdir -p "$SCRATCH"
: > "$OUT"
PIDS=()
trap 'for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done' EXIT

cargo build --quiet --release -p monogen
MONOGEN=$ROOT/target/release/monogen

wait_healthy() {
    for _ in $(seq 1 300); do
        curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    echo "no server on port $1" >&2
    return 1
}

for W in "${WORKLOADS[@]}"; do
    shape=${W%%-serve-*}                       # stories15m, stories110m
    dtype=${W##*-}                             # f32, bf16
    synth=$SCRATCH/synth-$shape
    [ -f "$synth/model.safetensors" ] || "$MONOGEN" synth-weights "workloads/$W.toml" --out "$synth"
    "$MONOGEN" build "workloads/$W.toml" >/dev/null
    CARGO_TARGET_DIR=$SCRATCH/target cargo build --quiet --release --manifest-path "generated/$W/Cargo.toml"
    bin=$SCRATCH/target/release/$W
    ctx=$(sed -n 's/^max_seq_len = //p' "workloads/$W.toml")

    # The single-sequence decode step of the same crate, alone.
    ids=$(python3 -c "import random; r=random.Random(1234); print(','.join(['1']+[str(r.randrange(100,32000)) for _ in range($PROMPT_LEN-1)]))")
    for _ in 1 2 3; do
        "$bin" --model "$synth" --prompt-ids "$ids" --max-tokens "$MAX_TOKENS" --json
    done | python3 -c "
import json, sys, statistics
runs = [json.loads(l) for l in sys.stdin]
step = statistics.median(r['decode_ms'] / max(1, len(r['generated_ids']) - 1) for r in runs)
print(f'$W: single-sequence decode step {step:.2f} ms (median of 3 runs of the command line)')
open('$OUT', 'a').write(json.dumps({'label': 'monogen $W', 'mode': 'single', 'decode_step_ms': step}) + '\n')"

    "$bin" serve --model "$synth" --port 18180 > "$SCRATCH/ours.log" 2>&1 &
    PIDS+=($!)
    wait_healthy 18180
    python3 bench/serve_load.py --url http://127.0.0.1:18180 --model "$W" --label "monogen $W" \
        --requests "$REQUESTS" --prompt-len "$PROMPT_LEN" --max-tokens "$MAX_TOKENS" \
        --concurrency "$CONCURRENCY" --out "$OUT"
    # An interactive request into a server saturated by the batch class, against an idle one's.
    python3 bench/serve_load.py --url http://127.0.0.1:18180 --model "$W" --label "monogen $W priority" \
        --requests "$REQUESTS" --prompt-len "$PROMPT_LEN" --max-tokens "$MAX_TOKENS" \
        --concurrency 32 --priority batch --probe interactive --requests $((REQUESTS * 4)) --out "$OUT"
    kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true

    if [ -n "${LLAMA_SERVER:-}" ]; then
        gguf=$SCRATCH/$shape-$dtype.gguf
        [ -f "$gguf" ] || python3 bench/synth_gguf.py "$synth" "$LLAMA_CPP" "$gguf" --outtype "$dtype"
        "$LLAMA_SERVER" -m "$gguf" --host 127.0.0.1 --port 18181 -t 2 -tb 2 -np 32 -c $((32 * ctx)) \
            > "$SCRATCH/llama-server.log" 2>&1 &
        PIDS+=($!)
        wait_healthy 18181
        python3 bench/serve_load.py --url http://127.0.0.1:18181 --model "$W" --label "llama-server $W" \
            --requests "$REQUESTS" --prompt-len "$PROMPT_LEN" --max-tokens "$MAX_TOKENS" \
            --concurrency "$CONCURRENCY" --out "$OUT"
        kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
    fi
done

for W in "${WORKLOADS[@]}"; do
    python3 - "$OUT" "$W" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
keep = [r for r in rows if r["label"] in ("monogen " + sys.argv[2], "llama-server " + sys.argv[2]) and r["mode"] == "closed"]
open(f"/tmp/frontier-{sys.argv[2]}.jsonl", "w").write("".join(json.dumps(r) + "\n" for r in keep))
EOF
    python3 bench/serve_load.py --plot "/tmp/frontier-$W.jsonl" --svg "bench/serve_frontier-$W.svg" \
        --title "$W, 2 threads: throughput against p99 inter-token latency (labels: concurrency)"
done
