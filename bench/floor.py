#!/usr/bin/env python3
"""A generated LLaMA crate's decode against its floor, both measured round by round.

The floor of a decode step is the weight bytes it reads (bench/weight_bytes.py) over the read
bandwidth of the machine at the crate's thread count, measured over a buffer of that size
(bench/peaks, `--read-only`). On a shared, noisy machine that bandwidth moves by a third from
one second to the next, so a floor measured once and a decode measured later say little about
each other. Each round here runs the decode between two measurements of the bandwidth (the one
after a round is the one before the next) and judges it against their geometric mean; it prints
per round floor / measured (1 is the floor itself; the goal of issue "Fast CPU kernels" is at
least 0.9), then their median and range over the rounds, and for comparison the same against
the read before each round alone.
Several binaries (two builds of a crate, say) run in turn within each round, against that
round's bandwidth.

Each binary is a release build of a crate generated for the model's shapes. Before the rounds,
the model file leaves the page cache and the first binary reads it back, once, in the 2 MiB
folios a crate asks for (bench/beside.py, which also runs the rounds). The bandwidth's buffer
is in huge pages as well (bench/peaks). Keep the machine otherwise idle.

Usage: bench/floor.py [--rounds R] [--threads T] [--max-tokens M] [--dir DIR] MODEL_DIR DTYPE BINARY...
       (DTYPE as the crate holds the weights: f32, bf16, int8, int4, or int8-packed for an int8 crate
       whose matmul packs them with binary16 scales; T the crates' thread count; MODEL_DIR the
       checkpoint, whose weights are counted, and DIR a directory the binaries read instead,
       such as one a packing crate saved with `--save-model`)
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from beside import alternate, bracket, crate_run, map_as_crates, name, peaks, summary  # noqa: E402
from weight_bytes import weight_bytes  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--dir", help="the model directory the binaries read (default: MODEL_DIR)")
    parser.add_argument("model")
    parser.add_argument("dtype", choices=["f32", "bf16", "int8", "int8-packed", "int4"])
    parser.add_argument("binaries", nargs="+")
    args = parser.parse_args()

    machine = peaks()
    size, _ = weight_bytes(args.model, args.dtype)
    model = args.dir or args.model

    def bandwidth() -> float:
        return machine("--read-only", "--threads", str(args.threads), "--rounds", "2", str(size))

    def decode(binary: str) -> float:
        return crate_run(binary, model, args.max_tokens)["decode_tok_s"]

    map_as_crates(model, lambda: decode(args.binaries[0]))

    print(f"{size / 1e6:.1f} MB of weights per token, {args.threads} threads, {args.max_tokens} new tokens")
    bandwidths = []
    ratios: dict[str, list[float]] = {b: [] for b in args.binaries}
    one_sided: dict[str, list[float]] = {b: [] for b in args.binaries}
    speeds: dict[str, list[float]] = {b: [] for b in args.binaries}
    rounds = alternate(args.rounds, args.binaries, bandwidth, decode)
    for round, (reads, tok_s) in enumerate(rounds):
        gb_s = bracket(reads)
        floor_ms = size / (gb_s * 1e9) * 1e3
        bandwidths.append(gb_s)
        line = f"  round {round + 1}: read {reads[0]:6.2f} then {reads[1]:6.2f} GB/s, floor {floor_ms:7.2f} ms"
        for b in args.binaries:
            ratio = floor_ms * tok_s[b] / 1e3
            ratios[b].append(ratio)
            # The same against the read before the round alone.
            one_sided[b].append(ratio * gb_s / reads[0])
            speeds[b].append(tok_s[b])
            line += f"; {name(b)} {tok_s[b]:8.2f} tok/s, floor / measured {ratio:.3f}"
        print(line)

    print(f"read GB/s (each round's two, by geometric mean) {summary(bandwidths)}")
    for b in args.binaries:
        print(f"{name(b):40s} decode tok/s {summary(speeds[b])}   floor / measured, per round: {summary(ratios[b])}")
        print(f"{'':40s} (against the read before each round alone: {summary(one_sided[b])})")


if __name__ == "__main__":
    main()
