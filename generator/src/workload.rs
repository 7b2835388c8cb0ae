//! The workload signature: the TOML file that states everything a generated crate is
//! specialized for (see `docs/workload.md` for every field).
//!
//! Parsing happens in three steps, each with errors that point into the file:
//! 1. TOML syntax (`toml` reports line and column);
//! 2. the schema: unknown keys, wrong types and missing fields, per architecture
//!    (`architecture` is read first, then the whole file is read against that
//!    architecture's schema with `deny_unknown_fields`);
//! 3. semantic checks (shapes that do not fit together, values out of range), which find
//!    the span of the offending value by its key path.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use toml::de::{DeTable, DeValue};

use crate::cpu;
use crate::diagnostics::{Diagnostic, nearest};

/// Largest workload file monogen reads; anything bigger is not a workload.
pub const MAX_WORKLOAD_BYTES: u64 = 1 << 20;

/// A parsed and checked workload signature.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Workload {
    /// Crate and binary name of the generated crate.
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub model: Model,
    pub weights: Weights,
    /// The KV cache's element type (a LLaMA's; f32 unless the file says otherwise).
    #[serde(skip_serializing_if = "KvCache::is_default")]
    pub kv_cache: KvCache,
    pub target: Target,
    pub request: Request,
    /// The `[serving]` table: the crate is also an HTTP server (its `serve` subcommand).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serving: Option<Serving>,
    /// The `[quality]` table: the bar `monogen eval` holds the crate to against its f32 twin.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quality: Option<Quality>,
    /// The `[speculation]` table: how a decoder's generation drafts tokens for the model to
    /// verify several at a time. Absent (or `speculator = "none"`), the crate has no
    /// speculation code at all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculation: Option<Speculation>,
    /// The text of the file it was parsed from, which a generated crate keeps as its
    /// `workload.toml` (none for a workload made in code, such as `init`'s).
    #[serde(skip)]
    pub source: SourceText,
}

/// The text a workload was parsed from. Not part of the workload's meaning: two workloads that
/// differ only in it are equal, and its canonical TOML leaves it out.
#[derive(Debug, Clone, Default)]
pub struct SourceText(pub Option<Arc<str>>);

impl PartialEq for SourceText {
    fn eq(&self, _: &SourceText) -> bool {
        true
    }
}

/// How the generated server serves requests: the optional `[serving]` table of a workload (a
/// decoder's completions, an encoder's embeddings). docs/serving.md documents each field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Serving {
    /// Priority classes, most urgent first. A request names its class in its `priority`
    /// field or its `X-Priority` header; a more urgent class is admitted first and may take a
    /// running sequence's place in the batch.
    #[serde(default = "Serving::default_priorities")]
    pub priorities: Vec<String>,
    /// The class of a request that names none: the first class unless set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_priority: Option<String>,
    /// Requests that may wait for a place in the batch; one more is answered 429.
    #[serde(default = "Serving::default_max_queue")]
    pub max_queue: usize,
    /// KV caches the server holds: the running sequences' and those of sequences a more
    /// urgent request displaced, which resume from them. At least `request.max_batch`;
    /// twice it unless set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_slots: Option<usize>,
    /// Largest request body accepted, in bytes; a larger one is answered 413.
    #[serde(default = "Serving::default_max_body_bytes")]
    pub max_body_bytes: usize,
    /// An encoder's server: how long the first sentence of a batch waits for others to join it
    /// (milliseconds); 2 unless set. Decoders batch continuously and have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_wait_ms: Option<u64>,
    /// A decoder's server also answers `/v1/chat/completions`, rendering this chat template
    /// (the `[serving.chat]` table), which the crate embeds: it reads no template at run time.
    /// Without it the crate has no chat path at all. `monogen init --serve` copies the model's
    /// template here where it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat: Option<Chat>,
}

/// The chat template a decoder's server renders chat messages with: the optional
/// `[serving.chat]` table, as `monogen init --serve` copies it from the model's
/// `chat_template.jinja` or `tokenizer_config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Chat {
    /// The Jinja template, rendered as Hugging Face renders it (`trim_blocks`, `lstrip_blocks`).
    pub template: String,
    /// The text the template's `bos_token` stands for (tokenizer_config.json's `bos_token`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bos_token: String,
    /// The text the template's `eos_token` stands for.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub eos_token: String,
}

impl Serving {
    fn default_priorities() -> Vec<String> {
        vec!["interactive".into(), "batch".into()]
    }

    fn default_max_queue() -> usize {
        64
    }

    fn default_max_body_bytes() -> usize {
        1 << 20
    }

    /// The class of a request that names none.
    pub fn default_priority(&self) -> &str {
        self.default_priority.as_deref().unwrap_or(&self.priorities[0])
    }

    /// KV caches the server holds, for a batch of `max_batch`.
    pub fn kv_slots(&self, max_batch: usize) -> usize {
        self.kv_slots.unwrap_or(2 * max_batch)
    }

    /// How long an encoder's batch waits for more sentences, in milliseconds.
    pub fn batch_wait_ms(&self) -> u64 {
        self.batch_wait_ms.unwrap_or(2)
    }
}

/// The bar a workload's crate must clear against its f32 twin (`monogen eval`): the optional
/// `[quality]` table. docs/quality.md documents each field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quality {
    /// A decoder: the largest mean KL divergence of the next-token distributions from f32's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_mean_kl: Option<f64>,
    /// A decoder: the smallest share of positions whose most likely next token is f32's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_top1: Option<f64>,
    /// An encoder: the smallest mean cosine similarity of its embeddings to f32's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_cosine: Option<f64>,
    /// The evaluation text, relative to the workload file; monogen's default text unless set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Why this workload is not evaluated (synthetic weights, a CPU no evaluating machine
    /// has): `check` then asks for no evaluation record. Excludes every bar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waived: Option<String>,
}

/// How a decoder speculates: the optional `[speculation]` table. docs/workload.md documents
/// each field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Speculation {
    /// Where drafted tokens come from.
    pub speculator: Speculator,
    /// Tokens drafted at most per step: the model verifies them and the last picked token in
    /// one forward pass of `draft_tokens + 1` rows.
    #[serde(default = "Speculation::default_draft_tokens")]
    pub draft_tokens: usize,
    /// Prompt lookup: the longest n-gram of the context's end that it looks for.
    #[serde(default = "Speculation::default_lookup_max")]
    pub lookup_max: usize,
    /// Prompt lookup: the shortest.
    #[serde(default = "Speculation::default_lookup_min")]
    pub lookup_min: usize,
    /// With `speculator = "measured"`: the prompt text of a typical request, which the
    /// authority (`monogen bench --model DIR`) decodes with and without speculation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub typical_text: Option<String>,
    /// With `speculator = "draft-model"`: the draft model (`[speculation.draft]`), generated
    /// into the crate beside the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<Box<Draft>>,
}

/// A draft model: a second, smaller LLaMA workload with the target's tokenizer, which drafts
/// greedily for the target to verify. It runs on the target's `[target]` and `[request]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Draft {
    /// Its `[model]` table, as a workload's (`architecture = "llama"`).
    pub model: Llama,
    /// How it holds its weights: a quantized copy of the target's own checkpoint is a draft
    /// model too (the crate reads the target's directory unless given another).
    pub weights: Weights,
}

impl Speculation {
    /// Prompt lookup with `draft_tokens` (4 unless given) and the default n-gram lengths.
    pub fn prompt_lookup(draft_tokens: Option<usize>) -> Speculation {
        Speculation {
            speculator: Speculator::PromptLookup,
            draft_tokens: draft_tokens.unwrap_or_else(Speculation::default_draft_tokens),
            lookup_max: Speculation::default_lookup_max(),
            lookup_min: Speculation::default_lookup_min(),
            typical_text: None,
            draft: None,
        }
    }

    fn default_draft_tokens() -> usize {
        4
    }

    fn default_lookup_max() -> usize {
        3
    }

    fn default_lookup_min() -> usize {
        2
    }

    /// Whether the crate may speculate: it names a speculator, or leaves the choice to
    /// measurement.
    pub fn speculates(&self) -> bool {
        self.speculator != Speculator::None
    }

    /// The draft lengths the authority tries for `speculator = "measured"`: 2, 4 and 8 below
    /// `draft_tokens`, and `draft_tokens` itself (the most it may draft, at most 16).
    pub fn draft_candidates(&self) -> Vec<usize> {
        let mut out: Vec<usize> = [2, 4, 8].into_iter().filter(|&k| k < self.draft_tokens).collect();
        out.push(self.draft_tokens);
        out
    }

    /// This table with the speculator `speculator` drafting `draft_tokens` at most: one
    /// candidate of a measured choice, or the choice made.
    /// Only a draft model's keeps the `[speculation.draft]` table.
    pub fn concrete(&self, speculator: Speculator, draft_tokens: usize) -> Speculation {
        let draft = if speculator == Speculator::DraftModel { self.draft.clone() } else { None };
        Speculation { speculator, draft_tokens, typical_text: None, draft, ..self.clone() }
    }
}

/// The implementations of the `speculator` interface a workload can name, and none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Speculator {
    /// No speculation: every step runs one token.
    None,
    /// Drafts copied from earlier in the context (implementations/speculator/prompt-lookup).
    PromptLookup,
    /// None or prompt lookup, with 2 up to `draft_tokens` drafts: whichever decodes the
    /// typical text fastest on the workload's hardware class, as `monogen bench --model DIR`
    /// measured it (none until it has).
    Measured,
    /// A draft model (`[speculation.draft]`) generated into the crate drafts greedily.
    DraftModel,
}

impl Speculator {
    /// Its name in a workload (`prompt-lookup`).
    pub fn as_str(self) -> &'static str {
        match self {
            Speculator::None => "none",
            Speculator::PromptLookup => "prompt-lookup",
            Speculator::Measured => "measured",
            Speculator::DraftModel => "draft-model",
        }
    }

    /// The implementation of the `speculator` interface it names.
    pub fn implementation(self) -> Option<&'static str> {
        match self {
            Speculator::None => None,
            Speculator::PromptLookup => Some("prompt-lookup"),
            Speculator::Measured | Speculator::DraftModel => None,
        }
    }
}

impl Quality {
    /// Whether it sets any bar.
    pub fn has_bar(&self) -> bool {
        self.max_mean_kl.is_some() || self.min_top1.is_some() || self.min_cosine.is_some()
    }
}

/// The model architecture with all its shapes and constants.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "architecture", rename_all = "lowercase")]
pub enum Model {
    Llama(Llama),
    Bert(Bert),
}

impl Model {
    pub fn architecture(&self) -> Architecture {
        match self {
            Model::Llama(_) => Architecture::Llama,
            Model::Bert(_) => Architecture::Bert,
        }
    }
}

/// Model architectures monogen can generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    Llama,
    Bert,
}

impl Architecture {
    pub const ALL: &'static [&'static str] = &["llama", "bert"];

    pub fn as_str(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Bert => "bert",
        }
    }

    /// The name as people write it.
    pub fn title(self) -> &'static str {
        match self {
            Architecture::Llama => "LLaMA",
            Architecture::Bert => "BERT",
        }
    }
}

