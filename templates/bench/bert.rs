//! The passes of a BERT workload: per interface, the calls of one `embed` of the typical batch
//! (BATCH sentences of SEQ tokens, ROWS = BATCH · SEQ rows) on buffers of its shapes, and the
//! comparison of a candidate with the reference. An encoder has no decode step.

use std::hint::black_box;

use crate::harness::{Matmul, Packing, Phases, Rng, Storage, TOLERANCE, compare};
use crate::{
    BATCH, DIM, HEAD_DIM, HIDDEN_DIM, LAYER_NORM_EPS, MAX_POSITIONS, N_HEADS, N_LAYERS, ROWS, SEQ,
    TYPE_VOCAB_SIZE, VOCAB_SIZE,
};

pub trait Embedding {
    fn embed<const D: usize>(
        out: &mut [f32],
        ids: &[u32],
        token_types: &[u32],
        words: &[f32],
        positions: &[f32],
        types: &[f32],
    );
}

pub trait Layernorm {
    fn layernorm<const D: usize>(out: &mut [f32], x: &[f32], weight: &[f32], bias: &[f32], eps: f32, rows: usize);
}

pub trait AttentionEncoder {
    fn attention_encoder<const H: usize, const HD: usize>(
        out: &mut [f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        scores: &mut [f32],
        len: usize,
    );
}

pub trait Gelu {
    fn gelu<const N: usize>(x: &mut [f32], rows: usize);
}

pub trait MeanPooling {
    fn mean_pool<const D: usize>(out: &mut [f32], x: &[f32], len: usize);
}

pub trait L2Normalize {
    fn l2_normalize<const D: usize>(x: &mut [f32], rows: usize);
}

/// The six projections of one layer, [out, in] each.
struct Projections<W> {
    query: W,
    key: W,
    value: W,
    output: W,
    intermediate: W,
    down: W,
}

/// Every matmul of a forward pass: six projections per layer on ROWS rows, with the weights
/// as the interface `M` of `new` holds them.
pub struct MatmulPass<W> {
    /// Where the matrices are, as a crate's loader places them (read through `layers`).
    storage: Storage,
    layers: Vec<Projections<W>>,
    x: Vec<f32>,
    hidden: Vec<f32>,
    outputs: [Vec<f32>; 6],
}

impl<W> MatmulPass<W> {
    pub const PHASES: Phases = (true, false);

    pub fn new<M: Matmul<Weights = W>>() -> MatmulPass<W> {
        let mut rng = Rng::new(21);
        let mut storage = Storage::default();
        let mut matrix = |n: usize, k: usize| M::weights(&mut storage, &rng.vec(n * k, 0.1), n, k);
        let layers = (0..N_LAYERS)
            .map(|_| Projections {
                query: matrix(DIM, DIM),
                key: matrix(DIM, DIM),
                value: matrix(DIM, DIM),
                output: matrix(DIM, DIM),
                intermediate: matrix(HIDDEN_DIM, DIM),
                down: matrix(DIM, HIDDEN_DIM),
            })
            .collect();
        MatmulPass {
            storage,
            layers,
            x: rng.vec(ROWS * DIM, 1.0),
            hidden: rng.vec(ROWS * HIDDEN_DIM, 1.0),
            outputs: [0, 1, 2, 3, 4, 5].map(|i| vec![0.0; ROWS * if i == 4 { HIDDEN_DIM } else { DIM }]),
        }
    }

    /// What the interface's packing of the pass's matrices took (0 for a kernel that does not
    /// pack): the time it adds to a crate's load.
    pub fn packing(&self) -> Packing {
        self.storage.packing()
    }

    pub fn run<M: Matmul<Weights = W>>(&mut self, _decode: bool) {
        self.layers_with::<M>(ROWS);
        black_box(&self.outputs);
    }

    fn layers_with<M: Matmul<Weights = W>>(&mut self, rows: usize) {
        let [q, k, v, o, mid, down] = &mut self.outputs;
        for l in &self.layers {
            M::matmul::<DIM, DIM>(q, &self.x, &l.query, rows);
            M::matmul::<DIM, DIM>(k, &self.x, &l.key, rows);
            M::matmul::<DIM, DIM>(v, &self.x, &l.value, rows);
            M::matmul::<DIM, DIM>(o, &self.x, &l.output, rows);
            M::matmul::<HIDDEN_DIM, DIM>(mid, &self.x, &l.intermediate, rows);
            M::matmul::<DIM, HIDDEN_DIM>(down, &self.hidden, &l.down, rows);
        }
    }

    /// What `M` computes on this pass's matrices at `rows` rows.
    fn outputs_of<M: Matmul<Weights = W>>(&mut self, rows: usize) -> [Vec<f32>; 6] {
        self.outputs.iter_mut().for_each(|o| o.fill(f32::NAN));
        self.layers_with::<M>(rows);
        self.outputs.clone()
    }

