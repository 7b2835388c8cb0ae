//! `monogen synth-weights`: a model directory with a workload's shapes and random weights, for
//! benchmarking shapes whose real weights are not at hand.
//!
//! It holds a Hugging Face style config.json, a model.safetensors of weights (f32, or BF16
//! for a bf16, int8 or int4 workload, as their checkpoints are) drawn
//! uniformly with the standard deviation of a trained model's linear layers (0.02; norm
//! weights are 1), written as it is generated so that multi-gigabyte shapes never sit in
//! memory, and a tokenizer.json that works: for a LLaMA model a word-level vocabulary of
//! `vocab_size` entries (`<unk>`, `<s>`, `</s>`, then `w3`, `w4`, ...) split on whitespace; for
//! a BERT encoder a WordPiece one (`[PAD]`, `[UNK]`, `[CLS]`, `[SEP]`, `[MASK]`, then `w5`, ...)
//! that adds `[CLS]` and `[SEP]` as BERT's does.

use std::io::Write;
use std::path::Path;

use serde_json::{Value, json};

use crate::Error;
use crate::workload::{Dtype, Model, Workload};

/// Standard deviation of the random linear weights.
const WEIGHT_STD: f32 = 0.02;

/// One tensor: its name, shape, and whether it is a norm weight (all ones).
struct TensorSpec {
    name: String,
    shape: Vec<usize>,
    ones: bool,
}

/// The tensors of a LLaMA workload, in file order (sorted by name, as writers do).
fn llama_tensors(w: &Workload) -> Vec<TensorSpec> {
    let m = w.llama();
    let (d, h, v) = (m.hidden_size, m.intermediate_size, m.vocab_size);
    let (q, kv) = (m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim);
    let mut specs = vec![
        TensorSpec { name: "model.embed_tokens.weight".into(), shape: vec![v, d], ones: false },
        TensorSpec { name: "model.norm.weight".into(), shape: vec![d], ones: true },
    ];
    if !m.tie_word_embeddings {
        specs.push(TensorSpec { name: "lm_head.weight".into(), shape: vec![v, d], ones: false });
    }
    for l in 0..m.num_layers {
        let p = format!("model.layers.{l}");
        let mut layer = vec![
            (format!("{p}.input_layernorm.weight"), vec![d], true),
            (format!("{p}.post_attention_layernorm.weight"), vec![d], true),
            (format!("{p}.self_attn.q_proj.weight"), vec![q, d], false),
            (format!("{p}.self_attn.k_proj.weight"), vec![kv, d], false),
            (format!("{p}.self_attn.v_proj.weight"), vec![kv, d], false),
            (format!("{p}.self_attn.o_proj.weight"), vec![d, q], false),
            (format!("{p}.mlp.gate_proj.weight"), vec![h, d], false),
            (format!("{p}.mlp.up_proj.weight"), vec![h, d], false),
            (format!("{p}.mlp.down_proj.weight"), vec![d, h], false),
        ];
        if m.qkv_bias {
            layer.push((format!("{p}.self_attn.q_proj.bias"), vec![q], false));
            layer.push((format!("{p}.self_attn.k_proj.bias"), vec![kv], false));
            layer.push((format!("{p}.self_attn.v_proj.bias"), vec![kv], false));
        }
        specs.extend(layer.into_iter().map(|(name, shape, ones)| TensorSpec { name, shape, ones }));
    }
    specs.sort_by(|a, b| a.name.cmp(&b.name));
    specs
}

/// The tensors of a BERT workload (the encoder, without the classification pooler), sorted by
/// name. LayerNorm weights are 1.
fn bert_tensors(w: &Workload) -> Vec<TensorSpec> {
    let m = w.bert();
    let (d, h) = (m.hidden_size, m.intermediate_size);
    let mut specs = vec![
        ("embeddings.word_embeddings.weight".to_string(), vec![m.vocab_size, d], false),
        ("embeddings.position_embeddings.weight".into(), vec![m.max_position_embeddings, d], false),
        ("embeddings.token_type_embeddings.weight".into(), vec![m.type_vocab_size, d], false),
        ("embeddings.LayerNorm.weight".into(), vec![d], true),
        ("embeddings.LayerNorm.bias".into(), vec![d], false),
    ];
    for l in 0..m.num_layers {
        let p = format!("encoder.layer.{l}");
        for (linear, rows, cols) in [
            ("attention.self.query", d, d),
            ("attention.self.key", d, d),
            ("attention.self.value", d, d),
            ("attention.output.dense", d, d),
            ("intermediate.dense", h, d),
            ("output.dense", d, h),
        ] {
            specs.push((format!("{p}.{linear}.weight"), vec![rows, cols], false));
            specs.push((format!("{p}.{linear}.bias"), vec![rows], false));
        }
        for norm in ["attention.output.LayerNorm", "output.LayerNorm"] {
            specs.push((format!("{p}.{norm}.weight"), vec![d], true));
            specs.push((format!("{p}.{norm}.bias"), vec![d], false));
        }
    }
    let mut specs: Vec<TensorSpec> =
        specs.into_iter().map(|(name, shape, ones)| TensorSpec { name, shape, ones }).collect();
    specs.sort_by(|a, b| a.name.cmp(&b.name));
    specs
}

