#!/usr/bin/env python3
"""The device check of the CUDA crates (issue "CUDA"), the part that runs on the GPU machine:
called by bench/gpu_check.sh, which says how to prepare and run it.

  parity BIN_DIR MODELS_DIR   each CUDA crate on its real model against transformers' reference
                              outputs: the logits of the reference text (within 1e-3 in f32, mean
                              KL at most 1e-3 with bf16 weights) and greedy continuations (equal ids)
  speed BIN MODEL_DIR         the TinyLlama-shaped crate on synthetic bf16 weights: decode tokens
                              per second against the memory floor (weight bytes per token over the
                              bandwidth of a device-to-device copy measured in the same run), a
                              512-token prefill against the bf16 tensor-core peak of a cuBLAS
                              product (torch.matmul) measured in the same run, and both against
                              PyTorch + transformers on the same weights and GPU

Prints one line per figure and writes them as JSON to $OUT/gpu_check.json (or ./gpu_check.json).
Exits 1 when a parity check fails.
"""
import json
import os
import struct
import subprocess
import sys
import time

import numpy as np

# Which crate runs on which model, and how it is held to the reference.
CRATES = [
    ("stories260k-cuda-f32", "stories260k", "f32"),
    ("stories260k-cuda-bf16", "stories260k", "bf16"),
    ("aidreams260k-cuda-f32", "aidreams260k", "f32"),
]

RESULTS = {}


def record(key, value, line):
    RESULTS[key] = value
    print(line, flush=True)


def log_softmax(a):
    a = a - a.max(axis=1, keepdims=True)
    return a - np.log(np.exp(a).sum(axis=1, keepdims=True))


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode}:\n{out.stderr}")
    return out.stdout


def parity(bin_dir, models_dir):
    failed = []
    for crate, model, dtype in CRATES:
        binary = os.path.join(bin_dir, crate)
        model_dir = os.path.join(models_dir, model)
        ref = json.load(open(os.path.join(model_dir, "reference", "reference.json")))
        want = np.load(os.path.join(model_dir, "reference", ref["logits"]["file"])).astype(np.float64)
        ids = ref["logits"]["input_ids"]
        path = f"/tmp/{crate}.logits"
        run([binary, "--model", model_dir, "--prompt-ids", ",".join(map(str, ids)), "--logits", path])
        got = np.fromfile(path, dtype="<f4").astype(np.float64).reshape(len(ids), -1)
        diff = float(np.abs(got - want).max())
        lp, lq = log_softmax(want), log_softmax(got)
        kl = float((np.exp(lp) * (lp - lq)).sum(axis=1).mean())
        top1 = float((got.argmax(axis=1) == want.argmax(axis=1)).mean())
        ok = diff <= 1e-3 if dtype == "f32" else kl <= 1e-3
        record(
            f"{crate}.logits",
            {"max_abs_diff": diff, "mean_kl": kl, "top1": top1, "ok": ok},
            f"{'ok' if ok else 'FAIL'} {crate}: logits of {len(ids)} positions, largest difference {diff:.2e}, mean KL {kl:.2e}, top-1 {top1:.2%}",
        )
        if not ok:
            failed.append(f"{crate} logits")
        for case in ref["greedy"]:
            n = len(case["new_ids"])
            out = json.loads(run([binary, "--model", model_dir, "--prompt-ids", ",".join(map(str, case["prompt_ids"])),
                                  "--max-tokens", str(n), "--json"]))
            same = out["generated_ids"][:n] == case["new_ids"]
            record(
                f"{crate}.greedy.{case['prompt']}",
                {"ok": same, "got": out["generated_ids"], "want": case["new_ids"]},
                f"{'ok' if same else 'FAIL'} {crate}: {n} greedy tokens after {case['prompt']!r}",
            )
            if not same:
                failed.append(f"{crate} greedy {case['prompt']!r}")
    return failed


def weight_bytes(model_dir):
    """Bytes a decode step reads: every tensor but the embedding, in bf16, plus one embedding row."""
    path = os.path.join(model_dir, "model.safetensors")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    total = 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        elements = int(np.prod(t["shape"]))
        if name == "model.embed_tokens.weight":
            total += 2 * t["shape"][1]
        elif len(t["shape"]) == 1:
            total += 4 * elements  # norms are f32 on the GPU
        else:
            total += 2 * elements
    return total


