//! all-MiniLM-L6-v2 sentence embeddings: the crates monogen generated for f32, bf16 and int8
//! weights against candle-transformers' BERT (f32), on the same model file and the same token
//! ids, each side in a process of its own, the sides alternating.
//!
//! `bert-vs-candle MODEL_DIR [ROUNDS]`. The sides: the three crates (2 threads), their
//! `threads = 1` twins, and candle at RAYON_NUM_THREADS=1 and 2. For each case, [`REPEATS`]
//! times over, every side in turn runs as a child process (`bert-vs-candle side NAME MODEL_DIR
//! CASE CALLS`) that loads
//! its model, warms up, and times calls back to back, as a service embeds one request after
//! another: `ROUNDS / REPEATS` of them, and more until half a second has passed. The parent prints each side's median, 10th and 90th percentiles over all its
//! calls, the cores it kept busy (CPU time over wall time), candle's median over the side's, and
//! the largest difference between the side's pooled vectors and candle's, by thread count.
//!
//! A process per side: in one process, each side's threads (a crate's thread team, rayon's
//! pool) spin for a while after each call, and the sides' weights compete for the caches, so
//! whichever side ran before would slow the side being timed.

use std::process::Command;
use std::time::{Duration, Instant};

use all_minilm_l6_v2_cpu_bf16 as ours_bf16;
use all_minilm_l6_v2_cpu_bf16_t1 as ours_bf16_t1;
use all_minilm_l6_v2_cpu_f32 as ours;
use all_minilm_l6_v2_cpu_f32_t1 as ours_t1;
use all_minilm_l6_v2_cpu_int8 as ours_int8;
use all_minilm_l6_v2_cpu_int8_t1 as ours_int8_t1;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use serde_json::{Value, json};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Times each side's process runs per case; the sides alternate between them.
const REPEATS: usize = 4;

/// The sides at each thread count; candle last.
const SIDES: [[&str; 4]; 2] = [
    ["monogen f32 1t", "monogen bf16 1t", "monogen int8 1t", "candle f32 1t"],
    ["monogen f32 2t", "monogen bf16 2t", "monogen int8 2t", "candle f32 2t"],
];

const CASES: [&str; 3] = ["short sentence", "typical sentence", "batch of 32"];

