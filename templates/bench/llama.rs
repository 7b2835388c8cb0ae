//! The passes of a LLaMA workload: per interface, the calls of one forward pass (the typical
//! prompt for prefill, one step at the typical context for decode) on buffers of its shapes,
//! and the comparison of a candidate with the reference.

use std::hint::black_box;

use crate::harness::{Matmul, Packing, Phases, Rng, Storage, TOLERANCE, bf16_bits, compare};
use crate::{
    CONTEXT, DECODE_ROWS, DIM, HEAD_DIM, HIDDEN_DIM, KV_DIM, MAX_SEQ_LEN, N_HEADS, N_KV_HEADS, N_LAYERS, PROMPT,
    Q_DIM, RMS_NORM_EPS, ROPE_THETA, ROWS, VOCAB_SIZE,
};

pub trait Rmsnorm {
    fn rmsnorm<const D: usize>(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32, rows: usize);
}

pub trait Rope {
    fn rope_table<const HD: usize>(theta: f32, positions: usize) -> (Vec<f32>, Vec<f32>);
    fn rope_table_from<const HD: usize>(inv_freq: &[f32], positions: usize) -> (Vec<f32>, Vec<f32>);
    fn rope<const H: usize, const HD: usize>(x: &mut [f32], cos: &[f32], sin: &[f32], start: usize, rows: usize);
}

/// A value of a KV cache: `f32`, or `u16` holding a bfloat16 (the high 16 bits of an f32).
pub trait Cached: Copy + 'static {
    /// `v` as the cache stores it: itself, or rounded to the nearest bfloat16.
    fn from_f32(v: f32) -> Self;
    /// The value, exactly.
    fn to_f32(self) -> f32;
}

impl Cached for f32 {
    fn from_f32(v: f32) -> f32 {
        v
    }

    fn to_f32(self) -> f32 {
        self
    }
}

impl Cached for u16 {
    fn from_f32(v: f32) -> u16 {
        bf16_bits(v)
    }

    fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self) << 16)
    }
}

pub trait AttentionPrefill {
    type Kv: Cached;
    fn attention_prefill<const H: usize, const KVH: usize, const HD: usize>(
        out: &mut [f32],
        q: &[f32],
        keys: &[Self::Kv],
        values: &[Self::Kv],
        scores: &mut [f32],
        start: usize,
        rows: usize,
    );
}

pub trait AttentionDecode {
    type Kv: Cached;
    fn attention_decode<const H: usize, const KVH: usize, const HD: usize>(
        out: &mut [f32],
        q: &[f32],
        keys: &[Self::Kv],
        values: &[Self::Kv],
        scores: &mut [f32],
    );
}

pub trait Swiglu {
    fn swiglu<const HIDDEN: usize>(gate: &mut [f32], up: &[f32], rows: usize);
}

pub trait KvCache {
    type Kv: Cached;
    type Cache;
    fn new() -> Self::Cache;
    fn store(cache: &mut Self::Cache, start: usize, k: &[f32], v: &[f32]);
    fn keys(cache: &Self::Cache, len: usize) -> &[Self::Kv];
    fn values(cache: &Self::Cache, len: usize) -> &[Self::Kv];
}

pub trait Sampler {
    fn sample<const VOCAB: usize>(
        logits: &[f32],
        temperature: f32,
        top_k: usize,
        top_p: f32,
        coin: f32,
        scratch: &mut Vec<(f32, u32)>,
    ) -> u32;
}

/// The seven projections of one layer, [out, in] each.
struct Projections<W> {
    q: W,
    k: W,
    v: W,
    o: W,
    gate: W,
    up: W,
    down: W,
}

