#!/usr/bin/env bash
# Whether a change left a committed crate's compiled code as it was: builds the crate as an older
# revision generated it and as the working tree has it (release, separate target folders), then
# compares, function by function, the instructions of the crate's own code (forward pass,
# kernels, weights, team) with addresses and hashes masked and the renames RENAMES lists undone.
# Where every function matches, the change cannot have moved the crate's speed, and no timing is
# needed; where one differs, measure (bench/ab_revisions.sh). Library code (tokenizers, std) is
# not compared, and the crate's tokenization is listed but not counted: ThinLTO's inlining of
# the tokenizers crate varies with unrelated edits, and it runs once a request, not per layer.
#
# Usage: bench/same_code.sh OLD_REV WORKLOAD_NAME... (RENAMES="old=new,old=new" for identifiers
#   a change renamed, e.g. RENAMES="matmul_bf16=matmul,kv_cache_bf16=kv_cache").
# Scratch files go to ${SAME_DIR:-/tmp/monogen-same}. Exits 1 when some function differs.
set -euo pipefail
cd "$(dirname "$0")/.."
old_rev=$1
shift
dir=${SAME_DIR:-/tmp/monogen-same}
mkdir -p "$dir"
status=0
for name in "$@"; do
  ident=${name//-/_}
  rm -rf "$dir/old" "$dir/new"
  mkdir -p "$dir/old"
  git archive "$old_rev" "generated/$name" | tar -x -C "$dir/old"
  mkdir -p "$dir/new/generated"
  cp -r "generated/$name" "$dir/new/generated/$name"
  for v in old new; do
    rm -rf "$dir/$v/generated/$name/target"
    CARGO_TARGET_DIR="$dir/target-$v" cargo build --release --quiet --manifest-path "$dir/$v/generated/$name/Cargo.toml"
    objdump -d --no-show-raw-insn -C "$dir/target-$v/release/$name" >"$dir/$name-$v.asm"
  done
  # Tokenizing the prompt and printing the text run once a request and a token, and inline the
  # tokenizers crate, whose code ThinLTO places differently after unrelated edits: listed, not
  # counted.
  python3 bench/compare_functions.py "$dir/$name-old.asm" "$dir/$name-new.asm" --label "$ident" \
    --crate "\b$ident::" --listed "::(tokenizer|tokenizer_file|detokenizer)::" --renames "${RENAMES:-}" || status=1
done
exit $status