/// config.json of a BERT workload, as transformers would read it.
fn bert_config(w: &Workload) -> Value {
    let m = w.bert();
    json!({
        "architectures": ["BertModel"],
        "model_type": "bert",
        "hidden_size": m.hidden_size,
        "intermediate_size": m.intermediate_size,
        "num_hidden_layers": m.num_layers,
        "num_attention_heads": m.num_heads,
        "vocab_size": m.vocab_size,
        "max_position_embeddings": m.max_position_embeddings,
        "type_vocab_size": m.type_vocab_size,
        "layer_norm_eps": m.layer_norm_eps,
        "hidden_act": "gelu",
        "pad_token_id": 0,
        "torch_dtype": if file_is_bf16(w) { "bfloat16" } else { "float32" },
    })
}

/// A WordPiece tokenizer.json with `vocab_size` entries that adds [CLS] and [SEP], as BERT's.
fn bert_tokenizer(vocab_size: usize) -> Value {
    const SPECIAL: [&str; 5] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];
    let mut vocab = serde_json::Map::new();
    for id in 0..vocab_size {
        let token = SPECIAL.get(id).map_or_else(|| format!("w{id}"), |s| s.to_string());
        vocab.insert(token, json!(id));
    }
    let special = |id: usize| json!({ "id": id, "content": SPECIAL[id], "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true });
    let token = |id: usize| json!({ "SpecialToken": { "id": SPECIAL[id], "type_id": 0 } });
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": (0..SPECIAL.len().min(vocab_size)).map(special).collect::<Vec<_>>(),
        "normalizer": { "type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null, "lowercase": true },
        "pre_tokenizer": { "type": "BertPreTokenizer" },
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [token(2), { "Sequence": { "id": "A", "type_id": 0 } }, token(3)],
            "pair": [token(2), { "Sequence": { "id": "A", "type_id": 0 } }, token(3), { "Sequence": { "id": "B", "type_id": 1 } }, { "SpecialToken": { "id": "[SEP]", "type_id": 1 } }],
            "special_tokens": {
                "[CLS]": { "id": "[CLS]", "ids": [2], "tokens": ["[CLS]"] },
                "[SEP]": { "id": "[SEP]", "ids": [3], "tokens": ["[SEP]"] }
            }
        },
        "decoder": { "type": "WordPiece", "prefix": "##", "cleanup": true },
        "model": { "type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100, "vocab": vocab }
    })
}

/// config.json of a LLaMA workload, as transformers would read it.
fn llama_config(w: &Workload) -> Value {
    let m = w.llama();
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": m.hidden_size,
        "intermediate_size": m.intermediate_size,
        "num_hidden_layers": m.num_layers,
        "num_attention_heads": m.num_heads,
        "num_key_value_heads": m.num_kv_heads,
        "head_dim": m.head_dim,
        "vocab_size": m.vocab_size,
        "max_position_embeddings": m.max_position_embeddings,
        "rms_norm_eps": m.rms_norm_eps,
        "rope_theta": m.rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": m.tie_word_embeddings,
        "bos_token_id": m.bos_token_id,
        "eos_token_id": m.eos_token_ids,
        "torch_dtype": if file_is_bf16(w) { "bfloat16" } else { "float32" },
    })
}

/// Whether the synthetic file holds bfloat16 (for bf16, int8 and int4 workloads) rather than f32.
fn file_is_bf16(w: &Workload) -> bool {
    matches!(w.weights.dtype, Dtype::Bf16 | Dtype::Int8 | Dtype::Int4)
}

/// A word-level tokenizer.json with `vocab_size` entries.
fn tokenizer(vocab_size: usize) -> Value {
    let mut vocab = serde_json::Map::new();
    for id in 0..vocab_size {
        let token = match id {
            0 => "<unk>".to_string(),
            1 => "<s>".to_string(),
            2 => "</s>".to_string(),
            n => format!("w{n}"),
        };
        vocab.insert(token, json!(id));
    }
    let special = |id: usize, content: &str| json!({ "id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true });
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
        "normalizer": null,
        "pre_tokenizer": { "type": "Whitespace" },
        "post_processor": null,
        "decoder": null,
        "model": { "type": "WordLevel", "vocab": vocab, "unk_token": "<unk>" }
    })
}

