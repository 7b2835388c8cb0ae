//! The tokenizer.json readers on arbitrary text: a LLaMA crate's hand-written reader of the ids
//! it decodes (`Tokenizer::load`), its whole tokenizer (`load_with_encoder`, encoding and
//! decoding a sentence), and a BERT crate's WordPiece tokenizer. Each must return a tokenizer or
//! an error, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("monogen-fuzz-tokenizer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("the temporary directory is writable");
    std::fs::write(dir.join("tokenizer.json"), data).expect("the temporary directory is writable");
    if let Ok(tokenizer) = stories260k_cpu_f32::Tokenizer::load(&dir) {
        let _ = tokenizer.decode(&[1, 2, 3, 300, 511]);
    }
    if let Ok(tokenizer) = stories260k_cpu_f32::Tokenizer::load_with_encoder(&dir)
        && let Ok(ids) = tokenizer.encode("Once upon a time, a cat sat.")
    {
        let _ = tokenizer.decode(&ids);
    }
    if let Ok(tokenizer) = all_minilm_l6_v2_cpu_f32::Tokenizer::load(&dir) {
        let _ = tokenizer.encode("A cat sat on the mat.");
    }
});
