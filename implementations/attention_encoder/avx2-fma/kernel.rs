//! Encoder self-attention with AVX2 and FMA: no causal mask, so every row's query heads attend
//! to all `len` valid rows through the single-query attention of the shared `avx2_attention`
//! module (the one the decoder kernels run), with as many key/value heads as query heads.

use super::shared::avx2_attention::attend;

/// Multi-head self-attention over the first `len` rows.
///
/// `q`, `k`, `v`, `out`: `[len, N_HEADS · HEAD_DIM]`; `scores`: at least `len` values.
#[inline]
pub fn attention_encoder<const N_HEADS: usize, const HEAD_DIM: usize>(
    out: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    scores: &mut [f32],
    len: usize,
) {
    let width = N_HEADS * HEAD_DIM;
    assert!(
        q.len() >= len * width && k.len() >= len * width && v.len() >= len * width,
        "attention_encoder: q, k and v need {len} rows of {width}"
    );
    assert!(out.len() >= len * width, "attention_encoder: out is shorter than {len} rows of {width}");
    assert!(scores.len() >= len, "attention_encoder: scores is shorter than {len}");
    // SAFETY: the generated crate checks at start-up that the CPU has AVX2 and FMA.
    unsafe { encoder_avx2::<N_HEADS, HEAD_DIM>(out, q, &k[..len * width], &v[..len * width], &mut scores[..len], len) }
}

#[target_feature(enable = "avx2,fma")]
fn encoder_avx2<const N_HEADS: usize, const HEAD_DIM: usize>(
    out: &mut [f32],
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut [f32],
    len: usize,
) {
    let width = N_HEADS * HEAD_DIM;
    for i in 0..len {
        for h in 0..N_HEADS {
            let at = i * width + h * HEAD_DIM;
            attend::<N_HEADS, HEAD_DIM>(&mut out[at..], &q[at..], keys, values, scores, h);
        }
    }
}
