//! The resolved plan: plain data saying what will be generated and why.
//!
//! A [`Plan`] is what `monogen explain` prints (as text or JSON) and the only input of the
//! emitters besides the registry's sources and the templates. It holds no `Workload`, only
//! what the crate needs of it (and the workload's canonical table, for the lock file): every
//! choice is already made, and every quantity the crate needs is here under the name it has
//! in the workload schema and in the generated constant. Its `Option`s are the model's own
//! options (rope scaling, a sliding window) and a kernel's (its packing, its team job).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::rankings::Evidence;
use crate::workload::{Architecture, DecoderRequest, EncoderRequest, Target, Weights};

#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// The crate's package and binary name: the workload's `name`.
    pub name: String,
    /// The crate's one-line description: the workload's, or one made from its model.
    pub description: String,
    /// The element types of the weights and of the products' activations.
    pub weights: Weights,
    /// Where the crate runs: device, arch, CPU features, threads, hardware class.
    pub target: Target,
    /// The workload as its canonical TOML table, which monogen.lock records.
    #[serde(skip)]
    pub workload_table: toml::Table,
    /// The workload file as it was written (its canonical TOML for a workload made in code),
    /// which the crate keeps as `workload.toml`: `monogen build --crate DIR` builds from it.
    #[serde(skip)]
    pub workload_file: String,
    /// Float constants as the workload writes them (an f32 prints badly), for the README:
    /// `rope_theta` and `rms_norm_eps` of a LLaMA model, `layer_norm_eps` of a BERT model.
    pub float_literals: BTreeMap<String, String>,
    /// sha256 of the workload's canonical TOML.
    pub workload_sha256: String,
    /// The shapes the ranking database keys this workload's measurements by.
    pub shapes: String,
    /// The derived constants the generated crate bakes in.
    pub consts: Consts,
    /// One entry per interface the architecture needs, in the order the forward pass uses them.
    pub interfaces: Vec<InterfacePlan>,
    /// CPU features the chosen kernels enable, in canonical order: the start-up check.
    pub cpu_features: Vec<String>,
    /// Shared helper modules the chosen kernels use, sorted.
    pub shared_modules: Vec<String>,
    pub footprint: Footprint,
}

/// The constants a generated crate bakes in, per architecture.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
#[allow(
    clippy::large_enum_variant,
    reason = "one per plan, built once; a box would only add a hop to every read"
)]
pub enum Consts {
    Llama(LlamaConsts),
    Bert(BertConsts),
}

impl Consts {
    pub fn architecture(&self) -> Architecture {
        match self {
            Consts::Llama(_) => Architecture::Llama,
            Consts::Bert(_) => Architecture::Bert,
        }
    }

    /// Requests a process serves per load of the model, where the workload counts the load.
    pub fn requests_per_load(&self) -> Option<u64> {
        match self {
            Consts::Llama(c) => c.request.requests_per_load,
            Consts::Bert(c) => c.request.requests_per_load,
        }
    }
}

/// Shapes and constants of a BERT crate, all resolved.
#[derive(Debug, Clone, Serialize)]
pub struct BertConsts {
    /// The workload's `hidden_size`: the crate's `HIDDEN_SIZE`.
    pub hidden_size: usize,
    /// The workload's `intermediate_size`: the crate's `INTERMEDIATE_SIZE`.
    pub intermediate_size: usize,
    /// The workload's `num_layers`: the crate's `NUM_LAYERS`.
    pub num_layers: usize,
    /// The workload's `num_heads`: the crate's `NUM_HEADS`.
    pub num_heads: usize,
    /// The workload's `head_dim`: the crate's `HEAD_DIM`.
    pub head_dim: usize,
    /// The workload's `vocab_size`: the crate's `VOCAB_SIZE`.
    pub vocab_size: usize,
    pub type_vocab_size: usize,
    /// Rows of the position embedding.
    pub max_position_embeddings: usize,
    /// Longest sequence the crate embeds; longer input is truncated.
    pub max_seq_len: usize,
    /// Most sentences per call.
    pub max_batch: usize,
    pub layer_norm_eps: f32,
    pub pooling: crate::workload::Pooling,
    pub normalize: bool,
    pub threads: usize,
    /// The request pattern: batch and sequence bounds, the typical call.
    pub request: EncoderRequest,
    /// The embeddings server, where the workload has a `[serving]` table.
    pub serving: Option<EmbeddingServingPlan>,
}

