//! The forward pass of `__workload_name` on a CUDA GPU: a LLaMA decoder of __n_layers layers,
//! written out with every shape a constant and every kernel chosen. Each step launches a kernel
//! on the GPU's one stream; only a token's logits come back to the host.
//!
//! In the shape comments, T is the number of positions run at once: 1 for a decode step,
//! up to PREFILL_CHUNK for prefill.

//~ The emitter fills this file for each CUDA LLaMA crate (emit/cuda.rs, `model_rs`). Lines
//~ starting with `//~`, like these, are not generated.
use std::path::Path;

use cudarc::driver::{LaunchConfig, PushKernelArg};

use crate::gpu::{CudaSlice, Gpu, GpuError};
use crate::kernels::attention_decode::attention_decode;
use crate::kernels::attention_prefill::attention_prefill;
use crate::kernels::kv_cache::kv_store;
use crate::kernels::matmul::matmul;
use crate::kernels::rmsnorm::rmsnorm;
__slot!(rope_use);
use crate::kernels::sampler::sample;
use crate::kernels::swiglu::swiglu;
use crate::weights::Weights;
use crate::{
    Error, HIDDEN_SIZE, HEAD_DIM, INTERMEDIATE_SIZE, KV_DIM, Kv, MAX_SEQ_LEN, NUM_HEADS, NUM_LAYERS, PREFILL_CHUNK, Q_DIM, ROPE_THETA,
    VOCAB_SIZE, Weight,
};

/// A loaded model: the GPU with the crate's kernels, the weights and the rotary tables on it.
/// Give each sequence its own [`Session`].
pub struct Model {
    gpu: Gpu,
    weights: Weights,
    /// cos of the rotary angles: [MAX_SEQ_LEN, HEAD_DIM / 2]
    rope_cos: CudaSlice<f32>,
    /// sin of the rotary angles: [MAX_SEQ_LEN, HEAD_DIM / 2]
    rope_sin: CudaSlice<f32>,
}

impl Model {
    /// Opens the GPU (checking its architecture) and compiles the kernels for it, then reads
    /// `dir/model.safetensors`, checks every tensor's name, dtype and shape, and uploads it.
    pub fn load(dir: impl AsRef<Path>) -> Result<Model, Error> {
        let gpu = Gpu::open()?;
        let weights = Weights::load(&gpu, &dir.as_ref().join("model.safetensors"))?;
        __slot!(rope_tables);
        let (rope_cos, rope_sin) = (gpu.upload(&rope_cos)?, gpu.upload(&rope_sin)?);
        Ok(Model { gpu, weights, rope_cos, rope_sin })
    }

    /// Writes `out`, a model directory made from `dir`: one model.safetensors of f32 tensors
    /// (a sharded or half-precision checkpoint read once), and the JSON files of `dir`. Needs
    /// no GPU. Returns the warnings of reading `dir`.
    pub fn save_model(dir: impl AsRef<Path>, out: impl AsRef<Path>) -> Result<Vec<String>, Error> {
        crate::tensor_file::save_model(dir.as_ref(), out.as_ref(), Weights::save)
    }

    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// What loading noticed but did not refuse (e.g. tensors this model does not use).
    pub fn warnings(&self) -> &[String] {
        self.weights.warnings()
    }

    /// A new sequence, with an empty KV cache (on the GPU from its first step).
    pub fn session(&self) -> Session<'_> {
        Session { model: self, pos: 0, buffers: None, logits: vec![0.0; VOCAB_SIZE] }
    }
}

/// One sequence: its position, its KV cache and activation buffers on the GPU, and the logits
/// of its last step on the host.
pub struct Session<'m> {
    model: &'m Model,
    /// Positions already in the KV cache.
    pos: usize,
    /// Allocated on the GPU at the first step, so that making a session cannot fail.
    buffers: Option<Buffers>,
    /// Logits of one position, copied back from the GPU: [VOCAB_SIZE]
    logits: Vec<f32>,
}

