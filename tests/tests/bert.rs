//! The committed BERT crate (all-MiniLM-L6-v2) against the reference outputs of Hugging Face
//! transformers and sentence-transformers in `../shared/models/all-minilm-l6-v2/reference/`,
//! through its library API, and its binary, built from a copy of the crate.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

use all_minilm_l6_v2_cpu_f32 as minilm;
use monogen_tests::{build_copy, ids, max_abs_diff, model_dir, read_npy_f32, reference_json};
use serde_json::Value;

const MODEL: &str = "all-minilm-l6-v2";
const CRATE: &str = "all-minilm-l6-v2-cpu-f32";
// Bounds on the largest difference from the reference of each compared output, each 3x what
// this crate measured (`cargo test -p monogen-tests --test bert -- --nocapture` prints the
// figures; 2026-12-06, amd-epyc-2c). The reference is transformers' f32 forward pass, stored
// as f32: a few units in the last place of values near 1 (2⁻²³ ≈ 1.2e-7) is as close as two
// f32 computations that sum in different orders come, and that is what these allow.
/// Token states (values up to about 10): measured 3.0e-6.
const STATES: f32 = 9e-6;
/// Mean-pooled vectors: measured 8.6e-7.
const POOLED: f32 = 2.5e-6;
/// L2-normalized vectors (values near 0.05): measured 1.7e-7.
const NORMALIZED: f32 = 5e-7;
/// Cosines of normalized vectors (the diagonal's sums of 384 squares near 1): measured 6.0e-7.
const COSINE: f32 = 1.8e-6;
/// How far a sentence's outputs may move when it runs in a batch: f32 rounding of sums taken
/// in another order (kernels may pick another path for a batch's row count).
const BATCH_ROUNDING: f32 = 1e-5;

struct Fixture {
    dir: PathBuf,
    model: minilm::Model,
    tokenizer: minilm::Tokenizer,
    reference: Value,
}

/// The model, loaded once for all tests; `None` without the real model.
fn fixture() -> Option<&'static Fixture> {
    static FIXTURE: OnceLock<Option<Fixture>> = OnceLock::new();
    FIXTURE
        .get_or_init(|| {
            let dir = model_dir(MODEL)?;
            Some(Fixture {
                model: minilm::Model::load(&dir).expect("the real model loads"),
                tokenizer: minilm::Tokenizer::load(&dir).expect("its tokenizer loads"),
                reference: reference_json(&dir),
                dir,
            })
        })
        .as_ref()
}

