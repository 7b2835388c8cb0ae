//! The `monogen` command line, end to end, on copies of the repository.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

#[test]
fn init_reproduces_the_committed_workloads() {
    let root = workspace_root();
    // (model, workload, CPU features, hardware class, files beside config.json that init reads)
    let cases: [(&str, &str, &str, &str, &[&str]); 3] = [
        ("stories260k", "stories260k-cpu-f32", "x86-64-v3", "amd-epyc-2c", &[]),
        ("aidreams260k", "aidreams260k-cpu-f32", "x86-64-v3", "amd-epyc-2c", &[]),
        (
            "all-minilm-l6-v2",
            "all-minilm-l6-v2-cpu-f32",
            "x86-64-v3",
            "amd-epyc-2c",
            &["modules.json", "1_Pooling/config.json", "sentence_bert_config.json"],
        ),
    ];
    for (model, name, cpu_features, hardware, extra) in cases {
        let dir = models_root().join(model);
        if !dir.join("config.json").is_file() {
            assert!(
                std::env::var("CI").map_or(true, |v| v != "true"),
                "{} is missing under CI",
                dir.display()
            );
            // Counted as tests/src/skip.rs counts skips (one `reason<TAB>test` line).
            let reason = format!("model {model} is not present (set MONOGEN_MODELS)");
            eprintln!("skipped init_of_{model}: {reason}");
            if let Some(log) = std::env::var_os("MONOGEN_SKIP_LOG") {
                use std::io::Write;
                let mut log = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
                log.write_all(format!("{reason}\tinit of {model}\n").as_bytes()).unwrap();
            }
            continue;
        }
        // config.json (and, for sentence-transformers models, their small JSON files) is enough.
        let alone = tempfile::tempdir().unwrap();
        let hf = alone.path().join(model);
        for file in ["config.json"].iter().chain(extra) {
            std::fs::create_dir_all(hf.join(file).parent().unwrap()).unwrap();
            std::fs::copy(dir.join(file), hf.join(file)).unwrap();
        }
        let out = monogen(
            &root,
            &[
                "init",
                "--hf",
                hf.to_str().unwrap(),
                "--name",
                name,
                "--threads",
                "2",
                "--cpu-features",
                cpu_features,
                "--hardware",
                hardware,
            ],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        let committed = std::fs::read_to_string(root.join(format!("workloads/{name}.toml"))).unwrap();
        let strip =
            |s: &str| s.lines().filter(|l| !l.starts_with("# Written by")).collect::<Vec<_>>().join("\n");
        assert_eq!(strip(&stdout(&out)), strip(&committed), "init output differs from workloads/{name}.toml");
    }
}

/// A small LLaMA's config.json, for `init`.
const LLAMA_CONFIG: &str = r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 172,
    "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 512,
    "max_position_embeddings": 512, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": true}"#;

/// A small BERT's config.json, for `init`.
const BERT_CONFIG: &str = r#"{"model_type": "bert", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 512, "max_position_embeddings": 64,
    "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu"}"#;

#[test]
fn init_writes_a_bf16_kv_cache_for_decoders_and_refuses_it_for_encoders() {
    let root = workspace_root();
    let temp = tempfile::tempdir().unwrap();
    let (llama, bert) = (temp.path().join("llama"), temp.path().join("bert"));
    for dir in [&llama, &bert] {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(llama.join("config.json"), LLAMA_CONFIG).unwrap();
    let args = |dir: &std::path::Path| {
        ["init", "--hf", dir.to_str().unwrap(), "--name", "m", "--kv-cache", "bf16", "--hardware", "none"]
            .map(String::from)
    };
    let out = monogen(&root, &args(&llama).each_ref().map(String::as_str));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("[kv_cache]\ndtype = \"bf16\""), "{text}");
    let w = monogen::workload::WorkloadSource::from_text("m.toml", &text).parse().unwrap();
    assert_eq!(w.kv_cache.dtype, monogen::workload::KvDtype::Bf16);

    std::fs::write(bert.join("config.json"), BERT_CONFIG).unwrap();
    let out = monogen(&root, &args(&bert).each_ref().map(String::as_str));
    assert!(!out.status.success());
    assert!(stderr(&out).contains("keeps no KV cache"), "{}", stderr(&out));
    let out = monogen(&root, &["init", "--hf", llama.to_str().unwrap(), "--name", "m", "--kv-cache", "int8"]);
    assert!(stderr(&out).contains("unknown KV cache dtype `int8`; use f32 or bf16"), "{}", stderr(&out));
}

#[test]
fn init_output_is_never_overwritten_without_force() {
    let root = workspace_root();
    let temp = tempfile::tempdir().unwrap();
    std::fs::write(temp.path().join("config.json"), LLAMA_CONFIG).unwrap();
    let file = temp.path().join("w.toml");
    let init = |name: &str, force: bool| {
        let mut args =
            vec!["init", "--hf", temp.path().to_str().unwrap(), "--name", name, "--hardware", "none"];
        args.extend(["-o", file.to_str().unwrap()]);
        if force {
            args.push("--force");
        }
        monogen(&root, &args)
    };
    let out = init("first", false);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read_to_string(&file).unwrap().contains("name = \"first\""));
    let out = init("second", false);
    assert!(!out.status.success(), "a second init overwrote {}", file.display());
    assert!(stderr(&out).contains("exists; pass --force to overwrite it"), "{}", stderr(&out));
    assert!(std::fs::read_to_string(&file).unwrap().contains("name = \"first\""), "the file was changed");
    let out = init("second", true);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read_to_string(&file).unwrap().contains("name = \"second\""));
}

