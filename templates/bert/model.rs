//! The forward pass of `__workload_name`: a BERT encoder of __n_layers layers, written out with every shape
//! a constant and every kernel chosen.
//!
//! A batch of B sentences is padded to its longest, L tokens: the matrix products run over
//! all B · L rows at once, and attention runs sentence by sentence over each one's own
//! tokens, so padding is never attended to and never pooled.

//~ The emitter fills this file for each BERT crate (emit/bert.rs, `model_rs`): each
//~ `__slot!(name)` is what the plan's choices make of one step. Everything else is the
//~ generated model.rs as it is. Lines starting with `//~`, like these, are not generated.
use std::path::Path;
use crate::kernels::attention_encoder::attention_encoder;
use crate::kernels::embedding::embed;
use crate::kernels::gelu::gelu;
__slot!(normalize_use);
use crate::kernels::layernorm::layernorm;
use crate::kernels::matmul::matmul;
__slot!(pooling_use);
use crate::weights::Weights;
use crate::{
    Error, HIDDEN_SIZE, HEAD_DIM, INTERMEDIATE_SIZE, LAYER_NORM_EPS, MAX_BATCH, MAX_SEQ_LEN, NUM_HEADS, VOCAB_SIZE,
};

/// Token types of a single-sentence input: all 0.
const SEGMENT_A: [u32; MAX_SEQ_LEN] = [0; MAX_SEQ_LEN];

/// A loaded model. It never changes after loading, so share it between threads and
/// give each thread its own [`Encoder`].
pub struct Model {
    weights: Weights,
}

impl Model {
    /// Checks the CPU, then maps `dir/model.safetensors` and checks every tensor's
    /// name, dtype and shape.
    pub fn load(dir: impl AsRef<Path>) -> Result<Model, Error> {
        crate::cpu::check()?;
        let weights = Weights::load(&dir.as_ref().join("model.safetensors"))?;
        Ok(Model { weights })
    }

    /// Writes `out`, a model directory for this crate made from `dir`: its
    /// model.safetensors holds every tensor the model reads as it holds them in memory
    /// (the linear layers' matrices in the workload's dtype: an int8 crate's quantized,
    /// with their scales), so that loading `out` maps them rather than converting them
    /// again; the JSON files of `dir` (config, tokenizer) are copied. Returns the
    /// warnings of reading `dir`.
    pub fn save_model(dir: impl AsRef<Path>, out: impl AsRef<Path>) -> Result<Vec<String>, Error> {
        crate::cpu::check()?;
        crate::tensor_file::save_model(dir.as_ref(), out.as_ref(), |from, to| {
            Ok(Weights::save(from, to)?.warnings().to_vec())
        })
    }

    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// What loading noticed but did not refuse (e.g. tensors this model does not use).
    pub fn warnings(&self) -> &[String] {
        self.weights.warnings()
    }

    /// Activation buffers for batches of up to MAX_BATCH sentences.
    pub fn encoder(&self) -> Encoder<'_> {
        Encoder::new(self)
    }
}

/// The activation buffers of one batch: up to MAX_BATCH sentences of MAX_SEQ_LEN tokens.
pub struct Encoder<'m> {
    model: &'m Model,
    /// The hidden states: [MAX_BATCH · MAX_SEQ_LEN, HIDDEN_SIZE]
    x: Vec<f32>,
    /// A sublayer's output before the residual: [MAX_BATCH · MAX_SEQ_LEN, HIDDEN_SIZE]
    xb: Vec<f32>,
    /// Queries, keys, values and attention output: [MAX_BATCH · MAX_SEQ_LEN, HIDDEN_SIZE] each
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    /// The MLP's intermediate layer: [MAX_BATCH · MAX_SEQ_LEN, INTERMEDIATE_SIZE]
    mlp: Vec<f32>,
    /// Attention scores of one query: [MAX_SEQ_LEN]
    scores: Vec<f32>,
}

