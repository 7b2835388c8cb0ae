//! A bf16 crate's weight loading on arbitrary files: BF16 matrices mapped in place, F32 and F16
//! ones rounded to bfloat16 at load.
//! It must return weights or an error, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path =
        std::env::temp_dir().join(format!("monogen-fuzz-bf16_weights-{}.safetensors", std::process::id()));
    std::fs::write(&path, data).expect("the temporary directory is writable");
    let _ = stories260k_cpu_bf16::weights::Weights::load(&path);
});
