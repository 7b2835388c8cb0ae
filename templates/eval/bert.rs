//! `monogen eval`'s harness for an encoder: the workload's crate (`subject`) and its f32 twin
//! (`reference`) embed every non-empty line of the text; it compares each pair of vectors by
//! cosine similarity. It prints one JSON line per batch done (`{"done": n, "total": n}`) and
//! then the figures (`{"figures": {...}}`).
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
    let tokenizer = q::Tokenizer::load(model).map_err(|e| e.to_string())?;
    let sentences: Vec<Vec<u32>> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| tokenizer.encode(l).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    if sentences.is_empty() {
        return Err("the text has no non-empty line: nothing to embed".into());
    }
    let subject = q::Model::load(model).map_err(|e| e.to_string())?;
    let reference = f::Model::load(model).map_err(|e| e.to_string())?;
    let batches: Vec<&[Vec<u32>]> = sentences.chunks(q::MAX_BATCH).collect();
    let mut cosines = Vec::new();
    for (done, batch) in batches.iter().enumerate() {
        let a = subject.encoder().embed(batch).map_err(|e| e.to_string())?;
        let b = reference.encoder().embed(batch).map_err(|e| e.to_string())?;
        for (x, y) in a.iter().zip(&b) {
            let dot: f64 = x.iter().zip(y).map(|(&p, &r)| p as f64 * r as f64).sum();
            let norm = |v: &[f32]| v.iter().map(|&p| p as f64 * p as f64).sum::<f64>().sqrt();
            cosines.push(dot / (norm(x) * norm(y)).max(f64::MIN_POSITIVE));
        }
        println!("{{\"done\": {}, \"total\": {}}}", done + 1, batches.len());
    }
    let n = cosines.len();
    println!(
        "{{\"figures\": {{\"kind\": \"encoder\", \"sentences\": {n}, \"mean_cosine\": {}, \"min_cosine\": {}}}}}",
        cosines.iter().sum::<f64>() / n as f64,
        cosines.iter().copied().fold(f64::INFINITY, f64::min),
    );
    Ok(())
}
