#!/usr/bin/env python3
"""One-time migration (2026-12-05): interfaces generic over element type.

Before it, every element type doubled an interface: `matmul_bf16`, `matmul_bf16_bf16` and
`matmul_q8` beside `matmul`; `attention_decode_bf16`, `attention_prefill_bf16` and
`kv_cache_bf16` beside theirs. After it there is one interface of each, and an implementation
declares the element types it takes (`elements = { weights = "bf16", activations = "f32" }`).

This script moved the implementations into their interface's folder (a prefix naming the
element type keeps the names unique), rewrote the kernel sources by a fixed list of textual
substitutions (the entry function's name, assert messages and comments: nothing a compiled
kernel does changes), and carried the measurements in rankings/ over under the new names.

A record is re-keyed (its `source_sha256` set to the new source's hash) only where it was
fresh for the old source: the old and new sources differ by the substitutions alone, which
is what `--check REV` verifies against the tree at git revision REV. Stale records stay stale.

    python3 tools/migrations/2026-12-05-element-types.py migrate   # done once, at 2026-12-05
    python3 tools/migrations/2026-12-05-element-types.py locks     # the locks alone (part of migrate)
    python3 tools/migrations/2026-12-05-element-types.py --check 300b66e1   # the revision before it

The committed locks were carried over too (`locks`), so that each crate's choices stayed the
incumbents of their interfaces when the crates were generated again.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
IMPL = os.path.join(ROOT, "implementations")

# old interface -> (new interface, name prefix, elements)
MOVES = {
    "matmul": ("matmul", "", {"weights": "f32", "activations": "f32"}),
    "matmul_bf16": ("matmul", "bf16-", {"weights": "bf16", "activations": "f32"}),
    "matmul_bf16_bf16": ("matmul", "bf16act-", {"weights": "bf16", "activations": "bf16"}),
    "matmul_q8": ("matmul", "q8-", {"weights": "int8", "activations": "f32"}),
    "attention_decode": ("attention_decode", "", {"kv": "f32"}),
    "attention_decode_bf16": ("attention_decode", "bf16-", {"kv": "bf16"}),
    "attention_prefill": ("attention_prefill", "", {"kv": "f32"}),
    "attention_prefill_bf16": ("attention_prefill", "bf16-", {"kv": "bf16"}),
    "kv_cache": ("kv_cache", "", {"kv": "f32"}),
    "kv_cache_bf16": ("kv_cache", "bf16-", {"kv": "bf16"}),
}


def new_name(old_interface, name):
    interface, prefix, _ = MOVES[old_interface]
    if name.startswith(prefix):  # kv_cache_bf16/bf16-contiguous
        return interface, name
    return interface, prefix + name


# Applied in order to every .rs file under implementations/.
SUBSTITUTIONS = [
    # Paths of implementations, in comments.
    ("kv_cache_bf16/bf16-contiguous", "kv_cache/bf16-contiguous"),
    ("matmul_bf16_bf16/", "matmul/bf16act-"),
    ("matmul_bf16/", "matmul/bf16-"),
    ("matmul_q8/", "matmul/q8-"),
    ("attention_decode_bf16/", "attention_decode/bf16-"),
    ("attention_prefill_bf16/", "attention_prefill/bf16-"),
    ("kv_cache_bf16/", "kv_cache/bf16-"),
    # The entry functions: one name per interface.
    ("pub fn matmul_bf16_bf16<", "pub fn matmul<"),
    ("pub fn matmul_bf16<", "pub fn matmul<"),
    ("pub fn matmul_q8<", "pub fn matmul<"),
    ("pub fn attention_decode_bf16<", "pub fn attention_decode<"),
    ("pub fn attention_prefill_bf16<", "pub fn attention_prefill<"),
    # Assert messages name the interface.
    ('"matmul_bf16_bf16:', '"matmul:'),
    ('"matmul_bf16:', '"matmul:'),
    ('"matmul_q8:', '"matmul:'),
    # Comments name an interface at an element type as `interface<element>`.
    ("`matmul_bf16_bf16`", "`matmul<bf16act>`"),
    ("`matmul_bf16`", "`matmul<bf16>`"),
    ("`matmul_q8`", "`matmul<q8>`"),
    ("`attention_decode_bf16`", "`attention_decode<bf16>`"),
    ("`attention_prefill_bf16`", "`attention_prefill<bf16>`"),
    ("`kv_cache_bf16`", "`kv_cache<bf16>`"),
]


def substitute(text):
    for old, new in SUBSTITUTIONS:
        text = text.replace(old, new)
    return text


def sha(data):
    return hashlib.sha256(data).hexdigest()


def read_manifest_shared(path):
    text = open(path, encoding="utf-8").read()
    m = re.search(r"^shared\s*=\s*\[(.*?)\]", text, re.M | re.S)
    return re.findall(r'"([^"]+)"', m.group(1)) if m else []


def measured_hashes(read):
    """(interface, name) -> the hash a record keeps (rankings::measured_source_sha256)."""
    shared = {}
    for f in sorted(os.listdir(os.path.join(IMPL, "_shared"))):
        if f.endswith(".rs"):
            shared[f[:-3]] = sha(read(os.path.join("_shared", f)))
    out = {}
    for interface in sorted(os.listdir(IMPL)):
        if interface == "_shared" or not os.path.isdir(os.path.join(IMPL, interface)):
            continue
        for name in sorted(os.listdir(os.path.join(IMPL, interface))):
            rel = os.path.join(interface, name)
            text = "kernel %s\n" % sha(read(os.path.join(rel, "kernel.rs")))
            for module in read_manifest_shared(os.path.join(IMPL, rel, "manifest.toml")):
                text += "shared %s %s\n" % (module, shared.get(module, "missing"))
            out[(interface, name)] = sha(text.encode())
    return out


def read_worktree(rel):
    return open(os.path.join(IMPL, rel), "rb").read()


def move_implementations():
    for old_interface, (interface, _, elements) in MOVES.items():
        folder = os.path.join(IMPL, old_interface)
        for name in sorted(os.listdir(folder)):
            _, name2 = new_name(old_interface, name)
            src = os.path.join(folder, name)
            dst = os.path.join(IMPL, interface, name2)
            if src != dst:
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.move(src, dst)
            manifest = os.path.join(dst, "manifest.toml")
            text = open(manifest, encoding="utf-8").read()
            text = re.sub(r'^interface = ".*"$', 'interface = "%s"' % interface, text, count=1, flags=re.M)
            text = re.sub(r'^name = ".*"$', 'name = "%s"' % name2, text, count=1, flags=re.M)
            m = re.search(r"^shadows = \[(.*)\]$", text, re.M)
            if m and m.group(1).strip():
                shadows = [new_name(old_interface, s)[1] for s in re.findall(r'"([^"]+)"', m.group(1))]
                text = text.replace(m.group(0), "shadows = [%s]" % ", ".join('"%s"' % s for s in shadows))
            table = ", ".join('%s = "%s"' % kv for kv in elements.items())
            # The element types go after the fields of the implementation, before [constraints].
            text = re.sub(r"^\[constraints\]", "elements = { %s }\n\n[constraints]" % table, text, count=1, flags=re.M)
            assert "elements = {" in text, manifest
            open(manifest, "w", encoding="utf-8").write(text)
        if old_interface != interface:
            os.rmdir(folder)


def rewrite_sources():
    for dirpath, _, files in os.walk(IMPL):
        for f in files:
            if f.endswith(".rs"):
                path = os.path.join(dirpath, f)
                text = open(path, encoding="utf-8").read()
                new = substitute(text)
                if new != text:
                    open(path, "w", encoding="utf-8").write(new)


HEADER = (
    "# Measurements of `{interface}` implementations on hardware class `{klass}`, written by\n"
    "# `monogen bench`. One record per implementation and shape signature; a record whose key\n"
    "# (version, source, shapes, machine, toolchain, build flags) no longer matches is stale.\n"
    "# docs/rankings.md explains the fields and the rule that ranks them.\n\n"
)


def rewrite_rankings(old_hashes, new_hashes):
    rankings = os.path.join(ROOT, "rankings")
    rekeyed = kept = 0
    for klass in sorted(os.listdir(rankings)):
        merged = {}
        for f in sorted(os.listdir(os.path.join(rankings, klass))):
            old_interface = f[:-5]
            path = os.path.join(rankings, klass, f)
            text = open(path, encoding="utf-8").read()
            blocks = text.split("[[record]]\n")[1:]
            for block in blocks:
                name = re.search(r'^implementation = "(.*)"$', block, re.M).group(1)
                source = re.search(r'^source_sha256 = "(.*)"$', block, re.M).group(1)
                if old_interface in MOVES:
                    interface, name2 = new_name(old_interface, name)
                else:
                    interface, name2 = old_interface, name
                block = block.replace('implementation = "%s"' % name, 'implementation = "%s"' % name2, 1)
                if old_hashes.get((old_interface, name)) == source and (interface, name2) in new_hashes:
                    block = block.replace(source, new_hashes[(interface, name2)], 1)
                    rekeyed += 1
                else:
                    kept += 1
                shapes = re.search(r'^shapes = "(.*)"$', block, re.M).group(1)
                merged.setdefault(interface, []).append((shapes, name2, block))
            os.remove(path)
        for interface, records in merged.items():
            records.sort(key=lambda r: (r[0], r[1]))
            body = "\n".join("[[record]]\n" + b.rstrip("\n") + "\n" for _, _, b in records)
            with open(os.path.join(rankings, klass, interface + ".toml"), "w", encoding="utf-8") as out:
                out.write(HEADER.format(interface=interface, klass=klass) + body)
    print("rankings: %d records re-keyed (fresh before), %d kept as they were (already stale)" % (rekeyed, kept))


def rewrite_locks():
    """The committed crates' monogen.lock under the new names, so that each choice stays the
    incumbent of its interface when the crates are generated again."""
    generated = os.path.join(ROOT, "generated")
    for crate in sorted(os.listdir(generated)):
        path = os.path.join(generated, crate, "monogen.lock")
        if not os.path.isfile(path):
            continue
        text = open(path, encoding="utf-8").read()

        def rename(m):
            old_interface, name = m.group(1), m.group(2)
            if old_interface not in MOVES:
                return m.group(0)
            interface, name2 = new_name(old_interface, name)
            return 'interface = "%s"\nimplementation = "%s"' % (interface, name2)

        new = re.sub(r'^interface = "(.*)"\nimplementation = "(.*)"$', rename, text, flags=re.M)
        if new != text:
            open(path, "w", encoding="utf-8").write(new)


def check(revision):
    """Every kernel and shared module equals the one at `revision` with the substitutions applied."""
    listing = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", revision, "implementations"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.split()
    checked = 0
    for path in listing:
        if not path.endswith(".rs"):
            continue
        old = subprocess.run(["git", "show", "%s:%s" % (revision, path)], cwd=ROOT, check=True,
                             capture_output=True).stdout.decode("utf-8")
        parts = path.split("/")
        if parts[1] != "_shared" and parts[1] in MOVES:
            interface, name = new_name(parts[1], parts[2])
            parts = [parts[0], interface, name] + parts[3:]
        new = open(os.path.join(ROOT, *parts), encoding="utf-8").read()
        assert new == substitute(old), "%s differs from %s:%s beyond the substitutions" % ("/".join(parts), revision, path)
        checked += 1
    print("%d sources equal their old text with the substitutions applied" % checked)


def main():
    if sys.argv[1:2] == ["--check"]:
        check(sys.argv[2])
    elif sys.argv[1:] == ["migrate"]:
        old = measured_hashes(read_worktree)
        move_implementations()
        rewrite_sources()
        new = measured_hashes(read_worktree)
        rewrite_rankings(old, new)
        rewrite_locks()
    elif sys.argv[1:] == ["locks"]:
        rewrite_locks()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
