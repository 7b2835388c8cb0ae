//! Times the implementations of the f32 LLaMA interfaces that have more than one (matmul, the
//! attentions and KV caches over f32 and bfloat16, rmsnorm, rope, swiglu, sampler; the bf16
//! and int8 products are timed by `benches/weights.rs`), at the shapes of the default workload, stories260k: hidden 64, intermediate 172, 8 query heads and 4 kv heads
//! of 8, vocabulary 512, 5 layers, a 128-token prompt (prefill, rows = 128) and decode steps
//! (rows = 1) at context 192.
//!
//! Candidates are warmed up, then timed in interleaved rounds (each round times every
//! candidate once, in batches of about a millisecond), so that a slow phase of the machine
//! hits all of them alike. Each shape reports the median time per call, the spread of the
//! rounds (10th and 90th percentile relative to the median) and the ratio of the reference's
//! time to each candidate's; each interface ends with the total over one forward pass, every
//! shape weighted by the number of times a pass calls it.
//!
//! `cargo bench -p monogen-kernel-tests --bench kernels`; without `--bench` (as `cargo test
//! --benches` runs it) it does a quick smoke run.

use std::hint::black_box;
use std::rc::Rc;
use std::time::{Duration, Instant};

use monogen_kernel_tests::check::cached;
use monogen_kernel_tests::rng::Rng;
use monogen_kernel_tests::{
    for_each_attention_decode_bf16, for_each_attention_decode_f32, for_each_attention_prefill_bf16,
    for_each_attention_prefill_f32, for_each_kv_cache_bf16, for_each_kv_cache_f32, for_each_matmul_f32,
    for_each_rmsnorm, for_each_rope, for_each_sampler, for_each_swiglu, kernels,
};

// The shapes of stories260k.
const DIM: usize = 64;
const HIDDEN: usize = 172;
const N_HEADS: usize = 8;
const N_KV_HEADS: usize = 4;
const HEAD_DIM: usize = 8;
const KV_DIM: usize = N_KV_HEADS * HEAD_DIM;
const VOCAB: usize = 512;
const LAYERS: usize = 5;
const PROMPT: usize = 128;
const CONTEXT: usize = 192;
const MAX_SEQ: usize = 256;
const ROPE_THETA: f32 = 10_000.0;

/// One implementation, ready to run once on its own copy of the inputs.
struct Candidate {
    name: &'static str,
    available: bool,
    run: Box<dyn FnMut()>,
}

impl Candidate {
    fn new(name: &'static str, available: bool, run: impl FnMut() + 'static) -> Self {
        Self { name, available, run: Box::new(run) }
    }
}

/// One shape of an interface, and how many times a forward pass runs it.
struct Case {
    label: String,
    calls: usize,
    candidates: Vec<Candidate>,
}

/// Cases that add up to one forward pass (of the prompt, or of one decode step).
struct Group {
    title: String,
    cases: Vec<Case>,
}

/// Nanoseconds per call.
struct Stats {
    median: f64,
    p10: f64,
    p90: f64,
}

/// Builds the groups of one interface, with a candidate for each of its implementations.
type BuildGroups = fn() -> Vec<Group>;

struct Timing {
    /// Whether the numbers mean anything (optimised, full length), and so deserve a verdict.
    full: bool,
    warm_up: Duration,
    sample: Duration,
    rounds: usize,
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let timing = if full {
        Timing { full, warm_up: Duration::from_millis(20), sample: Duration::from_millis(1), rounds: 51 }
    } else {
        Timing { full, warm_up: Duration::from_millis(1), sample: Duration::from_micros(100), rounds: 3 }
    };
    println!(
        "monogen kernels at the shapes of stories260k: hidden {DIM}, intermediate {HIDDEN}, {N_HEADS} heads / {N_KV_HEADS} kv heads of {HEAD_DIM}, vocab {VOCAB}, {LAYERS} layers"
    );
    println!(
        "median per call [10th, 90th percentile of {} rounds]; ratio = reference time / candidate time",
        timing.rounds
    );
    if !full {
        println!("(smoke run: pass --bench, as `cargo bench` does, for real numbers)");
    }

