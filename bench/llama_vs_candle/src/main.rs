//! LLaMA decoding, the crates monogen generates against candle-transformers' Llama, on the same
//! weights and the same prompt ids, each run as its own process, alternating run by run.
//!
//! - `llama-vs-candle candle MODEL_DIR IDS MAX_TOKENS`: the candle side alone, printing one JSON
//!   object with the fields of a generated crate's `--json` output (load, prefill and decode
//!   times and rates, generated ids). Greedy, no stop token, so both sides decode as many
//!   tokens.
//! - `llama-vs-candle candle-q8 MODEL_DIR IDS MAX_TOKENS`: the same with candle-transformers'
//!   quantized Llama (`quantized_llama`, the GGUF model) on `MODEL_DIR/model-q8_0.gguf`: every
//!   matrix in ggml's Q8_0 (int8 with a scale per 32 values, as monogen's int8 crates hold
//!   them), the norms in f32.
//! - `llama-vs-candle compare OURS_BIN MODEL_DIR THREADS ROUNDS [q8|saved [OURS_DIR]]`: `ROUNDS`
//!   alternating runs of the generated binary `OURS_BIN` (`--prompt-ids`, `--json`) and of the
//!   candle side (with RAYON_NUM_THREADS=THREADS; the quantized one with `q8`, which first
//!   writes the GGUF file from `model.safetensors` unless it exists; `OURS_BIN` then reads
//!   `OURS_DIR` if given, the model directory it wrote with `--save-model`, its matrices
//!   already in int8 as the GGUF's are in Q8_0; with `saved`, candle's Llama on `MODEL_DIR`
//!   and `OURS_BIN` on `OURS_DIR`, a crate that packs its matrices reading them packed) on a
//!   128-token prompt with 64 new tokens, then
//!   `ROUNDS` alternating runs of each that stop at the first token, timed from process start
//!   to exit: the time to first token. Prints the medians, each side's cores kept busy (CPU
//!   time over wall time of its processes) and the ratios.

use std::process::Command;
use std::time::{Duration, Instant};

use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use candle_core::{DType, Device, IndexOp, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::llama::{Cache, Llama, LlamaConfig};
use candle_transformers::models::quantized_llama::ModelWeights;
use serde_json::{Value, json};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const PROMPT_LEN: usize = 128;
const NEW_TOKENS: usize = 64;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("candle") if args.len() == 5 => {
            let ids: Vec<u32> = args[3].split(',').map(str::parse).collect::<std::result::Result<_, _>>()?;
            let report = candle_generate(args[2].as_ref(), &ids, args[4].parse()?)?;
            println!("{report}");
            Ok(())
        }
        Some("candle-q8") if args.len() == 5 => {
            let ids: Vec<u32> = args[3].split(',').map(str::parse).collect::<std::result::Result<_, _>>()?;
            let report = candle_q8_generate(args[2].as_ref(), &ids, args[4].parse()?)?;
            println!("{report}");
            Ok(())
        }
        Some("compare")
            if args.len() == 6 || ((7..=8).contains(&args.len()) && ["q8", "saved"].contains(&args[6].as_str())) =>
        {
            let ours_dir = args.get(7).unwrap_or(&args[3]);
            let q8 = args.get(6).is_some_and(|a| a == "q8");
            compare(&args[2], &args[3], ours_dir, args[4].parse()?, args[5].parse()?, q8)
        }
        _ => Err("usage: llama-vs-candle candle|candle-q8 MODEL_DIR IDS MAX_TOKENS | compare OURS_BIN MODEL_DIR THREADS ROUNDS [q8|saved [OURS_DIR]]".into()),
    }
}

/// Greedy generation with candle: load, one prefill pass over `ids`, then one-token steps.
fn candle_generate(dir: &std::path::Path, ids: &[u32], max_tokens: usize) -> Result<Value> {
    let started = Instant::now();
    let device = Device::Cpu;
    let text = std::fs::read_to_string(dir.join("config.json"))?;
    // candle computes in the checkpoint's dtype: bfloat16 for a bf16 workload's weights.
    let raw: Value = serde_json::from_str(&text)?;
    let dtype = if raw["torch_dtype"] == "bfloat16" { DType::BF16 } else { DType::F32 };
    let config: LlamaConfig = serde_json::from_str(&text)?;
    let config = config.into_config(false);
    // SAFETY: the weights file is not modified while it is mapped.
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[dir.join("model.safetensors")], dtype, &device)? };
    let llama = Llama::load(vb, &config)?;
    let mut cache = Cache::new(true, dtype, &config, &device)?;
    let load_ms = ms(started.elapsed());

    greedy(ids, max_tokens, load_ms, |tokens, position| {
        llama.forward(&Tensor::new(tokens, &device)?.unsqueeze(0)?, position, &mut cache)
    })
}

