//! Crates whose matmul packs its weights at load, on the real models against the reference
//! outputs. Most committed crates that get such a kernel are benchmark workloads without a
//! model of their shapes here (the BERT int8 crate is the exception), so each test generates its
//! crate from a scratch copy of the registry in which the packing kernel has the highest
//! priority, builds it, and runs its binary:
//! - `matmul/avx512-packed-threads`: stories260k (LLaMA; its classifier is tied to the
//!   embedding rows, which stay unpacked, and its 64-wide matrices end in a partial block; it
//!   also saves them packed and runs from the saved directory) and all-MiniLM-L6-v2 (BERT);
//! - `matmul/q8-avx512-vnni-packed-threads`, `matmul/q8-avx2-packed-threads`,
//!   `matmul/q8-avxvnni-packed-threads`, `matmul/bf16-avx512-packed-threads` and
//!   `matmul/bf16-avx2-packed-threads`: stories260k, against the greedy tokens of the committed
//!   int8 and bf16 crates, which read their weights unpacked.

use std::path::{Path, PathBuf};
use std::process::Command;

use monogen_tests::{
    build_crate, copy_dir, ids, max_abs_diff, model_dir, read_npy_f32, reference_json, workspace_root,
};
use serde_json::Value;

/// The AVX-512 features a generated crate may use on this machine (as the committed
/// `all-minilm-l6-v2-cpu-f32` lists them).
const AVX512: &str = r#""avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl""#;

