//! The LLaMA family: tiny random-weight models of each variant, made once with Hugging Face
//! transformers by `tools/make_fixtures.py` and committed under `tests/fixtures/` with their
//! reference logits and greedy ids, against the crates monogen generated for them. No Python
//! runs here.

use std::path::PathBuf;

use monogen_tests::{max_abs_diff, workspace_root};
use serde_json::Value;

/// Logits are compared within this bound, everywhere.
const TOLERANCE: f32 = 1e-4;

fn fixture(name: &str) -> (PathBuf, Value) {
    let dir = workspace_root().join("tests/fixtures").join(name);
    let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    (dir, serde_json::from_str(&text).unwrap())
}

fn ids(value: &Value) -> Vec<u32> {
    value.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
}

macro_rules! variant {
    ($module:ident, $krate:ident, $fixture:literal, $what:literal) => {
        mod $module {
            use super::*;
            use $krate::{GenerateParams, Model, VOCAB_SIZE};

            #[test]
            fn logits_match_transformers() {
                let (dir, reference) = fixture($fixture);
                let model = Model::load(&dir).unwrap();
                assert!(model.warnings().is_empty(), "{:?}", model.warnings());
                let prompt = ids(&reference["prompt_ids"]);
                let want: Vec<f32> = reference["logits"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .flat_map(|row| row.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32))
                    .collect();
                // The rows the fixture keeps (all of them, or the last for a large vocabulary).
                let rows: Vec<usize> = reference["logit_rows"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r.as_u64().unwrap() as usize)
                    .collect();
                assert_eq!(want.len(), rows.len() * VOCAB_SIZE);
                let all = model.session().logits_all(&prompt).unwrap();
                let got: Vec<f32> = rows
                    .iter()
                    .flat_map(|&r| all[r * VOCAB_SIZE..(r + 1) * VOCAB_SIZE].iter().copied())
                    .collect();
                let (diff, at) = max_abs_diff(&got, &want);
                eprintln!("{}: logits max abs diff {diff:e}", $what);
                assert!(diff <= TOLERANCE, "{}: logits differ by {diff} at row {}", $what, at / VOCAB_SIZE);
            }

            #[test]
            fn greedy_ids_match_transformers() {
                let (dir, reference) = fixture($fixture);
                let model = Model::load(&dir).unwrap();
                let prompt = ids(&reference["prompt_ids"]);
                let mut want = ids(&reference["greedy_ids"]);
                // transformers' loop above ignores end-of-sequence; the crate stops there.
                if let Some(end) = want.iter().position(|&id| id == 2) {
                    want.truncate(end + 1);
                }
                let params = GenerateParams { max_tokens: want.len(), ..GenerateParams::default() };
                let generation = model.session().generate(&prompt, &params, |_| true).unwrap();
                assert_eq!(generation.generated_ids, want, "{}", $what);
            }
        }
    };
}

variant!(smollm, smollm_tiny_cpu_f32, "smollm-tiny", "SmolLM (tied, 9 query / 3 kv heads, theta 1e5)");
variant!(qwen2, qwen2_tiny_cpu_f32, "qwen2-tiny", "Qwen2 (q/k/v biases, untied, theta 1e6)");
variant!(llama3, llama3_tiny_cpu_f32, "llama3-tiny", "Llama 3 (128256-token vocabulary, theta 5e5)");
variant!(linear_rope, linear_rope_tiny_cpu_f32, "linear-rope-tiny", "linear rope scaling (factor 4)");
variant!(
    llama31_rope,
    llama31_rope_tiny_cpu_f32,
    "llama31-rope-tiny",
    "Llama 3.1 rope scaling (factor 8, 1/4, 64)"
);
variant!(mistral, mistral_tiny_cpu_f32, "mistral-tiny", "Mistral (a sliding window of 16, prompt of 40)");