    let interfaces: [(&str, BuildGroups); 11] = [
        ("matmul", matmul_groups),
        ("attention_prefill", attention_prefill),
        ("attention_decode", attention_decode),
        ("attention_prefill<bf16>", attention_prefill_bf16),
        ("attention_decode<bf16>", attention_decode_bf16),
        ("rmsnorm", rmsnorm_groups),
        ("rope", rope_groups),
        ("swiglu", swiglu_groups),
        ("kv_cache", kv_cache),
        ("kv_cache<bf16>", kv_cache_bf16),
        ("sampler", sampler_groups),
    ];
    let mut summary = Vec::new();
    let mut single = Vec::new();
    for (interface, groups) in interfaces {
        let mut groups = groups();
        let names: Vec<&str> = groups[0].cases[0].candidates.iter().map(|c| c.name).collect();
        if names.len() < 2 {
            single.push(format!("{interface} ({})", names.join(", ")));
            continue;
        }
        for group in &mut groups {
            summary.extend(bench_group(interface, group, &timing));
        }
    }
    if !single.is_empty() {
        println!("\nnot compared, one implementation each: {}", single.join(", "));
    }
    println!("\nforward-pass totals, reference / candidate:");
    for line in summary {
        println!("  {line}");
    }
}

/// Times and prints one group; returns its summary lines.
fn bench_group(interface: &str, group: &mut Group, timing: &Timing) -> Vec<String> {
    let names: Vec<&'static str> = group.cases[0].candidates.iter().map(|c| c.name).collect();
    let reference = names[0];
    println!("\n{interface}, {}", group.title);
    let mut header = format!("  {:<30} {:>5}", "shape", "calls");
    for name in &names {
        header += &format!("  {name:>26}");
    }
    for name in &names[1..] {
        header += &format!("  {:>14}", format!("{reference}/{name}"));
    }
    println!("{header}");

    let mut totals = vec![Some(0.0f64); names.len()];
    for case in &mut group.cases {
        let stats = measure(&mut case.candidates, timing);
        let mut line = format!("  {:<30} {:>5}", case.label, case.calls);
        for (s, total) in stats.iter().zip(&mut totals) {
            match s {
                Some(s) => {
                    let spread =
                        format!("[{:+.0}%, {:+.0}%]", percent(s.p10, s.median), percent(s.p90, s.median));
                    line += &format!("  {:>12} {:>13}", format_time(s.median), spread);
                    *total = total.map(|t| t + s.median * case.calls as f64);
                }
                None => {
                    line += &format!("  {:>26}", "skipped: CPU lacks features");
                    *total = None;
                }
            }
        }
        for s in &stats[1..] {
            match (&stats[0], s) {
                (Some(r), Some(s)) => line += &format!("  {:>13.2}x", r.median / s.median),
                _ => line += &format!("  {:>14}", "-"),
            }
        }
        println!("{line}");
    }

    let mut line = format!("  {:<30} {:>5}", "forward pass", "");
    for total in &totals {
        line += &format!("  {:>26}", total.map_or("-".to_string(), format_time));
    }
    let mut summary = Vec::new();
    for (name, total) in names.iter().zip(&totals).skip(1) {
        match (totals[0], total) {
            (Some(r), Some(t)) => {
                line += &format!("  {:>13.2}x", r / t);
                let verdict = if !timing.full || r / t >= 2.0 { "" } else { "  (below the 2x goal)" };
                summary.push(format!(
                    "{interface:<18} {:<26} {reference} {:>10}  {name} {:>10}  {:>6.2}x{verdict}",
                    group.title,
                    format_time(r),
                    format_time(*t),
                    r / t
                ));
            }
            _ => line += &format!("  {:>14}", "-"),
        }
    }
    println!("{line}");
    summary
}

