#!/usr/bin/env python3
"""Writes tiny random-weight models of the LLaMA family, with reference outputs, to
tests/fixtures/<variant>/ (run once by hand; the test suite reads the files and needs no
Python).

Each fixture holds config.json and model.safetensors as Hugging Face transformers saves them,
tokenizer.json (stories260k's 512-token tokenizer, so that every id has an embedding), and
reference.json: the prompt ids, the logits of one full forward pass over them (float32, row t
predicts token t + 1) and 24 greedy new ids. Weights are drawn with a larger spread than
transformers' default, so that logits differ clearly and greedy decoding has no near-ties
(the script checks the gap between the two best logits at every greedy step).

Usage: python3 tools/make_fixtures.py [SHARED_MODELS_DIR]   (needs torch and transformers)
"""

import json
import pathlib
import shutil
import sys

import torch
import transformers

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT.parent / "shared" / "models"
PROMPT_LEN = 40
NEW_TOKENS = 24
MIN_GAP = 1e-3

VARIANTS = {
    # SmolLM / SmolLM2: tied embeddings, 9 query and 3 key/value heads, rope theta 1e5.
    "smollm-tiny": (
        transformers.LlamaConfig,
        dict(hidden_size=72, intermediate_size=96, num_hidden_layers=2, num_attention_heads=9,
             num_key_value_heads=3, head_dim=8, vocab_size=512, max_position_embeddings=256,
             rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1,
             eos_token_id=2),
    ),
    # Llama 3: a 128k-scale vocabulary (with a width of 2, to keep the file under 2 MB), rope
    # theta 5e5, tied embeddings as in Llama 3.2.
    "llama3-tiny": (
        transformers.LlamaConfig,
        dict(hidden_size=2, intermediate_size=8, num_hidden_layers=2, num_attention_heads=1,
             num_key_value_heads=1, head_dim=2, vocab_size=128256, max_position_embeddings=256,
             rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1,
             eos_token_id=2),
    ),
    # Linear rope scaling: every rotary frequency divided by the factor.
    "linear-rope-tiny": (
        transformers.LlamaConfig,
        dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=256,
             rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
             rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2),
    ),
    # Llama 3.1's rope scaling, with an original context short enough that, at head_dim 16, some
    # frequencies are kept, some divided and some interpolated.
    "llama31-rope-tiny": (
        transformers.LlamaConfig,
        dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=256,
             rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
                              "rope_theta": 500000.0},
             rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2),
    ),
    # Mistral: sliding-window attention, with a window of 16 positions, shorter than the
    # 40-token prompt and the 64 positions the greedy ids reach.
    "mistral-tiny": (
        transformers.MistralConfig,
        dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=256,
             rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=16,
             bos_token_id=1, eos_token_id=2),
    ),
    # Qwen2: biases on the q, k and v projections, untied embeddings, rope theta 1e6.
    "qwen2-tiny": (
        transformers.Qwen2Config,
        dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=512, max_position_embeddings=256,
             rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
             use_sliding_window=False, bos_token_id=1, eos_token_id=2),
    ),
}


def make(name, config_class, params, seed):
    config = config_class(**params)
    config.initializer_range = 0.2
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        # Biases are initialised to zero; give them values so that using them matters.
        for module_name, parameter in model.named_parameters():
            if module_name.endswith(".bias"):
                parameter.normal_(0.0, 0.2)
    prompt = torch.randint(3, params["vocab_size"], (1, PROMPT_LEN), generator=torch.Generator().manual_seed(seed))
    prompt[0, 0] = params["bos_token_id"]
    with torch.no_grad():
        logits = model(prompt).logits[0]
        ids = prompt
        gaps = []
        for _ in range(NEW_TOKENS):
            step = model(ids).logits[0, -1]
            top = torch.topk(step, 2).values
            gaps.append(float(top[0] - top[1]))
            ids = torch.cat([ids, step.argmax().view(1, 1)], dim=1)
    if min(gaps) < MIN_GAP:
        return None
    out = ROOT / "tests" / "fixtures" / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.save_pretrained(out, safe_serialization=True)
    for extra in out.glob("generation_config.json"):
        extra.unlink()
    shutil.copyfile(MODELS / "stories260k" / "tokenizer.json", out / "tokenizer.json")
    # Every row of logits for small vocabularies; the last row for large ones (files stay small).
    rows = list(range(PROMPT_LEN)) if params["vocab_size"] <= 4096 else [PROMPT_LEN - 1]
    reference = {
        "variant": name,
        "seed": seed,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "prompt_ids": prompt[0].tolist(),
        "logit_rows": rows,
        "logits": [[round(float(v), 7) for v in logits[r]] for r in rows],
        "greedy_ids": ids[0, PROMPT_LEN:].tolist(),
        "smallest_greedy_gap": min(gaps),
    }
    (out / "reference.json").write_text(json.dumps(reference))
    sizes = {p.name: p.stat().st_size for p in out.iterdir()}
    print(f"{name}: seed {seed}, smallest greedy gap {min(gaps):.4f}, files {sizes}")
    return out


for name, (config_class, params) in VARIANTS.items():
    for seed in range(1, 50):
        if make(name, config_class, params, seed):
            break
    else:
        sys.exit(f"{name}: no seed gave greedy steps without near-ties")
