"""Round-by-round measurement of generated crates beside a limit of the machine.

On a shared, noisy machine the limits a crate is judged against (the read bandwidth, the FMA
peak) move by a tenth to a third from one minute to the next, so a limit measured once and a
crate measured later say little about each other. bench/floor.py and bench/prefill_peak.py
run the crates between two measurements of the limit in every round, with what this module
gives them: `peaks` (bench/peaks, built), `crate_run` (one fresh process of a crate's binary on
the prompt ids that bench/ab.py and bench/llama_vs_candle.sh use), `map_as_crates` (the model
file read back as the crates map it), `alternate` (the rounds) and `bracket` (a round's limit).
"""

import json
import os
import statistics
import subprocess
import sys
from typing import Callable, Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The same prompt ids as bench/ab.py and bench/llama_vs_candle.sh.
IDS = ",".join(str(1 + (i * 7919) % 31000) for i in range(128))


def name(binary: str) -> str:
    return binary.rsplit("/", 1)[-1]


def peaks() -> Callable[..., float]:
    """Builds bench/peaks and returns a function that runs it with the given arguments (and
    `--json`) and returns its one figure."""
    target = os.path.join(ROOT, "target", "bench-peaks")
    subprocess.run(
        ["cargo", "build", "-q", "--release", "--manifest-path", os.path.join(ROOT, "bench/peaks/Cargo.toml")],
        check=True,
        env=os.environ | {"CARGO_TARGET_DIR": target},
    )
    binary = os.path.join(target, "release", "monogen-peaks")

    def run(*args: str) -> float:
        out = subprocess.run([binary, "--json", *args], capture_output=True, text=True, check=True).stdout
        return next(iter(json.loads(out).values()))

    return run


def crate_run(binary: str, model: str, max_tokens: int) -> dict:
    """One fresh process of `binary` on `model` with the prompt ids: its `--json` report. Exits
    with the binary's own error if it fails (a directory saved for another kernel, say)."""
    command = [binary, "--model", model, "--prompt-ids", IDS, "--max-tokens", str(max_tokens), "--json"]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{name(binary)} --model {model} failed (exit status {run.returncode}):\n{run.stderr}")
    return json.loads(run.stdout)


def map_as_crates(model: str, first_run: Callable[[], object]) -> None:
    """The model file out of the page cache, then `first_run` reads it back: a crate asks for its
    mapping in huge pages before it populates it (templates/runtime/tensor_file.rs), so the page
    cache then holds the file in 2 MiB folios, as bench/llama_vs_candle.sh arranges too. Left as
    another reader cached it (in 4 KiB pages), a stories110M bf16 crate decoded from a mapping
    only half of which was in huge pages."""
    fd = os.open(os.path.join(model, "model.safetensors"), os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    first_run()


def alternate(
    rounds: int, binaries: list[str], limit: Callable[[], float], run: Callable[[str], float]
) -> Iterator[tuple[tuple[float, float], dict[str, float]]]:
    """`rounds` rounds, each yielded as it ends: the machine's `limit` measured right before and
    right after the round, and one `run` of every binary in turn between them (in reverse order
    in odd rounds). The limit after a round is the one before the next, so R rounds take R + 1
    measurements of it.

    A round's runs are judged against both of its limits (their geometric mean, `bracket`):
    the machine's phase moves within seconds, and a run of several seconds (a TinyLlama decode,
    after its load and prefill) drifts from a limit measured on one side of it only. On an AMD
    EPYC (Zen 3, 2 threads) the read bandwidth moved from 21.7 to 30.0 GB/s between two
    consecutive rounds (bench/RESULTS.md)."""
    before = limit()
    for round in range(rounds):
        order = binaries if round % 2 == 0 else binaries[::-1]
        speeds = {b: run(b) for b in order}
        after = limit()
        yield (before, after), speeds
        before = after


def bracket(limits: tuple[float, float]) -> float:
    """A round's limit: the geometric mean of the measurements before and after it."""
    return (limits[0] * limits[1]) ** 0.5


def summary(values: list[float], scale: float = 1.0, digits: int = 3) -> str:
    """The median and the range."""
    low, mid, high = (scale * v for v in (min(values), statistics.median(values), max(values)))
    return f"{mid:.{digits}f} [{low:.{digits}f}-{high:.{digits}f}]"
