//! What the server counts, and `GET /metrics`'s Prometheus text of it.

use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::{KV_SLOTS, MAX_SEQ_LEN, WORKLOAD};

/// Upper bounds of the latency histograms' buckets, in seconds.
const BUCKETS: [f64; 14] = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0];

/// A latency histogram: counts per bucket (the last one above every bound), and the sum.
pub struct Histogram {
    counts: Mutex<([u64; BUCKETS.len() + 1], f64)>,
}

impl Histogram {
    fn new() -> Histogram {
        Histogram { counts: Mutex::new(([0; BUCKETS.len() + 1], 0.0)) }
    }

    pub fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let bucket = BUCKETS.iter().position(|&b| seconds <= b).unwrap_or(BUCKETS.len());
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.0[bucket] += 1;
        counts.1 += seconds;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let (counts, sum) = *self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut total = 0;
        for (bound, count) in BUCKETS.iter().zip(counts) {
            total += count;
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {total}");
        }
        total += counts[BUCKETS.len()];
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {total}\n{name}_sum {sum}\n{name}_count {total}");
    }
}

/// The server's counters, gauges and histograms, which the engine and the handlers update.
pub struct Metrics {
    started: Instant,
    /// Requests by endpoint and status code.
    requests: Mutex<Vec<(&'static str, u16, u64)>>,
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
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            started: Instant::now(),
            requests: Mutex::new(Vec::new()),
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
            time_to_first_token: Histogram::new(),
            inter_token_latency: Histogram::new(),
        }
    }
}

impl Metrics {
    /// One answered request.
    pub fn request(&self, endpoint: &'static str, status: u16) {
        let mut requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        match requests.iter_mut().find(|(e, s, _)| *e == endpoint && *s == status) {
            Some((_, _, count)) => *count += 1,
            None => requests.push((endpoint, status, 1)),
        }
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
        let mut gauge = |name: &str, help: &str, value: f64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
        };
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
        let mut counter = |name: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
        };
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
        counter("monogen_steps_total", "Engine steps.", self.steps.load(Ordering::Relaxed));
        counter("monogen_step_positions_total", "Positions run by engine steps.", self.step_rows.load(Ordering::Relaxed));
        let _ = writeln!(
            out,
            "# HELP monogen_step_seconds_total Time spent in engine steps.\n# TYPE monogen_step_seconds_total counter\nmonogen_step_seconds_total {}",
            self.step_nanos.load(Ordering::Relaxed) as f64 / 1e9
        );
        let _ = writeln!(out, "# HELP monogen_http_requests_total HTTP requests answered, by endpoint and status.");
        let _ = writeln!(out, "# TYPE monogen_http_requests_total counter");
        let requests = self.requests.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for (endpoint, status, count) in requests {
            let _ = writeln!(out, "monogen_http_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {count}");
        }
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
        let _ = writeln!(out, "# HELP monogen_info The workload this server was generated for.\n# TYPE monogen_info gauge\nmonogen_info{{workload=\"{WORKLOAD}\"}} 1");
        out
    }
}