/// A LLaMA-style decoder (RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Llama {
    /// The `architecture` key of the `[model]` table, already read to pick this schema.
    #[serde(rename = "architecture", default, skip_serializing)]
    pub tag: ArchitectureTag,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP's gate and up projections.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_layers: usize,
    /// Number of query heads.
    pub num_heads: usize,
    /// Number of key/value heads (equal to num_heads without grouped-query attention).
    pub num_kv_heads: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Number of rows of the embedding and of the classifier.
    pub vocab_size: usize,
    /// Longest sequence the model was trained for.
    pub max_position_embeddings: usize,
    /// Base of the rotary embedding's frequencies.
    pub rope_theta: f64,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f64,
    /// Whether the classifier reuses the embedding matrix (no `lm_head.weight`).
    pub tie_word_embeddings: bool,
    /// Token that starts a sequence.
    pub bos_token_id: u32,
    /// Tokens that end generation.
    pub eos_token_ids: Vec<u32>,
    /// Whether the q, k and v projections add a bias (Qwen2). Absent means false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qkv_bias: bool,
    /// How the rotary frequencies are scaled for long contexts. Absent means not at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeScaling>,
    /// Sliding-window attention (Mistral): each position attends to itself and the
    /// `sliding_window − 1` before it. Absent means full causal attention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<usize>,
}

/// Rope scaling, as Hugging Face's `rope_parameters` / `rope_scaling` states it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum RopeScaling {
    /// Every inverse frequency divided by `factor` (positions interpolated).
    Linear { factor: f64 },
    /// Llama 3.1's: low frequencies divided by `factor`, high ones kept, the band between
    /// interpolated smoothly.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
}

/// A BERT encoder (absolute positions, token types, post-LayerNorm, GELU MLP), with the
/// pooling a sentence-embedding model puts on top.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bert {
    #[serde(rename = "architecture", default, skip_serializing)]
    pub tag: ArchitectureTag,
    /// Width of the hidden states.
    pub hidden_size: usize,
    /// Width of the MLP's intermediate layer.
    pub intermediate_size: usize,
    /// Number of encoder layers.
    pub num_layers: usize,
    /// Number of attention heads.
    pub num_heads: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Rows of the word embedding.
    pub vocab_size: usize,
    /// Rows of the position embedding: the longest sequence the model takes.
    pub max_position_embeddings: usize,
    /// Rows of the token-type (segment) embedding.
    pub type_vocab_size: usize,
    /// Epsilon of every LayerNorm.
    pub layer_norm_eps: f64,
    /// The MLP's activation.
    pub hidden_act: Activation,
    /// How token states become one vector per sentence.
    pub pooling: Pooling,
    /// Whether the pooled vectors are L2-normalized (sentence-transformers' Normalize): the
    /// crate exports `normalize`, and its binary applies it unless `--no-normalize`.
    pub normalize: bool,
}

/// Activations of encoder MLPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// GELU with the exact erf, as PyTorch's `gelu` and Hugging Face's "gelu".
    Gelu,
}

/// Sentence pooling of an encoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    /// The mean of the token states (padding excluded).
    Mean,
    /// The state of the first token ([CLS]).
    Cls,
    /// No pooling: the crate returns token states only.
    None,
}

impl Pooling {
    pub fn as_str(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::None => "none",
        }
    }
}

/// How the weights are stored in memory while the model runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Weights {
    pub dtype: Dtype,
    /// What the linear layers' products read their activations as (optional; f32 unless the
    /// workload asks for bf16, which needs bf16 weights).
    #[serde(default, skip_serializing_if = "Activations::is_f32")]
    pub activations: Activations,
    /// Optional: how a decoder holds its classifier (`lm_head`, or the embedding table where the
    /// embeddings are tied, which then serves both) when not as `dtype`: an int4 model whose
    /// classifier stays in int8, as GGML's quantized files often keep it. The classifier's
    /// product then runs through a second `matmul` of that element type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classifier_dtype: Option<Dtype>,
}

impl Weights {
    /// The classifier's element type where it differs from the other matrices'.
    pub fn classifier(&self) -> Option<Dtype> {
        self.classifier_dtype.filter(|d| *d != self.dtype)
    }
}

/// How the products of the linear layers read their activations: `f32` (the default), or
/// `bf16`: each activation rounded to the nearest bfloat16 before the product, for bf16 weights,
/// so that AMX tiles or AVX512_BF16 dot products take it in one term (`matmul<bf16act>`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activations {
    #[default]
    F32,
    Bf16,
}

impl Activations {
    pub fn as_str(self) -> &'static str {
        match self {
            Activations::F32 => "f32",
            Activations::Bf16 => "bf16",
        }
    }

    fn is_f32(&self) -> bool {
        *self == Activations::F32
    }
}

/// Weight data types. LLaMA and BERT workloads have implementations for `f32`, `bf16`, `int8`
/// (blockwise, a scale per 32 values) and `int4` (blockwise too, two values per byte). `f16` is part of the schema so that
/// workloads can name it and resolution can say what is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F32,
    Bf16,
    F16,
    Int8,
    Int4,
}

impl Dtype {
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
            Dtype::Int8 => "int8",
            Dtype::Int4 => "int4",
        }
    }

    /// Bytes per value of a KV cache or a file of this type (whole bytes: int4, which packs
    /// two values in one, counts as the byte it reads them from).
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
            Dtype::Int8 | Dtype::Int4 => 1,
        }
    }

    /// Bytes of `parameters` weights in memory: int8 adds an f32 scale per block of 32, and
    /// int4 holds a block of 32 values in 16 bytes, a binary16 scale and a binary16 minimum.
    pub fn bytes(self, parameters: u64) -> u64 {
        match self {
            Dtype::Int8 => parameters + parameters.div_ceil(32) * 4,
            Dtype::Int4 => parameters.div_ceil(32) * (16 + 4),
            _ => parameters * self.size() as u64,
        }
    }
}

/// How a decoder's KV cache holds the keys and values of past positions: the optional
/// `[kv_cache]` table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvCache {
    pub dtype: KvDtype,
}

impl KvCache {
    fn is_default(&self) -> bool {
        *self == KvCache::default()
    }
}

/// KV cache element types: `f32` (the default), or `bf16`, which halves the bytes that
/// attention reads at every step (the keys and values are rounded once, when stored).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvDtype {
    #[default]
    F32,
    Bf16,
}

impl KvDtype {
    pub fn as_str(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::Bf16 => "bf16",
        }
    }

    /// Bytes per cached value.
    pub fn size(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::Bf16 => 2,
        }
    }
}

/// The hardware the crate runs on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    pub device: Device,
    /// The GPU architecture a CUDA crate's kernels are compiled for (`sm_80`, `sm_90`):
    /// required with `device = "cuda"`, refused with `"cpu"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_arch: Option<String>,
    /// `target_arch` of the CPU (a CUDA crate's host).
    /// `target_arch` of the CPU.
    pub arch: String,
    /// The CPU features the generated code may use (Rust target_feature names).
    pub cpu_features: Vec<String>,
    /// Worker threads the generated kernels may use.
    pub threads: usize,
    /// The hardware class the crate is tuned for: the folder of `rankings/` whose
    /// measurements choose its kernels (`monogen init` fills in this machine's). Without
    /// one, kernels are chosen by declared priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    Cuda,
}

impl Device {
    pub fn as_str(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
    }
}

/// The request pattern the crate serves: a decoder's or an encoder's.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Request {
    Decoder(DecoderRequest),
    Encoder(EncoderRequest),
}

impl Request {
    pub fn max_batch(&self) -> usize {
        match self {
            Request::Decoder(r) => r.max_batch,
            Request::Encoder(r) => r.max_batch,
        }
    }

    pub fn max_seq_len(&self) -> usize {
        match self {
            Request::Decoder(r) => r.max_seq_len,
            Request::Encoder(r) => r.max_seq_len,
        }
    }

    /// Requests served per load of the model, when the load counts in the rankings.
    pub fn requests_per_load(&self) -> Option<u64> {
        match self {
            Request::Decoder(r) => r.requests_per_load,
            Request::Encoder(r) => r.requests_per_load,
        }
    }
}

/// What a decoder (generation) serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecoderRequest {
    /// Sequences run through one decode step together (`MAX_BATCH`).
    pub max_batch: usize,
    /// Longest sequence (prompt plus generated tokens) a session holds.
    pub max_seq_len: usize,
    /// Typical prompt length: the prefill chunk size and the benchmark's prefill shape.
    pub typical_prompt_len: usize,
    /// Typical number of generated tokens: the benchmark's decode shape.
    pub typical_decode_len: usize,
    /// Requests one process serves from one load of the model from its checkpoint, when the
    /// load counts: the authority adds each candidate's work at load (a kernel that packs its
    /// weights) divided by this to its time per request. Absent: the load is not counted (a
    /// server that loads once, or a model saved packed with `--save-model`, whose load does no
    /// packing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_load: Option<u64>,
    /// A server's: the tokens its requests typically share at their start (a system prompt, a
    /// conversation so far). Set, the server keeps finished requests' KV caches and a request
    /// that starts with one's tokens (at least half this many) runs only the rest of its
    /// prompt; absent, the crate has no prefix cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_prefix_len: Option<usize>,
}

/// What an encoder (embedding, classification) serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncoderRequest {
    /// Most sentences embedded in one call; sizes the activation buffers.
    pub max_batch: usize,
    /// Longest sequence, special tokens included; longer input is truncated.
    pub max_seq_len: usize,
    /// Typical tokens per sentence: the benchmark's shape.
    pub typical_seq_len: usize,
    /// Typical sentences per call: the benchmark's batch.
    pub typical_batch: usize,
    /// Requests one process serves from one load of the model from its checkpoint, when the
    /// load counts: the authority adds each candidate's work at load (a kernel that packs its
    /// weights) divided by this to its time per request. Absent: the load is not counted (a
    /// server that loads once, or a model saved packed with `--save-model`, whose load does no
    /// packing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_load: Option<u64>,
}

/// The schema of a workload file for one architecture's model table.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkloadFile<M, R> {
    name: String,
    #[serde(default)]
    description: Option<String>,
    model: M,
    weights: Weights,
    #[serde(default)]
    kv_cache: Option<KvCache>,
    target: Target,
    request: R,
    #[serde(default)]
    serving: Option<Serving>,
    #[serde(default)]
    quality: Option<Quality>,
    #[serde(default)]
    speculation: Option<Speculation>,
}

/// Stands for the `architecture` key inside an architecture's model table; the key is
/// read (and checked) before the table, and written back by `Model`'s serde tag.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArchitectureTag;

impl<'de> Deserialize<'de> for ArchitectureTag {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d).map(|_| ArchitectureTag)
    }
}

/// Reads only what decides the schema: `model.architecture`.
#[derive(Deserialize)]
struct ArchitectureProbe {
    model: Option<ModelProbe>,
}

#[derive(Deserialize)]
struct ModelProbe {
    architecture: Option<toml::Spanned<String>>,
}

/// A workload file's text, kept for error spans.
#[derive(Debug, Clone)]
pub struct WorkloadSource {
    pub path: PathBuf,
    pub text: Arc<str>,
}

