//! The server's engine: one thread that owns the batch and the KV caches and runs continuous
//! batching. Each step passes every running sequence's next token, and a piece of at most
//! PREFILL_CHUNK positions of the prompts being read, through the layers together
//! ([`Batch::step`]), so that a long prompt delays the running sequences' next tokens by one
//! chunk at a time, never by its whole length.
//!
//! A request holds one of KV_SLOTS KV caches from admission to its end. The running ones are the
//! MAX_BATCH most urgent of them (by class, then by arrival); the others wait with their caches
//! kept, and resume exactly where they stopped when a place frees up. When every KV slot is
//! taken and a request arrives that is more urgent than the least urgent holder, that holder
//! gives its cache up and waits again; when it is admitted anew, it reads its prompt and the
//! tokens it had generated again, and goes on with the same random numbers.
//!
//! A sequence samples and stops exactly as [`Session::generate`](crate::Session::generate) does,
//! so a request's tokens are those of the same prompt and parameters run alone.
//!
//! With speculation, a decoding sequence's step runs its next token and the tokens prompt lookup
//! (or the draft model, a session of it for each sequence) drafts after it, and picks from each
//! of those rows in turn, as long as each pick is the drafted token; sequences of one step may
//! draft different numbers of tokens.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use crate::generate::Rng;
use crate::kernels::sampler::sample;
use crate::metrics::Metrics;
use crate::model::{Batch, Run, Sequence, check_tokens};
#[only_if(prefix_cache)]
use crate::PREFIX_CACHE_MIN;
#[only_if(prompt_lookup)]
use crate::kernels::speculator::draft;
#[only_if(speculation)]
use crate::{DRAFT_TOKENS, STEP_ROWS};
#[only_if(prompt_lookup)]
use crate::{LOOKUP_MAX, LOOKUP_MIN};
use crate::{EOS_TOKEN_IDS, Error, GenerateParams, KV_SLOTS, MAX_BATCH, MAX_QUEUE, MAX_SEQ_LEN, Model, PREFILL_CHUNK, StopReason, VOCAB_SIZE};

/// Prompt positions a step reads beside decode rows: a quarter of a prefill chunk, so that a
/// step with a piece of a prompt takes a few decode steps' time, not a whole chunk's, and the
/// running sequences' next tokens are not held up by it (a step without decode rows reads a
/// whole chunk).
const PREFILL_BESIDE_DECODE: usize = PREFILL_CHUNK.div_ceil(4);

/// A request for the engine: a prompt of ids and how to continue it.
pub struct Request {
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    /// Its class, an index of [`PRIORITIES`](crate::PRIORITIES): 0 is the most urgent.
    pub priority: u8,
    /// Where its tokens go. Dropping the receiver cancels the request and frees its place.
    pub events: UnboundedSender<Event>,
}

/// What the engine tells a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The next token.
    Token(u32),
    /// Generation ended; no event follows.
    Done(StopReason),
    /// The request cannot run; no event follows.
    Failed(String),
}

/// Why a request was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// MAX_QUEUE requests are already waiting.
    QueueFull,
    /// The engine is shutting down.
    Stopped,
}

/// The engine's thread, and the way to hand it requests.
pub struct Engine {
    sender: Mutex<Option<mpsc::Sender<Request>>>,
    /// Requests handed over and not yet admitted.
    queued: Arc<AtomicUsize>,
    closed: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Engine {
    /// Starts the engine's thread on `model`, recording what it does in `metrics`.
    pub fn start(model: Arc<Model>, metrics: Arc<Metrics>) -> Engine {
        let (sender, receiver) = mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let scheduler = Scheduler {
            receiver,
            queued: queued.clone(),
            metrics,
            waiting: Vec::new(),
            held: Vec::new(),
            free: Vec::new(),
            #[only_if(prefix_cache)]
            kept: Vec::new(),
            arrivals: 0,
            scratch: Vec::with_capacity(VOCAB_SIZE),
        };
        let thread = std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || scheduler.run(&model))
            .expect("the engine's thread starts");
        Engine {
            sender: Mutex::new(Some(sender)),
            queued,
            closed: AtomicBool::new(false),
            thread: Mutex::new(Some(thread)),
        }
    }