/// `init --serve` gives a decoder's server a chat path exactly where the model has a chat
/// template, copies that template (and the tokens it renders) into the workload as Hugging
/// Face's tokenizer finds it, and the crate embeds it: it has no chat code without one, and
/// reads no template at run time with one.
#[test]
fn init_serve_chats_where_the_model_has_a_chat_template() {
    let root = workspace_root();
    let temp = tempfile::tempdir().unwrap();
    let template = "{% for m in messages %}{{ m['content'] }}{% endfor %}";
    let jinja = "{{ bos_token }}{% for m in messages %}\"{{ m['content'] }}\"#\n{% endfor %}";
    let named = serde_json::json!({
        "bos_token": { "content": "<|begin|>", "lstrip": false },
        "eos_token": "<|end|>",
        "chat_template": [{ "name": "tool_use", "template": "tools" }, { "name": "default", "template": template }],
    });
    // (model folder, files beside config.json, the template and BOS and EOS the server renders)
    type Case<'a> = (&'a str, Vec<(&'a str, String)>, Option<(&'a str, &'a str, &'a str)>);
    let cases: [Case; 6] = [
        ("base", vec![], None),
        ("config-without", vec![("tokenizer_config.json", r#"{"bos_token": "<s>"}"#.to_string())], None),
        (
            "config",
            vec![("tokenizer_config.json", serde_json::json!({ "chat_template": template }).to_string())],
            Some((template, "", "")),
        ),
        (
            "named",
            vec![("tokenizer_config.json", named.to_string())],
            Some((template, "<|begin|>", "<|end|>")),
        ),
        ("jinja", vec![("chat_template.jinja", jinja.to_string())], Some((jinja, "", ""))),
        (
            "both",
            vec![("chat_template.jinja", jinja.to_string()), ("tokenizer_config.json", named.to_string())],
            Some((jinja, "<|begin|>", "<|end|>")),
        ),
    ];
    for (name, files, chat) in cases {
        let dir = temp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), LLAMA_CONFIG).unwrap();
        for (file, text) in &files {
            std::fs::write(dir.join(file), text).unwrap();
        }
        let workload = temp.path().join(format!("{name}.toml"));
        let out = monogen(
            &root,
            &[
                "init",
                "--hf",
                dir.to_str().unwrap(),
                "--name",
                name,
                "--hardware",
                "none",
                "--serve",
                "--output",
            ]
            .into_iter()
            .chain([workload.to_str().unwrap()])
            .collect::<Vec<_>>(),
        );
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let text = std::fs::read_to_string(&workload).unwrap();
        assert_eq!(text.contains("\n[serving.chat]\n"), chat.is_some(), "{name}: {text}");
        let w = monogen::workload::WorkloadSource::from_text("w.toml", &text).parse().unwrap();
        let want = chat.map(|(template, bos, eos)| monogen::workload::Chat {
            template: template.into(),
            bos_token: bos.into(),
            eos_token: eos.into(),
        });
        assert_eq!(w.serving.as_ref().unwrap().chat, want, "{name}");
        let krate = temp.path().join(format!("{name}-crate"));
        let out = monogen(&root, &["build", workload.to_str().unwrap(), "--out", krate.to_str().unwrap()]);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let serve = std::fs::read_to_string(krate.join("src/serve.rs")).unwrap();
        let manifest = std::fs::read_to_string(krate.join("Cargo.toml")).unwrap();
        assert_eq!(serve.contains("ChatTemplate"), chat.is_some(), "{name}");
        assert_eq!(manifest.contains("minijinja"), chat.is_some(), "{name}");
        assert!(!serve.contains("only_if"), "{name}: a condition was left in the crate");
        let embedded = std::fs::read_to_string(krate.join("src/chat_template.rs")).ok();
        assert_eq!(embedded.is_some(), chat.is_some(), "{name}");
        if let (Some(embedded), Some((template, _, _))) = (embedded, chat) {
            assert!(
                embedded.contains(template),
                "{name}: the template is not in the crate as it reads:\n{embedded}"
            );
        }
        for file in ["serve.rs", "http.rs", "main.rs", "tokenizer.rs"] {
            let source = std::fs::read_to_string(krate.join("src").join(file)).unwrap();
            assert!(
                !source.contains("tokenizer_config") && !source.contains(".jinja"),
                "{name}: {file} reads a template"
            );
        }
    }
}

#[test]
fn init_writes_requests_per_load_for_decoders_and_encoders() {
    let root = workspace_root();
    let temp = tempfile::tempdir().unwrap();
    for (model, config) in [("llama", LLAMA_CONFIG), ("bert", BERT_CONFIG)] {
        let dir = temp.path().join(model);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), config).unwrap();
        let init = |extra: &[&str]| {
            let mut args = vec!["init", "--hf", dir.to_str().unwrap(), "--name", "m", "--hardware", "none"];
            args.extend_from_slice(extra);
            monogen(&root, &args)
        };
        let out = init(&["--requests-per-load", "1"]);
        assert!(out.status.success(), "{model}: {}", stderr(&out));
        let text = stdout(&out);
        assert!(text.contains("\nrequests_per_load = 1\n"), "{model}: {text}");
        let w = monogen::workload::WorkloadSource::from_text("m.toml", &text).parse().unwrap();
        assert_eq!(w.request.requests_per_load(), Some(1), "{model}");
        let out = init(&[]);
        assert!(!stdout(&out).contains("requests_per_load"), "{model}: absent by default");
        let out = init(&["--requests-per-load", "0"]);
        assert!(!out.status.success(), "{model}");
        assert!(stderr(&out).contains("--requests-per-load"), "{model}: {}", stderr(&out));
    }
}

#[test]
fn init_writes_bf16_activations_for_bf16_weights_only() {
    let root = workspace_root();
    let temp = tempfile::tempdir().unwrap();
    for (model, config) in [("llama", LLAMA_CONFIG), ("bert", BERT_CONFIG)] {
        let dir = temp.path().join(model);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), config).unwrap();
        let dir = dir.to_str().unwrap();
        let args = [
            "init",
            "--hf",
            dir,
            "--name",
            "m",
            "--dtype",
            "bf16",
            "--activations",
            "bf16",
            "--hardware",
            "none",
        ];
        let out = monogen(&root, &args);
        assert!(out.status.success(), "{model}: {}", stderr(&out));
        let text = stdout(&out);
        assert!(
            text.contains("dtype = \"bf16\"\n# Optional: the linear layers' products round"),
            "{model}: {text}"
        );
        let w = monogen::workload::WorkloadSource::from_text("m.toml", &text).parse().unwrap();
        assert_eq!(w.weights.activations, monogen::workload::Activations::Bf16, "{model}");
        let out = monogen(&root, &["init", "--hf", dir, "--name", "m", "--activations", "bf16"]);
        assert!(!out.status.success());
        assert!(stderr(&out).contains("--activations bf16 rounds the activations of bf16 weights' products, and --dtype is f32; add --dtype bf16"), "{model}: {}", stderr(&out));
    }
}

