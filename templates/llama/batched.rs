//~ The batched half of model.rs, for a workload whose request.max_batch is above 1: the emitter
//~ (emit/llama.rs, `model_rs`) keeps templates/llama/model.rs up to `impl Model`, its free
//~ functions and its slots, and puts these items in place of its `Session`. Its `use` lines join
//~ model.rs's. Lines starting with `//~`, like these, are not generated.
use crate::{MAX_BATCH, STEP_ROWS};

/// Rows of a step whose logits it returns at most: each sequence's last.
#[only_if(not(speculation))]
const LOGIT_ROWS: usize = MAX_BATCH;

/// Rows of a step whose logits it returns at most: each sequence's last, or the rows of its
/// verification (the last picked token and DRAFT_TOKENS drafted ones), within STEP_ROWS.
#[only_if(speculation)]
const LOGIT_ROWS: usize = if MAX_BATCH * (DRAFT_TOKENS + 1) < STEP_ROWS { MAX_BATCH * (DRAFT_TOKENS + 1) } else { STEP_ROWS };

impl Model {
    /// The activation buffers of a step of up to MAX_BATCH sequences, which a server shares
    /// between all of them.
    pub fn batch(&self) -> Batch<'_> {
        Batch::new(self)
    }
}

/// One sequence: its KV cache and its position. A [`Batch`] step runs it, beside others.
pub struct Sequence {
    /// Positions already in the KV cache.
    pos: usize,
    /// One cache per layer.
    kv: Vec<KvCache<MAX_SEQ_LEN, KV_DIM>>,
}

impl Default for Sequence {
    fn default() -> Sequence {
        Sequence::new()
    }
}

impl Sequence {
    /// An empty sequence. Its KV cache is allocated for MAX_SEQ_LEN positions, and its memory
    /// is taken as positions fill it.
    pub fn new() -> Sequence {
        Sequence { pos: 0, kv: (0..NUM_LAYERS).map(|_| KvCache::new()).collect() }
    }

    /// Positions the sequence holds.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Forgets the sequence, keeping its cache's memory, to start a new one.
    pub fn reset(&mut self) {
        self.pos = 0;
    }

    /// Keeps its first `len` positions and forgets the rest: the start that another sequence
    /// shares, whose keys and values depend only on the tokens up to them.
    pub fn truncate(&mut self, len: usize) {
        self.pos = self.pos.min(len);
    }

    /// Holds the first `len` positions of `from`, copied: the start that another sequence
    /// shares, whose keys and values depend only on the tokens up to them. `from` keeps them.
    #[only_if(prefix_cache)]
    pub fn copy_start(&mut self, from: &Sequence, len: usize) {
        let len = len.min(from.pos);
        for (to, from) in self.kv.iter_mut().zip(&from.kv) {
            __slot!(copy_layer);
        }
        self.pos = len;
    }

    /// Whether `tokens` can run at the next positions: not empty, every id in the
    /// vocabulary, and room for all of them in the KV cache.
    pub fn check(&self, tokens: &[u32]) -> Result<(), Error> {
        check_tokens(self.pos, tokens)
    }
}

/// Whether `tokens` can run at positions `start..`: not empty, every id in the vocabulary, and
/// no position past MAX_SEQ_LEN.
pub(crate) fn check_tokens(start: usize, tokens: &[u32]) -> Result<(), Error> {
    if tokens.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    if let Some(&id) = tokens.iter().find(|&&id| id as usize >= VOCAB_SIZE) {
        return Err(Error::TokenOutOfRange { id, vocab_size: VOCAB_SIZE });
    }
    let len = start + tokens.len();
    if len > MAX_SEQ_LEN {
        return Err(Error::SequenceTooLong { len, max: MAX_SEQ_LEN });
    }
    Ok(())
}

/// What one sequence runs in a step: its next tokens, at its next positions.
pub struct Run<'s> {
    pub sequence: &'s mut Sequence,
    pub tokens: &'s [u32],
}