fn sentences(f: &Fixture) -> Vec<(String, Vec<u32>)> {
    f.reference["sentences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["text"].as_str().unwrap().to_string(), ids(&s["input_ids"])))
        .collect()
}

fn rows(path: &Path) -> Vec<Vec<f32>> {
    let (shape, values) = read_npy_f32(path);
    values.chunks(shape[1]).map(<[f32]>::to_vec).collect()
}

#[test]
fn the_tokenizer_gives_the_reference_ids() {
    let Some(f) = fixture() else { return };
    for (text, want) in sentences(f) {
        assert_eq!(f.tokenizer.encode(&text).unwrap(), want, "{text}");
    }
    // tokenizer.json pads and truncates to 128; the crate pads per batch and truncates at
    // min(128, MAX_SEQ_LEN).
    assert_eq!(f.tokenizer.max_len(), 128.min(minilm::MAX_SEQ_LEN));
    assert_eq!(f.tokenizer.encode("").unwrap(), [101, 102], "an empty sentence is [CLS] [SEP]");
}

#[test]
fn token_states_match_the_reference_alone_and_padded_in_a_batch() {
    let Some(f) = fixture() else { return };
    let batch: Vec<Vec<u32>> = sentences(f).into_iter().map(|(_, ids)| ids).collect();
    let mut encoder = f.model.encoder();
    let together = encoder.hidden_states(&batch).unwrap();
    for (i, ids) in batch.iter().enumerate() {
        let (shape, want) = read_npy_f32(&f.dir.join(format!("reference/last_hidden_state_{i}.npy")));
        assert_eq!(shape, [ids.len(), minilm::HIDDEN_SIZE]);
        let alone = encoder.hidden_states(&[ids]).unwrap().remove(0);
        let (diff, at) = max_abs_diff(&alone, &want);
        eprintln!("sentence {i}: last_hidden_state max abs diff {diff:e}");
        assert!(diff <= STATES, "sentence {i}: token states differ by {diff} at {at}");
        // Sentences 0 and 1 (12 tokens) are padded to sentence 2's 14 in the batch. Masking
        // makes padding invisible; what may differ is rounding, as a matmul kernel may sum in
        // another order for a batch's row count than for one sentence's (a masking error
        // would show as differences of 1e-2 and more).
        let (diff, at) = max_abs_diff(&together[i], &alone);
        assert!(
            diff <= BATCH_ROUNDING,
            "sentence {i}: padding in a batch changes its states by {diff} at {at}"
        );
    }
}

#[test]
fn pooled_and_normalized_vectors_and_their_cosines_match_the_reference() {
    let Some(f) = fixture() else { return };
    let batch: Vec<Vec<u32>> = sentences(f).into_iter().map(|(_, ids)| ids).collect();
    let mut encoder = f.model.encoder();
    let mut vectors = encoder.embed(&batch).unwrap();
    for (i, want) in rows(&f.dir.join("reference/mean_pooled.npy")).iter().enumerate() {
        let (diff, at) = max_abs_diff(&vectors[i], want);
        eprintln!("sentence {i}: mean pooled max abs diff {diff:e}");
        assert!(diff <= POOLED, "sentence {i}: mean pooled vector differs by {diff} at {at}");
    }
    minilm::normalize(&mut vectors);
    for (i, want) in rows(&f.dir.join("reference/normalized.npy")).iter().enumerate() {
        let (diff, at) = max_abs_diff(&vectors[i], want);
        eprintln!("sentence {i}: normalized max abs diff {diff:e}");
        assert!(diff <= NORMALIZED, "sentence {i}: normalized vector differs by {diff} at {at}");
    }
    let cosine = &f.reference["cosine"];
    let mut worst = 0f32;
    for i in 0..3 {
        for j in 0..3 {
            let dot: f32 = vectors[i].iter().zip(&vectors[j]).map(|(a, b)| a * b).sum();
            let want = cosine[i][j].as_f64().unwrap() as f32;
            assert!((dot - want).abs() <= COSINE, "cosine[{i}][{j}] = {dot}, reference {want}");
            worst = worst.max((dot - want).abs());
        }
    }
    eprintln!("cosines: max abs diff {worst:e}");
}

#[test]
fn long_batches_run_in_parts_and_long_sentences_are_truncated() {
    let Some(f) = fixture() else { return };
    let mut encoder = f.model.encoder();
    // More sentences than MAX_BATCH, of many lengths, some empty; the part after the first
    // MAX_BATCH holds one far too long (a full batch of 128 tokens would take seconds).
    let long_at = minilm::MAX_BATCH + 1;
    let texts: Vec<String> = (0..minilm::MAX_BATCH + 3)
        .map(|i| match i {
            i if i == long_at => "word ".repeat(1000),
            i if i % 4 == 0 => String::new(),
            i => "a few words ".repeat(i % 9),
        })
        .collect();
    let batch: Vec<Vec<u32>> = texts.iter().map(|t| f.tokenizer.encode(t).unwrap()).collect();
    assert_eq!(batch[long_at].len(), f.tokenizer.max_len(), "a long sentence is truncated");
    assert_eq!(*batch[long_at].last().unwrap(), 102, "truncation keeps [SEP]");
    let all = encoder.embed(&batch).unwrap();
    assert_eq!(all.len(), batch.len());
    for i in [0, 1, 2, long_at, long_at + 1] {
        let alone = encoder.embed(&[&batch[i]]).unwrap().remove(0);
        let (diff, at) = max_abs_diff(&all[i], &alone);
        assert!(diff <= BATCH_ROUNDING, "sentence {i}: batching changes its vector by {diff} at {at}");
        assert!(alone.iter().all(|v| v.is_finite()), "sentence {i}: not finite");
    }
}

#[test]
fn bad_token_ids_are_refused_with_a_reason() {
    let Some(f) = fixture() else { return };
    let mut encoder = f.model.encoder();
    let out_of_range = encoder.embed(&[vec![101, 40_000, 102]]).unwrap_err();
    assert!(matches!(out_of_range, minilm::Error::TokenOutOfRange { id: 40_000, .. }), "{out_of_range}");
    let too_long = encoder.embed(&[vec![101; minilm::MAX_SEQ_LEN + 1]]).unwrap_err();
    assert!(matches!(too_long, minilm::Error::SequenceTooLong { .. }), "{too_long}");
    let empty: Vec<u32> = Vec::new();
    let empty = encoder.hidden_states(&[empty]).unwrap_err();
    assert!(empty.to_string().contains("sentence 0 has no tokens"), "{empty}");
}

/// The binary of a copy of the crate, built once.
fn binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| build_copy(CRATE))
}

