#!/usr/bin/env python3
"""Alternating runs of generated crates' binaries on the same model and prompt ids.

Each round runs every binary once, in turn (every other round in reverse order), with
`--prompt-ids` (N ids, the same deterministic sequence as bench/llama_vs_candle.sh's prompt when
N is 128), `--max-tokens` and `--json`, and reads the prefill and decode speeds the binary
reports. Prints per binary the median and the range over the rounds, and whether every run
generated the same ids. From the second binary on, it also prints the ratio of its speed to the
first binary's within each round (median and range): a slow phase of the machine slows both
runs of a round, so the ratios spread less than the speeds do. Besides the speeds, each run's
load time (as the binary reports it) and the wall time of its whole process, from spawn to
exit, are compared as the first binary's time over this one's (above 1 is faster); with
`--max-tokens 1` the latter is the time from process start to the first token.

Before the rounds, the model file leaves the page cache and the first binary reads it back,
once, in the 2 MiB folios a crate asks for (bench/beside.py's `map_as_crates`, as
bench/floor.py does): a file left in the 4 KiB pages of another reader, or of the writes that
saved it, maps a page at a time. The stories15M int8 crate's load took 7.5 ms from such a
cache and 5.0 ms after this (bench/RESULTS.md).

The binaries must be release builds of crates generated for the same model shapes (two crates
share a target folder only under different package names: rename one in its Cargo.toml and
its src/main.rs). Keep the machine otherwise idle while it runs.

With `--batch N`, each run decodes N copies of the prompt as one batch (a batching crate's
`--batch`): the decode speed is then the batch's, every copy's tokens together.

Usage: bench/ab.py [--rounds R] [--prompt-len N] [--max-tokens M] [--batch N] MODEL_DIR BINARY...
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from beside import map_as_crates  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--batch", type=int, default=1, help="copies of the prompt decoded as one batch (a batching crate's --batch)"
    )
    parser.add_argument("model")
    parser.add_argument("binaries", nargs="+")
    args = parser.parse_args()

    ids = ",".join(str(1 + (i * 7919) % 31000) for i in range(args.prompt_len))
    results = {b: {"decode": [], "prefill": [], "load": [], "wall": [], "ids": set()} for b in args.binaries}

    def command(binary: str) -> list[str]:
        batch = ["--batch", str(args.batch)] if args.batch != 1 else []
        return [binary, "--model", args.model, "--prompt-ids", ids, "--max-tokens", str(args.max_tokens), "--json"] + batch

    map_as_crates(args.model, lambda: subprocess.run(command(args.binaries[0]), capture_output=True, check=True))
    for round in range(args.rounds):
        # Every other round in reverse order, so that no binary always runs first.
        for binary in args.binaries if round % 2 == 0 else args.binaries[::-1]:
            started = time.perf_counter()
            run = subprocess.run(command(binary), capture_output=True, text=True, check=True)
            wall = (time.perf_counter() - started) * 1e3
            out = json.loads(run.stdout)
            results[binary]["decode"].append(out["decode_tok_s"])
            results[binary]["prefill"].append(out["prefill_tok_s"])
            results[binary]["load"].append(out["load_ms"])
            results[binary]["wall"].append(wall)
            for sequence in out.get("sequences", [out]):
                results[binary]["ids"].add(tuple(sequence["generated_ids"]))

    batch = f", batches of {args.batch}" if args.batch != 1 else ""
    print(f"{args.rounds} alternating rounds, {args.prompt_len} prompt ids, {args.max_tokens} new tokens{batch}")
    for binary, r in results.items():
        name = binary.rsplit("/", 1)[-1]
        d, p, l, w = r["decode"], r["prefill"], r["load"], r["wall"]
        print(
            f"{name:40s} decode tok/s {statistics.median(d):8.1f} [{min(d):.1f}-{max(d):.1f}]"
            f"   prefill tok/s {statistics.median(p):8.1f} [{min(p):.1f}-{max(p):.1f}]"
            f"   load ms {statistics.median(l):6.1f}   process ms {statistics.median(w):7.1f}"
        )
    first = results[args.binaries[0]]
    labels = {"decode": "decode", "prefill": "prefill", "load": "load", "wall": "process"}
    for binary in args.binaries[1:]:
        name = binary.rsplit("/", 1)[-1]
        # Speeds as they are, times inverted: above 1 is faster either way.
        # (No decode with `--max-tokens 1`: its speeds are 0.)
        ratios = {
            what: [b / a for a, b in zip(first[what], results[binary][what]) if a > 0]
            for what in ("decode", "prefill")
        } | {
            what: [a / b for a, b in zip(first[what], results[binary][what])]
            for what in ("load", "wall")
        }
        print(
            f"{name:40s} per round, speed / the first binary's:"
            + "".join(
                f"   {labels[what]} {statistics.median(r):.3f} [{min(r):.3f}-{max(r):.3f}]"
                for what, r in ratios.items()
                if r
            )
        )
    generated = set().union(*(r["ids"] for r in results.values()))
    print("every run generated the same ids:", len(generated) == 1)


if __name__ == "__main__":
    main()
