//! Token generation: prefill the prompt, then sample and decode one token at a time until
//! an end-of-sequence id, the token limit or the end of the context.

use std::time::Instant;

use crate::kernels::sampler::sample;
use crate::model::Session;
use crate::{Error, EOS_TOKEN_IDS, MAX_SEQ_LEN, VOCAB_SIZE};

/// How to pick tokens and when to stop.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateParams {
    /// New tokens to generate at most.
    pub max_tokens: usize,
    /// 0 picks the most likely token (greedy); higher values flatten the distribution.
    pub temperature: f32,
    /// Sample among the `top_k` most likely tokens only; 0 keeps all.
    pub top_k: usize,
    /// Sample among the most likely tokens whose probabilities add up to `top_p`; 1 keeps all.
    pub top_p: f32,
    /// Seed of the random numbers behind sampling: the same seed gives the same tokens.
    pub seed: u64,
}

impl Default for GenerateParams {
    fn default() -> GenerateParams {
        GenerateParams { max_tokens: 128, temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
    }
}

impl GenerateParams {
    /// Checks that every parameter is in range.
    pub fn validate(&self) -> Result<(), Error> {
        let invalid = |name, reason: &str| Err(Error::InvalidParameter { name, reason: reason.to_string() });
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return invalid("temperature", "must be a finite number, 0 or more");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return invalid("top_p", "must be above 0 and at most 1");
        }
        Ok(())
    }
}

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-sequence id.
    Eos,
    /// `max_tokens` new tokens were generated.
    MaxTokens,
    /// The session reached the last position this crate was generated for.
    ContextFull,
    /// The caller's callback asked to stop.
    Cancelled,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Eos => "eos",
            StopReason::MaxTokens => "max_tokens",
            StopReason::ContextFull => "context_full",
            StopReason::Cancelled => "cancelled",
        }
    }
}

/// The outcome of one generation, with its timings.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    /// The new ids, including the end-of-sequence id if generation stopped at one.
    pub generated_ids: Vec<u32>,
    pub stop: StopReason,
    /// Time to run the prompt and pick the first new token.
    pub prefill_ms: f64,
    /// Time of the decode steps that followed.
    pub decode_ms: f64,
    /// Number of decode steps (each one runs one token and picks the next).
    pub decode_steps: usize,
}

impl Generation {
    pub fn prefill_tok_s(&self) -> f64 {
        rate(self.prompt_ids.len(), self.prefill_ms)
    }

    pub fn decode_tok_s(&self) -> f64 {
        rate(self.decode_steps, self.decode_ms)
    }
}

fn rate(tokens: usize, ms: f64) -> f64 {
    if ms > 0.0 { tokens as f64 / (ms / 1000.0) } else { 0.0 }
}

impl Session<'_> {
    /// Runs `prompt` after whatever the session already holds, then generates up to
    /// `params.max_tokens` new tokens. `on_token` sees each new id as soon as it is picked
    /// and returns `false` to stop.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<Generation, Error> {
        params.validate()?;
        if prompt.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        let mut rng = Rng::new(params.seed);
        let mut scratch = Vec::with_capacity(VOCAB_SIZE);
        let mut generated = Vec::new();
        let mut stop = StopReason::MaxTokens;
        let mut decode_steps = 0;

        let started = Instant::now();
        let logits = self.prefill(prompt)?;
        let mut token = sample::<VOCAB_SIZE>(logits, params.temperature, params.top_k, params.top_p, rng.next_f32(), &mut scratch);
        let prefill_ms = started.elapsed().as_secs_f64() * 1000.0;

        let decode_started = Instant::now();
        while generated.len() < params.max_tokens {
            generated.push(token);
            if !on_token(token) {
                stop = StopReason::Cancelled;
                break;
            }
            if EOS_TOKEN_IDS.contains(&token) {
                stop = StopReason::Eos;
                break;
            }
            if generated.len() == params.max_tokens {
                break;
            }
            if self.position() == MAX_SEQ_LEN {
                stop = StopReason::ContextFull;
                break;
            }
            let logits = self.decode(token)?;
            token = sample::<VOCAB_SIZE>(logits, params.temperature, params.top_k, params.top_p, rng.next_f32(), &mut scratch);
            decode_steps += 1;
        }
        Ok(Generation {
            prompt_ids: prompt.to_vec(),
            generated_ids: generated,
            stop,
            prefill_ms,
            decode_ms: decode_started.elapsed().as_secs_f64() * 1000.0,
            decode_steps,
        })
    }
}

/// xorshift64*, seeded through splitmix64: small, fast and the same on every machine.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    /// A uniform number in [0, 1).
    pub(crate) fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
        bits as f32 / (1u64 << 24) as f32
    }
}
