#!/usr/bin/env python3
"""One-time migration (2026-12-06): the team's jobs are the shared modules' work types, and an
int8 matmul takes its weights as one pair.

Before it, 18 threaded kernels wrapped the work type of their shared module in a job of their
own (`pub(crate) struct Shared(Product<W>)` and an `impl Job` that forwarded every method to it),
the 4 over `_shared/amx_bf16.rs` named theirs by an alias (`pub(crate) type Shared =
Amx<Exact>`), and `Job` asked for `n`, `granule` and `work` one method each. After it:
- `Job` lives in `_shared/job.rs`, which depends on nothing, and asks for one `extent()` (the
  columns, the granule and the work); `team.rs` re-exports it;
- each shared module implements it for its work type once (`avx512_matmul::Product<W>`, ...),
  and a kernel's manifest names that type as its `team_job`
  (`team_job = "avx512_matmul::Product<W>"`), which the generated `TeamJob` enum holds;
- every manifest whose shared modules use `job` lists it.
And `matmul<q8>` takes `w: (&[i8], &[f32])`, the values and their scales, where it took
`w: &[i8], scales: &[f32]`: one weights parameter at every element type, the kernels taking the
pair apart on their first line.

What the candidates run is unchanged. `OLD_GENERATOR=1 bench/same_harness.sh 7eb60256 ...` (the
eleven measured workloads; see bench/RESULTS.md) compiled every candidate's kernels, old and
new, to the same functions; what differs is the number of the `TeamJob` variant that
`team::run` stores (kernels that hand the team the same type now share one), and the order of a
compare-and-branch and one register move in the passes around the AVX-512 decode attention's
call to the team. (`matmul/q8-scalar` keeps its old body in a private function, which compiles
as it did.) The committed crates, which differ more in register choices, were timed end to end
against 7eb60256's: within noise (bench/RESULTS.md).

So the records carry over: `migrate REV` gives each record that was fresh for the sources at
git revision REV (the kernel, its manifest's shared modules) the hash of the working tree's.

    python3 tools/migrations/2026-12-06-team-jobs.py migrate 7eb60256   # done once, 2026-12-06
    python3 tools/migrations/2026-12-06-team-jobs.py migrate 092b8710   # done once, after it

The second run carried the records over a review's edits to the same sources (comments, a
`debug_assert!`, the product granule named `job::GRANULE`), after `bench/same_harness.sh
092b8710` (the same eleven workloads) found every function of every harness the same.
"""

import hashlib
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
IMPL = os.path.join(ROOT, "implementations")


def sha(data):
    return hashlib.sha256(data).hexdigest()


def git_show(revision, path):
    return subprocess.run(["git", "show", "%s:%s" % (revision, path)], cwd=ROOT, check=True,
                          capture_output=True).stdout


def now(path):
    return open(os.path.join(ROOT, path), "rb").read()


def shared_of(manifest):
    m = re.search(r'^shared = \[(.*)\]$', manifest.decode(), re.M)
    return re.findall(r'"([^"]+)"', m.group(1)) if m else []


def hashes(read):
    """(interface, name) -> rankings::measured_source_sha256, of the files `read` gives."""
    out = {}
    for interface in sorted(os.listdir(IMPL)):
        if interface == "_shared" or not os.path.isdir(os.path.join(IMPL, interface)):
            continue
        for name in sorted(os.listdir(os.path.join(IMPL, interface))):
            folder = "implementations/%s/%s/" % (interface, name)
            text = "kernel %s\n" % sha(read(folder + "kernel.rs"))
            for module in shared_of(read(folder + "manifest.toml")):
                text += "shared %s %s\n" % (module, sha(read("implementations/_shared/%s.rs" % module)))
            out[(interface, name)] = sha(text.encode())
    return out


def migrate(revision):
    before = hashes(lambda path: git_show(revision, path))
    after = hashes(now)
    rankings = os.path.join(ROOT, "rankings")
    rekeyed = 0
    for klass in sorted(os.listdir(rankings)):
        for f in sorted(os.listdir(os.path.join(rankings, klass))):
            path = os.path.join(rankings, klass, f)
            text = open(path, encoding="utf-8").read()
            head, *blocks = text.split("[[record]]\n")
            for k, block in enumerate(blocks):
                key = (f[:-5], re.search(r'^implementation = "(.*)"$', block, re.M).group(1))
                source = re.search(r'^source_sha256 = "(.*)"$', block, re.M).group(1)
                if key in before and before[key] == source and after[key] != source:
                    blocks[k] = block.replace(source, after[key], 1)
                    rekeyed += 1
            open(path, "w", encoding="utf-8").write("[[record]]\n".join([head] + blocks))
    print("rankings: %d records that were fresh at %s re-keyed" % (rekeyed, revision))


def main():
    if sys.argv[1:2] == ["migrate"] and len(sys.argv) == 3:
        migrate(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
