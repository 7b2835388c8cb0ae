//! One forward pass of every committed benchmark crate (`generated/*-bench-*`) at its real
//! shapes, on synthetic weights (`monogen::synth`, as `monogen synth-weights` writes them):
//! stories15M, stories110M and TinyLlama 1.1B, each in every dtype and kernel choice committed.
//! The benchmarks time these crates; this checks that they compute. Each crate:
//!
//! - loads the model (a CPU without the crate's features skips, named and counted);
//! - runs a prompt through its prefill, and the same tokens one decode step at a time: every
//!   logit is finite, and the two paths agree;
//! - agrees with the f32 crate of the same model on the same weights, within its bound
//!   (below), and generates tokens.
//!
//! Every crate of a model reads one synthetic checkpoint in bfloat16 (2 GiB for TinyLlama),
//! written once under target/test-models/synthetic/: the bf16 crates map it, the f32 crates
//! widen it, the int8 and int4 crates quantize it. Its values are exactly representable in bf16, so the
//! two f32 crates of stories110M compute the same products, and differ only in the order of
//! their f32 additions.
//!
//! TinyLlama's five crates run where `MONOGEN_LARGE=1` is set: its synthetic checkpoint and
//! five loads of it in a debug build take longer than CI's half hour allows, so CI skips them,
//! saying so, and tests/full-runs.txt records where they last ran.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use monogen::workload::WorkloadSource;
use monogen_tests::{skip, workspace_root};

/// The prompt: BOS and four ordinary tokens, below every model's vocabulary.
const PROMPT: [u32; 5] = [1, 450, 2001, 7, 3155];

/// Each crate has two bounds, as fractions of the largest logit: on the last position's logits
/// against the f32 crate's (`within`), and on its prefill's logits against its decode steps'
/// (`decode`). Each is 3x what the crate measured (rounded up) on `amd-epyc-2c` (AVX-512) on
/// 2026-12-07 (`MONOGEN_LARGE=1 cargo test -p monogen-tests --test bench_crates --
/// --nocapture` prints the figures). Every crate but the f32 ones keeps its KV cache in
/// bfloat16, so each differs from f32 by that rounding, and its prefill (which attends to the
/// chunk's own keys before they are stored) from its decode steps; the bf16-activation and
/// int8 crates also round their products' inputs, and their prefill and decode kernels round
/// them differently. The AMX crates, which compute the f32 products of their AVX-512 twins on
/// tiles, are held to their twins' bounds. The int4 crate's four bits move the random weights'
/// logits by 0.40 of the largest (measured on intel-xeon-2c, 2026-12-07, the same on every CPU
/// with its kernels' features), ten times the int8 crate's: 3x that would pass logits of zero
/// (1.0 off), so its bound is 1.5x; its accuracy on real models is `accuracy.rs`'s and
/// `monogen eval`'s.
/// The synthetic model directory of `model` (`stories15m`, `stories110m`, `tinyllama`), written
/// from its bf16 benchmark workload once: later runs reuse a complete one.
fn synthetic(model: &str) -> PathBuf {
    static WRITING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = WRITING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = workspace_root().join("target/test-models/synthetic").join(format!("{model}-seed7"));
    let complete = dir.join("complete");
    if !complete.exists() {
        let path = workspace_root().join(format!("workloads/{model}-bench-cpu-bf16.toml"));
        let workload = WorkloadSource::read(&path).unwrap().parse().unwrap();
        monogen::synth::write_model_dir(&workload, &dir, 7).unwrap();
        std::fs::write(&complete, "").unwrap();
    }
    dir
}

/// What a crate computed on the prompt: its prefill's logits of the last position, and
/// whether the crate runs here at all.
type LastLogits = Option<Vec<f32>>;

/// Runs the crate `$krate` on `$dir` and checks it (see the module's comment); evaluates to
/// the last position's logits, or returns from the test where this CPU cannot run it.
macro_rules! forward {
    ($krate:ident, $dir:expr, $decode:expr) => {{
        use $krate as krate;
        let model = match krate::Model::load(&$dir) {
            Ok(model) => model,
            Err(krate::Error::UnsupportedCpu { missing, .. }) => {
                let missing: Vec<&str> = missing.split(", ").collect();
                skip::cpu(&monogen_tests::current_test(), &missing);
                return None;
            }
            Err(e) => panic!("{}: {e}", stringify!($krate)),
        };
        assert!(model.warnings().is_empty(), "{:?}", model.warnings());
        let vocab = krate::VOCAB_SIZE;
        let prefill = model.session().logits_all(&PROMPT).unwrap();
        assert_eq!(prefill.len(), PROMPT.len() * vocab);
        assert!(prefill.iter().all(|v| v.is_finite()), "{}: a logit is not finite", stringify!($krate));
        let mut session = model.session();
        let decode: Vec<f32> = PROMPT.iter().flat_map(|&id| session.decode(id).unwrap().to_vec()).collect();
        let scale = largest(&prefill);
        let (diff, at) = monogen_tests::max_abs_diff(&prefill, &decode);
        eprintln!("{} prefill against decode: {:.2e} of the largest logit", stringify!($krate), diff / scale);
        assert!(
            diff <= $decode * scale,
            "{}: prefill and decode differ by {diff} at {at} (largest logit {scale})",
            stringify!($krate)
        );
        let params = krate::GenerateParams { max_tokens: 3, ..krate::GenerateParams::default() };
        let generation = model.session().generate(&PROMPT, &params, |_| true).unwrap();
        assert!(!generation.generated_ids.is_empty());
        assert!(generation.generated_ids.iter().all(|&id| (id as usize) < vocab));
        Some(prefill[(PROMPT.len() - 1) * vocab..].to_vec())
    }};
}