/// The sentences of a case.
fn case(name: &str) -> Vec<String> {
    match name {
        "short sentence" => vec!["The cat sat on the mat.".into()],
        "typical sentence" => vec!["The quick brown fox jumps over the lazy dog.".into()],
        _ => (0..32)
            .map(|i| match i % 4 {
                0 => "A short one.".to_string(),
                1 => "The quick brown fox jumps over the lazy dog.".to_string(),
                2 => "Rust is a systems programming language focused on safety and speed.".to_string(),
                _ => "Small specialized models doing narrow jobs are where a monomorphized runtime shines."
                    .to_string(),
            })
            .collect(),
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("side") {
        let [name, dir, case_name, calls] = &args[2..] else {
            return Err("usage: bert-vs-candle side NAME MODEL_DIR CASE CALLS".into());
        };
        return side(name, dir.as_ref(), case_name, calls.parse()?);
    }
    let dir = args.get(1).ok_or("usage: bert-vs-candle MODEL_DIR [ROUNDS]")?;
    let rounds: usize = args.get(2).map_or(Ok(20), |r| r.parse())?;
    let calls = rounds.div_ceil(REPEATS);
    let me = std::env::current_exe()?;
    let tokenizer = ours::Tokenizer::load(dir)?;

    assert_eq!((ours_t1::THREADS, ours::THREADS), (1, 2), "the crates' thread counts");
    println!(
        "all-MiniLM-L6-v2; each side in {REPEATS} alternating processes of at least {calls} calls and 0.5 s"
    );
    let sides: Vec<&str> = SIDES.concat();
    for name in CASES {
        let mut times = vec![Vec::new(); sides.len()];
        let mut cpu = vec![Duration::ZERO; sides.len()];
        let mut vectors: Vec<Vec<f32>> = vec![Vec::new(); sides.len()];
        for _ in 0..REPEATS {
            for (i, side) in sides.iter().enumerate() {
                let output =
                    Command::new(&me).args(["side", side, dir, name, &calls.to_string()]).output()?;
                if !output.status.success() {
                    return Err(format!("{side} failed: {}", String::from_utf8_lossy(&output.stderr)).into());
                }
                let report: Value = serde_json::from_slice(&output.stdout)?;
                let floats = |key: &str| -> Vec<f64> {
                    report[key]
                        .as_array()
                        .map_or(Vec::new(), |a| a.iter().filter_map(Value::as_f64).collect())
                };
                times[i].extend(floats("times_ns").into_iter().map(|ns| Duration::from_nanos(ns as u64)));
                cpu[i] += Duration::from_nanos(report["cpu_ns"].as_u64().unwrap_or(0));
                vectors[i] = floats("vectors").into_iter().map(|v| v as f32).collect();
            }
        }
        let texts = case(name);
        let tokens: usize = texts.iter().map(|t| tokenizer.encode(t).map_or(0, |ids| ids.len())).sum();
        println!(
            "{name} ({} sentence{}, {tokens} tokens):",
            texts.len(),
            if texts.len() == 1 { "" } else { "s" }
        );
        for (i, side) in sides.iter().enumerate() {
            // candle at the same thread count: the last side of this side's row of SIDES.
            let row = SIDES[0].len();
            let candle = i / row * row + row - 1;
            let m_candle = percentile(&times[candle], 0.5);
            let m = percentile(&times[i], 0.5);
            let busy = cpu[i].as_secs_f64() / times[i].iter().sum::<Duration>().as_secs_f64();
            let diff =
                vectors[i].iter().zip(&vectors[candle]).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            println!(
                "  {side:<16} {:>9.3} ms [{:.3}, {:.3}] {busy:.2} cores | candle/this {:.2}x | max abs diff from candle {diff:.1e}",
                ms(m),
                ms(percentile(&times[i], 0.1)),
                ms(percentile(&times[i], 0.9)),
                m_candle.as_secs_f64() / m.as_secs_f64(),
            );
        }
    }
    Ok(())
}

/// A boxed embedding function over one of our crates, which owns its model (leaked: the child
/// exits when done).
macro_rules! embedder {
    ($krate:ident, $dir:expr) => {{
        let model: &'static $krate::Model = Box::leak(Box::new($krate::Model::load($dir)?));
        let mut encoder = model.encoder();
        Box::new(move |ids: &[Vec<u32>]| Ok(encoder.embed(ids)?))
    }};
}

/// A child: loads one side, embeds the case's sentences `calls` times back to back after a
/// warm-up, and prints the times, the CPU time they took and the pooled vectors as JSON.
fn side(name: &str, dir: &std::path::Path, case_name: &str, calls: usize) -> Result<()> {
    let tokenizer = ours::Tokenizer::load(dir)?;
    let ids: Vec<Vec<u32>> =
        case(case_name).iter().map(|t| tokenizer.encode(t)).collect::<std::result::Result<_, _>>()?;
    let mut embed: Box<dyn FnMut(&[Vec<u32>]) -> Result<Vec<Vec<f32>>>> = match name {
        "monogen f32 2t" => embedder!(ours, dir),
        "monogen bf16 2t" => embedder!(ours_bf16, dir),
        "monogen int8 2t" => embedder!(ours_int8, dir),
        "monogen f32 1t" => embedder!(ours_t1, dir),
        "monogen bf16 1t" => embedder!(ours_bf16_t1, dir),
        "monogen int8 1t" => embedder!(ours_int8_t1, dir),
        "candle f32 1t" | "candle f32 2t" => {
            // rayon sizes its pool from this at its first use.
            // SAFETY: no other thread runs yet.
            unsafe { std::env::set_var("RAYON_NUM_THREADS", if name.ends_with("1t") { "1" } else { "2" }) };
            let config: Config = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
            // SAFETY: the weights file is not modified while it is mapped.
            let vb = unsafe {
                VarBuilder::from_mmaped_safetensors(
                    &[dir.join("model.safetensors")],
                    DType::F32,
                    &Device::Cpu,
                )?
            };
            let bert = BertModel::load(vb, &config)?;
            Box::new(move |ids| candle_embed(&bert, ids))
        }
        other => return Err(format!("no side `{other}`").into()),
    };
    let vectors = embed(&ids)?;
    for _ in 0..3 {
        embed(&ids)?;
    }
    // At least `calls` calls and half a second, so that the CPU time (in ticks of 10 ms) is
    // measured over many ticks.
    let cpu_before = cpu_time();
    let begun = Instant::now();
    let mut times = Vec::with_capacity(calls);
    while times.len() < calls || begun.elapsed() < Duration::from_millis(500) {
        let start = Instant::now();
        embed(&ids)?;
        times.push(start.elapsed().as_nanos() as u64);
    }
    let cpu = cpu_time().saturating_sub(cpu_before);
    let report = json!({
        "times_ns": times,
        "cpu_ns": cpu.as_nanos() as u64,
        "vectors": vectors.concat(),
    });
    println!("{report}");
    Ok(())
}

/// Mean-pooled embeddings with candle: the sentences padded to the longest, the padding masked
/// in attention and in the mean.
fn candle_embed(bert: &BertModel, batch: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
    let longest = batch.iter().map(Vec::len).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(batch.len() * longest);
    let mut mask = Vec::with_capacity(batch.len() * longest);
    for sentence in batch {
        for i in 0..longest {
            ids.push(sentence.get(i).copied().unwrap_or(0));
            mask.push(u32::from(i < sentence.len()));
        }
    }
    let shape = (batch.len(), longest);
    let ids = Tensor::from_vec(ids, shape, &Device::Cpu)?;
    let mask = Tensor::from_vec(mask, shape, &Device::Cpu)?;
    let types = ids.zeros_like()?;
    let states = bert.forward(&ids, &types, Some(&mask))?;
    let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
    let pooled = states.broadcast_mul(&mask)?.sum(1)?.broadcast_div(&mask.sum(1)?)?;
    Ok(pooled.to_vec2()?)
}

/// This process's CPU time from /proc/self/stat (utime + stime, in clock ticks of 10 ms).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks: u64 = fields.get(11..13).map_or(0, |f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum());
    Duration::from_millis(ticks * 10)
}

fn percentile(values: &[Duration], q: f64) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    sorted[((q * sorted.len() as f64) as usize).min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
