//! `monogen init` for LLaMA-style decoders (LLaMA, Mistral, Qwen2): config.json's fields,
//! each honoured, known to be bookkeeping, or refused with the reason.

use std::path::Path;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Map, Value};

use super::options::{BOOKKEEPING, InitOptions, usize_field};
use crate::diagnostics::Diagnostic;
use crate::emit::Templates;
use crate::workload::{
    ArchitectureTag, Chat, DecoderRequest, Device, KvCache, Llama, Model, Request, RopeScaling, Serving,
    Target, Workload,
};
use crate::{Error, cpu};

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

/// Builds a LLaMA-style workload from a parsed config.json at `path` (`source` is its text,
/// for messages); a `model_type` that is not one of them is refused here.
pub fn workload(
    path: &Path,
    config: &Map<String, Value>,
    source: &Arc<str>,
    opts: &InitOptions,
) -> Result<Workload, Error> {
    let diag = |key: &str, message: String| super::config_diag(path, source, key, message);
    let mut problems = Vec::new();
    let qkv_bias = qkv_bias_of_model_type(config, path, &diag, &mut problems);
    let window = Window::of(config, &diag, &mut problems);
    check_keys(config, &window, &diag, &mut problems);
    let model = read_model(config, path, qkv_bias, window.size, &diag, &mut problems);
    if !problems.is_empty() {
        return Err(problems.into());
    }
    build(path, config, model, opts)
}

/// Makes a diagnostic of config.json pointing at a key.
type ConfigDiag<'a> = dyn Fn(&str, String) -> Diagnostic + 'a;

/// Whether the q, k and v projections of the `model_type` add a bias (Qwen2 is a LLaMA with
/// them); a problem when the model type is missing or not a LLaMA-style one.
fn qkv_bias_of_model_type(
    config: &Map<String, Value>,
    path: &Path,
    diag: &ConfigDiag,
    problems: &mut Vec<Diagnostic>,
) -> bool {
    let mut qkv_bias = false;
    match config.get("model_type").and_then(Value::as_str) {
        Some("llama") => {}
        Some("qwen2") => qkv_bias = true,
        Some("mistral") => {}
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
    qkv_bias
}

/// The sliding window of a config.json, as far as monogen honours it.
struct Window {
    /// Whether the window is switched off: full attention in every layer.
    off: bool,
    /// Whether the model is a Mistral, whose window (the same in every layer) the crate applies.
    mistral: bool,
    /// The window of a Mistral that has it on.
    size: Option<usize>,
}

impl Window {
    /// The window `config` states; a problem when a Mistral's `sliding_window` is not a size.
    fn of(config: &Map<String, Value>, diag: &ConfigDiag, problems: &mut Vec<Diagnostic>) -> Window {
        // A sliding window that is switched off changes nothing; one that is on is not supported
        // yet. (Qwen2 switches it with `use_sliding_window`; Mistral has only `sliding_window`,
        // on unless null.)
        let off = match config.get("use_sliding_window") {
            Some(v) => v == &Value::Bool(false),
            None => config.get("sliding_window").is_none_or(Value::is_null),
        } && config
            .get("layer_types")
            .is_none_or(|v| v.as_array().is_some_and(|layers| layers.iter().all(|l| l == "full_attention")));
        let mistral = config.get("model_type").and_then(Value::as_str) == Some("mistral");
        let size = if mistral && !off {
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
        Window { off, mistral, size }
    }
}

/// Every key of `config` that monogen neither honours nor knows to be bookkeeping must keep
/// its default (or a sliding window must be off, or a Mistral's); a problem for each that
/// does not, and for each unknown one.
fn check_keys(
    config: &Map<String, Value>,
    window: &Window,
    diag: &ConfigDiag,
    problems: &mut Vec<Diagnostic>,
) {
    for (key, value) in config {
        if HONOURED.contains(&key.as_str()) || BOOKKEEPING.contains(&key.as_str()) {
            continue;
        }
        let window_key = matches!(
            key.as_str(),
            "use_sliding_window" | "sliding_window" | "max_window_layers" | "layer_types"
        );
        if window_key && window.off {
            continue;
        }
        // Mistral's window: the same size in every layer, resolved when the crate is generated.
        if key == "sliding_window" && window.mistral {
            continue;
        }
        if window_key {
            problems.push(diag(key, format!("config.json field `{key}` cannot be honoured")).note(
                "sliding-window attention is not supported yet; only full attention in every layer is",
            ));
            continue;
        }
        problems.extend(super::unhonoured(key, required_default(key, value), &diag));
    }
}

/// The model's shapes and constants as config.json states them, with `qkv_bias` and the
/// `sliding_window` found before; a problem for each field that is missing without a default
/// or of the wrong type (and a placeholder value in its place).
fn read_model(
    config: &Map<String, Value>,
    path: &Path,
    qkv_bias: bool,
    sliding_window: Option<usize>,
    diag: &ConfigDiag,
    problems: &mut Vec<Diagnostic>,
) -> Llama {
    let mut usize_field =
        |key: &str, default: Option<usize>| usize_field(config, key, default, path, diag, problems);
    let hidden_size = usize_field("hidden_size", None);
    let intermediate_size = usize_field("intermediate_size", None);
    let num_layers = usize_field("num_hidden_layers", None);
    let num_heads = usize_field("num_attention_heads", None);
    let vocab_size = usize_field("vocab_size", None);
    let num_kv_heads = usize_field("num_key_value_heads", Some(num_heads));
    let head_dim = usize_field("head_dim", Some(hidden_size.checked_div(num_heads).unwrap_or(0)));
    let max_position_embeddings = usize_field("max_position_embeddings", Some(2048));
    let bos_token_id = usize_field("bos_token_id", Some(1)) as u32;

    let (rope_theta, rope_scaling) = rope(config, diag, problems);
    let rms_norm_eps = float_field(config, "rms_norm_eps", 1e-6, diag, problems);
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
    Llama {
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
    }
}

/// The number `key` of config.json, or `default`; a problem (and `default`) when it is not a
/// number.
fn float_field(
    config: &Map<String, Value>,
    key: &str,
    default: f64,
    diag: &ConfigDiag,
    problems: &mut Vec<Diagnostic>,
) -> f64 {
    match config.get(key) {
        None => default,
        Some(v) => v.as_f64().unwrap_or_else(|| {
            problems.push(diag(key, format!("config.json field `{key}` = {v} is not a number")));
            default
        }),
    }
}

/// The rotary embedding's base and scaling: `rope_theta`, overridden by the one of
/// `rope_parameters` or `rope_scaling`, and the first scaling either states; a problem for
/// a scaling monogen does not generate.
fn rope(
    config: &Map<String, Value>,
    diag: &ConfigDiag,
    problems: &mut Vec<Diagnostic>,
) -> (f64, Option<RopeScaling>) {
    let mut rope_theta = float_field(config, "rope_theta", 10000.0, diag, problems);
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
    (rope_theta, rope_scaling)
}

/// The workload of `model`, with the request, target and weights that `opts` gives or their
/// defaults for it.
fn build(
    path: &Path,
    config: &Map<String, Value>,
    model: Llama,
    opts: &InitOptions,
) -> Result<Workload, Error> {
    let max_seq_len = opts.max_seq_len.unwrap_or(model.max_position_embeddings.min(4096));
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
            "{model_dir} (Hugging Face {class}) with {} weights on {}",
            opts.dtype.as_str(),
            match &opts.cuda_arch {
                Some(arch) => format!("a CUDA GPU ({arch})"),
                None => format!("{} {}", cpu::host_arch(), Device::Cpu.as_str()),
            }
        )),
        model: Model::Llama(model),
        weights: opts.weights()?,
        kv_cache: KvCache { dtype: opts.kv_cache },
        target: Target {
            device: if opts.cuda_arch.is_some() { Device::Cuda } else { Device::Cpu },
            cuda_arch: opts.cuda_arch.clone(),
            arch: cpu::host_arch().to_string(),
            cpu_features,
            threads,
            hardware: opts.hardware.clone(),
        },
        request: Request::Decoder(DecoderRequest {
            max_batch: opts.max_batch.unwrap_or(if opts.serve { 8 } else { 1 }),
            max_seq_len,
            typical_prompt_len,
            typical_decode_len,
            requests_per_load: opts.requests_per_load,
            shared_prefix_len: opts.shared_prefix_len,
        }),
        serving: opts.serve.then(|| Serving {
            chat: path.parent().and_then(chat_template),
            ..toml::from_str("").expect("every field of [serving] has a default")
        }),
        quality: opts.quality(false),
        speculation: speculation(opts)?,
        source: Default::default(),
    })
}

