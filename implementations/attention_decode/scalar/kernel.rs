//! Reference grouped-query attention of the newest position over the whole KV cache, of f32
//! or of bfloat16 (`KV`).
//!
//! Every head runs the scalar single-query attention of the shared `scalar_attention` module, a
//! bfloat16 key or value widened exactly to f32 as it is read: in-order f32 dot products scaled by
//! 1/√HEAD_DIM, a softmax that subtracts the maximum, and the probability-weighted sum of the
//! values. This is the definition every other decode implementation of the same element type is
//! checked against.

use super::shared::scalar_attention::decode;

/// Attention of the query `q` of the newest position over all `len` cached positions.
///
/// `q`, `out`: `[N_HEADS · HEAD_DIM]`; `keys`, `values`: `[len, N_KV_HEADS · HEAD_DIM]` of
/// the cache's element type;
/// `scores`: scratch of at least `len` values. Query head h reads kv head
/// `h / (N_HEADS / N_KV_HEADS)`.
#[inline]
pub fn attention_decode<const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize>(
    out: &mut [f32],
    q: &[f32],
    keys: &[KV],
    values: &[KV],
    scores: &mut [f32],
) {
    decode::<N_HEADS, N_KV_HEADS, HEAD_DIM>(out, q, keys, values, scores)
}