/// The activation buffers of a step: up to MAX_BATCH sequences at once, STEP_ROWS tokens in
/// all. Every sequence's tokens pass through each matrix product together, as rows of one
/// product, and each attends over its own KV cache.
pub struct Batch<'m> {
    model: &'m Model,
    /// The residual stream: [STEP_ROWS, HIDDEN_SIZE]
    x: Buffer,
    /// A sublayer's normalised input, then its output: [STEP_ROWS, HIDDEN_SIZE]
    xb: Buffer,
    /// Queries: [STEP_ROWS, Q_DIM]
    q: Buffer,
    /// New keys: [STEP_ROWS, KV_DIM]
    k: Buffer,
    /// New values: [STEP_ROWS, KV_DIM]
    v: Buffer,
    /// Attention output: [STEP_ROWS, Q_DIM]
    att: Buffer,
    /// MLP gate projection: [STEP_ROWS, INTERMEDIATE_SIZE]
    gate: Buffer,
    /// MLP up projection: [STEP_ROWS, INTERMEDIATE_SIZE]
    up: Buffer,
    /// Attention scores of one query: [MAX_SEQ_LEN]
    scores: Buffer,
    /// Logits of the rows of a step that pick a token: [LOGIT_ROWS, VOCAB_SIZE]
    logits: Buffer,
    /// Sessions of the draft model, at most MAX_BATCH, made as needed, each with the sequence it
    /// drafted for last (its key); the one used last is last.
    #[only_if(draft_model)]
    drafters: Vec<(u64, crate::drafter::Drafter<'m>)>,
    /// The memory of the buffers above, in huge pages where the kernel grants them.
    _scratch: Scratch,
}

