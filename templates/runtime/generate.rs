//! Token generation: prefill the prompt, then sample and decode one token at a time until
//! an end-of-sequence id, the token limit or the end of the context.

#[only_if(speculation)]
use std::collections::VecDeque;
use std::time::Instant;

#[only_if(not(cuda))]
use crate::kernels::sampler::sample;
#[only_if(batched)]
use crate::model::{Batch, Run, Sequence};
#[only_if(prompt_lookup)]
use crate::kernels::speculator::draft;
use crate::model::Session;
use crate::{Error, EOS_TOKEN_IDS, MAX_SEQ_LEN, VOCAB_SIZE};
#[only_if(speculation)]
use crate::DRAFT_TOKENS;
#[only_if(prompt_lookup)]
use crate::{LOOKUP_MAX, LOOKUP_MIN};
#[only_if(prefix_cache)]
use crate::PREFIX_CACHE_MIN;
#[only_if(batched)]
use crate::{MAX_BATCH, PREFILL_CHUNK};

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
    /// The prompt this generation ran.
    pub prompt_ids: Vec<u32>,
    /// Tokens at the start of the prompt that [`Session::generate_anew`] kept from what the
    /// session held, and did not run again (`prompt_ids` is the rest).
    #[only_if(prefix_cache)]
    pub reused: usize,
    /// The new ids, including the end-of-sequence id if generation stopped at one.
    pub generated_ids: Vec<u32>,
    pub stop: StopReason,
    /// Time to run the prompt and pick the first new token.
    pub prefill_ms: f64,
    /// Time of the decode steps that followed.
    pub decode_ms: f64,
    /// Tokens the decode steps picked: every new token after the first.
    pub decode_steps: usize,
    /// Tokens the speculator drafted.
    #[only_if(speculation)]
    pub drafted: usize,
    /// Drafted tokens the model picked too, which cost no step of their own (a step picks its
    /// kept drafted tokens and one more).
    #[only_if(speculation)]
    pub accepted: usize,
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
        #[only_if(not(speculation))]
        let mut decode_steps = 0;
        #[only_if(speculation)]
        let start = self.position();

        let started = Instant::now();
        #[only_if(not(cuda))]
        let logits = self.prefill(prompt)?;
        #[only_if(not(cuda))]
        let mut token = sample::<VOCAB_SIZE>(logits, params.temperature, params.top_k, params.top_p, rng.next_f32(), &mut scratch);
        // a greedy pick runs on the GPU, whose logits then stay there
        #[only_if(cuda)]
        let mut token = self.prefill_pick(prompt, params, rng.next_f32(), &mut scratch)?;
        let prefill_ms = started.elapsed().as_secs_f64() * 1000.0;
        #[only_if(speculation)]
        #[only_if(not(prefix_cache))]
        let mut spec = Speculation::new(prompt, token);
        // the lookup reads all the session holds: the start `generate_anew` kept (the system
        // prompt, the earlier turns) as well as the prompt
        #[only_if(speculation)]
        #[only_if(prefix_cache)]
        let mut spec = Speculation::new(self.held(), token);

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
            // while a verification's picks remain, the cache already holds the token handed out
            #[only_if(speculation)]
            if let Some(next) = spec.ahead.pop_front() {
                token = next;
                continue;
            }
            if self.position() == MAX_SEQ_LEN {
                stop = StopReason::ContextFull;
                break;
            }
            #[only_if(not(speculation))]
            #[only_if(not(cuda))]
            {
                let logits = self.decode(token)?;
                token = sample::<VOCAB_SIZE>(logits, params.temperature, params.top_k, params.top_p, rng.next_f32(), &mut scratch);
                decode_steps += 1;
            }
            #[only_if(cuda)]
            {
                token = self.decode_pick(token, params, rng.next_f32(), &mut scratch)?;
                decode_steps += 1;
            }
            // drafts fit beside `token` in the cache, and among the tokens still to pick after it
            #[only_if(speculation)]
            {
                let room = (MAX_SEQ_LEN - self.position() - 1).min(params.max_tokens - generated.len() - 1);
                self.speculate(token, room, &mut spec, params, &mut rng, &mut scratch)?;
                token = spec.ahead.pop_front().expect("a verification picks at least one token");
            }
        }
        // the session holds the prompt and every handed-out token but the last, as without drafts
        #[only_if(speculation)]
        self.rewind(start + prompt.len() + generated.len().saturating_sub(1));
        // picks still ahead were not handed out: all but the last of them kept drafts
        #[only_if(speculation)]
        let accepted = spec.accepted - spec.ahead.len().saturating_sub(1);
        #[only_if(speculation)]
        let decode_steps = generated.len().saturating_sub(1);
        Ok(Generation {
            prompt_ids: prompt.to_vec(),
            #[only_if(prefix_cache)]
            reused: 0,
            generated_ids: generated,
            stop,
            prefill_ms,
            decode_ms: decode_started.elapsed().as_secs_f64() * 1000.0,
            decode_steps,
            #[only_if(speculation)]
            drafted: spec.drafted,
            #[only_if(speculation)]
            accepted,
        })
    }

    /// Generates after `prompt` as a new sequence, as [`Session::reset`] then
    /// [`Session::generate`] would, with the same tokens; but where the session holds the start
    /// of `prompt` (at least PREFIX_CACHE_MIN tokens: a shared system prompt, a conversation
    /// so far), those positions are kept and only the rest of the prompt runs. The keys and
    /// values of a position depend only on the tokens up to it. Its last token always runs,
    /// for the logits that pick the first new one.
    #[only_if(prefix_cache)]
    pub fn generate_anew(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        on_token: impl FnMut(u32) -> bool,
    ) -> Result<Generation, Error> {
        params.validate()?;
        if prompt.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        let shared = self.held().iter().zip(prompt).take_while(|(a, b)| a == b).count().min(prompt.len() - 1);
        let keep = if shared >= PREFIX_CACHE_MIN { shared } else { 0 };
        // refused before the session forgets anything
        if let Some(&id) = prompt.iter().find(|&&id| id as usize >= VOCAB_SIZE) {
            return Err(Error::TokenOutOfRange { id, vocab_size: VOCAB_SIZE });
        }
        if prompt.len() > MAX_SEQ_LEN {
            return Err(Error::SequenceTooLong { len: prompt.len(), max: MAX_SEQ_LEN });
        }
        self.rewind(keep);
        let mut generation = self.generate(&prompt[keep..], params, on_token)?;
        generation.reused = keep;
        Ok(generation)
    }

    /// One speculative step after `token`: drafts at most `room` tokens (DRAFT_TOKENS at most),
    /// runs `token` and them in one pass, and picks from each row's logits as a decode step
    /// would (the same sampler, the next coin), keeping drafted tokens while each is the pick.
    /// The picks go to `spec.ahead`; the cache keeps `token` and the kept drafted tokens.
    #[only_if(speculation)]
    fn speculate(
        &mut self,
        token: u32,
        room: usize,
        spec: &mut Speculation,
        params: &GenerateParams,
        rng: &mut Rng,
        scratch: &mut Vec<(f32, u32)>,
    ) -> Result<(), Error> {
        let Speculation { context, ahead, rows, drafted, accepted } = spec;
        // rows = token, then the drafted tokens
        rows.clear();
        rows.push(token);
        #[only_if(prompt_lookup)]
        draft::<LOOKUP_MAX, LOOKUP_MIN>(context, room.min(DRAFT_TOKENS), rows);
        #[only_if(draft_model)]
        {
            self.drafter().draft(context, room.min(DRAFT_TOKENS), rows)?;
        }
        let at = self.position();
        // logits = the model over rows: [rows.len(), VOCAB_SIZE]
        let logits = self.verify(rows)?;
        for (row, logits) in logits.chunks_exact(VOCAB_SIZE).enumerate() {
            let pick = sample::<VOCAB_SIZE>(logits, params.temperature, params.top_k, params.top_p, rng.next_f32(), scratch);
            ahead.push_back(pick);
            context.push(pick);
            if rows.get(row + 1) != Some(&pick) {
                break;
            }
        }
        let kept = ahead.len() - 1;
        *drafted += rows.len() - 1;
        *accepted += kept;
        // forget the rows of drafted tokens that were not picked
        self.rewind(at + 1 + kept);
        Ok(())
    }
}

