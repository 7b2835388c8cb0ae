//! Accuracy of the reduced-precision BERT crates, measured rather than assumed:
//! `all-minilm-l6-v2-cpu-bf16` (linear layers' weights rounded to bfloat16 at load) and
//! `all-minilm-l6-v2-cpu-int8` (quantized to blockwise int8 at load, activations quantized per
//! block in every product) and `all-minilm-l6-v2-cpu-int4` (its weights in four bits) against sentence-transformers' reference vectors and cosines, and
//! against the f32 crate on sentences of every length and topic: how close each sentence's
//! vector stays to f32's, and whether the cosines that rank sentences by similarity move.

use all_minilm_l6_v2_cpu_bf16 as bf16;
use all_minilm_l6_v2_cpu_f32 as f32m;
use all_minilm_l6_v2_cpu_int4 as int4;
use all_minilm_l6_v2_cpu_int8 as int8;
use monogen_tests::{ids, model_dir, read_npy_f32, reference_json};

const MODEL: &str = "all-minilm-l6-v2";

/// Sentences of many lengths and topics, some close in meaning and some far apart.
const SENTENCES: [&str; 16] = [
    "",
    "Hello!",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "The new movie is awesome and everyone should see it this weekend.",
    "The stock market fell sharply today after the central bank raised interest rates again.",
    "Rust's ownership model rules out data races at compile time, without a garbage collector.",
    "Photosynthesis converts light energy into chemical energy stored in glucose molecules.",
    "The quick brown fox jumps over the lazy dog near the riverbank while the sun sets slowly behind the distant hills and birds sing.",
];

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The normalized vectors of `SENTENCES` and of the reference's sentences (by their ids), from
/// one crate.
macro_rules! vectors {
    ($krate:ident, $dir:expr, $reference_ids:expr) => {{
        let model = $krate::Model::load($dir).unwrap();
        let tokenizer = $krate::Tokenizer::load($dir).unwrap();
        let ids: Vec<Vec<u32>> = SENTENCES.iter().map(|s| tokenizer.encode(s).unwrap()).collect();
        let mut encoder = model.encoder();
        let mut ours = encoder.embed(&ids).unwrap();
        $krate::normalize(&mut ours);
        let mut reference = encoder.embed($reference_ids).unwrap();
        $krate::normalize(&mut reference);
        (ours, reference)
    }};
}

/// What a reduced-precision crate must keep of f32's vectors.
struct Limits {
    /// Each sentence's vector against f32's (and against the reference's): their cosine.
    min_cosine: f32,
    /// Any pairwise cosine (and the reference's cosine matrix): how far it may move.
    max_cosine_shift: f32,
    /// The share of similarity orderings (one sentence as the query, two others ranked) kept.
    min_orderings_kept: f64,
}

/// Compares `got` (one reduced-precision crate's vectors) with the f32 crate's and with the
/// reference; asserts the limits and prints the figures.
fn assert_close(
    what: &str,
    got: (Vec<Vec<f32>>, Vec<Vec<f32>>),
    want: &(Vec<Vec<f32>>, Vec<Vec<f32>>),
    reference: &[Vec<f32>],
    reference_cosines: &serde_json::Value,
    limits: Limits,
) {
    let Limits { min_cosine, max_cosine_shift, min_orderings_kept } = limits;
    // Each sentence's vector against f32's: their cosine (both are unit vectors).
    let to_f32: Vec<f32> = got.0.iter().zip(&want.0).map(|(a, b)| dot(a, b)).collect();
    let worst = to_f32.iter().copied().fold(1.0f32, f32::min);
    let mean = to_f32.iter().sum::<f32>() / to_f32.len() as f32;
    // Every pair's cosine, which is what a search ranks by, against f32's.
    let n = SENTENCES.len();
    let cosines = |v: &[Vec<f32>]| -> Vec<Vec<f32>> {
        (0..n).map(|i| (0..n).map(|j| dot(&v[i], &v[j])).collect()).collect()
    };
    let (g, w) = (cosines(&got.0), cosines(&want.0));
    let shift = (0..n)
        .flat_map(|i| (0..n).map(move |j| (i, j)))
        .fold(0.0f32, |m, (i, j)| m.max((g[i][j] - w[i][j]).abs()));
    // With each sentence as the query, does every two others keep their order? (f32's near
    // ties, within 1e-3, may go either way.)
    let (mut order_kept, mut orderings) = (0, 0);
    for i in 0..n {
        for j in (0..n).filter(|&j| j != i) {
            for k in (j + 1..n).filter(|&k| k != i) {
                orderings += 1;
                if (g[i][j] > g[i][k]) == (w[i][j] > w[i][k]) || (w[i][j] - w[i][k]).abs() < 1e-3 {
                    order_kept += 1;
                }
            }
        }
    }
    eprintln!(
        "{what}: cosine to f32 worst {worst:.7} mean {mean:.7}; pairwise cosines move by at most {shift:.2e}; \
         {order_kept} of {orderings} orderings kept"
    );
    assert!(
        order_kept as f64 >= min_orderings_kept * orderings as f64,
        "{what}: {order_kept} of {orderings} similarity orderings kept (limit {min_orderings_kept})"
    );
    assert!(worst >= min_cosine, "{what}: a vector's cosine to f32's is {worst} (limit {min_cosine})");
    assert!(
        shift <= max_cosine_shift,
        "{what}: a pairwise cosine moved by {shift} (limit {max_cosine_shift})"
    );
    // The reference sentences: vectors against sentence-transformers', and their cosines.
    for (i, (g, r)) in got.1.iter().zip(reference).enumerate() {
        let c = dot(g, r);
        eprintln!("{what}: reference sentence {i}: cosine to the reference vector {c:.7}");
        assert!(c >= min_cosine, "{what}: reference sentence {i}: cosine {c} to the reference vector");
    }
    for i in 0..got.1.len() {
        for j in 0..got.1.len() {
            let (g, w) = (dot(&got.1[i], &got.1[j]), reference_cosines[i][j].as_f64().unwrap() as f32);
            assert!((g - w).abs() <= max_cosine_shift, "{what}: cosine[{i}][{j}] = {g}, reference {w}");
        }
    }
}

