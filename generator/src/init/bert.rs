//! `monogen init` for BERT encoders: config.json, plus the sentence-transformers files beside
//! it when they are there (`1_Pooling/config.json` for the pooling, `modules.json` for
//! normalization, `sentence_bert_config.json` for the maximum sequence length).

use std::path::Path;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Map, Value};

use super::options::{BOOKKEEPING, InitOptions, usize_field};
use crate::diagnostics::Diagnostic;
use crate::emit::Templates;
use crate::workload::{
    Activation, ArchitectureTag, Bert, Device, EncoderRequest, KvCache, KvDtype, Model, Pooling, Request,
    Serving, Target, Workload,
};
use crate::{Error, cpu};

/// config.json keys of a BERT model that monogen honours.
const HONOURED: &[&str] = &[
    "hidden_act",
    "hidden_size",
    "intermediate_size",
    "layer_norm_eps",
    "max_position_embeddings",
    "num_attention_heads",
    "num_hidden_layers",
    "type_vocab_size",
    "vocab_size",
];

/// Keys of BERT configs that only matter for training.
const TRAINING_ONLY: &[&str] =
    &["attention_probs_dropout_prob", "classifier_dropout", "gradient_checkpointing", "hidden_dropout_prob"];

/// Keys whose default monogen supports, with what it supports.
fn required_default(key: &str, value: &Value) -> Option<Result<(), String>> {
    let (ok, why) = match key {
        "position_embedding_type" => (value == "absolute", "only absolute position embeddings are supported"),
        "is_decoder" | "add_cross_attention" => {
            (value == &Value::Bool(false), "only encoders (no decoder, no cross-attention) are supported")
        }
        "chunk_size_feed_forward" => (value.as_u64() == Some(0), "chunked feed-forward is not supported"),
        _ => return None,
    };
    Some(if ok { Ok(()) } else { Err(format!("{key} = {value}: {why}")) })
}

