//! Broken model directories and weight files, through the library API of the committed
//! stories260k crate: every one ends in an error that names the file or the tensor (and the
//! expected and found shape or dtype), never a panic or garbage output. The binary maps these
//! errors to exit code 3 (see `standalone.rs` for the exit codes of bad arguments).

use monogen_tests::{Safetensors, add_tensor_copy, model_dir};
use serde_json::json;
use stories260k_cpu_f32::{Error, Model, Tokenizer};

/// A model directory with `weights` as model.safetensors and the real tokenizer.json.
fn model_with(weights: &[u8]) -> tempfile::TempDir {
    let source = model_dir("stories260k").expect("checked by the caller");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("model.safetensors"), weights).unwrap();
    std::fs::copy(source.join("tokenizer.json"), dir.path().join("tokenizer.json")).unwrap();
    dir
}

fn load(weights: &[u8]) -> Result<Model, Error> {
    let dir = model_with(weights);
    Model::load(dir.path())
}

fn real_weights() -> Option<Vec<u8>> {
    Some(std::fs::read(model_dir("stories260k")?.join("model.safetensors")).unwrap())
}

/// The weights with one change to the header.
fn edited(weights: &[u8], edit: impl FnOnce(&mut Safetensors)) -> Vec<u8> {
    let mut st = Safetensors::parse(weights);
    edit(&mut st);
    st.to_bytes()
}

const Q0: &str = "model.layers.0.self_attn.q_proj.weight";

#[test]
fn missing_files_name_the_path() {
    if model_dir("stories260k").is_none() {
        return;
    }
    let empty = tempfile::tempdir().unwrap();
    let e = Model::load(empty.path().join("no-such-dir")).err().unwrap();
    assert!(matches!(e, Error::Io { .. }) && e.to_string().contains("no-such-dir/model.safetensors"), "{e}");
    let e = Model::load(empty.path()).err().unwrap();
    assert!(e.to_string().contains("model.safetensors"), "{e}");
    let e = Tokenizer::load(empty.path()).err().unwrap();
    assert!(matches!(e, Error::Io { .. }) && e.to_string().contains("tokenizer.json"), "{e}");
    // An unreadable file: a directory where the weights should be.
    std::fs::create_dir(empty.path().join("model.safetensors")).unwrap();
    let e = Model::load(empty.path()).err().unwrap();
    assert!(e.to_string().contains("model.safetensors"), "{e}");
}

#[test]
fn damaged_files_are_refused_as_invalid_safetensors() {
    let Some(weights) = real_weights() else { return };
    let header_len = u64::from_le_bytes(weights[..8].try_into().unwrap()) as usize;
    let mut garbage_header = weights.clone();
    garbage_header[8..8 + 16].copy_from_slice(b"this is not JSON");
    let mut oversized = weights.clone();
    oversized[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("an empty file", Vec::new()),
        ("a file shorter than its length field", weights[..5].to_vec()),
        ("a file cut inside the header", weights[..8 + header_len / 2].to_vec()),
        ("a file cut inside the data", weights[..weights.len() / 2].to_vec()),
        ("a header that is not JSON", garbage_header),
        ("a header length beyond the file", oversized),
        (
            "offsets beyond the data",
            edited(&weights, |st| {
                let end = st.data.len() + 4096;
                st.header["model.norm.weight"]["data_offsets"] = json!([end - 256, end]);
            }),
        ),
        (
            "two tensors over the same bytes",
            edited(&weights, |st| {
                let other = st.header["model.norm.weight"]["data_offsets"].clone();
                st.header["model.layers.0.input_layernorm.weight"]["data_offsets"] = other;
            }),
        ),
        (
            "a shape that does not match the byte count",
            edited(&weights, |st| st.header[Q0]["shape"] = json!([64, 65])),
        ),
    ];
    for (what, bytes) in cases {
        let e = load(&bytes).err().unwrap_or_else(|| panic!("{what}: loaded"));
        eprintln!("{what}: {e}");
        assert!(matches!(e, Error::InvalidWeights { .. }), "{what}: {e}");
        assert!(e.to_string().contains("model.safetensors is not a valid safetensors file"), "{what}: {e}");
    }
}

