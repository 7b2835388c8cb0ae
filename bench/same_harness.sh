#!/usr/bin/env bash
# Whether a change left the compiled code of every benchmark candidate as it was: writes and
# compiles the benchmark harness of each workload (`monogen bench --build-only`: every competing
# implementation of every interface, at the workload's shapes) twice with the working tree's
# monogen, once over the registry of an older revision (its interfaces/, implementations/,
# templates/, rankings/ and workloads/) and once over the working tree's, then compares the
# harnesses' kernel modules function by function (bench/compare_functions.py).
#
# Where every function matches, a candidate measures as it did, and its records may be carried
# over the change (as tools/migrations/ do) instead of measured again: this covers the
# candidates no committed crate chooses, which bench/same_code.sh (one crate's choices) cannot.
#
# With OLD_GENERATOR=1 the older revision's own monogen (built from it) writes the old harness:
# for a change to what the generator writes beside the kernels (the team's `TeamJob` enum),
# where the working tree's monogen would not compile the old kernels.
#
# Usage: bench/same_harness.sh OLD_REV WORKLOAD_NAME... (RENAMES="old=new,..." for the kernel
#   modules a change renamed, e.g. RENAMES="matmul__bf16_avx512_threads=matmul__avx512_threads").
# Scratch files go to ${SAME_DIR:-/tmp/monogen-same-harness}. Exits 1 when some function differs.
set -euo pipefail
cd "$(dirname "$0")/.."
old_rev=$1
shift
dir=${SAME_DIR:-/tmp/monogen-same-harness}
rm -rf "$dir/old"
mkdir -p "$dir/old"
git archive "$old_rev" interfaces implementations templates rankings workloads | tar -x -C "$dir/old"
cargo build --quiet -p monogen
monogen=$PWD/target/debug/monogen
old_monogen=$monogen
if [ "${OLD_GENERATOR:-}" = 1 ]; then
  rm -rf "$dir/old-generator"
  mkdir -p "$dir/old-generator"
  git archive "$old_rev" Cargo.toml Cargo.lock generator | tar -x -C "$dir/old-generator"
  # The generator alone: the workspace's other members need the committed crates.
  sed -i 's/^members = .*/members = ["generator"]/' "$dir/old-generator/Cargo.toml"
  CARGO_TARGET_DIR="$dir/target-generator" cargo build --quiet -p monogen --manifest-path "$dir/old-generator/Cargo.toml"
  old_monogen=$dir/target-generator/debug/monogen
fi
# One target folder for both trees: their harness crates' names differ by a hash of their sources.
export MONOGEN_BENCH_TARGET_DIR=$dir/target
status=0
for name in "$@"; do
  for v in old new; do
    root=$PWD
    generator=$monogen
    [ "$v" = old ] && root=$dir/old && generator=$old_monogen
    exe=$("$generator" --root "$root" bench "$root/workloads/$name.toml" --build-only)
    objdump -d --no-show-raw-insn -C "$exe" >"$dir/$name-$v.asm"
  done
  python3 bench/compare_functions.py "$dir/$name-old.asm" "$dir/$name-new.asm" --label "$name" \
    --crate '\bmonogen_bench_\w+::' --renames "${RENAMES:-}" || status=1
done
exit $status
