//! `monogen synth-weights`: a random model directory with a workload's shapes loads in that
//! workload's crate, its tokenizer works, and `monogen init` reads its config.json back into
//! the same model.

use monogen::init::{CpuFeatures, InitOptions, workload_from_hf};
use monogen::workload::{Dtype, KvDtype, WorkloadSource};
use monogen_tests::workspace_root;
use stories260k_cpu_f32::{GenerateParams, Model, Tokenizer, VOCAB_SIZE};

/// What `monogen init` is given to read a synthetic folder back: f32, nothing optional.
fn init_options() -> InitOptions {
    InitOptions {
        name: "synth".into(),
        dtype: Dtype::F32,
        activations: monogen::workload::Activations::F32,
        classifier_dtype: None,
        kv_cache: KvDtype::F32,
        threads: Some(2),
        cpu_features: CpuFeatures::parse("x86-64-v3").unwrap(),
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
        cuda_arch: None,
    }
}

#[test]
fn synthetic_weights_load_run_and_read_back() {
    let path = workspace_root().join("workloads/stories260k-cpu-f32.toml");
    let workload = WorkloadSource::read(&path).unwrap().parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let parameters = monogen::synth::write_model_dir(&workload, dir.path(), 7).unwrap();
    assert_eq!(parameters, 260_032);

    let model = Model::load(dir.path()).unwrap();
    assert!(model.warnings().is_empty(), "{:?}", model.warnings());
    let tokenizer = Tokenizer::load(dir.path()).unwrap();
    let prompt = tokenizer.encode("w5 w9 w100").unwrap();
    assert_eq!(prompt, [5, 9, 100]);
    let logits = model.session().logits_all(&prompt).unwrap();
    assert_eq!(logits.len(), 3 * VOCAB_SIZE);
    assert!(logits.iter().all(|v| v.is_finite()));
    let params = GenerateParams { max_tokens: 8, ..GenerateParams::default() };
    let generation = model.session().generate(&prompt, &params, |_| true).unwrap();
    assert!(!generation.generated_ids.is_empty());

    let opts = init_options();
    let back = workload_from_hf(dir.path(), &opts).unwrap();
    assert_eq!(back.model, workload.model);
}

/// A BERT encoder's synthetic weights load in its crate, its WordPiece tokenizer adds [CLS] and
/// [SEP], the crate embeds sentences, and `monogen init` reads the folder back into the same
/// model (sentence-transformers' pooling and normalization included).
#[test]
fn synthetic_bert_weights_load_embed_and_read_back() {
    use all_minilm_l6_v2_cpu_f32 as minilm;
    let path = workspace_root().join("workloads/all-minilm-l6-v2-cpu-f32.toml");
    let workload = WorkloadSource::read(&path).unwrap().parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let parameters = monogen::synth::write_model_dir(&workload, dir.path(), 7).unwrap();
    assert_eq!(parameters, 22_565_376);

    let model = minilm::Model::load(dir.path()).unwrap();
    let tokenizer = minilm::Tokenizer::load(dir.path()).unwrap();
    let ids = tokenizer.encode("w5 W9 w100").unwrap();
    assert_eq!(ids, [2, 5, 9, 100, 3], "[CLS], the words lowercased, [SEP]");
    let vectors = model.encoder().embed(&[ids, tokenizer.encode("w7").unwrap()]).unwrap();
    assert_eq!(vectors.len(), 2);
    assert!(vectors.iter().all(|v| v.len() == minilm::HIDDEN_SIZE && v.iter().all(|x| x.is_finite())));
    assert_ne!(vectors[0], vectors[1]);

    let opts = init_options();
    let back = workload_from_hf(dir.path(), &opts).unwrap();
    assert_eq!(back.model, workload.model);
}

/// A bf16 workload's synthetic weights are BF16 tensors, which its crate maps in place; the
/// f32 crate of the same model widens the same file, and the two compute the same logits up
/// to the f32 sums' rounding (the weights are the same values).
#[test]
fn synthetic_bf16_weights_run_in_the_bf16_crate_as_in_the_f32_one() {
    let path = workspace_root().join("workloads/stories260k-cpu-bf16.toml");
    let workload = WorkloadSource::read(&path).unwrap().parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    monogen::synth::write_model_dir(&workload, dir.path(), 7).unwrap();
    let file = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    let header = monogen_tests::Safetensors::parse(&file).header;
    assert!(header.values().filter_map(|t| t.get("dtype")).all(|d| d == "BF16"), "{header:?}");

    let prompt = [5, 9, 100, 7];
    let half = stories260k_cpu_bf16::Model::load(dir.path()).unwrap();
    let got = half.session().logits_all(&prompt).unwrap();
    let full = Model::load(dir.path()).unwrap();
    let want = full.session().logits_all(&prompt).unwrap();
    let (diff, at) = monogen_tests::max_abs_diff(&got, &want);
    assert!(diff <= 1e-4, "bf16 crate differs from the f32 crate by {diff} at {at}");
}
