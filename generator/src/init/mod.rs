//! `monogen init --hf DIR`: a workload from a Hugging Face model directory's config.json.
//!
//! Every field of config.json is accounted for: it is honoured (shapes, constants), known to
//! not change inference (bookkeeping such as `transformers_version`), or known to change the
//! model in a way monogen does not support yet, in which case init fails and names it. An
//! unknown field is an error too: it might change the model, and a crate that silently
//! computes something else is worse than no crate.

//!
//! [`options`] holds what every architecture shares; [`llama`] and [`bert`] read their own
//! fields. This module reads the file and hands it to the architecture its `model_type` names.

mod bert;
mod llama;
mod options;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::Error;
use crate::diagnostics::Diagnostic;
use crate::emit::Templates;
use crate::workload::{Model, Workload};

pub use options::{CpuFeatures, InitOptions};

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
    match config.get("model_type").and_then(Value::as_str) {
        Some("bert") => bert::workload(path, &config, &source, opts),
        _ => llama::workload(path, &config, &source, opts),
    }
}

/// Why config.json's field `key` stops the workload, if it does: `required` is what the
/// architecture's `required_default` says of its value (`None`: a field monogen does not know).
fn unhonoured(
    key: &str,
    required: Option<Result<(), String>>,
    diag: &impl Fn(&str, String) -> Diagnostic,
) -> Option<Diagnostic> {
    match required {
        Some(Ok(())) => None,
        Some(Err(why)) => Some(diag(key, format!("config.json field `{key}` cannot be honoured")).note(why)),
        None => Some(
            diag(key, format!("config.json field `{key}` is unknown to monogen"))
                .note("it might change what the model computes, so monogen will not guess")
                .hint("if this field does not affect inference, add it to the bookkeeping list in generator/src/init/options.rs"),
        ),
    }
}

/// A diagnostic of config.json (`source`, at `path`) pointing at the first `"key"` in it.
fn config_diag(path: &Path, source: &Arc<str>, key: &str, message: String) -> Diagnostic {
    let needle = format!("\"{key}\"");
    let span = source.find(&needle).map_or(0..0, |i| i..i + needle.len());
    Diagnostic::new(message).in_file(path, source).primary(span, "")
}

/// The workload as a commented TOML file; `source` says where it came from.
pub fn render(w: &Workload, templates: &Templates, source: &Path) -> Result<String, Error> {
    match &w.model {
        Model::Llama(m) => llama::render(w, m, templates, source),
        Model::Bert(m) => bert::render(w, m, templates, source),
    }
}

/// Default output path of `init`: `workloads/<name>.toml` under the project root.
pub fn default_path(root: &Path, name: &str) -> PathBuf {
    root.join("workloads").join(format!("{name}.toml"))
}

/// `--hardware`: `this` (this machine's class), `none`, or a class name.
pub fn parse_hardware(spec: &str) -> Result<Option<String>, Error> {
    match spec {
        "this" => Ok(Some(crate::host::this_class())),
        "none" => Ok(None),
        class if crate::workload::is_hardware_class(class) => Ok(Some(class.to_string())),
        class => Err(Error::Refused(format!(
            "--hardware `{class}` cannot name a hardware class: use lowercase letters, digits and `-`"
        ))),
    }
}

/// The workload file `monogen init` writes for the model in `hf`, checked by parsing it back
/// as `build` will read it (`label` names it in errors).
pub fn workload_file(
    hf: &Path,
    opts: &InitOptions,
    templates: &Templates,
    label: &Path,
) -> Result<String, Error> {
    if !crate::workload::is_crate_name(&opts.name) {
        return Err(Error::Refused(format!(
            "--name `{}` cannot name a crate: use lowercase letters, digits, `-` and `_`, starting with a letter",
            opts.name
        )));
    }
    let workload = workload_from_hf(hf, opts)?;
    let text = render(&workload, templates, hf)?;
    crate::workload::WorkloadSource::from_text(label, &text).parse().map_err(|mut ds| {
        for d in &mut ds {
            d.notes.push(format!("the workload was written from {}/config.json", hf.display()));
        }
        Error::Diagnostics(ds)
    })?;
    Ok(text)
}

/// Writes a workload file, refusing to replace one unless `force`.
pub fn write_workload_file(path: &Path, text: &str, force: bool) -> Result<(), Error> {
    if path.exists() && !force {
        return Err(Error::Refused(format!("{} exists; pass --force to overwrite it", path.display())));
    }
    crate::write::write_file(path, text.as_bytes())?;
    Ok(())
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
        InitOptions { hardware: Some("intel-xeon-2c".into()), ..InitOptions::for_tests("t") }
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
