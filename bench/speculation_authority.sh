#!/usr/bin/env bash
# The authority's choice of speculation for workloads that leave it to measurement
# (`speculator = "measured"`, docs/rankings.md): `monogen bench --interface speculator --model DIR
# --dry-run` (rankings/ is left as it is) on scratch workloads under target/spec-authority/,
# each trying no speculation and prompt lookup with 2, 4 and 8 drafts:
# - stories260k, the real model, on text that repeats itself and on the start of a story;
# - the stories110M shape in f32 on synthetic weights (which decode greedily into a repeated
#   token, where prompt lookup drafts well), on the repeating text.
# Each report gives every candidate's time per request, its speed against none (the median of
# the interleaved rounds' ratios), the share of drafts kept, and what `build` would choose.
#
# Usage: bench/speculation_authority.sh [ROUNDS]   (default 7)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-7}"
out=target/spec-authority
mkdir -p "$out"
cargo build --quiet --release -p monogen
monogen=target/release/monogen
models="${MONOGEN_MODELS:-$PWD/../shared/models}"
repeating="Lily and Tom went to the park. They played on the swings. Lily and Tom went to the park. They played on the"
story="Once upon a time, there was a little girl named Lily. She loved to play outside"
# measured FROM NAME TEXT: the workload FROM named NAME, its speculation left to measurement.
measured() {
    sed -e "s/^name = .*/name = \"$2\"/" -e '/^\[speculation\]/,$d' "$1"
    printf '\n[speculation]\nspeculator = "measured"\ndraft_tokens = 8\ntypical_text = "%s"\n' "$3"
}
measured workloads/stories260k-cpu-f32.toml stories260k-measured-repeating "$repeating" >"$out/repeating.toml"
measured workloads/stories260k-cpu-f32.toml stories260k-measured-story "$story" >"$out/story.toml"
measured workloads/stories110m-bench-cpu-f32.toml stories110m-measured-synthetic "$repeating" >"$out/synthetic.toml"
[ -f "$out/model110m/model.safetensors" ] ||
    "$monogen" synth-weights workloads/stories110m-bench-cpu-f32.toml --out "$out/model110m" >/dev/null
for case in "repeating:$models/stories260k" "story:$models/stories260k" "synthetic:$out/model110m"; do
    "$monogen" bench "$out/${case%%:*}.toml" --interface speculator --model "${case#*:}" \
        --confirm-rounds "$rounds" --dry-run
    echo
done
