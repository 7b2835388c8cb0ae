//! What the hand-written tokenizer.json readers of generated crates buy over the library:
//! `runtime/tokenizer_file.rs` (the whole tokenizer, for text prompts and BERT crates) and
//! `runtime/detokenizer.rs` (decoding only, for a LLaMA crate given prompt ids) against
//! `tokenizers::Tokenizer::from_file`, on the tokenizer.json files at hand.
//!
//! `cargo bench -p monogen-tests --bench tokenizer_load`: each reader reads each file in turn,
//! interleaved, for 15 rounds; it prints each one's median and the ratio to `from_file`'s.

#[path = "../../templates/runtime/tokenizer_file.rs"]
#[allow(dead_code)]
mod tokenizer_file;

#[path = "../../templates/runtime/detokenizer.rs"]
#[allow(dead_code)]
mod detokenizer;

use std::path::PathBuf;
use std::time::Instant;

use monogen::workload::WorkloadSource;
use monogen_tests::{model_dir, workspace_root};
use tokenizers::Tokenizer;

const ROUNDS: usize = 15;

fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let synthetic = tempfile::tempdir().unwrap();
    let workload = WorkloadSource::read(&workspace_root().join("workloads/stories15m-bench-cpu-f32.toml"))
        .unwrap()
        .parse()
        .unwrap();
    monogen::synth::write_model_dir(&workload, synthetic.path(), 1).unwrap();
    let mut files: Vec<(String, PathBuf)> =
        vec![("stories15M's shape (synthetic, 32000 words)".into(), synthetic.path().join("tokenizer.json"))];
    for name in ["all-minilm-l6-v2", "stories260k"] {
        if let Some(dir) = model_dir(name) {
            files.push((name.to_string(), dir.join("tokenizer.json")));
        }
    }
    println!(
        "reading tokenizer.json, median of {ROUNDS} interleaved rounds (ratio = from_file's time / the reader's)"
    );
    for (name, path) in files {
        let (mut library, mut whole, mut decoding) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let start = Instant::now();
            let tokenizer = Tokenizer::from_file(&path).unwrap();
            library.push(start.elapsed().as_secs_f64() * 1e3);
            drop(tokenizer);
            let start = Instant::now();
            let text = std::fs::read_to_string(&path).unwrap();
            let read = tokenizer_file::parse(&text).unwrap();
            whole.push(start.elapsed().as_secs_f64() * 1e3);
            drop(read);
            let start = Instant::now();
            let text = std::fs::read_to_string(&path).unwrap();
            let read = detokenizer::read(&text).unwrap();
            decoding.push(start.elapsed().as_secs_f64() * 1e3);
            drop(read);
        }
        let (library, whole, decoding) = (median(library), median(whole), median(decoding));
        println!("{name}");
        println!("  Tokenizer::from_file     {library:8.2} ms");
        println!("  tokenizer_file::parse    {whole:8.2} ms  {:.2}x", library / whole);
        println!("  detokenizer::read        {decoding:8.2} ms  {:.2}x", library / decoding);
    }
}