/// Builds a BERT workload from a parsed config.json at `path`.
pub fn workload(
    path: &Path,
    config: &Map<String, Value>,
    source: &Arc<str>,
    opts: &InitOptions,
) -> Result<Workload, Error> {
    if opts.kv_cache != KvDtype::F32 {
        return Err(Error::Refused(format!(
            "--kv-cache {}: {} is a BERT encoder, which keeps no KV cache; leave the option out",
            opts.kv_cache.as_str(),
            path.display()
        )));
    }
    if opts.speculation.is_some() {
        return Err(Error::Refused(format!(
            "--speculate: {} is a BERT encoder, which generates no tokens to draft; leave the option out",
            path.display()
        )));
    }
    if opts.shared_prefix_len.is_some() {
        return Err(Error::Refused(format!(
            "--shared-prefix-len: {} is a BERT encoder, whose server keeps no KV caches to share; leave the option out",
            path.display()
        )));
    }
    let diag = |key: &str, message: String| super::config_diag(path, source, key, message);
    let mut problems = Vec::new();
    for (key, value) in config {
        let key = key.as_str();
        if HONOURED.contains(&key) || BOOKKEEPING.contains(&key) || TRAINING_ONLY.contains(&key) {
            continue;
        }
        problems.extend(super::unhonoured(key, required_default(key, value), &diag));
    }
    let mut usize_field =
        |key: &str, default: Option<usize>| usize_field(config, key, default, path, &diag, &mut problems);
    let hidden_size = usize_field("hidden_size", None);
    let intermediate_size = usize_field("intermediate_size", None);
    let num_layers = usize_field("num_hidden_layers", None);
    let num_heads = usize_field("num_attention_heads", None);
    let vocab_size = usize_field("vocab_size", None);
    let max_position_embeddings = usize_field("max_position_embeddings", Some(512));
    let type_vocab_size = usize_field("type_vocab_size", Some(2));
    let layer_norm_eps = match config.get("layer_norm_eps") {
        None => 1e-12,
        Some(v) => v.as_f64().unwrap_or_else(|| {
            problems.push(diag(
                "layer_norm_eps",
                format!("config.json field `layer_norm_eps` = {v} is not a number"),
            ));
            1e-12
        }),
    };
    match config.get("hidden_act") {
        None => {}
        Some(v) if v == "gelu" => {}
        Some(v) => problems.push(
            diag("hidden_act", "config.json field `hidden_act` cannot be honoured".into())
                .note(format!("hidden_act = {v}: only \"gelu\" (the exact erf form) is supported")),
        ),
    }

    let dir = path.parent().unwrap_or(Path::new("."));
    let (pooling, normalize, st_max_seq_len) = match sentence_transformers(dir) {
        Ok(found) => found,
        Err(d) => {
            problems.push(d);
            (Pooling::None, false, None)
        }
    };
    if opts.serve && pooling == Pooling::None {
        problems.push(
            Diagnostic::new("--serve: an embeddings server needs a pooled model".to_string())
                .at_path(&dir.join("modules.json"))
                .note("`/v1/embeddings` answers one vector per input; this model has no sentence-transformers pooling (modules.json)".to_string()),
        );
    }
    if !problems.is_empty() {
        return Err(problems.into());
    }

    let head_dim = hidden_size.checked_div(num_heads).unwrap_or(0);
    let max_seq_len =
        opts.max_seq_len.or(st_max_seq_len).unwrap_or(max_position_embeddings).min(max_position_embeddings);
    let max_batch = opts.max_batch.unwrap_or(32);
    let typical_seq_len = opts.typical_prompt_len.unwrap_or(12.min(max_seq_len));
    let model_dir = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    Ok(Workload {
        name: opts.name.clone(),
        description: Some(format!(
            "{model_dir} (Hugging Face BertModel, {} pooling) with {} weights on {} {}",
            pooling.as_str(),
            opts.dtype.as_str(),
            cpu::host_arch(),
            Device::Cpu.as_str()
        )),
        model: Model::Bert(Bert {
            tag: ArchitectureTag,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            head_dim,
            vocab_size,
            max_position_embeddings,
            type_vocab_size,
            layer_norm_eps,
            hidden_act: Activation::Gelu,
            pooling,
            normalize,
        }),
        weights: match opts.classifier_dtype {
            Some(_) => {
                return Err(Error::Refused(
                    "--classifier-dtype is for decoders: a BERT encoder has no classifier".into(),
                ));
            }
            None => opts.weights()?,
        },
        kv_cache: KvCache::default(),
        target: Target {
            device: if opts.cuda_arch.is_some() { Device::Cuda } else { Device::Cpu },
            cuda_arch: opts.cuda_arch.clone(),
            arch: cpu::host_arch().to_string(),
            cpu_features: opts.cpu_features.resolve(),
            threads: opts
                .threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            hardware: opts.hardware.clone(),
        },
        request: Request::Encoder(EncoderRequest {
            max_batch,
            max_seq_len,
            typical_seq_len,
            typical_batch: 1,
            requests_per_load: opts.requests_per_load,
        }),
        serving: opts.serve.then(|| Serving {
            batch_wait_ms: Some(2),
            ..toml::from_str("").expect("every field of [serving] has a default")
        }),
        quality: opts.quality(true),
        speculation: None,
        source: Default::default(),
    })
}