#[test]
fn the_binary_embeds_texts_and_files_as_json_or_lines() {
    let Some(f) = fixture() else { return };
    let model = f.dir.to_str().unwrap();
    let texts: Vec<String> = sentences(f).into_iter().map(|(t, _)| t).collect();
    let input = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(input.path(), format!("{}\n{}\n", texts[1], texts[2])).unwrap();
    let out = Command::new(binary())
        .args(["--model", model, "--text", &texts[0], "--input", input.path().to_str().unwrap()])
        .args(["--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["workload"], CRATE);
    assert_eq!(report["tokens"], serde_json::json!([12, 12, 14]));
    for key in ["load_ms", "tokenize_ms", "encode_ms", "sentences_per_s"] {
        assert!(report[key].as_f64().is_some_and(|v| v >= 0.0), "{key}: {report}");
    }
    let want = rows(&f.dir.join("reference/normalized.npy"));
    for (i, vector) in report["embeddings"].as_array().unwrap().iter().enumerate() {
        let got: Vec<f32> = vector.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        let (diff, _) = max_abs_diff(&got, &want[i]);
        assert!(diff <= NORMALIZED, "sentence {i}: {diff}");
    }

    // Plain output: one line of HIDDEN_SIZE values per sentence; an empty text is a sentence. The
    // workload normalizes; --no-normalize prints the pooled vectors as they are.
    let out = Command::new(binary()).args(["--model", model, "--text", &texts[0]]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line: Vec<f32> =
        String::from_utf8(out.stdout).unwrap().trim().split(' ').map(|v| v.parse().unwrap()).collect();
    let (diff, _) = max_abs_diff(&line, &want[0]);
    assert!(diff <= NORMALIZED, "the default line is not the normalized vector: {diff}");
    let out = Command::new(binary())
        .args(["--model", model, "--text", &texts[0], "--text", "", "--no-normalize"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2);
    let first: Vec<f32> = lines[0].split(' ').map(|v| v.parse().unwrap()).collect();
    assert_eq!(first.len(), minilm::HIDDEN_SIZE);
    let (diff, _) = max_abs_diff(&first, &rows(&f.dir.join("reference/mean_pooled.npy"))[0]);
    assert!(diff <= POOLED, "unnormalized line differs by {diff}");
}

#[test]
fn the_binary_refuses_bad_input_with_an_exit_code() {
    let Some(f) = fixture() else { return };
    let model = f.dir.to_str().unwrap();
    let cases: [(&[&str], i32, &str); 3] = [
        (&["--model", model], 2, "--text"),
        (&["--model", "/nonexistent/model", "--text", "x"], 3, "/nonexistent/model"),
        (&["--model", model, "--input", "/nonexistent/sentences.txt"], 3, "/nonexistent/sentences.txt"),
    ];
    for (args, code, message) in cases {
        let out = Command::new(binary()).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(message), "{args:?}: {err}");
    }
}

#[test]
fn ctrl_c_stops_a_long_run_promptly_with_the_usual_status() {
    use std::os::unix::process::ExitStatusExt;
    let Some(f) = fixture() else { return };
    let input = tempfile::NamedTempFile::new().unwrap();
    let sentence = "Small specialized models doing narrow jobs are where a monomorphized runtime shines. ";
    let lines: Vec<String> = (0..4000).map(|i| format!("{i} {}", sentence.repeat(3))).collect();
    std::fs::write(input.path(), lines.join("\n")).unwrap();
    let mut child = Command::new(binary())
        .args(["--model", f.dir.to_str().unwrap(), "--input", input.path().to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let sent = Instant::now();
    let kill = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(2), "{status:?}: Ctrl-C ends the process as SIGINT does");
    assert!(sent.elapsed().as_secs_f64() < 2.0, "it took {:?} to stop", sent.elapsed());
}
