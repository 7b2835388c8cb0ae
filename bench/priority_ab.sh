#!/usr/bin/env bash
# Interactive first tokens into a saturated server, old crate against new: each server in turn
# (ROUNDS rounds, default 2) takes 128 requests of class `batch` at concurrency 32 while requests
# of class `interactive` arrive one at a time (bench/serve_load.py --probe), then 8 `interactive`
# requests on its own, idle; prints the probes' and the idle requests' time to first token.
# The servers listen on 127.0.0.1:18190, one at a time, and stop after their round.
#
# Usage: bench/priority_ab.sh MODEL_DIR WORKLOAD_NAME BINARY...
#   e.g. bench/priority_ab.sh ../scratch/serve-frontier/synth-stories110m stories110m-serve-cpu-f32 \
#            /tmp/old/stories110m-serve-cpu-f32 target/release/stories110m-serve-cpu-f32
#   (release builds of a serving workload's crate, for the model's shapes: bench/serve_frontier.sh
#   makes the synthetic model)
set -euo pipefail
cd "$(dirname "$0")/.."
model=$1
workload=$2
shift 2
port=18190
for round in $(seq 1 "${ROUNDS:-2}"); do
    for bin in "$@"; do
        "$bin" serve --model "$model" --port "$port" > /tmp/monogen-priority-ab.log 2>&1 &
        pid=$!
        trap 'kill $pid 2>/dev/null || true' EXIT
        for _ in $(seq 1 150); do
            curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
            sleep 0.2
        done
        echo "== round $round: $bin"
        python3 bench/serve_load.py --url "http://127.0.0.1:$port" --model "$workload" --label saturated \
            --requests 128 --prompt-len 64 --max-tokens 64 --concurrency 32 \
            --priority batch --probe interactive --probes 10 | tail -2
        python3 bench/serve_load.py --url "http://127.0.0.1:$port" --model "$workload" --label idle \
            --requests 8 --prompt-len 64 --max-tokens 8 --concurrency 1 --priority interactive | tail -1
        kill "$pid"
        wait "$pid" 2>/dev/null || true
    done
done
