//! What CI checks of the CUDA crates without a GPU: their kernels and their forward pass run on
//! the CPU under emulation (tools/cuda_emulate.py: the CUDA C compiled with g++, a block's
//! threads as fibers) against numpy and against transformers' logits and greedy tokens; every
//! kernel file of every committed CUDA crate compiles with NVRTC for sm_80 and sm_90 (PyPI's
//! nvidia-cuda-nvrtc-cu12 ships NVRTC, which needs no GPU; `.ci/run` installs it); and a CUDA
//! crate's binary on a machine without a GPU says so and exits 5. Their generation, determinism
//! and standalone build are the freshness, no-dispatch and lint tests' as for every committed
//! crate. What only a GPU shows (races, the launchers' device buffers, speed) is the device
//! check's, bench/gpu_check.sh.

use std::path::PathBuf;
use std::process::Command;

use monogen::init::{CpuFeatures, InitOptions};
use monogen::workload::{Activations, Dtype, KvDtype};
use monogen_tests::{build_copy, model_dir, workspace_root};

/// The committed crates generated for a CUDA GPU.
fn cuda_crates() -> Vec<PathBuf> {
    let mut crates: Vec<PathBuf> = std::fs::read_dir(workspace_root().join("generated"))
        .expect("generated/ reads")
        .map(|e| e.expect("an entry of generated/").path())
        .filter(|dir| {
            std::fs::read_to_string(dir.join("workload.toml"))
                .is_ok_and(|w| w.contains("\ndevice = \"cuda\"\n"))
        })
        .collect();
    crates.sort();
    crates
}

