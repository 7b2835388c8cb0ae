//! Grouped-query attention of the newest position over the whole KV cache, with AVX2 and
//! FMA.
//!
//! Every head runs the AVX2 single-query attention of the shared `avx2_attention` module:
//! dot products of 8 keys at a time reduced by a transposed horizontal-add tree, a vectorised
//! exp for the softmax, and FMA accumulation of the weighted values.

use super::shared::avx2_attention::attend;

/// Attention of the query `q` of the newest position over all `len` cached positions.
///
/// `q`, `out`: `[N_HEADS · HEAD_DIM]`; `keys`, `values`: `[len, N_KV_HEADS · HEAD_DIM]`;
/// `scores`: scratch of at least `len` values. Query head h reads kv head
/// `h / (N_HEADS / N_KV_HEADS)`.
#[inline]
pub fn attention_decode<const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize>(
    out: &mut [f32],
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut [f32],
) {
    const {
        assert!(
            N_KV_HEADS > 0 && N_HEADS.is_multiple_of(N_KV_HEADS),
            "N_HEADS must be a multiple of N_KV_HEADS"
        )
    };
    let q_dim = N_HEADS * HEAD_DIM;
    let kv_dim = N_KV_HEADS * HEAD_DIM;
    let len = keys.len() / kv_dim;
    assert!(
        len > 0 && keys.len() == len * kv_dim,
        "attention_decode: keys must hold whole positions, at least one"
    );
    assert!(
        values.len() == keys.len(),
        "attention_decode: values and keys differ in length"
    );
    assert!(
        q.len() >= q_dim && out.len() >= q_dim,
        "attention_decode: q or out is shorter than N_HEADS · HEAD_DIM"
    );
    assert!(
        scores.len() >= len,
        "attention_decode: scores is shorter than len"
    );
    // SAFETY: the generated crate checks at start-up that the CPU has AVX2 and FMA.
    unsafe {
        decode_avx2::<N_HEADS, N_KV_HEADS, HEAD_DIM>(out, q, keys, values, &mut scores[..len])
    }
}

#[target_feature(enable = "avx2,fma")]
fn decode_avx2<const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize>(
    out: &mut [f32],
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut [f32],
) {
    let group = N_HEADS / N_KV_HEADS;
    for h in 0..N_HEADS {
        let at = h * HEAD_DIM;
        attend::<N_KV_HEADS, HEAD_DIM>(&mut out[at..], &q[at..], keys, values, scores, h / group);
    }
}