/// Warms every candidate up, then times them in interleaved rounds.
fn measure(candidates: &mut [Candidate], timing: &Timing) -> Vec<Option<Stats>> {
    let batches: Vec<usize> = candidates
        .iter_mut()
        .map(|c| {
            if !c.available {
                return 0;
            }
            let start = Instant::now();
            let mut calls = 0usize;
            while start.elapsed() < timing.warm_up || calls == 0 {
                (c.run)();
                calls += 1;
            }
            let per_call = start.elapsed().as_secs_f64() / calls as f64;
            ((timing.sample.as_secs_f64() / per_call).ceil() as usize).max(1)
        })
        .collect();
    let mut samples = vec![Vec::with_capacity(timing.rounds); candidates.len()];
    for _ in 0..timing.rounds {
        for ((candidate, &batch), samples) in candidates.iter_mut().zip(&batches).zip(&mut samples) {
            if batch == 0 {
                continue;
            }
            let start = Instant::now();
            for _ in 0..batch {
                (candidate.run)();
            }
            samples.push(start.elapsed().as_secs_f64() * 1e9 / batch as f64);
        }
    }
    samples
        .into_iter()
        .map(|mut s| {
            if s.is_empty() {
                return None;
            }
            s.sort_by(f64::total_cmp);
            let at = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
            Some(Stats { median: at(0.5), p10: at(0.1), p90: at(0.9) })
        })
        .collect()
}

fn percent(value: f64, median: f64) -> f64 {
    (value / median - 1.0) * 100.0
}

fn format_time(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.1} ns")
    } else if ns < 1e6 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{:.2} ms", ns / 1e6)
    }
}

fn matmul_groups() -> Vec<Group> {
    [(1, "decode step (rows = 1)"), (PROMPT, "prefill (rows = 128)")]
        .into_iter()
        .map(|(rows, title)| Group {
            title: title.to_string(),
            cases: vec![
                matmul_case::<DIM, DIM>("q/o-proj", 2 * LAYERS, rows),
                matmul_case::<KV_DIM, DIM>("k/v-proj", 2 * LAYERS, rows),
                matmul_case::<HIDDEN, DIM>("gate/up-proj", 2 * LAYERS, rows),
                matmul_case::<DIM, HIDDEN>("down-proj", LAYERS, rows),
                matmul_case::<VOCAB, DIM>("lm_head", 1, rows),
            ],
        })
        .collect()
}

fn matmul_case<const N: usize, const K: usize>(name: &str, calls: usize, rows: usize) -> Case {
    let mut rng = Rng::for_shape(&[N, K, rows]);
    let x = Rc::new(rng.vec(rows * K, 1.0));
    let w = Rc::new(rng.vec(N * K, 1.0));
    let mut candidates = Vec::new();
    macro_rules! candidate {
        ($name:literal, $module:ident, $available:expr) => {{
            let x = Rc::clone(&x);
            let w = monogen_kernel_tests::matmul_f32_weights::$module(&w, N, K);
            let mut out = vec![0.0; rows * N];
            candidates.push(Candidate::new($name, $available, move || {
                kernels::$module::matmul::<N, K>(
                    black_box(&mut out),
                    black_box(&x),
                    black_box(&w),
                    black_box(rows),
                )
            }));
        }};
    }
    for_each_matmul_f32!(candidate);
    Case { label: format!("{name} N={N} K={K}"), calls, candidates }
}