impl<'m> Batch<'m> {
    fn new(model: &'m Model) -> Batch<'m> {
        let (scratch, [x, xb, q, k, v, att, gate, up, scores, logits]) = Scratch::buffers([
            Room::new(STEP_ROWS * HIDDEN_SIZE),
            Room::new(STEP_ROWS * HIDDEN_SIZE),
            Room::new(STEP_ROWS * Q_DIM),
            Room::new(STEP_ROWS * KV_DIM),
            Room::new(STEP_ROWS * KV_DIM),
            Room::new(STEP_ROWS * Q_DIM),
            Room::new(STEP_ROWS * INTERMEDIATE_SIZE),
            Room::new(STEP_ROWS * INTERMEDIATE_SIZE),
            Room::new(MAX_SEQ_LEN),
            Room::new(LOGIT_ROWS * VOCAB_SIZE),
        ]);
        Batch { model, x, xb, q, k, v, att, gate, up, scores, logits, #[only_if(draft_model)] drafters: Vec::new(), _scratch: scratch }
    }

    /// The draft model's session for the sequence `key` (a server's request's arrival number):
    /// the one that drafted for it last, wherever its place in the step is now, unless MAX_BATCH
    /// other sequences have drafted since; else a new one, or the one left unused longest. A
    /// session keeps the positions it shares with the sequence it drafts for and runs the rest.
    #[only_if(draft_model)]
    pub(crate) fn drafter(&mut self, key: u64) -> &mut crate::drafter::Drafter<'m> {
        let entry = match self.drafters.iter().position(|d| d.0 == key) {
            Some(at) => self.drafters.remove(at),
            None if self.drafters.len() < MAX_BATCH => (key, crate::drafter::Drafter::new(&self.model.draft)),
            None => (key, self.drafters.remove(0).1),
        };
        self.drafters.push(entry);
        &mut self.drafters.last_mut().expect("pushed above").1
    }

    /// Runs each run's tokens at its sequence's next positions, all in one pass through the
    /// layers, and returns the logits of each run's last token: [runs.len(), VOCAB_SIZE].
    /// A sequence's logits do not depend on what else runs beside it.
    pub fn step(&mut self, runs: &mut [Run<'_>]) -> Result<&[f32], Error> {
        self.check(runs)?;
        self.forward(runs);
        let mut rows = [0; MAX_BATCH];
        let mut end = 0;
        for (row, run) in rows.iter_mut().zip(runs.iter()) {
            end += run.tokens.len();
            *row = end - 1;
        }
        self.classify(&rows[..runs.len()]);
        Ok(&self.logits[..runs.len() * VOCAB_SIZE])
    }

    /// Runs each run's tokens as [`Batch::step`] does, and returns the logits of the last
    /// `picks[i]` tokens of run i, run after run: a verification's rows (its last picked token
    /// and the drafted ones, each row's logits picking the token after it), or a run's last.
    /// [picks.iter().sum(), VOCAB_SIZE].
    #[only_if(speculation)]
    pub fn step_rows(&mut self, runs: &mut [Run<'_>], picks: &[usize]) -> Result<&[f32], Error> {
        self.check(runs)?;
        let wanted: usize = picks.iter().sum();
        let fits = picks.len() == runs.len() && runs.iter().zip(picks).all(|(run, &n)| (1..=run.tokens.len()).contains(&n));
        if !fits || wanted > LOGIT_ROWS {
            return Err(Error::InvalidParameter {
                name: "picks",
                reason: format!("each run picks from 1 to all of its rows, {LOGIT_ROWS} rows in all"),
            });
        }
        self.forward(runs);
        let mut rows = [0; LOGIT_ROWS];
        let (mut end, mut at) = (0, 0);
        for (run, &n) in runs.iter().zip(picks) {
            end += run.tokens.len();
            for (row, r) in rows[at..at + n].iter_mut().zip(end - n..end) {
                *row = r;
            }
            at += n;
        }
        self.classify(&rows[..wanted]);
        Ok(&self.logits[..wanted * VOCAB_SIZE])
    }

    /// Whether `runs` fit one step: 1 to MAX_BATCH of them, STEP_ROWS tokens at most in all,
    /// each run's tokens fitting its sequence.
    pub fn check(&self, runs: &[Run<'_>]) -> Result<(), Error> {
        if runs.is_empty() || runs.len() > MAX_BATCH {
            return Err(Error::InvalidParameter {
                name: "runs",
                reason: format!("a step runs 1 to {MAX_BATCH} sequences, not {}", runs.len()),
            });
        }
        let rows: usize = runs.iter().map(|run| run.tokens.len()).sum();
        if rows > STEP_ROWS {
            return Err(Error::InvalidParameter {
                name: "runs",
                reason: format!("a step runs at most {STEP_ROWS} tokens in all, not {rows}"),
            });
        }
        runs.iter().try_for_each(|run| run.sequence.check(run.tokens))
    }

    /// The decoder layers over every run's tokens (T rows in all, at most STEP_ROWS), each run
    /// at its sequence's next positions. Leaves the last layer's residual stream in `x`.
    fn forward(&mut self, runs: &mut [Run<'_>]) {
        let Batch { model, x, xb, q, k, v, att, gate, up, scores, .. } = self;
        let w = &model.weights;
        let t: usize = runs.iter().map(|run| run.tokens.len()).sum();
        let x = &mut x[..t * HIDDEN_SIZE];
        let xb = &mut xb[..t * HIDDEN_SIZE];
        let q = &mut q[..t * Q_DIM];
        let k = &mut k[..t * KV_DIM];
        let v = &mut v[..t * KV_DIM];
        let att = &mut att[..t * Q_DIM];
        let gate = &mut gate[..t * INTERMEDIATE_SIZE];
        let up = &mut up[..t * INTERMEDIATE_SIZE];
        // x = embed_tokens[tokens of every run]: [T, HIDDEN_SIZE]
        for (row, &token) in runs.iter().flat_map(|run| run.tokens).enumerate() {
            let token = token as usize;
            __slot!(embed_row);
        }
        for (l, layer) in w.layers.iter().enumerate() {
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
            // each run's rows, at its sequence's positions start..start + T (T its own rows here),
            // against its sequence's cache of this layer
            let mut row = 0;
            for run in runs.iter_mut() {
                let (start, t) = (run.sequence.pos, run.tokens.len());
                let q = &mut q[row * Q_DIM..(row + t) * Q_DIM];
                let k = &mut k[row * KV_DIM..(row + t) * KV_DIM];
                let v = &mut v[row * KV_DIM..(row + t) * KV_DIM];
                let att = &mut att[row * Q_DIM..(row + t) * Q_DIM];
                let cache = &mut run.sequence.kv[l];
                // rotate q and k by their positions start..start + T
                rope::<NUM_HEADS, HEAD_DIM>(q, &model.rope_cos, &model.rope_sin, start, t);
                rope::<NUM_KV_HEADS, HEAD_DIM>(k, &model.rope_cos, &model.rope_sin, start, t);
                __slot!(c_store);
                cache.store(start, k, v);
                __slot!(c_att);
                __slot!(attention);
                row += t;
            }
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
        for run in runs.iter_mut() {
            run.sequence.pos += run.tokens.len();
        }
    }

    /// The final norm and the classifier for rows `rows` of the last step's `x` (N of them, at
    /// most LOGIT_ROWS): fills `logits` with one row each.
    fn classify(&mut self, rows: &[usize]) {
        let Batch { model, x, xb, logits, .. } = self;
        let w = &model.weights;
        let n = rows.len();
        let xb = &mut xb[..n * HIDDEN_SIZE];
        let logits = &mut logits[..n * VOCAB_SIZE];
        // xb = rmsnorm(x[rows]) · norm: [N, HIDDEN_SIZE]
        for (i, &row) in rows.iter().enumerate() {
            let (out, x) = (&mut xb[i * HIDDEN_SIZE..(i + 1) * HIDDEN_SIZE], &x[row * HIDDEN_SIZE..(row + 1) * HIDDEN_SIZE]);
            rmsnorm::<HIDDEN_SIZE>(out, x, &w.norm, RMS_NORM_EPS, 1);
        }
        __slot!(c_classifier);
        __slot!(mm_classifier);
    }
}

/// One sequence alone, as a crate without batching runs it: a [`Sequence`] with a [`Batch`] of
/// its own.
pub struct Session<'m> {
    batch: Batch<'m>,
    sequence: Sequence,
    /// The tokens whose keys and values the sequence holds, in order (for `generate_anew`).
    #[only_if(prefix_cache)]
    held: Vec<u32>,
}

impl<'m> Session<'m> {
    fn new(model: &'m Model) -> Session<'m> {
        Session {
            batch: Batch::new(model),
            sequence: Sequence::new(),
            #[only_if(prefix_cache)]
            held: Vec::with_capacity(MAX_SEQ_LEN),
        }
    }

    /// The tokens whose keys and values the session holds, in order.
    #[only_if(prefix_cache)]
    pub fn held(&self) -> &[u32] {
        &self.held
    }

    /// Positions the session holds.
    pub fn position(&self) -> usize {
        self.sequence.position()
    }

    /// Forgets the sequence, keeping the buffers, to start a new one.
    pub fn reset(&mut self) {
        self.sequence.reset();
        #[only_if(prefix_cache)]
        self.held.clear();
    }

    /// Runs `tokens` at the next positions and returns the logits of the last one:
    /// [VOCAB_SIZE].
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<&[f32], Error> {
        self.check(tokens)?;
        // the layers run PREFILL_CHUNK positions at a time; only the last position needs logits
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            self.batch.forward(&mut [Run { sequence: &mut self.sequence, tokens: chunk }]);
        }
        #[only_if(prefix_cache)]
        self.held.extend_from_slice(tokens);
        self.batch.classify(&[(tokens.len() - 1) % PREFILL_CHUNK]);
        Ok(&self.batch.logits[..VOCAB_SIZE])
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
            self.batch.forward(&mut [Run { sequence: &mut self.sequence, tokens: chunk }]);
            #[only_if(prefix_cache)]
            self.held.extend_from_slice(chunk);
            for row in 0..chunk.len() {
                self.batch.classify(&[row]);
                all.extend_from_slice(&self.batch.logits[..VOCAB_SIZE]);
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
        let picks = [tokens.len()];
        let logits = self.batch.step_rows(&mut [Run { sequence: &mut self.sequence, tokens }], &picks)?;
        #[only_if(prefix_cache)]
        self.held.extend_from_slice(tokens);
        Ok(logits)
    }

    /// The draft model's session that drafts for this one.
    #[only_if(draft_model)]
    pub(crate) fn drafter(&mut self) -> &mut crate::drafter::Drafter<'m> {
        self.batch.drafter(0)
    }

    /// Forgets every position from `pos` on: the next token runs at `pos`. The keys and values
    /// of a position depend only on the tokens up to it, so the positions kept are those of
    /// their tokens run alone. A `pos` at or past the session's position changes nothing.
    #[only_if(rewind)]
    pub fn rewind(&mut self, pos: usize) {
        self.sequence.truncate(pos);
        #[only_if(prefix_cache)]
        self.held.truncate(self.sequence.position());
    }

    /// Whether `tokens` can run at the next positions: not empty, every id in the
    /// vocabulary, and room for all of them in the KV cache.
    pub fn check(&self, tokens: &[u32]) -> Result<(), Error> {
        self.sequence.check(tokens)
    }
}
