//! `monogen init --hf DIR`: a workload from a Hugging Face model directory's config.json.
//!
//! Every field of config.json is accounted for: it is honoured (shapes, constants), known to
//! not change inference (bookkeeping such as `transformers_version`), or known to change the
//! model in a way monogen does not support yet, in which case init fails and names it. An
//! unknown field is an error too: it might change the model, and a crate that silently
//! computes something else is worse than no crate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::diagnostics::Diagnostic;
use crate::emit::Templates;
use crate::workload::{
    Activations, ArchitectureTag, DecoderRequest, Device, Dtype, KvCache, KvDtype, Llama, Model, Request,
    RopeScaling, Target, Weights, Workload,
};
use crate::{Error, cpu};

/// Which CPU features a new workload may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuFeatures {
    /// This machine's.
    Native,
    /// An x86-64 level (`x86-64-v3`, ...) or an explicit list.
    List(Vec<String>),
}

impl CpuFeatures {
    /// Parses `native`, a level name, `none`, or a comma-separated list.
    pub fn parse(text: &str) -> Result<CpuFeatures, String> {
        let text = text.trim();
        if text == "native" {
            return Ok(CpuFeatures::Native);
        }
        if text == "none" || text.is_empty() {
            return Ok(CpuFeatures::List(Vec::new()));
        }
        if let Some(level) = cpu::x86_64_level(text) {
            return Ok(CpuFeatures::List(level.into_iter().map(String::from).collect()));
        }
        let list: Vec<String> =
            text.split(',').map(|f| f.trim().to_string()).filter(|f| !f.is_empty()).collect();
        for f in &list {
            if !cpu::X86_64_FEATURES.contains(&f.as_str()) {
                let near = crate::diagnostics::nearest(f, cpu::X86_64_FEATURES.iter().copied())
                    .map(|n| format!(" (did you mean `{n}`?)"))
                    .unwrap_or_default();
                return Err(format!(
                    "unknown CPU feature `{f}`{near}; use native, none, one of {}, or a list of: {}",
                    cpu::X86_64_LEVELS.join(", "),
                    cpu::X86_64_FEATURES.join(", ")
                ));
            }
        }
        Ok(CpuFeatures::List(list))
    }
}

impl CpuFeatures {
    /// The feature names, in canonical order.
    pub fn resolve(&self) -> Vec<String> {
        match self {
            CpuFeatures::Native => cpu::host_features().into_iter().map(String::from).collect(),
            CpuFeatures::List(list) => cpu::X86_64_FEATURES
                .iter()
                .filter(|f| list.iter().any(|l| l == *f))
                .map(|f| f.to_string())
                .collect(),
        }
    }
}

/// What `init` needs besides config.json.
#[derive(Debug, Clone)]
pub struct InitOptions {
    pub name: String,
    pub dtype: Dtype,
    /// What the linear layers' products read their activations as (`bf16` needs bf16 weights).
    pub activations: Activations,
    /// The KV cache's element type (decoders only).
    pub kv_cache: KvDtype,
    /// Default: this machine's available parallelism.
    pub threads: Option<usize>,
    pub cpu_features: CpuFeatures,
    /// Default: min(max_position_embeddings, 4096).
    pub max_seq_len: Option<usize>,
    /// Default: min(128, max_seq_len / 2).
    pub typical_prompt_len: Option<usize>,
    /// Default: min(128, max_seq_len - typical_prompt_len).
    pub typical_decode_len: Option<usize>,
    /// The hardware class whose measurements choose the kernels (`target.hardware`).
    pub hardware: Option<String>,
    /// Encoders only: most sentences per call (default 32).
    pub max_batch: Option<usize>,
    /// `request.requests_per_load`: when the load counts in the rankings.
    pub requests_per_load: Option<u64>,
}