#[test]
fn init_refuses_configs_it_cannot_honour() {
    let temp = tempfile::tempdir().unwrap();
    let config = r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2,
        "num_attention_heads": 8, "vocab_size": 512, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}"#;
    std::fs::write(temp.path().join("config.json"), config).unwrap();
    let out = monogen(&workspace_root(), &["init", "--hf", temp.path().to_str().unwrap(), "--name", "x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("config.json field `rope_scaling` cannot be honoured"), "{}", stderr(&out));
    assert!(stderr(&out).contains("config.json:2:"), "{}", stderr(&out));
}

#[test]
fn explain_shows_every_candidate_and_why() {
    let repo = scratch_repo();
    let out = monogen(repo.path(), &["explain", WORKLOAD]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for expected in [
        "matmul<f32>: ",
        "  element type f32: takes activations = f32, weights = f32 (implementations of other element types do not compete)",
        "  avx2-fma 1.0.0 (priority 20): CHOSEN, highest declared priority (20) among 2 compatible implementations",
        "  scalar 1.0.0 (priority 0): compatible, not chosen: declared priority 0 is below avx2-fma's 20",
        "start-up check: avx2, fma",
        "memory: weights 1015.8 KiB (260032 parameters, f32, memory-mapped); per session: KV cache 640.0 KiB (f32)",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }

    // Without AVX2 the scalar kernels are chosen, and the reason is given.
    without_avx2(&repo.path().join(WORKLOAD));
    let out = monogen(repo.path(), &["explain", WORKLOAD]);
    let text = stdout(&out);
    assert!(text.contains("  avx2-fma 1.0.0 (priority 20): rejected: needs CPU features avx2, fma, which target.cpu_features does not list"), "{text}");
    assert!(text.contains("  scalar 1.0.0 (priority 0): CHOSEN"), "{text}");
    assert!(text.contains("start-up check: none"), "{text}");

    let out = monogen(repo.path(), &["explain", WORKLOAD, "--json"]);
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["interfaces"][1]["chosen"]["name"], "scalar");
}

/// Makes the workload at `path` target a CPU with SSE4.2 alone.
fn without_avx2(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap();
    let start = text.find("cpu_features = [").unwrap();
    let end = start + text[start..].find(']').unwrap() + 1;
    std::fs::write(path, format!("{}cpu_features = [\"sse4.2\"]{}", &text[..start], &text[end..])).unwrap();
}

#[test]
fn explain_shows_the_packing_at_load_a_workload_counts() {
    // stories15M int8 is run as a process per request (`requests_per_load = 1`): its packing
    // kernels' records carry the time of their packing at load, charged in full to a request.
    let root = workspace_root();
    let out = monogen(&root, &["explain", "workloads/stories15m-bench-cpu-int8.toml"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("; each request loads the model (packing at load counted in full)"), "{text}");
    let q8 = &text[text.find("\nmatmul<q8>:").unwrap()..];
    let q8 = &q8[..q8[1..].find("\n\n").unwrap()];
    let packed =
        q8.lines().skip_while(|l| !l.starts_with("  q8-avx512-vnni-packed-threads ")).nth(1).unwrap();
    assert!(
        packed.contains("; packing at load ")
            && packed.contains(" (slowest ")
            && packed.contains(" of it counted per request)"),
        "{q8}"
    );
    let chosen = q8.lines().find(|l| l.contains(": CHOSEN, ")).unwrap();
    assert!(chosen.contains(", packing at load counted in full)"), "{q8}");
    // A workload that does not count the load charges none of it.
    let out = monogen(&root, &["explain", "workloads/stories110m-bench-cpu-int8.toml"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(!text.contains("loads the model") && !text.contains("counted per request"), "{text}");
}

#[test]
fn a_workload_no_implementation_fits_is_refused_with_every_reason() {
    // Without AVX2 the SIMD products need features the workload lacks, and a scratch registry's
    // scalar product wants a wider model: each f32 candidate is named with its reason, and no
    // implementation of another element type is (they never compete).
    let repo = scratch_repo();
    let manifest = repo.path().join("implementations/matmul/scalar/manifest.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, format!("{text}\n[constraints.shapes]\nhidden_size = {{ min = 4096 }}\n"))
        .unwrap();
    without_avx2(&repo.path().join(WORKLOAD));
    let out = monogen(repo.path(), &["build", WORKLOAD]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    for expected in [
        "no implementation of `matmul` fits workload `stories260k-cpu-f32`",
        "matmul/scalar: needs hidden_size >= 4096: the workload's hidden_size is 64, below the minimum 4096",
        "matmul/avx2-fma: needs CPU features avx2, fma, which target.cpu_features does not list",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in\n{err}");
    }
    assert!(!err.contains("matmul/bf16-") && !err.contains("matmul/q8-"), "{err}");
}

#[test]
fn a_workload_no_element_type_fits_is_refused_with_the_types_it_takes() {
    let repo = scratch_repo();
    let path = repo.path().join(WORKLOAD);
    let text = std::fs::read_to_string(&path).unwrap().replace("dtype = \"f32\"", "dtype = \"f16\"");
    std::fs::write(&path, text).unwrap();
    let out = monogen(repo.path(), &["build", WORKLOAD]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("no element type of `matmul` fits workload `stories260k-cpu-f32`: interface `matmul` takes { activations = f32, weights = f32 }, or { activations = f32, weights = bf16 }, or"),
        "{err}"
    );
    assert!(err.contains("; the workload has activations = f32, weights = f16"), "{err}");
    assert!(err.contains("change the workload's dtypes to one the interface takes"), "{err}");
}

#[test]
fn bad_workloads_are_located_and_explained() {
    let repo = scratch_repo();
    let path = repo.path().join(WORKLOAD);
    let text = std::fs::read_to_string(&path).unwrap().replace("num_kv_heads = 4", "num_kv_heads = 3");
    std::fs::write(&path, text).unwrap();
    let out = monogen(repo.path(), &["build", WORKLOAD]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("error: model.num_heads (8) is not a multiple of model.num_kv_heads (3)"), "{err}");
    assert!(err.contains("workloads/stories260k-cpu-f32.toml:18:16"), "{err}");
    assert!(err.contains("help: grouped-query attention needs num_heads divisible by num_kv_heads"), "{err}");
    assert!(!repo.path().join("generated").exists(), "nothing is written for a bad workload");
}

#[test]
fn a_kernel_that_breaks_its_interface_is_rejected() {
    let repo = scratch_repo();
    let kernel = repo.path().join("implementations/matmul/avx2-fma/kernel.rs");
    let source = std::fs::read_to_string(&kernel).unwrap();
    let broken = source.replacen("w: &[f32], rows: usize)", "w: &[f32], rows: u32)", 1);
    assert_ne!(source, broken);
    std::fs::write(&kernel, broken).unwrap();
    let out = monogen(repo.path(), &["explain", WORKLOAD]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("`matmul` does not match the signature that interface `matmul<f32>` declares"),
        "{err}"
    );
    assert!(err.contains("implementations/matmul/avx2-fma/kernel.rs:"), "{err}");
    assert!(err.contains("rows: usize") && err.contains("rows: u32"), "{err}");
}

#[test]
fn build_writes_only_changes_refuses_hand_edits_and_check_says_why() {
    let repo = scratch_repo();
    let out = monogen(repo.path(), &["build", WORKLOAD]);
    assert!(out.status.success(), "{}", stderr(&out));
    let crate_dir = repo.path().join("generated/stories260k-cpu-f32");
    assert!(stderr(&out).contains("34 created"), "{}", stderr(&out));
    assert_eq!(monogen(repo.path(), &["check", "--all"]).status.code(), Some(0));
    std::fs::write(crate_dir.join("Cargo.lock"), "# user's lock\n").unwrap();
    std::fs::create_dir_all(crate_dir.join("target/debug")).unwrap();
    std::fs::write(crate_dir.join("target/debug/x"), "artifact").unwrap();

    let out = monogen(repo.path(), &["build", WORKLOAD]);
    assert!(stderr(&out).contains("is up to date"), "{}", stderr(&out));

    // A changed workload: check fails and says why, build rewrites only what changed.
    let path = repo.path().join(WORKLOAD);
    std::fs::write(&path, std::fs::read_to_string(&path).unwrap().replace("threads = 2", "threads = 3"))
        .unwrap();
    let check = monogen(repo.path(), &["check", WORKLOAD]);
    assert_eq!(check.status.code(), Some(1));
    let report = stdout(&check);
    assert!(report.contains("because the workload changed"), "{report}");
    assert!(report.contains("differs: src/lib.rs"), "{report}");
    assert!(report.contains("fix: monogen build workloads/stories260k-cpu-f32.toml"), "{report}");
    let out = monogen(repo.path(), &["build", WORKLOAD]);
    assert!(out.status.success());
    assert!(stderr(&out).contains("0 created, 4 updated, 0 removed, 30 unchanged"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(crate_dir.join("Cargo.lock")).unwrap(), "# user's lock\n");
    assert_eq!(std::fs::read_to_string(crate_dir.join("target/debug/x")).unwrap(), "artifact");

    // A hand edit is refused, and kept, unless --force.
    let lib = crate_dir.join("src/lib.rs");
    let edited = std::fs::read_to_string(&lib)
        .unwrap()
        .replace("pub const THREADS: usize = 3;", "pub const THREADS: usize = 64;");
    std::fs::write(&lib, &edited).unwrap();
    std::fs::write(&path, std::fs::read_to_string(&path).unwrap().replace("threads = 3", "threads = 2"))
        .unwrap();
    let out = monogen(repo.path(), &["build", WORKLOAD]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("refusing to overwrite 1 file that was edited by hand"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read_to_string(&lib).unwrap(), edited);
    assert!(
        stdout(&monogen(repo.path(), &["check", WORKLOAD])).contains("differs: src/lib.rs (edited by hand)")
    );
    assert!(monogen(repo.path(), &["build", WORKLOAD, "--force"]).status.success());
    assert_eq!(monogen(repo.path(), &["check", "--all"]).status.code(), Some(0));
}

#[test]
fn an_interrupted_build_leaves_the_previous_generation_whole() {
    let repo = scratch_repo();
    assert!(monogen(repo.path(), &["build", WORKLOAD]).status.success());
    let crate_dir = repo.path().join("generated/stories260k-cpu-f32");
    let before = read_tree(&crate_dir);
    let path = repo.path().join(WORKLOAD);
    std::fs::write(&path, std::fs::read_to_string(&path).unwrap().replace("threads = 2", "threads = 5"))
        .unwrap();

    for fault in ["staged:1", "staged:3"] {
        let out = Command::new(env!("CARGO_BIN_EXE_monogen"))
            .args(["build", WORKLOAD])
            .current_dir(repo.path())
            .env("MONOGEN_FAULT", fault)
            .output()
            .unwrap();
        assert!(!out.status.success(), "the fault stops the build");
        assert!(crate_dir.join(".monogen-staging").exists(), "the new files were staged, not written");
        let after: Vec<_> =
            read_tree(&crate_dir).into_iter().filter(|(p, _)| !p.starts_with(".monogen-staging")).collect();
        assert_eq!(after, before, "after {fault}: the previous generation is untouched");
    }

    // A run killed after its commit point is completed by the next one.
    let out = Command::new(env!("CARGO_BIN_EXE_monogen"))
        .args(["build", WORKLOAD])
        .current_dir(repo.path())
        .env("MONOGEN_FAULT", "applied:1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let out = monogen(repo.path(), &["check", WORKLOAD]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(!crate_dir.join(".monogen-staging").exists());
    assert!(std::fs::read_to_string(crate_dir.join("src/lib.rs")).unwrap().contains("THREADS: usize = 5"));
}

#[test]
fn foreign_output_directories_are_refused() {
    let repo = scratch_repo();
    let out_dir = repo.path().join("mine");
    std::fs::create_dir(&out_dir).unwrap();
    std::fs::write(out_dir.join("notes.md"), "keep me").unwrap();
    let out = monogen(repo.path(), &["build", WORKLOAD, "--out", "mine"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is not empty and holds no monogen.lock"), "{}", stderr(&out));
    assert_eq!(read_tree(&out_dir).len(), 1);
}

#[test]
fn stale_files_of_an_older_generation_are_removed() {
    let repo = scratch_repo();
    assert!(monogen(repo.path(), &["build", WORKLOAD]).status.success());
    let crate_dir = repo.path().join("generated/stories260k-cpu-f32");
    assert!(crate_dir.join("src/kernels/shared/avx2_math.rs").exists());
    // Without AVX2 no kernel uses the shared AVX2 helpers any more.
    let path = repo.path().join(WORKLOAD);
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text.find("cpu_features = [").unwrap();
    let end = start + text[start..].find(']').unwrap() + 1;
    std::fs::write(&path, format!("{}cpu_features = []{}", &text[..start], &text[end..])).unwrap();
    let out = monogen(repo.path(), &["build", WORKLOAD]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!crate_dir.join("src/kernels/shared/avx2_math.rs").exists());
    assert!(!crate_dir.join("src/kernels/shared/avx2_attention.rs").exists());
    assert_eq!(monogen(repo.path(), &["check", "--all"]).status.code(), Some(0));
}

#[test]
fn only_weights_beyond_every_cache_are_copied_into_memory_at_load() {
    let root = workspace_root();
    let resident = |workload: &Path| {
        let out = monogen(&root, &["explain", workload.to_str().unwrap(), "--json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        plan["consts"]["resident_weights"]
            .as_bool()
            .unwrap_or_else(|| panic!("no resident_weights in {plan}"))
    };
    let committed = |name: &str| root.join("workloads").join(format!("{name}.toml"));
    // TinyLlama's 4.4 GB are copied; stories110M's 438 MB and stories260k's 1 MB are mapped.
    assert!(resident(&committed("tinyllama-bench-cpu-f32")));
    assert!(!resident(&committed("stories110m-bench-cpu-f32")));
    assert!(!resident(&committed("stories260k-cpu-f32")));
    // A crate whose matmul packs its weights holds them in copies already, or maps a file saved
    // with `--save-model`, which decodes as fast: no copy. TinyLlama's int8 matrices (1.24 GB)
    // are quantized and packed at load, its bf16 ones (2.2 GB) packed.
    assert!(!resident(&committed("tinyllama-bench-cpu-int8")));
    assert!(!resident(&committed("tinyllama-bench-cpu-bf16")));
    // Without AVX-512 its bf16 matmul (`avx2-fma-threads`) reads the file as it is: copied.
    let scratch = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(committed("tinyllama-bench-cpu-bf16")).unwrap();
    let avx512 = r#", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"]"#;
    assert!(text.contains(avx512), "{text}");
    let avx2 = scratch.path().join("tinyllama-bench-cpu-bf16-avx2.toml");
    std::fs::write(
        &avx2,
        text.replace(avx512, "]")
            .replace("name = \"tinyllama-bench-cpu-bf16\"", "name = \"tinyllama-bench-cpu-bf16-avx2\""),
    )
    .unwrap();
    assert!(resident(&avx2));
    let bf16 = scratch.path().join("bf16");
    let out = monogen(&root, &["build", avx2.to_str().unwrap(), "--out", bf16.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The copy is of a file that holds the matrices in the crate's dtype.
    let weights =
        std::fs::read_to_string(root.join("generated/tinyllama-bench-cpu-f32/src/weights.rs")).unwrap();
    assert!(weights.contains("TensorFile::open(path)?.resident(safetensors::Dtype::F32)?"), "{weights}");
    let weights = std::fs::read_to_string(bf16.join("src/weights.rs")).unwrap();
    assert!(weights.contains("TensorFile::open(path)?.resident(safetensors::Dtype::BF16)?"), "{weights}");
    let weights = std::fs::read_to_string(root.join("generated/stories260k-cpu-f32/src/weights.rs")).unwrap();
    assert!(!weights.contains("resident"), "{weights}");
    // ... and only where the kernel maps the file mostly in small pages, which the crate reads
    // from /proc/self/smaps with runtime/huge_pages.rs, a module only these crates carry.
    for (src, carries) in [
        (bf16.join("src"), true),
        (root.join("generated/tinyllama-bench-cpu-f32/src"), true),
        (root.join("generated/stories260k-cpu-f32/src"), false),
        (root.join("generated/tinyllama-bench-cpu-bf16/src"), false),
    ] {
        assert_eq!(src.join("huge_pages.rs").exists(), carries, "{}", src.display());
        let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
        assert_eq!(lib.contains("mod huge_pages;"), carries, "{}", src.display());
    }
    let resident = std::fs::read_to_string(bf16.join("src/resident.rs")).unwrap();
    assert!(resident.contains("huge_pages::share(&self.map)"), "{resident}");
}

/// A kernel that packs its weights declares it, exposes its interface's packing function, and
/// may do so only for an interface that has one; each slip is refused with the reason.
#[test]
fn packing_kernels_are_checked_against_the_interface() {
    let cases: [(&str, &str, &str, &str, &str); 7] = [
        // Packs without saying so: `pack` is then an item the interface does not declare.
        (
            "matmul/avx512-packed",
            "manifest.toml",
            "packs_weights = true\n",
            "",
            "`pack` is public but not part of interface `matmul<f32>`",
        ),
        // Says so without the function.
        (
            "matmul/avx512-packed",
            "kernel.rs",
            "pub fn pack(",
            "fn pack_rows(",
            "missing `pack`, which interface `matmul<f32>` requires",
        ),
        // Says so for an interface that has no packing function.
        (
            "gelu/scalar",
            "manifest.toml",
            "shared = []\n",
            "shared = []\npacks_weights = true\n",
            "interface `gelu` declares no packing function",
        ),
        // Packs without naming the length of a packed matrix (which a crate checks a saved
        // model's packed matrices against), or names something else.
        (
            "matmul/avx512-packed",
            "manifest.toml",
            "packed_len = \"avx512_packed::packed_len\"\n",
            "",
            "`packs_weights`, but no `packed_len`",
        ),
        (
            "matmul/avx512-packed",
            "manifest.toml",
            "avx512_packed::packed_len",
            "avx512_packed::packed_length",
            "shared module `avx512_packed` has no function `packed_length`",
        ),
        (
            "matmul/avx512-packed",
            "manifest.toml",
            "avx512_packed::packed_len",
            "avx512_packed::pack",
            "`avx512_packed::pack` is `pub fn pack(w: &[f32], n: usize, k: usize) -> Vec<f32>`; `packed_len` needs",
        ),
        (
            "matmul/avx512-packed",
            "manifest.toml",
            "avx512_packed::packed_len",
            "amx_bf16::packed_len",
            "`packed_len` names shared module `amx_bf16`, which `shared` does not list",
        ),
    ];
    assert_each_slip_refused(&cases);
}

/// For each `(implementation, file, from, to, expected)`: in a scratch repository whose
/// `implementations/<implementation>/<file>` has `from` replaced by `to`, `monogen build`
/// fails, saying `expected`.
fn assert_each_slip_refused(cases: &[(&str, &str, &str, &str, &str)]) {
    for &(implementation, file, from, to, expected) in cases {
        let repo = scratch_repo();
        let path = repo.path().join("implementations").join(implementation).join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{implementation}/{file} no longer holds {from:?}");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        let out = monogen(repo.path(), &["build", WORKLOAD]);
        assert!(!out.status.success(), "{implementation}: {}", stdout(&out));
        assert!(stderr(&out).contains(expected), "{implementation}: {}", stderr(&out));
    }
}

/// A kernel on the crate's thread team names its job type, a shared module's public type or a
/// `pub(crate)` struct of its kernel.rs, and only such a kernel names one; each slip is refused
/// with the reason.
#[test]
fn team_jobs_are_checked() {
    let cases: [(&str, &str, &str, &str, &str); 8] = [
        // On the team without naming the job.
        (
            "swiglu/avx512-threads",
            "manifest.toml",
            "team_job = \"Shared\"\n",
            "",
            "uses shared module `team` but names no `team_job`",
        ),
        // Naming a job without the team.
        (
            "gelu/scalar",
            "manifest.toml",
            "shared = []\n",
            "shared = []\nteam_job = \"Shared\"\n",
            "`team_job = \"Shared\"`, but `shared` does not list `team`",
        ),
        // A job that kernel.rs does not define.
        (
            "swiglu/avx512-threads",
            "manifest.toml",
            "team_job = \"Shared\"\n",
            "team_job = \"Product\"\n",
            "team job `Product` is not a struct, enum or type alias of implementations/swiglu/avx512-threads/kernel.rs",
        ),
        // A job that the crate's `TeamJob` could not hold.
        (
            "swiglu/avx512-threads",
            "kernel.rs",
            "pub(crate) struct Shared {",
            "struct Shared {",
            "team job `Shared` must be `pub(crate)`",
        ),
        // A shared module's type, of a module that the kernel does not use.
        (
            "matmul/avx512-threads",
            "manifest.toml",
            "team_job = \"avx512_matmul::Product<W>\"",
            "team_job = \"avx512_packed::Packed\"",
            "`team_job` names shared module `avx512_packed`, which `shared` does not list",
        ),
        // A type that the shared module does not define.
        (
            "matmul/avx512-threads",
            "manifest.toml",
            "team_job = \"avx512_matmul::Product<W>\"",
            "team_job = \"avx512_matmul::Products<W>\"",
            "shared module `avx512_matmul` has no public struct or type `Products`",
        ),
        // Not a type.
        (
            "matmul/avx512-threads",
            "manifest.toml",
            "team_job = \"avx512_matmul::Product<W>\"",
            "team_job = \"avx512_matmul::Product<\"",
            "`team_job = \"avx512_matmul::Product<\"` is not a type's path",
        ),
        // A type argument that the kernel does not define.
        (
            "kv_cache/bf16-avx512-threads",
            "manifest.toml",
            "team_job = \"kv_split::Split<RoundBf16>\"",
            "team_job = \"kv_split::Split<RoundBf17>\"",
            "`RoundBf17`, which team job `kv_split::Split<RoundBf17>` names, is not a struct, enum or type alias of implementations/kv_cache/bf16-avx512-threads/kernel.rs",
        ),
    ];
    assert_each_slip_refused(&cases);
}

/// An implementation of an interface with element types declares the types it takes, which
/// must be those of one of the interface's element types, and its kernel exposes the
/// interface's signatures with that element type's types; each slip is refused with the reason.
#[test]
fn element_types_are_checked() {
    let cases: [(&str, &str, &str, &str, &str); 4] = [
        // Types that no element type of `matmul` takes.
        (
            "matmul/bf16-avx512-repack-threads",
            "manifest.toml",
            "elements = { weights = \"bf16\", activations = \"f32\" }",
            "elements = { weights = \"f16\", activations = \"f32\" }",
            "`elements = { activations = f32, weights = f16 }`, but interface `matmul` takes { activations = f32, weights = f32 }, or",
        ),
        // No element types at all.
        (
            "kv_cache/bf16-avx512",
            "manifest.toml",
            "elements = { kv = \"bf16\" }",
            "",
            "no `elements`, but interface `kv_cache` takes { kv = f32 }, or { kv = bf16 }",
        ),
        // Element types where the interface has none.
        (
            "gelu/scalar",
            "manifest.toml",
            "shared = []\n",
            "shared = []\nelements = { kv = \"f32\" }\n",
            "`elements = { kv = f32 }`, but interface `gelu` has no element types",
        ),
        // A kernel whose signature has the types of another element type.
        (
            "matmul/bf16-scalar",
            "kernel.rs",
            "w: &[u16]",
            "w: &[f32]",
            "`matmul` does not match the signature that interface `matmul<bf16>` declares",
        ),
    ];
    assert_each_slip_refused(&cases);
}

/// Matrices that the matmul packs at load are copies in memory already: even TinyLlama's f32
/// weights are then not copied a second time.
#[test]
fn packed_weights_are_not_also_copied_into_memory() {
    let repo = scratch_repo();
    let manifest = repo.path().join("implementations/matmul/avx512-packed-threads/manifest.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let priority = text.lines().find(|l| l.starts_with("priority = ")).unwrap().to_string();
    std::fs::write(&manifest, text.replace(&priority, "priority = 1000")).unwrap();
    let workload = "workloads/tinyllama-bench-cpu-f32.toml";
    std::fs::copy(workspace_root().join(workload), repo.path().join(workload)).unwrap();
    let out = monogen(repo.path(), &["explain", workload, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["consts"]["resident_weights"], false, "{}", plan["consts"]);
    let matmul = plan["interfaces"].as_array().unwrap().iter().find(|i| i["interface"] == "matmul").unwrap();
    assert_eq!(matmul["chosen"]["packs_weights"], true, "{}", matmul["chosen"]);
}

#[test]
fn check_and_explain_read_a_crate_built_with_out() {
    let repo = scratch_repo();
    let elsewhere = tempfile::tempdir().unwrap();
    let dir = elsewhere.path().join("my-crate");
    let dir_arg = dir.to_str().unwrap();
    assert!(monogen(repo.path(), &["build", WORKLOAD, "--out", dir_arg]).status.success());
    // The default folder has no crate; the one built with --out is fresh.
    assert_eq!(monogen(repo.path(), &["check", WORKLOAD]).status.code(), Some(1));
    let check = monogen(repo.path(), &["check", WORKLOAD, "--out", dir_arg]);
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));
    assert!(stdout(&check).starts_with("ok "), "{}", stdout(&check));
    let explain = monogen(repo.path(), &["explain", WORKLOAD, "--out", dir_arg]);
    assert!(explain.status.success(), "{}", stderr(&explain));
    assert!(stdout(&explain).contains(&format!("output: {dir_arg}")), "{}", stdout(&explain));
    // A stale crate there is fixed by a build into the same folder.
    let lib = dir.join("src/lib.rs");
    std::fs::remove_file(&lib).unwrap();
    let check = monogen(repo.path(), &["check", WORKLOAD, "--out", dir_arg]);
    assert_eq!(check.status.code(), Some(1));
    assert!(
        stdout(&check).contains(&format!("fix: monogen build {WORKLOAD} --out {dir_arg}")),
        "{}",
        stdout(&check)
    );
    let two =
        monogen(repo.path(), &["check", WORKLOAD, "workloads/stories260k-cpu-bf16.toml", "--out", dir_arg]);
    assert_eq!(two.status.code(), Some(2));
}

#[test]
fn help_describes_every_argument() {
    let root = workspace_root();
    for command in ["build", "bench", "check", "explain", "synth-weights"] {
        let out = monogen(&root, &[command, "--help"]);
        assert!(out.status.success());
        let help = stdout(&out);
        // Every positional argument and option line carries a description.
        for line in help.lines().filter(|l| l.starts_with("  ") && !l.trim().is_empty()) {
            let trimmed = line.trim_start();
            if !(trimmed.starts_with('-') || trimmed.starts_with('<') || trimmed.starts_with('[')) {
                continue;
            }
            let described = trimmed.split("  ").filter(|p| !p.trim().is_empty()).count() > 1;
            assert!(described, "`monogen {command} --help`: `{trimmed}` has no description:\n{help}");
        }
    }
}

#[test]
fn a_workload_outside_the_repository_names_its_crate_folder() {
    let repo = scratch_repo();
    let deployment = tempfile::tempdir().unwrap();
    let workload = deployment.path().join("mine.toml");
    std::fs::copy(repo.path().join(WORKLOAD), &workload).unwrap();
    let out = monogen(repo.path(), &["build", workload.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is outside the monogen repository"), "{}", stderr(&out));
    assert!(stderr(&out).contains("pass --out DIR"), "{}", stderr(&out));
    assert!(!repo.path().join("generated/stories260k-cpu-f32").exists(), "nothing went into generated/");
    let dir = deployment.path().join("crates/mine");
    let out = monogen(repo.path(), &["build", workload.to_str().unwrap(), "--out", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(dir.join("monogen.lock").is_file());
}

#[test]
fn explain_shows_the_server_and_the_memory_of_its_kv_slots() {
    let root = workspace_root();
    let out = monogen(&root, &["explain", "workloads/stories260k-serve-cpu-f32.toml"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("serving: an OpenAI-compatible server (`serve`, completions) batching up to 4 sequences; classes interactive > batch (default interactive); 16 requests may wait; 8 KV slots\n"),
        "{text}"
    );
    // The chat twin chats and keeps a prefix cache.
    let out = monogen(&root, &["explain", "workloads/stories260k-chat-cpu-f32.toml"]);
    let text = stdout(&out);
    assert!(
        text.contains("(`serve`, completions and chat completions)")
            && text.contains("8 KV slots; a prefix cache: finished requests' KV caches are kept among the slots, and a request that starts with at least 16 of one's tokens reads only the rest\n"),
        "{text}"
    );
    assert!(
        text.contains("KV cache 640.0 KiB (f32) per sequence, 5.0 MiB in all for 8 KV slots of the server (taken as positions fill them)"),
        "{text}"
    );
    assert!(text.contains("per batch of 4 sequences, 132 positions a step"), "{text}");
}

/// `explain` says how a crate speculates, and lists the speculator among the interfaces; a
/// crate without `[speculation]` has neither.
#[test]
fn explain_shows_how_a_crate_speculates() {
    let root = workspace_root();
    let out = monogen(&root, &["explain", "workloads/stories260k-cpu-f32-lookup.toml"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("  speculation: prompt-lookup drafts up to 4 tokens (n-grams of 3 down to 2), verified in one pass of up to 5 rows; output as without it\n")
            && text.contains("\nspeculator: ")
            && text.contains("prompt-lookup 1.0.0 (priority 0): CHOSEN")
            && text.contains("  prefix cache: a session's `generate_anew` keeps the positions it holds that a new prompt starts with, at least 16 of them, and runs only the rest\n"),
        "{text}"
    );
    let plain = stdout(&monogen(&root, &["explain", "workloads/stories260k-cpu-f32.toml"]));
    assert!(!plain.contains("speculat") && !plain.contains("prefix cache"), "{plain}");
}

/// `eval --stale` evaluates exactly the crates `check` would ask it of, and says why of the
/// others: an f32 crate, a waived one and one whose record is current have nothing to do; one
/// without a record needs its model, which it looks for in a folder named as the crate.
#[test]
fn eval_stale_picks_the_crates_check_asks_an_evaluation_of() {
    let root = workspace_root();
    let temp = tempfile::tempdir().unwrap();
    let crates = temp.path().join("crates");
    let int8 = std::fs::read_to_string(root.join("workloads/stories260k-cpu-int8.toml")).unwrap();
    let renamed = temp.path().join("fresh-int8.toml");
    std::fs::write(&renamed, int8.replace("name = \"stories260k-cpu-int8\"", "name = \"fresh-int8\""))
        .unwrap();
    for (workload, name) in [
        (root.join("workloads/stories260k-cpu-f32.toml"), "f32"),
        (root.join("workloads/stories110m-bench-cpu-int8.toml"), "waived"),
        (root.join("workloads/stories260k-cpu-int8.toml"), "recorded"),
        (root.join("workloads/stories260k-cpu-int8.toml"), "retrained"),
        (renamed, "fresh-int8"),
    ] {
        let out_dir = crates.join(name);
        let out = monogen(&root, &["build", workload.to_str().unwrap(), "--out", out_dir.to_str().unwrap()]);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
    }
    // `recorded` has the weights it was evaluated on; `retrained` the same crate, with one
    // weight changed: a new checkpoint, which is evaluated again.
    let models = temp.path().join("models");
    let Some(stories) =
        model_or_skip("stories260k", "eval_stale_picks_the_crates_check_asks_an_evaluation_of")
    else {
        return;
    };
    for (name, change) in [("recorded", false), ("retrained", true)] {
        let dir = models.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for file in ["config.json", "tokenizer.json", "model.safetensors"] {
            std::fs::copy(stories.join(file), dir.join(file)).unwrap();
        }
        if change {
            let mut bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
            let last = bytes.len() - 1;
            bytes[last] ^= 1;
            std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
        }
    }
    let dirs: Vec<String> = ["f32", "waived", "recorded", "retrained", "fresh-int8"]
        .iter()
        .map(|n| crates.join(n).display().to_string())
        .collect();
    let mut args = vec!["eval", "--stale", "--models", models.to_str().unwrap(), "--crate"];
    args.extend(dirs.iter().map(String::as_str));
    let out = monogen(&root, &args);
    let said = stdout(&out);
    assert!(said.contains("/f32: nothing to evaluate (f32 weights, activations and KV cache)"), "{said}");
    assert!(said.contains("/waived: nothing to evaluate (its evaluation is waived: "), "{said}");
    assert!(
        said.contains("/recorded: nothing to evaluate (its record over the default text is current ("),
        "{said}"
    );
    assert!(
        said.contains("/retrained: needs an evaluation (the weights of ")
            && said.contains("models/retrained are not those it was evaluated on over the default text"),
        "{said}"
    );
    assert_eq!(out.status.code(), Some(2), "{said}{}", stderr(&out));
    let refused = stderr(&out);
    assert!(
        refused
            .contains("/fresh-int8 needs an evaluation (it has no evaluation record over the default text)")
            && refused.contains("models/fresh-int8 is not its model's folder (it has no config.json)"),
        "{refused}"
    );
    // Without --stale, one crate at a time.
    let out = monogen(&root, &["eval", "--model", models.to_str().unwrap(), "--crate", &dirs[0], &dirs[1]]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("eval takes one --crate"), "{}", stderr(&out));
}

/// Folders `llama` and `bert` under `dir`, each with nothing but a config.json, for `init`.
fn config_folders(dir: &Path) -> (PathBuf, PathBuf) {
    for (model, config) in [("llama", LLAMA_CONFIG), ("bert", BERT_CONFIG)] {
        std::fs::create_dir_all(dir.join(model)).unwrap();
        std::fs::write(dir.join(model).join("config.json"), config).unwrap();
    }
    (dir.join("llama"), dir.join("bert"))
}

/// `init --serve --shared-prefix-len N` gives a decoder's server a prefix cache (a crate with
/// `PREFIX_CACHE_MIN`, half of N); without `--serve`, the crate's sessions get `generate_anew`;
/// for an encoder, it is refused.
#[test]
fn init_writes_the_shared_prefix_of_a_decoder_server() {
    let root = workspace_root();
    let temp = tempfile::tempdir().unwrap();
    let (llama, bert) = config_folders(temp.path());
    let workload = temp.path().join("p.toml");
    let args = ["init", "--hf", llama.to_str().unwrap(), "--name", "p", "--hardware", "none"];
    let out = monogen(
        &root,
        &[&args[..], &["--serve", "--shared-prefix-len", "64", "-o", workload.to_str().unwrap()]].concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read_to_string(&workload).unwrap().contains("\nshared_prefix_len = 64\n"));
    let krate = temp.path().join("p-crate");
    let out = monogen(&root, &["build", workload.to_str().unwrap(), "--out", krate.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let lib = std::fs::read_to_string(krate.join("src/lib.rs")).unwrap();
    assert!(lib.contains("pub const PREFIX_CACHE_MIN: usize = 32;"), "{lib}");
    assert!(std::fs::read_to_string(krate.join("src/engine.rs")).unwrap().contains("struct Kept"));

    let alone = temp.path().join("q.toml");
    let out =
        monogen(&root, &[&args[..], &["--shared-prefix-len", "64", "-o", alone.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&alone).unwrap();
    assert!(text.contains("\nshared_prefix_len = 64\n") && !text.contains("[serving]"), "{text}");
    let krate = temp.path().join("q-crate");
    let out = monogen(&root, &["build", alone.to_str().unwrap(), "--out", krate.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        std::fs::read_to_string(krate.join("src/generate.rs")).unwrap().contains("pub fn generate_anew(")
    );
    assert!(!krate.join("src/engine.rs").exists());
    let out = monogen(
        &root,
        &["init", "--hf", bert.to_str().unwrap(), "--name", "b", "--serve", "--shared-prefix-len", "8"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("is a BERT encoder, whose server keeps no KV caches to share"),
        "{}",
        stderr(&out)
    );
}

/// `init --speculate [--draft-tokens N]` writes a `[speculation]` table that `build` turns
/// into a speculating crate; `--draft-tokens` needs `--speculate`, an encoder refuses it, and a
/// draft too long for the prefill chunk is refused with the workload's line.
#[test]
fn init_writes_a_classifier_dtype_and_build_gives_the_classifier_its_own_matmul() {
    let root = workspace_root();
    let temp = tempfile::tempdir().unwrap();
    let (llama, bert) = config_folders(temp.path());
    let workload = temp.path().join("c.toml");
    let args =
        ["init", "--hf", llama.to_str().unwrap(), "--name", "c", "--hardware", "none", "--dtype", "int4"];
    let out = monogen(
        &root,
        &[&args[..], &["--classifier-dtype", "int8", "-o", workload.to_str().unwrap()]].concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&workload).unwrap();
    assert!(
        text.contains("[weights]\ndtype = \"int4\"\n") && text.contains("\nclassifier_dtype = \"int8\"\n"),
        "{text}"
    );
    let krate = temp.path().join("c-crate");
    let out = monogen(&root, &["build", workload.to_str().unwrap(), "--out", krate.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let kernel = std::fs::read_to_string(krate.join("src/kernels/matmul_classifier.rs")).unwrap();
    assert!(kernel.contains("\n// matmul (classifier): `q8-"), "{}", &kernel[..300]);
    let lock = std::fs::read_to_string(krate.join("monogen.lock")).unwrap();
    assert!(lock.contains("interface = \"matmul\"\nrole = \"classifier\"\nimplementation = \"q8-"), "{lock}");
    let out = monogen(&root, &["explain", workload.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("matmul<q8> (classifier):"), "{}", stderr(&out));
    // The crate is what build writes: check asks only for its evaluation.
    let out = monogen(&root, &["check", workload.to_str().unwrap(), "--out", krate.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("no evaluation record") && said.matches("because").count() == 1, "{said}");

    // Refused: the classifier as --dtype, with bf16 activations, or for an encoder.
    for (extra, said) in [
        (&["--dtype", "int4", "--classifier-dtype", "int4"][..], "is --dtype already"),
        (
            &["--dtype", "bf16", "--activations", "bf16", "--classifier-dtype", "int8"][..],
            "do not go together",
        ),
    ] {
        let out = monogen(&root, &[&args[..5], &["--hardware", "none"], extra].concat());
        assert!(!out.status.success() && stderr(&out).contains(said), "{extra:?}: {}", stderr(&out));
    }
    let out = monogen(
        &root,
        &[
            "init",
            "--hf",
            bert.to_str().unwrap(),
            "--name",
            "b",
            "--hardware",
            "none",
            "--classifier-dtype",
            "int8",
        ],
    );
    assert!(!out.status.success() && stderr(&out).contains("is for decoders"), "{}", stderr(&out));
}

#[test]
fn init_writes_a_speculation_table() {
    let root = workspace_root();
    let temp = tempfile::tempdir().unwrap();
    let (llama, bert) = config_folders(temp.path());
    let args = ["init", "--hf", llama.to_str().unwrap(), "--name", "s", "--hardware", "none"];
    let workload = temp.path().join("s.toml");
    let out = monogen(
        &root,
        &[&args[..], &["--speculate", "--draft-tokens", "6", "-o", workload.to_str().unwrap()]].concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&workload).unwrap();
    assert!(
        text.contains("\n[speculation]\nspeculator = \"prompt-lookup\"\ndraft_tokens = 6\nlookup_max = 3\nlookup_min = 2\n"),
        "{text}"
    );
    let krate = temp.path().join("s-crate");
    let out = monogen(&root, &["build", workload.to_str().unwrap(), "--out", krate.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(krate.join("src/kernels/speculator.rs").is_file());
    let lib = std::fs::read_to_string(krate.join("src/lib.rs")).unwrap();
    assert!(lib.contains("pub const DRAFT_TOKENS: usize = 6;"), "{lib}");

    // --typical-text leaves the speculator to measurement on that text.
    let text = temp.path().join("typical.txt");
    std::fs::write(&text, "fn main() {\n    println!(\"hello\");\n}\n").unwrap();
    let measured = temp.path().join("m.toml");
    let out = monogen(
        &root,
        &[
            &args[..],
            &["--speculate", "--typical-text", text.to_str().unwrap(), "-o", measured.to_str().unwrap()],
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let written = std::fs::read_to_string(&measured).unwrap();
    let w = monogen::workload::WorkloadSource::from_text("m.toml", &written).parse().unwrap();
    let s = w.speculation.unwrap();
    assert_eq!(s.speculator, monogen::workload::Speculator::Measured, "{written}");
    assert_eq!(s.typical_text.as_deref(), Some("fn main() {\n    println!(\"hello\");\n}\n"), "{written}");
    let explain = stdout(&monogen(&root, &["explain", measured.to_str().unwrap()]));
    assert!(
        explain.contains("names no hardware class (target.hardware) whose records choose: no speculation"),
        "{explain}"
    );
    std::fs::write(&text, " \n").unwrap();
    let out =
        monogen(&root, &[&args[..], &["--speculate", "--typical-text", text.to_str().unwrap()]].concat());
    assert!(!out.status.success() && stderr(&out).contains("is empty"), "{}", stderr(&out));
    let out = monogen(&root, &[&args[..], &["--typical-text", text.to_str().unwrap()]].concat());
    assert_eq!(out.status.code(), Some(2));

    let out = monogen(&root, &[&args[..], &["--draft-tokens", "6"]].concat());
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--speculate"), "{}", stderr(&out));
    let out = monogen(&root, &[&args[..], &["--speculate", "--draft-tokens", "99"]].concat());
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("speculation.draft_tokens is 99"), "{}", stderr(&out));
    let out = monogen(&root, &["init", "--hf", bert.to_str().unwrap(), "--name", "b", "--speculate"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("generates no tokens to draft"), "{}", stderr(&out));
}
