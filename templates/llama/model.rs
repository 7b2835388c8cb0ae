//! The forward pass of `__workload_name`: a LLaMA decoder of __n_layers layers, written out with every
//! shape a constant and every kernel chosen.
//!
//! In the shape comments, T is the number of positions run at once: 1 for a decode step,
//! up to PREFILL_CHUNK for prefill.

//~ The emitter fills this file for each LLaMA crate (emit/llama.rs, `model_rs`): each
//~ `__slot!(name)` is what the plan's choices make of one step. Everything else is the generated
//~ model.rs as it is. Lines starting with `//~`, like these, are not generated.
use std::path::Path;
use crate::kernels::attention_decode::attention_decode;
__slot!(prefill_use);
use crate::kernels::kv_cache::KvCache;
use crate::kernels::matmul::matmul;
use crate::kernels::rmsnorm::rmsnorm;
__slot!(rope_use);
use crate::kernels::swiglu::swiglu;
use crate::scratch::{Buffer, Room, Scratch};
use crate::weights::Weights;
use crate::{
    Error, HIDDEN_SIZE, HEAD_DIM, INTERMEDIATE_SIZE, KV_DIM, MAX_SEQ_LEN, NUM_HEADS, NUM_KV_HEADS, NUM_LAYERS, PREFILL_CHUNK, Q_DIM,
    RMS_NORM_EPS, ROPE_THETA, VOCAB_SIZE,
};
__slot!(window_use);
#[only_if(speculation)]
use crate::DRAFT_TOKENS;

/// A loaded model: the weights and the rotary tables. It never changes after loading,
/// so share it between threads and give each sequence its own [`Session`].
pub struct Model {
    weights: Weights,
    /// cos of the rotary angles: [MAX_SEQ_LEN, HEAD_DIM / 2]
    rope_cos: Vec<f32>,
    /// sin of the rotary angles: [MAX_SEQ_LEN, HEAD_DIM / 2]
    rope_sin: Vec<f32>,
    /// The draft model (the crate in draft/), which drafts the tokens a step verifies.
    #[only_if(draft_model)]
    pub(crate) draft: draft_model::Model,
}

impl Model {
    /// Checks the CPU, then maps `dir/model.safetensors` and checks every tensor's
    /// name, dtype and shape.
    #[only_if(not(draft_model))]
    pub fn load(dir: impl AsRef<Path>) -> Result<Model, Error> {
        crate::cpu::check()?;
        let weights = Weights::load(&dir.as_ref().join("model.safetensors"))?;
        __slot!(rope_tables);
        Ok(Model { weights, rope_cos, rope_sin })
    }

    /// Checks the CPU, then maps `dir/model.safetensors` and checks every tensor's
    /// name, dtype and shape; then loads the draft model: from `dir/draft/` where the
    /// directory has one (whose tokenizer.json must be `dir`'s), else from `dir` itself (the
    /// target's own checkpoint, which the draft model holds as its workload says).
    #[only_if(draft_model)]
    pub fn load(dir: impl AsRef<Path>) -> Result<Model, Error> {
        crate::cpu::check()?;
        let draft = crate::drafter::load(dir.as_ref())?;
        let weights = Weights::load(&dir.as_ref().join("model.safetensors"))?;
        __slot!(rope_tables);
        Ok(Model { weights, rope_cos, rope_sin, draft })
    }

    /// Writes `out`, a model directory for this crate made from `dir`: its
    /// model.safetensors holds every tensor the model reads as it holds them in memory
    /// (matrices in the workload's dtype: an int8 crate's quantized, with their scales),
    /// so that loading `out` maps them rather than converting them again; the JSON
    /// files of `dir` (config, tokenizer) are copied. Returns the warnings of reading
    /// `dir`.
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

    /// A new sequence, with an empty KV cache.
    pub fn session(&self) -> Session<'_> {
        Session::new(self)
    }
}

/// One sequence: its KV cache, its position and the activation buffers.
pub struct Session<'m> {
    model: &'m Model,
    /// Positions already in the KV cache.
    pos: usize,
    /// One cache per layer.
    kv: Vec<KvCache<MAX_SEQ_LEN, KV_DIM>>,
    /// The residual stream: [PREFILL_CHUNK, HIDDEN_SIZE]
    x: Buffer,
    /// A sublayer's normalised input, then its output: [PREFILL_CHUNK, HIDDEN_SIZE]
    xb: Buffer,
    /// Queries: [PREFILL_CHUNK, Q_DIM]
    q: Buffer,
    /// New keys: [PREFILL_CHUNK, KV_DIM]
    k: Buffer,
    /// New values: [PREFILL_CHUNK, KV_DIM]
    v: Buffer,
    /// Attention output: [PREFILL_CHUNK, Q_DIM]
    att: Buffer,
    /// MLP gate projection: [PREFILL_CHUNK, INTERMEDIATE_SIZE]
    gate: Buffer,
    /// MLP up projection: [PREFILL_CHUNK, INTERMEDIATE_SIZE]
    up: Buffer,
    /// Attention scores of one query: [MAX_SEQ_LEN]
    scores: Buffer,
    /// Logits of one position: [VOCAB_SIZE]
    logits: Buffer,
    /// Logits of each row a speculative step verifies: [DRAFT_TOKENS + 1, VOCAB_SIZE]
    #[only_if(speculation)]
    verified: Vec<f32>,
    /// The tokens whose keys and values the cache holds, in order (for `generate_anew`).
    #[only_if(prefix_cache)]
    held: Vec<u32>,
    /// A session of the draft model, which drafts after this one's tokens.
    #[only_if(draft_model)]
    drafter: crate::drafter::Drafter<'m>,
    /// The memory of the buffers above, in huge pages where the kernel grants them.
    _scratch: Scratch,
}