impl InitOptions {
    /// The `[weights]` table these options ask for, refused when `--activations bf16` comes
    /// without `--dtype bf16`.
    pub(crate) fn weights(&self) -> Result<Weights, Error> {
        if self.activations == Activations::Bf16 && self.dtype != Dtype::Bf16 {
            return Err(Error::Refused(format!(
                "--activations bf16 rounds the activations of bf16 weights' products, and --dtype is {}; add --dtype bf16",
                self.dtype.as_str()
            )));
        }
        Ok(Weights { dtype: self.dtype, activations: self.activations })
    }
}

/// config.json keys that do not change what inference computes.
pub(crate) const BOOKKEEPING: &[&str] = &[
    "_name_or_path",
    "architectures",
    "attention_dropout",
    "bad_words_ids",
    "dtype",
    "initializer_range",
    "model_type",
    "output_attentions",
    "output_hidden_states",
    "pad_token_id",
    "return_dict",
    "torch_dtype",
    "torchscript",
    "transformers_version",
    "use_cache",
];

/// config.json keys monogen honours.
const HONOURED: &[&str] = &[
    "bos_token_id",
    "eos_token_id",
    "head_dim",
    "hidden_size",
    "intermediate_size",
    "max_position_embeddings",
    "num_attention_heads",
    "num_hidden_layers",
    "num_key_value_heads",
    "rms_norm_eps",
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
    "tie_word_embeddings",
    "vocab_size",
];

/// config.json keys whose default monogen supports, and what else would need.
fn required_default(key: &str, value: &Value) -> Option<Result<(), String>> {
    let ok = match key {
        "hidden_act" => value == "silu",
        "attention_bias" | "mlp_bias" => value == &Value::Bool(false),
        "pretraining_tp" => value.as_u64() == Some(1),
        _ => return None,
    };
    Some(if ok {
        Ok(())
    } else {
        Err(match key {
            "hidden_act" => format!("hidden_act = {value} is not supported: LLaMA's MLP is SwiGLU with silu"),
            "attention_bias" | "mlp_bias" => format!(
                "{key} = {value}: projection biases are not supported yet (they come with Qwen2-style models)"
            ),
            _ => format!(
                "pretraining_tp = {value}: only 1 is supported (it changes how the projections are split)"
            ),
        })
    })
}

/// The non-negative integer `key` of config.json, or `default`; a problem (and 0) when it is
/// missing without a default or is not such an integer.
pub(crate) fn usize_field(
    config: &Map<String, Value>,
    key: &str,
    default: Option<usize>,
    path: &Path,
    diag: &dyn Fn(&str, String) -> Diagnostic,
    problems: &mut Vec<Diagnostic>,
) -> usize {
    match config.get(key) {
        Some(v) => v.as_u64().map(|n| n as usize).unwrap_or_else(|| {
            problems
                .push(diag(key, format!("config.json field `{key}` = {v} is not a non-negative integer")));
            0
        }),
        None => default.unwrap_or_else(|| {
            problems.push(
                Diagnostic::new(format!("config.json has no `{key}`"))
                    .at_path(path)
                    .hint("monogen does not guess shapes; add the field"),
            );
            0
        }),
    }
}

/// The rope scaling a `rope_parameters` or `rope_scaling` object states: none for the default
/// type, linear and llama3 scaling, an error naming anything else.
fn scaling_of(parameters: &Value) -> Result<Option<RopeScaling>, String> {
    let kind = parameters
        .get("rope_type")
        .or_else(|| parameters.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let number = |key: &str| -> Result<f64, String> {
        parameters
            .get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("rope_type \"{kind}\" needs a numeric `{key}`"))
    };
    match kind {
        "default" => Ok(None),
        "linear" => Ok(Some(RopeScaling::Linear { factor: number("factor")? })),
        "llama3" => Ok(Some(RopeScaling::Llama3 {
            factor: number("factor")?,
            low_freq_factor: number("low_freq_factor")?,
            high_freq_factor: number("high_freq_factor")?,
            original_max_position_embeddings: number("original_max_position_embeddings")? as usize,
        })),
        other => Err(format!(
            "rope_type \"{other}\" is not supported: monogen generates the default, \"linear\" and \"llama3\" rope"
        )),
    }
}

