#!/usr/bin/env python3
"""A generated LLaMA crate's prefill against the machine's FMA or AMX peak, both measured round by round.

The goal of issue "Fast CPU kernels" for an f32 prefill is at least 60% of the FMA peak measured
in the same run, and for a bf16 prefill on AMX tiles at least 25% of the AMX bf16 peak (`--peak
amx`, for the crates of the `*-amx` workloads: bench/peaks' 4 chains of `tdpbf16ps`). On a
shared, noisy machine that peak moves by a tenth or more from one minute to the next
(bench/RESULTS.md): a peak measured once, before or after a series of runs, says little about
any one of them. Each round here runs the crates between two measurements of the peak at the
crate's thread count (bench/peaks, `--fma-only`: AVX-512 where the CPU has it, else AVX2; or
`--amx-only`; the one after a round is the one before the next), judged against their geometric
mean: one fresh process of each binary,
which reads the prompt's 128 ids (the same as bench/ab.py's and bench/llama_vs_candle.sh's) and
generates one token. It prints per round the prefill's rate (its tok/s times the operations of a
prefill token, bench/weight_bytes.py) over that round's peak, then their median and range over
the rounds.

The rate is that of the first prefill of a fresh process, which the crate's `--json` reports,
as bench/llama_vs_candle.sh measures it: it pays for the process's first touches of memory (the
KV cache's pages), which later prefills of the same process do not.

Each binary is a release build of a crate generated for the model's shapes. Before the rounds,
the model file leaves the page cache and the first binary reads it back once, in the 2 MiB
folios that a crate asks for (bench/beside.py, which also runs the rounds, as for
bench/floor.py). Keep the machine otherwise idle.

Usage: bench/prefill_peak.py [--rounds R] [--threads T] [--peak fma|amx] MODEL_DIR DTYPE BINARY...
       (DTYPE as the crate holds the weights, as bench/weight_bytes.py takes it; MODEL_DIR the
       checkpoint, or with --dir a directory the crate reads instead, such as one it saved)
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
    parser.add_argument("--peak", choices=["fma", "amx"], default="fma", help="the peak to judge against")
    parser.add_argument("--dir", help="the model directory the binaries read (default: MODEL_DIR)")
    parser.add_argument("model")
    parser.add_argument("dtype", choices=["f32", "bf16", "int8", "int8-packed"])
    parser.add_argument("binaries", nargs="+")
    args = parser.parse_args()

    machine = peaks()
    _, ops = weight_bytes(args.model, args.dtype)
    model = args.dir or args.model

    def peak() -> float:
        return machine(f"--{args.peak}-only", "--threads", str(args.threads), "--rounds", "2")

    def prefill(binary: str) -> float:
        return crate_run(binary, model, 1)["prefill_tok_s"]

    map_as_crates(model, lambda: prefill(args.binaries[0]))

    label = {"fma": "FMA", "amx": "AMX bf16"}[args.peak]
    print(f"{ops / 1e6:.1f} MFLOP per prefill token, 128 prompt ids, {args.threads} threads")
    peaks_seen = []
    shares: dict[str, list[float]] = {b: [] for b in args.binaries}
    speeds: dict[str, list[float]] = {b: [] for b in args.binaries}
    for round, (measured, tok_s) in enumerate(alternate(args.rounds, args.binaries, peak, prefill)):
        gflop_s = bracket(measured)
        peaks_seen.append(gflop_s)
        line = f"  round {round + 1}: {label} peak {measured[0]:7.1f} then {measured[1]:7.1f} GFLOP/s"
        for b in args.binaries:
            rate = tok_s[b] * ops / 1e9
            shares[b].append(rate / gflop_s)
            speeds[b].append(tok_s[b])
            line += f"; {name(b)} {tok_s[b]:7.1f} tok/s, {rate:6.1f} GFLOP/s, {100 * rate / gflop_s:5.1f}% of the peak"
        print(line)

    print(f"{label} peak GFLOP/s {summary(peaks_seen, digits=1)}")
    for b in args.binaries:
        share = summary(shares[b], 100, 1)
        print(f"{name(b):40s} prefill tok/s {summary(speeds[b], digits=1)}   % of the {label} peak, per round: {share}")


if __name__ == "__main__":
    main()