/// How an encoder's server batches: resolved from `[serving]`.
#[derive(Debug, Clone, Serialize)]
pub struct EmbeddingServingPlan {
    /// Requests that may wait for a place in a batch; one more is answered 429.
    pub max_queue: usize,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// How long the first sentence of a batch waits for others, in milliseconds.
    pub batch_wait_ms: u64,
}

/// Shapes and constants of a LLaMA crate, all resolved.
#[derive(Debug, Clone, Serialize)]
pub struct LlamaConsts {
    /// The workload's `hidden_size`: the crate's `HIDDEN_SIZE`.
    pub hidden_size: usize,
    /// The workload's `intermediate_size`: the crate's `INTERMEDIATE_SIZE`.
    pub intermediate_size: usize,
    /// The workload's `num_layers`: the crate's `NUM_LAYERS`.
    pub num_layers: usize,
    /// The workload's `num_heads`: the crate's `NUM_HEADS`.
    pub num_heads: usize,
    /// The workload's `num_kv_heads`: the crate's `NUM_KV_HEADS`.
    pub num_kv_heads: usize,
    /// The workload's `head_dim`: the crate's `HEAD_DIM`.
    pub head_dim: usize,
    pub q_dim: usize,
    pub kv_dim: usize,
    /// The workload's `vocab_size`: the crate's `VOCAB_SIZE`.
    pub vocab_size: usize,
    pub max_seq_len: usize,
    /// Rows processed at once during prefill.
    pub prefill_chunk: usize,
    pub rope_theta: f32,
    pub rms_norm_eps: f32,
    pub bos_token_id: u32,
    pub eos_token_ids: Vec<u32>,
    pub threads: usize,
    pub tie_word_embeddings: bool,
    /// The q, k and v projections add a bias.
    pub qkv_bias: bool,
    pub rope_scaling: Option<crate::workload::RopeScaling>,
    /// Positions each query attends to (itself included), when attention slides.
    pub sliding_window: Option<usize>,
    /// The weights are copied into anonymous memory at load (see
    /// `resolve::RESIDENT_WEIGHT_BYTES`) rather than read through the file mapping, where the
    /// kernel maps the file in small pages (`runtime/resident.rs`).
    pub resident_weights: bool,
    /// The KV cache's element type, which `kv_cache` and the attention interfaces take.
    pub kv_dtype: crate::workload::KvDtype,
    /// The request pattern: longest sequence, typical prompt and decode lengths.
    pub request: DecoderRequest,
    /// Positions one batched step runs at most: a prefill chunk beside a full batch's decode
    /// rows (`PREFILL_CHUNK + MAX_BATCH`); the prefill chunk alone without batching.
    pub step_rows: usize,
    /// The HTTP server, when the workload has a `[serving]` table.
    pub serving: Option<ServingPlan>,
    /// Speculative decoding, when the workload's `[speculation]` names a speculator.
    pub speculation: Option<Box<SpeculationPlan>>,
    /// Where the workload leaves the speculator to measurement (`speculator = "measured"`):
    /// what was chosen and why.
    pub speculation_measured: Option<Box<MeasuredSpeculation>>,
    /// This crate is another crate's draft model (`speculator = "draft-model"`), generated
    /// into that crate's `draft/`: its sessions rewind, as the drafter needs them to.
    pub drafts: bool,
}

/// The choice made for `speculator = "measured"`.
#[derive(Debug, Clone, Serialize)]
pub struct MeasuredSpeculation {
    /// `none` or `prompt-lookup, N drafts`.
    pub chosen: String,
    /// Why, with the figures.
    pub reason: String,
    /// Why the workload's hardware class lacks a fresh measurement, where it does.
    pub unmeasured: Option<String>,
}

impl From<crate::speculation::Decision> for MeasuredSpeculation {
    fn from(d: crate::speculation::Decision) -> MeasuredSpeculation {
        MeasuredSpeculation { chosen: d.summary(), reason: d.reason, unmeasured: d.unmeasured }
    }
}

