#!/usr/bin/env python3
"""One-time migration (2026-12-06): one folder for kernels that differ only in element type.

Before it, six attention implementations had a twin for the bfloat16 KV cache whose kernel.rs
differed from theirs only in `f32` against `u16` (and in comments): `attention_decode/`
`bf16-avx2-fma-threads`, `bf16-avx512-threads` and `bf16-scalar`, and `attention_prefill/`
`bf16-avx2-fma-threads`, `bf16-avx512-flash-threads` and `bf16-scalar`. After it, each pair is
one folder whose manifest declares both element types (`elements = [{ kv = "f32" }, { kv =
"bf16" }]`) and whose kernel names the cache's type by the interface's placeholder, `KV`;
the generator compiles it once per element type with `pub type KV = u16;` (or `f32`) added.

The merged kernels were written by hand (the f32 kernel, its `f32` cache types made `KV`, its
comments made to speak of both). `--check REV` verifies that each, with `KV` read as `f32`
and as `u16`, has the code (every line that is not a comment) of the two kernels it replaces
at git revision REV: what a crate compiles at either element type is what it compiled before.

`migrate` does the rest, once:
- the manifests: the f32 one's, with both element types, the twin's CPU features beyond its
  own as `[constraints.element_cpu_features]`, and the higher of the two versions (the
  priorities keep their order within each element type);
- the twins' folders go, and the interfaces' bf16 references become the merged `scalar`;
- rankings/: a record of a merged implementation now names its element type (`element =
  "bf16"`), the twin's records take the merged name, and a record that was fresh for its old
  kernel gets the merged kernel's hash and version (stale ones stay stale);
- the committed locks name the merged implementations.

    python3 tools/migrations/2026-12-06-several-elements.py migrate        # done once, 2026-12-06
    python3 tools/migrations/2026-12-06-several-elements.py comments REV   # done once, after it
    python3 tools/migrations/2026-12-06-several-elements.py migrate matmul # done once, after that
    python3 tools/migrations/2026-12-06-several-elements.py --check REV matmul
    python3 tools/migrations/2026-12-06-several-elements.py migrate kv_cache   # done once, last

The third set, `kv_cache`, made the cache's two references one folder of a new name,
`kv_cache/contiguous`, whose store is its element type's (`_shared/kv_store.rs`: a copy, or a
rounding loop). Its code is not the old kernels' in text, so there is no `--check` for it:
`bench/same_harness.sh` showed that every harness compiles to what it did.

The second set, `matmul`, merged three matmul kernels whose bf16-weight twin differed in `u16`
alone (`avx2-fma-team` and `bf16-avx2-fma-threads`, `avx512` and `bf16-avx512`,
`avx512-threads` and `bf16-avx512-threads`); the merged kernel names the weights' type `W`.
The merged `avx2-fma-team` keeps its priority (32; its twin had 20): among the bf16 kernels it
stays above `bf16-avx2-packed-threads` (19) and below the AVX-512 ones that shadow it.

`comments REV` carried the records over a change of comments alone: two shared modules'
documentation named the twins (after the attention merge), and two KV cache kernels' named the
old references (after the kv_cache merge). It verifies that every kernel and shared module has the code
it had at REV, then gives each record that was fresh for the tree at REV the current hash.
    python3 tools/migrations/2026-12-06-several-elements.py --check 11cd9a47   # the revision before it
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
IMPL = os.path.join(ROOT, "implementations")

# The merges, in two sets done one after the other: (interface, merged name, bf16 twin), the
# placeholder the merged kernel names its type by, how the old kernels spelled that type at
# each element type, and the manifests' `elements` before and after.
SETS = {
    "attention": {
        "merges": [
            ("attention_decode", "avx2-fma-threads", "bf16-avx2-fma-threads"),
            ("attention_decode", "avx512-threads", "bf16-avx512-threads"),
            ("attention_decode", "scalar", "bf16-scalar"),
            ("attention_prefill", "avx2-fma-threads", "bf16-avx2-fma-threads"),
            ("attention_prefill", "avx512-flash-threads", "bf16-avx512-flash-threads"),
            ("attention_prefill", "scalar", "bf16-scalar"),
        ],
        "as": {"f32": [("KV", "f32"), ("Flash<f32>", "Flash")], "bf16": [("KV", "u16")]},
        "elements": ('elements = { kv = "f32" }', 'elements = [{ kv = "f32" }, { kv = "bf16" }]'),
    },
    # The KV cache's references, whose stores differed too (a copy, or a rounding loop): one
    # kernel whose store is its element type's (`_shared/kv_store.rs`), in a folder of a new
    # name. Its code is not the old kernels' in text; bench/same_harness.sh showed it compiles
    # to theirs.
    "kv_cache": {
        "merges": [("kv_cache", "contiguous", "bf16-contiguous")],
        "f32_old": {"contiguous": "f32-contiguous"},
        "as": {},
        "elements": None,
    },
    # bf16 weights beside f32 ones: the kernels whose bf16 twin differed in `u16` alone.
    "matmul": {
        "merges": [
            ("matmul", "avx2-fma-team", "bf16-avx2-fma-threads"),
            ("matmul", "avx512", "bf16-avx512"),
            ("matmul", "avx512-threads", "bf16-avx512-threads"),
        ],
        "as": {"f32": [("W", "f32")], "bf16": [("W", "u16")]},
        "elements": (
            'elements = { weights = "f32", activations = "f32" }',
            'elements = [{ weights = "f32", activations = "f32" }, { weights = "bf16", activations = "f32" }]',
        ),
    },
}


def use_set(name):
    global MERGES, RENAMED, ELEMENT_OF, AS, ELEMENTS
    MERGES = SETS[name]["merges"]
    # (interface, old name) -> the merged name, and the element type its records were of.
    RENAMED = {(i, twin): merged for i, merged, twin in MERGES}
    ELEMENT_OF = {(i, twin): "bf16" for i, _, twin in MERGES}
    for i, merged, _ in MERGES:
        old = SETS[name].get("f32_old", {}).get(merged, merged)
        RENAMED[(i, old)] = merged
        ELEMENT_OF[(i, old)] = "f32"
    AS = SETS[name]["as"]
    ELEMENTS = SETS[name]["elements"]


use_set("attention")


def sha(data):
    return hashlib.sha256(data).hexdigest()


def code(text):
    """The lines that are not comments, stripped, without blank ones."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("//"):
            out.append(line)
    return out