/// Greedy generation with candle's quantized Llama on the Q8_0 GGUF file of `dir`.
fn candle_q8_generate(dir: &std::path::Path, ids: &[u32], max_tokens: usize) -> Result<Value> {
    let started = Instant::now();
    let device = Device::Cpu;
    let path = dir.join("model-q8_0.gguf");
    let mut file = std::fs::File::open(&path)?;
    let content = gguf_file::Content::read(&mut file)?;
    let mut model = ModelWeights::from_gguf(content, &mut file, &device)?;
    let load_ms = ms(started.elapsed());

    greedy(ids, max_tokens, load_ms, |tokens, position| {
        model.forward(&Tensor::new(tokens, &device)?.unsqueeze(0)?, position)
    })
}

/// One prefill pass over `ids`, then one-token steps until `max_tokens` are generated, with
/// `forward(tokens, position)` returning the logits of the last token: the report of a run.
fn greedy(
    ids: &[u32],
    max_tokens: usize,
    load_ms: f64,
    mut forward: impl FnMut(&[u32], usize) -> candle_core::Result<Tensor>,
) -> Result<Value> {
    let prefill = Instant::now();
    let mut next = argmax(&forward(ids, 0)?.i(0)?)?;
    let prefill_ms = ms(prefill.elapsed());
    let mut generated = vec![next];
    let decode = Instant::now();
    while generated.len() < max_tokens {
        let position = ids.len() + generated.len() - 1;
        next = argmax(&forward(&[next], position)?.i(0)?)?;
        generated.push(next);
    }
    let decode_ms = ms(decode.elapsed());
    let steps = generated.len() - 1;
    Ok(json!({
        "generated_ids": generated,
        "load_ms": load_ms,
        "prefill_ms": prefill_ms,
        "prefill_tok_s": ids.len() as f64 / (prefill_ms / 1000.0),
        "decode_ms": decode_ms,
        "decode_tok_s": if steps == 0 { 0.0 } else { steps as f64 / (decode_ms / 1000.0) },
    }))
}

/// Writes `dir/model-q8_0.gguf` from `dir/model.safetensors` unless it exists: the tensors
/// under their GGUF names, matrices in Q8_0 and norms in f32, with the metadata
/// `quantized_llama` reads. (The benchmark's weights are random, so the rotary permutation
/// that llama.cpp's converter applies to q and k is left out: it changes no cost.)
fn write_gguf(dir: &std::path::Path) -> Result<()> {
    let path = dir.join("model-q8_0.gguf");
    if path.exists() {
        return Ok(());
    }
    let config: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
    let tensors = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu)?;
    let rename = |name: &str| -> String {
        let name = name.replace("model.layers.", "blk.").replace("model.embed_tokens", "token_embd");
        let name = name.replace("model.norm", "output_norm").replace("lm_head", "output");
        name.replace(".self_attn.q_proj", ".attn_q")
            .replace(".self_attn.k_proj", ".attn_k")
            .replace(".self_attn.v_proj", ".attn_v")
            .replace(".self_attn.o_proj", ".attn_output")
            .replace(".mlp.gate_proj", ".ffn_gate")
            .replace(".mlp.up_proj", ".ffn_up")
            .replace(".mlp.down_proj", ".ffn_down")
            .replace(".input_layernorm", ".attn_norm")
            .replace(".post_attention_layernorm", ".ffn_norm")
    };
    let mut quantized = Vec::new();
    for (name, tensor) in &tensors {
        let tensor = tensor.to_dtype(DType::F32)?;
        let dtype = if tensor.rank() == 2 { GgmlDType::Q8_0 } else { GgmlDType::F32 };
        quantized.push((rename(name), QTensor::quantize(&tensor, dtype)?));
    }
    let u32_of = |key: &str| gguf_file::Value::U32(config[key].as_u64().unwrap_or(0) as u32);
    let head_dim = config["hidden_size"].as_u64().unwrap_or(0) / config["num_attention_heads"].as_u64().unwrap_or(1);
    let metadata = [
        ("general.architecture", gguf_file::Value::String("llama".into())),
        ("llama.attention.head_count", u32_of("num_attention_heads")),
        ("llama.attention.head_count_kv", u32_of("num_key_value_heads")),
        ("llama.block_count", u32_of("num_hidden_layers")),
        ("llama.embedding_length", u32_of("hidden_size")),
        ("llama.rope.dimension_count", gguf_file::Value::U32(head_dim as u32)),
        ("llama.attention.layer_norm_rms_epsilon", gguf_file::Value::F32(config["rms_norm_eps"].as_f64().unwrap_or(1e-5) as f32)),
        ("llama.rope.freq_base", gguf_file::Value::F32(config["rope_theta"].as_f64().unwrap_or(10000.0) as f32)),
    ];
    let metadata: Vec<(&str, &gguf_file::Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let tensors: Vec<(&str, &QTensor)> = quantized.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let partial = dir.join("model-q8_0.gguf.partial");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&partial)?);
    gguf_file::write(&mut out, &metadata, &tensors)?;
    drop(out);
    std::fs::rename(partial, path)?;
    Ok(())
}