/// How generation speculates: the crate's `DRAFT_TOKENS`, `LOOKUP_MAX` and `LOOKUP_MIN`, and
/// its `speculator` kernel.
#[derive(Debug, Clone, Serialize)]
pub struct SpeculationPlan {
    /// The `speculator` implementation that drafts, or `draft-model`.
    pub speculator: String,
    /// With `draft-model`: the draft model's plan, which the emitter makes a crate of in the
    /// target crate's `draft/` (a path dependency, `draft_model`).
    pub draft: Option<Box<Plan>>,
    pub draft_tokens: usize,
    pub lookup_max: usize,
    pub lookup_min: usize,
}

impl LlamaConsts {
    /// The draft model's plan, where a draft model speculates.
    pub fn draft(&self) -> Option<&Plan> {
        self.speculation.as_ref()?.draft.as_deref()
    }

    /// The prefix cache's least shared start (`PREFIX_CACHE_MIN`), where the workload sets
    /// `request.shared_prefix_len`: half of it. A server keeps finished requests' caches; a
    /// `Session` keeps its own positions for `generate_anew`.
    pub fn prefix_cache_min(&self) -> Option<usize> {
        self.request.shared_prefix_len.map(|n| n.div_ceil(2).max(1))
    }

    /// Whether the crate runs sequences in batches (`model::Batch`): it batches them
    /// (request.max_batch above 1), or serves them (a batch of one still interleaves prompts
    /// with decode steps).
    pub fn batched(&self) -> bool {
        self.request.max_batch > 1 || self.serving.is_some()
    }
}

/// The generated server's settings, every default filled in.
#[derive(Debug, Clone, Serialize)]
pub struct ServingPlan {
    /// Priority classes, most urgent first.
    pub priorities: Vec<String>,
    /// The class of a request that names none.
    pub default_priority: String,
    /// Requests that may wait for a place in the batch.
    pub max_queue: usize,
    /// KV caches the server holds: the running sequences' and the displaced ones'.
    pub kv_slots: usize,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// The server keeps finished requests' KV caches and reuses one for a request that starts
    /// with at least this many of its tokens (half `request.shared_prefix_len`, at least 1);
    /// `None`: no prefix cache.
    pub prefix_cache_min: Option<usize>,
    /// The server answers chat completions with this chat template, which the crate embeds.
    pub chat: Option<Box<crate::workload::Chat>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct InterfacePlan {
    pub interface: String,
    /// The part of the model this instance of the interface serves, where the crate calls two
    /// of it: `classifier` for the classifier's own `matmul` (`weights.classifier_dtype`).
    /// `None` for the interface every other call goes through.
    pub role: Option<String>,
    pub summary: String,
    /// The element type of the interface that the workload's element types pick (`bf16` of
    /// `matmul<bf16>`); `None` for an interface without element types.
    pub element: Option<String>,
    /// The element types of `element` (`weights = "int8"`, ...); empty without one.
    pub takes: BTreeMap<String, String>,
    /// The implementation every other one of this element type is checked against.
    pub reference: String,
    pub chosen: Chosen,
    pub candidates: Vec<Candidate>,
    /// The implementations that compete for the workload (compatible and not shadowed), in
    /// declared-priority order: what `bench` measures.
    pub competitors: Vec<String>,
    /// Competing candidates without fresh measurements on the workload's hardware class, each
    /// with the reason; empty when the choice needs none. `monogen check` reports them.
    pub unmeasured: Vec<String>,
}

/// Whether the chosen matmul (of whichever element type the workload's weights take) reads
/// weights that its `pack` rewrote at load: only an interface with `[[packing]]` functions lets
/// an implementation pack (the registry checks), and only `matmul` has one.
pub fn matmul_packs_weights(interfaces: &[InterfacePlan]) -> bool {
    interfaces.iter().any(|i| i.chosen.packs_weights)
}

/// The implementation picked for an interface.
#[derive(Debug, Clone, Serialize)]
pub struct Chosen {
    pub name: String,
    pub version: String,
    pub source_sha256: String,
    /// The registry's revision as the choice saw it: a hash of every compatible
    /// implementation of the interface (name, version, kernel and shared sources), which the
    /// lock records.
    pub candidates_sha256: String,
    pub cpu_features: Vec<String>,
    pub shared: Vec<String>,
    /// Crates its kernel uses, which the generated crate then depends on.
    pub dependencies: Vec<String>,
    /// Whether its kernel reads weights that its `pack` rewrote at load.
    pub packs_weights: bool,
    /// For a kernel that packs its weights, the layout a saved model's packed matrices must be
    /// in for the crate to map them.
    pub packing: Option<Packing>,
    /// The type in which its kernel hands work to the crate's thread team, if it uses one, as
    /// a path from the crate's `kernels` module (`shared::avx512_matmul::Product<u16>`).
    pub team_job: Option<String>,
    /// Why it won, in one sentence, with the evidence (for `explain`).
    pub reason: String,
    /// Why it won in words that do not change when the same ranking is measured again (for
    /// the generated README, which must not change when nothing flipped).
    pub basis: String,
}

/// The layout of a packing kernel's weights, as a generated crate names and checks it.
#[derive(Debug, Clone, Serialize)]
pub struct Packing {
    /// The function (`module::function` of `kernels::shared`) that gives the length of a
    /// packed `[n, k]` matrix.
    pub packed_len: String,
    /// `interface/implementation version sha256:…` with the hash of its kernel and shared
    /// modules (as a ranking record keeps it): a saved model's packed matrices are mapped only
    /// by a crate whose kernel packs exactly the same way.
    pub layout: String,
}

/// Every implementation of an interface, and what resolution made of it.
#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    pub name: String,
    pub version: String,
    pub priority: i64,
    pub verdict: Verdict,
    /// What the ranking database says about it; `None` when it does not compete (rejected
    /// or shadowed).
    pub evidence: Option<Evidence>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    Chosen {
        reason: String,
    },
    /// Compatible, but another compatible candidate ranks higher.
    Outranked {
        by: String,
        reason: String,
        /// `reason` without figures, for the generated README.
        basis: String,
    },
    /// Compatible, but a compatible candidate declares that it replaces this one.
    Shadowed {
        by: String,
    },
    /// Fits, but its output did not match the reference's when it was measured: never chosen.
    Failed {
        failure: String,
    },
    /// Does not fit the workload.
    Rejected {
        reasons: Vec<String>,
    },
}

