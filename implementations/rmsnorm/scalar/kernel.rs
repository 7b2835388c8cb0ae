//! Reference RMS norm, as Hugging Face's `LlamaRMSNorm` computes it in f32.
//!
//! For each row: the mean of the squares accumulated in f32 in order, `inv = 1 / √(mean +
//! eps)`, and `out[i] = weight[i] · (x[i] · inv)`, in that order of rounding.

/// Normalises `rows` rows of `DIM` values: `out = weight · x / √(mean(x²) + eps)`.
///
/// `x`, `out`: `[rows, DIM]`; `weight`: `[DIM]`.
#[inline]
pub fn rmsnorm<const DIM: usize>(
    out: &mut [f32],
    x: &[f32],
    weight: &[f32],
    eps: f32,
    rows: usize,
) {
    assert!(
        x.len() >= rows * DIM,
        "rmsnorm: x is shorter than {rows} rows of {DIM}"
    );
    assert!(
        out.len() >= rows * DIM,
        "rmsnorm: out is shorter than {rows} rows of {DIM}"
    );
    let weight = &weight[..DIM];
    for r in 0..rows {
        let x_row = &x[r * DIM..(r + 1) * DIM];
        let out_row = &mut out[r * DIM..(r + 1) * DIM];
        let mut sum_sq = 0.0f32;
        for v in x_row {
            sum_sq += v * v;
        }
        let inv = 1.0 / (sum_sq / DIM as f32 + eps).sqrt();
        for ((o, v), w) in out_row.iter_mut().zip(x_row).zip(weight) {
            *o = w * (v * inv);
        }
    }
}