impl WorkloadSource {
    /// Reads a workload file, refusing what cannot be one (unreadable, huge, not UTF-8).
    #[allow(clippy::result_large_err)]
    pub fn read(path: &Path) -> Result<WorkloadSource, Diagnostic> {
        let meta = std::fs::metadata(path).map_err(|e| {
            Diagnostic::new(format!("cannot read workload file: {e}"))
                .at_path(path)
                .hint("pass the path of a workload TOML file, e.g. workloads/stories260k-cpu-f32.toml")
        })?;
        if meta.is_dir() {
            return Err(Diagnostic::new("expected a workload file, found a directory").at_path(path));
        }
        if meta.len() > MAX_WORKLOAD_BYTES {
            return Err(Diagnostic::new(format!(
                "workload file is {} bytes; a workload is a small TOML file (at most {} bytes)",
                meta.len(),
                MAX_WORKLOAD_BYTES
            ))
            .at_path(path));
        }
        let bytes = std::fs::read(path)
            .map_err(|e| Diagnostic::new(format!("cannot read workload file: {e}")).at_path(path))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            Diagnostic::new(format!(
                "workload file is not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ))
            .at_path(path)
            .hint("a workload is a TOML text file; `monogen init --hf DIR` writes one")
        })?;
        Ok(WorkloadSource { path: path.to_path_buf(), text: Arc::from(text) })
    }

    pub fn from_text(path: impl Into<PathBuf>, text: &str) -> WorkloadSource {
        WorkloadSource { path: path.into(), text: Arc::from(text) }
    }

    fn diag(&self, message: impl Into<String>) -> Diagnostic {
        Diagnostic::new(message).in_file(&self.path, &self.text)
    }

    /// Parses and checks the workload; every problem found is returned.
    pub fn parse(&self) -> Result<Workload, Vec<Diagnostic>> {
        let text: &str = &self.text;
        if text.trim().is_empty() {
            return Err(vec![
                Diagnostic::new("workload file is empty")
                    .at_path(&self.path)
                    .hint("`monogen init --hf MODEL_DIR --name NAME` writes a complete workload"),
            ]);
        }
        let doc = DeTable::parse(text).map_err(|e| vec![self.toml_error(&e)])?;
        let probe: ArchitectureProbe = toml::from_str(text).map_err(|e| vec![self.toml_error(&e)])?;
        let Some(architecture) = probe.model.and_then(|m| m.architecture) else {
            let span = span_of(&doc, &["model"]).unwrap_or(0..0);
            return Err(vec![
                self.diag("missing field `model.architecture`")
                    .primary(span, "the [model] table must say which architecture it describes")
                    .hint(format!(
                        "add `architecture = \"llama\"` to [model]; known: {}",
                        Architecture::ALL.join(", ")
                    )),
            ]);
        };
        let workload = match architecture.get_ref().as_str() {
            "llama" => {
                if let Some(span) = span_of(&doc, &["serving", "chat"])
                    && matches!(&self.text[span_clamp(&self.text, &span)], "true" | "false")
                {
                    return Err(vec![
                        self.diag("serving.chat is a table: the chat template itself")
                            .primary(span, "a flag no longer says where the template is")
                            .hint(
                                "`monogen init --serve --hf MODEL_DIR` writes [serving.chat] with the model's \
                                 template; or write `template = \"...\"` under [serving.chat]; or remove `chat`",
                            ),
                    ]);
                }
                let file: WorkloadFile<Llama, DecoderRequest> =
                    toml::from_str(text).map_err(|e| vec![self.toml_error(&e)])?;
                Workload {
                    name: file.name,
                    description: file.description,
                    model: Model::Llama(file.model),
                    weights: file.weights,
                    kv_cache: file.kv_cache.unwrap_or_default(),
                    target: file.target,
                    request: Request::Decoder(file.request),
                    serving: file.serving,
                    quality: file.quality,
                    speculation: file.speculation,
                    source: SourceText(Some(self.text.clone())),
                }
            }
            "bert" => {
                // An embeddings server has no classes and no KV caches: it batches what arrives.
                let decoder_only: Vec<Diagnostic> = ["priorities", "default_priority", "kv_slots", "chat"]
                    .iter()
                    .filter_map(|key| {
                        let span = span_of(&doc, &["serving", key])?;
                        Some(
                            self.diag(format!("serving.{key} applies to decoders (`llama`) only"))
                                .primary(
                                    span,
                                    if *key == "chat" {
                                        "an embeddings server answers /v1/embeddings, not chat completions"
                                    } else {
                                        "an embeddings server batches requests in the order they arrive"
                                    },
                                )
                                .hint(if *key == "chat" {
                                    "remove `chat`".to_string()
                                } else {
                                    format!(
                                        "remove `{key}`; `batch_wait_ms` sets how long a batch waits to fill"
                                    )
                                }),
                        )
                    })
                    .collect();
                if !decoder_only.is_empty() {
                    return Err(decoder_only);
                }
                let file: WorkloadFile<Bert, EncoderRequest> =
                    toml::from_str(text).map_err(|e| vec![self.toml_error(&e)])?;
                if file.kv_cache.is_some() {
                    let span = span_of(&doc, &["kv_cache"]).unwrap_or(0..0);
                    return Err(vec![
                        self.diag("a `bert` workload has no KV cache")
                            .primary(span, "only decoders (`llama`) keep keys and values between steps")
                            .hint("remove the [kv_cache] table"),
                    ]);
                }
                if file.speculation.is_some() {
                    let span = span_of(&doc, &["speculation"]).unwrap_or(0..0);
                    return Err(vec![
                        self.diag("a `bert` workload does not generate tokens to speculate on")
                            .primary(span, "speculative decoding drafts a decoder's (`llama`) next tokens")
                            .hint("remove the [speculation] table"),
                    ]);
                }
                if file.serving.is_some() && file.model.pooling == Pooling::None {
                    let span = span_of(&doc, &["serving"]).unwrap_or(0..0);
                    return Err(vec![
                        self.diag("an embeddings server needs pooling")
                            .primary(span, "`/v1/embeddings` answers one vector per input")
                            .hint("set model.pooling to \"mean\" or \"cls\", or remove the [serving] table"),
                    ]);
                }
                Workload {
                    name: file.name,
                    description: file.description,
                    model: Model::Bert(file.model),
                    weights: file.weights,
                    kv_cache: KvCache::default(),
                    target: file.target,
                    request: Request::Encoder(file.request),
                    serving: file.serving,
                    quality: file.quality,
                    speculation: file.speculation,
                    source: SourceText(Some(self.text.clone())),
                }
            }
            other => {
                let mut d = self
                    .diag(format!("unknown architecture `{other}`"))
                    .primary(architecture.span(), "not an architecture monogen generates");
                d = match nearest(other, Architecture::ALL.iter().copied()) {
                    Some(near) => d.hint(format!("did you mean `{near}`?")),
                    None => d.hint(format!("known architectures: {}", Architecture::ALL.join(", "))),
                };
                return Err(vec![d]);
            }
        };
        let problems = check(&workload, &|path| span_of(&doc, path), self);
        if problems.is_empty() { Ok(workload) } else { Err(problems) }
    }

    /// Turns a `toml` error into a diagnostic, with a hint for misspelt keys and variants.
    fn toml_error(&self, e: &toml::de::Error) -> Diagnostic {
        let message = e.message().trim().to_string();
        let span = e.span().unwrap_or(0..0);
        let mut d = self.diag(first_line(&message)).primary(span.clone(), label_for(&message));
        if let Some(hint) = hint_for_toml_error(&message, &self.text[span_clamp(&self.text, &span)]) {
            d = d.hint(hint);
        }
        d
    }
}

fn span_clamp(text: &str, span: &Range<usize>) -> Range<usize> {
    let end = span.end.min(text.len());
    let start = span.start.min(end);
    if text.is_char_boundary(start) && text.is_char_boundary(end) { start..end } else { 0..0 }
}

fn first_line(message: &str) -> String {
    message.lines().next().unwrap_or("").to_string()
}

fn label_for(message: &str) -> String {
    if message.starts_with("unknown field") {
        "unknown key".into()
    } else if message.starts_with("unknown variant") {
        "unknown value".into()
    } else if message.starts_with("missing field") {
        "in this table".into()
    } else if message.starts_with("invalid type") {
        "wrong type".into()
    } else if message.starts_with("invalid value") {
        "out of range".into()
    } else {
        String::new()
    }
}

/// `unknown field `hiden_size`, expected one of `a`, `b`` → "did you mean `hidden_size`?".
fn hint_for_toml_error(message: &str, offending: &str) -> Option<String> {
    let expected: Vec<&str> = message
        .split_once("expected")
        .map(|(_, rest)| rest.split('`').skip(1).step_by(2).collect())
        .unwrap_or_default();
    if message.starts_with("unknown field") || message.starts_with("unknown variant") {
        let word = message.split('`').nth(1).unwrap_or(offending.trim_matches('"'));
        if let Some(near) = nearest(word, expected.iter().copied()) {
            return Some(format!("did you mean `{near}`?"));
        }
        if !expected.is_empty() {
            return Some(format!("expected one of: {}", expected.join(", ")));
        }
    }
    if message.starts_with("missing field") {
        return Some("every field of a workload is required; see docs/workload.md".into());
    }
    None
}

/// The span of the value at `path` (e.g. `["model", "num_heads"]`) in the parsed document.
pub fn span_of(doc: &toml::Spanned<DeTable<'_>>, path: &[&str]) -> Option<Range<usize>> {
    let mut table = doc.get_ref();
    let mut span = doc.span();
    for (i, key) in path.iter().enumerate() {
        let (_, value) = table.iter().find(|(k, _)| k.get_ref() == key)?;
        span = value.span();
        if i + 1 < path.len() {
            match value.get_ref() {
                DeValue::Table(t) => table = t,
                _ => return None,
            }
        }
    }
    Some(span)
}

/// Semantic checks: every problem found, the weights and the name first, then the model, the
/// target and the request (nothing after the model when one of its sizes is out of range).
/// `span` finds a value's span by key path.
fn check(w: &Workload, span: &SpanOf, src: &WorkloadSource) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let at = |path: &[&str]| span(path).unwrap_or(0..0);
    let mk = |path: &[&str], message: String, label: &str, hint: String| {
        src.diag(message).primary(at(path), label).hint(hint)
    };

    let encoder = matches!(w.model, Model::Bert(_)).then_some(w.name.as_str());
    check_weights(&w.weights, encoder, &mut out, &mk);

    if !is_crate_name(&w.name) {
        out.push(mk(
            &["name"],
            format!("`{}` cannot name a crate", w.name),
            "not a valid crate name",
            "use lowercase letters, digits, `-` and `_`, starting with a letter (at most 64 characters)"
                .into(),
        ));
    }

    let max_seq_len = w.request.max_seq_len();
    let sizes_ok = match &w.model {
        Model::Llama(m) => check_llama(m, max_seq_len, span, src, &mut out, &mk),
        Model::Bert(m) => check_bert(m, max_seq_len, span, src, &mut out, &mk),
    };
    if !sizes_ok {
        return out;
    }
    check_target(&w.target, span, src, &mut out, &mk);
    if w.target.device == Device::Cuda {
        check_cuda(w, &mut out, &mk);
    }
    check_request(&w.request, &mut out, &mk);
    match (&w.serving, &w.request) {
        (Some(serving), Request::Decoder(r)) => check_serving(serving, r, &mut out, &mk),
        (Some(serving), Request::Encoder(_)) => check_embedding_serving(serving, &mut out, &mk),
        (None, _) => {}
    }
    if let Request::Decoder(r) = &w.request
        && let Some(shared) = r.shared_prefix_len
        && (shared == 0 || shared >= r.max_seq_len)
    {
        out.push(mk(
            &["request", "shared_prefix_len"],
            format!(
                "request.shared_prefix_len ({shared}) must be between 1 and request.max_seq_len - 1 ({})",
                r.max_seq_len.saturating_sub(1)
            ),
            "out of range",
            "use the tokens requests typically share at their start, e.g. a system prompt's".into(),
        ));
    }
    if let Some(q) = &w.quality {
        check_quality(q, &w.request, &mut out, &mk);
    }
    if let (Some(s), Request::Decoder(r)) = (&w.speculation, &w.request) {
        check_speculation(s, r, &mut out, &mk);
        if let Model::Llama(m) = &w.model {
            check_draft(s, m, r, span, src, &mut out, &mk);
        }
    }
    out
}