#[only_if(batched)]
impl Batch<'_> {
    /// Generates after each of `prompts` (1 to MAX_BATCH of them) as [`Session::generate`] does
    /// after each alone, with the same parameters and each its own random numbers from
    /// `params.seed`, so each gets the tokens it gets alone; but their decode steps run
    /// together, every sequence still generating passing its next token as a row of one step.
    /// The prompts run first, one after another, PREFILL_CHUNK positions a step. Each
    /// generation's `decode_ms` runs from the first decode step to its own end; no tokens are
    /// drafted here.
    pub fn generate(&mut self, prompts: &[&[u32]], params: &GenerateParams) -> Result<Vec<Generation>, Error> {
        params.validate()?;
        if prompts.is_empty() || prompts.len() > MAX_BATCH {
            return Err(Error::InvalidParameter {
                name: "prompts",
                reason: format!("a batch generates after 1 to {MAX_BATCH} prompts, not {}", prompts.len()),
            });
        }
        let mut sequences: Vec<Sequence> = prompts.iter().map(|_| Sequence::new()).collect();
        for (sequence, prompt) in sequences.iter().zip(prompts) {
            sequence.check(prompt)?;
        }
        let mut scratch = Vec::with_capacity(VOCAB_SIZE);
        let mut states = Vec::with_capacity(prompts.len());
        for (sequence, prompt) in sequences.iter_mut().zip(prompts) {
            let started = Instant::now();
            let mut rng = Rng::new(params.seed);
            let mut logits: &[f32] = &[];
            for chunk in prompt.chunks(PREFILL_CHUNK) {
                logits = self.step(&mut [Run { sequence: &mut *sequence, tokens: chunk }])?;
            }
            let token = sample::<VOCAB_SIZE>(logits, params.temperature, params.top_k, params.top_p, rng.next_f32(), &mut scratch);
            states.push(BatchMember {
                rng,
                token,
                generated: Vec::new(),
                stop: None,
                prefill_ms: started.elapsed().as_secs_f64() * 1000.0,
                decode_ms: 0.0,
                decode_steps: 0,
            });
        }

        let decode_started = Instant::now();
        let mut running = Vec::with_capacity(prompts.len());
        let mut tokens = Vec::with_capacity(prompts.len());
        loop {
            // each running sequence hands out its token, and stops where `Session::generate` would
            running.clear();
            tokens.clear();
            for (i, (state, sequence)) in states.iter_mut().zip(&sequences).enumerate() {
                if state.stop.is_some() {
                    continue;
                }
                let stop = if state.generated.len() == params.max_tokens {
                    Some(StopReason::MaxTokens)
                } else {
                    state.generated.push(state.token);
                    if EOS_TOKEN_IDS.contains(&state.token) {
                        Some(StopReason::Eos)
                    } else if state.generated.len() == params.max_tokens {
                        Some(StopReason::MaxTokens)
                    } else if sequence.position() == MAX_SEQ_LEN {
                        Some(StopReason::ContextFull)
                    } else {
                        None
                    }
                };
                match stop {
                    Some(stop) => {
                        state.stop = Some(stop);
                        state.decode_ms = decode_started.elapsed().as_secs_f64() * 1000.0;
                    }
                    None => {
                        running.push(i);
                        tokens.push(state.token);
                    }
                }
            }
            if running.is_empty() {
                break;
            }
            // logits = the model over each running sequence's token: [running.len(), VOCAB_SIZE]
            let mut runs: Vec<Run<'_>> = sequences
                .iter_mut()
                .zip(&states)
                .filter(|(_, state)| state.stop.is_none())
                .zip(&tokens)
                .map(|((sequence, _), token)| Run { sequence, tokens: std::slice::from_ref(token) })
                .collect();
            let logits = self.step(&mut runs)?;
            for (&i, logits) in running.iter().zip(logits.chunks_exact(VOCAB_SIZE)) {
                let state = &mut states[i];
                state.token = sample::<VOCAB_SIZE>(logits, params.temperature, params.top_k, params.top_p, state.rng.next_f32(), &mut scratch);
                state.decode_steps += 1;
            }
        }
        Ok(states
            .into_iter()
            .zip(prompts)
            .map(|(state, prompt)| Generation {
                prompt_ids: prompt.to_vec(),
                #[only_if(prefix_cache)]
                reused: 0,
                generated_ids: state.generated,
                stop: state.stop.unwrap_or(StopReason::MaxTokens),
                prefill_ms: state.prefill_ms,
                decode_ms: state.decode_ms,
                decode_steps: state.decode_steps,
                #[only_if(speculation)]
                drafted: 0,
                #[only_if(speculation)]
                accepted: 0,
            })
            .collect())
    }
}

