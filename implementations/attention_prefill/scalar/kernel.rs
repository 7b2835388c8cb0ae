//! Reference causal grouped-query attention for a chunk of `rows` new positions over a KV
//! cache of f32 or of bfloat16 (`KV`).
//!
//! Row r of the chunk sits at position `start + r` and attends to positions `0..=start + r`.
//! Every (row, head) pair runs the scalar single-query attention of the shared
//! `scalar_attention` module, a bfloat16 key or value widened exactly to f32 as it is read:
//! in-order f32 dot products scaled by 1/√HEAD_DIM, a softmax that
//! subtracts the maximum, and the probability-weighted sum of the values. This is the
//! definition every other prefill implementation of the same element type is checked
//! against.

use super::shared::scalar_attention::prefill;

/// Causal attention of the queries of positions `start..start + rows` over the cache.
///
/// `q`, `out`: `[rows, N_HEADS · HEAD_DIM]`; `keys`, `values`: `[start + rows, N_KV_HEADS ·
/// HEAD_DIM]` of the cache's element type; `scores`: scratch of at least `start + rows` values.
/// Query head h reads kv head `h / (N_HEADS / N_KV_HEADS)`.
#[inline]
pub fn attention_prefill<const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize>(
    out: &mut [f32],
    q: &[f32],
    keys: &[KV],
    values: &[KV],
    scores: &mut [f32],
    start: usize,
    rows: usize,
) {
    prefill::<N_HEADS, N_KV_HEADS, HEAD_DIM>(out, q, keys, values, scores, start, rows)
}