/// Reads `dir/config.json` and builds a workload from it.
pub fn workload_from_hf(dir: &Path, opts: &InitOptions) -> Result<Workload, Error> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        Diagnostic::new(format!("cannot read config.json: {e}"))
            .at_path(&path)
            .hint("pass a Hugging Face model directory, the one that holds config.json")
    })?;
    workload_from_config(&path, &text, opts)
}

/// Builds a workload from the text of a config.json (`path` is for messages only).
pub fn workload_from_config(path: &Path, text: &str, opts: &InitOptions) -> Result<Workload, Error> {
    let source: Arc<str> = Arc::from(text);
    let config: Map<String, Value> = match serde_json::from_str(text) {
        Ok(Value::Object(map)) => map,
        Ok(_) => return Err(Diagnostic::new("config.json is not a JSON object").at_path(path).into()),
        Err(e) => {
            let offset = crate::diagnostics::offset_of(text, e.line(), e.column());
            return Err(Diagnostic::new(format!("config.json is not valid JSON: {e}"))
                .in_file(path, &source)
                .primary(offset..offset + 1, "")
                .into());
        }
    };
    let key_span = |key: &str| {
        let needle = format!("\"{key}\"");
        text.find(&needle).map_or(0..0, |i| i..i + needle.len())
    };
    let diag = |key: &str, message: String| {
        Diagnostic::new(message).in_file(path, &source).primary(key_span(key), "")
    };
    let mut problems = Vec::new();

    // Qwen2 is a LLaMA with biases on the q, k and v projections.
    let mut qkv_bias = false;
    match config.get("model_type").and_then(Value::as_str) {
        Some("llama") => {}
        Some("qwen2") => qkv_bias = true,
        Some("mistral") => {}
        Some("bert") => return crate::init_bert::workload(path, &config, &source, opts),
        Some(other) => problems.push(diag(
            "model_type",
            format!(
                "model_type `{other}` is not supported: monogen generates `llama`, `mistral`, `qwen2` and `bert` models"
            ),
        )),
        None => problems.push(
            Diagnostic::new("config.json has no `model_type`")
                .at_path(path)
                .hint("a Hugging Face config.json names its model_type, e.g. \"llama\""),
        ),
    }
    // A sliding window that is switched off changes nothing; one that is on is not supported yet.
    // (Qwen2 switches it with `use_sliding_window`; Mistral has only `sliding_window`, on
    // unless null.)
    let window_off = match config.get("use_sliding_window") {
        Some(v) => v == &Value::Bool(false),
        None => config.get("sliding_window").is_none_or(Value::is_null),
    } && config
        .get("layer_types")
        .is_none_or(|v| v.as_array().is_some_and(|layers| layers.iter().all(|l| l == "full_attention")));
    let is_mistral = config.get("model_type").and_then(Value::as_str) == Some("mistral");
    let sliding_window = if is_mistral && !window_off {
        match config.get("sliding_window").and_then(Value::as_u64) {
            Some(w) => Some(w as usize),
            None => {
                problems.push(diag(
                    "sliding_window",
                    "config.json field `sliding_window` is not a window size".into(),
                ));
                None
            }
        }
    } else {
        None
    };
    for (key, value) in &config {
        if HONOURED.contains(&key.as_str()) || BOOKKEEPING.contains(&key.as_str()) {
            continue;
        }
        let window_key = matches!(
            key.as_str(),
            "use_sliding_window" | "sliding_window" | "max_window_layers" | "layer_types"
        );
        if window_key && window_off {
            continue;
        }
        // Mistral's window: the same size in every layer, resolved when the crate is generated.
        if key == "sliding_window" && is_mistral {
            continue;
        }
        if window_key {
            problems.push(diag(key, format!("config.json field `{key}` cannot be honoured")).note(
                "sliding-window attention is not supported yet; only full attention in every layer is",
            ));
            continue;
        }
        match required_default(key, value) {
            Some(Ok(())) => {}
            Some(Err(why)) => problems.push(diag(key, format!("config.json field `{key}` cannot be honoured")).note(why)),
            None => problems.push(
                diag(key, format!("config.json field `{key}` is unknown to monogen"))
                    .note("it might change what the model computes, so monogen will not guess")
                    .hint("if this field does not affect inference, add it to the bookkeeping list in generator/src/init.rs"),
            ),
        }
    }

    let mut usize_field =
        |key: &str, default: Option<usize>| usize_field(&config, key, default, path, &diag, &mut problems);
    let hidden_size = usize_field("hidden_size", None);
    let intermediate_size = usize_field("intermediate_size", None);
    let num_layers = usize_field("num_hidden_layers", None);
    let num_heads = usize_field("num_attention_heads", None);
    let vocab_size = usize_field("vocab_size", None);
    let num_kv_heads = usize_field("num_key_value_heads", Some(num_heads));
    let head_dim = usize_field("head_dim", Some(hidden_size.checked_div(num_heads).unwrap_or(0)));
    let max_position_embeddings = usize_field("max_position_embeddings", Some(2048));
    let bos_token_id = usize_field("bos_token_id", Some(1)) as u32;

    let float_field = |key: &str, default: f64, problems: &mut Vec<Diagnostic>| -> f64 {
        match config.get(key) {
            None => default,
            Some(v) => v.as_f64().unwrap_or_else(|| {
                problems.push(diag(key, format!("config.json field `{key}` = {v} is not a number")));
                default
            }),
        }
    };
    let mut rope_theta = float_field("rope_theta", 10000.0, &mut problems);
    // transformers 5 writes `rope_parameters = {rope_type, rope_theta, ...}`; older configs a
    // `rope_theta` and a `rope_scaling = {type or rope_type, ...}` (null without scaling).
    let mut rope_scaling = None;
    for key in ["rope_parameters", "rope_scaling"] {
        let Some(parameters) = config.get(key).filter(|v| !v.is_null()) else { continue };
        if let Some(theta) = parameters.get("rope_theta").and_then(Value::as_f64) {
            rope_theta = theta;
        }
        match scaling_of(parameters) {
            Ok(scaling) => rope_scaling = rope_scaling.or(scaling),
            Err(why) => {
                problems.push(diag(key, format!("config.json field `{key}` cannot be honoured")).note(why))
            }
        }
    }
    let rms_norm_eps = float_field("rms_norm_eps", 1e-6, &mut problems);
    let tie_word_embeddings = match config.get("tie_word_embeddings") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            problems.push(diag(
                "tie_word_embeddings",
                format!("config.json field `tie_word_embeddings` = {v} is not a boolean"),
            ));
            false
        }
    };
    let eos_token_ids = match config.get("eos_token_id") {
        None => vec![2],
        Some(Value::Number(n)) if n.as_u64().is_some() => vec![n.as_u64().unwrap_or_default() as u32],
        Some(Value::Array(items)) if items.iter().all(|v| v.as_u64().is_some()) => {
            items.iter().filter_map(Value::as_u64).map(|n| n as u32).collect()
        }
        Some(v) => {
            problems.push(diag(
                "eos_token_id",
                format!("config.json field `eos_token_id` = {v} is not an id or a list of ids"),
            ));
            vec![]
        }
    };
    if !problems.is_empty() {
        return Err(problems.into());
    }

    let max_seq_len = opts.max_seq_len.unwrap_or(max_position_embeddings.min(4096));
    let typical_prompt_len = opts.typical_prompt_len.unwrap_or((max_seq_len / 2).clamp(1, 128));
    let typical_decode_len =
        opts.typical_decode_len.unwrap_or(max_seq_len.saturating_sub(typical_prompt_len).min(128));
    let cpu_features = opts.cpu_features.resolve();
    let threads = opts.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let model_dir =
        path.parent().and_then(Path::file_name).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let class = config
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .unwrap_or("LlamaForCausalLM")
        .to_string();
    Ok(Workload {
        name: opts.name.clone(),
        description: Some(format!(
            "{model_dir} (Hugging Face {class}) with {} weights on {} {}",
            opts.dtype.as_str(),
            cpu::host_arch(),
            Device::Cpu.as_str()
        )),
        model: Model::Llama(Llama {
            tag: ArchitectureTag,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size,
            max_position_embeddings,
            rope_theta,
            rms_norm_eps,
            tie_word_embeddings,
            bos_token_id,
            eos_token_ids,
            qkv_bias,
            rope_scaling,
            sliding_window,
        }),
        weights: opts.weights()?,
        kv_cache: KvCache { dtype: opts.kv_cache },
        target: Target {
            device: Device::Cpu,
            arch: cpu::host_arch().to_string(),
            cpu_features,
            threads,
            hardware: opts.hardware.clone(),
        },
        request: Request::Decoder(DecoderRequest {
            max_batch: 1,
            max_seq_len,
            typical_prompt_len,
            typical_decode_len,
            requests_per_load: opts.requests_per_load,
        }),
    })
}

