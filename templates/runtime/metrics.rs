//! What the server counts, and `GET /metrics`'s Prometheus text of it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::http::{Answered, Histogram, write_info, write_metric};
use crate::{KV_SLOTS, MAX_SEQ_LEN};

/// The server's counters, gauges and histograms, which the engine and the handlers update.
pub struct Metrics {
    started: Instant,
    /// Requests by endpoint and status code.
    requests: Answered,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub finished: AtomicU64,
    pub cancelled: AtomicU64,
    pub evicted: AtomicU64,
    pub steps: AtomicU64,
    pub step_rows: AtomicU64,
    pub step_nanos: AtomicU64,
    pub running: AtomicUsize,
    pub waiting: AtomicUsize,
    pub kv_slots_used: AtomicUsize,
    pub kv_positions: AtomicUsize,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    /// The prefix cache: requests that took a kept cache, those that found none, the kept
    /// caches given up for room, and the prompt positions not read again.
    #[only_if(prefix_cache)]
    pub prefix_hits: AtomicU64,
    #[only_if(prefix_cache)]
    pub prefix_misses: AtomicU64,
    #[only_if(prefix_cache)]
    pub prefix_evictions: AtomicU64,
    #[only_if(prefix_cache)]
    pub prefix_reused_tokens: AtomicU64,
    /// Speculation: tokens drafted, and drafted tokens the model picked too.
    #[only_if(speculation)]
    pub drafted_tokens: AtomicU64,
    #[only_if(speculation)]
    pub accepted_tokens: AtomicU64,
    /// Positions the draft model ran: its sequences' tokens and its drafts.
    #[only_if(draft_model)]
    pub draft_positions: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            started: Instant::now(),
            requests: Answered::default(),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            steps: AtomicU64::new(0),
            step_rows: AtomicU64::new(0),
            step_nanos: AtomicU64::new(0),
            running: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            kv_slots_used: AtomicUsize::new(0),
            kv_positions: AtomicUsize::new(0),
            time_to_first_token: Histogram::default(),
            inter_token_latency: Histogram::default(),
            #[only_if(prefix_cache)]
            prefix_hits: AtomicU64::new(0),
            #[only_if(prefix_cache)]
            prefix_misses: AtomicU64::new(0),
            #[only_if(prefix_cache)]
            prefix_evictions: AtomicU64::new(0),
            #[only_if(prefix_cache)]
            prefix_reused_tokens: AtomicU64::new(0),
            #[only_if(speculation)]
            drafted_tokens: AtomicU64::new(0),
            #[only_if(speculation)]
            accepted_tokens: AtomicU64::new(0),
            #[only_if(draft_model)]
            draft_positions: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// One answered request.
    pub fn request(&self, endpoint: &'static str, status: u16) {
        self.requests.count(endpoint, status);
    }

    /// One engine step of `rows` positions.
    pub fn record_step(&self, rows: usize, elapsed: Duration) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.step_rows.fetch_add(rows as u64, Ordering::Relaxed);
        self.step_nanos.fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut gauge = |name: &str, help: &str, value: f64| write_metric(&mut out, "gauge", name, help, value);
        let uptime = self.started.elapsed().as_secs_f64();
        let generated = self.generated_tokens.load(Ordering::Relaxed);
        gauge("monogen_up_seconds", "Seconds since the server started.", uptime);
        gauge(
            "monogen_queue_depth",
            "Requests waiting for a place in the batch (new, or displaced by a more urgent one).",
            self.waiting.load(Ordering::Relaxed) as f64,
        );
        gauge("monogen_running_sequences", "Sequences in the running batch.", self.running.load(Ordering::Relaxed) as f64);
        gauge(
            "monogen_kv_slots_used",
            "KV caches held by requests.",
            self.kv_slots_used.load(Ordering::Relaxed) as f64,
        );
        gauge("monogen_kv_slots", "KV caches the server holds at most.", KV_SLOTS as f64);
        let positions = self.kv_positions.load(Ordering::Relaxed);
        gauge(
            "monogen_kv_cache_usage_ratio",
            "Positions held in KV caches, over what all KV slots hold.",
            positions as f64 / (KV_SLOTS * MAX_SEQ_LEN) as f64,
        );
        gauge(
            "monogen_kv_cache_positions",
            "Positions held in KV caches.",
            positions as f64,
        );
        gauge(
            "monogen_generation_tokens_per_second",
            "Generated tokens per second since the server started.",
            if uptime > 0.0 { generated as f64 / uptime } else { 0.0 },
        );
        let mut counter = |name: &str, help: &str, value: u64| write_metric(&mut out, "counter", name, help, value as f64);
        counter("monogen_prompt_tokens_total", "Prompt tokens read.", self.prompt_tokens.load(Ordering::Relaxed));
        counter("monogen_generation_tokens_total", "Tokens generated.", generated);
        counter("monogen_requests_finished_total", "Requests that ran to their end.", self.finished.load(Ordering::Relaxed));
        counter(
            "monogen_requests_cancelled_total",
            "Requests whose client went away before their end.",
            self.cancelled.load(Ordering::Relaxed),
        );
        counter(
            "monogen_preemptions_total",
            "KV caches given up to a more urgent request.",
            self.evicted.load(Ordering::Relaxed),
        );
        #[only_if(prefix_cache)]
        {
            counter(
                "monogen_prefix_cache_hits_total",
                "Requests that took a finished request's KV cache holding the start of their prompt.",
                self.prefix_hits.load(Ordering::Relaxed),
            );
            counter(
                "monogen_prefix_cache_misses_total",
                "Requests that found no kept KV cache holding the start of their prompt.",
                self.prefix_misses.load(Ordering::Relaxed),
            );
            counter(
                "monogen_prefix_cache_evictions_total",
                "Kept KV caches given up to make room.",
                self.prefix_evictions.load(Ordering::Relaxed),
            );
            counter(
                "monogen_prefix_cache_reused_tokens_total",
                "Prompt positions taken from kept KV caches instead of read again.",
                self.prefix_reused_tokens.load(Ordering::Relaxed),
            );
        }
        #[only_if(speculation)]
        {
            counter(
                "monogen_speculation_drafted_tokens_total",
                "Tokens the speculator drafted for the model to verify.",
                self.drafted_tokens.load(Ordering::Relaxed),
            );
            counter(
                "monogen_speculation_accepted_tokens_total",
                "Drafted tokens the model picked too, which took no step of their own.",
                self.accepted_tokens.load(Ordering::Relaxed),
            );
        }
        #[only_if(draft_model)]
        counter(
            "monogen_draft_model_positions_total",
            "Positions the draft model ran: its sequences' tokens and its drafts.",
            self.draft_positions.load(Ordering::Relaxed),
        );
        counter("monogen_steps_total", "Engine steps.", self.steps.load(Ordering::Relaxed));
        counter("monogen_step_positions_total", "Positions run by engine steps.", self.step_rows.load(Ordering::Relaxed));
        write_metric(
            &mut out,
            "counter",
            "monogen_step_seconds_total",
            "Time spent in engine steps.",
            self.step_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        );
        self.requests.write(&mut out);
        self.time_to_first_token.write(
            &mut out,
            "monogen_time_to_first_token_seconds",
            "From a request's arrival to its first token.",
        );
        self.inter_token_latency.write(
            &mut out,
            "monogen_inter_token_latency_seconds",
            "Between two tokens of one request.",
        );
        write_info(&mut out);
        out
    }
}
