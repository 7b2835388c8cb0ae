//! Reference LayerNorm: the mean, then the variance of the centred values (two passes, so
//! that large means do not cancel the variance away), both accumulated in f32 in order.

/// Normalises `rows` rows of `DIM` values:
/// `out = (x − mean) / √(var + eps) · weight + bias`.
///
/// `x`, `out`: `[rows, DIM]`; `weight`, `bias`: `[DIM]`.
#[inline]
pub fn layernorm<const DIM: usize>(
    out: &mut [f32],
    x: &[f32],
    weight: &[f32],
    bias: &[f32],
    eps: f32,
    rows: usize,
) {
    assert!(x.len() >= rows * DIM, "layernorm: x is shorter than {rows} rows of {DIM}");
    assert!(out.len() >= rows * DIM, "layernorm: out is shorter than {rows} rows of {DIM}");
    let (weight, bias) = (&weight[..DIM], &bias[..DIM]);
    for r in 0..rows {
        let x_row = &x[r * DIM..(r + 1) * DIM];
        let out_row = &mut out[r * DIM..(r + 1) * DIM];
        let mut sum = 0.0f32;
        for v in x_row {
            sum += v;
        }
        let mean = sum / DIM as f32;
        let mut sum_sq = 0.0f32;
        for v in x_row {
            let d = v - mean;
            sum_sq += d * d;
        }
        let inv = 1.0 / (sum_sq / DIM as f32 + eps).sqrt();
        for (((o, v), w), b) in out_row.iter_mut().zip(x_row).zip(weight).zip(bias) {
            *o = (v - mean) * inv * w + b;
        }
    }
}