/// The attention and KV cache groups of a cache of f32 (`attention_prefill`, ...) or of
/// bfloat16 (`attention_prefill<bf16>`, ...): the same inputs, each cached value rounded to the
/// cache's type.
macro_rules! cache_groups {
    ($elem:ty, $prefill:ident, $for_each_prefill:ident, $decode:ident, $for_each_decode:ident, $kv_cache:ident, $for_each_kv_cache:ident) => {
        fn $prefill() -> Vec<Group> {
            let mut rng = Rng::new(11);
            let q = Rc::new(rng.vec(PROMPT * N_HEADS * HEAD_DIM, 2.0));
            let keys = Rc::new(cached::<$elem>(rng.vec(PROMPT * KV_DIM, 2.0)));
            let values = Rc::new(cached::<$elem>(rng.vec(PROMPT * KV_DIM, 1.0)));
            let mut candidates = Vec::new();
            macro_rules! candidate {
                ($name:literal, $module:ident, $available:expr) => {{
                    let (q, keys, values) = (Rc::clone(&q), Rc::clone(&keys), Rc::clone(&values));
                    let mut out = vec![0.0; PROMPT * N_HEADS * HEAD_DIM];
                    let mut scores = vec![0.0; PROMPT];
                    candidates.push(Candidate::new($name, $available, move || {
                        kernels::$module::attention_prefill::<N_HEADS, N_KV_HEADS, HEAD_DIM>(
                            black_box(&mut out),
                            black_box(&q),
                            black_box(&keys),
                            black_box(&values),
                            black_box(&mut scores),
                            black_box(0),
                            black_box(PROMPT),
                        )
                    }));
                }};
            }
            $for_each_prefill!(candidate);
            let case = Case { label: format!("start=0 rows={PROMPT}"), calls: LAYERS, candidates };
            vec![Group { title: "prefill (rows = 128)".to_string(), cases: vec![case] }]
        }

        fn $decode() -> Vec<Group> {
            let mut rng = Rng::new(12);
            let q = Rc::new(rng.vec(N_HEADS * HEAD_DIM, 2.0));
            let keys = Rc::new(cached::<$elem>(rng.vec(CONTEXT * KV_DIM, 2.0)));
            let values = Rc::new(cached::<$elem>(rng.vec(CONTEXT * KV_DIM, 1.0)));
            let mut candidates = Vec::new();
            macro_rules! candidate {
                ($name:literal, $module:ident, $available:expr) => {{
                    let (q, keys, values) = (Rc::clone(&q), Rc::clone(&keys), Rc::clone(&values));
                    let mut out = vec![0.0; N_HEADS * HEAD_DIM];
                    let mut scores = vec![0.0; CONTEXT];
                    candidates.push(Candidate::new($name, $available, move || {
                        kernels::$module::attention_decode::<N_HEADS, N_KV_HEADS, HEAD_DIM>(
                            black_box(&mut out),
                            black_box(&q),
                            black_box(&keys),
                            black_box(&values),
                            black_box(&mut scores),
                        )
                    }));
                }};
            }
            $for_each_decode!(candidate);
            let case = Case { label: format!("len={CONTEXT}"), calls: LAYERS, candidates };
            vec![Group { title: "decode step (rows = 1)".to_string(), cases: vec![case] }]
        }

        fn $kv_cache() -> Vec<Group> {
            [(1, CONTEXT - 1, "decode step (rows = 1)"), (PROMPT, 0, "prefill (rows = 128)")]
                .into_iter()
                .map(|(rows, start, title)| {
                    let mut rng = Rng::new(16);
                    let k = Rc::new(rng.vec(rows * KV_DIM, 1.0));
                    let v = Rc::new(rng.vec(rows * KV_DIM, 1.0));
                    let mut candidates = Vec::new();
                    macro_rules! candidate {
                        ($name:literal, $module:ident, $available:expr) => {{
                            let (k, v) = (Rc::clone(&k), Rc::clone(&v));
                            let mut cache = kernels::$module::KvCache::<MAX_SEQ, KV_DIM>::new();
                            candidates.push(Candidate::new($name, $available, move || {
                                cache.store(black_box(start), black_box(&k), black_box(&v));
                                black_box((cache.keys(start + rows), cache.values(start + rows)));
                            }));
                        }};
                    }
                    $for_each_kv_cache!(candidate);
                    let case =
                        Case { label: "store, then keys and values".to_string(), calls: LAYERS, candidates };
                    Group { title: title.to_string(), cases: vec![case] }
                })
                .collect()
        }
    };
}

cache_groups!(
    f32,
    attention_prefill,
    for_each_attention_prefill_f32,
    attention_decode,
    for_each_attention_decode_f32,
    kv_cache,
    for_each_kv_cache_f32
);
cache_groups!(
    u16,
    attention_prefill_bf16,
    for_each_attention_prefill_bf16,
    attention_decode_bf16,
    for_each_attention_decode_bf16,
    kv_cache_bf16,
    for_each_kv_cache_bf16
);