/// Writes config.json, model.safetensors and tokenizer.json for `w` into `dir`; returns the
/// number of parameters written.
pub fn write_model_dir(w: &Workload, dir: &Path, seed: u64) -> Result<u64, Error> {
    let write_json = |name: &str, value: &Value| {
        let text = serde_json::to_string_pretty(value).expect("JSON serializes") + "\n";
        crate::write::write_file(&dir.join(name), text.as_bytes())
    };
    let specs = match &w.model {
        Model::Llama(m) => {
            write_json("config.json", &llama_config(w))?;
            write_json("tokenizer.json", &tokenizer(m.vocab_size))?;
            llama_tensors(w)
        }
        Model::Bert(m) => {
            write_json("config.json", &bert_config(w))?;
            write_json("tokenizer.json", &bert_tokenizer(m.vocab_size))?;
            // sentence-transformers' modules: the pooling and normalization `init` reads back.
            let mut modules = vec![
                json!({ "idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer" }),
            ];
            if m.pooling != crate::workload::Pooling::None {
                modules.push(json!({ "idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling" }));
                let mean = m.pooling == crate::workload::Pooling::Mean;
                write_json(
                    "1_Pooling/config.json",
                    &json!({
                        "word_embedding_dimension": m.hidden_size,
                        "pooling_mode_cls_token": !mean,
                        "pooling_mode_mean_tokens": mean,
                        "pooling_mode_max_tokens": false,
                        "pooling_mode_mean_sqrt_len_tokens": false
                    }),
                )?;
            }
            if m.normalize {
                let idx = modules.len();
                modules.push(json!({ "idx": idx, "name": idx.to_string(), "path": "2_Normalize", "type": "sentence_transformers.models.Normalize" }));
            }
            write_json("modules.json", &Value::Array(modules))?;
            bert_tensors(w)
        }
    };

    // The file holds what a checkpoint for the workload would: bfloat16 for a bf16 workload
    // (its crate then maps the matrices in place) and for an int8 or int4 one (its crate
    // quantizes them at load, as it would a published bfloat16 checkpoint), f32 otherwise.
    let bf16 = file_is_bf16(w);
    let (dtype, width) = if bf16 { ("BF16", 2) } else { ("F32", 4) };
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for s in &specs {
        let bytes = width * s.shape.iter().product::<usize>();
        header.insert(
            s.name.clone(),
            json!({ "dtype": dtype, "shape": s.shape, "data_offsets": [offset, offset + bytes] }),
        );
        offset += bytes;
    }
    let mut header = serde_json::to_vec(&header).expect("JSON serializes");
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    // Uniform in ±√3·σ has standard deviation σ.
    let amplitude = WEIGHT_STD * 3f32.sqrt();
    let mut state = seed ^ 0x9e37_79b9_7f4a_7c15;
    let mut parameters = 0u64;
    crate::write::write_file_with(&dir.join("model.safetensors"), |out| {
        out.write_all(&(header.len() as u64).to_le_bytes())?;
        out.write_all(&header)?;
        for s in &specs {
            let n = s.shape.iter().product::<usize>();
            parameters += n as u64;
            for _ in 0..n {
                let value = if s.ones {
                    1.0f32
                } else {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let unit = (state >> 40) as f32 / (1u64 << 24) as f32;
                    (2.0 * unit - 1.0) * amplitude
                };
                if bf16 {
                    // Truncation: the values are random anyway, and exactly representable after.
                    out.write_all(&((value.to_bits() >> 16) as u16).to_le_bytes())?;
                } else {
                    out.write_all(&value.to_le_bytes())?;
                }
            }
        }
        Ok(())
    })?;
    Ok(parameters)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_cover_every_weight_of_the_workload() {
        let w = crate::workload::WorkloadSource::from_text("w.toml", crate::workload::tests_support::GOOD)
            .parse()
            .unwrap();
        let specs = llama_tensors(&w);
        let total: usize = specs.iter().map(|s| s.shape.iter().product::<usize>()).sum();
        let plan_params = {
            let m = w.llama();
            let (d, h, v) = (m.hidden_size, m.intermediate_size, m.vocab_size);
            let (q, kv) = (m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim);
            v * d + d + m.num_layers * (2 * d + q * d + 2 * kv * d + d * q + 3 * h * d)
        };
        assert_eq!(total, plan_params);
        assert!(specs.windows(2).all(|p| p[0].name < p[1].name), "sorted by name");
        assert_eq!(tokenizer(10)["model"]["vocab"]["w9"], 9);
    }
}
