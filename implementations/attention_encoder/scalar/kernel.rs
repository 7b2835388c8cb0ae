//! Reference encoder attention: every valid row attends to every valid row (no causal mask),
//! one head at a time, with a softmax that subtracts the row's maximum score first.

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
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();
    for i in 0..len {
        for h in 0..N_HEADS {
            let offset = h * HEAD_DIM;
            let q_row = &q[i * width + offset..][..HEAD_DIM];
            let mut max = f32::NEG_INFINITY;
            for (j, score) in scores[..len].iter_mut().enumerate() {
                let k_row = &k[j * width + offset..][..HEAD_DIM];
                let mut dot = 0.0f32;
                for d in 0..HEAD_DIM {
                    dot += q_row[d] * k_row[d];
                }
                *score = dot * scale;
                max = max.max(*score);
            }
            let mut sum = 0.0f32;
            for score in &mut scores[..len] {
                *score = (*score - max).exp();
                sum += *score;
            }
            let out_row = &mut out[i * width + offset..][..HEAD_DIM];
            out_row.fill(0.0);
            for (j, &weight) in scores[..len].iter().enumerate() {
                let v_row = &v[j * width + offset..][..HEAD_DIM];
                let weight = weight / sum;
                for d in 0..HEAD_DIM {
                    out_row[d] += weight * v_row[d];
                }
            }
        }
    }
}