fn rmsnorm_groups() -> Vec<Group> {
    [(1, "decode step (rows = 1)"), (PROMPT, "prefill (rows = 128)")]
        .into_iter()
        .map(|(rows, title)| {
            let mut rng = Rng::new(13);
            let x = Rc::new(rng.vec(rows * DIM, 1.0));
            let weight = Rc::new(rng.vec(DIM, 1.0));
            let mut candidates = Vec::new();
            macro_rules! candidate {
                ($name:literal, $module:ident, $available:expr) => {{
                    let (x, weight) = (Rc::clone(&x), Rc::clone(&weight));
                    let mut out = vec![0.0; rows * DIM];
                    candidates.push(Candidate::new($name, $available, move || {
                        kernels::$module::rmsnorm::<DIM>(
                            black_box(&mut out),
                            black_box(&x),
                            black_box(&weight),
                            1e-5,
                            black_box(rows),
                        )
                    }));
                }};
            }
            for_each_rmsnorm!(candidate);
            let case = Case { label: format!("DIM={DIM}"), calls: 2 * LAYERS + 1, candidates };
            Group { title: title.to_string(), cases: vec![case] }
        })
        .collect()
}

fn rope_groups() -> Vec<Group> {
    [(1, CONTEXT - 1, "decode step (rows = 1)"), (PROMPT, 0, "prefill (rows = 128)")]
        .into_iter()
        .map(|(rows, start, title)| Group {
            title: title.to_string(),
            cases: vec![rope_case::<N_HEADS>("q", rows, start), rope_case::<N_KV_HEADS>("k", rows, start)],
        })
        .collect()
}

fn rope_case<const HEADS: usize>(name: &str, rows: usize, start: usize) -> Case {
    let x = Rng::new(14).vec(rows * HEADS * HEAD_DIM, 1.0);
    let mut candidates = Vec::new();
    macro_rules! candidate {
        ($name:literal, $module:ident, $available:expr) => {{
            let (cos, sin) = kernels::$module::rope_table::<HEAD_DIM>(ROPE_THETA, MAX_SEQ);
            let mut x = x.clone();
            candidates.push(Candidate::new($name, $available, move || {
                kernels::$module::rope::<HEADS, HEAD_DIM>(
                    black_box(&mut x),
                    black_box(&cos),
                    black_box(&sin),
                    start,
                    rows,
                )
            }));
        }};
    }
    for_each_rope!(candidate);
    Case { label: format!("{name}, {HEADS} heads"), calls: LAYERS, candidates }
}

fn swiglu_groups() -> Vec<Group> {
    [(1, "decode step (rows = 1)"), (PROMPT, "prefill (rows = 128)")]
        .into_iter()
        .map(|(rows, title)| {
            let mut rng = Rng::new(15);
            let gate = Rc::new(rng.vec(rows * HIDDEN, 4.0));
            let up = Rc::new(rng.vec(rows * HIDDEN, 1.0));
            let mut candidates = Vec::new();
            macro_rules! candidate {
                ($name:literal, $module:ident, $available:expr) => {{
                    let (gate, up) = (Rc::clone(&gate), Rc::clone(&up));
                    let mut out = gate.to_vec();
                    candidates.push(Candidate::new($name, $available, move || {
                        // Every call starts from the same gate, so that the values stay in range.
                        out.copy_from_slice(&gate);
                        kernels::$module::swiglu::<HIDDEN>(
                            black_box(&mut out),
                            black_box(&up),
                            black_box(rows),
                        )
                    }));
                }};
            }
            for_each_swiglu!(candidate);
            let case = Case { label: format!("HIDDEN={HIDDEN}"), calls: LAYERS, candidates };
            Group { title: title.to_string(), cases: vec![case] }
        })
        .collect()
}

fn sampler_groups() -> Vec<Group> {
    let logits = Rc::new(Rng::new(17).vec(VOCAB, 4.0));
    let mut candidates = Vec::new();
    macro_rules! candidate {
        ($name:literal, $module:ident, $available:expr) => {{
            let logits = Rc::clone(&logits);
            let mut scratch = Vec::new();
            candidates.push(Candidate::new($name, $available, move || {
                black_box(kernels::$module::sample::<VOCAB>(
                    black_box(&logits),
                    0.8,
                    40,
                    0.9,
                    0.5,
                    &mut scratch,
                ));
            }));
        }};
    }
    for_each_sampler!(candidate);
    let case = Case { label: "temperature 0.8, top-k 40, top-p 0.9".to_string(), calls: 1, candidates };
    vec![Group { title: "decode step".to_string(), cases: vec![case] }]
}