/// Memory the generated crate needs at run time.
#[derive(Debug, Clone, Serialize)]
pub struct Footprint {
    pub parameters: u64,
    pub weight_bytes: u64,
    /// The KV cache of one sequence, full.
    pub kv_cache_bytes: u64,
    /// KV caches the crate holds at most: 1 for one session, the server's KV slots, or a
    /// batch's sequences.
    pub kv_caches: u64,
    /// Activation buffers of one session.
    pub scratch_bytes: u64,
}

impl Plan {
    /// The plan of interface `name`, if the forward pass calls it (the one every call but a
    /// role's goes through).
    pub fn interface(&self, name: &str) -> Option<&InterfacePlan> {
        self.interfaces.iter().find(|i| i.interface == name && i.role.is_none())
    }

    /// The classifier's own `matmul`, where `weights.classifier_dtype` gives it another
    /// element type than the other matrices'.
    pub fn classifier_matmul(&self) -> Option<&InterfacePlan> {
        self.interfaces.iter().find(|i| i.interface == "matmul" && i.role.as_deref() == Some(CLASSIFIER))
    }
}

/// The role of the classifier's own `matmul`.
pub const CLASSIFIER: &str = "classifier";

/// The name of the crate's module that holds an instance's chosen kernel
/// (`kernels/<module>.rs`), which also keys its choice in `monogen.lock`: the interface's name,
/// with `_<role>` for a role's instance (`matmul_classifier`).
pub fn role_module(interface: &str, role: Option<&str>) -> String {
    match role {
        None => interface.to_string(),
        Some(role) => format!("{interface}_{role}"),
    }
}

/// How messages name an instance: `matmul`, or `matmul (classifier)`.
pub fn role_title(interface: &str, role: Option<&str>) -> String {
    match role {
        None => interface.to_string(),
        Some(role) => format!("{interface} ({role})"),
    }
}

impl InterfacePlan {
    /// [`role_module`] of this instance.
    pub fn module(&self) -> String {
        role_module(&self.interface, self.role.as_deref())
    }

    /// [`role_title`] of this instance.
    pub fn title(&self) -> String {
        role_title(&self.interface, self.role.as_deref())
    }
}

/// `1234567` (nanoseconds) → `1.23 ms`.
pub fn human_ns(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.3} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.3} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

/// `1234567` → `1.2 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}
