//! An int4 crate's weight loading on arbitrary files: every matrix is checked, then quantized to
//! blockwise int4 at load (F32, BF16 or F16 tensors), or read as saved (`--save-model`: U8
//! matrices with their F16 scales and minimums).
//! It must return weights or an error, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path =
        std::env::temp_dir().join(format!("monogen-fuzz-int4_weights-{}.safetensors", std::process::id()));
    std::fs::write(&path, data).expect("the temporary directory is writable");
    let _ = stories260k_cpu_int4::weights::Weights::load(&path);
});