def git_show(revision, path):
    return subprocess.run(["git", "show", "%s:%s" % (revision, path)], cwd=ROOT, check=True,
                          capture_output=True).stdout.decode("utf-8")


def check(revision):
    checked = 0
    for interface, merged, twin in MERGES:
        new = open(os.path.join(IMPL, interface, merged, "kernel.rs"), encoding="utf-8").read()
        for element, old_name in (("f32", merged), ("bf16", twin)):
            text = new
            for a, b in AS[element]:
                text = re.sub(r"\b%s(?!\w)" % re.escape(a), b, text)
            old = git_show(revision, "implementations/%s/%s/kernel.rs" % (interface, old_name))
            # The old kernels wrapped their signatures' comments differently; code alone counts.
            assert code(text) == code(old), "%s/%s as %s differs from %s:%s/%s in code" % (
                interface, merged, element, revision, interface, old_name)
            checked += 1
    print("%d kernels: the merged kernel at their element type has their code" % checked)


def read_manifest(path):
    return open(path, encoding="utf-8").read()


def field(text, key):
    m = re.search(r'^%s = (.*)$' % key, text, re.M)
    return m.group(1) if m else None


def list_field(text, key):
    value = field(text, key) or "[]"
    return re.findall(r'"([^"]+)"', value)


def version_key(v):
    return tuple(int(x) for x in v.strip('"').split("."))


def measured_hash(interface, name):
    """rankings::measured_source_sha256 of the folder as it is now."""
    folder = os.path.join(IMPL, interface, name)
    text = "kernel %s\n" % sha(open(os.path.join(folder, "kernel.rs"), "rb").read())
    for module in list_field(read_manifest(os.path.join(folder, "manifest.toml")), "shared"):
        path = os.path.join(IMPL, "_shared", module + ".rs")
        text += "shared %s %s\n" % (module, sha(open(path, "rb").read()) if os.path.exists(path) else "missing")
    return sha(text.encode())


