#!/usr/bin/env python3
"""Compares two disassemblies (objdump -d --no-show-raw-insn -C) function by function.

    compare_functions.py OLD.asm NEW.asm --crate REGEX [--label NAME] [--within REGEX]
                         [--listed REGEX] [--renames old=new,...]

Only the functions of the crate compare: those whose name matches `--crate` (a regex for the
crate's path prefix, which both names lose, so that two crates of different names compare),
and, with `--within`, whose name (after that) matches it too. Instructions compare without
what depends on where code and data lie (RIP-relative displacements, branch and call targets,
symbol references, objdump's comments) and without the padding (nops) that aligns code where it
happens to lie; constants and other operands compare as they are. `--renames`
undoes identifiers a change renamed, in the old names. A function matching `--listed` is shown
but not counted. Exits 1 when a counted function differs or is in one build only.
"""

import argparse
import hashlib
import re
import sys

p = argparse.ArgumentParser()
p.add_argument("old")
p.add_argument("new")
p.add_argument("--crate", required=True)
p.add_argument("--label", default="")
p.add_argument("--within", default="")
p.add_argument("--listed", default="")
p.add_argument("--renames", default="")
a = p.parse_args()
pairs = [r.split("=", 1) for r in a.renames.split(",") if r]
crate = re.compile(a.crate)
PADDING = re.compile(r"^((data16|cs|ds)\s+)*(nop[wl]?\b|xchg\s+%ax,%ax|int3)")


def mask(ins):
    """An instruction without what depends on where code and data lie: objdump's comment, the
    displacement of a RIP-relative operand, a branch's or call's target. Immediates and other
    displacements stay: a changed constant is a changed function."""
    ins = re.sub(r"\s*#.*$", "", ins)
    ins = re.sub(r"-?0x[0-9a-f]+\(%rip\)", "_(%rip)", ins)
    # A direct branch or call: `call 5bb92 <crate::f<T>>`, its target whole (names nest `<>`).
    ins = re.sub(r"^((?:bnd\s+|notrack\s+)?(?:j[a-z]+|call|loop[a-z]*)\s+)[0-9a-f]+(\s+<.*)?$", r"\1_", ins)
    return re.sub(r"<[^>]*>", "_", crate.sub("crate::", ins))


def functions(path, undo):
    """Function name -> the sorted hashes of the bodies of that name (monomorphized copies of
    one generic function share a name once its hash is cut)."""
    bodies, current = [], None
    for line in open(path, encoding="utf-8", errors="replace"):
        head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if head:
            name = re.sub(r"::h[0-9a-f]{16}$", "", head.group(1))
            current = None
            if crate.search(name):
                name = crate.sub("crate::", name)
                if undo:
                    for old, new in pairs:
                        name = re.sub(r"\b%s\b" % re.escape(old), new, name)
                if not a.within or re.search(a.within, name):
                    current = []
                    bodies.append((name, current))
            continue
        if current is not None and "\t" in line:
            ins = line.split("\t", 1)[1].strip()
            # Padding that aligns a loop or a function follows from where the code lies, which
            # moves with everything placed before it.
            if PADDING.match(ins):
                continue
            current.append(mask(ins))
    out = {}
    for name, body in bodies:
        out.setdefault(name, []).append(hashlib.sha256("\n".join(body).encode()).hexdigest())
    return {k: sorted(v) for k, v in out.items()}


old, new = functions(a.old, True), functions(a.new, False)
listed = re.compile(a.listed) if a.listed else None
differ = sorted(k for k in old.keys() & new.keys() if old[k] != new[k])
only = sorted(old.keys() ^ new.keys())
# A body that one build names one way and the other another (identical functions the linker
# folded into one, keeping either name) is the same code: shown, not counted.
old_only = sorted(h for k in only if k in old for h in old[k])
new_only = sorted(h for k in only if k in new for h in new[k])
folded = set(only) if old_only == new_only else set()
counted = [k for k in differ + only if not (listed and listed.search(k)) and k not in folded]
print("%s: %d functions compared, %d differ, %d in one build only (%d counted)"
      % (a.label, len(old.keys() & new.keys()), len(differ), len(only), len(counted)))
for k in differ + only:
    where = "differs" if k in differ else ("old only" if k in old else "new only")
    why = " (the same code as the other build's, under another name)" if k in folded else " (listed, not counted)"
    print("  %s: %s%s" % (k, where, "" if k in counted else why))
sys.exit(1 if counted else 0)