#[derive(Serialize)]
struct WorkloadContext<'a> {
    w: &'a Workload,
    m: &'a Llama,
    rope_theta: String,
    rms_norm_eps: String,
    kv_dtype: &'static str,
    source: String,
}

/// The workload as a commented TOML file; `source` says where it came from.
pub fn render(w: &Workload, templates: &Templates, source: &Path) -> Result<String, Error> {
    if let Model::Bert(m) = &w.model {
        return crate::init_bert::render(w, m, templates, source);
    }
    let m = w.llama();
    let context = WorkloadContext {
        w,
        m,
        rope_theta: format!("{:?}", m.rope_theta),
        rms_norm_eps: format!("{:?}", m.rms_norm_eps),
        kv_dtype: w.kv_cache.dtype.as_str(),
        source: source.display().to_string(),
    };
    templates.render("workload.toml.j2", &context)
}

/// Default output path of `init`: `workloads/<name>.toml` under the project root.
pub fn default_path(root: &Path, name: &str) -> PathBuf {
    root.join("workloads").join(format!("{name}.toml"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STORIES: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_size": 64,
  "intermediate_size": 172,
  "num_hidden_layers": 5,
  "num_attention_heads": 8,
  "num_key_value_heads": 4,
  "head_dim": 8,
  "vocab_size": 512,
  "max_position_embeddings": 512,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "rope_scaling": null,
  "hidden_act": "silu",
  "attention_bias": false,
  "mlp_bias": false,
  "tie_word_embeddings": true,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "pretraining_tp": 1,
  "torch_dtype": "float32"
}"#;

    fn opts() -> InitOptions {
        InitOptions {
            name: "t".into(),
            dtype: Dtype::F32,
            activations: Activations::F32,
            kv_cache: KvDtype::F32,
            threads: Some(2),
            cpu_features: CpuFeatures::parse("x86-64-v3").unwrap(),
            max_seq_len: None,
            typical_prompt_len: None,
            typical_decode_len: None,
            hardware: Some("intel-xeon-2c".into()),
            max_batch: None,
            requests_per_load: None,
        }
    }

    fn from(text: &str) -> Result<Workload, String> {
        workload_from_config(Path::new("m/config.json"), text, &opts()).map_err(|e| e.to_string())
    }

    #[test]
    fn reads_a_llama_config() {
        let w = from(STORIES).unwrap();
        let m = w.llama();
        assert_eq!((m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim), (64, 5, 8, 4, 8));
        assert_eq!(m.eos_token_ids, [2]);
        assert!(m.tie_word_embeddings);
        assert_eq!(w.request.max_seq_len(), 512);
        assert_eq!((w.decoder().typical_prompt_len, w.decoder().typical_decode_len), (128, 128));
        assert!(w.target.cpu_features.contains(&"avx2".to_string()));
    }

    #[test]
    fn unsupported_fields_are_named() {
        let e = from(
            &STORIES
                .replace("\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 2.0}"),
        )
        .unwrap_err();
        assert!(e.contains("m/config.json:14:3: config.json field `rope_scaling` cannot be honoured"), "{e}");
        let e = from(&STORIES.replace("\"attention_bias\": false", "\"attention_bias\": true")).unwrap_err();
        assert!(e.contains("`attention_bias` cannot be honoured"), "{e}");
        let e = from(&STORIES.replace("\"pretraining_tp\": 1", "\"sliding_window\": 4096")).unwrap_err();
        assert!(e.contains("`sliding_window` cannot be honoured"), "{e}");
        let e = from(&STORIES.replace("\"llama\"", "\"mixtral\"")).unwrap_err();
        assert!(e.contains("model_type `mixtral` is not supported"), "{e}");
        // Mistral's window is resolved into the workload.
        let mistral = STORIES
            .replace("\"llama\"", "\"mistral\"")
            .replace("\"pretraining_tp\": 1", "\"sliding_window\": 16");
        let w = workload_from_config(Path::new("m/config.json"), &mistral, &opts()).unwrap();
        assert_eq!(w.llama().sliding_window, Some(16));
        let e = from(&STORIES.replace("  \"hidden_size\": 64,\n", "")).unwrap_err();
        assert!(e.contains("config.json has no `hidden_size`"), "{e}");
    }

    #[test]
    fn defaults_follow_transformers() {
        let text = STORIES
            .replace("  \"num_key_value_heads\": 4,\n", "")
            .replace("  \"head_dim\": 8,\n", "")
            .replace("\"eos_token_id\": 2", "\"eos_token_id\": [2, 7]");
        let w = from(&text).unwrap();
        assert_eq!((w.llama().num_kv_heads, w.llama().head_dim), (8, 8));
        assert_eq!(w.llama().eos_token_ids, [2, 7]);
    }

    #[test]
    fn cpu_feature_option_forms() {
        assert_eq!(CpuFeatures::parse("native").unwrap(), CpuFeatures::Native);
        assert_eq!(CpuFeatures::parse("none").unwrap(), CpuFeatures::List(vec![]));
        assert_eq!(
            CpuFeatures::parse("avx2, fma").unwrap(),
            CpuFeatures::List(vec!["avx2".into(), "fma".into()])
        );
        assert!(CpuFeatures::parse("avx3").unwrap_err().contains("unknown CPU feature `avx3`"));
    }

    #[test]
    fn qwen2_configs_give_q_k_v_biases_and_refuse_a_sliding_window() {
        let qwen2 = STORIES
            .replace(r#""model_type": "llama""#, r#""model_type": "qwen2", "use_sliding_window": false, "sliding_window": 4096, "max_window_layers": 28"#)
            .replace(r#""attention_bias": false,"#, "")
            .replace(r#""mlp_bias": false,"#, "");
        let w = workload_from_config(Path::new("m/config.json"), &qwen2, &opts()).unwrap();
        assert!(w.llama().qkv_bias);
        let on = qwen2.replace(r#""use_sliding_window": false"#, r#""use_sliding_window": true"#);
        let e = workload_from_config(Path::new("m/config.json"), &on, &opts()).unwrap_err().to_string();
        assert!(e.contains("config.json field `use_sliding_window` cannot be honoured"), "{e}");
    }
}