/// Every matmul of a forward pass: seven projections per layer on `rows` rows, and the
/// classifier on the last row of a prompt or every row of a decode step (`DECODE_ROWS`: one per
/// sequence of a batched step), with the weights as the interface `M` of `new` holds them.
pub struct MatmulPass<W> {
    /// Where the matrices are, as a crate's loader places them (read through `layers`).
    storage: Storage,
    layers: Vec<Projections<W>>,
    classifier: W,
    x: Vec<f32>,
    attention: Vec<f32>,
    hidden: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    logits: Vec<f32>,
}

impl<W> MatmulPass<W> {
    pub const PHASES: Phases = (true, true);

    pub fn new<M: Matmul<Weights = W>>() -> MatmulPass<W> {
        let mut rng = Rng::new(1);
        let mut storage = Storage::default();
        let mut matrix = |n: usize, k: usize| M::weights(&mut storage, &rng.vec(n * k, 0.1), n, k);
        let layers = (0..N_LAYERS)
            .map(|_| Projections {
                q: matrix(Q_DIM, DIM),
                k: matrix(KV_DIM, DIM),
                v: matrix(KV_DIM, DIM),
                o: matrix(DIM, Q_DIM),
                gate: matrix(HIDDEN_DIM, DIM),
                up: matrix(HIDDEN_DIM, DIM),
                down: matrix(DIM, HIDDEN_DIM),
            })
            .collect();
        let classifier = matrix(VOCAB_SIZE, DIM);
        MatmulPass {
            storage,
            layers,
            classifier,
            x: rng.vec(ROWS * DIM, 1.0),
            attention: rng.vec(ROWS * Q_DIM, 1.0),
            hidden: rng.vec(ROWS * HIDDEN_DIM, 1.0),
            q: vec![0.0; ROWS * Q_DIM],
            k: vec![0.0; ROWS * KV_DIM],
            v: vec![0.0; ROWS * KV_DIM],
            o: vec![0.0; ROWS * DIM],
            gate: vec![0.0; ROWS * HIDDEN_DIM],
            up: vec![0.0; ROWS * HIDDEN_DIM],
            down: vec![0.0; ROWS * DIM],
            logits: vec![0.0; DECODE_ROWS * VOCAB_SIZE],
        }
    }

    /// What the interface's packing of the pass's matrices took (0 for a kernel that does not
    /// pack): the time it adds to a crate's load.
    pub fn packing(&self) -> Packing {
        self.storage.packing()
    }

    /// One forward pass: the prompt (`decode` false) or one decode step of `DECODE_ROWS`
    /// sequences.
    pub fn run<M: Matmul<Weights = W>>(&mut self, decode: bool) {
        let rows = if decode { DECODE_ROWS } else { PROMPT };
        self.layers_with::<M>(rows);
        self.classify::<M>(rows);
        black_box(&self.logits);
    }

    /// The rows the classifier takes after `rows` rows: every row of a decode step of
    /// `DECODE_ROWS` sequences, else the last one.
    fn classified(rows: usize) -> usize {
        if rows == DECODE_ROWS { DECODE_ROWS } else { 1 }
    }

    /// The logits of the rows [`MatmulPass::classified`] names.
    fn classify<M: Matmul<Weights = W>>(&mut self, rows: usize) {
        let logits = Self::classified(rows);
        M::matmul::<VOCAB_SIZE, DIM>(&mut self.logits, &self.x[..logits * DIM], &self.classifier, logits);
    }

    fn layers_with<M: Matmul<Weights = W>>(&mut self, rows: usize) {
        for l in &self.layers {
            M::matmul::<Q_DIM, DIM>(&mut self.q, &self.x, &l.q, rows);
            M::matmul::<KV_DIM, DIM>(&mut self.k, &self.x, &l.k, rows);
            M::matmul::<KV_DIM, DIM>(&mut self.v, &self.x, &l.v, rows);
            M::matmul::<DIM, Q_DIM>(&mut self.o, &self.attention, &l.o, rows);
            M::matmul::<HIDDEN_DIM, DIM>(&mut self.gate, &self.x, &l.gate, rows);
            M::matmul::<HIDDEN_DIM, DIM>(&mut self.up, &self.x, &l.up, rows);
            M::matmul::<DIM, HIDDEN_DIM>(&mut self.down, &self.hidden, &l.down, rows);
        }
    }