/// A session's memory on the GPU.
struct Buffers {
    /// Keys of each layer: NUM_LAYERS × [MAX_SEQ_LEN, KV_DIM]
    keys: Vec<CudaSlice<Kv>>,
    /// Values of each layer: NUM_LAYERS × [MAX_SEQ_LEN, KV_DIM]
    values: Vec<CudaSlice<Kv>>,
    /// The token ids of a chunk: [PREFILL_CHUNK]
    ids: CudaSlice<u32>,
    /// The residual stream: [PREFILL_CHUNK, HIDDEN_SIZE]
    x: CudaSlice<f32>,
    /// A sublayer's normalised input, then its output: [PREFILL_CHUNK, HIDDEN_SIZE]
    xb: CudaSlice<f32>,
    /// Queries: [PREFILL_CHUNK, Q_DIM]
    q: CudaSlice<f32>,
    /// New keys: [PREFILL_CHUNK, KV_DIM]
    k: CudaSlice<f32>,
    /// New values: [PREFILL_CHUNK, KV_DIM]
    v: CudaSlice<f32>,
    /// Attention output: [PREFILL_CHUNK, Q_DIM]
    att: CudaSlice<f32>,
    /// MLP gate projection: [PREFILL_CHUNK, INTERMEDIATE_SIZE]
    gate: CudaSlice<f32>,
    /// MLP up projection: [PREFILL_CHUNK, INTERMEDIATE_SIZE]
    up: CudaSlice<f32>,
    /// The residual stream of the row to classify: [1, HIDDEN_SIZE]
    last: CudaSlice<f32>,
    /// Its final norm: [1, HIDDEN_SIZE]
    normed: CudaSlice<f32>,
    /// Its logits: [VOCAB_SIZE]
    logits: CudaSlice<f32>,
    /// The token a greedy pick chose: [1]
    picked: CudaSlice<u32>,
    /// Decode attention's own: [NUM_HEADS, MAX_SEQ_LEN + HEAD_DIM + 2]
    scratch: CudaSlice<f32>,
}

impl Buffers {
    fn new(gpu: &Gpu) -> Result<Buffers, GpuError> {
        let layers = |gpu: &Gpu| (0..NUM_LAYERS).map(|_| gpu.zeros(MAX_SEQ_LEN * KV_DIM)).collect::<Result<Vec<_>, _>>();
        Ok(Buffers {
            keys: layers(gpu)?,
            values: layers(gpu)?,
            ids: gpu.zeros(PREFILL_CHUNK)?,
            x: gpu.zeros(PREFILL_CHUNK * HIDDEN_SIZE)?,
            xb: gpu.zeros(PREFILL_CHUNK * HIDDEN_SIZE)?,
            q: gpu.zeros(PREFILL_CHUNK * Q_DIM)?,
            k: gpu.zeros(PREFILL_CHUNK * KV_DIM)?,
            v: gpu.zeros(PREFILL_CHUNK * KV_DIM)?,
            att: gpu.zeros(PREFILL_CHUNK * Q_DIM)?,
            gate: gpu.zeros(PREFILL_CHUNK * INTERMEDIATE_SIZE)?,
            up: gpu.zeros(PREFILL_CHUNK * INTERMEDIATE_SIZE)?,
            last: gpu.zeros(HIDDEN_SIZE)?,
            normed: gpu.zeros(HIDDEN_SIZE)?,
            logits: gpu.zeros(VOCAB_SIZE)?,
            picked: gpu.zeros(1)?,
            scratch: gpu.zeros(NUM_HEADS * (MAX_SEQ_LEN + HEAD_DIM + 2))?,
        })
    }
}

impl<'m> Session<'m> {
    /// Positions the session holds.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Forgets the sequence, keeping the buffers, to start a new one.
    pub fn reset(&mut self) {
        self.pos = 0;
    }

