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
  python3 - "$dir/$name-old.asm" "$dir/$name-new.asm" "$ident" "${RENAMES:-}" <<'EOF' || status=1
import hashlib, re, sys

old_path, new_path, crate, renames = sys.argv[1:]
pairs = [r.split("=", 1) for r in renames.split(",") if r]


def functions(path, undo):
    """Function name -> the sorted hashes of the bodies of that name (monomorphized copies of
    one generic function share a name once its hash is cut)."""
    bodies, current = [], None
    for line in open(path, encoding="utf-8", errors="replace"):
        head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if head:
            name = re.sub(r"::h[0-9a-f]{16}$", "", head.group(1))
            if undo:
                for old, new in pairs:
                    name = re.sub(r"\b%s\b" % re.escape(old), new, name)
            current = [] if crate + "::" in name else None
            if current is not None:
                bodies.append((name, current))
            continue
        if current is not None and "\t" in line:
            ins = line.split("\t", 1)[1].strip()
            current.append(re.sub(r"0x[0-9a-f]+|\b[0-9a-f]{5,}\b|<[^>]*>", "_", ins))
    out = {}
    for name, body in bodies:
        out.setdefault(name, []).append(hashlib.sha256("\n".join(body).encode()).hexdigest())
    return {k: sorted(v) for k, v in out.items()}


old, new = functions(old_path, True), functions(new_path, False)
# Tokenizing the prompt and printing the text run once a request and a token, and inline the
# tokenizers crate, whose code ThinLTO places differently after unrelated edits: listed, not
# counted.
text = re.compile(r"::(tokenizer|tokenizer_file|detokenizer)::")
differ = sorted(k for k in old.keys() & new.keys() if old[k] != new[k])
only = sorted(old.keys() ^ new.keys())
hot = [k for k in differ + only if not text.search(k)]
print("%s: %d functions of the crate compared, %d differ (%d outside tokenization), %d in one build only"
      % (crate, len(old.keys() & new.keys()), len(differ), len(hot), len(only)))
for k in differ + only:
    print("  %s%s" % (k, "" if k in hot else " (tokenization)"))
sys.exit(1 if hot else 0)
EOF
done
exit $status
