//! The committed generated crates against reference outputs of the real models: logits
//! from one forward and from prefill + decode steps, greedy continuations, tokenizer ids.

use monogen_tests::{ids, max_abs_diff, model_dir, read_npy_f32, reference_json, untied_stories260k};

/// The tests every generated LLaMA crate runs, instantiated per crate (the crates share
/// one API, with different constants).
macro_rules! llama_reference_tests {
    ($test_module:ident, $krate:ident, $model_dir:expr) => {
        mod $test_module {
            use super::*;
            use ::$krate::{GenerateParams, Model, StopReason, Tokenizer, VOCAB_SIZE};

            const TOLERANCE: f32 = 1e-4;

            fn setup() -> Option<(std::path::PathBuf, Model, serde_json::Value, Vec<f32>)> {
                let dir = $model_dir?;
                let model = Model::load(&dir).expect("the model loads");
                assert!(model.warnings().is_empty(), "{:?}", model.warnings());
                let reference = reference_json(&dir);
                let (shape, logits) = read_npy_f32(&dir.join("reference/logits.npy"));
                assert_eq!(shape[1], VOCAB_SIZE);
                Some((dir, model, reference, logits))
            }

            fn check_rows(label: &str, got: &[f32], expected: &[f32], first_row: usize) {
                let (diff, at) = max_abs_diff(got, expected);
                assert!(
                    diff <= TOLERANCE,
                    "{label}: max abs diff {diff} at row {}, token {} (limit {TOLERANCE})",
                    first_row + at / VOCAB_SIZE,
                    at % VOCAB_SIZE
                );
            }

            #[test]
            fn logits_of_one_forward_match_the_reference() {
                let Some((_, model, reference, expected)) = setup() else { return };
                let input = ids(&reference["logits"]["input_ids"]);
                let got = model.session().logits_all(&input).unwrap();
                check_rows("one forward", &got, &expected, 0);
                eprintln!(
                    "{}: one forward over {} tokens, max abs diff {:e}",
                    stringify!($krate),
                    input.len(),
                    max_abs_diff(&got, &expected).0
                );
            }

            #[test]
            fn logits_of_prefill_then_decode_steps_match_the_reference() {
                let Some((_, model, reference, expected)) = setup() else { return };
                let input = ids(&reference["logits"]["input_ids"]);
                let mut session = model.session();
                let split = 5;
                let last = session.prefill(&input[..split]).unwrap().to_vec();
                check_rows(
                    "prefill",
                    &last,
                    &expected[(split - 1) * VOCAB_SIZE..split * VOCAB_SIZE],
                    split - 1,
                );
                for (t, &token) in input.iter().enumerate().skip(split) {
                    let got = session.decode(token).unwrap().to_vec();
                    check_rows("decode step", &got, &expected[t * VOCAB_SIZE..(t + 1) * VOCAB_SIZE], t);
                }
                assert_eq!(session.position(), input.len());
            }

            #[test]
            fn prefill_of_the_whole_input_returns_the_logits_of_its_last_position() {
                let Some((_, model, reference, expected)) = setup() else { return };
                let input = ids(&reference["logits"]["input_ids"]);
                let mut session = model.session();
                let last = session.prefill(&input).unwrap().to_vec();
                let t = input.len() - 1;
                check_rows("whole prefill", &last, &expected[t * VOCAB_SIZE..(t + 1) * VOCAB_SIZE], t);
            }

            #[test]
            fn logits_of_chunked_prefill_match_the_reference() {
                let Some((_, model, reference, expected)) = setup() else { return };
                let input = ids(&reference["logits"]["input_ids"]);
                let mut session = model.session();
                let mut start = 0;
                for len in [1, 6, 2, 11, 100] {
                    let end = (start + len).min(input.len());
                    if start == end {
                        break;
                    }
                    let got = session.logits_all(&input[start..end]).unwrap();
                    check_rows("chunk", &got, &expected[start * VOCAB_SIZE..end * VOCAB_SIZE], start);
                    start = end;
                }
            }

            #[test]
            fn greedy_continuations_match_the_reference() {
                let Some((_, model, reference, _)) = setup() else { return };
                let tokenizer = Tokenizer::load($model_dir.unwrap()).unwrap();
                for case in reference["greedy"].as_array().unwrap() {
                    let prompt_ids = ids(&case["prompt_ids"]);
                    assert_eq!(tokenizer.encode(case["prompt"].as_str().unwrap()).unwrap(), prompt_ids);
                    let expected = ids(&case["new_ids"]);
                    let params = GenerateParams { max_tokens: expected.len(), ..GenerateParams::default() };
                    let generation = model.session().generate(&prompt_ids, &params, |_| true).unwrap();
                    assert_eq!(generation.generated_ids, expected, "prompt {:?}", case["prompt"]);
                    assert_eq!(generation.stop, StopReason::MaxTokens);
                    let text = tokenizer.decode(&generation.generated_ids).unwrap();
                    assert_eq!(text, case["new_text"].as_str().unwrap());
                }
            }

            #[test]
            fn tokenizer_matches_the_reference_cases() {
                let Some((dir, _, reference, _)) = setup() else { return };
                let tokenizer = Tokenizer::load(&dir).unwrap();
                for case in reference["tokenizer"].as_array().unwrap() {
                    let text = case["text"].as_str().unwrap();
                    let expected = ids(&case["ids"]);
                    assert_eq!(tokenizer.encode(text).unwrap(), expected, "text {text:?}");
                    assert_eq!(tokenizer.decode(&expected).unwrap(), case["decoded"].as_str().unwrap());
                    // Streaming gives the same text, piece by piece.
                    let mut stream = tokenizer.stream();
                    let mut streamed = String::new();
                    for &id in &expected {
                        streamed.push_str(&stream.push(id).unwrap().unwrap_or_default());
                    }
                    assert_eq!(streamed, case["decoded"].as_str().unwrap());
                }
            }

            #[test]
            fn one_model_serves_many_sessions_and_threads() {
                fn shareable<T: Send + Sync>(_: &T) {}
                let Some((_, model, reference, _)) = setup() else { return };
                shareable(&model);
                let case = &reference["greedy"][0];
                let prompt = ids(&case["prompt_ids"]);
                let expected = ids(&case["new_ids"]);
                let params = GenerateParams { max_tokens: expected.len(), ..GenerateParams::default() };
                std::thread::scope(|scope| {
                    let handles: Vec<_> = (0..2)
                        .map(|_| {
                            scope.spawn(|| {
                                model.session().generate(&prompt, &params, |_| true).unwrap().generated_ids
                            })
                        })
                        .collect();
                    for h in handles {
                        assert_eq!(h.join().unwrap(), expected);
                    }
                });
                let mut session = model.session();
                for _ in 0..2 {
                    session.reset();
                    assert_eq!(session.generate(&prompt, &params, |_| true).unwrap().generated_ids, expected);
                }
            }

            #[test]
            fn sampling_is_reproducible_per_seed() {
                let Some((_, model, reference, _)) = setup() else { return };
                let prompt = ids(&reference["greedy"][0]["prompt_ids"]);
                let run = |seed| {
                    let params =
                        GenerateParams { max_tokens: 40, temperature: 1.0, top_k: 0, top_p: 1.0, seed };
                    model.session().generate(&prompt, &params, |_| true).unwrap().generated_ids
                };
                assert_eq!(run(7), run(7), "the same seed gives the same tokens");
                let distinct: std::collections::BTreeSet<Vec<u32>> = (1..=4).map(run).collect();
                assert!(distinct.len() > 1, "different seeds give different tokens");
                let params =
                    GenerateParams { max_tokens: 20, temperature: 0.8, top_k: 5, top_p: 0.9, seed: 3 };
                let sampled = model.session().generate(&prompt, &params, |_| true).unwrap();
                assert!(sampled.generated_ids.iter().all(|&id| (id as usize) < VOCAB_SIZE));
            }

            #[test]
            fn requests_that_do_not_fit_are_errors() {
                let Some((_, model, _, _)) = setup() else { return };
                let mut session = model.session();
                let too_long = vec![1u32; ::$krate::MAX_SEQ_LEN + 1];
                let e = session.prefill(&too_long).unwrap_err();
                assert!(matches!(e, ::$krate::Error::SequenceTooLong { .. }), "{e}");
                assert!(e.to_string().contains("request.max_seq_len"), "{e}");
                let e = session.prefill(&[VOCAB_SIZE as u32]).unwrap_err();
                assert!(matches!(e, ::$krate::Error::TokenOutOfRange { .. }), "{e}");
                assert!(matches!(session.prefill(&[]).unwrap_err(), ::$krate::Error::EmptyPrompt));
                assert_eq!(session.position(), 0, "a refused request changes nothing");
                let bad = GenerateParams { temperature: -1.0, ..GenerateParams::default() };
                assert!(matches!(
                    session.generate(&[1], &bad, |_| true).unwrap_err(),
                    ::$krate::Error::InvalidParameter { .. }
                ));
                // The last position can be filled, and generation stops there.
                for (prompt_len, most) in [(::$krate::MAX_SEQ_LEN, 1), (::$krate::MAX_SEQ_LEN - 1, 2)] {
                    let prompt = vec![1u32; prompt_len];
                    let params = GenerateParams { max_tokens: 10, ..GenerateParams::default() };
                    let g = model.session().generate(&prompt, &params, |_| true).unwrap();
                    let ended_early = g.stop == StopReason::Eos && g.generated_ids.len() <= most;
                    assert!(
                        ended_early || (g.stop == StopReason::ContextFull && g.generated_ids.len() == most),
                        "{g:?}"
                    );
                }
            }
        }
    };
}