def speed(binary, model_dir, rounds=3):
    import torch

    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(0)
    record("gpu", name, f"GPU: {name}")

    def timed(fn, reps):
        fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / reps

    # The memory's bandwidth: a copy of 4 GiB reads and writes every byte.
    src = torch.empty(1 << 31, dtype=torch.int16, device=dev)
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), 10)
    bandwidth = 2 * src.numel() * 2 / seconds
    del src, dst
    # The bf16 tensor-core peak of a cuBLAS product.
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    peak = 2 * 8192**3 / timed(lambda: a @ b, 10)
    del a, b
    torch.cuda.empty_cache()
    record("bandwidth_GBps", bandwidth / 1e9, f"device-to-device copy: {bandwidth / 1e9:.0f} GB/s")
    record("bf16_peak_TFLOPs", peak / 1e12, f"cuBLAS bf16 8192^3: {peak / 1e12:.0f} TFLOP/s")

    config = json.load(open(os.path.join(model_dir, "config.json")))
    vocab = config["vocab_size"]
    rng = np.random.default_rng(1)
    prompt = [1] + rng.integers(3, vocab, 511).tolist()
    decode_tokens = 128
    per_token = weight_bytes(model_dir)
    floor = per_token / bandwidth
    # Parameters a token multiplies by: every matrix but the embedding (a lookup).
    params = (per_token - 4 * config["hidden_size"] * (2 * config["num_hidden_layers"] + 1) - 2 * config["hidden_size"]) / 2

    crate = []
    for _ in range(rounds):
        out = json.loads(run([binary, "--model", model_dir, "--prompt-ids", ",".join(map(str, prompt)),
                              "--max-tokens", str(decode_tokens), "--json"]))
        crate.append(out)
    decode = float(np.median([o["decode_tok_s"] for o in crate]))
    prefill_s = float(np.median([o["prefill_ms"] for o in crate])) / 1e3
    prefill_flops = 2 * params * len(prompt) / prefill_s
    record("crate.decode_tok_s", decode,
           f"crate decode: {decode:.1f} tok/s; floor {1 / floor:.1f} tok/s ({per_token / 1e9:.2f} GB a token): {decode * floor:.2f} of the floor (goal 0.85)")
    record("crate.prefill_TFLOPs", prefill_flops / 1e12,
           f"crate prefill of {len(prompt)}: {prefill_s * 1e3:.1f} ms, {prefill_flops / 1e12:.1f} TFLOP/s, {prefill_flops / peak:.3f} of the peak (goal 0.5)")

    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        record("torch", None, "PyTorch + transformers: not measured (transformers is missing)")
        return
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    except TypeError:  # transformers before 4.56 names it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.bfloat16)
    model = model.to(dev).eval()
    ids = torch.tensor([prompt], device=dev)
    with torch.no_grad():
        prefill_t = timed(lambda: model(ids), rounds)
        gen = lambda: model.generate(ids, max_new_tokens=decode_tokens, min_new_tokens=decode_tokens, do_sample=False)
        total = timed(gen, rounds)
    torch_decode = decode_tokens / max(total - prefill_t, 1e-9)
    record("torch.decode_tok_s", torch_decode,
           f"PyTorch + transformers decode: {torch_decode:.1f} tok/s; the crate {decode / torch_decode:.2f}x (goal 3x)")
    record("torch.prefill_ms", prefill_t * 1e3,
           f"PyTorch + transformers prefill of {len(prompt)}: {prefill_t * 1e3:.1f} ms; the crate {prefill_t / prefill_s:.2f}x (goal 3x)")


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("parity", "speed"):
        print(__doc__, file=sys.stderr)
        return 2
    failed = []
    try:
        if sys.argv[1] == "parity":
            failed = parity(sys.argv[2], sys.argv[3])
        else:
            speed(sys.argv[2], sys.argv[3])
    finally:
        out = os.path.join(os.environ.get("OUT", "."), f"gpu_check_{sys.argv[1]}.json")
        with open(out, "w") as f:
            json.dump(RESULTS, f, indent=1)
    if failed:
        print("FAILED: " + "; ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