/// The pooling, normalization and maximum sequence length of a sentence-transformers model
/// directory; `(None, false, None)` for a plain BERT model.
#[allow(clippy::result_large_err)]
fn sentence_transformers(dir: &Path) -> Result<(Pooling, bool, Option<usize>), Diagnostic> {
    let read = |rel: &str| -> Result<Option<Value>, Diagnostic> {
        let path = dir.join(rel);
        match std::fs::read_to_string(&path) {
            Err(_) => Ok(None),
            Ok(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| Diagnostic::new(format!("{rel} is not valid JSON: {e}")).at_path(&path)),
        }
    };
    let modules = read("modules.json")?;
    let module_types: Vec<(String, String)> = modules
        .as_ref()
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .map(|m| {
                    let field = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
                    (field("type"), field("path"))
                })
                .collect()
        })
        .unwrap_or_default();
    let pooling_dir = module_types
        .iter()
        .find(|(t, _)| t.ends_with(".Pooling"))
        .map(|(_, p)| p.clone())
        .or_else(|| dir.join("1_Pooling").is_dir().then(|| "1_Pooling".to_string()));
    let pooling = match pooling_dir {
        None => Pooling::None,
        Some(p) => {
            let rel = format!("{p}/config.json");
            let config = read(&rel)?.unwrap_or(Value::Null);
            let on = |k: &str| config.get(k).and_then(Value::as_bool).unwrap_or(false);
            match (on("pooling_mode_mean_tokens"), on("pooling_mode_cls_token")) {
                (true, false)
                    if !on("pooling_mode_max_tokens") && !on("pooling_mode_mean_sqrt_len_tokens") =>
                {
                    Pooling::Mean
                }
                (false, true)
                    if !on("pooling_mode_max_tokens") && !on("pooling_mode_mean_sqrt_len_tokens") =>
                {
                    Pooling::Cls
                }
                _ => {
                    return Err(Diagnostic::new(format!("{rel}: this pooling is not supported"))
                        .at_path(&dir.join(&rel))
                        .note("monogen generates mean pooling or [CLS] pooling, one of them")
                        .hint("set model.pooling by hand in the workload if another mode is equivalent"));
                }
            }
        }
    };
    let normalize = module_types.iter().any(|(t, _)| t.ends_with(".Normalize"));
    let max_seq_len = read("sentence_bert_config.json")?
        .and_then(|c| c.get("max_seq_length").and_then(Value::as_u64))
        .map(|n| n as usize);
    Ok((pooling, normalize, max_seq_len))
}

#[derive(Serialize)]
struct Context<'a> {
    w: &'a Workload,
    m: &'a Bert,
    r: &'a EncoderRequest,
    layer_norm_eps: String,
    source: String,
}

/// The BERT workload as a commented TOML file.
pub fn render(w: &Workload, m: &Bert, templates: &Templates, source: &Path) -> Result<String, Error> {
    let context = Context {
        w,
        m,
        r: w.encoder(),
        layer_norm_eps: format!("{:?}", m.layer_norm_eps),
        source: source.display().to_string(),
    };
    templates.render("bert/workload.toml.j2", &context)
}

#[cfg(test)]
mod tests {
    use crate::init::{InitOptions, workload_from_config};
    use crate::workload::Pooling;
    use std::path::Path;

    const MINILM: &str = r#"{
  "architectures": ["BertModel"], "model_type": "bert", "hidden_act": "gelu",
  "hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 6, "num_attention_heads": 12,
  "vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
  "position_embedding_type": "absolute", "hidden_dropout_prob": 0.1, "pad_token_id": 0
}"#;

    fn opts() -> InitOptions {
        InitOptions::for_tests("m")
    }

    #[test]
    fn a_plain_bert_config_gives_an_encoder_without_pooling() {
        let w = workload_from_config(Path::new("/nonexistent/m/config.json"), MINILM, &opts()).unwrap();
        let m = w.bert();
        assert_eq!((m.hidden_size, m.num_heads, m.head_dim, m.num_layers), (384, 12, 32, 6));
        assert_eq!((m.pooling, m.normalize), (Pooling::None, false));
        let r = w.encoder();
        assert_eq!((r.max_seq_len, r.max_batch, r.typical_seq_len, r.typical_batch), (512, 32, 12, 1));
    }

    #[test]
    fn configs_it_cannot_honour_are_refused_by_field() {
        for (from, to, expected) in [
            (
                r#""position_embedding_type": "absolute""#,
                r#""position_embedding_type": "relative_key""#,
                "position_embedding_type",
            ),
            (r#""hidden_act": "gelu""#, r#""hidden_act": "gelu_new""#, "hidden_act"),
            (r#""pad_token_id": 0"#, r#""pad_token_id": 0, "num_experts": 8"#, "num_experts"),
        ] {
            let config = MINILM.replace(from, to);
            let e =
                workload_from_config(Path::new("m/config.json"), &config, &opts()).unwrap_err().to_string();
            assert!(e.contains(&format!("config.json field `{expected}`")), "{e}");
        }
    }
}