/// A `[weights]` table (the workload's, or a draft model's through a `mk` that says so):
/// bfloat16 activations only with bf16 weights; a classifier dtype only for a decoder (`encoder`
/// names the workload that is not one), other than `dtype`, and not beside bf16 activations.
fn check_weights(weights: &Weights, encoder: Option<&str>, out: &mut Vec<Diagnostic>, mk: &MakeDiagnostic) {
    if weights.activations == Activations::Bf16 && weights.dtype != Dtype::Bf16 {
        out.push(mk(
            &["weights", "activations"],
            format!(
                "weights.activations = \"bf16\" needs bf16 weights, and weights.dtype is \"{}\"",
                weights.dtype.as_str()
            ),
            "bfloat16 activations are read by the bf16 weights' products only",
            "set weights.dtype = \"bf16\", or remove weights.activations (f32 activations)".into(),
        ));
    }
    let Some(classifier) = weights.classifier_dtype else { return };
    let problem = if let Some(name) = encoder {
        Some((
            format!("weights.classifier_dtype is for decoders, and `{name}` is an encoder"),
            "a BERT encoder has no classifier",
            "remove weights.classifier_dtype".to_string(),
        ))
    } else if classifier == weights.dtype {
        Some((
            format!("weights.classifier_dtype is \"{}\", as weights.dtype is", classifier.as_str()),
            "the classifier is held as weights.dtype already",
            "remove weights.classifier_dtype, or name another element type".to_string(),
        ))
    } else if weights.activations == Activations::Bf16 {
        Some((
            "weights.classifier_dtype with weights.activations = \"bf16\"".to_string(),
            "bfloat16 activations are for bf16 products alone",
            "remove one of the two".to_string(),
        ))
    } else {
        None
    };
    if let Some((message, label, hint)) = problem {
        out.push(mk(&["weights", "classifier_dtype"], message, label, hint));
    }
}

