//! all-MiniLM-L6-v2 sentence embeddings: the crate monogen generated against candle-transformers'
//! BERT, on the same weights and the same token ids, in one process, interleaved round by round.
//!
//! `bert-vs-candle MODEL_DIR [ROUNDS]`. Each case first checks that both sides give the same
//! mean-pooled vectors, then times `ROUNDS` rounds (each times ours, then candle's) after a
//! warm-up, and prints the medians, the 10th/90th percentiles and the ratio. candle's thread
//! count comes from RAYON_NUM_THREADS; the CPU time over wall time of each side shows how
//! many cores it really kept busy.

use std::time::{Duration, Instant};

use all_minilm_l6_v2_cpu_f32 as ours;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(args.get(1).ok_or("usage: bert-vs-candle MODEL_DIR [ROUNDS]")?);
    let rounds: usize = args.get(2).map_or(Ok(40), |r| r.parse())?;

    let model = ours::Model::load(&dir)?;
    let tokenizer = ours::Tokenizer::load(&dir)?;
    let mut encoder = model.encoder();

    let config: Config = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
    // SAFETY: the weights file is not modified while it is mapped.
    let vb = unsafe {
        VarBuilder::from_mmaped_safetensors(&[dir.join("model.safetensors")], DType::F32, &Device::Cpu)?
    };
    let bert = BertModel::load(vb, &config)?;

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
        "all-MiniLM-L6-v2, RAYON_NUM_THREADS={} (candle), monogen crate THREADS={}; {rounds} interleaved rounds",
        std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "unset".into()),
        ours::THREADS
    );
    for (name, texts) in &cases {
        let ids: Vec<Vec<u32>> =
            texts.iter().map(|t| tokenizer.encode(t)).collect::<std::result::Result<_, _>>()?;
        let tokens: usize = ids.iter().map(Vec::len).sum();
        let a = encoder.embed(&ids)?;
        let b = candle_embed(&bert, &ids)?;
        let diff =
            a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        for _ in 0..3 {
            encoder.embed(&ids)?;
            candle_embed(&bert, &ids)?;
        }
        let (mut t_ours, mut t_candle) = (Vec::new(), Vec::new());
        let (mut cpu_ours, mut cpu_candle) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..rounds {
            let (wall, cpu) = timed(|| Ok(encoder.embed(&ids).map(drop)?))?;
            t_ours.push(wall);
            cpu_ours += cpu;
            let (wall, cpu) = timed(|| candle_embed(&bert, &ids).map(drop))?;
            t_candle.push(wall);
            cpu_candle += cpu;
        }
        let (m_ours, m_candle) = (percentile(&t_ours, 0.5), percentile(&t_candle, 0.5));
        let busy =
            |cpu: Duration, t: &[Duration]| cpu.as_secs_f64() / t.iter().sum::<Duration>().as_secs_f64();
        println!(
            "{name:>16} ({} sentence{}, {tokens} tokens): monogen {:>9.3} ms [{:.3}, {:.3}] {:.2} cores | candle {:>9.3} ms [{:.3}, {:.3}] {:.2} cores | candle/monogen {:.2}x | max abs diff {diff:.1e}",
            ids.len(),
            if ids.len() == 1 { "" } else { "s" },
            ms(m_ours),
            ms(percentile(&t_ours, 0.1)),
            ms(percentile(&t_ours, 0.9)),
            busy(cpu_ours, &t_ours),
            ms(m_candle),
            ms(percentile(&t_candle, 0.1)),
            ms(percentile(&t_candle, 0.9)),
            busy(cpu_candle, &t_candle),
            m_candle.as_secs_f64() / m_ours.as_secs_f64(),
        );
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