#[test]
fn tensors_of_the_wrong_name_shape_or_dtype_are_named() {
    let Some(weights) = real_weights() else { return };
    let renamed = edited(&weights, |st| {
        let entry = st.header.remove("model.norm.weight").unwrap();
        st.header.insert("model.final_norm.weight".into(), entry);
    });
    let e = load(&renamed).err().unwrap();
    assert!(matches!(&e, Error::MissingTensor { name, .. } if name == "model.norm.weight"), "{e}");
    assert!(e.to_string().starts_with("tensor `model.norm.weight` is missing from "), "{e}");
    assert!(e.to_string().ends_with("model.safetensors"), "{e}");

    let reshaped = edited(&weights, |st| st.header[Q0]["shape"] = json!([32, 128]));
    let e = load(&reshaped).err().unwrap();
    assert_eq!(
        e.to_string(),
        format!("tensor `{Q0}` has shape [32, 128], but this crate was generated for [64, 64]")
    );

    let retyped = edited(&weights, |st| st.header[Q0]["dtype"] = json!("I32"));
    let e = load(&retyped).err().unwrap();
    assert_eq!(e.to_string(), format!("tensor `{Q0}` has dtype I32, but this crate reads F32, BF16 or F16"));

    // An extra tensor loads, with a warning that names it.
    let extra = add_tensor_copy(&weights, "model.norm.weight", "model.unexpected.weight");
    let model = load(&extra).unwrap();
    assert_eq!(model.warnings().len(), 1);
    assert!(model.warnings()[0].contains("tensor `model.unexpected.weight`"), "{:?}", model.warnings());
}

#[test]
fn a_tokenizer_larger_than_the_vocabulary_or_broken_is_refused() {
    let Some(source) = model_dir("stories260k") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut tokenizer: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("tokenizer.json")).unwrap()).unwrap();
    tokenizer["added_tokens"].as_array_mut().unwrap().push(json!({
        "id": 600, "content": "<extra>", "single_word": false, "lstrip": false, "rstrip": false,
        "normalized": false, "special": true
    }));
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let e = Tokenizer::load(dir.path()).err().unwrap();
    // (tokenizers gives an added token that is not in the vocabulary the next free id, 512.)
    assert!(matches!(e, Error::VocabularyMismatch { largest: 512.., expected: 512, .. }), "{e}");
    assert!(e.to_string().contains("but the model's vocabulary has 512 rows"), "{e}");

    // A vocabulary whose ids are not 0..n is checked token by token: id 300 moved to 700.
    let mut gapped: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("tokenizer.json")).unwrap()).unwrap();
    let vocab = gapped["model"]["vocab"].as_object_mut().unwrap();
    let moved = vocab.iter().find(|(_, id)| id.as_u64() == Some(300)).unwrap().0.clone();
    vocab.insert(moved, json!(700));
    std::fs::write(dir.path().join("tokenizer.json"), gapped.to_string()).unwrap();
    let e = Tokenizer::load(dir.path()).err().unwrap();
    assert!(matches!(e, Error::VocabularyMismatch { largest: 700, expected: 512, .. }), "{e}");

    std::fs::write(dir.path().join("tokenizer.json"), "{ not json").unwrap();
    let e = Tokenizer::load(dir.path()).err().unwrap();
    assert!(matches!(e, Error::Tokenizer { .. }) && e.to_string().contains("tokenizer.json"), "{e}");
}

#[test]
fn a_model_of_another_architecture_is_named_as_such() {
    // The LLaMA crate pointed at a BERT encoder, and the BERT crate at a LLaMA decoder.
    let (Some(llama), Some(bert)) = (model_dir("stories260k"), model_dir("all-minilm-l6-v2")) else {
        return;
    };
    let e = Model::load(&bert).err().unwrap();
    assert!(matches!(e, Error::WrongArchitecture { .. }), "{e}");
    let text = e.to_string();
    assert!(text.contains("holds a BERT encoder, but this crate runs a LLaMA-style decoder"), "{text}");
    assert!(text.contains("monogen init --hf"), "{text}");
    assert_eq!(e.exit_code(), 3);

    let e = all_minilm_l6_v2_cpu_f32::Model::load(&llama).err().unwrap();
    let text = e.to_string();
    assert!(text.contains("holds a LLaMA-style decoder, but this crate runs a BERT encoder"), "{text}");
}