/// A draft model (`speculator = "draft-model"` with `[speculation.draft]`): a LLaMA whose
/// shapes pass a workload's checks, with the target's tokenizer (vocabulary size and special
/// ids).
fn check_draft(
    s: &Speculation,
    target: &Llama,
    r: &DecoderRequest,
    span: &SpanOf,
    src: &WorkloadSource,
    out: &mut Vec<Diagnostic>,
    mk: &MakeDiagnostic,
) {
    let draft = match (&s.speculator, &s.draft) {
        (Speculator::DraftModel, None) => {
            out.push(mk(
                &["speculation", "speculator"],
                "speculator = \"draft-model\" needs a [speculation.draft] table".into(),
                "no draft model named",
                "add [speculation.draft.model] (a LLaMA [model] table) and [speculation.draft.weights]"
                    .into(),
            ));
            return;
        }
        // With `measured`, the draft model is one more candidate of the authority's.
        (Speculator::DraftModel | Speculator::Measured, Some(draft)) => draft,
        (_, Some(_)) => {
            out.push(mk(
                &["speculation", "draft"],
                "[speculation.draft] is read only with speculator = \"draft-model\" or \"measured\"".into(),
                "no draft model drafts here",
                "set `speculator = \"draft-model\"`, or remove the [speculation.draft] table".into(),
            ));
            return;
        }
        (_, None) => return,
    };
    let at = |path: &[&str]| -> Vec<String> {
        ["speculation", "draft"].iter().chain(path).map(|k| k.to_string()).collect()
    };
    let draft_span = |path: &[&str]| {
        let path = at(path);
        span(&path.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let draft_mk = |path: &[&str], message: String, label: &str, hint: String| {
        let path = at(path);
        mk(
            &path.iter().map(String::as_str).collect::<Vec<_>>(),
            format!("the draft model: {message}"),
            label,
            hint,
        )
    };
    if !check_llama(&draft.model, r.max_seq_len, &draft_span, src, out, &draft_mk) {
        return;
    }
    let differs: Vec<(&str, String, String)> = [
        ("vocab_size", draft.model.vocab_size.to_string(), target.vocab_size.to_string()),
        ("bos_token_id", draft.model.bos_token_id.to_string(), target.bos_token_id.to_string()),
        ("eos_token_ids", format!("{:?}", draft.model.eos_token_ids), format!("{:?}", target.eos_token_ids)),
    ]
    .into_iter()
    .filter(|(_, a, b)| a != b)
    .collect();
    if let Some((key, _, _)) = differs.first() {
        let list: Vec<String> =
            differs.iter().map(|(k, a, b)| format!("{k} {a} where the target's is {b}")).collect();
        out.push(draft_mk(
            &["model", key],
            format!("its tokenizer is not the target's: {}", list.join("; ")),
            "a draft's tokens must mean what the target's mean",
            "name a draft model with the target's tokenizer (the same vocabulary and special ids), such as a smaller model of its family or a quantized copy of its own checkpoint".into(),
        ));
    }
    check_weights(&draft.weights, None, out, &draft_mk);
}

/// The `[speculation]` table: drafts that fit one prefill chunk, n-gram lengths in order.
fn check_speculation(s: &Speculation, r: &DecoderRequest, out: &mut Vec<Diagnostic>, mk: &MakeDiagnostic) {
    match (&s.speculator, &s.typical_text) {
        (Speculator::Measured, None) => out.push(mk(
            &["speculation", "speculator"],
            "speculator = \"measured\" needs speculation.typical_text".into(),
            "the authority measures on a typical request's text",
            "add `typical_text = '''...'''`: the prompt of a typical request (a document being quoted, code being edited)".into(),
        )),
        (Speculator::Measured, Some(text)) if text.trim().is_empty() => out.push(mk(
            &["speculation", "typical_text"],
            "speculation.typical_text is empty".into(),
            "nothing to decode",
            "write the prompt of a typical request".into(),
        )),
        (Speculator::None | Speculator::PromptLookup, Some(_)) => out.push(mk(
            &["speculation", "typical_text"],
            "speculation.typical_text is read only where the authority chooses the speculator".into(),
            "no measurement reads it",
            "set `speculator = \"measured\"`, or remove `typical_text`".into(),
        )),
        _ => {}
    }
    if !s.speculates() {
        return;
    }
    let chunk = r.typical_prompt_len.min(r.max_seq_len);
    let most = chunk.saturating_sub(1).min(MAX_DRAFT_TOKENS);
    if s.draft_tokens == 0 || s.draft_tokens > most {
        out.push(mk(
            &["speculation", "draft_tokens"],
            format!("speculation.draft_tokens is {}; it must be between 1 and {most}", s.draft_tokens),
            "the drafted tokens and the last picked one run as one chunk of rows",
            format!(
                "use 1 to {most} (at most {MAX_DRAFT_TOKENS}, and fewer than the prefill chunk, request.typical_prompt_len = {})",
                r.typical_prompt_len
            ),
        ));
    }
    if s.lookup_min == 0 || s.lookup_min > s.lookup_max || s.lookup_max > MAX_LOOKUP {
        let key = if s.lookup_min == 0 || s.lookup_max <= MAX_LOOKUP { "lookup_min" } else { "lookup_max" };
        out.push(mk(
            &["speculation", key],
            format!(
                "speculation.lookup_min ({}) and lookup_max ({}) must satisfy 1 <= lookup_min <= lookup_max <= {MAX_LOOKUP}",
                s.lookup_min, s.lookup_max
            ),
            "out of range",
            "prompt lookup matches the context's last lookup_max down to lookup_min tokens, e.g. 3 and 2".into(),
        ));
    }
}

/// The most tokens a step drafts: more rarely all match, and each one adds a row.
pub const MAX_DRAFT_TOKENS: usize = 16;

/// The longest n-gram prompt lookup matches.
pub const MAX_LOOKUP: usize = 8;

/// The `[quality]` table: bars of the workload's kind, in range, or a reason for none.
fn check_quality(q: &Quality, r: &Request, out: &mut Vec<Diagnostic>, mk: &MakeDiagnostic) {
    let encoder = matches!(r, Request::Encoder(_));
    let bars = [
        ("max_mean_kl", q.max_mean_kl, !encoder, 0.0..=f64::MAX, "a positive number, e.g. 1e-3"),
        ("min_top1", q.min_top1, !encoder, 0.0..=1.0, "a share between 0 and 1, e.g. 0.98"),
        ("min_cosine", q.min_cosine, encoder, -1.0..=1.0, "a cosine between -1 and 1, e.g. 0.999"),
    ];
    for (key, value, applies, range, hint) in bars {
        let Some(value) = value else { continue };
        if !applies {
            let (kind, other) = if encoder {
                ("an encoder's embeddings", "min_cosine")
            } else {
                ("a decoder's next-token distributions", "max_mean_kl or min_top1")
            };
            out.push(mk(
                &["quality", key],
                format!("quality.{key} does not apply to this workload"),
                &format!("{kind} are compared with f32 by {other}"),
                format!("use {other}"),
            ));
        } else if !value.is_finite() || !range.contains(&value) || (key == "max_mean_kl" && value <= 0.0) {
            out.push(mk(
                &["quality", key],
                format!("quality.{key} is {value}"),
                "out of range",
                format!("use {hint}"),
            ));
        }
    }
    match &q.waived {
        Some(reason) if q.has_bar() => out.push(mk(
            &["quality", "waived"],
            "quality.waived and a bar are both set".into(),
            &format!("waived: {reason}"),
            "keep the bars and remove `waived`, or the other way round".into(),
        )),
        Some(reason) if reason.trim().is_empty() => out.push(mk(
            &["quality", "waived"],
            "quality.waived is empty".into(),
            "a waiver says why",
            "say why the crate is not evaluated, e.g. \"synthetic weights\"".into(),
        )),
        None if !q.has_bar() => out.push(mk(
            &["quality"],
            "[quality] sets no bar".into(),
            "nothing to hold the crate to",
            if encoder { "set min_cosine" } else { "set max_mean_kl, min_top1 or both" }.into(),
        )),
        _ => {}
    }
}

/// Finds a value's span by key path.
type SpanOf<'a> = dyn Fn(&[&str]) -> Option<Range<usize>> + 'a;

type MakeDiagnostic<'a> = dyn Fn(&[&str], String, &str, String) -> Diagnostic + 'a;

/// The checks of a LLaMA's `[model]` table, and of `max_seq_len` against its positions. False
/// when a size is out of range, and then nothing else is checked (the sizes' products could
/// overflow).
fn check_llama(
    m: &Llama,
    max_seq_len: usize,
    span: &SpanOf,
    src: &WorkloadSource,
    out: &mut Vec<Diagnostic>,
    mk: &MakeDiagnostic,
) -> bool {
    let sizes = [
        ("hidden_size", m.hidden_size, 1 << 20),
        ("intermediate_size", m.intermediate_size, 1 << 22),
        ("num_layers", m.num_layers, 4096),
        ("num_heads", m.num_heads, 4096),
        ("num_kv_heads", m.num_kv_heads, 4096),
        ("head_dim", m.head_dim, 4096),
        ("vocab_size", m.vocab_size, 1 << 24),
        ("max_position_embeddings", m.max_position_embeddings, 1 << 27),
    ];
    if !check_sizes(&sizes, out, mk) {
        return false;
    }
    check_llama_heads(m, span, src, out, mk);
    check_llama_constants(m, out, mk);
    check_llama_tokens(m, out, mk);
    if max_seq_len > m.max_position_embeddings && m.max_position_embeddings > 0 {
        out.push(seq_above_positions(
            max_seq_len,
            m.max_position_embeddings,
            "longer than the model was trained for",
            span,
            src,
        ));
    }
    true
}

/// The attention heads of a LLaMA: query heads in groups per kv head, `num_heads × head_dim =
/// hidden_size`, and an even `head_dim` for the rotary embedding.
fn check_llama_heads(
    m: &Llama,
    span: &SpanOf,
    src: &WorkloadSource,
    out: &mut Vec<Diagnostic>,
    mk: &MakeDiagnostic,
) {
    let at = |path: &[&str]| span(path).unwrap_or(0..0);
    if m.num_heads > 0 && m.num_kv_heads > 0 && !m.num_heads.is_multiple_of(m.num_kv_heads) {
        let mut d = src
            .diag(format!(
                "model.num_heads ({}) is not a multiple of model.num_kv_heads ({})",
                m.num_heads, m.num_kv_heads
            ))
            .primary(
                at(&["model", "num_kv_heads"]),
                "each kv head must serve the same number of query heads",
            );
        if let Some(s) = span(&["model", "num_heads"]) {
            d = d.secondary(s, "query heads");
        }
        out.push(d.hint(format!(
            "grouped-query attention needs num_heads divisible by num_kv_heads; divisors of {} are {}",
            m.num_heads,
            divisors(m.num_heads).iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
        )));
    }
    if m.num_heads > 0 && m.head_dim > 0 && m.num_heads * m.head_dim != m.hidden_size {
        let mut d = src
            .diag(format!(
                "model.head_dim ({}) is inconsistent with hidden_size ({}) and num_heads ({})",
                m.head_dim, m.hidden_size, m.num_heads
            ))
            .primary(at(&["model", "head_dim"]), "num_heads × head_dim must equal hidden_size");
        if let Some(s) = span(&["model", "hidden_size"]) {
            d = d.secondary(s, "hidden_size");
        }
        let hint = if m.hidden_size.is_multiple_of(m.num_heads) {
            format!("for a LLaMA model, head_dim = hidden_size / num_heads = {}", m.hidden_size / m.num_heads)
        } else {
            "hidden_size must be a multiple of num_heads".to_string()
        };
        out.push(d.hint(hint));
    }
    if m.head_dim % 2 == 1 {
        out.push(mk(
            &["model", "head_dim"],
            format!("model.head_dim ({}) is odd", m.head_dim),
            "rotary embeddings rotate pairs of values",
            "LLaMA head dims are even; check config.json".into(),
        ));
    }
}

/// The constants of a LLaMA's positions and norms: `rope_theta`, `sliding_window`,
/// `rope_scaling` and `rms_norm_eps`, each within its range.
fn check_llama_constants(m: &Llama, out: &mut Vec<Diagnostic>, mk: &MakeDiagnostic) {
    if !(m.rope_theta.is_finite() && m.rope_theta > 1.0) {
        out.push(mk(
            &["model", "rope_theta"],
            format!("model.rope_theta ({}) is out of range", m.rope_theta),
            "must be a finite number above 1",
            "LLaMA models use 10000.0; Llama 3 uses 500000.0".into(),
        ));
    }
    if m.sliding_window == Some(0) {
        out.push(mk(
            &["model", "sliding_window"],
            "model.sliding_window must be at least 1".into(),
            "zero",
            "copy sliding_window from config.json, or leave it out for full attention".into(),
        ));
    }
    if let Some(scaling) = &m.rope_scaling
        && !rope_scaling_in_range(scaling)
    {
        out.push(mk(
            &["model", "rope_scaling"],
            "model.rope_scaling is out of range".into(),
            "factor must be at least 1; for llama3, 0 < low_freq_factor < high_freq_factor",
            "copy rope_parameters (or rope_scaling) from config.json".into(),
        ));
    }
    if !(m.rms_norm_eps.is_finite() && m.rms_norm_eps > 0.0 && m.rms_norm_eps < 1.0) {
        out.push(mk(
            &["model", "rms_norm_eps"],
            format!("model.rms_norm_eps ({}) is out of range", m.rms_norm_eps),
            "must be above 0 and below 1",
            "typical values are 1e-5 and 1e-6".into(),
        ));
    }
}

/// Whether a rope scaling's factor is at least 1 and, for llama3, its frequency factors are
/// finite with 0 < low_freq_factor < high_freq_factor and its original positions at least 1.
fn rope_scaling_in_range(scaling: &RopeScaling) -> bool {
    let (factor, ok) = match *scaling {
        RopeScaling::Linear { factor } => (factor, true),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => (
            factor,
            low_freq_factor.is_finite()
                && high_freq_factor.is_finite()
                && low_freq_factor > 0.0
                && high_freq_factor > low_freq_factor
                && original_max_position_embeddings > 0,
        ),
    };
    factor.is_finite() && factor >= 1.0 && ok
}

/// The special tokens of a LLaMA: `bos_token_id` and every `eos_token_ids` within the
/// vocabulary, and at least one end-of-sequence id.
fn check_llama_tokens(m: &Llama, out: &mut Vec<Diagnostic>, mk: &MakeDiagnostic) {
    if m.vocab_size > 0 && m.bos_token_id as usize >= m.vocab_size {
        out.push(mk(
            &["model", "bos_token_id"],
            format!("model.bos_token_id ({}) is not below vocab_size ({})", m.bos_token_id, m.vocab_size),
            "outside the vocabulary",
            "check bos_token_id in config.json".into(),
        ));
    }
    if m.eos_token_ids.is_empty() {
        out.push(mk(
            &["model", "eos_token_ids"],
            "model.eos_token_ids is empty".into(),
            "generation could never stop at end of sequence",
            "list the model's end-of-sequence ids, e.g. [2]".into(),
        ));
    }
    if let Some(bad) = m.eos_token_ids.iter().find(|&&id| m.vocab_size > 0 && id as usize >= m.vocab_size) {
        out.push(mk(
            &["model", "eos_token_ids"],
            format!("model.eos_token_ids holds {bad}, which is not below vocab_size ({})", m.vocab_size),
            "outside the vocabulary",
            "check eos_token_id in config.json".into(),
        ));
    }
}

/// The checks of a BERT's `[model]` table, and of `max_seq_len` against its positions. False
/// when a size is out of range, and then nothing else is checked (the sizes' products could
/// overflow).
fn check_bert(
    m: &Bert,
    max_seq_len: usize,
    span: &SpanOf,
    src: &WorkloadSource,
    out: &mut Vec<Diagnostic>,
    mk: &MakeDiagnostic,
) -> bool {
    let at = |path: &[&str]| span(path).unwrap_or(0..0);
    let sizes = [
        ("hidden_size", m.hidden_size, 1 << 20),
        ("intermediate_size", m.intermediate_size, 1 << 22),
        ("num_layers", m.num_layers, 4096),
        ("num_heads", m.num_heads, 4096),
        ("head_dim", m.head_dim, 4096),
        ("vocab_size", m.vocab_size, 1 << 24),
        ("max_position_embeddings", m.max_position_embeddings, 1 << 20),
        ("type_vocab_size", m.type_vocab_size, 1 << 16),
    ];
    if !check_sizes(&sizes, out, mk) {
        return false;
    }
    if m.num_heads * m.head_dim != m.hidden_size {
        let mut d = src
            .diag(format!(
                "model.head_dim ({}) is inconsistent with hidden_size ({}) and num_heads ({})",
                m.head_dim, m.hidden_size, m.num_heads
            ))
            .primary(at(&["model", "head_dim"]), "num_heads × head_dim must equal hidden_size");
        if let Some(s) = span(&["model", "hidden_size"]) {
            d = d.secondary(s, "hidden_size");
        }
        out.push(d.hint(format!(
            "for a BERT model, head_dim = hidden_size / num_heads = {}",
            m.hidden_size / m.num_heads
        )));
    }
    if !(m.layer_norm_eps.is_finite() && m.layer_norm_eps > 0.0 && m.layer_norm_eps < 1.0) {
        out.push(mk(
            &["model", "layer_norm_eps"],
            format!("model.layer_norm_eps ({}) is out of range", m.layer_norm_eps),
            "must be above 0 and below 1",
            "BERT models use 1e-12".into(),
        ));
    }
    if m.normalize && m.pooling == Pooling::None {
        out.push(mk(
            &["model", "normalize"],
            "model.normalize needs a pooled vector, but model.pooling is \"none\"".into(),
            "nothing to normalize",
            "set pooling = \"mean\" (sentence-transformers) or \"cls\", or normalize = false".into(),
        ));
    }
    if max_seq_len > m.max_position_embeddings {
        out.push(seq_above_positions(
            max_seq_len,
            m.max_position_embeddings,
            "the position embedding has no row for it",
            span,
            src,
        ));
    }
    true
}

/// The diagnostic of a `request.max_seq_len` above the model's `max_position_embeddings`;
/// `label` says why that cannot be served.
fn seq_above_positions(
    max_seq_len: usize,
    max_position_embeddings: usize,
    label: &str,
    span: &SpanOf,
    src: &WorkloadSource,
) -> Diagnostic {
    let mut d = src
        .diag(format!(
            "request.max_seq_len ({max_seq_len}) is above model.max_position_embeddings ({max_position_embeddings})"
        ))
        .primary(span(&["request", "max_seq_len"]).unwrap_or(0..0), label);
    if let Some(s) = span(&["model", "max_position_embeddings"]) {
        d = d.secondary(s, "the model's limit");
    }
    d.hint(format!("set max_seq_len to at most {max_position_embeddings}"))
}

/// The checks of the `[target]` table: the arch and its CPU features, the hardware class and
/// the number of threads.
fn check_target(
    t: &Target,
    span: &SpanOf,
    src: &WorkloadSource,
    out: &mut Vec<Diagnostic>,
    mk: &MakeDiagnostic,
) {
    match t.arch.as_str() {
        "x86_64" => check_cpu_features(&t.cpu_features, span, src, out),
        other => {
            let hint = match nearest(other, ["x86_64"]) {
                Some(near) => format!("did you mean `{near}`?"),
                None => "monogen generates CPU code for x86_64 only, for now".into(),
            };
            out.push(mk(
                &["target", "arch"],
                format!("unsupported target arch `{other}`"),
                "not an arch monogen generates for",
                hint,
            ));
        }
    }
    match (t.device, &t.cuda_arch) {
        (Device::Cuda, None) => out.push(mk(
            &["target", "device"],
            "a CUDA target needs target.cuda_arch".into(),
            "no GPU architecture",
            format!(
                "add `cuda_arch = \"sm_90\"` (H100, H200) or `\"sm_80\"` (A100) under [target]; one of {}",
                CUDA_ARCHES.join(", ")
            ),
        )),
        (Device::Cuda, Some(arch)) if !CUDA_ARCHES.contains(&arch.as_str()) => out.push(mk(
            &["target", "cuda_arch"],
            format!("unsupported CUDA architecture `{arch}`"),
            "not an architecture monogen compiles for",
            match nearest(arch, CUDA_ARCHES.iter().copied()) {
                Some(near) => format!("did you mean `{near}`?"),
                None => format!("use one of {} (bfloat16 needs sm_80 or later)", CUDA_ARCHES.join(", ")),
            },
        )),
        (Device::Cpu, Some(_)) => out.push(mk(
            &["target", "cuda_arch"],
            "target.cuda_arch is only for `device = \"cuda\"`".into(),
            "a CPU target",
            "remove `cuda_arch`, or set `device = \"cuda\"`".into(),
        )),
        _ => {}
    }
    if let Some(class) = &t.hardware
        && !is_hardware_class(class)
    {
        out.push(mk(
            &["target", "hardware"],
            format!("`{class}` cannot name a hardware class"),
            "not a folder name of rankings/",
            "use lowercase letters, digits and `-`, starting with a letter or digit (e.g. `xeon-8480-2c`); `monogen init` writes this machine's".into(),
        ));
    }
    if t.threads == 0 {
        out.push(mk(
            &["target", "threads"],
            "target.threads must be at least 1".into(),
            "zero threads",
            "use the number of cores to run on, e.g. 2".into(),
        ));
    } else if t.threads > 1024 {
        out.push(mk(
            &["target", "threads"],
            format!("target.threads ({}) is above 1024", t.threads),
            "too many",
            "use the number of cores to run on".into(),
        ));
    }
}

/// The GPU architectures CUDA crates are generated for: bfloat16 arithmetic needs sm_80 or later.
pub const CUDA_ARCHES: &[&str] = &["sm_80", "sm_86", "sm_89", "sm_90"];

/// What a CUDA crate can be today: a LLaMA decoder with f32 or bf16 weights and an f32 or bf16 KV
/// cache, one sequence at a time, without a server or speculation. Each other choice is refused
/// by name rather than generated wrong.
fn check_cuda(w: &Workload, out: &mut Vec<Diagnostic>, mk: &MakeDiagnostic) {
    let cuda_only = |what: &str| format!("CUDA crates do not support {what} yet");
    let mut refuse = |path: &[&str], message: String, hint: &str| {
        out.push(mk(path, message, "not for CUDA yet", hint.into()));
    };
    if let Model::Bert(_) = &w.model {
        refuse(
            &["model", "architecture"],
            "CUDA crates are generated for LLaMA decoders only, for now".into(),
            "use `device = \"cpu\"` for an encoder",
        );
    }
    if !matches!(w.weights.dtype, Dtype::F32 | Dtype::Bf16) {
        refuse(
            &["weights", "dtype"],
            format!("CUDA crates hold their weights in f32 or bf16, not {}", w.weights.dtype.as_str()),
            "use `dtype = \"bf16\"` (or \"f32\")",
        );
    }
    if w.weights.activations != Activations::F32 {
        refuse(&["weights", "activations"], cuda_only("bfloat16 activations"), "leave `activations` out");
    }
    if w.weights.classifier_dtype.is_some() {
        refuse(
            &["weights", "classifier_dtype"],
            cuda_only("a classifier dtype of its own"),
            "leave `classifier_dtype` out",
        );
    }
    if w.request.max_batch() != 1 {
        refuse(&["request", "max_batch"], cuda_only("batched decoding"), "use `max_batch = 1`");
    }
    if w.serving.is_some() {
        refuse(&["serving"], cuda_only("a server (`[serving]`)"), "remove `[serving]`");
    }
    if w.speculation.is_some() {
        refuse(&["speculation"], cuda_only("speculation"), "remove `[speculation]`");
    }
}

/// Every CPU feature of an x86_64 target must be one monogen knows, listed once; each
/// diagnostic points at the offending element of `target.cpu_features`.
fn check_cpu_features(features: &[String], span: &SpanOf, src: &WorkloadSource, out: &mut Vec<Diagnostic>) {
    let mut seen = std::collections::BTreeSet::new();
    for (i, f) in features.iter().enumerate() {
        let path_span = span(&["target", "cpu_features"]).map(|s| element_span(&src.text, s, i));
        if !cpu::X86_64_FEATURES.contains(&f.as_str()) {
            let hint = match nearest(f, cpu::X86_64_FEATURES.iter().copied()) {
                Some(near) => format!("did you mean `{near}`?"),
                None => format!("known x86_64 features: {}", cpu::X86_64_FEATURES.join(", ")),
            };
            out.push(
                src.diag(format!("unknown CPU feature `{f}`"))
                    .primary(path_span.unwrap_or(0..0), "not an x86_64 feature monogen knows")
                    .hint(hint),
            );
        } else if !seen.insert(f.as_str()) {
            out.push(
                src.diag(format!("CPU feature `{f}` is listed twice"))
                    .primary(path_span.unwrap_or(0..0), "duplicate")
                    .hint("list each feature once"),
            );
        }
    }
}

/// The checks of the `[request]` table, a decoder's or an encoder's, and of
/// `requests_per_load`, which both have.
fn check_request(r: &Request, out: &mut Vec<Diagnostic>, mk: &MakeDiagnostic) {
    match r {
        Request::Decoder(r) => check_decoder_request(r, out, mk),
        Request::Encoder(r) => check_encoder_request(r, out, mk),
    }
    if r.requests_per_load() == Some(0) {
        out.push(mk(
            &["request", "requests_per_load"],
            "request.requests_per_load must be at least 1".into(),
            "zero",
            "use 1 for a process per request (a command-line run), or leave it out for a server that loads once"
                .into(),
        ));
    }
}

/// Every `(model field, value, largest value monogen accepts)` must be in 1..=max: far above
/// real models, low enough that no product of shapes overflows. False (with a diagnostic per
/// field) when one is not.
fn check_sizes(sizes: &[(&str, usize, usize)], out: &mut Vec<Diagnostic>, mk: &MakeDiagnostic) -> bool {
    let mut ok = true;
    for &(key, value, max) in sizes {
        let (message, label) = match value {
            0 => (format!("model.{key} must be at least 1"), "zero"),
            v if v > max => {
                (format!("model.{key} ({v}) is above {max}, the largest monogen accepts"), "too large")
            }
            _ => continue,
        };
        out.push(mk(&["model", key], message, label, "copy the value from the model's config.json".into()));
        ok = false;
    }
    ok
}

/// `max_seq_len` within 1..=2^24; false (with a diagnostic) when not.
fn check_max_seq_len(max_seq_len: usize, out: &mut Vec<Diagnostic>, mk: &MakeDiagnostic) -> bool {
    if max_seq_len > 1 << 24 {
        out.push(mk(
            &["request", "max_seq_len"],
            format!("request.max_seq_len ({max_seq_len}) is above {}, the largest monogen accepts", 1 << 24),
            "too large",
            "use the longest sequence you serve".into(),
        ));
        return false;
    }
    if max_seq_len == 0 {
        out.push(mk(
            &["request", "max_seq_len"],
            "request.max_seq_len must be at least 1".into(),
            "zero",
            "use the longest sequence you serve".into(),
        ));
        return false;
    }
    true
}

fn check_decoder_request(r: &DecoderRequest, out: &mut Vec<Diagnostic>, mk: &MakeDiagnostic) {
    if r.max_batch == 0 {
        out.push(mk(
            &["request", "max_batch"],
            "request.max_batch must be at least 1".into(),
            "zero",
            "use 1".into(),
        ));
    } else if r.max_batch > 256 {
        out.push(mk(
            &["request", "max_batch"],
            format!(
                "request.max_batch ({}) is above 256, the most sequences one decode step runs",
                r.max_batch
            ),
            "too large",
            "use the most sequences you decode at once, e.g. 16".into(),
        ));
    }
    if !check_max_seq_len(r.max_seq_len, out, mk) {
        return;
    }
    if r.typical_prompt_len == 0 || r.typical_prompt_len > r.max_seq_len {
        out.push(mk(
            &["request", "typical_prompt_len"],
            format!(
                "request.typical_prompt_len ({}) must be between 1 and max_seq_len ({})",
                r.typical_prompt_len, r.max_seq_len
            ),
            "out of range",
            "use the prompt length you expect most often".into(),
        ));
    } else if r.typical_decode_len > r.max_seq_len - r.typical_prompt_len {
        out.push(mk(
            &["request", "typical_decode_len"],
            format!(
                "request.typical_prompt_len + typical_decode_len ({}) is above max_seq_len ({})",
                r.typical_prompt_len + r.typical_decode_len,
                r.max_seq_len
            ),
            "a typical request would not fit",
            format!("use at most {}", r.max_seq_len - r.typical_prompt_len),
        ));
    }
}

/// The `[serving]` table of a decoder workload: its classes, queue and KV caches.
fn check_serving(s: &Serving, r: &DecoderRequest, out: &mut Vec<Diagnostic>, mk: &MakeDiagnostic) {
    if s.priorities.is_empty() {
        out.push(mk(
            &["serving", "priorities"],
            "serving.priorities is empty".into(),
            "no class",
            "name at least one class, most urgent first, e.g. [\"interactive\", \"batch\"]".into(),
        ));
    }
    for (i, class) in s.priorities.iter().enumerate() {
        let valid = !class.is_empty()
            && class.len() <= 32
            && class.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
        if !valid {
            out.push(mk(
                &["serving", "priorities"],
                format!("serving.priorities: `{class}` cannot name a class"),
                "not a class name",
                "use lowercase letters, digits, `-` and `_` (at most 32 characters)".into(),
            ));
        } else if s.priorities[..i].contains(class) {
            out.push(mk(
                &["serving", "priorities"],
                format!("serving.priorities names `{class}` twice"),
                "repeated",
                "name each class once, most urgent first".into(),
            ));
        }
    }
    if let Some(default) = &s.default_priority
        && !s.priorities.contains(default)
    {
        out.push(mk(
            &["serving", "default_priority"],
            format!("serving.default_priority `{default}` is not one of serving.priorities"),
            "unknown class",
            format!("use one of: {}", s.priorities.join(", ")),
        ));
    }
    if s.batch_wait_ms.is_some() {
        out.push(mk(
            &["serving", "batch_wait_ms"],
            "serving.batch_wait_ms applies to encoders (`bert`) only".into(),
            "a decoder batches continuously",
            "remove it: a decoder's request joins the running batch at the next step".into(),
        ));
    }
    if let Some(slots) = s.kv_slots
        && (slots < r.max_batch || slots > 4096)
    {
        out.push(mk(
            &["serving", "kv_slots"],
            format!(
                "serving.kv_slots ({slots}) must be between request.max_batch ({}) and 4096",
                r.max_batch
            ),
            "out of range",
            format!("use at least {}: every sequence in the batch holds one KV cache", r.max_batch),
        ));
    }
    if let Some(chat) = &s.chat
        && let Err(e) = minijinja::Environment::new().template_from_str(&chat.template)
    {
        out.push(mk(
            &["serving", "chat", "template"],
            format!(
                "serving.chat.template is not a Jinja template: {}",
                e.detail().unwrap_or("syntax error")
            ),
            "does not parse",
            match e.range() {
                Some(range) => format!(
                    "it fails at `{}` (line {} of the template); fix it as the model's own template reads",
                    template_excerpt(&chat.template, range),
                    e.line().unwrap_or(1)
                ),
                None => "fix it as the model's own template reads".into(),
            },
        ));
    }
    check_queue_and_body(s, out, mk);
}

/// The template's text around `range`, on one line: a few characters either side.
fn template_excerpt(template: &str, range: Range<usize>) -> String {
    let start = (0..=range.start.saturating_sub(40).min(template.len()))
        .rev()
        .find(|&i| template.is_char_boundary(i))
        .unwrap_or(0);
    let end = (range.end.min(template.len()) + 8).min(template.len());
    let end = (end..=template.len()).find(|&i| template.is_char_boundary(i)).unwrap_or(template.len());
    template[start.min(end)..end].replace('\n', "\\n")
}

/// The `[serving]` table of an encoder workload: its wait, queue and request bodies.
fn check_embedding_serving(s: &Serving, out: &mut Vec<Diagnostic>, mk: &MakeDiagnostic) {
    if s.batch_wait_ms.is_some_and(|ms| ms > 1000) {
        out.push(mk(
            &["serving", "batch_wait_ms"],
            format!("serving.batch_wait_ms ({}) must be at most 1000", s.batch_wait_ms.unwrap_or_default()),
            "out of range",
            "a few milliseconds fill a batch under load without slowing a lone request, e.g. 2".into(),
        ));
    }
    check_queue_and_body(s, out, mk);
}

/// What every `[serving]` table bounds: its queue and its request bodies.
fn check_queue_and_body(s: &Serving, out: &mut Vec<Diagnostic>, mk: &MakeDiagnostic) {
    if s.max_queue == 0 || s.max_queue > 1 << 16 {
        out.push(mk(
            &["serving", "max_queue"],
            format!("serving.max_queue ({}) must be between 1 and {}", s.max_queue, 1 << 16),
            "out of range",
            "use the most requests that may wait for a place in the batch, e.g. 64".into(),
        ));
    }
    if s.max_body_bytes < 1024 || s.max_body_bytes > 1 << 30 {
        out.push(mk(
            &["serving", "max_body_bytes"],
            format!("serving.max_body_bytes ({}) must be between 1024 and {}", s.max_body_bytes, 1u64 << 30),
            "out of range",
            "use 1048576 (1 MiB) unless prompts are longer".into(),
        ));
    }
}

fn check_encoder_request(r: &EncoderRequest, out: &mut Vec<Diagnostic>, mk: &MakeDiagnostic) {
    if r.max_batch == 0 || r.max_batch > 1 << 16 {
        out.push(mk(
            &["request", "max_batch"],
            format!("request.max_batch ({}) must be between 1 and {}", r.max_batch, 1 << 16),
            "out of range",
            "use the most sentences you embed in one call, e.g. 32".into(),
        ));
    }
    if !check_max_seq_len(r.max_seq_len, out, mk) {
        return;
    }
    if r.typical_seq_len == 0 || r.typical_seq_len > r.max_seq_len {
        out.push(mk(
            &["request", "typical_seq_len"],
            format!(
                "request.typical_seq_len ({}) must be between 1 and max_seq_len ({})",
                r.typical_seq_len, r.max_seq_len
            ),
            "out of range",
            "use the sentence length you expect most often, in tokens".into(),
        ));
    }
    if r.typical_batch == 0 || r.typical_batch > r.max_batch {
        out.push(mk(
            &["request", "typical_batch"],
            format!(
                "request.typical_batch ({}) must be between 1 and max_batch ({})",
                r.typical_batch, r.max_batch
            ),
            "out of range",
            "use the batch size you expect most often".into(),
        ));
    }
}

/// The span of the `index`th element of the array whose span is `array` (best effort).
fn element_span(text: &str, array: Range<usize>, index: usize) -> Range<usize> {
    let Some(inner) = text.get(array.clone()) else { return array };
    let mut pos = 0;
    let mut found = 0;
    while let Some(start) = inner[pos..].find('"') {
        let start = pos + start;
        let Some(len) = inner[start + 1..].find('"') else { break };
        let end = start + 1 + len + 1;
        if found == index {
            return array.start + start..array.start + end;
        }
        found += 1;
        pos = end;
    }
    array
}

fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|d| n.is_multiple_of(*d)).collect()
}