/// Generates `workload` (a file of `workloads/`, renamed `name`, without its hardware class and
/// with the AVX-512 features, and VNNI for an int8 one) from a scratch registry that prefers
/// the packing kernel `implementation` (`interface/name`), builds it and returns its binary;
/// `None` on a CPU without those features.
fn packed_crate(scratch: &Path, workload: &str, name: &str, implementation: &str) -> Option<PathBuf> {
    let int8 = implementation.starts_with("matmul/q8-");
    // An AVX2 kernel runs on the workload's own CPU features (AVX2 and FMA), an AVX-VNNI one on
    // those and AVX-VNNI.
    let avxvnni = implementation.contains("-avxvnni-");
    let avx512 = !implementation.contains("-avx2-") && !avxvnni;
    let needs = [
        ("avx2", true, std::arch::is_x86_feature_detected!("avx2")),
        ("fma", true, std::arch::is_x86_feature_detected!("fma")),
        ("avx512f", avx512, std::arch::is_x86_feature_detected!("avx512f")),
        ("avx512vnni", int8 && avx512, std::arch::is_x86_feature_detected!("avx512vnni")),
        ("f16c", int8, std::arch::is_x86_feature_detected!("f16c")),
        ("avxvnni", avxvnni, std::arch::is_x86_feature_detected!("avxvnni")),
    ];
    if needs.iter().any(|&(_, needed, present)| needed && !present) {
        let features: Vec<&str> = needs.iter().filter(|n| n.1).map(|n| n.0).collect();
        monogen_tests::skip::cpu(&format!("{} ({implementation})", monogen_tests::current_test()), &features);
        return None;
    }
    for dir in ["interfaces", "implementations", "templates"] {
        copy_dir(&workspace_root().join(dir), &scratch.join(dir));
    }
    let manifest = scratch.join("implementations").join(implementation).join("manifest.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let priority = text.lines().find(|l| l.starts_with("priority = ")).unwrap().to_string();
    std::fs::write(&manifest, text.replace(&priority, "priority = 1000")).unwrap();

    let text = std::fs::read_to_string(workspace_root().join("workloads").join(workload)).unwrap();
    let old_name = text.lines().find(|l| l.starts_with("name = ")).unwrap().to_string();
    let mut text = text
        .replace(&old_name, &format!("name = \"{name}\""))
        .lines()
        .filter(|l| !l.starts_with("hardware = "))
        .collect::<Vec<_>>()
        .join("\n");
    if avxvnni {
        text = text.replace(r#""movbe"]"#, r#""movbe", "avxvnni"]"#);
    }
    if avx512 && !text.contains("avx512f") {
        let vnni = if int8 { r#", "avx512vnni""# } else { "" };
        text = text.replace(r#""movbe"]"#, &format!(r#""movbe", {AVX512}{vnni}]"#));
    }
    let path = scratch.join("workload.toml");
    std::fs::write(&path, text).unwrap();

    let project = monogen::Project::load(scratch).unwrap();
    let out = scratch.join(name);
    let (plan, output) = project.generate_into(&path, Some(&out)).unwrap();
    let (interface, kernel) = implementation.split_once('/').unwrap();
    let chosen = &plan.interface(interface).expect("the plan calls it").chosen;
    assert!(chosen.packs_weights && chosen.name == kernel, "{interface}/{} does not pack", chosen.name);
    monogen::write::write(&out, &output, false).unwrap();
    let source = std::fs::read_to_string(out.join("src/weights.rs")).unwrap();
    let loader = if int8 {
        "q8_packed"
    } else if implementation.starts_with("matmul/bf16-") {
        "bf16_packed("
    } else {
        ".packed("
    };
    assert!(source.contains(loader), "{source}");
    Some(build_crate(&out, name))
}

/// Runs `binary --save-model saved` on `model` and returns the JSON header of the
/// model.safetensors it writes.
fn save_model(binary: &Path, model: &Path, saved: &Path) -> Value {
    let out = Command::new(binary)
        .args(["--model", model.to_str().unwrap(), "--save-model", saved.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(saved.join("model.safetensors")).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    serde_json::from_slice(&bytes[8..8 + header_len]).unwrap()
}

/// The JSON report of `binary` continuing `prompt` greedily by 32 tokens from model directory
/// `dir`.
fn greedy(binary: &Path, dir: &Path, prompt: &[u32]) -> Value {
    let ids: Vec<String> = prompt.iter().map(u32::to_string).collect();
    let args =
        ["--model", dir.to_str().unwrap(), "--prompt-ids", &ids.join(","), "--max-tokens", "32", "--json"];
    json(binary, &args)
}

fn json(binary: &Path, args: &[&str]) -> Value {
    let out = Command::new(binary).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Asserts that `$binary` continues every reference prompt of stories260k (`$model`) greedily
/// by the same 32 tokens as the committed crate `$krate`, from the checkpoint and from the
/// directory `$saved` it saved.
macro_rules! continues_as_committed {
    ($krate:ident, $binary:expr, $model:expr, $saved:expr) => {{
        let committed = $krate::Model::load($model).unwrap();
        for case in reference_json($model)["greedy"].as_array().unwrap() {
            let prompt = ids(&case["prompt_ids"]);
            let params = $krate::GenerateParams { max_tokens: 32, ..Default::default() };
            let mut want = Vec::new();
            committed
                .session()
                .generate(&prompt, &params, |t| {
                    want.push(t);
                    true
                })
                .unwrap();
            for dir in [$model, $saved] {
                let out = greedy($binary, dir, &prompt);
                assert_eq!(ids(&out["generated_ids"]), want, "{}: {}", dir.display(), case["prompt"]);
            }
        }
    }};
}

#[test]
fn a_llama_crate_with_packed_weights_continues_as_the_reference() {
    let Some(model) = model_dir("stories260k") else { return };
    let scratch = tempfile::tempdir().unwrap();
    let Some(binary) = packed_crate(
        scratch.path(),
        "stories260k-cpu-f32.toml",
        "stories260k-packed",
        "matmul/avx512-packed-threads",
    ) else {
        return;
    };
    let weights = std::fs::read_to_string(scratch.path().join("stories260k-packed/src/weights.rs")).unwrap();
    assert!(weights.contains("classifier"), "a tied classifier gets its packed copy: {weights}");
    // The crate saves its matrices packed (with the layout's name), and continues the same from
    // the saved directory, which it maps instead of packing again.
    let saved = scratch.path().join("saved");
    let header = save_model(&binary, &model, &saved);
    let packed: Vec<&String> =
        header.as_object().unwrap().keys().filter(|n| n.ends_with(".packed")).collect();
    // 5 layers of 7 matrices and the tied classifier.
    assert_eq!(packed.len(), 36, "{packed:?}");
    assert!(packed.iter().all(|n| header[n.as_str()]["dtype"] == "F32"));
    assert_eq!(header["model.embed_tokens.weight"]["shape"], serde_json::json!([512, 64]));
    assert_eq!(header["monogen.packed_layout"]["dtype"], "U8");

    let reference = reference_json(&model);
    for case in reference["greedy"].as_array().unwrap() {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["new_ids"]);
        for dir in [&model, &saved] {
            let out = greedy(&binary, dir, &prompt);
            assert_eq!(
                ids(&out["generated_ids"]),
                want[..want.len().min(32)],
                "{}: {}",
                dir.display(),
                case["prompt"]
            );
        }
    }
}

#[test]
fn an_int8_crate_with_packed_weights_generates_as_the_unpacked_one_and_from_its_saved_directory() {
    int8_packed_generates_as_the_unpacked_one(
        "matmul/q8-avx512-vnni-packed-threads",
        "stories260k-q8-packed",
    );
}

#[test]
fn an_avx2_int8_crate_with_packed_weights_generates_as_the_unpacked_one_and_from_its_saved_directory() {
    int8_packed_generates_as_the_unpacked_one("matmul/q8-avx2-packed-threads", "stories260k-q8-avx2-packed");
}

#[test]
fn an_avxvnni_int8_crate_with_packed_weights_generates_as_the_unpacked_one_and_from_its_saved_directory() {
    int8_packed_generates_as_the_unpacked_one(
        "matmul/q8-avxvnni-packed-threads",
        "stories260k-q8-avxvnni-packed",
    );
}

/// Generates stories260k in int8 with the packing kernel `kernel`, checks its saved directory
/// and its greedy tokens against the committed int8 crate's, and that a damaged scale in the
/// saved directory is an error naming the tensor.
fn int8_packed_generates_as_the_unpacked_one(kernel: &str, name: &str) {
    let Some(model) = model_dir("stories260k") else { return };
    let scratch = tempfile::tempdir().unwrap();
    let Some(binary) = packed_crate(scratch.path(), "stories260k-cpu-int8.toml", name, kernel) else {
        return;
    };
    // Saved with the matrices packed (values and binary16 scales in one buffer each), and the
    // tied embedding's rows unpacked, which a step dequantizes.
    let saved = scratch.path().join("saved");
    let header = save_model(&binary, &model, &saved);
    let dtypes = |suffix: &str| -> Vec<String> {
        let names = header.as_object().unwrap().iter().filter(|(n, _)| n.ends_with(suffix));
        names.map(|(_, t)| t["dtype"].as_str().unwrap().to_string()).collect()
    };
    // 5 layers of 7 matrices and the tied classifier.
    assert_eq!(dtypes(".weight.packed"), vec!["I8"; 36]);
    assert!(dtypes(".weight_scale.packed").is_empty());
    assert_eq!(header["model.embed_tokens.weight"]["dtype"], "I8");
    assert!(dtypes("proj.weight").is_empty());

    // The same greedy tokens as the committed int8 crate (the same quantization; only the
    // order of the f32 additions differs), from the checkpoint and from the saved directory.
    continues_as_committed!(stories260k_cpu_int8, &binary, &model, &saved);

    // A saved packed scale that is NaN (binary16, the first of the matrix's first line of
    // scales) is an error naming the tensor (exit code 3).
    let scales = "model.layers.1.self_attn.k_proj.weight.packed";
    let damaged = scratch.path().join("damaged");
    std::fs::create_dir(&damaged).unwrap();
    for file in ["config.json", "tokenizer.json"] {
        std::fs::copy(saved.join(file), damaged.join(file)).unwrap();
    }
    let mut bytes = std::fs::read(saved.join("model.safetensors")).unwrap();
    let data = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let at = data + header[scales]["data_offsets"][0].as_u64().unwrap() as usize;
    bytes[at..at + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
    std::fs::write(damaged.join("model.safetensors"), bytes).unwrap();
    let out = Command::new(&binary)
        .args(["--model", damaged.to_str().unwrap(), "--prompt-ids", "1,2", "--max-tokens", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains(scales) && stderr.contains("NaN"), "{stderr}");
}

#[test]
fn a_bf16_crate_with_packed_weights_generates_as_the_unpacked_one_and_from_its_saved_directory() {
    bf16_packed_generates_as_the_unpacked_one(
        "matmul/bf16-avx512-packed-threads",
        "stories260k-bf16-packed",
        192,
    );
}

#[test]
fn an_avx2_bf16_crate_with_packed_weights_generates_as_the_unpacked_one() {
    bf16_packed_generates_as_the_unpacked_one(
        "matmul/bf16-avx2-packed-threads",
        "stories260k-bf16-avx2-packed",
        176,
    );
}

/// Generates stories260k in bf16 with the packing kernel `kernel`, whose layout pads the
/// 172-row projections to `padded` rows, and checks its saved directory and its greedy tokens
/// against the committed bf16 crate's.
fn bf16_packed_generates_as_the_unpacked_one(kernel: &str, name: &str, padded: usize) {
    let Some(model) = model_dir("stories260k") else { return };
    let scratch = tempfile::tempdir().unwrap();
    let Some(binary) = packed_crate(scratch.path(), "stories260k-cpu-bf16.toml", name, kernel) else {
        return;
    };
    // Saved with the matrices packed (blocks of 64 weight rows for AVX-512, 32 for AVX2, each
    // stored column by column; the last block of 32 or 16 rows), and the tied embedding's rows
    // unpacked.
    let saved = scratch.path().join("saved");
    let header = save_model(&binary, &model, &saved);
    let packed: Vec<&String> =
        header.as_object().unwrap().keys().filter(|n| n.ends_with(".packed")).collect();
    // 5 layers of 7 matrices and the tied classifier.
    assert_eq!(packed.len(), 36, "{packed:?}");
    assert!(packed.iter().all(|n| header[n.as_str()]["dtype"] == "BF16"));
    assert_eq!(header["model.layers.0.mlp.up_proj.weight.packed"]["shape"], serde_json::json!([padded * 64]));
    assert_eq!(header["model.embed_tokens.weight"]["dtype"], "BF16");
    assert_eq!(header["monogen.packed_layout"]["dtype"], "U8");

    // The same greedy tokens as the committed bf16 crate (the same bf16 weights times the same
    // f32 activations; only the order of the f32 additions differs), from the checkpoint and
    // from the saved directory.
    continues_as_committed!(stories260k_cpu_bf16, &binary, &model, &saved);
}

#[test]
fn a_bert_crate_with_packed_weights_embeds_as_the_reference() {
    let Some(model) = model_dir("all-minilm-l6-v2") else { return };
    let scratch = tempfile::tempdir().unwrap();
    let Some(binary) = packed_crate(
        scratch.path(),
        "all-minilm-l6-v2-cpu-f32.toml",
        "all-minilm-packed",
        "matmul/avx512-packed-threads",
    ) else {
        return;
    };
    let reference = reference_json(&model);
    let texts: Vec<&str> =
        reference["sentences"].as_array().unwrap().iter().map(|s| s["text"].as_str().unwrap()).collect();
    let mut args = vec!["--model", model.to_str().unwrap(), "--json"];
    for text in &texts {
        args.extend(["--text", text]);
    }
    let out = json(&binary, &args);
    let (shape, values) = read_npy_f32(&model.join("reference/normalized.npy"));
    let embeddings = out["embeddings"].as_array().unwrap();
    assert_eq!(embeddings.len(), shape[0]);
    for (i, vector) in embeddings.iter().enumerate() {
        let got: Vec<f32> = vector.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        let (diff, _) = max_abs_diff(&got, &values[i * shape[1]..(i + 1) * shape[1]]);
        assert!(diff <= 1e-4, "sentence {i}: {diff}");
    }
}
