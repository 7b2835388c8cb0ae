//! all-MiniLM-L6-v2 sentence embeddings: the crates monogen generated for f32, bf16 and int8
//! weights against candle-transformers' BERT (f32), on the same model file and the same token
//! ids, in one process, interleaved round by round.
//!
//! `bert-vs-candle MODEL_DIR [ROUNDS]`. Each case first compares every side's mean-pooled
//! vectors with candle's, then runs `ROUNDS` rounds; a round gives each side in turn a block of
//! [`BLOCK`] calls, back to back as a service embeds one request after another, and times all
//! but the block's first call. It prints each side's median, 10th and 90th percentiles over
//! every timed call, and candle's median over the side's. candle's thread count comes from
//! RAYON_NUM_THREADS; the CPU time over wall time of each side shows how many cores it really
//! kept busy.
//!
//! Blocks rather than single calls: the sides share the process, and each keeps threads that
//! spin for a while after a call (each crate's thread team, rayon's pool). Alternating single
//! calls would time each side against the spinning threads of the side before it; a 2 ms pause
//! before each block lets those sleep, and the untimed first call wakes the side's own.

use std::time::{Duration, Instant};

use all_minilm_l6_v2_cpu_bf16 as ours_bf16;
use all_minilm_l6_v2_cpu_f32 as ours;
use all_minilm_l6_v2_cpu_int8 as ours_int8;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Calls per side per round; the first of each block is not timed.
const BLOCK: usize = 6;

/// One side of the race: its name and its embedding of a batch of token ids.
struct Side<'a> {
    name: &'static str,
    embed: Box<dyn FnMut(&[Vec<u32>]) -> Result<Vec<Vec<f32>>> + 'a>,
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(args.get(1).ok_or("usage: bert-vs-candle MODEL_DIR [ROUNDS]")?);
    let rounds: usize = args.get(2).map_or(Ok(40), |r| r.parse())?;

    let tokenizer = ours::Tokenizer::load(&dir)?;
    let (f32_model, bf16_model, int8_model) =
        (ours::Model::load(&dir)?, ours_bf16::Model::load(&dir)?, ours_int8::Model::load(&dir)?);
    let (mut f32_encoder, mut bf16_encoder, mut int8_encoder) =
        (f32_model.encoder(), bf16_model.encoder(), int8_model.encoder());

    let config: Config = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
    // SAFETY: the weights file is not modified while it is mapped.
    let vb = unsafe {
        VarBuilder::from_mmaped_safetensors(&[dir.join("model.safetensors")], DType::F32, &Device::Cpu)?
    };
    let bert = BertModel::load(vb, &config)?;

    let mut sides = [
        Side { name: "monogen f32", embed: Box::new(|ids| Ok(f32_encoder.embed(ids)?)) },
        Side { name: "monogen bf16", embed: Box::new(|ids| Ok(bf16_encoder.embed(ids)?)) },
        Side { name: "monogen int8", embed: Box::new(|ids| Ok(int8_encoder.embed(ids)?)) },
        Side { name: "candle f32", embed: Box::new(|ids| candle_embed(&bert, ids)) },
    ];
    let candle = sides.len() - 1;

    let short = "The cat sat on the mat.";
    let typical = "The quick brown fox jumps over the lazy dog.";
    let batch: Vec<String> = (0..32)
        .map(|i| match i % 4 {
            0 => "A short one.".to_string(),
            1 => typical.to_string(),
            2 => "Rust is a systems programming language focused on safety and speed.".to_string(),
            _ => "Small specialized models doing narrow jobs are where a monomorphized runtime shines."
                .to_string(),
        })
        .collect();
    let cases: [(&str, Vec<String>); 3] = [
        ("short sentence", vec![short.into()]),
        ("typical sentence", vec![typical.into()]),
        ("batch of 32", batch),
    ];

    println!(
        "all-MiniLM-L6-v2, RAYON_NUM_THREADS={} (candle), monogen crates THREADS={}; {rounds} interleaved rounds",
        std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "unset".into()),
        ours::THREADS
    );
    for (name, texts) in &cases {
        let ids: Vec<Vec<u32>> =
            texts.iter().map(|t| tokenizer.encode(t)).collect::<std::result::Result<_, _>>()?;
        let tokens: usize = ids.iter().map(Vec::len).sum();
        let vectors: Vec<Vec<Vec<f32>>> = sides.iter_mut().map(|s| (s.embed)(&ids)).collect::<Result<_>>()?;
        for _ in 0..3 {
            for side in &mut sides {
                (side.embed)(&ids)?;
            }
        }
        let mut times = vec![Vec::new(); sides.len()];
        let mut cpu = vec![Duration::ZERO; sides.len()];
        for _ in 0..rounds {
            for (i, side) in sides.iter_mut().enumerate() {
                std::thread::sleep(Duration::from_millis(2));
                (side.embed)(&ids)?;
                for _ in 1..BLOCK {
                    let (wall, used) = timed(|| (side.embed)(&ids).map(drop))?;
                    times[i].push(wall);
                    cpu[i] += used;
                }
            }
        }
        println!(
            "{name} ({} sentence{}, {tokens} tokens):",
            ids.len(),
            if ids.len() == 1 { "" } else { "s" }
        );
        let m_candle = percentile(&times[candle], 0.5);
        for (i, side) in sides.iter().enumerate() {
            let m = percentile(&times[i], 0.5);
            let busy = cpu[i].as_secs_f64() / times[i].iter().sum::<Duration>().as_secs_f64();
            let diff = vectors[i]
                .iter()
                .flatten()
                .zip(vectors[candle].iter().flatten())
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            println!(
                "  {:<13} {:>9.3} ms [{:.3}, {:.3}] {:.2} cores | candle/this {:.2}x | max abs diff from candle {diff:.1e}",
                side.name,
                ms(m),
                ms(percentile(&times[i], 0.1)),
                ms(percentile(&times[i], 0.9)),
                busy,
                m_candle.as_secs_f64() / m.as_secs_f64(),
            );
        }
    }
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

/// Wall time and CPU time (user + system, this process) of `f`.
fn timed(f: impl FnOnce() -> Result<()>) -> Result<(Duration, Duration)> {
    let cpu_before = cpu_time();
    let start = Instant::now();
    f()?;
    Ok((start.elapsed(), cpu_time().saturating_sub(cpu_before)))
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
