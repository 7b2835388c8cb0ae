#!/usr/bin/env bash
# Old against new: a committed crate as an older revision generated it and as the working tree
# has it, built in release into one target folder (the old one renamed `<name>-old`), run in
# alternation by bench/ab.py on a synthetic model of the workload's shapes.
#
# Usage: bench/ab_revisions.sh OLD_REV ROUNDS WORKLOAD_NAME...
#   e.g. bench/ab_revisions.sh 229c29f0 6 stories110m-bench-cpu-f32 stories110m-bench-cpu-bf16
# Scratch files go to ${AB_DIR:-/tmp/monogen-ab}. BATCH=N decodes N copies of the prompt as one
# batch (a batching crate's `--batch`).
set -euo pipefail
cd "$(dirname "$0")/.."
old_rev=$1
rounds=$2
shift 2
dir=${AB_DIR:-/tmp/monogen-ab}
mkdir -p "$dir/crates"
cargo build --quiet -p monogen
for name in "$@"; do
  ident=${name//-/_}
  rm -rf "$dir/crates/$name-old" "$dir/crates/$name-new" "$dir/crates/generated"
  git archive "$old_rev" "generated/$name" | tar -x -C "$dir/crates"
  mv "$dir/crates/generated/$name" "$dir/crates/$name-old"
  sed -i "s/^name = \"$name\"/name = \"$name-old\"/" "$dir/crates/$name-old/Cargo.toml"
  sed -i "s/\b$ident::/${ident}_old::/g" "$dir/crates/$name-old/src/main.rs"
  cp -r "generated/$name" "$dir/crates/$name-new"
  rm -rf "$dir/crates/$name-new/target"
  for v in old new; do
    CARGO_TARGET_DIR="$dir/target" cargo build --release --quiet --manifest-path "$dir/crates/$name-$v/Cargo.toml"
  done
  [ -d "$dir/model-$name" ] || target/debug/monogen synth-weights "workloads/$name.toml" --out "$dir/model-$name"
  echo "== $name: $old_rev against the working tree"
  python3 bench/ab.py --rounds "$rounds" --max-tokens 32 --batch "${BATCH:-1}" "$dir/model-$name" \
    "$dir/target/release/$name-old" "$dir/target/release/$name"
done
