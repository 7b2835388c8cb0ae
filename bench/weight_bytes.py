#!/usr/bin/env python3
"""Weight bytes that a LLaMA crate reads per decoded token, and the operations of a prefill token.

The bytes: every tensor of MODEL_DIR/model.safetensors but the embedding table, which a step
reads one row of (unless the classifier is tied to it, when it is read whole), as the crate
holds it: with DTYPE int8 a matrix takes a byte per value and an f32 scale per 32 (the norms stay
f32), whatever the file holds (a directory that an int8 crate saved with `--save-model` holds
them so already: its int8 matrices and their `_scale` tensors count as they are); with DTYPE
int8-packed (a crate whose `matmul<q8>` packs its weights, `matmul/q8-avx512-vnni-packed-threads`), a byte
per value and a binary16 scale per 32, as that kernel holds them; with DTYPE int4, 16 bytes, a
binary16 scale and a binary16 minimum per 32 values (a directory that an int4 crate saved holds its U8 matrices and F16
`_scale` tensors so already); otherwise as the file holds it. The operations: two per weight of the layers' matrices (the classifier runs
for the last token only).

Usage: bench/weight_bytes.py MODEL_DIR DTYPE   (prints "BYTES OPS"; DTYPE f32, bf16, int8, int8-packed or int4)
"""

import json
import struct
import sys


def weight_bytes(model_dir: str, dtype: str) -> tuple[int, int]:
    """(bytes read per decoded token, operations per prefill token), as the module doc says."""
    with open(model_dir + "/model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    if any(name.endswith(".packed") for name in header):
        sys.exit(f"{model_dir} holds packed matrices (a packing crate's --save-model): give the checkpoint it was saved from")
    tied = "lm_head.weight" not in header
    scale_bytes = 2 if dtype == "int8-packed" else 4
    total = 0
    for name, t in header.items():
        size = t["data_offsets"][1] - t["data_offsets"][0]
        scale = name.endswith("_scale")
        if dtype.startswith("int8") and t["dtype"] != "I8" and not scale:
            shape = t["shape"]
            if len(shape) == 2:
                size = shape[0] * (shape[1] + (shape[1] + 31) // 32 * scale_bytes)
            else:
                size = shape[0] * 4
        if dtype == "int4" and t["dtype"] != "U8" and not scale:
            shape = t["shape"]
            if len(shape) == 2:
                size = shape[0] * ((shape[1] + 31) // 32) * 20
            else:
                size = shape[0] * 4
        if name.removesuffix("_scale") == "model.embed_tokens.weight" and not tied:
            size = size // t["shape"][0]
        total += size
    layers = sum(
        t["shape"][0] * t["shape"][1]
        for name, t in header.items()
        if name.startswith("model.layers.") and len(t.get("shape", [])) == 2 and not name.endswith("_scale")
    )
    return total, 2 * layers


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    print(*weight_bytes(sys.argv[1], sys.argv[2]))