impl<'m> Session<'m> {
    fn new(model: &'m Model) -> Session<'m> {
        let kv: Vec<KvCache<MAX_SEQ_LEN, KV_DIM>> = (0..NUM_LAYERS).map(|_| KvCache::new()).collect();
        let (scratch, [x, xb, q, k, v, att, gate, up, scores, logits]) = Scratch::buffers([
            Room::new(PREFILL_CHUNK * HIDDEN_SIZE),
            Room::new(PREFILL_CHUNK * HIDDEN_SIZE),
            Room::new(PREFILL_CHUNK * Q_DIM),
            __slot!(new_keys),
            __slot!(new_values),
            Room::new(PREFILL_CHUNK * Q_DIM),
            Room::new(PREFILL_CHUNK * INTERMEDIATE_SIZE),
            Room::new(PREFILL_CHUNK * INTERMEDIATE_SIZE),
            Room::new(MAX_SEQ_LEN),
            Room::new(VOCAB_SIZE),
        ]);
        Session {
            model,
            pos: 0,
            kv,
            x,
            xb,
            q,
            k,
            v,
            att,
            gate,
            up,
            scores,
            logits,
            #[only_if(speculation)]
            verified: vec![0.0; (DRAFT_TOKENS + 1) * VOCAB_SIZE],
            #[only_if(prefix_cache)]
            held: Vec::with_capacity(MAX_SEQ_LEN),
            #[only_if(draft_model)]
            drafter: crate::drafter::Drafter::new(&model.draft),
            _scratch: scratch,
        }
    }

    /// The draft model's session that drafts for this one.
    #[only_if(draft_model)]
    pub(crate) fn drafter(&mut self) -> &mut crate::drafter::Drafter<'m> {
        &mut self.drafter
    }

    /// Positions the session holds.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Forgets the sequence, keeping the buffers, to start a new one.
    pub fn reset(&mut self) {
        self.pos = 0;
        #[only_if(prefix_cache)]
        self.held.clear();
    }

    /// The tokens whose keys and values the session holds, in order.
    #[only_if(prefix_cache)]
    pub fn held(&self) -> &[u32] {
        &self.held
    }

