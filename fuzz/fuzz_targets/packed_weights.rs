//! The weight loading of a crate whose matmul kernel packs its matrices, on arbitrary files:
//! unpacked matrices packed at load, or a saved model's packed ones (`name.packed`, in the
//! layout `monogen.packed_layout` names) checked and mapped.
//! It must return weights or an error, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // It packs with AVX-512 as it loads: a CPU without it has nothing to fuzz here.
    if stories260k_cpu_bf16_bf16act::cpu::check().is_err() {
        return;
    }
    let path =
        std::env::temp_dir().join(format!("monogen-fuzz-packed_weights-{}.safetensors", std::process::id()));
    std::fs::write(&path, data).expect("the temporary directory is writable");
    let _ = stories260k_cpu_bf16_bf16act::weights::Weights::load(&path);
});
