//! What `monogen init` is asked for, and what reading a config.json needs for any architecture.

use std::path::Path;

use serde_json::{Map, Value};

use crate::diagnostics::Diagnostic;
use crate::workload::{Activations, Dtype, KvDtype, Weights};
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
    /// A decoder's classifier's weight dtype, where it differs from `dtype`.
    pub classifier_dtype: Option<Dtype>,
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
    /// Most sentences per call of an encoder (default 32), most sequences per decode step of a
    /// decoder (default 1, or 8 when serving).
    pub max_batch: Option<usize>,
    /// Decoders: write a `[serving]` table.
    pub serve: bool,
    /// Decoders: the `[speculation]` table to write.
    pub speculation: Option<crate::workload::Speculation>,
    /// Decoders, with `speculation`: a file whose text is a typical request's prompt, which
    /// leaves the speculator to measurement (`speculator = "measured"`, `typical_text`).
    pub typical_text: Option<std::path::PathBuf>,
    /// `request.requests_per_load`: when the load counts in the rankings.
    pub requests_per_load: Option<u64>,
    /// `request.shared_prefix_len` (a decoder's server): the prefix cache.
    pub shared_prefix_len: Option<usize>,
    /// A CUDA target's GPU architecture (`target.cuda_arch`): set, the workload targets
    /// `device = "cuda"`.
    pub cuda_arch: Option<String>,
}

impl InitOptions {
    /// Options named `name`, f32 throughout, 2 threads on x86-64-v3, of no hardware class.
    #[cfg(test)]
    pub(crate) fn for_tests(name: &str) -> InitOptions {
        InitOptions {
            name: name.into(),
            dtype: Dtype::F32,
            activations: Activations::F32,
            classifier_dtype: None,
            kv_cache: KvDtype::F32,
            threads: Some(2),
            cpu_features: CpuFeatures::parse("x86-64-v3").unwrap(),
            max_seq_len: None,
            typical_prompt_len: None,
            typical_decode_len: None,
            hardware: None,
            max_batch: None,
            serve: false,
            speculation: None,
            typical_text: None,
            requests_per_load: None,
            shared_prefix_len: None,
            cuda_arch: None,
        }
    }

    /// The `[quality]` table of weights of `dtype` (and a decoder's KV cache): none for f32;
    /// for the others the bar docs/quality.md suggests, which `monogen eval` then holds the
    /// crate to. A bf16 KV cache with f32 weights has the bf16 bar.
    pub(crate) fn quality(&self, encoder: bool) -> Option<crate::workload::Quality> {
        let q = crate::workload::Quality::default();
        // A CUDA crate runs on a GPU, which `monogen eval` does not drive: its parity with f32
        // is the device check's.
        if self.cuda_arch.is_some() && self.dtype != Dtype::F32 {
            return Some(crate::workload::Quality {
                waived: Some(
                    "a CUDA crate runs on a GPU, which `monogen eval` does not drive; its KL against f32 is the device check's (issue: CUDA)".into(),
                ),
                ..q
            });
        }
        match (self.dtype, encoder) {
            (Dtype::F32, false) if self.kv_cache == crate::workload::KvDtype::Bf16 => {
                Some(crate::workload::Quality { max_mean_kl: Some(1e-3), min_top1: Some(0.98), ..q })
            }
            (Dtype::F32, _) => None,
            (Dtype::Bf16, false) => {
                Some(crate::workload::Quality { max_mean_kl: Some(1e-3), min_top1: Some(0.98), ..q })
            }
            (Dtype::Int4, false) => {
                Some(crate::workload::Quality { max_mean_kl: Some(5e-2), min_top1: Some(0.85), ..q })
            }
            (_, false) => {
                Some(crate::workload::Quality { max_mean_kl: Some(5e-3), min_top1: Some(0.95), ..q })
            }
            (Dtype::Bf16, true) => Some(crate::workload::Quality { min_cosine: Some(0.999), ..q }),
            (Dtype::Int4, true) => Some(crate::workload::Quality { min_cosine: Some(0.95), ..q }),
            (_, true) => Some(crate::workload::Quality { min_cosine: Some(0.99), ..q }),
        }
    }

    /// The `[weights]` table these options ask for, refused when `--activations bf16` comes
    /// without `--dtype bf16`, or `--classifier-dtype` names `--dtype` or comes with `--activations bf16`.
    pub(crate) fn weights(&self) -> Result<Weights, Error> {
        if let Some(classifier) = self.classifier_dtype {
            if classifier == self.dtype {
                return Err(Error::Refused(format!(
                    "--classifier-dtype {} is --dtype already; leave it out",
                    classifier.as_str()
                )));
            }
            if self.activations == Activations::Bf16 {
                return Err(Error::Refused(
                    "--classifier-dtype and --activations bf16 do not go together: bfloat16 activations are for bf16 products alone"
                        .into(),
                ));
            }
        }
        if self.activations == Activations::Bf16 && self.dtype != Dtype::Bf16 {
            return Err(Error::Refused(format!(
                "--activations bf16 rounds the activations of bf16 weights' products, and --dtype is {}; add --dtype bf16",
                self.dtype.as_str()
            )));
        }
        Ok(Weights {
            dtype: self.dtype,
            activations: self.activations,
            classifier_dtype: self.classifier_dtype,
        })
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