    /// Compares `C` with the reference `R` on every shape of the pass, for the typical batch,
    /// one row, and a few rows.
    pub fn check<C: Matmul<Weights = W>, R: Matmul<Weights = W>>(&mut self) -> Result<(), String> {
        for rows in [ROWS, 1, 3.min(ROWS)] {
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
        for rows in [ROWS, 1, 3.min(ROWS)] {
            let got = candidate.outputs_of::<C>(rows);
            compare_outputs(rows, &got, &self.outputs_of::<R>(rows))?;
        }
        Ok(())
    }
}

/// Compares the six products of a candidate with the reference's at `rows` rows, each within
/// the tolerance of its K.
fn compare_outputs(rows: usize, got: &[Vec<f32>; 6], want: &[Vec<f32>; 6]) -> Result<(), String> {
    let names = ["query", "key", "value", "attention output", "intermediate", "output"];
    for (i, name) in names.iter().enumerate() {
        let (k, n) = match i {
            4 => (DIM, HIDDEN_DIM),
            5 => (HIDDEN_DIM, DIM),
            _ => (DIM, DIM),
        };
        let tolerance = TOLERANCE * (k as f32 / 64.0).max(1.0);
        let len = rows * n;
        compare(&format!("{name} at {rows} rows"), &got[i][..len], &want[i][..len], tolerance)?;
    }
    Ok(())
}

/// The embeddings of every sentence of the batch.
pub struct EmbeddingPass {
    words: Vec<f32>,
    positions: Vec<f32>,
    types: Vec<f32>,
    ids: Vec<Vec<u32>>,
    kinds: Vec<u32>,
    out: Vec<f32>,
}

impl EmbeddingPass {
    pub const PHASES: Phases = (true, false);

    pub fn new() -> EmbeddingPass {
        let mut rng = Rng::new(22);
        EmbeddingPass {
            words: rng.vec(VOCAB_SIZE * DIM, 1.0),
            positions: rng.vec(MAX_POSITIONS * DIM, 0.5),
            types: rng.vec(TYPE_VOCAB_SIZE * DIM, 0.1),
            ids: (0..BATCH).map(|_| (0..SEQ).map(|_| (rng.unit() * VOCAB_SIZE as f32) as u32 % VOCAB_SIZE as u32).collect()).collect(),
            kinds: vec![0; SEQ],
            out: vec![0.0; ROWS * DIM],
        }
    }

    pub fn run<M: Embedding>(&mut self, _decode: bool) {
        for (s, ids) in self.ids.iter().enumerate() {
            M::embed::<DIM>(&mut self.out[s * SEQ * DIM..], ids, &self.kinds, &self.words, &self.positions, &self.types);
        }
        black_box(&self.out);
    }

    pub fn check<C: Embedding, R: Embedding>(&mut self) -> Result<(), String> {
        let mut got = vec![f32::NAN; SEQ * DIM];
        let mut want = vec![f32::NAN; SEQ * DIM];
        C::embed::<DIM>(&mut got, &self.ids[0], &self.kinds, &self.words, &self.positions, &self.types);
        R::embed::<DIM>(&mut want, &self.ids[0], &self.kinds, &self.words, &self.positions, &self.types);
        compare(&format!("embedding of {SEQ} tokens"), &got, &want, TOLERANCE)
    }
}

/// Every LayerNorm of a forward pass: the embeddings' and two per layer, on ROWS rows.
pub struct LayernormPass {
    weights: Vec<(Vec<f32>, Vec<f32>)>,
    x: Vec<f32>,
    out: Vec<f32>,
}

impl LayernormPass {
    pub const PHASES: Phases = (true, false);

    pub fn new() -> LayernormPass {
        let mut rng = Rng::new(23);
        LayernormPass {
            weights: (0..2 * N_LAYERS + 1).map(|_| (rng.vec(DIM, 1.0), rng.vec(DIM, 0.2))).collect(),
            x: rng.vec(ROWS * DIM, 3.0),
            out: vec![0.0; ROWS * DIM],
        }
    }

    pub fn run<M: Layernorm>(&mut self, _decode: bool) {
        for (weight, bias) in &self.weights {
            M::layernorm::<DIM>(&mut self.out, &self.x, weight, bias, LAYER_NORM_EPS, ROWS);
        }
        black_box(&self.out);
    }

    pub fn check<C: Layernorm, R: Layernorm>(&mut self) -> Result<(), String> {
        let (weight, bias) = &self.weights[0];
        let mut got = vec![f32::NAN; ROWS * DIM];
        let mut want = vec![f32::NAN; ROWS * DIM];
        C::layernorm::<DIM>(&mut got, &self.x, weight, bias, LAYER_NORM_EPS, ROWS);
        R::layernorm::<DIM>(&mut want, &self.x, weight, bias, LAYER_NORM_EPS, ROWS);
        compare(&format!("layernorm of {ROWS} rows"), &got, &want, TOLERANCE)
    }
}

/// Attention of every layer over each sentence's SEQ tokens.
pub struct AttentionEncoderPass {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    scores: Vec<f32>,
    out: Vec<f32>,
}

impl AttentionEncoderPass {
    pub const PHASES: Phases = (true, false);