def merge_manifests():
    """(interface, old name) -> (old version); writes the merged manifests, removes the twins."""
    old = {}
    for interface, merged, twin in MERGES:
        mine_path = os.path.join(IMPL, interface, merged, "manifest.toml")
        mine, theirs = read_manifest(mine_path), read_manifest(os.path.join(IMPL, interface, twin, "manifest.toml"))
        old[(interface, merged)] = field(mine, "version").strip('"')
        old[(interface, twin)] = field(theirs, "version").strip('"')
        version = max(field(mine, "version"), field(theirs, "version"), key=version_key)
        text = re.sub(r"^version = .*$", "version = %s" % version, mine, count=1, flags=re.M)
        assert ELEMENTS[0] in text, mine_path
        text = text.replace(*ELEMENTS)
        extra = [f for f in list_field(theirs, "cpu_features") if f not in list_field(mine, "cpu_features")]
        if extra:
            text = text.rstrip("\n") + "\n\n[constraints.element_cpu_features]\nbf16 = [%s]\n" % ", ".join(
                '"%s"' % f for f in extra)
        open(mine_path, "w", encoding="utf-8").write(text)
        shutil.rmtree(os.path.join(IMPL, interface, twin))
    # Shadows that named a twin name the merged implementation now.
    for interface in sorted({i for i, _, _ in MERGES}):
        for name in sorted(os.listdir(os.path.join(IMPL, interface))):
            path = os.path.join(IMPL, interface, name, "manifest.toml")
            text = read_manifest(path)

            def rename(m):
                names = [RENAMED.get((interface, s), s) for s in re.findall(r'"([^"]+)"', m.group(1))]
                return "shadows = [%s]" % ", ".join('"%s"' % s for s in names)

            new = re.sub(r"^shadows = \[(.*)\]$", rename, text, count=1, flags=re.M)
            if new != text:
                open(path, "w", encoding="utf-8").write(new)
        path = os.path.join(ROOT, "interfaces", interface + ".toml")
        text = open(path, encoding="utf-8").read()
        # The bf16 references that merged (the attentions' `scalar`) are the merged folder's.
        if (interface, "bf16-scalar") in RENAMED:
            text = text.replace('reference = "bf16-scalar"', 'reference = "scalar"')
        open(path, "w", encoding="utf-8").write(text)
    return old


def rewrite_rankings(old_hashes, old_versions):
    rankings = os.path.join(ROOT, "rankings")
    rekeyed = kept = 0
    for klass in sorted(os.listdir(rankings)):
        for interface in sorted({i for i, _, _ in MERGES}):
            path = os.path.join(rankings, klass, interface + ".toml")
            if not os.path.exists(path):
                continue
            text = open(path, encoding="utf-8").read()
            head, *blocks = text.split("[[record]]\n")
            records = []
            for block in blocks:
                name = re.search(r'^implementation = "(.*)"$', block, re.M).group(1)
                element = ELEMENT_OF.get((interface, name))
                if element is None:
                    records.append((re.search(r'^shapes = "(.*)"$', block, re.M).group(1), name, "", block))
                    continue
                new_name = RENAMED[(interface, name)]
                source = re.search(r'^source_sha256 = "(.*)"$', block, re.M).group(1)
                version = re.search(r'^version = "(.*)"$', block, re.M).group(1)
                fresh = old_hashes[(interface, name)] == source and old_versions[(interface, name)] == version
                block = block.replace('implementation = "%s"\n' % name,
                                      'implementation = "%s"\nelement = "%s"\n' % (new_name, element), 1)
                if fresh:
                    new_version = field(read_manifest(os.path.join(IMPL, interface, new_name, "manifest.toml")),
                                        "version").strip('"')
                    block = block.replace('version = "%s"' % version, 'version = "%s"' % new_version, 1)
                    block = block.replace(source, measured_hash(interface, new_name), 1)
                    rekeyed += 1
                else:
                    kept += 1
                shapes = re.search(r'^shapes = "(.*)"$', block, re.M).group(1)
                records.append((shapes, new_name, element, block))
            records.sort(key=lambda r: (r[0], r[1], r[2]))
            body = "\n".join("[[record]]\n" + b.rstrip("\n") + "\n" for _, _, _, b in records)
            open(path, "w", encoding="utf-8").write(head + body)
    print("rankings: %d records re-keyed (fresh before), %d kept as they were (already stale)" % (rekeyed, kept))