/// Whether `name` is a valid Cargo package name that monogen accepts.
pub fn is_crate_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && name.len() <= 64
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

/// A shape parameter: a quantity of the workload that a manifest's `[constraints.shapes]` may
/// bound and that keys the ranking database's measurements, named as the workload schema
/// names it. [`Workload::shapes`] is the one table of their values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Shape {
    HiddenSize,
    IntermediateSize,
    NumLayers,
    NumHeads,
    NumKvHeads,
    HeadDim,
    VocabSize,
    MaxSeqLen,
}

impl Shape {
    /// Every shape parameter, in the order the model declares them.
    pub const ALL: [Shape; 8] = [
        Shape::HiddenSize,
        Shape::IntermediateSize,
        Shape::NumLayers,
        Shape::NumHeads,
        Shape::NumKvHeads,
        Shape::HeadDim,
        Shape::VocabSize,
        Shape::MaxSeqLen,
    ];

    /// Its name in the workload schema (`[model]`, or `[request]` for `max_seq_len`), in
    /// manifests and in ranking records.
    pub fn name(self) -> &'static str {
        match self {
            Shape::HiddenSize => "hidden_size",
            Shape::IntermediateSize => "intermediate_size",
            Shape::NumLayers => "num_layers",
            Shape::NumHeads => "num_heads",
            Shape::NumKvHeads => "num_kv_heads",
            Shape::HeadDim => "head_dim",
            Shape::VocabSize => "vocab_size",
            Shape::MaxSeqLen => "max_seq_len",
        }
    }

    /// The shape parameter named `name`.
    pub fn named(name: &str) -> Option<Shape> {
        Shape::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// The element types a workload has ([`Workload::element_types`]), by the names that an
/// interface's `[[elements]]` take them by: the weights' dtype, the activations' and the KV
/// cache's.
pub const ELEMENT_PARAMETERS: [&str; 3] = ["weights", "activations", "kv"];

impl Workload {
    /// Sequences one decode step runs: a decoder's `request.max_batch`; 1 for an encoder, which
    /// has no decode step.
    pub fn decode_batch(&self) -> usize {
        match &self.request {
            Request::Decoder(r) => r.max_batch,
            Request::Encoder(_) => 1,
        }
    }

    /// The value of every shape parameter, in [`Shape::ALL`]'s order. An encoder's keys and
    /// values have as many heads as its queries: its `num_kv_heads` is its `num_heads`.
    pub fn shapes(&self) -> [(Shape, usize); 8] {
        let (hidden, intermediate, layers, heads, kv_heads, head_dim, vocab) = match &self.model {
            Model::Llama(m) => (
                m.hidden_size,
                m.intermediate_size,
                m.num_layers,
                m.num_heads,
                m.num_kv_heads,
                m.head_dim,
                m.vocab_size,
            ),
            Model::Bert(m) => (
                m.hidden_size,
                m.intermediate_size,
                m.num_layers,
                m.num_heads,
                m.num_heads,
                m.head_dim,
                m.vocab_size,
            ),
        };
        let values =
            [hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, self.request.max_seq_len()];
        std::array::from_fn(|i| (Shape::ALL[i], values[i]))
    }

    /// The element types the kernels take, by the parameter names of `interfaces/*.toml`'s
    /// `[[elements]]` (`weights`, `activations`, `kv`): what picks an interface's
    /// implementations among those of other element types.
    pub fn element_types(&self) -> BTreeMap<&'static str, &'static str> {
        let [weights, activations, kv] = ELEMENT_PARAMETERS;
        BTreeMap::from([
            (weights, self.weights.dtype.as_str()),
            (activations, self.weights.activations.as_str()),
            (kv, self.kv_cache.dtype.as_str()),
        ])
    }

    /// The workload in canonical TOML (field order fixed, no comments): what `monogen.lock`
    /// records and what the workload hash is taken over.
    pub fn canonical_toml(&self) -> String {
        toml::to_string(self).expect("a workload always serializes")
    }

    /// The LLaMA model of a workload resolved for that architecture.
    pub fn llama(&self) -> &Llama {
        match &self.model {
            Model::Llama(m) => m,
            other => panic!("a {} workload has no LLaMA model", other.architecture().as_str()),
        }
    }

    /// The BERT model of a workload resolved for that architecture.
    pub fn bert(&self) -> &Bert {
        match &self.model {
            Model::Bert(m) => m,
            other => panic!("a {} workload has no BERT model", other.architecture().as_str()),
        }
    }

    /// The request of a decoder workload.
    pub fn decoder(&self) -> &DecoderRequest {
        match &self.request {
            Request::Decoder(r) => r,
            Request::Encoder(_) => panic!("an encoder workload has no decoder request"),
        }
    }

    /// The request of an encoder workload.
    pub fn encoder(&self) -> &EncoderRequest {
        match &self.request {
            Request::Encoder(r) => r,
            Request::Decoder(_) => panic!("a decoder workload has no encoder request"),
        }
    }
}

/// Whether `s` can name a hardware class (a folder of `rankings/`): lowercase letters, digits
/// and `-`, at most 64 characters, not starting with `-`.
pub fn is_hardware_class(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && !s.starts_with('-')
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// A complete workload for unit tests across the crate.
#[cfg(test)]
pub(crate) mod tests_support {
    pub const GOOD: &str = r#"
name = "tiny-cpu-f32"

[model]
architecture = "llama"
hidden_size = 64
intermediate_size = 172
num_layers = 5
num_heads = 8
num_kv_heads = 4
head_dim = 8
vocab_size = 512
max_position_embeddings = 512
rope_theta = 10000.0
rms_norm_eps = 1e-5
tie_word_embeddings = true
bos_token_id = 1
eos_token_ids = [2]

[weights]
dtype = "f32"

[target]
device = "cpu"
arch = "x86_64"
cpu_features = ["avx2", "fma"]
threads = 2

[request]
max_batch = 1
max_seq_len = 512
typical_prompt_len = 128
typical_decode_len = 128
"#;
}

#[cfg(test)]
mod tests {
    use super::tests_support::GOOD;
    use super::*;

    fn parse(text: &str) -> Result<Workload, Vec<Diagnostic>> {
        WorkloadSource::from_text("w.toml", text).parse()
    }

    fn first_error(text: &str) -> String {
        parse(text).unwrap_err()[0].to_string()
    }

    #[test]
    fn parses_a_complete_workload() {
        let w = parse(GOOD).unwrap();
        assert_eq!(w.name, "tiny-cpu-f32");
        assert_eq!(w.llama().num_kv_heads, 4);
        assert_eq!(w.target.cpu_features, ["avx2", "fma"]);
    }

    #[test]
    fn a_cuda_target_needs_its_architecture_and_refuses_what_cuda_crates_cannot_be() {
        let cuda = GOOD.replace("device = \"cpu\"", "device = \"cuda\"\ncuda_arch = \"sm_90\"");
        let w = parse(&cuda).unwrap();
        assert_eq!((w.target.device, w.target.cuda_arch.as_deref()), (Device::Cuda, Some("sm_90")));

        let e = first_error(&GOOD.replace("device = \"cpu\"", "device = \"cuda\""));
        assert!(e.contains("a CUDA target needs target.cuda_arch"), "{e}");
        assert!(e.contains("cuda_arch = \"sm_90\""), "{e}");
        let e = first_error(&cuda.replace("sm_90", "sm_9O"));
        assert!(
            e.contains("unsupported CUDA architecture `sm_9O`") && e.contains("did you mean `sm_90`?"),
            "{e}"
        );
        let e = first_error(&GOOD.replace("device = \"cpu\"", "device = \"cpu\"\ncuda_arch = \"sm_90\""));
        assert!(e.contains("target.cuda_arch is only for `device = \"cuda\"`"), "{e}");
        let e = first_error(&cuda.replace("max_batch = 1", "max_batch = 4"));
        assert!(e.contains("CUDA crates do not support batched decoding yet"), "{e}");
        assert!(e.contains("w.toml:"), "points into the file: {e}");
        let e = first_error(&cuda.replace("dtype = \"f32\"", "dtype = \"int8\""));
        assert!(e.contains("CUDA crates hold their weights in f32 or bf16, not int8"), "{e}");
    }

    #[test]
    fn unknown_key_names_line_column_and_suggests() {
        let text = GOOD.replace("hidden_size = 64", "hiden_size = 64");
        let e = first_error(&text);
        assert!(e.starts_with("w.toml:6:1: unknown field `hiden_size`"), "{e}");
        assert!(e.contains("did you mean `hidden_size`?"), "{e}");
    }

    #[test]
    fn wrong_type_is_located() {
        let e = first_error(&GOOD.replace("num_layers = 5", "num_layers = \"five\""));
        assert!(e.starts_with("w.toml:8:14:"), "{e}");
        assert!(e.contains("invalid type"), "{e}");
    }

    #[test]
    fn semantic_errors_name_the_field_and_hint() {
        let e = first_error(&GOOD.replace("num_kv_heads = 4", "num_kv_heads = 3"));
        assert!(
            e.contains("w.toml:10:16: model.num_heads (8) is not a multiple of model.num_kv_heads (3)"),
            "{e}"
        );
        assert!(e.contains("divisors of 8 are 1, 2, 4, 8"), "{e}");

        let e = first_error(&GOOD.replace("head_dim = 8", "head_dim = 16"));
        assert!(e.contains("model.head_dim (16) is inconsistent"), "{e}");
        assert!(e.contains("head_dim = hidden_size / num_heads = 8"), "{e}");

        let e = first_error(&GOOD.replace("max_seq_len = 512", "max_seq_len = 1024"));
        assert!(e.contains("request.max_seq_len (1024) is above model.max_position_embeddings (512)"), "{e}");

        let e = first_error(&GOOD.replace("threads = 2", "threads = 0"));
        assert!(e.contains("target.threads must be at least 1"), "{e}");

        let e = first_error(&GOOD.replace("max_batch = 1", "max_batch = 300"));
        assert!(e.contains("request.max_batch (300) is above 256"), "{e}");
        assert!(parse(&GOOD.replace("max_batch = 1", "max_batch = 4")).is_ok());
    }

    #[test]
    fn the_serving_table_is_checked() {
        let served = parse(&format!("{GOOD}\n[serving]\n")).unwrap();
        let serving = served.serving.as_ref().expect("a [serving] table");
        assert_eq!(serving.priorities, ["interactive", "batch"]);
        assert_eq!(
            (serving.default_priority(), serving.max_queue, serving.kv_slots(4)),
            ("interactive", 64, 8)
        );
        assert!(served.canonical_toml().contains("[serving]"), "{}", served.canonical_toml());
        assert!(!parse(GOOD).unwrap().canonical_toml().contains("serving"));

        let e = first_error(&format!("{GOOD}\n[serving]\npriorities = [\"a\", \"a\"]\n"));
        assert!(e.contains("serving.priorities names `a` twice"), "{e}");
        let e = first_error(&format!("{GOOD}\n[serving]\npriorities = [\"Fast lane\"]\n"));
        assert!(e.contains("`Fast lane` cannot name a class"), "{e}");
        let e = first_error(&format!("{GOOD}\n[serving]\ndefault_priority = \"bulk\"\n"));
        assert!(e.contains("serving.default_priority `bulk` is not one of serving.priorities"), "{e}");
        assert!(e.contains("use one of: interactive, batch"), "{e}");
        let e = first_error(&format!("{GOOD}\n[serving]\nmax_queue = 0\n"));
        assert!(e.contains("serving.max_queue (0) must be between 1 and 65536"), "{e}");
        let e = first_error(&format!(
            "{}\n[serving]\nkv_slots = 2\n",
            GOOD.replace("max_batch = 1", "max_batch = 4")
        ));
        assert!(e.contains("serving.kv_slots (2) must be between request.max_batch (4) and 4096"), "{e}");
        let e = first_error(&format!("{GOOD}\n[serving]\nqueue = 3\n"));
        assert!(e.contains("unknown field `queue`"), "{e}");
    }

    #[test]
    fn unknown_cpu_feature_points_at_the_element() {
        let e = first_error(&GOOD.replace("\"fma\"]", "\"fmaa\"]"));
        assert!(e.contains("unknown CPU feature `fmaa`"), "{e}");
        assert!(e.contains("did you mean `fma`?"), "{e}");
        assert!(e.starts_with("w.toml:26:25:"), "{e}");
    }

    #[test]
    fn unknown_architecture_and_empty_file() {
        let e = first_error(&GOOD.replace("\"llama\"", "\"lama\""));
        assert!(e.contains("unknown architecture `lama`") && e.contains("did you mean `llama`?"), "{e}");
        assert!(first_error("  \n").contains("workload file is empty"));
    }

    #[test]
    fn absurd_sizes_are_refused_without_overflow() {
        let text = GOOD
            .replace("num_heads = 8", "num_heads = 4294967296")
            .replace("head_dim = 8", "head_dim = 4294967296");
        let e = first_error(&text);
        assert!(e.contains("model.num_heads (4294967296) is above 4096"), "{e}");
        let all: Vec<String> = parse(&GOOD.replace("max_seq_len = 512", "max_seq_len = 100000000000"))
            .unwrap_err()
            .iter()
            .map(|d| d.to_string())
            .collect();
        assert!(all.iter().any(|e| e.contains("is above 16777216")), "{all:?}");
    }

    #[test]
    fn all_problems_are_reported_at_once() {
        let text = GOOD.replace("threads = 2", "threads = 0").replace("max_batch = 1", "max_batch = 0");
        assert_eq!(parse(&text).unwrap_err().len(), 2);
    }

    #[test]
    fn canonical_form_round_trips() {
        let w = parse(GOOD).unwrap();
        let canonical = w.canonical_toml();
        assert!(canonical.contains("architecture = \"llama\""), "{canonical}");
        assert_eq!(parse(&canonical).unwrap(), w);
        // The default KV cache is left out, so that the workloads written before the table
        // existed keep their canonical form (and their measurements); a bf16 one round-trips.
        assert!(!canonical.contains("kv_cache"), "{canonical}");
        let bf16 = parse(&format!("{GOOD}\n[kv_cache]\ndtype = \"bf16\"\n")).unwrap();
        assert_eq!(bf16.kv_cache.dtype, KvDtype::Bf16);
        assert_eq!(parse(&bf16.canonical_toml()).unwrap(), bf16);
    }

    #[test]
    fn requests_per_load_is_optional_positive_and_round_trips() {
        let w = parse(GOOD).unwrap();
        assert_eq!(w.request.requests_per_load(), None);
        assert!(!w.canonical_toml().contains("requests_per_load"), "absent stays absent");
        let counted = parse(&format!("{GOOD}requests_per_load = 1\n")).unwrap();
        assert_eq!(counted.request.requests_per_load(), Some(1));
        assert_eq!(parse(&counted.canonical_toml()).unwrap(), counted);
        let e = first_error(&format!("{GOOD}requests_per_load = 0\n"));
        assert!(e.starts_with("w.toml:34:21: request.requests_per_load must be at least 1"), "{e}");
        assert!(e.contains("leave it out for a server that loads once"), "{e}");
        let e = first_error(&format!("{GOOD}requests_per_load = -3\n"));
        assert!(e.starts_with("w.toml:34:21:"), "{e}");
    }

    #[test]
    fn bf16_activations_need_bf16_weights_and_round_trip() {
        assert_eq!(GOOD.matches("dtype = \"f32\"\n").count(), 1);
        let with = |dtype: &str, activations: &str| {
            GOOD.replace(
                "dtype = \"f32\"\n",
                &format!("dtype = \"{dtype}\"\nactivations = \"{activations}\"\n"),
            )
        };
        let e = first_error(&with("f32", "bf16"));
        assert!(
            e.starts_with("w.toml:22:15:")
                && e.contains("weights.activations = \"bf16\" needs bf16 weights")
                && e.contains("set weights.dtype = \"bf16\""),
            "{e}"
        );
        let e = first_error(&with("bf16", "int8"));
        assert!(e.contains("unknown variant `int8`, expected `f32` or `bf16`"), "{e}");
        let rounded = parse(&with("bf16", "bf16")).unwrap();
        assert_eq!(rounded.weights.activations, Activations::Bf16);
        assert_eq!(parse(&rounded.canonical_toml()).unwrap(), rounded);
        // The default is left out of the canonical form, so that the workloads written before
        // the key existed keep their hashes (and their measurements).
        assert!(!parse(GOOD).unwrap().canonical_toml().contains("activations"));
        assert_eq!(parse(&with("f32", "f32")).unwrap(), parse(GOOD).unwrap());
    }

    #[test]
    fn a_classifier_dtype_round_trips_and_is_refused_beside_bf16_activations() {
        let with = |weights: &str| GOOD.replace("dtype = \"f32\"\n", weights);
        let mixed = parse(&with("dtype = \"int4\"\nclassifier_dtype = \"int8\"\n")).unwrap();
        assert_eq!(mixed.weights.classifier(), Some(Dtype::Int8));
        assert_eq!(parse(&mixed.canonical_toml()).unwrap(), mixed);
        // Absent, it stays out of the canonical form (the workloads' hashes do not move).
        assert!(!parse(GOOD).unwrap().canonical_toml().contains("classifier_dtype"));
        assert_eq!(parse(GOOD).unwrap().weights.classifier(), None);
        let e = first_error(&with("dtype = \"bf16\"\nactivations = \"bf16\"\nclassifier_dtype = \"int8\"\n"));
        assert!(
            e.starts_with("w.toml:23:20:") && e.contains("weights.classifier_dtype with weights.activations"),
            "{e}"
        );
        let e = first_error(&with("dtype = \"int4\"\nclassifier_dtype = \"int2\"\n"));
        assert!(e.contains("unknown variant `int2`"), "{e}");
        // A draft model's [weights] are checked as the workload's, and say they are the draft's.
        let draft = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../workloads/stories260k-cpu-f32-draft-int4.toml"),
        )
        .unwrap()
        .replace(
            "[speculation.draft.weights]\ndtype = \"int4\"\n",
            "[speculation.draft.weights]\ndtype = \"int4\"\nclassifier_dtype = \"int4\"\n",
        );
        let e = WorkloadSource::from_text("w.toml", &draft).parse().expect_err("refused");
        let e = e.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("\n");
        assert!(
            e.contains("the draft model: weights.classifier_dtype is \"int4\", as weights.dtype is"),
            "{e}"
        );
    }

    #[test]
    fn the_kv_cache_table_is_checked() {
        let e = first_error(&format!("{GOOD}\n[kv_cache]\ndtype = \"int8\"\n"));
        assert!(
            e.starts_with("w.toml:36:9:") && e.contains("unknown variant `int8`, expected `f32` or `bf16`"),
            "{e}"
        );
        let e = first_error(&format!("{GOOD}\n[kv_cache]\ndtype = \"bf16\"\nlayout = \"paged\"\n"));
        assert!(e.contains("unknown field `layout`"), "{e}");
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let bert = std::fs::read_to_string(root.join("workloads/all-minilm-l6-v2-cpu-f32.toml")).unwrap();
        let e = first_error(&format!("{bert}\n[kv_cache]\ndtype = \"bf16\"\n"));
        assert!(
            e.contains("a `bert` workload has no KV cache") && e.contains("remove the [kv_cache] table"),
            "{e}"
        );
    }
}