    /// Runs `tokens` at the next positions and returns the logits of the last one:
    /// [VOCAB_SIZE].
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<&[f32], Error> {
        self.check(tokens)?;
        // the layers run PREFILL_CHUNK positions at a time; only the last position needs logits
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            self.forward(chunk);
        }
        self.classify((tokens.len() - 1) % PREFILL_CHUNK);
        Ok(&self.logits)
    }

    /// Runs one token at the next position and returns its logits: [VOCAB_SIZE].
    pub fn decode(&mut self, token: u32) -> Result<&[f32], Error> {
        self.prefill(std::slice::from_ref(&token))
    }

    /// Runs `tokens` at the next positions and returns the logits of every one of
    /// them: [tokens.len(), VOCAB_SIZE].
    pub fn logits_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>, Error> {
        self.check(tokens)?;
        let mut all = Vec::with_capacity(tokens.len() * VOCAB_SIZE);
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            self.forward(chunk);
            for row in 0..chunk.len() {
                self.classify(row);
                all.extend_from_slice(&self.logits);
            }
        }
        Ok(all)
    }

    /// Runs `tokens` at the next positions, the last picked token and then the drafted ones
    /// (at most DRAFT_TOKENS + 1 of them), and returns the logits of every one:
    /// [tokens.len(), VOCAB_SIZE]. Row i's logits pick the token after `tokens[i]`; the
    /// positions of drafted tokens that are not kept are given back with [`Session::rewind`].
    #[only_if(speculation)]
    pub fn verify(&mut self, tokens: &[u32]) -> Result<&[f32], Error> {
        self.check(tokens)?;
        if tokens.len() > DRAFT_TOKENS + 1 {
            return Err(Error::InvalidParameter {
                name: "tokens",
                reason: format!("{} rows; a verification runs at most DRAFT_TOKENS + 1 = {}", tokens.len(), DRAFT_TOKENS + 1),
            });
        }
        let t = tokens.len();
        self.forward(tokens);
        let Session { model, x, xb, verified, .. } = self;
        let w = &model.weights;
        let xb = &mut xb[..t * HIDDEN_SIZE];
        let logits = &mut verified[..t * VOCAB_SIZE];
        // xb = rmsnorm(x) · norm: [T, HIDDEN_SIZE]
        rmsnorm::<HIDDEN_SIZE>(xb, &x[..t * HIDDEN_SIZE], &w.norm, RMS_NORM_EPS, t);
        __slot!(c_classifier_rows);
        __slot!(mm_classifier_rows);
        Ok(logits)
    }

    /// Forgets every position from `pos` on: the next token runs at `pos`. The keys and values
    /// of a position depend only on the tokens up to it, so the positions kept are those of
    /// their tokens run alone. A `pos` at or past the session's position changes nothing.
    #[only_if(rewind)]
    pub fn rewind(&mut self, pos: usize) {
        self.pos = self.pos.min(pos);
        #[only_if(prefix_cache)]
        self.held.truncate(self.pos);
    }

    /// Whether `tokens` can run at the next positions: not empty, every id in the
    /// vocabulary, and room for all of them in the KV cache.
    pub fn check(&self, tokens: &[u32]) -> Result<(), Error> {
        if tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= VOCAB_SIZE) {
            return Err(Error::TokenOutOfRange { id, vocab_size: VOCAB_SIZE });
        }
        let len = self.pos + tokens.len();
        if len > MAX_SEQ_LEN {
            return Err(Error::SequenceTooLong { len, max: MAX_SEQ_LEN });
        }
        Ok(())
    }

    /// The decoder layers over `tokens` (T ≤ PREFILL_CHUNK) at positions
    /// start..start + T. Leaves the last layer's residual stream in `x`.
    fn forward(&mut self, tokens: &[u32]) {
        let Session { model, pos, kv, x, xb, q, k, v, att, gate, up, scores, .. } = self;
        let w = &model.weights;
        let (t, start) = (tokens.len(), *pos);
        let x = &mut x[..t * HIDDEN_SIZE];
        let xb = &mut xb[..t * HIDDEN_SIZE];
        let q = &mut q[..t * Q_DIM];
        let k = &mut k[..t * KV_DIM];
        let v = &mut v[..t * KV_DIM];
        let att = &mut att[..t * Q_DIM];
        let gate = &mut gate[..t * INTERMEDIATE_SIZE];
        let up = &mut up[..t * INTERMEDIATE_SIZE];
        // x = embed_tokens[tokens]: [T, HIDDEN_SIZE]
        for (row, &token) in tokens.iter().enumerate() {
            let token = token as usize;
            __slot!(embed_row);
        }
        for (layer, cache) in w.layers.iter().zip(kv.iter_mut()) {
            // xb = rmsnorm(x) · input_layernorm: [T, HIDDEN_SIZE]
            rmsnorm::<HIDDEN_SIZE>(xb, x, &layer.input_layernorm, RMS_NORM_EPS, t);
            __slot!(c_q);
            __slot!(mm_q);
            __slot!(q_bias);
            __slot!(c_kv);
            __slot!(mm_k);
            __slot!(k_bias);
            __slot!(mm_v);
            __slot!(v_bias);
            // rotate q and k by their positions start..start + T
            rope::<NUM_HEADS, HEAD_DIM>(q, &model.rope_cos, &model.rope_sin, start, t);
            rope::<NUM_KV_HEADS, HEAD_DIM>(k, &model.rope_cos, &model.rope_sin, start, t);
            __slot!(c_store);
            cache.store(start, k, v);
            __slot!(c_att);
            __slot!(attention);
            // xb = att · o_projᵀ: [T, HIDDEN_SIZE]
            __slot!(mm_o);
            // x = x + xb (residual)
            add_assign(x, xb);
            // xb = rmsnorm(x) · post_attention_layernorm: [T, HIDDEN_SIZE]
            rmsnorm::<HIDDEN_SIZE>(xb, x, &layer.post_attention_layernorm, RMS_NORM_EPS, t);
            // gate = xb · gate_projᵀ, up = xb · up_projᵀ: [T, INTERMEDIATE_SIZE]
            __slot!(mm_gate);
            __slot!(mm_up);
            // gate = silu(gate) · up: [T, INTERMEDIATE_SIZE]
            swiglu::<INTERMEDIATE_SIZE>(gate, up, t);
            // xb = gate · down_projᵀ: [T, HIDDEN_SIZE]
            __slot!(mm_down);
            // x = x + xb (residual)
            add_assign(x, xb);
        }
        *pos += t;
        #[only_if(prefix_cache)]
        self.held.extend_from_slice(tokens);
    }

    /// The final norm and the classifier for row `row` of the last chunk: fills `logits`.
    fn classify(&mut self, row: usize) {
        let Session { model, x, xb, logits, .. } = self;
        let w = &model.weights;
        let xb = &mut xb[..HIDDEN_SIZE];
        // xb = rmsnorm(x[row]) · norm: [1, HIDDEN_SIZE]
        rmsnorm::<HIDDEN_SIZE>(xb, &x[row * HIDDEN_SIZE..(row + 1) * HIDDEN_SIZE], &w.norm, RMS_NORM_EPS, 1);
        __slot!(c_classifier);
        __slot!(mm_classifier);
    }
}

/// x += y, element by element.
fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += *b;
    }
}

__slot!(add_bias_fn);
__slot!(inv_freq_fn);
__slot!(widen_fn);