llama_reference_tests!(stories260k, stories260k_cpu_f32, model_dir("stories260k"));
llama_reference_tests!(aidreams260k, aidreams260k_cpu_f32, model_dir("aidreams260k"));
// Speculative decoding by prompt lookup: generation verifies drafted tokens several at a time.
llama_reference_tests!(stories260k_lookup, stories260k_cpu_f32_lookup, model_dir("stories260k"));
// Untied embeddings (the classifier is lm_head.weight) and the scalar reference kernels.
llama_reference_tests!(stories260k_untied, stories260k_untied_scalar, untied_stories260k());

#[test]
fn untied_crates_need_lm_head_and_tied_crates_warn_about_it() {
    let (Some(tied), Some(untied)) = (model_dir("stories260k"), untied_stories260k()) else { return };
    let e = stories260k_untied_scalar::Model::load(&tied).err().expect("stories260k has no lm_head.weight");
    assert!(e.to_string().contains("tensor `lm_head.weight` is missing"), "{e}");
    let model = stories260k_cpu_f32::Model::load(&untied).unwrap();
    assert_eq!(model.warnings().len(), 1);
    assert!(
        model.warnings()[0].contains("tensor `lm_head.weight`") && model.warnings()[0].contains("not used"),
        "{:?}",
        model.warnings()
    );
}