    /// Hands `request` to the engine, unless MAX_QUEUE requests already wait or the engine
    /// takes no more.
    pub fn submit(&self, request: Request) -> Result<(), Refused> {
        let sender = self.sender.lock().unwrap_or_else(|e| e.into_inner());
        let Some(sender) = sender.as_ref() else { return Err(Refused::Stopped) };
        if self.queued.fetch_add(1, Ordering::AcqRel) >= MAX_QUEUE {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(Refused::QueueFull);
        }
        sender.send(request).map_err(|_| {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            Refused::Stopped
        })
    }

    /// Takes no more requests; those taken run to their end.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.sender.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Whether it takes no more requests.
    pub fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Takes no more requests, and waits until those taken have run to their end.
    pub fn stop(&self) {
        self.close();
        if let Some(thread) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One request inside the engine.
struct Active {
    request: Request,
    /// The order of arrival, which breaks ties between requests of one class.
    arrival: u64,
    /// Prompt and generated tokens, the last one generated not yet run.
    tokens: Vec<u32>,
    /// Tokens of `tokens` in the KV cache.
    fed: usize,
    generated: usize,
    rng: Rng,
    /// When it was handed over, and when its last token was sent.
    arrived: Instant,
    last_token: Option<Instant>,
}

impl Active {
    /// The order in which requests get a place: class first, then arrival.
    fn rank(&self) -> (u8, u64) {
        (self.request.priority, self.arrival)
    }
}

struct Scheduler {
    receiver: mpsc::Receiver<Request>,
    queued: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
    /// Requests without a KV cache: new ones, and those that gave theirs up.
    waiting: Vec<Active>,
    /// Requests that hold a KV cache, most urgent first: the first MAX_BATCH of them run.
    held: Vec<(Active, Sequence)>,
    /// KV caches no request holds.
    free: Vec<Sequence>,
    /// Finished requests' KV caches, with the tokens they hold, for the requests that start
    /// with them.
    #[only_if(prefix_cache)]
    kept: Vec<Kept>,
    arrivals: u64,
    /// The sampler's working space, kept from step to step.
    scratch: Vec<(f32, u32)>,
}

/// A finished request's KV cache, kept with the tokens it holds (the prefix cache of
/// `request.shared_prefix_len`): a request that starts with at least PREFIX_CACHE_MIN of them
/// takes a copy of that start and reads only the rest of its prompt. The keys and values of a position
/// depend only on the tokens up to it, so its tokens are the same. Kept caches count among the
/// KV_SLOTS; the least recently used one is given up first when a request needs a cache, and a
/// cache a request holds never is.
#[only_if(prefix_cache)]
struct Kept {
    /// The tokens whose keys and values the cache holds, in order.
    tokens: Vec<u32>,
    sequence: Sequence,
    /// When it was last kept or taken, by the arrivals' count: the least recent goes first.
    used: u64,
}

impl Scheduler {
    fn run(mut self, model: &Model) {
        let mut batch = model.batch();
        let mut open = true;
        loop {
            open = self.receive(open);
            self.drop_cancelled();
            self.admit();
            self.publish();
            if self.held.is_empty() {
                if !open {
                    return;
                }
                continue;
            }
            self.step(&mut batch);
            self.publish();
        }
    }

    /// Takes the requests handed over: waits for one when nothing runs (returning false when
    /// the engine is stopping and none will come), takes what is there otherwise.
    fn receive(&mut self, open: bool) -> bool {
        let mut open = open;
        if open && self.held.is_empty() && self.waiting.is_empty() {
            match self.receiver.recv() {
                Ok(request) => self.arrive(request),
                Err(_) => return false,
            }
        }
        while open {
            match self.receiver.try_recv() {
                Ok(request) => self.arrive(request),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => open = false,
            }
        }
        open
    }

    fn arrive(&mut self, request: Request) {
        self.arrivals += 1;
        let rng = Rng::new(request.params.seed);
        self.waiting.push(Active {
            tokens: request.prompt.clone(),
            request,
            arrival: self.arrivals,
            fed: 0,
            generated: 0,
            rng,
            arrived: Instant::now(),
            last_token: None,
        });
    }

    /// Frees the place of every request whose client went away.
    fn drop_cancelled(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|a| !a.request.events.is_closed());
        self.queued.fetch_sub(before - self.waiting.len(), Ordering::AcqRel);
        let mut i = 0;
        while i < self.held.len() {
            if self.held[i].0.request.events.is_closed() {
                let (_, sequence) = self.held.remove(i);
                self.free.push(sequence);
                self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            } else {
                i += 1;
            }
        }
    }

    /// Gives KV caches to the most urgent waiting requests: a kept cache that holds the start
    /// of its tokens first (with a prefix cache), then free ones, new ones while fewer than
    /// KV_SLOTS are taken, the least recently used kept one, and last those of less urgent
    /// holders, which wait again.
    fn admit(&mut self) {
        self.waiting.sort_by_key(Active::rank);
        while !self.waiting.is_empty() {
            #[only_if(prefix_cache)]
            if let Some(sequence) = self.take_prefix() {
                self.hold(sequence);
                continue;
            }
            let sequence = match self.free.pop() {
                Some(mut sequence) => {
                    sequence.reset();
                    sequence
                }
                None if self.taken() < KV_SLOTS => Sequence::new(),
                #[only_if(prefix_cache)]
                None if !self.kept.is_empty() => self.give_up_kept(),
                None if self.held.last().is_some_and(|(last, _)| last.rank() > self.waiting[0].rank()) => {
                    let (mut evicted, mut sequence) = self.held.pop().expect("held is not empty");
                    sequence.reset();
                    evicted.fed = 0;
                    self.metrics.evicted.fetch_add(1, Ordering::Relaxed);
                    self.queued.fetch_add(1, Ordering::AcqRel);
                    self.waiting.push(evicted);
                    self.waiting.sort_by_key(Active::rank);
                    sequence
                }
                None => break,
            };
            // A request that gave its cache up reads its tokens again: not a miss of its own.
            #[only_if(prefix_cache)]
            if self.waiting[0].generated == 0 {
                self.metrics.prefix_misses.fetch_add(1, Ordering::Relaxed);
            }
            self.hold(sequence);
        }
    }

    /// Hands `sequence` to the most urgent waiting request, which takes its place among the
    /// holders.
    fn hold(&mut self, sequence: Sequence) {
        let active = self.waiting.remove(0);
        self.queued.fetch_sub(1, Ordering::AcqRel);
        let at = self.held.partition_point(|(held, _)| held.rank() < active.rank());
        self.held.insert(at, (active, sequence));
    }

    /// KV caches allocated: the held ones.
    #[only_if(not(prefix_cache))]
    fn taken(&self) -> usize {
        self.held.len()
    }

    /// KV caches allocated: the held ones and the kept ones.
    #[only_if(prefix_cache)]
    fn taken(&self) -> usize {
        self.held.len() + self.kept.len()
    }

    /// The least recently used kept cache, emptied (one is kept).
    #[only_if(prefix_cache)]
    fn give_up_kept(&mut self) -> Sequence {
        let oldest = (0..self.kept.len()).min_by_key(|&i| self.kept[i].used).expect("a cache is kept");
        let mut sequence = self.kept.swap_remove(oldest).sequence;
        sequence.reset();
        self.metrics.prefix_evictions.fetch_add(1, Ordering::Relaxed);
        sequence
    }

    /// For the most urgent waiting request, the kept cache that holds the longest start of its
    /// tokens, if at least PREFIX_CACHE_MIN: that start (up to one token short of all of them,
    /// whose logits are needed), its positions counted as read. The start is copied into a
    /// cache to be had without taking one from a request (a free one, a new one, or the least
    /// recently used other kept one), so that the kept cache stays for the next request that
    /// shares it (a system prompt, the turns of a chat); where none is, the kept cache moves.
    #[only_if(prefix_cache)]
    fn take_prefix(&mut self) -> Option<Sequence> {
        let tokens = &self.waiting[0].tokens;
        let common = |kept: &Kept| kept.tokens.iter().zip(tokens).take_while(|(a, b)| a == b).count();
        let best = self.kept.iter().enumerate().map(|(i, k)| (i, common(k))).max_by_key(|&(_, n)| n);
        let (mut best, length) = best.filter(|&(_, n)| n.min(tokens.len() - 1) >= PREFIX_CACHE_MIN)?;
        let length = length.min(tokens.len() - 1);
        let copy = match self.free.pop() {
            Some(sequence) => Some(sequence),
            None if self.taken() < KV_SLOTS => Some(Sequence::new()),
            None if self.kept.len() > 1 => {
                let oldest = (0..self.kept.len())
                    .filter(|&i| i != best)
                    .min_by_key(|&i| self.kept[i].used)
                    .expect("another cache is kept");
                let sequence = self.kept.swap_remove(oldest).sequence;
                // the last one took the given-up one's place
                if best == self.kept.len() {
                    best = oldest;
                }
                self.metrics.prefix_evictions.fetch_add(1, Ordering::Relaxed);
                Some(sequence)
            }
            None => None,
        };
        let sequence = match copy {
            Some(mut sequence) => {
                let kept = &mut self.kept[best];
                sequence.copy_start(&kept.sequence, length);
                kept.used = self.arrivals;
                sequence
            }
            None => {
                let mut sequence = self.kept.swap_remove(best).sequence;
                sequence.truncate(length);
                sequence
            }
        };
        self.waiting[0].fed = length;
        self.metrics.prefix_hits.fetch_add(1, Ordering::Relaxed);
        self.metrics.prefix_reused_tokens.fetch_add(length as u64, Ordering::Relaxed);
        Some(sequence)
    }

    /// Keeps the KV cache of a finished request that held `tokens`, for those that start
    /// with them. A kept cache whose tokens all start these serves no request that this one
    /// does not serve as well: it is freed.
    #[only_if(prefix_cache)]
    fn keep(&mut self, mut tokens: Vec<u32>, sequence: Sequence) {
        tokens.truncate(sequence.position());
        let mut i = 0;
        while i < self.kept.len() {
            if tokens.starts_with(&self.kept[i].tokens) {
                let mut covered = self.kept.swap_remove(i).sequence;
                covered.reset();
                self.free.push(covered);
            } else {
                i += 1;
            }
        }
        self.kept.push(Kept { tokens, sequence, used: self.arrivals });
    }

    /// [`Scheduler::draft_with`] prompt lookup.
    #[only_if(prompt_lookup)]
    fn draft(&mut self, running: usize, ends: &mut [usize; MAX_BATCH]) -> [usize; MAX_BATCH] {
        self.draft_with(running, ends, |_, tokens, room, out| draft::<LOOKUP_MAX, LOOKUP_MIN>(tokens, room, out))
    }

    /// [`Scheduler::draft_with`] the draft model's session of each sequence (`Batch::drafter`,
    /// by the request's arrival number, so that a sequence keeps its session when a more urgent
    /// one takes its place in the step). A draft model that cannot run drafts nothing, and the
    /// sequence decodes one token.
    #[only_if(draft_model)]
    fn draft(&mut self, running: usize, ends: &mut [usize; MAX_BATCH], batch: &mut Batch<'_>) -> [usize; MAX_BATCH] {
        let metrics = self.metrics.clone();
        self.draft_with(running, ends, |arrival, tokens, room, out| match batch.drafter(arrival).draft(tokens, room, out) {
            Ok(positions) => {
                metrics.draft_positions.fetch_add(positions as u64, Ordering::Relaxed);
            }
            Err(_) => out.clear(),
        })
    }

    /// Drafts tokens for the decoding sequences among the first `running` holders, within the
    /// rows the step has left (`ends[i]` is where holder i's run ends), with `drafter(arrival,
    /// tokens, room, out)` (the request's arrival number, and its tokens): a sequence's drafted
    /// tokens join its tokens, and its run ends past them. Returns how many each one drafted.
    #[only_if(speculation)]
    fn draft_with(
        &mut self,
        running: usize,
        ends: &mut [usize; MAX_BATCH],
        mut drafter: impl FnMut(u64, &[u32], usize, &mut Vec<u32>),
    ) -> [usize; MAX_BATCH] {
        let mut drafts = [0; MAX_BATCH];
        let rows: usize =
            self.held[..running].iter().zip(ends.iter()).map(|((active, _), &end)| end.saturating_sub(active.fed)).sum();
        let mut spare = STEP_ROWS - rows;
        let mut drafted = Vec::with_capacity(DRAFT_TOKENS);
        for (((active, sequence), end), count) in self.held[..running].iter_mut().zip(ends.iter_mut()).zip(drafts.iter_mut()) {
            let decoding = active.tokens.len() - active.fed == 1 && *end == active.tokens.len();
            if !decoding || spare == 0 {
                continue;
            }
            // drafts fit in the cache beside the next token, and among the tokens still to pick
            let room = DRAFT_TOKENS
                .min(spare)
                .min(MAX_SEQ_LEN - sequence.position() - 1)
                .min(active.request.params.max_tokens.saturating_sub(active.generated + 1));
            drafted.clear();
            drafter(active.arrival, &active.tokens, room, &mut drafted);
            active.tokens.extend_from_slice(&drafted);
            *end = active.tokens.len();
            *count = drafted.len();
            spare -= drafted.len();
        }
        drafts
    }

    fn publish(&self) {
        let running = self.held.len().min(MAX_BATCH);
        self.metrics.running.store(running, Ordering::Relaxed);
        self.metrics.waiting.store(self.held.len() - running + self.waiting.len(), Ordering::Relaxed);
        self.metrics.kv_slots_used.store(self.held.len(), Ordering::Relaxed);
        let positions = self.held.iter().map(|(_, s)| s.position()).sum();
        self.metrics.kv_positions.store(positions, Ordering::Relaxed);
    }

    /// One step of the MAX_BATCH most urgent holders: each runs its next token, or a piece of
    /// the tokens it has not read yet, PREFILL_CHUNK positions at most in all; those whose
    /// tokens are all read then pick their next.
    fn step(&mut self, batch: &mut Batch<'_>) {
        let started = Instant::now();
        let running = self.held.len().min(MAX_BATCH);
        // Decoding sequences first, whole; then pieces of prompts, most urgent first. A prompt
        // of a more urgent class runs without the decode rows and the prompts of less urgent
        // ones, so that its first token comes as soon as on an idle server; they wait a step.
        // (With the prompts of less urgent classes beside it, a 64-position interactive prompt
        // shared a whole chunk's step with a batch-class one, twice as long as its own.)
        let urgent = self.held[..running]
            .iter()
            .filter(|(active, _)| active.tokens.len() - active.fed > 1)
            .map(|(active, _)| active.request.priority)
            .min();
        let mut ends = [0; MAX_BATCH];
        let mut decoding = false;
        for ((active, _), end) in self.held[..running].iter().zip(ends.iter_mut()) {
            let left = active.tokens.len() - active.fed;
            if left == 1 && urgent.is_none_or(|u| active.request.priority <= u) {
                *end = active.tokens.len();
                decoding = true;
            }
        }
        let mut budget = if decoding { PREFILL_BESIDE_DECODE } else { PREFILL_CHUNK };
        for ((active, _), end) in self.held[..running].iter().zip(ends.iter_mut()) {
            let left = active.tokens.len() - active.fed;
            if left > 1 && budget > 0 && urgent.is_none_or(|u| active.request.priority <= u) {
                let piece = left.min(budget);
                budget -= piece;
                *end = active.fed + piece;
            }
        }
        #[only_if(prompt_lookup)]
        let drafts = self.draft(running, &mut ends);
        #[only_if(draft_model)]
        let drafts = self.draft(running, &mut ends, batch);
        let mut runs: Vec<Run<'_>> = Vec::with_capacity(running);
        let mut members = [0; MAX_BATCH];
        for (i, ((active, sequence), &end)) in self.held[..running].iter_mut().zip(ends.iter()).enumerate() {
            if end > active.fed {
                members[runs.len()] = i;
                runs.push(Run { sequence, tokens: &active.tokens[active.fed..end] });
            }
        }
        let rows: usize = runs.iter().map(|run| run.tokens.len()).sum();
        let n = runs.len();
        // rows of each run that pick a token: its last, or a verification's
        #[only_if(speculation)]
        let mut picks = [0; MAX_BATCH];
        #[only_if(speculation)]
        for (pick, &i) in picks.iter_mut().zip(&members[..n]) {
            *pick = 1 + drafts[i];
        }
        // The logits borrow the batch, not the sequences.
        #[only_if(not(speculation))]
        let result = batch.step(&mut runs);
        #[only_if(speculation)]
        let result = batch.step_rows(&mut runs, &picks[..n]);
        drop(runs);
        let logits = match result {
            Ok(logits) => logits,
            Err(e) => {
                // The requests were checked on arrival; fail them rather than the server.
                for &i in members[..n].iter().rev() {
                    let (active, sequence) = self.held.remove(i);
                    let _ = active.request.events.send(Event::Failed(e.to_string()));
                    self.free.push(sequence);
                }
                return;
            }
        };
        self.metrics.record_step(rows, started.elapsed());
        let mut finished = Vec::new();
        for (r, &i) in members[..n].iter().enumerate() {
            // the rows of the logits that pick this run's tokens
            #[only_if(not(speculation))]
            let rows = r..r + 1;
            #[only_if(speculation)]
            let rows = {
                let first: usize = picks[..r].iter().sum();
                first..first + picks[r]
            };
            #[only_if(speculation)]
            let first = rows.start;
            #[only_if(not(speculation))]
            let active = &mut self.held[i].0;
            #[only_if(speculation)]
            let (active, sequence) = &mut self.held[i];
            active.fed = ends[i];
            // the drafted tokens leave the tokens again: each stays only as the model's pick
            #[only_if(speculation)]
            let mut drafted = [0; DRAFT_TOKENS];
            #[only_if(speculation)]
            let drafted = &mut drafted[..drafts[i]];
            #[only_if(speculation)]
            if !drafted.is_empty() {
                self.metrics.drafted_tokens.fetch_add(drafted.len() as u64, Ordering::Relaxed);
                let from = active.fed - drafted.len();
                drafted.copy_from_slice(&active.tokens[from..active.fed]);
                active.tokens.truncate(from);
                active.fed = from;
            }
            if active.fed < active.tokens.len() {
                continue;
            }
            let params = &active.request.params;
            for at in rows {
                let row = &logits[at * VOCAB_SIZE..(at + 1) * VOCAB_SIZE];
                let token = sample::<VOCAB_SIZE>(
                    row,
                    params.temperature,
                    params.top_k,
                    params.top_p,
                    active.rng.next_f32(),
                    &mut self.scratch,
                );
                // a drafted token that is the model's pick: the next row picks after it
                #[only_if(speculation)]
                let kept = drafted.get(at - first) == Some(&token);
                #[only_if(speculation)]
                if kept {
                    self.metrics.accepted_tokens.fetch_add(1, Ordering::Relaxed);
                }
                active.tokens.push(token);
                active.generated += 1;
                let now = Instant::now();
                match active.last_token {
                    None => self.metrics.time_to_first_token.observe(now - active.arrived),
                    Some(last) => self.metrics.inter_token_latency.observe(now - last),
                }
                active.last_token = Some(now);
                self.metrics.generated_tokens.fetch_add(1, Ordering::Relaxed);
                if active.request.events.send(Event::Token(token)).is_err() {
                    self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                    finished.push(i);
                    break;
                }
                // the positions the cache holds once this token is the last picked
                let held = active.tokens.len() - 1;
                let stop = if EOS_TOKEN_IDS.contains(&token) {
                    Some(StopReason::Eos)
                } else if active.generated >= params.max_tokens {
                    Some(StopReason::MaxTokens)
                } else if held == MAX_SEQ_LEN {
                    Some(StopReason::ContextFull)
                } else {
                    None
                };
                if let Some(stop) = stop {
                    let _ = active.request.events.send(Event::Done(stop));
                    self.metrics.finished.fetch_add(1, Ordering::Relaxed);
                    finished.push(i);
                    break;
                }
                #[only_if(speculation)]
                if !kept {
                    break;
                }
            }
            // the cache forgets the rows of drafted tokens that were not picked
            #[only_if(speculation)]
            {
                active.fed = active.tokens.len() - 1;
                sequence.truncate(active.fed);
            }
        }
        for &i in finished.iter().rev() {
            #[only_if(prefix_cache)]
            {
                let (active, sequence) = self.held.remove(i);
                self.keep(active.tokens, sequence);
            }
            #[only_if(not(prefix_cache))]
            {
                let (_, mut sequence) = self.held.remove(i);
                sequence.reset();
                self.free.push(sequence);
            }
        }
    }
}

/// Checks a request before it is handed over: a prompt that fits the context with room for at
/// least one new token, ids in the vocabulary, and parameters in range.
pub fn check(prompt: &[u32], params: &GenerateParams) -> Result<(), Error> {
    params.validate()?;
    check_tokens(0, prompt)?;
    if prompt.len() == MAX_SEQ_LEN {
        return Err(Error::SequenceTooLong { len: prompt.len() + 1, max: MAX_SEQ_LEN });
    }
    Ok(())
}
