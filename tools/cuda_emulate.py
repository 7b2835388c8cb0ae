#!/usr/bin/env python3
"""Runs a generated CUDA crate's kernels (src/kernels/*.cu) on the CPU, where there is no GPU,
and checks what they compute: each kernel against a numpy reference at the crate's shapes, then
the whole forward pass over a real model against transformers' reference outputs.

The kernel files are compiled with g++ after tools/cuda_emu/emu.h, which runs a launch's blocks
one after another and a block's threads as fibers (see its comment). The launches below are
those of the crate's src/kernels/*.rs and src/model.rs (grid, block, arguments in order); the
forward pass is src/model.rs's, step by step. What this cannot see is what only a GPU does:
threads of a block running at once (a race the fiber schedule hides), memory the launcher sizes
wrongly on the device, timing. Those are the device check's.

usage: cuda_emulate.py CRATE_DIR [--model DIR]
Exits 0 when every check passes, 1 when one fails, 2 when g++ or numpy is missing.
"""
import argparse
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("numpy is missing", file=sys.stderr)
    sys.exit(2)

HERE = os.path.dirname(os.path.abspath(__file__))
F32P = ctypes.POINTER(ctypes.c_float)

# Each kernel: its C parameters, and the launch of its Rust launcher as a function of the
# arguments (grid, block).
KERNELS = {
    "rmsnorm": ("rmsnorm", "float* out, const float* x, const float* weight, int rows"),
    "rope": ("rope", "float* q, float* k, const float* cos, const float* sin, int start, int rows"),
    "kv_cache": ("kv_store", "KV* keys, KV* values, const float* k, const float* v, int start, int rows"),
    "attention_prefill": (
        "attention_prefill",
        "float* out, const float* q, const KV* keys, const KV* values, int start, int rows",
    ),
    "attention_decode": [
        ("attention_decode_spans", "float* partials, const float* q, const KV* keys, const KV* values, int len"),
        ("attention_decode_combine", "float* out, const float* partials, int len"),
    ],
    "swiglu": ("swiglu", "float* gate, const float* up, int rows"),
}


def consts(crate):
    text = open(os.path.join(crate, "src/lib.rs")).read()
    values = {name: int(v) for name, v in re.findall(r"pub const (\w+): usize = (\d+);", text)}
    values["Q_DIM"] = values["NUM_HEADS"] * values["HEAD_DIM"]
    values["KV_DIM"] = values["NUM_KV_HEADS"] * values["HEAD_DIM"]
    values["RMS_NORM_EPS"] = float(re.search(r"pub const RMS_NORM_EPS: f32 = ([^;]+);", text).group(1))
    values["ROPE_THETA"] = float(re.search(r"pub const ROPE_THETA: f32 = ([^;]+);", text).group(1))
    values["bf16"] = "pub type Weight = u16;" in text
    values["kv_bf16"] = "pub type Kv = u16;" in text
    import tomllib

    workload = tomllib.load(open(os.path.join(crate, "workload.toml"), "rb"))
    values["WINDOW"] = workload["model"].get("sliding_window") or values["MAX_SEQ_LEN"]
    return values


def compile_kernels(crate, build):
    """One shared library per kernel file, with a `launch_<kernel>` wrapper per kernel."""
    kernels = os.path.join(crate, "src/kernels")
    libs = {}
    for file in sorted(os.listdir(kernels)):
        if not file.endswith(".cu"):
            continue
        module = file[:-3]
        source = open(os.path.join(kernels, file)).read()
        wrappers = []
        if module == "matmul":
            shapes = re.search(r"#define MATMUL_SHAPES\(X\) (.*)", source).group(1)
            for n, k in re.findall(r"X\((\d+), (\d+)\)", shapes):
                wrappers.append((f"matmul_{n}_{k}", "float* out, const float* x, const W* w, int rows"))
                wrappers.append((f"matmul_tiles_{n}_{k}", "float* out, const float* x, const W* w, int rows"))
        elif module == "model":
            wrappers += [
                ("embed", "float* x, const W* table, const unsigned int* ids, int rows"),
                ("add", "float* x, const float* y, int n"),
                ("argmax", "unsigned int* picked, const float* logits"),
            ]
            if "void add_bias(" in source:
                wrappers.append(("add_bias", "float* x, const float* bias, int rows, int dim"))
        elif isinstance(KERNELS[module], list):
            wrappers += KERNELS[module]
        else:
            wrappers.append(KERNELS[module])
        code = [f'#include "{os.path.join(kernels, file)}"']
        for name, params in wrappers:
            args = ", ".join(p.split()[-1].lstrip("*") for p in params.split(","))
            code.append(
                f'extern "C" void launch_{name}(unsigned gx, unsigned gy, unsigned bx, {params}) '
                f"{{ emu::launch({{gx, gy, 1}}, {{bx, 1, 1}}, [&] {{ {name}({args}); }}); }}"
            )
        cpp = os.path.join(build, f"{module}.cpp")
        with open(cpp, "w") as f:
            f.write("\n".join(code) + "\n")
        lib = os.path.join(build, f"lib{module}.so")
        subprocess.run(
            ["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-shared", "-fPIC", "-w",
             "-include", os.path.join(HERE, "cuda_emu/emu.h"), cpp, "-o", lib],
            check=True,
        )
        libs[module] = ctypes.CDLL(lib)
    return libs


