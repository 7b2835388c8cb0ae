//! The generated crate's weight loading (safetensors header parsing and the check of every
//! tensor's name, dtype and shape) on arbitrary files, through its library API: it must
//! return weights or an error, never panic.
#![no_main]

use std::io::Write;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("monogen-fuzz-{}.safetensors", std::process::id()));
    let mut file = std::fs::File::create(&path).expect("the temporary directory is writable");
    file.write_all(data).expect("the temporary file is writable");
    drop(file);
    let _ = stories260k_cpu_f32::weights::Weights::load(&path);
});