impl<'m> Encoder<'m> {
    fn new(model: &'m Model) -> Encoder<'m> {
        let rows = MAX_BATCH * MAX_SEQ_LEN;
        Encoder {
            model,
            x: vec![0.0; rows * HIDDEN_SIZE],
            xb: vec![0.0; rows * HIDDEN_SIZE],
            q: vec![0.0; rows * HIDDEN_SIZE],
            k: vec![0.0; rows * HIDDEN_SIZE],
            v: vec![0.0; rows * HIDDEN_SIZE],
            att: vec![0.0; rows * HIDDEN_SIZE],
            mlp: vec![0.0; rows * INTERMEDIATE_SIZE],
            scores: vec![0.0; MAX_SEQ_LEN],
        }
    }

    /// The last layer's state of every token of every sentence: [len, HIDDEN_SIZE] each, flat.
    pub fn hidden_states<S: AsRef<[u32]>>(&mut self, batch: &[S]) -> Result<Vec<Vec<f32>>, Error> {
        let batch: Vec<&[u32]> = batch.iter().map(AsRef::as_ref).collect();
        check(&batch)?;
        let mut states = Vec::with_capacity(batch.len());
        for part in batch.chunks(MAX_BATCH) {
            let longest = self.forward(part);
            for (s, ids) in part.iter().enumerate() {
                states.push(self.x[s * longest * HIDDEN_SIZE..(s * longest + ids.len()) * HIDDEN_SIZE].to_vec());
            }
        }
        Ok(states)
    }

    __slot!(embed_fn);

    /// Runs the layers over up to MAX_BATCH checked sentences, padded to the longest;
    /// returns its length L. Sentence s's states are rows s·L..s·L + len of `x`.
    fn forward(&mut self, batch: &[&[u32]]) -> usize {
        let Encoder { model, x, xb, q, k, v, att, mlp, scores } = self;
        let w = &model.weights;
        let longest = batch.iter().map(|ids| ids.len()).max().unwrap_or(0);
        let rows = batch.len() * longest;
        let x = &mut x[..rows * HIDDEN_SIZE];
        let xb = &mut xb[..rows * HIDDEN_SIZE];
        let q = &mut q[..rows * HIDDEN_SIZE];
        let k = &mut k[..rows * HIDDEN_SIZE];
        let v = &mut v[..rows * HIDDEN_SIZE];
        let att = &mut att[..rows * HIDDEN_SIZE];
        let mlp = &mut mlp[..rows * INTERMEDIATE_SIZE];
        let sentence = |s: usize| s * longest * HIDDEN_SIZE..(s + 1) * longest * HIDDEN_SIZE;
        // xb[s] = word_embeddings[ids] + token_type_embeddings[0] + position_embeddings[0..len]: [L, HIDDEN_SIZE] per sentence, padding rows zero
        xb.fill(0.0);
        for (s, ids) in batch.iter().enumerate() {
            embed::<HIDDEN_SIZE>(
                &mut xb[sentence(s)],
                ids,
                &SEGMENT_A[..ids.len()],
                &w.word_embeddings,
                &w.position_embeddings,
                &w.token_type_embeddings,
            );
        }
        // x = layernorm(xb) · embeddings.LayerNorm: [B·L, HIDDEN_SIZE]
        layernorm::<HIDDEN_SIZE>(x, xb, &w.embeddings_norm.weight, &w.embeddings_norm.bias, LAYER_NORM_EPS, rows);
        for layer in &w.layers {
            // q, k, v = x · {query, key, value}ᵀ + bias: [B·L, HIDDEN_SIZE]
            __slot!(mm_q);
            add_bias(q, &layer.query.bias);
            __slot!(mm_k);
            add_bias(k, &layer.key.bias);
            __slot!(mm_v);
            add_bias(v, &layer.value.bias);
            // att[s] = softmax(q[s] · k[s]ᵀ / √HEAD_DIM) · v[s], over sentence s's own len tokens: [len, HIDDEN_SIZE]
            att.fill(0.0);
            for (s, ids) in batch.iter().enumerate() {
                let at = sentence(s);
                attention_encoder::<NUM_HEADS, HEAD_DIM>(
                    &mut att[at.clone()],
                    &q[at.clone()],
                    &k[at.clone()],
                    &v[at],
                    scores,
                    ids.len(),
                );
            }
            // xb = att · attention.output.denseᵀ + bias: [B·L, HIDDEN_SIZE]
            __slot!(mm_o);
            add_bias(xb, &layer.attention_output.bias);
            // x = layernorm(x + xb) · attention.output.LayerNorm: [B·L, HIDDEN_SIZE]
            add_assign(xb, x);
            layernorm::<HIDDEN_SIZE>(x, xb, &layer.attention_norm.weight, &layer.attention_norm.bias, LAYER_NORM_EPS, rows);
            // mlp = gelu(x · intermediate.denseᵀ + bias): [B·L, INTERMEDIATE_SIZE]
            __slot!(mm_mlp);
            add_bias(mlp, &layer.intermediate.bias);
            gelu::<INTERMEDIATE_SIZE>(mlp, rows);
            // xb = mlp · output.denseᵀ + bias: [B·L, HIDDEN_SIZE]
            __slot!(mm_down);
            add_bias(xb, &layer.output.bias);
            // x = layernorm(x + xb) · output.LayerNorm: [B·L, HIDDEN_SIZE]
            add_assign(xb, x);
            layernorm::<HIDDEN_SIZE>(x, xb, &layer.output_norm.weight, &layer.output_norm.bias, LAYER_NORM_EPS, rows);
        }
        longest
    }
}

__slot!(normalize_fn);

/// Every sentence must have tokens, fit MAX_SEQ_LEN and use ids of the vocabulary.
fn check(batch: &[&[u32]]) -> Result<(), Error> {
    for (s, ids) in batch.iter().enumerate() {
        if ids.is_empty() {
            return Err(Error::InvalidParameter {
                name: "input",
                reason: format!("sentence {s} has no tokens (a tokenizer gives at least [CLS] and [SEP])"),
            });
        }
        if ids.len() > MAX_SEQ_LEN {
            return Err(Error::SequenceTooLong { len: ids.len(), max: MAX_SEQ_LEN });
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= VOCAB_SIZE) {
            return Err(Error::TokenOutOfRange { id, vocab_size: VOCAB_SIZE });
        }
    }
    Ok(())
}

/// Adds `bias` to every row of `x`.
fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (a, b) in row.iter_mut().zip(bias) {
            *a += *b;
        }
    }
}

/// x += y, element by element.
fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += *b;
    }
}
