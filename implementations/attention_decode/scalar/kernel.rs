//! Reference grouped-query attention of the newest position over the whole KV cache.
//!
//! Every head runs the scalar single-query attention of the shared `scalar_attention`
//! module: in-order f32 dot products scaled by 1/√HEAD_DIM, a softmax that subtracts the
//! maximum, and the probability-weighted sum of the values. This is the definition every
//! other decode implementation is checked against.

use super::shared::scalar_attention::attend;

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
    let group = N_HEADS / N_KV_HEADS;
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
    for h in 0..N_HEADS {
        let at = h * HEAD_DIM;
        attend::<N_KV_HEADS, HEAD_DIM>(
            &mut out[at..],
            &q[at..],
            keys,
            values,
            &mut scores[..len],
            h / group,
        );
    }
}
