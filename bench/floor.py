#!/usr/bin/env python3
"""A generated LLaMA crate's decode against its floor, both measured round by round.

The floor of a decode step is the weight bytes it reads (bench/weight_bytes.py) over the read
bandwidth of the machine at the crate's thread count, measured over a buffer of that size
(bench/peaks, `--read-only`). On a shared, noisy machine that bandwidth moves by a third from
one second to the next, so a floor measured once and a decode measured later say little about
each other. Each round here measures both, one right after the other (every other round in the
reverse order), and prints per round floor / measured (1 is the floor itself; the goal of
issue "Fast CPU kernels" is at least 0.9), then their median and range over the rounds.
Several binaries (two builds of a crate, say) run in turn within each round, against that
round's bandwidth.

Each binary is a release build of a crate generated for the model's shapes. Before the rounds,
the model file leaves the page cache and the first binary reads it back, once: a crate asks for
its mapping in huge pages before it populates it (templates/runtime/tensor_file.rs), so the
page cache then holds the file in 2 MiB folios, as bench/llama_vs_candle.sh arranges too. Left
as another reader cached it (in 4 KiB pages), a stories110M bf16 crate decoded from a mapping
only half of which was in huge pages. The bandwidth's buffer is in huge pages as well
(bench/peaks). Keep the machine otherwise idle.

Usage: bench/floor.py [--rounds R] [--threads T] [--max-tokens M] MODEL_DIR DTYPE BINARY...
       (DTYPE as the crate holds the weights: f32, bf16, int8, or int8-packed for an int8 crate
       whose matmul packs them with binary16 scales; T the crates' thread count)
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
    parser.add_argument("--max-tokens", type=int, default=64)
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
    size, _ = weight_bytes(args.model, args.dtype)
    # The same prompt ids as bench/ab.py and bench/llama_vs_candle.sh.
    ids = ",".join(str(1 + (i * 7919) % 31000) for i in range(128))

    def bandwidth() -> float:
        command = [peaks, "--read-only", "--json", "--threads", str(args.threads), "--rounds", "2", str(size)]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        return next(iter(json.loads(out).values()))

    def decode(binary: str) -> float:
        command = [binary, "--model", args.model, "--prompt-ids", ids]
        command += ["--max-tokens", str(args.max_tokens), "--json"]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        return json.loads(out)["decode_tok_s"]

    # The file out of the page cache, then back in as the crates map it.
    weights = os.path.join(args.model, "model.safetensors")
    fd = os.open(weights, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    decode(args.binaries[0])

    print(f"{size / 1e6:.1f} MB of weights per token, {args.threads} threads, {args.max_tokens} new tokens")
    bandwidths = []
    ratios: dict[str, list[float]] = {b: [] for b in args.binaries}
    speeds: dict[str, list[float]] = {b: [] for b in args.binaries}
    for round in range(args.rounds):
        # The bandwidth first in even rounds and last in odd ones, the binaries in turn.
        order = args.binaries if round % 2 == 0 else args.binaries[::-1]
        if round % 2 == 0:
            gb_s = bandwidth()
            tok_s = {b: decode(b) for b in order}
        else:
            tok_s = {b: decode(b) for b in order}
            gb_s = bandwidth()
        floor_ms = size / (gb_s * 1e9) * 1e3
        bandwidths.append(gb_s)
        line = f"  round {round + 1}: read {gb_s:6.2f} GB/s, floor {floor_ms:7.2f} ms"
        for b in args.binaries:
            ratio = floor_ms * tok_s[b] / 1e3
            ratios[b].append(ratio)
            speeds[b].append(tok_s[b])
            line += f"; {name(b)} {tok_s[b]:8.2f} tok/s, floor / measured {ratio:.3f}"
        print(line)

    def summary(values: list[float]) -> str:
        return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"

    print(f"read GB/s {summary(bandwidths)}")
    for b in args.binaries:
        print(f"{name(b):40s} decode tok/s {summary(speeds[b])}   floor / measured, per round: {summary(ratios[b])}")


if __name__ == "__main__":
    main()
