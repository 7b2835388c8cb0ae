//! `monogen eval`'s harness for a decoder: the workload's crate (`subject`) and its f32 twin
//! (`reference`) read the same text, teacher-forced, a window of tokens at a time; at every
//! position both give a next-token distribution. It prints one JSON line per window done
//! (`{"done": n, "total": n}`) and then the figures (`{"figures": {...}}`).
//!
//! Usage: harness MODEL_DIR TEXT_FILE

use subject as q;
use reference as f;

fn main() {
    if let Err(e) = run() {
        eprintln!("{e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, text] = args.as_slice() else {
        return Err("usage: harness MODEL_DIR TEXT_FILE".into());
    };
    let text = std::fs::read_to_string(text).map_err(|e| format!("cannot read {text}: {e}"))?;
    let tokenizer = q::Tokenizer::load_with_encoder(model).map_err(|e| e.to_string())?;
    let ids = tokenizer.encode(&text).map_err(|e| e.to_string())?;
    let subject = q::Model::load(model).map_err(|e| e.to_string())?;
    let reference = f::Model::load(model).map_err(|e| e.to_string())?;
    // Windows of at most 256 tokens (or the context), each read from a fresh KV cache.
    let window = q::MAX_SEQ_LEN.min(256).max(2);
    let windows: Vec<&[u32]> = ids.chunks(window).filter(|w| w.len() > 1).collect();
    if windows.is_empty() {
        return Err("the text is shorter than two tokens: nothing to score".into());
    }
    let v = q::VOCAB_SIZE;
    let mut kls = Vec::new();
    let (mut agree, mut nll_q, mut nll_f) = (0usize, 0f64, 0f64);
    for (done, w) in windows.iter().enumerate() {
        let lq = subject.session().logits_all(w).map_err(|e| e.to_string())?;
        let lf = reference.session().logits_all(w).map_err(|e| e.to_string())?;
        for i in 0..w.len() - 1 {
            let (rq, rf) = (log_softmax(&lq[i * v..(i + 1) * v]), log_softmax(&lf[i * v..(i + 1) * v]));
            // KL(reference || subject): what the subject loses of the f32 distribution.
            let kl: f64 = rf.iter().zip(&rq).map(|(&a, &b)| a.exp() * (a - b)).sum();
            kls.push(kl.max(0.0));
            agree += usize::from(argmax(&rq) == argmax(&rf));
            let next = w[i + 1] as usize;
            nll_q -= rq[next];
            nll_f -= rf[next];
        }
        println!("{{\"done\": {}, \"total\": {}}}", done + 1, windows.len());
    }
    let n = kls.len();
    let mean_kl = kls.iter().sum::<f64>() / n as f64;
    let mut sorted = kls.clone();
    sorted.sort_by(f64::total_cmp);
    let p99_kl = sorted[((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1];
    println!(
        "{{\"figures\": {{\"kind\": \"decoder\", \"positions\": {n}, \"top1\": {}, \"mean_kl\": {mean_kl:e}, \"p99_kl\": {p99_kl:e}, \"perplexity\": {}, \"perplexity_f32\": {}}}}}",
        agree as f64 / n as f64,
        (nll_q / n as f64).exp(),
        (nll_f / n as f64).exp(),
    );
    Ok(())
}

/// The log-probabilities of `logits`, in f64.
fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&x| (x as f64 - max).exp()).sum();
    let log_sum = sum.ln() + max;
    logits.iter().map(|&x| x as f64 - log_sum).collect()
}

/// The index of the largest value (the first of equals).
fn argmax(values: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in values.iter().enumerate() {
        if x > values[best] {
            best = i;
        }
    }
    best
}