fn largest(logits: &[f32]) -> f32 {
    logits.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// Checks `logits` against the f32 crate's of the same model, within `bound` of its largest.
fn assert_near_f32(what: &str, logits: &[f32], f32_logits: &[f32], bound: f32) {
    let scale = largest(f32_logits);
    let (diff, at) = monogen_tests::max_abs_diff(logits, f32_logits);
    eprintln!("{what}: {:.2e} of the largest f32 logit", diff / scale);
    assert!(diff <= bound * scale, "{what}: differs from f32 by {diff} at {at} (bound {bound} of {scale})");
}

/// Whether the TinyLlama crates run here (`MONOGEN_LARGE=1`); a skip, said and counted, where
/// they do not.
fn large_models_run() -> bool {
    if std::env::var("MONOGEN_LARGE").is_ok_and(|v| v == "1") {
        return true;
    }
    skip::because(
        &monogen_tests::current_test(),
        "TinyLlama's crates run at their real shapes only with MONOGEN_LARGE=1 (2 GiB of synthetic weights; see tests/full-runs.txt)",
    );
    false
}

/// Declares the f32 crate of a model (whose logits the others are held to) and a test for
/// every other crate of it.
macro_rules! bench_model {
    (
        $module:ident, $model:literal, large: $large:literal,
        f32: $f32_crate:ident decode $f32_decode:literal;
        $($test:ident: $krate:ident within $bound:literal decode $decode:literal;)*
    ) => {
        mod $module {
            use super::*;

            fn dir() -> Option<PathBuf> {
                if $large && !large_models_run() {
                    return None;
                }
                Some(synthetic($model))
            }

            fn f32_run(dir: &Path) -> LastLogits {
                forward!($f32_crate, dir, $f32_decode)
            }

            /// The f32 crate's last logits, computed once per process; `None` where this CPU
            /// cannot run it (the test that computed it first says so).
            fn f32_logits(dir: &Path) -> LastLogits {
                static LOGITS: OnceLock<LastLogits> = OnceLock::new();
                LOGITS.get_or_init(|| f32_run(dir)).clone()
            }

            #[test]
            fn f32() {
                let Some(dir) = dir() else { return };
                f32_logits(&dir);
            }

            $(
                #[test]
                fn $test() {
                    fn run(dir: &Path) -> LastLogits {
                        forward!($krate, dir, $decode)
                    }
                    let Some(dir) = dir() else { return };
                    let Some(logits) = run(&dir) else { return };
                    let Some(reference) = f32_logits(&dir) else {
                        skip::because(&monogen_tests::current_test(), "its model's f32 crate cannot run on this CPU");
                        return;
                    };
                    assert_near_f32(stringify!($krate), &logits, &reference, $bound);
                }
            )*
        }
    };
}

bench_model! {
    stories15m, "stories15m", large: false,
    f32: stories15m_bench_cpu_f32 decode 1e-6;
    bf16: stories15m_bench_cpu_bf16 within 9e-3 decode 1e-6;
    int8: stories15m_bench_cpu_int8 within 6e-2 decode 1.2e-2;
}

bench_model! {
    stories110m, "stories110m", large: false,
    f32: stories110m_bench_cpu_f32 decode 2e-6;
    f32_prefill: stories110m_bench_cpu_f32_prefill within 8e-7 decode 2e-6;
    bf16: stories110m_bench_cpu_bf16 within 1e-2 decode 1e-3;
    bf16_amx: stories110m_bench_cpu_bf16_amx within 1e-2 decode 1e-3;
    bf16_bf16act: stories110m_bench_cpu_bf16_bf16act within 2e-2 decode 2.1e-3;
    bf16_bf16act_amx: stories110m_bench_cpu_bf16_bf16act_amx within 2e-2 decode 2.1e-3;
    int8: stories110m_bench_cpu_int8 within 6.7e-2 decode 2.7e-2;
}

bench_model! {
    tinyllama, "tinyllama", large: true,
    f32: tinyllama_bench_cpu_f32 decode 4.8e-6;
    bf16: tinyllama_bench_cpu_bf16 within 1.7e-2 decode 1.3e-3;
    bf16_bf16act: tinyllama_bench_cpu_bf16_bf16act within 3.4e-2 decode 1.9e-2;
    int8: tinyllama_bench_cpu_int8 within 1.1e-1 decode 7.7e-2;
    int4: tinyllama_bench_cpu_int4 within 0.6 decode 8.1e-2;
}

/// Every committed benchmark crate has its test above: a new one fails this until it does.
#[test]
fn every_benchmark_crate_is_run() {
    let source = std::fs::read_to_string(workspace_root().join("tests/tests/bench_crates.rs")).unwrap();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(workspace_root().join("generated")).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let ident = name.replace('-', "_");
        let named = source.contains(&format!(": {ident} "));
        // A CUDA crate's forward pass runs on the CPU under emulation (tests/tests/cuda.rs),
        // and at its benchmark shapes on a GPU (bench/gpu_check.sh).
        let cuda = std::fs::read_to_string(entry.path().join("workload.toml"))
            .is_ok_and(|w| w.contains("\ndevice = \"cuda\"\n"));
        if name.contains("-bench-") && !named && !cuda {
            missing.push(name);
        }
    }
    assert!(missing.is_empty(), "benchmark crates without a forward pass here: {missing:?}");
}
