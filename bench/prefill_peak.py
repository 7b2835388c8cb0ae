#!/usr/bin/env python3
"""A generated LLaMA crate's prefill against the machine's FMA peak, both measured round by round.

The goal of issue "Fast CPU kernels" for an f32 prefill is at least 60% of the FMA peak measured
in the same run. On a shared, noisy machine that peak moves by a tenth or more from one minute
to the next (bench/RESULTS.md): a peak measured once, before or after a series of runs, says
little about any one of them. Each round here measures both, one right after the other (every
other round in the reverse order): the FMA peak at the crate's thread count (bench/peaks,
`--fma-only`: AVX-512 where the CPU has it, else AVX2) and one fresh process of each binary,
which reads the prompt's 128 ids (the same as bench/ab.py's and bench/llama_vs_candle.sh's) and
generates one token. It prints per round the prefill's rate (its tok/s times the operations of a
prefill token, bench/weight_bytes.py) over that round's peak, then their median and range over
the rounds.

The rate is that of the first prefill of a fresh process, which the crate's `--json` reports,
as bench/llama_vs_candle.sh measures it: it pays for the process's first touches of memory (the
KV cache's pages), which later prefills of the same process do not.

Each binary is a release build of a crate generated for the model's shapes. Before the rounds,
the model file leaves the page cache and the first binary reads it back once, in the 2 MiB
folios that a crate asks for (as bench/floor.py does). Keep the machine otherwise idle.

Usage: bench/prefill_peak.py [--rounds R] [--threads T] MODEL_DIR DTYPE BINARY...
       (DTYPE as the crate holds the weights, as bench/weight_bytes.py takes it; MODEL_DIR the
       checkpoint, or with --dir a directory the crate reads instead, such as one it saved)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from weight_bytes import weight_bytes  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def name(binary: str) -> str:
    return binary.rsplit("/", 1)[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dir", help="the model directory the binaries read (default: MODEL_DIR)")
    parser.add_argument("model")
    parser.add_argument("dtype", choices=["f32", "bf16", "int8", "int8-packed"])
    parser.add_argument("binaries", nargs="+")
    args = parser.parse_args()

    target = os.path.join(ROOT, "target", "bench-peaks")
    subprocess.run(
        ["cargo", "build", "-q", "--release", "--manifest-path", os.path.join(ROOT, "bench/peaks/Cargo.toml")],
        check=True,
        env=os.environ | {"CARGO_TARGET_DIR": target},
    )
    peaks = os.path.join(target, "release", "monogen-peaks")
    _, ops = weight_bytes(args.model, args.dtype)
    model = args.dir or args.model
    ids = ",".join(str(1 + (i * 7919) % 31000) for i in range(128))

    def peak() -> float:
        command = [peaks, "--fma-only", "--json", "--threads", str(args.threads), "--rounds", "2"]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        return next(iter(json.loads(out).values()))

    def prefill(binary: str) -> float:
        command = [binary, "--model", model, "--prompt-ids", ids, "--max-tokens", "1", "--json"]
        run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"{name(binary)} --model {model} failed (exit status {run.returncode}):\n{run.stderr}")
        return json.loads(run.stdout)["prefill_tok_s"]

    # The file out of the page cache, then back in as the crates map it.
    weights = os.path.join(model, "model.safetensors")
    fd = os.open(weights, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    prefill(args.binaries[0])

    print(f"{ops / 1e6:.1f} MFLOP per prefill token, 128 prompt ids, {args.threads} threads")
    peaks_seen = []
    shares: dict[str, list[float]] = {b: [] for b in args.binaries}
    speeds: dict[str, list[float]] = {b: [] for b in args.binaries}
    for round in range(args.rounds):
        # The peak first in even rounds and last in odd ones, the binaries in turn.
        order = args.binaries if round % 2 == 0 else args.binaries[::-1]
        if round % 2 == 0:
            gflop_s = peak()
            tok_s = {b: prefill(b) for b in order}
        else:
            tok_s = {b: prefill(b) for b in order}
            gflop_s = peak()
        peaks_seen.append(gflop_s)
        line = f"  round {round + 1}: FMA peak {gflop_s:7.1f} GFLOP/s"
        for b in args.binaries:
            rate = tok_s[b] * ops / 1e9
            shares[b].append(rate / gflop_s)
            speeds[b].append(tok_s[b])
            line += f"; {name(b)} {tok_s[b]:7.1f} tok/s, {rate:6.1f} GFLOP/s, {100 * rate / gflop_s:5.1f}% of the peak"
        print(line)

    def summary(values: list[float], scale: float = 1.0) -> str:
        return f"{scale * statistics.median(values):.1f} [{scale * min(values):.1f}-{scale * max(values):.1f}]"

    print(f"FMA peak GFLOP/s {summary(peaks_seen)}")
    for b in args.binaries:
        print(f"{name(b):40s} prefill tok/s {summary(speeds[b])}   % of the FMA peak, per round: {summary(shares[b], 100)}")


if __name__ == "__main__":
    main()