def ptr(a):
    assert a.flags["C_CONTIGUOUS"]
    return ctypes.c_void_p(a.ctypes.data)


def bf16_bits(a):
    """f32 → the nearest bfloat16's bits (ties to even), as the crate's weights.rs rounds."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def widen(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


class Gpu:
    """The crate's kernels, launched as its Rust launchers launch them."""

    def __init__(self, libs, c):
        self.libs, self.c = libs, c

    def call(self, module, name, grid, block, *args):
        f = getattr(self.libs[module], f"launch_{name}")
        values = [ctypes.c_uint(grid[0]), ctypes.c_uint(grid[1]), ctypes.c_uint(block)]
        values += [ptr(a) if isinstance(a, np.ndarray) else ctypes.c_int(a) for a in args]
        f(*values)

    def rmsnorm(self, out, x, weight, rows):
        self.call("rmsnorm", "rmsnorm", (rows, 1), 256, out, x, weight, rows)

    def matmul(self, n, k, out, x, w, rows):
        if rows < 8:
            self.call("matmul", f"matmul_{n}_{k}", (-(-n // 8), rows), 256, out, x, w, rows)
        else:
            self.call("matmul", f"matmul_tiles_{n}_{k}", (-(-n // 64), -(-rows // 64)), 256, out, x, w, rows)

    def rope(self, q, k, cos, sin, start, rows):
        self.call("rope", "rope", (rows, 1), 128, q, k, cos, sin, start, rows)

    def kv_store(self, keys, values, k, v, start, rows):
        n = rows * self.c["KV_DIM"]
        self.call("kv_cache", "kv_store", (-(-n // 256), 1), 256, keys, values, k, v, start, rows)

    def attention_prefill(self, out, q, keys, values, start, rows):
        self.call("attention_prefill", "attention_prefill", (-(-rows // 16), self.c["NUM_HEADS"]), 128, out, q, keys, values, start, rows)

    def attention_decode(self, out, q, keys, values, length):
        c = self.c
        scratch = np.zeros(c["NUM_HEADS"] * (c["MAX_SEQ_LEN"] + c["HEAD_DIM"] + 2), np.float32)
        self.call("attention_decode", "attention_decode_spans", (-(-length // 256), c["NUM_HEADS"]), 128, scratch, q, keys, values, length)
        self.call("attention_decode", "attention_decode_combine", (c["NUM_HEADS"], 1), 64, out, scratch, length)

    def swiglu(self, gate, up, rows):
        n = rows * self.c["INTERMEDIATE_SIZE"]
        self.call("swiglu", "swiglu", (-(-n // 256), 1), 256, gate, up, rows)

    def embed(self, x, table, ids, rows):
        n = rows * self.c["HIDDEN_SIZE"]
        self.call("model", "embed", (-(-n // 256), 1), 256, x, table, ids, rows)

    def add(self, x, y, n):
        self.call("model", "add", (-(-n // 256), 1), 256, x, y, n)

    def add_bias(self, x, bias, rows, dim):
        self.call("model", "add_bias", (-(-(rows * dim) // 256), 1), 256, x, bias, rows, dim)

    def argmax(self, logits):
        picked = np.zeros(1, np.uint32)
        self.call("model", "argmax", (1, 1), 1024, picked, np.ascontiguousarray(logits, np.float32))
        return int(picked[0])


def inv_freq(theta, head_dim, scaling=None):
    """The rotary inverse frequencies in f32, scaled as the crate's rope_inv_freq scales them."""
    f32 = np.float32
    inv = [f32(1.0) / f32(theta) ** (f32(2 * i) / f32(head_dim)) for i in range(head_dim // 2)]
    if scaling and scaling.get("type") == "linear":
        inv = [f / f32(scaling["factor"]) for f in inv]
    elif scaling and scaling.get("type") == "llama3":
        factor, low, high = f32(scaling["factor"]), f32(scaling["low_freq_factor"]), f32(scaling["high_freq_factor"])
        original = f32(scaling["original_max_position_embeddings"])
        scaled = []
        for f in inv:
            wavelen = f32(2.0) * f32(np.pi) / f
            if wavelen > original / low:
                f = f / factor
            elif wavelen >= original / high:
                smooth = (original / wavelen - low) / (high - low)
                f = (f32(1.0) - smooth) * f / factor + smooth * f
            scaled.append(f32(f))
        inv = scaled
    return np.array(inv, dtype=np.float32)


def rope_table(theta, head_dim, positions, scaling=None):
    inv = inv_freq(theta, head_dim, scaling)
    angles = (np.arange(positions, dtype=np.float32)[:, None] * inv[None, :]).astype(np.float64)
    return np.ascontiguousarray(np.cos(angles).astype(np.float32)), np.ascontiguousarray(np.sin(angles).astype(np.float32))


def attention_reference(q, keys, values, start, rows, c):
    hd, nh, nkv = c["HEAD_DIM"], c["NUM_HEADS"], c["NUM_KV_HEADS"]
    out = np.zeros((rows, nh * hd), dtype=np.float64)
    for r in range(rows):
        length = start + r + 1
        first = max(0, length - c["WINDOW"])  # the sliding window's first position
        for h in range(nh):
            g = h // (nh // nkv)
            qh = q[r, h * hd:(h + 1) * hd].astype(np.float64)
            kh = keys[first:length, g * hd:(g + 1) * hd].astype(np.float64)
            s = kh @ qh / np.sqrt(hd)
            p = np.exp(s - s.max())
            p /= p.sum()
            out[r, h * hd:(h + 1) * hd] = p @ values[first:length, g * hd:(g + 1) * hd].astype(np.float64)
    return out


def check_kernels(gpu, c, failures):
    """Each kernel against numpy at the crate's shapes, on random inputs."""
    rng = np.random.default_rng(7)
    H, I, Q, KV, S = c["HIDDEN_SIZE"], c["INTERMEDIATE_SIZE"], c["Q_DIM"], c["KV_DIM"], c["MAX_SEQ_LEN"]
    rows, start = 5, 3

    def close(name, got, want, tol):
        err = float(np.max(np.abs(got.astype(np.float64) - want)) / max(1.0, float(np.max(np.abs(want)))))
        status = "ok" if err <= tol else "FAIL"
        print(f"{status} {name}: largest error {err:.2e} (bound {tol:.0e})")
        if err > tol:
            failures.append(name)

    def f32(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    x, weight, out = f32(rows, H), f32(H), np.zeros((rows, H), np.float32)
    gpu.rmsnorm(out, x, weight, rows)
    want = weight * (x / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + c["RMS_NORM_EPS"]))
    close("rmsnorm", out, want, 1e-5)

    text = open(os.path.join(gpu.crate, "src/kernels/matmul.cu")).read()
    for n, k in re.findall(r"X\((\d+), (\d+)\)", re.search(r"#define MATMUL_SHAPES\(X\) (.*)", text).group(1)):
        n, k = int(n), int(k)
        # a decode step's few rows (a warp per output), and prefill's many (tiles, two of rows)
        for m in (rows, 70):
            xs, w = f32(m, k), f32(n, k)
            held = bf16_bits(w) if c["bf16"] else w
            wf = widen(held) if c["bf16"] else w
            out = np.zeros((m, n), np.float32)
            gpu.matmul(n, k, out, xs, held, m)
            # bfloat16 weights from 8 rows: the tensor cores, on activations rounded to bfloat16
            tensor_cores = c["bf16"] and m >= 8
            xr = widen(bf16_bits(xs)) if tensor_cores else xs
            what = " on tensor cores" if tensor_cores else ""
            close(f"matmul_{n}_{k} ({m} rows{what})", out, xr.astype(np.float64) @ wf.astype(np.float64).T, 1e-5)

    cos, sin = rope_table(c["ROPE_THETA"], c["HEAD_DIM"], S)
    q, k = f32(rows, Q), f32(rows, KV)
    want_q, want_k = q.astype(np.float64).copy(), k.astype(np.float64).copy()
    half = c["HEAD_DIM"] // 2
    for a, heads in ((want_q, c["NUM_HEADS"]), (want_k, c["NUM_KV_HEADS"])):
        for r in range(rows):
            cs, sn = cos[start + r], sin[start + r]
            for h in range(heads):
                lo, hi = a[r, h * c["HEAD_DIM"]:h * c["HEAD_DIM"] + half].copy(), a[r, h * c["HEAD_DIM"] + half:(h + 1) * c["HEAD_DIM"]].copy()
                a[r, h * c["HEAD_DIM"]:h * c["HEAD_DIM"] + half] = lo * cs - hi * sn
                a[r, h * c["HEAD_DIM"] + half:(h + 1) * c["HEAD_DIM"]] = hi * cs + lo * sn
    gpu.rope(q, k, cos, sin, start, rows)
    close("rope (q)", q, want_q, 1e-5)
    close("rope (k)", k, want_k, 1e-5)

    # The cache as the crate holds it (f32, or bfloat16 bits), and as f32 for the references.
    kv_dtype = np.uint16 if c["kv_bf16"] else np.float32
    held = (lambda a: bf16_bits(a)) if c["kv_bf16"] else (lambda a: np.ascontiguousarray(a, np.float32))
    as_f32 = (lambda h: widen(h)) if c["kv_bf16"] else (lambda h: h)
    keys, values = np.zeros((S, KV), kv_dtype), np.zeros((S, KV), kv_dtype)
    old_k, old_v = f32(start, KV), f32(start, KV)
    keys[:start], values[:start] = held(old_k), held(old_v)
    new_k, new_v = f32(rows, KV), f32(rows, KV)
    gpu.kv_store(keys, values, new_k, new_v, start, rows)
    for name, got, want in [
        ("kv_store", keys[:start + rows], held(np.concatenate([old_k, new_k]))),
        ("kv_store (values)", values[:start + rows], held(np.concatenate([old_v, new_v]))),
        ("kv_store (untouched rows)", keys[start + rows:], np.zeros_like(keys[start + rows:])),
    ]:
        same = np.array_equal(got, want)
        print(f"{'ok' if same else 'FAIL'} {name}: {'bit for bit' if same else 'differs'} ({np.dtype(kv_dtype).name})")
        if not same:
            failures.append(name)

    q = f32(rows, Q)
    out = np.zeros((rows, Q), np.float32)
    gpu.attention_prefill(out, q, keys, values, start, rows)
    close("attention_prefill", out, attention_reference(q, as_f32(keys), as_f32(values), start, rows, c), 1e-5)
    # Several tiles of rows and of positions, the chunk starting inside a tile of positions.
    many, at = min(40, S // 2), min(37, S // 4)
    full_k, full_v, qm = held(f32(S, KV)), held(f32(S, KV)), f32(many, Q)
    out = np.zeros((many, Q), np.float32)
    gpu.attention_prefill(out, qm, full_k, full_v, at, many)
    close(f"attention_prefill of {many} rows from position {at}", out, attention_reference(qm, as_f32(full_k), as_f32(full_v), at, many, c), 1e-5)
    q1 = f32(1, Q)
    out = np.zeros((1, Q), np.float32)
    gpu.attention_decode(out, q1, keys, values, start + rows)
    close("attention_decode", out, attention_reference(q1, as_f32(keys), as_f32(values), start + rows - 1, 1, c), 1e-5)
    # Over every position the cache holds: several spans where MAX_SEQ_LEN has them.
    gpu.attention_decode(out, q1, full_k, full_v, S)
    close(f"attention_decode over {S} positions", out, attention_reference(q1, as_f32(full_k), as_f32(full_v), S - 1, 1, c), 1e-5)

    V = c["VOCAB_SIZE"]
    for name, logits in [
        ("random", f32(V)),
        ("a tie: the first index", np.concatenate([np.zeros(V - 3, np.float32), np.full(3, 5.0, np.float32)])),
        ("all equal", np.full(V, -np.inf, np.float32)),
    ]:
        logits = np.ascontiguousarray(logits)
        got, want = gpu.argmax(logits), int(np.argmax(logits))
        print(f"{'ok' if got == want else 'FAIL'} argmax ({name}): {got}, numpy {want}")
        if got != want:
            failures.append(f"argmax ({name})")

    gate, up = f32(rows, I), f32(rows, I)
    want = gate.astype(np.float64) / (1 + np.exp(-gate.astype(np.float64))) * up
    gpu.swiglu(gate, up, rows)
    close("swiglu", gate, want, 1e-5)


class Model:
    """src/model.rs's forward pass, with the emulated kernels."""

    def __init__(self, gpu, c, model_dir):
        from safetensors.numpy import load_file

        t = load_file(os.path.join(model_dir, "model.safetensors"))
        held = (lambda a: bf16_bits(a.astype(np.float32))) if c["bf16"] else (lambda a: np.ascontiguousarray(a, np.float32))
        self.gpu, self.c = gpu, c
        self.embed = held(t["model.embed_tokens.weight"])
        self.classifier = held(t["lm_head.weight"]) if "lm_head.weight" in t else self.embed
        self.norm = np.ascontiguousarray(t["model.norm.weight"], np.float32)
        self.layers = []
        for l in range(c["NUM_LAYERS"]):
            p = f"model.layers.{l}."
            self.layers.append({
                "in": np.ascontiguousarray(t[p + "input_layernorm.weight"], np.float32),
                "post": np.ascontiguousarray(t[p + "post_attention_layernorm.weight"], np.float32),
                **{name: held(t[p + path]) for name, path in [
                    ("q", "self_attn.q_proj.weight"), ("k", "self_attn.k_proj.weight"), ("v", "self_attn.v_proj.weight"),
                    ("o", "self_attn.o_proj.weight"), ("gate", "mlp.gate_proj.weight"), ("up", "mlp.up_proj.weight"),
                    ("down", "mlp.down_proj.weight")]},
            })
        # q/k/v biases, where the checkpoint has them (Qwen2)
        if "model.layers.0.self_attn.q_proj.bias" in t:
            for l, w in enumerate(self.layers):
                for name in ("q", "k", "v"):
                    w[name + "_bias"] = np.ascontiguousarray(t[f"model.layers.{l}.self_attn.{name}_proj.bias"], np.float32)
        import tomllib

        workload = tomllib.load(open(os.path.join(gpu.crate, "workload.toml"), "rb"))
        scaling = workload["model"].get("rope_scaling")
        self.cos, self.sin = rope_table(c["ROPE_THETA"], c["HEAD_DIM"], c["MAX_SEQ_LEN"], scaling)
        S, KV = c["MAX_SEQ_LEN"], c["KV_DIM"]
        kv_dtype = np.uint16 if c["kv_bf16"] else np.float32
        self.keys = [np.zeros((S, KV), kv_dtype) for _ in self.layers]
        self.values = [np.zeros((S, KV), kv_dtype) for _ in self.layers]
        self.pos = 0

    def forward(self, tokens):
        g, c = self.gpu, self.c
        H, I, Q, KV = c["HIDDEN_SIZE"], c["INTERMEDIATE_SIZE"], c["Q_DIM"], c["KV_DIM"]
        t, start = len(tokens), self.pos
        ids = np.array(tokens, dtype=np.uint32)
        z = lambda *s: np.zeros(s, np.float32)
        x, xb, q, k, v, att, gate, up = z(t, H), z(t, H), z(t, Q), z(t, KV), z(t, KV), z(t, Q), z(t, I), z(t, I)
        g.embed(x, self.embed, ids, t)
        for l, w in enumerate(self.layers):
            keys, values = self.keys[l], self.values[l]
            g.rmsnorm(xb, x, w["in"], t)
            g.matmul(Q, H, q, xb, w["q"], t)
            g.matmul(KV, H, k, xb, w["k"], t)
            g.matmul(KV, H, v, xb, w["v"], t)
            if "q_bias" in w:
                g.add_bias(q, w["q_bias"], t, Q)
                g.add_bias(k, w["k_bias"], t, KV)
                g.add_bias(v, w["v_bias"], t, KV)
            g.rope(q, k, self.cos, self.sin, start, t)
            g.kv_store(keys, values, k, v, start, t)
            if t == 1:
                g.attention_decode(att, q, keys, values, start + 1)
            else:
                g.attention_prefill(att, q, keys, values, start, t)
            g.matmul(H, Q, xb, att, w["o"], t)
            g.add(x, xb, t * H)
            g.rmsnorm(xb, x, w["post"], t)
            g.matmul(I, H, gate, xb, w["gate"], t)
            g.matmul(I, H, up, xb, w["up"], t)
            g.swiglu(gate, up, t)
            g.matmul(H, I, xb, gate, w["down"], t)
            g.add(x, xb, t * H)
        self.pos += t
        return x

    def classify(self, x, row):
        c = self.c
        H, V = c["HIDDEN_SIZE"], c["VOCAB_SIZE"]
        last = np.ascontiguousarray(x[row:row + 1])
        normed, logits = np.zeros((1, H), np.float32), np.zeros((1, V), np.float32)
        self.gpu.rmsnorm(normed, last, self.norm, 1)
        self.gpu.matmul(V, H, logits, normed, self.classifier, 1)
        return logits[0]


def check_model(gpu, c, model_dir, failures):
    if os.path.exists(os.path.join(model_dir, "reference.json")):
        # a fixture of tests/fixtures (tools/make_fixtures.py): logits of some rows, greedy ids
        ref = json.load(open(os.path.join(model_dir, "reference.json")))
        ids, rows = ref["prompt_ids"], ref["logit_rows"]
        want = np.array(ref["logits"], dtype=np.float64)
        greedy = {"prompt": "the fixture's prompt", "prompt_ids": ids, "new_ids": ref["greedy_ids"]}
        bound = 1e-4
    else:
        # a model of ../shared/models: the logits of every position, greedy continuations
        ref = json.load(open(os.path.join(model_dir, "reference/reference.json")))
        want = np.load(os.path.join(model_dir, "reference", ref["logits"]["file"])).astype(np.float64)
        ids = ref["logits"]["input_ids"]
        rows = list(range(len(ids)))
        greedy = ref["greedy"][0]
        bound = 1e-3
    model = Model(gpu, c, model_dir)
    x = model.forward(ids)
    got = np.array([model.classify(x, r) for r in rows], dtype=np.float64)
    err = float(np.max(np.abs(got - want)))
    def log_softmax(a):
        a = a - a.max(axis=1, keepdims=True)
        return a - np.log(np.exp(a).sum(axis=1, keepdims=True))
    lp, lq = log_softmax(want), log_softmax(got)
    kl = float((np.exp(lp) * (lp - lq)).sum(axis=1).mean())
    top1 = float((got.argmax(axis=1) == want.argmax(axis=1)).mean())
    print(f"logits over {len(rows)} positions: largest difference {err:.2e}, mean KL {kl:.2e}, top-1 {top1:.2%}")
    if c["bf16"]:
        ok = kl <= 1e-3
        print(f"{'ok' if ok else 'FAIL'} bf16 weights: mean KL against the f32 reference at most 1e-3")
    else:
        ok = err <= bound
        print(f"{'ok' if ok else 'FAIL'} f32: logits within {bound:.0e} of the reference")
    if not ok:
        failures.append("logits")

    # Greedy decoding, one token at a time through the decode path, against the reference.
    case = greedy
    model = Model(gpu, c, model_dir)
    x = model.forward(case["prompt_ids"])
    logits = model.classify(x, len(case["prompt_ids"]) - 1)
    new = []
    for _ in range(min(12, len(case["new_ids"]))):
        token = gpu.argmax(logits)
        new.append(token)
        x = model.forward([token])
        logits = model.classify(x, 0)
    same = new == case["new_ids"][:len(new)]
    print(f"{'ok' if same else 'FAIL'} greedy: {len(new)} tokens after {case['prompt']!r}: {new}")
    if not same:
        failures.append("greedy")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("crate")
    parser.add_argument("--model", help="the Hugging Face folder of the crate's model, with reference/")
    args = parser.parse_args()
    if shutil.which("g++") is None:
        print("g++ is missing", file=sys.stderr)
        return 2
    args.crate = os.path.abspath(args.crate)
    c = consts(args.crate)
    failures = []
    with tempfile.TemporaryDirectory() as build:
        gpu = Gpu(compile_kernels(args.crate, build), c)
        gpu.crate = args.crate
        check_kernels(gpu, c, failures)
        if args.model:
            check_model(gpu, c, args.model, failures)
    print(f"{args.crate}: {'every check passed' if not failures else 'FAILED: ' + ', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
