//! Attention of one query head over cached positions with AVX2 and FMA: the core that the
//! AVX2 prefill and decode kernels run for every (row, head) pair.
//!
//! Three passes over the `len` cached positions of one kv head:
//! 1. scores: 8 keys at a time, 8 dot products accumulated lane-wise and reduced by one
//!    transposed horizontal-add tree into a vector of 8 scores, scaled by 1/√HEAD_DIM, with a
//!    running vector maximum;
//! 2. softmax numerators: `exp(score − max)` 8 at a time with a vectorised exp, and their sum;
//! 3. output: the values weighted by those numerators with fused multiply-adds into four
//!    independent accumulators (hiding the FMA latency), scaled by 1/sum at the end.
//!
//! Any HEAD_DIM works (a head dim that is not a multiple of 8 ends with masked loads), and so
//! does any number of positions (leftover keys are scored one at a time).

use std::arch::x86_64::*;

use super::avx2_math::{
    LANES, dot_tile, exp, hmax, hsum, lane_mask, load, load_partial, load_upto, store,
    store_partial, store_upto, sum8,
};

/// Attends the query head `q` (`HEAD_DIM` values) to the first `scores.len()` positions of
/// kv head `kv_head` in `keys` and `values` (`[positions, N_KV_HEADS · HEAD_DIM]`), writing
/// the `HEAD_DIM` outputs to `out`. `scores` is scratch space, one value per position.
///
/// # Safety
///
/// Code that does not itself enable AVX2 and FMA may call this (in `unsafe`) only on a CPU
/// that has both features.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn attend<const N_KV_HEADS: usize, const HEAD_DIM: usize>(
    out: &mut [f32],
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut [f32],
    kv_head: usize,
) {
    let kv_dim = N_KV_HEADS * HEAD_DIM;
    let len = scores.len();
    assert!(kv_head < N_KV_HEADS, "kv head {kv_head} of {N_KV_HEADS}");
    let offset = kv_head * HEAD_DIM;
    // The cache is walked in blocks of whole rows: with the head known to lie inside a row,
    // the compiler drops the bounds checks of the rows.
    let keys = &keys[..len * kv_dim];
    let values = &values[..len * kv_dim];
    let q = &q[..HEAD_DIM];
    let out = &mut out[..HEAD_DIM];
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();

    // Scores of 8 keys at a time, and their running maximum.
    let mut max_lanes = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut key_blocks = keys.chunks_exact(LANES * kv_dim);
    let mut score_blocks = scores.chunks_exact_mut(LANES);
    for (block, block_scores) in (&mut key_blocks).zip(&mut score_blocks) {
        let mut heads: [&[f32]; LANES] = [&[]; LANES];
        for (i, head) in heads.iter_mut().enumerate() {
            *head = &block[i * kv_dim + offset..][..HEAD_DIM];
        }
        let [dots] = dot_tile::<HEAD_DIM, 1, LANES>([q], heads);
        let s = _mm256_mul_ps(sum8(dots), _mm256_set1_ps(scale));
        store(block_scores, 0, s);
        max_lanes = _mm256_max_ps(max_lanes, s);
    }
    let mut max = hmax(max_lanes);
    let tail_keys = key_blocks.remainder().chunks_exact(kv_dim);
    for (row, score) in tail_keys.zip(score_blocks.into_remainder()) {
        let [[dot]] = dot_tile::<HEAD_DIM, 1, 1>([q], [&row[offset..][..HEAD_DIM]]);
        *score = hsum(dot) * scale;
        max = max.max(*score);
    }

    // Softmax numerators exp(s - max), in place, and their sum.
    let max_lanes = _mm256_set1_ps(max);
    let mut sum_lanes = _mm256_setzero_ps();
    let mut score_blocks = scores.chunks_exact_mut(LANES);
    for block in &mut score_blocks {
        let e = exp(_mm256_sub_ps(load(block, 0), max_lanes));
        store(block, 0, e);
        sum_lanes = _mm256_add_ps(sum_lanes, e);
    }
    let tail = score_blocks.into_remainder();
    if !tail.is_empty() {
        let e = exp(_mm256_sub_ps(load_partial(tail), max_lanes));
        store_partial(tail, e);
        // Lanes past the end of the scores hold exp(-max): keep them out of the sum.
        let kept = _mm256_and_ps(e, _mm256_castsi256_ps(lane_mask(tail.len())));
        sum_lanes = _mm256_add_ps(sum_lanes, kept);
    }
    let inv_sum = _mm256_set1_ps(1.0 / hsum(sum_lanes));

    // The weighted sum of the values, 8 output lanes at a time, over 4 positions at a time
    // into 4 accumulators.
    let scores = &*scores;
    for d in (0..HEAD_DIM).step_by(LANES) {
        let mut acc = [_mm256_setzero_ps(); 4];
        let value_quads = values.chunks_exact(4 * kv_dim);
        let score_quads = scores.chunks_exact(4);
        let tail = value_quads
            .remainder()
            .chunks_exact(kv_dim)
            .zip(score_quads.remainder());
        for (quad, p) in value_quads.zip(score_quads) {
            for (u, lanes) in acc.iter_mut().enumerate() {
                let value = &quad[u * kv_dim + offset..][..HEAD_DIM];
                *lanes = _mm256_fmadd_ps(_mm256_set1_ps(p[u]), load_upto(value, d), *lanes);
            }
        }
        for (row, &p) in tail {
            let value = &row[offset..][..HEAD_DIM];
            acc[0] = _mm256_fmadd_ps(_mm256_set1_ps(p), load_upto(value, d), acc[0]);
        }
        let total = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        store_upto(out, d, _mm256_mul_ps(total, inv_sum));
    }
}