def rewrite_locks():
    generated = os.path.join(ROOT, "generated")
    for crate in sorted(os.listdir(generated)):
        path = os.path.join(generated, crate, "monogen.lock")
        if not os.path.isfile(path):
            continue
        text = open(path, encoding="utf-8").read()

        def rename(m):
            merged = RENAMED.get((m.group(1), m.group(2)))
            return 'interface = "%s"\nimplementation = "%s"' % (m.group(1), merged) if merged else m.group(0)

        new = re.sub(r'^interface = "(.*)"\nimplementation = "(.*)"$', rename, text, flags=re.M)
        if new != text:
            open(path, "w", encoding="utf-8").write(new)


def hashes_at(read_kernel, read_manifest_text, read_shared):
    """(interface, name) -> rankings::measured_source_sha256, with the files the readers give."""
    out = {}
    for interface in sorted(os.listdir(IMPL)):
        if interface == "_shared" or not os.path.isdir(os.path.join(IMPL, interface)):
            continue
        for name in sorted(os.listdir(os.path.join(IMPL, interface))):
            text = "kernel %s\n" % sha(read_kernel(interface, name).encode())
            for module in list_field(read_manifest_text(interface, name), "shared"):
                text += "shared %s %s\n" % (module, sha(read_shared(module).encode()))
            out[(interface, name)] = sha(text.encode())
    return out


def comments(revision):
    for dirpath, _, files in os.walk(IMPL):
        for f in files:
            if f.endswith(".rs"):
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT)
                new = open(os.path.join(ROOT, rel), encoding="utf-8").read()
                assert code(new) == code(git_show(revision, rel)), "%s changed in code since %s" % (rel, revision)
    kernel = lambda i, n: "implementations/%s/%s/kernel.rs" % (i, n)
    manifest = lambda i, n: "implementations/%s/%s/manifest.toml" % (i, n)
    shared = lambda m: "implementations/_shared/%s.rs" % m
    now = lambda path: open(os.path.join(ROOT, path), encoding="utf-8").read()
    before = hashes_at(lambda i, n: git_show(revision, kernel(i, n)), lambda i, n: now(manifest(i, n)),
                       lambda m: git_show(revision, shared(m)))
    after = hashes_at(lambda i, n: now(kernel(i, n)), lambda i, n: now(manifest(i, n)), lambda m: now(shared(m)))
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
    print("comments: code unchanged since %s; %d records re-keyed" % (revision, rekeyed))


def main():
    if sys.argv[1:2] == ["--check"]:
        use_set(sys.argv[3] if len(sys.argv) > 3 else "attention")
        check(sys.argv[2])
    elif sys.argv[1:2] == ["comments"]:
        comments(sys.argv[2])
    elif sys.argv[1:2] == ["migrate"]:
        use_set(sys.argv[2] if len(sys.argv) > 2 else "attention")
        # The hashes the records of the old folders were measured against: the old kernels are
        # those of git's HEAD (the merged kernels are written in the working tree already).
        old_hashes, old_versions = {}, {}
        for interface, name in RENAMED:
            kernel = git_show("HEAD", "implementations/%s/%s/kernel.rs" % (interface, name)).encode()
            manifest = git_show("HEAD", "implementations/%s/%s/manifest.toml" % (interface, name))
            text = "kernel %s\n" % sha(kernel)
            for module in list_field(manifest, "shared"):
                text += "shared %s %s\n" % (module, sha(open(os.path.join(IMPL, "_shared", module + ".rs"), "rb").read()))
            old_hashes[(interface, name)] = sha(text.encode())
            old_versions[(interface, name)] = field(manifest, "version").strip('"')
        if ELEMENTS:
            merge_manifests()
        else:
            # A folder of a new name, its manifest written by hand: the old folders go, and the
            # interface's references are the new folder.
            for (interface, name), merged in RENAMED.items():
                shutil.rmtree(os.path.join(IMPL, interface, name))
                path = os.path.join(ROOT, "interfaces", interface + ".toml")
                text = open(path, encoding="utf-8").read().replace('reference = "%s"' % name, 'reference = "%s"' % merged)
                open(path, "w", encoding="utf-8").write(text)
        rewrite_rankings(old_hashes, old_versions)
        rewrite_locks()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
