//! The BERT loader (all-MiniLM-L6-v2's crate) on arbitrary files: embeddings, LayerNorms, biases
//! and matrices checked by name, dtype and shape.
//! It must return weights or an error, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path =
        std::env::temp_dir().join(format!("monogen-fuzz-bert_weights-{}.safetensors", std::process::id()));
    std::fs::write(&path, data).expect("the temporary directory is writable");
    let _ = all_minilm_l6_v2_cpu_f32::weights::Weights::load(&path);
});
