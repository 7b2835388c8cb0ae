//! Attention of one query head over cached positions in plain scalar code: the definition
//! that the reference prefill and decode kernels run for every (row, head) pair.
//!
//! As Hugging Face's eager LLaMA attention computes it in f32: scores `q · k / √HEAD_DIM`
//! (each dot product accumulated in order), a softmax that subtracts the maximum score and
//! divides every `exp` by their sum, and the sum of the values weighted by those
//! probabilities, accumulated position by position.

/// Attends the query head `q` (`HEAD_DIM` values) to the first `scores.len()` positions of
/// kv head `kv_head` in `keys` and `values` (`[positions, N_KV_HEADS · HEAD_DIM]`), writing
/// the `HEAD_DIM` outputs to `out`. `scores` is scratch space, one value per position.
#[inline]
pub fn attend<const N_KV_HEADS: usize, const HEAD_DIM: usize>(
    out: &mut [f32],
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut [f32],
    kv_head: usize,
) {
    let kv_dim = N_KV_HEADS * HEAD_DIM;
    let q = &q[..HEAD_DIM];
    let out = &mut out[..HEAD_DIM];
    let offset = kv_head * HEAD_DIM;
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();

    for (j, score) in scores.iter_mut().enumerate() {
        let key = &keys[j * kv_dim + offset..][..HEAD_DIM];
        let mut dot = 0.0f32;
        for (a, b) in q.iter().zip(key) {
            dot += a * b;
        }
        *score = dot * scale;
    }

    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for score in scores.iter_mut() {
        *score = (*score - max).exp();
        sum += *score;
    }

    out.fill(0.0);
    for (j, &e) in scores.iter().enumerate() {
        let p = e / sum;
        let value = &values[j * kv_dim + offset..][..HEAD_DIM];
        for (o, v) in out.iter_mut().zip(value) {
            *o += p * v;
        }
    }
}