    pub fn new() -> AttentionEncoderPass {
        let mut rng = Rng::new(24);
        AttentionEncoderPass {
            q: rng.vec(ROWS * DIM, 1.0),
            k: rng.vec(ROWS * DIM, 1.0),
            v: rng.vec(ROWS * DIM, 1.0),
            scores: vec![0.0; SEQ],
            out: vec![0.0; ROWS * DIM],
        }
    }

    pub fn run<M: AttentionEncoder>(&mut self, _decode: bool) {
        for _ in 0..N_LAYERS {
            for s in 0..BATCH {
                let at = s * SEQ * DIM..(s + 1) * SEQ * DIM;
                M::attention_encoder::<N_HEADS, HEAD_DIM>(
                    &mut self.out[at.clone()],
                    &self.q[at.clone()],
                    &self.k[at.clone()],
                    &self.v[at],
                    &mut self.scores,
                    SEQ,
                );
            }
        }
        black_box(&self.out);
    }

    pub fn check<C: AttentionEncoder, R: AttentionEncoder>(&mut self) -> Result<(), String> {
        let len = SEQ * DIM;
        let mut got = vec![f32::NAN; len];
        let mut want = vec![f32::NAN; len];
        C::attention_encoder::<N_HEADS, HEAD_DIM>(&mut got, &self.q[..len], &self.k[..len], &self.v[..len], &mut self.scores, SEQ);
        R::attention_encoder::<N_HEADS, HEAD_DIM>(&mut want, &self.q[..len], &self.k[..len], &self.v[..len], &mut self.scores, SEQ);
        compare(&format!("attention over {SEQ} tokens"), &got, &want, TOLERANCE)
    }
}

/// The GELU of each layer's MLP. Its input is restored before every call (the kernel works
/// in place), so the timing includes that copy for every candidate alike.
pub struct GeluPass {
    source: Vec<f32>,
    x: Vec<f32>,
}

impl GeluPass {
    pub const PHASES: Phases = (true, false);

    pub fn new() -> GeluPass {
        let source = Rng::new(25).vec(ROWS * HIDDEN_DIM, 4.0);
        GeluPass { x: source.clone(), source }
    }

    pub fn run<M: Gelu>(&mut self, _decode: bool) {
        for _ in 0..N_LAYERS {
            self.x.copy_from_slice(&self.source);
            M::gelu::<HIDDEN_DIM>(&mut self.x, ROWS);
        }
        black_box(&self.x);
    }

    pub fn check<C: Gelu, R: Gelu>(&mut self) -> Result<(), String> {
        let mut got = self.source.clone();
        let mut want = self.source.clone();
        C::gelu::<HIDDEN_DIM>(&mut got, ROWS);
        R::gelu::<HIDDEN_DIM>(&mut want, ROWS);
        compare(&format!("gelu of {ROWS} rows"), &got, &want, TOLERANCE)
    }
}

/// The mean pooling of every sentence.
pub struct MeanPoolingPass {
    x: Vec<f32>,
    out: Vec<f32>,
}

impl MeanPoolingPass {
    pub const PHASES: Phases = (true, false);

    pub fn new() -> MeanPoolingPass {
        MeanPoolingPass { x: Rng::new(26).vec(ROWS * DIM, 2.0), out: vec![0.0; BATCH * DIM] }
    }

    pub fn run<M: MeanPooling>(&mut self, _decode: bool) {
        for s in 0..BATCH {
            M::mean_pool::<DIM>(&mut self.out[s * DIM..], &self.x[s * SEQ * DIM..], SEQ);
        }
        black_box(&self.out);
    }

    pub fn check<C: MeanPooling, R: MeanPooling>(&mut self) -> Result<(), String> {
        let mut got = vec![f32::NAN; DIM];
        let mut want = vec![f32::NAN; DIM];
        C::mean_pool::<DIM>(&mut got, &self.x, SEQ);
        R::mean_pool::<DIM>(&mut want, &self.x, SEQ);
        compare(&format!("mean of {SEQ} rows"), &got, &want, TOLERANCE)
    }
}

/// The normalization of the batch's vectors (restored before every call: it works in place).
pub struct L2NormalizePass {
    source: Vec<f32>,
    x: Vec<f32>,
}

impl L2NormalizePass {
    pub const PHASES: Phases = (true, false);

    pub fn new() -> L2NormalizePass {
        let source = Rng::new(27).vec(BATCH * DIM, 2.0);
        L2NormalizePass { x: source.clone(), source }
    }

    pub fn run<M: L2Normalize>(&mut self, _decode: bool) {
        self.x.copy_from_slice(&self.source);
        M::l2_normalize::<DIM>(&mut self.x, BATCH);
        black_box(&self.x);
    }

    pub fn check<C: L2Normalize, R: L2Normalize>(&mut self) -> Result<(), String> {
        let mut got = self.source.clone();
        let mut want = self.source.clone();
        C::l2_normalize::<DIM>(&mut got, BATCH);
        R::l2_normalize::<DIM>(&mut want, BATCH);
        compare(&format!("l2 normalization of {BATCH} vectors"), &got, &want, TOLERANCE)
    }
}
