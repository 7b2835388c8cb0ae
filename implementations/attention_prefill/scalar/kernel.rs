//! Reference causal grouped-query attention for a chunk of `rows` new positions.
//!
//! Row r of the chunk sits at position `start + r` and attends to positions `0..=start + r`.
//! Every (row, head) pair runs the scalar single-query attention of the shared
//! `scalar_attention` module: in-order f32 dot products scaled by 1/√HEAD_DIM, a softmax that
//! subtracts the maximum, and the probability-weighted sum of the values. This is the
//! definition every other prefill implementation is checked against.

use super::shared::scalar_attention::attend;

/// Causal attention of the queries of positions `start..start + rows` over the cache.
///
/// `q`, `out`: `[rows, N_HEADS · HEAD_DIM]`; `keys`, `values`: `[start + rows,
/// N_KV_HEADS · HEAD_DIM]`; `scores`: scratch of at least `start + rows` values. Query head
/// h reads kv head `h / (N_HEADS / N_KV_HEADS)`.
#[inline]
pub fn attention_prefill<const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize>(
    out: &mut [f32],
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut [f32],
    start: usize,
    rows: usize,
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
    assert!(
        q.len() >= rows * q_dim,
        "attention_prefill: q is shorter than {rows} rows"
    );
    assert!(
        out.len() >= rows * q_dim,
        "attention_prefill: out is shorter than {rows} rows"
    );
    assert!(
        keys.len() >= (start + rows) * kv_dim,
        "attention_prefill: keys hold fewer than start + rows positions"
    );
    assert!(
        values.len() >= (start + rows) * kv_dim,
        "attention_prefill: values hold fewer than start + rows positions"
    );
    assert!(
        scores.len() >= start + rows,
        "attention_prefill: scores is shorter than start + rows"
    );
    for r in 0..rows {
        let len = start + r + 1;
        for h in 0..N_HEADS {
            let at = r * q_dim + h * HEAD_DIM;
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
}