    fn outputs(&self, rows: usize) -> [(&'static str, Vec<f32>); 8] {
        [
            ("q_proj", self.q[..rows * Q_DIM].to_vec()),
            ("k_proj", self.k[..rows * KV_DIM].to_vec()),
            ("v_proj", self.v[..rows * KV_DIM].to_vec()),
            ("o_proj", self.o[..rows * DIM].to_vec()),
            ("gate_proj", self.gate[..rows * HIDDEN_DIM].to_vec()),
            ("up_proj", self.up[..rows * HIDDEN_DIM].to_vec()),
            ("down_proj", self.down[..rows * DIM].to_vec()),
            ("classifier", self.logits[..Self::classified(rows) * VOCAB_SIZE].to_vec()),
        ]
    }

    fn clear(&mut self) {
        for buffer in [&mut self.q, &mut self.k, &mut self.v, &mut self.o, &mut self.gate, &mut self.up, &mut self.down, &mut self.logits] {
            buffer.fill(f32::NAN);
        }
    }

    /// What `M` computes on this pass's matrices at `rows` rows, every output named.
    fn outputs_of<M: Matmul<Weights = W>>(&mut self, rows: usize) -> [(&'static str, Vec<f32>); 8] {
        self.clear();
        self.layers_with::<M>(rows);
        self.classify::<M>(rows);
        self.outputs(rows)
    }

    /// Compares `C` with the reference `R` on every shape of the pass, for the prompt, one
    /// row, a few rows, and a batched decode step's rows.
    pub fn check<C: Matmul<Weights = W>, R: Matmul<Weights = W>>(&mut self) -> Result<(), String> {
        for rows in [PROMPT, 1, 3.min(PROMPT), DECODE_ROWS] {
            let got = self.outputs_of::<C>(rows);
            compare_outputs(rows, &got, &self.outputs_of::<R>(rows))?;
        }
        Ok(())
    }

    /// As [`MatmulPass::check`], for a candidate `C` that holds its weights in another layout
    /// (it packs them): `C` runs on `candidate`, the same matrices as it holds them.
    pub fn check_packed<C: Matmul, R: Matmul<Weights = W>>(
        &mut self,
        candidate: &mut MatmulPass<C::Weights>,
    ) -> Result<(), String> {
        for rows in [PROMPT, 1, 3.min(PROMPT), DECODE_ROWS] {
            let got = candidate.outputs_of::<C>(rows);
            compare_outputs(rows, &got, &self.outputs_of::<R>(rows))?;
        }
        Ok(())
    }
}

/// Compares the named outputs of a candidate with the reference's, each within the tolerance
/// of its K.
fn compare_outputs(rows: usize, got: &[(&'static str, Vec<f32>)], want: &[(&'static str, Vec<f32>)]) -> Result<(), String> {
    let tolerance = |k: usize| TOLERANCE * (k as f32 / 64.0).max(1.0);
    for ((name, g), (_, w)) in got.iter().zip(want) {
        let k = match *name {
            "o_proj" => Q_DIM,
            "down_proj" => HIDDEN_DIM,
            _ => DIM,
        };
        compare(&format!("{name} at {rows} rows"), g, w, tolerance(k))?;
    }
    Ok(())
}

/// Every RMSNorm of a forward pass: two per layer on `rows` rows, and the final one on the
/// last row.
pub struct RmsnormPass {
    weights: Vec<Vec<f32>>,
    x: Vec<f32>,
    out: Vec<f32>,
}

impl RmsnormPass {
    pub const PHASES: Phases = (true, true);

    pub fn new() -> RmsnormPass {
        let mut rng = Rng::new(2);
        RmsnormPass {
            weights: (0..2 * N_LAYERS + 1).map(|_| rng.vec(DIM, 1.0)).collect(),
            x: rng.vec(ROWS * DIM, 2.0),
            out: vec![0.0; ROWS * DIM],
        }
    }

    /// The norms of the prompt (the final one on its last row), or of a decode step of
    /// `DECODE_ROWS` sequences (the final one on every row).
    pub fn run<M: Rmsnorm>(&mut self, decode: bool) {
        let (rows, last_rows) = if decode { (DECODE_ROWS, DECODE_ROWS) } else { (PROMPT, 1) };
        let (last, layers) = self.weights.split_last().expect("there is a final norm");
        for weight in layers {
            M::rmsnorm::<DIM>(&mut self.out, &self.x, weight, RMS_NORM_EPS, rows);
        }
        M::rmsnorm::<DIM>(&mut self.out, &self.x[..last_rows * DIM], last, RMS_NORM_EPS, last_rows);
        black_box(&self.out);
    }

    pub fn check<C: Rmsnorm, R: Rmsnorm>(&mut self) -> Result<(), String> {
        for rows in [PROMPT, 1, DECODE_ROWS] {
            let mut got = vec![f32::NAN; rows * DIM];
            let mut want = vec![f32::NAN; rows * DIM];
            C::rmsnorm::<DIM>(&mut got, &self.x, &self.weights[0], RMS_NORM_EPS, rows);
            R::rmsnorm::<DIM>(&mut want, &self.x, &self.weights[0], RMS_NORM_EPS, rows);
            compare(&format!("rmsnorm at {rows} rows"), &got, &want, TOLERANCE)?;
        }
        Ok(())
    }
}

/// Every rotation of a forward pass: queries and keys of each layer.
pub struct RopePass {
    cos: Vec<f32>,
    sin: Vec<f32>,
    q: Vec<Vec<f32>>,
    k: Vec<Vec<f32>>,
}

impl RopePass {
    pub const PHASES: Phases = (true, true);

    /// The tables come from the reference `R`; `check` compares each candidate's own.
    pub fn new<R: Rope>() -> RopePass {
        let mut rng = Rng::new(3);
        let (cos, sin) = R::rope_table::<HEAD_DIM>(ROPE_THETA, MAX_SEQ_LEN);
        RopePass {
            cos,
            sin,
            q: (0..N_LAYERS).map(|_| rng.vec(PROMPT * Q_DIM, 1.0)).collect(),
            k: (0..N_LAYERS).map(|_| rng.vec(PROMPT * KV_DIM, 1.0)).collect(),
        }
    }

    pub fn run<M: Rope>(&mut self, decode: bool) {
        let (start, rows) = if decode { (CONTEXT, 1) } else { (0, PROMPT) };
        for (q, k) in self.q.iter_mut().zip(&mut self.k) {
            M::rope::<N_HEADS, HEAD_DIM>(q, &self.cos, &self.sin, start, rows);
            M::rope::<N_KV_HEADS, HEAD_DIM>(k, &self.cos, &self.sin, start, rows);
        }
        black_box(&self.q);
    }

    pub fn check<C: Rope, R: Rope>(&mut self) -> Result<(), String> {
        let (cos_c, sin_c) = C::rope_table::<HEAD_DIM>(ROPE_THETA, MAX_SEQ_LEN);
        compare("rope_table cos", &cos_c, &self.cos, TOLERANCE)?;
        compare("rope_table sin", &sin_c, &self.sin, TOLERANCE)?;
        let inv_freq: Vec<f32> = (0..HEAD_DIM / 2).map(|i| 0.5f32.powi(i as i32)).collect();
        let (cos_f, sin_f) = C::rope_table_from::<HEAD_DIM>(&inv_freq, MAX_SEQ_LEN);
        let (cos_r, sin_r) = R::rope_table_from::<HEAD_DIM>(&inv_freq, MAX_SEQ_LEN);
        compare("rope_table_from cos", &cos_f, &cos_r, TOLERANCE)?;
        compare("rope_table_from sin", &sin_f, &sin_r, TOLERANCE)?;
        for (start, rows) in [(0, PROMPT), (CONTEXT, 1)] {
            let mut got = self.q[0].clone();
            let mut want = self.q[0].clone();
            C::rope::<N_HEADS, HEAD_DIM>(&mut got, &cos_c, &sin_c, start, rows);
            R::rope::<N_HEADS, HEAD_DIM>(&mut want, &self.cos, &self.sin, start, rows);
            compare(&format!("rope of queries at position {start}, {rows} rows"), &got, &want, TOLERANCE)?;
            let mut got = self.k[0].clone();
            let mut want = self.k[0].clone();
            C::rope::<N_KV_HEADS, HEAD_DIM>(&mut got, &cos_c, &sin_c, start, rows);
            R::rope::<N_KV_HEADS, HEAD_DIM>(&mut want, &self.cos, &self.sin, start, rows);
            compare(&format!("rope of keys at position {start}, {rows} rows"), &got, &want, TOLERANCE)?;
        }
        Ok(())
    }
}

/// Queries, the keys and values of every layer over `len` positions (in the cache's element
/// type `E`), and the buffers the attention kernels write.
pub struct AttentionInputs<E> {
    q: Vec<f32>,
    keys: Vec<Vec<E>>,
    values: Vec<Vec<E>>,
    scores: Vec<f32>,
    out: Vec<f32>,
}

impl<E: Cached> AttentionInputs<E> {
    fn new(seed: u64, rows: usize, len: usize) -> AttentionInputs<E> {
        let mut rng = Rng::new(seed);
        let q = rng.vec(rows * Q_DIM, 1.0);
        let mut cached = |len: usize| rng.vec(len, 1.0).into_iter().map(E::from_f32).collect::<Vec<E>>();
        AttentionInputs {
            q,
            keys: (0..N_LAYERS).map(|_| cached(len * KV_DIM)).collect(),
            values: (0..N_LAYERS).map(|_| cached(len * KV_DIM)).collect(),
            scores: vec![0.0; MAX_SEQ_LEN],
            out: vec![0.0; rows * Q_DIM],
        }
    }
}

/// Attention over the prompt, one call per layer.
pub struct AttentionPrefillPass<E>(AttentionInputs<E>);

impl<E: Cached> AttentionPrefillPass<E> {
    pub const PHASES: Phases = (true, false);

    pub fn new() -> AttentionPrefillPass<E> {
        AttentionPrefillPass(AttentionInputs::new(4, PROMPT, PROMPT))
    }

    pub fn run<M: AttentionPrefill<Kv = E>>(&mut self, _decode: bool) {
        let a = &mut self.0;
        for (keys, values) in a.keys.iter().zip(&a.values) {
            M::attention_prefill::<N_HEADS, N_KV_HEADS, HEAD_DIM>(&mut a.out, &a.q, keys, values, &mut a.scores, 0, PROMPT);
        }
        black_box(&a.out);
    }

    pub fn check<C: AttentionPrefill<Kv = E>, R: AttentionPrefill<Kv = E>>(&mut self) -> Result<(), String> {
        let a = &mut self.0;
        let mut got = vec![f32::NAN; PROMPT * Q_DIM];
        let mut want = vec![f32::NAN; PROMPT * Q_DIM];
        C::attention_prefill::<N_HEADS, N_KV_HEADS, HEAD_DIM>(&mut got, &a.q, &a.keys[0], &a.values[0], &mut a.scores, 0, PROMPT);
        R::attention_prefill::<N_HEADS, N_KV_HEADS, HEAD_DIM>(&mut want, &a.q, &a.keys[0], &a.values[0], &mut a.scores, 0, PROMPT);
        compare(&format!("attention over a prompt of {PROMPT}"), &got, &want, TOLERANCE)
    }
}

/// Attention of one decode step at the typical context, one call per layer.
pub struct AttentionDecodePass<E>(AttentionInputs<E>);

impl<E: Cached> AttentionDecodePass<E> {
    pub const PHASES: Phases = (false, true);

    pub fn new() -> AttentionDecodePass<E> {
        AttentionDecodePass(AttentionInputs::new(5, 1, CONTEXT + 1))
    }

    pub fn run<M: AttentionDecode<Kv = E>>(&mut self, _decode: bool) {
        let a = &mut self.0;
        for (keys, values) in a.keys.iter().zip(&a.values) {
            M::attention_decode::<N_HEADS, N_KV_HEADS, HEAD_DIM>(&mut a.out, &a.q, keys, values, &mut a.scores);
        }
        black_box(&a.out);
    }

    pub fn check<C: AttentionDecode<Kv = E>, R: AttentionDecode<Kv = E>>(&mut self) -> Result<(), String> {
        let a = &mut self.0;
        for len in [CONTEXT + 1, 1, 17.min(CONTEXT + 1)] {
            let keys = &a.keys[0][..len * KV_DIM];
            let values = &a.values[0][..len * KV_DIM];
            let mut got = vec![f32::NAN; Q_DIM];
            let mut want = vec![f32::NAN; Q_DIM];
            C::attention_decode::<N_HEADS, N_KV_HEADS, HEAD_DIM>(&mut got, &a.q, keys, values, &mut a.scores);
            R::attention_decode::<N_HEADS, N_KV_HEADS, HEAD_DIM>(&mut want, &a.q, keys, values, &mut a.scores);
            compare(&format!("attention over a context of {len}"), &got, &want, TOLERANCE)?;
        }
        Ok(())
    }
}

/// The SwiGLU of each layer. Its input is restored before every call (the kernel works in
/// place), so the timing includes that copy for every candidate alike.
pub struct SwigluPass {
    source: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
}

impl SwigluPass {
    pub const PHASES: Phases = (true, true);

    pub fn new() -> SwigluPass {
        let mut rng = Rng::new(6);
        let source = rng.vec(ROWS * HIDDEN_DIM, 4.0);
        SwigluPass { gate: source.clone(), source, up: rng.vec(ROWS * HIDDEN_DIM, 2.0) }
    }

    /// The MLP activations of the prompt, or of a decode step of `DECODE_ROWS` sequences.
    pub fn run<M: Swiglu>(&mut self, decode: bool) {
        let rows = if decode { DECODE_ROWS } else { PROMPT };
        for _ in 0..N_LAYERS {
            self.gate[..rows * HIDDEN_DIM].copy_from_slice(&self.source[..rows * HIDDEN_DIM]);
            M::swiglu::<HIDDEN_DIM>(&mut self.gate, &self.up, rows);
        }
        black_box(&self.gate);
    }

    pub fn check<C: Swiglu, R: Swiglu>(&mut self) -> Result<(), String> {
        for rows in [PROMPT, 1, DECODE_ROWS] {
            let mut got = self.source.clone();
            let mut want = self.source.clone();
            C::swiglu::<HIDDEN_DIM>(&mut got, &self.up, rows);
            R::swiglu::<HIDDEN_DIM>(&mut want, &self.up, rows);
            compare(&format!("swiglu at {rows} rows"), &got, &want, TOLERANCE)?;
        }
        Ok(())
    }
}

/// The KV cache of every layer: storing the prompt's keys and values and reading them back,
/// or storing one position and reading the typical context.
pub struct KvCachePass<M: KvCache> {
    caches: Vec<M::Cache>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl<M: KvCache> KvCachePass<M> {
    pub const PHASES: Phases = (true, true);

    pub fn new() -> KvCachePass<M> {
        let mut rng = Rng::new(7);
        KvCachePass {
            caches: (0..N_LAYERS).map(|_| M::new()).collect(),
            k: rng.vec(MAX_SEQ_LEN * KV_DIM, 1.0),
            v: rng.vec(MAX_SEQ_LEN * KV_DIM, 1.0),
        }
    }

    pub fn run(&mut self, decode: bool) {
        let (start, rows) = if decode { (CONTEXT, 1) } else { (0, PROMPT) };
        let k = &self.k[start * KV_DIM..(start + rows) * KV_DIM];
        let v = &self.v[start * KV_DIM..(start + rows) * KV_DIM];
        for cache in &mut self.caches {
            M::store(cache, start, k, v);
            black_box(M::keys(cache, start + rows));
            black_box(M::values(cache, start + rows));
        }
    }
}

/// Compares a candidate cache with the reference's after the prompt and decode steps up to
/// the typical context.
pub fn check_kv_cache<C: KvCache, R: KvCache<Kv = C::Kv>>() -> Result<(), String> {
    let widened = |values: &[C::Kv]| values.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
    let mut rng = Rng::new(8);
    let k = rng.vec((CONTEXT + 1) * KV_DIM, 1.0);
    let v = rng.vec((CONTEXT + 1) * KV_DIM, 1.0);
    let mut got = C::new();
    let mut want = R::new();
    C::store(&mut got, 0, &k[..PROMPT * KV_DIM], &v[..PROMPT * KV_DIM]);
    R::store(&mut want, 0, &k[..PROMPT * KV_DIM], &v[..PROMPT * KV_DIM]);
    for pos in PROMPT..=CONTEXT {
        C::store(&mut got, pos, &k[pos * KV_DIM..(pos + 1) * KV_DIM], &v[pos * KV_DIM..(pos + 1) * KV_DIM]);
        R::store(&mut want, pos, &k[pos * KV_DIM..(pos + 1) * KV_DIM], &v[pos * KV_DIM..(pos + 1) * KV_DIM]);
    }
    for len in [PROMPT, CONTEXT + 1] {
        let (got_keys, want_keys) = (widened(C::keys(&got, len)), widened(R::keys(&want, len)));
        compare(&format!("keys of {len} positions"), &got_keys, &want_keys, 0.0)?;
        let (got_values, want_values) = (widened(C::values(&got, len)), widened(R::values(&want, len)));
        compare(&format!("values of {len} positions"), &got_values, &want_values, 0.0)?;
    }
    Ok(())
}

/// Sampling the next token at temperature 0.8 and top-p 0.95, once per step.
pub struct SamplerPass {
    logits: Vec<f32>,
    scratch: Vec<(f32, u32)>,
    rng: Rng,
}

impl SamplerPass {
    pub const PHASES: Phases = (true, true);

    pub fn new() -> SamplerPass {
        let mut rng = Rng::new(9);
        SamplerPass { logits: rng.vec(VOCAB_SIZE, 8.0), scratch: Vec::new(), rng }
    }

    pub fn run<M: Sampler>(&mut self, _decode: bool) {
        let coin = self.rng.unit();
        black_box(M::sample::<VOCAB_SIZE>(&self.logits, 0.8, 0, 0.95, coin, &mut self.scratch));
    }

    pub fn check<C: Sampler, R: Sampler>(&mut self) -> Result<(), String> {
        let settings = [(0.0, 0, 1.0), (0.8, 0, 0.95), (1.0, 40, 1.0), (1.3, 10, 0.5)];
        for (temperature, top_k, top_p) in settings {
            for coin in [0.0, 0.1, 0.5, 0.9, 0.999] {
                let got = C::sample::<VOCAB_SIZE>(&self.logits, temperature, top_k, top_p, coin, &mut self.scratch);
                let want = R::sample::<VOCAB_SIZE>(&self.logits, temperature, top_k, top_p, coin, &mut self.scratch);
                if got != want {
                    return Err(format!(
                        "at temperature {temperature}, top-k {top_k}, top-p {top_p} and coin {coin} it picks {got}, the reference {want}"
                    ));
                }
            }
        }
        Ok(())
    }
}