    /// Runs `tokens` at the next positions and returns the logits of the last one:
    /// [VOCAB_SIZE].
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<&[f32], Error> {
        let row = self.run(tokens)?;
        self.classify(row)?;
        Ok(&self.logits)
    }

    /// Runs `tokens` at the next positions, PREFILL_CHUNK at a time, and returns the row of
    /// the last chunk that holds the last token: only that position needs logits.
    fn run(&mut self, tokens: &[u32]) -> Result<usize, Error> {
        self.check(tokens)?;
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            self.forward(chunk)?;
        }
        Ok((tokens.len() - 1) % PREFILL_CHUNK)
    }

    /// Runs one token at the next position and returns its logits: [VOCAB_SIZE].
    pub fn decode(&mut self, token: u32) -> Result<&[f32], Error> {
        self.prefill(std::slice::from_ref(&token))
    }

    /// Runs `tokens` at the next positions and picks the token after the last one as
    /// [`crate::kernels::sampler::sample`] does with these parameters and `coin`: at temperature
    /// 0 on the GPU (the first index of the largest logit), so that only the id comes back;
    /// otherwise from the logits, copied back, on the host.
    pub fn prefill_pick(
        &mut self,
        tokens: &[u32],
        params: &crate::GenerateParams,
        coin: f32,
        scratch: &mut Vec<(f32, u32)>,
    ) -> Result<u32, Error> {
        let row = self.run(tokens)?;
        if params.temperature <= 0.0 {
            return self.greedy(row);
        }
        self.classify(row)?;
        Ok(sample::<VOCAB_SIZE>(&self.logits, params.temperature, params.top_k, params.top_p, coin, scratch))
    }

    /// [`Session::prefill_pick`] of one token.
    pub fn decode_pick(
        &mut self,
        token: u32,
        params: &crate::GenerateParams,
        coin: f32,
        scratch: &mut Vec<(f32, u32)>,
    ) -> Result<u32, Error> {
        self.prefill_pick(std::slice::from_ref(&token), params, coin, scratch)
    }

    /// Runs `tokens` at the next positions and returns the logits of every one of
    /// them: [tokens.len(), VOCAB_SIZE].
    pub fn logits_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>, Error> {
        self.check(tokens)?;
        let mut all = Vec::with_capacity(tokens.len() * VOCAB_SIZE);
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            self.forward(chunk)?;
            for row in 0..chunk.len() {
                self.classify(row)?;
                all.extend_from_slice(&self.logits);
            }
        }
        Ok(all)
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
    fn forward(&mut self, tokens: &[u32]) -> Result<(), Error> {
        let Session { model, pos, buffers, .. } = self;
        let gpu = &model.gpu;
        let b = match buffers {
            Some(b) => b,
            None => buffers.insert(Buffers::new(gpu)?),
        };
        let w = &model.weights;
        let (t, start) = (tokens.len(), *pos);
        gpu.stream().memcpy_htod(tokens, &mut b.ids)?;
        // x = embed_tokens[tokens]: [T, HIDDEN_SIZE]
        embed(gpu, &mut b.x, &w.embed_tokens, &b.ids, t)?;
        for (layer, (keys, values)) in w.layers.iter().zip(b.keys.iter_mut().zip(b.values.iter_mut())) {
            // xb = rmsnorm(x) · input_layernorm: [T, HIDDEN_SIZE]
            rmsnorm(gpu, &mut b.xb, &b.x, &layer.input_layernorm, t)?;
            // q = xb · q_projᵀ: [T, Q_DIM]
            matmul::<Q_DIM, HIDDEN_SIZE>(gpu, &mut b.q, &b.xb, &layer.q_proj, t)?;
            // k = xb · k_projᵀ, v = xb · v_projᵀ: [T, KV_DIM]
            matmul::<KV_DIM, HIDDEN_SIZE>(gpu, &mut b.k, &b.xb, &layer.k_proj, t)?;
            matmul::<KV_DIM, HIDDEN_SIZE>(gpu, &mut b.v, &b.xb, &layer.v_proj, t)?;
            // q += q_bias, k += k_bias, v += v_bias, row by row
            #[only_if(qkv_bias)]
            {
                add_bias(gpu, &mut b.q, &layer.q_bias, t, Q_DIM)?;
                add_bias(gpu, &mut b.k, &layer.k_bias, t, KV_DIM)?;
                add_bias(gpu, &mut b.v, &layer.v_bias, t, KV_DIM)?;
            }
            // rotate q and k by their positions start..start + T
            rope(gpu, &mut b.q, &mut b.k, &model.rope_cos, &model.rope_sin, start, t)?;
            // the layer's cache holds k and v at positions start..start + T
            kv_store(gpu, keys, values, &b.k, &b.v, start, t)?;
            // att = softmax(q · kᵀ / √HEAD_DIM) · v, each row over the positions up to its own: [T, Q_DIM]
            if t == 1 {
                attention_decode(gpu, &mut b.att, &b.q, keys, values, &mut b.scratch, start + 1)?;
            } else {
                attention_prefill(gpu, &mut b.att, &b.q, keys, values, start, t)?;
            }
            // xb = att · o_projᵀ: [T, HIDDEN_SIZE]
            matmul::<HIDDEN_SIZE, Q_DIM>(gpu, &mut b.xb, &b.att, &layer.o_proj, t)?;
            // x = x + xb (residual)
            add(gpu, &mut b.x, &b.xb, t * HIDDEN_SIZE)?;
            // xb = rmsnorm(x) · post_attention_layernorm: [T, HIDDEN_SIZE]
            rmsnorm(gpu, &mut b.xb, &b.x, &layer.post_attention_layernorm, t)?;
            // gate = xb · gate_projᵀ, up = xb · up_projᵀ: [T, INTERMEDIATE_SIZE]
            matmul::<INTERMEDIATE_SIZE, HIDDEN_SIZE>(gpu, &mut b.gate, &b.xb, &layer.gate_proj, t)?;
            matmul::<INTERMEDIATE_SIZE, HIDDEN_SIZE>(gpu, &mut b.up, &b.xb, &layer.up_proj, t)?;
            // gate = silu(gate) · up: [T, INTERMEDIATE_SIZE]
            swiglu(gpu, &mut b.gate, &b.up, t)?;
            // xb = gate · down_projᵀ: [T, HIDDEN_SIZE]
            matmul::<HIDDEN_SIZE, INTERMEDIATE_SIZE>(gpu, &mut b.xb, &b.gate, &layer.down_proj, t)?;
            // x = x + xb (residual)
            add(gpu, &mut b.x, &b.xb, t * HIDDEN_SIZE)?;
        }
        *pos += t;
        Ok(())
    }

    /// The final norm and the classifier for row `row` of the last chunk, on the GPU, then the
    /// first index of the largest logit: only that id comes back.
    fn greedy(&mut self, row: usize) -> Result<u32, Error> {
        self.logits_on_gpu(row)?;
        let Session { model, buffers, .. } = self;
        let Some(b) = buffers.as_mut() else { unreachable!("greedy runs after forward") };
        let gpu = &model.gpu;
        argmax(gpu, &mut b.picked, &b.logits)?;
        let mut picked = [0u32];
        gpu.stream().memcpy_dtoh(&b.picked, &mut picked)?;
        gpu.stream().synchronize()?;
        Ok(picked[0])
    }

    /// The final norm and the classifier for row `row` of the last chunk: fills `logits`.
    fn classify(&mut self, row: usize) -> Result<(), Error> {
        self.logits_on_gpu(row)?;
        let Session { model, buffers, logits, .. } = self;
        let Some(b) = buffers.as_mut() else { unreachable!("classify runs after forward") };
        let gpu = &model.gpu;
        gpu.stream().memcpy_dtoh(&b.logits, logits.as_mut_slice())?;
        gpu.stream().synchronize()?;
        Ok(())
    }

    /// The final norm and the classifier for row `row` of the last chunk, into the GPU's
    /// `logits`.
    fn logits_on_gpu(&mut self, row: usize) -> Result<(), Error> {
        let Session { model, buffers, .. } = self;
        let Some(b) = buffers.as_mut() else { unreachable!("the logits follow forward") };
        let (gpu, w) = (&model.gpu, &model.weights);
        // last = x[row]: [1, HIDDEN_SIZE]
        gpu.stream().memcpy_dtod(&b.x.slice(row * HIDDEN_SIZE..(row + 1) * HIDDEN_SIZE), &mut b.last)?;
        // normed = rmsnorm(last) · norm: [1, HIDDEN_SIZE]
        rmsnorm(gpu, &mut b.normed, &b.last, &w.norm, 1)?;
        // logits = normed · classifierᵀ: [1, VOCAB_SIZE]
        __slot!(classifier);
        Ok(())
    }
}