/// The `[speculation]` table to write: the one asked for, left to measurement on the text of
/// `opts.typical_text` where that names a file.
fn speculation(opts: &InitOptions) -> Result<Option<crate::workload::Speculation>, Error> {
    let (Some(speculation), Some(file)) = (&opts.speculation, &opts.typical_text) else {
        return Ok(opts.speculation.clone());
    };
    let text = std::fs::read_to_string(file).map_err(|e| Error::io(file, e))?;
    if text.trim().is_empty() {
        return Err(Error::Refused(format!(
            "--typical-text {} is empty; it takes a file holding the prompt of a typical request",
            crate::shown(file)
        )));
    }
    Ok(Some(crate::workload::Speculation {
        speculator: crate::workload::Speculator::Measured,
        typical_text: Some(text),
        ..speculation.clone()
    }))
}

/// The chat template of model directory `dir`, as Hugging Face's tokenizer loads it:
/// chat_template.jinja, else tokenizer_config.json's `chat_template` (a string, or the one
/// named `default` of a list), with the `bos_token` and `eos_token` it renders; `None` for a
/// model without one (a base model).
pub fn chat_template(dir: &Path) -> Option<Chat> {
    let config: Value = std::fs::read_to_string(dir.join("tokenizer_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let template = match std::fs::read_to_string(dir.join("chat_template.jinja")) {
        Ok(text) => text,
        Err(_) => match config.get("chat_template")? {
            Value::String(text) => text.clone(),
            Value::Array(named) => named
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))?
                .get("template")?
                .as_str()?
                .to_string(),
            _ => return None,
        },
    };
    // A token is a string, or an added token's object with its `content`.
    let token = |name: &str| match config.get(name) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o.get("content").and_then(Value::as_str).unwrap_or_default().to_string(),
        _ => String::new(),
    };
    Some(Chat { template, bos_token: token("bos_token"), eos_token: token("eos_token") })
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
pub fn render(w: &Workload, m: &Llama, templates: &Templates, source: &Path) -> Result<String, Error> {
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
