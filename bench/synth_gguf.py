#!/usr/bin/env python3
"""Turns a model directory that `monogen synth-weights` wrote into a GGUF file with llama.cpp's
own converter (convert_hf_to_gguf.py), for llama-server to serve the same weights.

The synthetic directory's tokenizer.json is a word-level one that the converter does not read;
the converter wants a SentencePiece model for a LLaMA of this vocabulary. This script writes one
beside a copy of the weights: `<unk>`, `<s>`, `</s>`, the 256 byte pieces, then filler pieces up
to the vocabulary size. The benchmark sends prompts as token ids, so the text of a piece never
matters, only that both servers have the same vocabulary size and the same weights.

Usage: bench/synth_gguf.py SYNTH_DIR LLAMA_CPP_DIR OUT.gguf [--outtype f32|bf16]
       (needs sentencepiece and protobuf, and the converter's own requirements: numpy, torch,
       transformers, safetensors)
"""

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

from sentencepiece import sentencepiece_model_pb2 as pb


def sentencepiece_model(vocab_size):
    model = pb.ModelProto()
    model.trainer_spec.model_type = pb.TrainerSpec.BPE
    model.trainer_spec.vocab_size = vocab_size
    model.trainer_spec.byte_fallback = True
    model.normalizer_spec.name = "identity"
    model.normalizer_spec.add_dummy_prefix = True

    def piece(text, kind, score=0.0):
        p = model.pieces.add()
        p.piece, p.type, p.score = text, kind, score

    piece("<unk>", pb.ModelProto.SentencePiece.UNKNOWN)
    piece("<s>", pb.ModelProto.SentencePiece.CONTROL)
    piece("</s>", pb.ModelProto.SentencePiece.CONTROL)
    for b in range(256):
        piece(f"<0x{b:02X}>", pb.ModelProto.SentencePiece.BYTE)
    for i in range(vocab_size - len(model.pieces)):
        piece(f"\u2581w{i}", pb.ModelProto.SentencePiece.NORMAL, -float(i))
    return model.SerializeToString()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("synth_dir", type=pathlib.Path)
    p.add_argument("llama_cpp", type=pathlib.Path)
    p.add_argument("out", type=pathlib.Path)
    p.add_argument("--outtype", default="f32")
    args = p.parse_args()
    config = json.loads((args.synth_dir / "config.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        for name in ["config.json", "model.safetensors"]:
            (tmp / name).symlink_to((args.synth_dir / name).resolve())
        (tmp / "tokenizer.model").write_bytes(sentencepiece_model(config["vocab_size"]))
        env = {"PYTHONPATH": str(args.llama_cpp / "gguf-py")}
        subprocess.run(
            [sys.executable, str(args.llama_cpp / "convert_hf_to_gguf.py"), str(tmp),
             "--outfile", str(args.out), "--outtype", args.outtype],
            check=True, env={**__import__("os").environ, **env},
        )


if __name__ == "__main__":
    main()