fn argmax(logits: &Tensor) -> Result<u32> {
    Ok(logits.to_dtype(DType::F32)?.argmax(0)?.to_scalar::<u32>()?)
}

/// One process's JSON report, its wall time and the CPU time it used.
struct Run {
    report: Value,
    wall: Duration,
    cpu: Duration,
}

fn run(mut command: Command) -> Result<Run> {
    let cpu_before = children_cpu_time();
    let start = Instant::now();
    let output = command.output()?;
    let wall = start.elapsed();
    if !output.status.success() {
        return Err(format!("{command:?} failed: {}", String::from_utf8_lossy(&output.stderr)).into());
    }
    let report = serde_json::from_slice(&output.stdout)?;
    Ok(Run { report, wall, cpu: children_cpu_time().saturating_sub(cpu_before) })
}

fn compare(ours: &str, dir: &str, ours_dir: &str, threads: usize, rounds: usize, q8: bool) -> Result<()> {
    if q8 {
        write_gguf(dir.as_ref())?;
    }
    // Fixed prompt ids spread over the vocabulary (never 0, 1 or 2, the special tokens).
    let ids: Vec<u32> = (0..PROMPT_LEN as u32).map(|i| 3 + (i * 7919 + 13) % 20000).collect();
    let ids_arg = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let me = std::env::current_exe()?;
    let ours_cmd = |tokens: usize| {
        let mut c = Command::new(ours);
        c.args(["--model", ours_dir, "--prompt-ids", &ids_arg, "--max-tokens", &tokens.to_string(), "--json"]);
        c
    };
    let candle_cmd = |tokens: usize| {
        let mut c = Command::new(&me);
        let side = if q8 { "candle-q8" } else { "candle" };
        c.args([side, dir, &ids_arg, &tokens.to_string()]).env("RAYON_NUM_THREADS", threads.to_string());
        c
    };

    // Warm the page cache and check that both sides agree on the first greedy tokens.
    let a = run(ours_cmd(8))?.report;
    let b = run(candle_cmd(8))?.report;
    let agree = a["generated_ids"].as_array().zip(b["generated_ids"].as_array()).map_or(0, |(x, y)| {
        x.iter().zip(y).take_while(|(p, q)| p == q).count()
    });

    let (mut ours_runs, mut candle_runs) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        ours_runs.push(run(ours_cmd(NEW_TOKENS))?);
        candle_runs.push(run(candle_cmd(NEW_TOKENS))?);
    }
    let (mut ours_first, mut candle_first) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        ours_first.push(run(ours_cmd(1))?.wall);
        candle_first.push(run(candle_cmd(1))?.wall);
    }

    let field = |runs: &[Run], name: &str| median(runs.iter().map(|r| r.report[name].as_f64().unwrap_or(f64::NAN)).collect());
    let cores = |runs: &[Run]| {
        runs.iter().map(|r| r.cpu).sum::<Duration>().as_secs_f64() / runs.iter().map(|r| r.wall).sum::<Duration>().as_secs_f64()
    };
    let decoded = ours_runs[0].report["generated_ids"].as_array().map_or(0, Vec::len);
    println!(
        "{} threads, {rounds} alternating runs each against candle's {}; prompt {PROMPT_LEN} ids, {NEW_TOKENS} new tokens (ours decoded {decoded}); the first {agree} of 8 greedy tokens agree",
        threads,
        if q8 { "quantized Llama (Q8_0 GGUF)" } else { "Llama" }
    );
    let line = |what: &str, o: f64, c: f64, higher_is_better: bool| {
        let ratio = if higher_is_better { o / c } else { c / o };
        println!("  {what:<30} monogen {o:>10.2}   candle {c:>10.2}   monogen/candle speed {ratio:.2}x");
    };
    line("prefill tok/s (128 tokens)", field(&ours_runs, "prefill_tok_s"), field(&candle_runs, "prefill_tok_s"), true);
    line("decode tok/s (64 tokens)", field(&ours_runs, "decode_tok_s"), field(&candle_runs, "decode_tok_s"), true);
    line("load ms", field(&ours_runs, "load_ms"), field(&candle_runs, "load_ms"), false);
    line(
        "process start to first token ms",
        median(ours_first.iter().map(|d| ms(*d)).collect()),
        median(candle_first.iter().map(|d| ms(*d)).collect()),
        false,
    );
    println!("  cores kept busy (CPU / wall over whole runs): monogen {:.2}, candle {:.2}", cores(&ours_runs), cores(&candle_runs));
    Ok(())
}

/// CPU time (user + system) of this process's waited-for children, from /proc/self/stat
/// (cutime + cstime, in clock ticks of 10 ms).
fn children_cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks: u64 = fields.get(13..15).map_or(0, |f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum());
    Duration::from_millis(ticks * 10)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