#[test]
fn weights_of_another_shape_are_refused_naming_the_tensor() {
    let Some(stories) = model_dir("stories260k") else { return };
    // aidreams260k has 4 kv heads of 16 where stories260k has 4 of 8.
    let e = aidreams260k_cpu_f32::Model::load(&stories)
        .err()
        .expect("stories260k weights do not fit aidreams260k");
    let message = e.to_string();
    assert!(
        message.contains("tensor `model.layers.0.self_attn.k_proj.weight` has shape [32, 64]"),
        "{message}"
    );
    assert!(message.contains("[64, 64]"), "{message}");
    assert_eq!(e.exit_code(), 3);
}

#[test]
fn missing_and_damaged_weight_files_are_refused() {
    let Some(stories) = model_dir("stories260k") else { return };
    let dir = tempfile::tempdir().unwrap();
    let e = stories260k_cpu_f32::Model::load(dir.path()).err().unwrap();
    assert!(matches!(e, stories260k_cpu_f32::Error::Io { .. }), "{e}");

    let bytes = std::fs::read(stories.join("model.safetensors")).unwrap();
    let path = dir.path().join("model.safetensors");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let e = stories260k_cpu_f32::Model::load(dir.path()).err().unwrap();
    assert!(matches!(e, stories260k_cpu_f32::Error::InvalidWeights { .. }), "{e}");
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
}
