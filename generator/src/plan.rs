//! The resolved plan: plain data saying what will be generated and why.
//!
//! A [`Plan`] is what `monogen explain` prints (as text or JSON) and the only input of the
//! emitters besides the registry's sources and the templates. It holds no `Option`s that
//! emitters have to interpret: every choice is already made.

use serde::Serialize;

use crate::rankings::Evidence;
use crate::workload::Workload;

#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub workload: Workload,
    /// sha256 of the workload's canonical TOML.
    pub workload_sha256: String,
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
pub enum Consts {
    Llama(LlamaConsts),
    Bert(BertConsts),
}

/// Shapes and constants of a BERT crate, all resolved.
#[derive(Debug, Clone, Serialize)]
pub struct BertConsts {
    pub dim: usize,
    pub hidden_dim: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub type_vocab_size: usize,
    /// Rows of the position embedding.
    pub max_positions: usize,
    /// Longest sequence the crate embeds; longer input is truncated.
    pub max_seq_len: usize,
    /// Most sentences per call.
    pub max_batch: usize,
    pub layer_norm_eps: f32,
    pub pooling: crate::workload::Pooling,
    pub normalize: bool,
    pub threads: usize,
}

/// Shapes and constants of a LLaMA crate, all resolved.
#[derive(Debug, Clone, Serialize)]
pub struct LlamaConsts {
    pub dim: usize,
    pub hidden_dim: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub q_dim: usize,
    pub kv_dim: usize,
    pub vocab_size: usize,
    pub max_seq_len: usize,
    /// Rows processed at once during prefill.
    pub prefill_chunk: usize,
    pub rope_theta: f32,
    pub rms_norm_eps: f32,
    pub bos_id: u32,
    pub eos_ids: Vec<u32>,
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
}

#[derive(Debug, Clone, Serialize)]
pub struct InterfacePlan {
    pub interface: String,
    pub summary: String,
    pub chosen: Chosen,
    pub candidates: Vec<Candidate>,
    /// Competing candidates without fresh measurements on the workload's hardware class, each
    /// with the reason; empty when the choice needs none. `monogen check` reports them.
    pub unmeasured: Vec<String>,
}

/// Whether the chosen matmul (whichever interface the workload's weights take) reads weights
/// that its `pack` rewrote at load: only an interface with `[[packing]]` functions lets an
/// implementation pack (the registry checks), and only the matmul interfaces have one.
pub fn matmul_packs_weights(interfaces: &[InterfacePlan]) -> bool {
    interfaces.iter().any(|i| i.chosen.packs_weights)
}

/// The implementation picked for an interface.
#[derive(Debug, Clone, Serialize)]
pub struct Chosen {
    pub name: String,
    pub version: String,
    pub source_sha256: String,
    pub cpu_features: Vec<String>,
    pub shared: Vec<String>,
    /// Crates its kernel uses, which the generated crate then depends on.
    pub dependencies: Vec<String>,
    /// Whether its kernel reads weights that its `pack` rewrote at load.
    pub packs_weights: bool,
    /// For a kernel that packs its weights, the layout a saved model's packed matrices must be
    /// in for the crate to map them.
    pub packing: Option<Packing>,
    /// The type in which its kernel hands work to the crate's thread team, if it uses one.
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
    pub kv_cache_bytes: u64,
    /// Activation buffers of one session.
    pub scratch_bytes: u64,
}

impl Plan {
    /// The constants of a LLaMA plan.
    pub fn llama(&self) -> &LlamaConsts {
        match &self.consts {
            Consts::Llama(c) => c,
            Consts::Bert(_) => panic!("a BERT plan has no LLaMA constants"),
        }
    }

    /// The constants of a BERT plan.
    pub fn bert(&self) -> &BertConsts {
        match &self.consts {
            Consts::Bert(c) => c,
            Consts::Llama(_) => panic!("a LLaMA plan has no BERT constants"),
        }
    }

    pub fn interface(&self, name: &str) -> &InterfacePlan {
        self.interfaces
            .iter()
            .find(|i| i.interface == name)
            .unwrap_or_else(|| panic!("the plan has no interface `{name}`"))
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