/// One sequence of [`Batch::generate`].
#[only_if(batched)]
struct BatchMember {
    rng: Rng,
    /// The token picked last, not handed out yet.
    token: u32,
    generated: Vec<u32>,
    stop: Option<StopReason>,
    prefill_ms: f64,
    decode_ms: f64,
    decode_steps: usize,
}

/// A speculative generation's state.
#[only_if(speculation)]
struct Speculation {
    /// What prompt lookup searches: the prompt and every token picked since.
    context: Vec<u32>,
    /// Tokens the last verification picked and `generate` has not handed out yet; the cache
    /// holds all but the last.
    ahead: VecDeque<u32>,
    /// The rows of a verification: the last picked token and the drafted ones.
    rows: Vec<u32>,
    drafted: usize,
    accepted: usize,
}

#[only_if(speculation)]
impl Speculation {
    fn new(prompt: &[u32], first: u32) -> Speculation {
        let mut context = Vec::with_capacity(MAX_SEQ_LEN);
        context.extend_from_slice(prompt);
        context.push(first);
        Speculation {
            context,
            ahead: VecDeque::with_capacity(DRAFT_TOKENS + 1),
            rows: Vec::with_capacity(DRAFT_TOKENS + 1),
            drafted: 0,
            accepted: 0,
        }
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