#[test]
fn every_kernel_of_every_cuda_crate_compiles_with_nvrtc_for_sm80_and_sm90() {
    let crates = cuda_crates();
    assert!(crates.len() >= 2, "the repository commits CUDA crates in f32 and bf16: {crates:?}");
    let mut files: Vec<PathBuf> = Vec::new();
    for dir in &crates {
        let kernels = dir.join("src/kernels");
        let mut cu: Vec<PathBuf> = std::fs::read_dir(&kernels)
            .expect("src/kernels reads")
            .map(|e| e.expect("an entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "cu"))
            .collect();
        assert!(
            cu.len() >= 8,
            "{}: a kernel file per CUDA interface and model.cu: {cu:?}",
            kernels.display()
        );
        cu.sort();
        files.extend(cu);
    }
    let out = Command::new("python3")
        .arg(workspace_root().join("tools/nvrtc_compile.py"))
        .args(["--arch", "sm_80", "--arch", "sm_90"])
        .args(&files)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(2) {
        monogen_tests::skip::tool(
            "every_kernel_of_every_cuda_crate_compiles_with_nvrtc_for_sm80_and_sm90",
            "NVRTC (pip install nvidia-cuda-nvrtc-cu12)",
        );
        return;
    }
    assert!(out.status.success(), "a kernel does not compile:\n{stdout}\n{stderr}");
    let summary = format!("{} files x 2 architectures, 0 failed", files.len());
    assert!(stdout.contains(&summary), "expected `{summary}`:\n{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("ok ")).count(), files.len() * 2, "{stdout}");
    // `.ci/run` installs ptxas too, which checks the inline PTX that NVRTC passes through.
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        assert!(stdout.contains("assembled by ptxas"), "ptxas (nvidia-cuda-nvcc-cu12) is missing:\n{stdout}");
    }
}

#[test]
fn a_cuda_crate_without_a_gpu_says_so_and_exits_5() {
    let Some(model) = model_dir("stories260k") else { return };
    let gpu_here = ["/dev/nvidiactl", "/dev/nvidia0"].iter().any(|p| std::path::Path::new(p).exists());
    if gpu_here {
        monogen_tests::skip::because(
            "a_cuda_crate_without_a_gpu_says_so_and_exits_5",
            "this machine has an NVIDIA GPU; bench/gpu_check.sh runs the crates there",
        );
        return;
    }
    let binary = build_copy("stories260k-cuda-bf16");
    let out = Command::new(&binary)
        .args(["--model"])
        .arg(&model)
        .args(["--prompt", "Once upon a time", "--max-tokens", "4"])
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "exit code 5 without a GPU; stderr:\n{stderr}");
    assert!(stderr.contains("no GPU to run crate stories260k-cuda-bf16 on:"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing generated: {}", String::from_utf8_lossy(&out.stdout));
}

/// Whether the emulator's tools are here (g++, Python's numpy and safetensors); skips `test`
/// when not, which fails it under CI.
fn emulator_here(test: &str) -> bool {
    let gxx = Command::new("g++").arg("--version").output().is_ok_and(|o| o.status.success());
    let numpy =
        Command::new("python3").args(["-c", "import numpy, safetensors"]).status().is_ok_and(|s| s.success());
    if !gxx || !numpy {
        monogen_tests::skip::tool(test, "g++, or Python's numpy and safetensors");
    }
    gxx && numpy
}

/// Runs `tools/cuda_emulate.py` on the committed crate `name`: its kernels on the CPU (compiled
/// with g++ after tools/cuda_emu/emu.h), each against numpy, then its forward pass over the real
/// model `model` against transformers' logits and greedy tokens.
fn emulate(test: &str, name: &str, model: &str) {
    let Some(model) = model_dir(model) else { return };
    if emulator_here(test) {
        emulate_crate(&workspace_root().join("generated").join(name), &model);
    }
}

/// `tools/cuda_emulate.py` on the crate in `dir`, against the references of the model in `model`.
fn emulate_crate(dir: &std::path::Path, model: &std::path::Path) {
    let name = dir.display();
    let out = Command::new("python3")
        .arg(workspace_root().join("tools/cuda_emulate.py"))
        .arg(dir)
        .arg("--model")
        .arg(model)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name} under emulation:\n{stdout}\n{stderr}");
    assert!(stdout.contains(": every check passed"), "{stdout}");
    // Every kernel was checked, the forward pass against the logits, and greedy decoding.
    for check in [
        "ok rmsnorm",
        "ok matmul_",
        "ok rope (q)",
        "ok kv_store",
        "ok attention_prefill",
        "ok attention_decode",
        "ok swiglu",
        "ok greedy",
    ] {
        assert!(stdout.contains(check), "`{check}` missing:\n{stdout}");
    }
    assert!(!stdout.contains("FAIL"), "{stdout}");
}

#[test]
fn the_f32_cuda_crates_under_emulation_match_the_reference_logits_within_1e3() {
    let test = "the_f32_cuda_crates_under_emulation_match_the_reference_logits_within_1e3";
    emulate(test, "stories260k-cuda-f32", "stories260k");
    emulate(test, "aidreams260k-cuda-f32", "aidreams260k");
}

#[test]
fn the_bf16_cuda_crate_under_emulation_stays_within_kl_1e3_of_the_reference() {
    emulate(
        "the_bf16_cuda_crate_under_emulation_stays_within_kl_1e3_of_the_reference",
        "stories260k-cuda-bf16",
        "stories260k",
    );
}

/// `monogen init --device cuda --cuda-arch sm_90` of the model at `dir` (f32, no hardware class),
/// which refuses what a CUDA crate cannot be.
/// Checks the crate in `dir` with clippy, all targets, every warning an error.
fn lint_crate(dir: &std::path::Path) {
    let out = monogen_tests::clippy(&dir.join("Cargo.toml"));
    assert!(out.status.success(), "clippy of {}:\n{}", dir.display(), String::from_utf8_lossy(&out.stderr));
}

fn cuda_workload(dir: &std::path::Path, name: &str) -> Result<String, monogen::Error> {
    let options = InitOptions {
        name: name.into(),
        dtype: Dtype::F32,
        activations: Activations::F32,
        classifier_dtype: None,
        kv_cache: KvDtype::F32,
        threads: Some(1),
        cpu_features: CpuFeatures::parse("none").unwrap(),
        max_seq_len: None,
        typical_prompt_len: None,
        typical_decode_len: None,
        hardware: None,
        max_batch: None,
        serve: false,
        speculation: None,
        typical_text: None,
        requests_per_load: None,
        shared_prefix_len: None,
        cuda_arch: Some("sm_90".into()),
    };
    let templates = monogen::emit::Templates::load(&workspace_root()).unwrap();
    monogen::init::workload_file(dir, &options, &templates, &dir.join("workload.toml"))
}

/// The LLaMA variants of tests/fixtures as CUDA crates (SmolLM's 9 query and 3 key/value heads,
/// Qwen2's q/k/v biases and untied classifier, Llama 3.1's and linear scaled rotary frequencies,
/// Mistral's sliding window) generated, built, and run under emulation against transformers'
/// logits and greedy ids; a BERT encoder, which no CUDA crate can be yet, refused by name.
#[test]
fn the_llama_variants_as_cuda_crates_match_transformers_and_an_encoder_is_refused() {
    let test = "the_llama_variants_as_cuda_crates_match_transformers_and_an_encoder_is_refused";
    if !emulator_here(test) {
        return;
    }
    let root = workspace_root();
    let project = monogen::Project::load(&root).unwrap();
    let scratch = root.join("target/cuda-variants");
    std::fs::create_dir_all(&scratch).unwrap();
    for fixture in ["smollm-tiny", "qwen2-tiny", "llama31-rope-tiny", "linear-rope-tiny", "mistral-tiny"] {
        let dir = root.join("tests/fixtures").join(fixture);
        let name = format!("{fixture}-cuda-f32");
        let text = cuda_workload(&dir, &name).unwrap_or_else(|e| panic!("{fixture}: {e}"));
        let path = scratch.join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        let out = scratch.join(&name);
        let (_, output) = project.generate_into(&path, Some(&out)).unwrap();
        monogen::write::write(&out, &output, false).unwrap();
        // the launchers and the forward pass compile, with no warning of rustc or clippy, as
        // a committed crate (tests/tests/lints.rs)
        lint_crate(&out);
        emulate_crate(&out, &dir);
    }
    if let Some(bert) = model_dir("all-minilm-l6-v2") {
        let refused = cuda_workload(&bert, "all-minilm-l6-v2-cuda-f32").unwrap_err().to_string();
        assert!(refused.contains("CUDA crates are generated for LLaMA decoders only, for now"), "{refused}");
        assert!(refused.contains("workload.toml"), "names the file: {refused}");
    }
}