/// x[r] = table[ids[r]] for `rows` rows: `model.cu`'s `embed`, one thread per value.
fn embed(gpu: &Gpu, x: &mut CudaSlice<f32>, table: &CudaSlice<Weight>, ids: &CudaSlice<u32>, rows: usize) -> Result<(), GpuError> {
    let function = gpu.function("model", "embed")?;
    let n = rows * HIDDEN_SIZE;
    let config = LaunchConfig { grid_dim: (n.div_ceil(256) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let rows = rows as i32;
    let mut launch = gpu.stream().launch_builder(&function);
    launch.arg(x).arg(table).arg(ids).arg(&rows);
    // SAFETY: the arguments are those of `embed` in model.cu, in order; every id is below
    // VOCAB_SIZE (Session::check), the rows of the table.
    unsafe { launch.launch(config) }?;
    Ok(())
}

/// picked[0] = the first index of the largest of the VOCAB_SIZE logits: `model.cu`'s `argmax`,
/// one block of 1024 threads.
fn argmax(gpu: &Gpu, picked: &mut CudaSlice<u32>, logits: &CudaSlice<f32>) -> Result<(), GpuError> {
    let function = gpu.function("model", "argmax")?;
    let config = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
    let mut launch = gpu.stream().launch_builder(&function);
    launch.arg(picked).arg(logits);
    // SAFETY: the arguments are those of `argmax` in model.cu, in order; logits holds
    // VOCAB_SIZE values and picked one.
    unsafe { launch.launch(config) }?;
    Ok(())
}

/// x[r] += bias for `rows` rows of `dim` values: `model.cu`'s `add_bias`, one thread per value.
#[only_if(qkv_bias)]
fn add_bias(gpu: &Gpu, x: &mut CudaSlice<f32>, bias: &CudaSlice<f32>, rows: usize, dim: usize) -> Result<(), GpuError> {
    let function = gpu.function("model", "add_bias")?;
    let n = rows * dim;
    let config = LaunchConfig { grid_dim: (n.div_ceil(256) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let (rows, dim) = (rows as i32, dim as i32);
    let mut launch = gpu.stream().launch_builder(&function);
    launch.arg(x).arg(bias).arg(&rows).arg(&dim);
    // SAFETY: the arguments are those of `add_bias` in model.cu, in order; x holds `rows` rows
    // of `dim` values and bias `dim`.
    unsafe { launch.launch(config) }?;
    Ok(())
}

/// x += y over the first `n` values: `model.cu`'s `add`, one thread per value.
fn add(gpu: &Gpu, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>, n: usize) -> Result<(), GpuError> {
    let function = gpu.function("model", "add")?;
    let config = LaunchConfig { grid_dim: (n.div_ceil(256) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let n = n as i32;
    let mut launch = gpu.stream().launch_builder(&function);
    launch.arg(x).arg(y).arg(&n);
    // SAFETY: the arguments are those of `add` in model.cu, in order; both buffers hold at
    // least `n` values.
    unsafe { launch.launch(config) }?;
    Ok(())
}

__slot!(inv_freq_fn);
