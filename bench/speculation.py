#!/usr/bin/env python3
"""Decode tokens per second with prompt lookup against plain decoding, run alternately.

Each case runs the plain crate and its speculating twin on the same prompt and parameters,
`--json`, ROUNDS times each, interleaved, and prints the median decode tokens per second of
each, their ratio, the share of drafted tokens kept, and in how many runs both picked the same
tokens (a sampled run may depart where a coin falls within the rounding of a cumulative
probability, as random weights' flat distributions make likelier).
"""
import argparse
import json
import statistics
import subprocess

REPEATING = (
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
    "One day, she saw a big, red ball. Once upon a time, there was a little girl named Lily. She loved"
)


def run(binary, model, prompt, max_tokens, temperature, seed):
    args = [binary, "--model", model, "--max-tokens", str(max_tokens), "--json",
            "--temperature", str(temperature), "--seed", str(seed)]
    args += ["--prompt-ids", prompt] if prompt[0].isdigit() else ["--prompt", prompt]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def case(name, plain, lookup, model, prompt, max_tokens, temperature, rounds):
    speeds = {"plain": [], "lookup": []}
    kept = drafted = same = 0
    for r in range(rounds):
        a = run(plain, model, prompt, max_tokens, temperature, r)
        b = run(lookup, model, prompt, max_tokens, temperature, r)
        same += a["generated_ids"] == b["generated_ids"]
        speeds["plain"].append(a["decode_tok_s"])
        speeds["lookup"].append(b["decode_tok_s"])
        kept += b["accepted"]
        drafted += b["drafted"]
    p, l = statistics.median(speeds["plain"]), statistics.median(speeds["lookup"])
    share = f"{kept / drafted:.0%} of {drafted // rounds} drafted" if drafted else "nothing drafted"
    print(f"| {name} | {p:.1f} | {l:.1f} | {l / p:.2f}x | {share} | {same} of {rounds} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bin", required=True, help="folder of the release binaries")
    ap.add_argument("--stories260k", required=True)
    ap.add_argument("--stories110m", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    b = lambda name: f"{a.bin}/{name}"
    print("| case | plain decode tok/s | prompt lookup tok/s | ratio | drafted tokens kept (per run) | runs with the same tokens |")
    print("|---|---|---|---|---|---|")
    s260 = (b("stories260k-cpu-f32"), b("stories260k-cpu-f32-lookup"), a.stories260k)
    case("stories260k, text that repeats, greedy, 200 tokens", *s260, REPEATING, 200, 0, a.rounds)
    case("stories260k, a story's start, greedy, 200 tokens", *s260, "Once upon a time", 200, 0, a.rounds)
    case("stories260k, a story's start, temperature 1, 200 tokens", *s260, "Once upon a time", 200, 1, a.rounds)
    s110 = (b("stories110m-bench-cpu-f32"), b("stories110m-bench-cpu-f32-lookup"), a.stories110m)
    ids = ",".join(str(i) for i in [1] + list(range(400, 528)))
    case("stories110M shape, synthetic, greedy (a repeated token), 128 tokens", *s110, ids, 128, 0, a.rounds)
    case("stories110M shape, synthetic, temperature 1 (no recurrence), 128 tokens", *s110, ids, 128, 1, a.rounds)


if __name__ == "__main__":
    main()