#[test]
fn bf16_and_int8_vectors_stay_close_to_f32_and_the_reference() {
    let Some(dir) = model_dir(MODEL) else { return };
    let json = reference_json(&dir);
    let reference_ids: Vec<Vec<u32>> =
        json["sentences"].as_array().unwrap().iter().map(|s| ids(&s["input_ids"])).collect();
    let (shape, values) = read_npy_f32(&dir.join("reference/normalized.npy"));
    let reference: Vec<Vec<f32>> = values.chunks(shape[1]).map(<[f32]>::to_vec).collect();
    let want = vectors!(f32m, &dir, &reference_ids);
    assert_close(
        "bf16",
        vectors!(bf16, &dir, &reference_ids),
        &want,
        &reference,
        &json["cosine"],
        // Measured (2026-12-06): worst cosine 0.9999856, pairwise cosines moved by at most
        // 8.81e-4, every ordering kept. Each bound is 3x the error: 1 - 3 × 1.44e-5, 3 × 8.81e-4.
        Limits { min_cosine: 0.999957, max_cosine_shift: 2.6e-3, min_orderings_kept: 1.0 },
    );
    assert_close(
        "int8",
        vectors!(int8, &dir, &reference_ids),
        &want,
        &reference,
        &json["cosine"],
        // Measured: worst cosine 0.9982140, pairwise cosines moved by at most 9.01e-3, 1669 of
        // 1680 orderings kept. Bounds at 3x (or less) of each error: 1 - 3 × 1.79e-3, 0.02,
        // 1 - 3 × 11/1680.
        Limits { min_cosine: 0.9946, max_cosine_shift: 0.02, min_orderings_kept: 0.98 },
    );
}

#[test]
fn int4_vectors_stay_close_to_f32_and_the_reference() {
    let Some(dir) = model_dir(MODEL) else { return };
    let json = reference_json(&dir);
    let reference_ids: Vec<Vec<u32>> =
        json["sentences"].as_array().unwrap().iter().map(|s| ids(&s["input_ids"])).collect();
    let (shape, values) = read_npy_f32(&dir.join("reference/normalized.npy"));
    let reference: Vec<Vec<f32>> = values.chunks(shape[1]).map(<[f32]>::to_vec).collect();
    let want = vectors!(f32m, &dir, &reference_ids);
    assert_close(
        "int4",
        vectors!(int4, &dir, &reference_ids),
        &want,
        &reference,
        &json["cosine"],
        // Measured (2026-12-07, intel-xeon-2c): worst cosine 0.9279870, pairwise cosines moved
        // by at most 7.74e-2, 1551 of 1680 orderings kept: four bits cost this 22M-parameter
        // encoder about forty times int8's error. Bounds at 3x each error: 1 - 3 × 7.2e-2,
        // 3 × 7.74e-2, 1 - 3 × 129/1680.
        Limits { min_cosine: 0.784, max_cosine_shift: 0.233, min_orderings_kept: 0.769 },
    );
}
