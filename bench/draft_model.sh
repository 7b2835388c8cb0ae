#!/usr/bin/env bash
# Decode speed with a draft model against the same model alone, at batch 1, on real weights:
# the target is WORKLOAD (a LLaMA workload with one sequence at a time and no [speculation]
# table) with its weights in TARGET_DTYPE; its twin adds a [speculation] table whose draft model
# is the same checkpoint in DRAFT_DTYPE (int4 drafts with an int8 classifier), drafting
# DRAFT_TOKENS at most. Both are generated under target/draft-bench/ (outside generated/), built
# in release, and decode the same prompts greedily in ROUNDS alternating rounds (128 new tokens
# each); prints each round's tok/s, the medians and their ratio, the share of drafts kept, and
# for how many prompts both generated the same tokens.
#
# Usage: bench/draft_model.sh MODEL_DIR [ROUNDS] [WORKLOAD] [TARGET_DTYPE] [DRAFT_DTYPE] [DRAFT_TOKENS]
#   (defaults: 5 rounds, workloads/smollm2-135m-cpu-bf16.toml, f32, int4, 4)
# e.g. bench/draft_model.sh ../scratch/smollm2-135m-instruct 5
set -euo pipefail
cd "$(dirname "$0")/.."
model="$(realpath "$1")"
rounds="${2:-5}"
workload="${3:-workloads/smollm2-135m-cpu-bf16.toml}"
target_dtype="${4:-f32}"
draft_dtype="${5:-int4}"
draft_tokens="${6:-4}"
out=target/draft-bench
mkdir -p "$out"
python3 - "$workload" "$target_dtype" "$draft_dtype" "$draft_tokens" "$out" <<'EOF'
import re, sys
workload, target, draft, k, out = sys.argv[1:]
text = open(workload).read()
name = re.search(r'^name = "(.*)"$', text, re.M).group(1)
# The target: the workload's model at TARGET_DTYPE, no quality bar, no class (priority chooses).
text = re.sub(r'^dtype = ".*"$', f'dtype = "{target}"', text, count=1, flags=re.M)
text = re.sub(r'^classifier_dtype = .*\n', '', text, flags=re.M)
text = re.sub(r'^hardware = .*\n', '', text, flags=re.M)
text = text.split('\n[quality]')[0].rstrip('\n') + '\n'
plain = text.replace(f'name = "{name}"', 'name = "target"')
open(f'{out}/target.toml', 'w').write(plain)
model = re.search(r'^\[model\]\n(.*?)\n\n', text, re.M | re.S).group(1)
classifier = '\nclassifier_dtype = "int8"' if draft == 'int4' else ''
spec = (f'\n[speculation]\nspeculator = "draft-model"\ndraft_tokens = {k}\n\n'
        f'[speculation.draft.model]\n{model}\n\n[speculation.draft.weights]\ndtype = "{draft}"{classifier}\n')
open(f'{out}/speculating.toml', 'w').write(text.replace(f'name = "{name}"', 'name = "speculating"') + spec)
EOF
cargo build --quiet --release -p monogen
for name in target speculating; do
    rm -rf "${out:?}/$name"
    target/release/monogen build "$out/$name.toml" --out "$out/$name" >/dev/null
    CARGO_TARGET_DIR="$PWD/$out/target" cargo build --quiet --release --manifest-path "$out/$name/Cargo.toml"
done
python3 - "$out/target/release" "$model" "$rounds" <<'EOF'
import json, statistics, subprocess, sys
bin_dir, model, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
prompts = ["Once upon a time", "Write a short poem about the sea.", "The capital of France is",
           "def fibonacci(n):"]
def run(name, prompt):
    out = subprocess.run([f"{bin_dir}/{name}", "--model", model, "--prompt", prompt, "--max-tokens", "128",
                          "--json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)
rates = {"target": [], "speculating": []}
drafted = kept = 0
ids = {}
for r in range(rounds):
    line = []
    for name in ["target", "speculating"]:
        tokens = ms = 0.0
        for p in prompts:
            d = run(name, p)
            ids.setdefault((name, p), d["generated_ids"])
            tokens += len(d["generated_ids"]) - 1
            ms += d["decode_ms"]
            if name == "speculating":
                drafted += d["drafted"]; kept += d["accepted"]
        rates[name].append(tokens / ms * 1000)
        line.append(f"{name} {rates[name][-1]:7.1f} tok/s")
    print(f"round {r + 1}: " + ", ".join(line))
a, b = statistics.median(rates["target"]), statistics.median(rates["speculating"])
print(f"decode tok/s, medians of {rounds} rounds over {len(prompts)} prompts of 128 greedy tokens: "
      f"target alone {a:.1f}, with the draft model {b:.1f}: {b / a:.2f}x; "
      f"{kept} of {drafted} drafts kept ({100 * kept / max(drafted, 1):.0f}%)")
same = sum(ids[("target", p)] == ids[("speculating", p)] for p in prompts)
print(f"the same tokens as the target alone for {same} of {len(prompts)} prompts")
EOF
