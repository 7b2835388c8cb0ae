//! LayerNorm with AVX2 and FMA: the reference's two passes (the mean, then the variance of the
//! centred values, so that a large mean does not cancel the variance away), each with four
//! independent 8-lane accumulators, then one pass that writes `(x − mean) · inv · weight + bias`.
//! A DIM that is not a multiple of 8 ends with masked loads and stores.

use std::arch::x86_64::*;

use super::shared::avx2_math::{LANES, hsum, lane_mask, load_upto, store_upto};

/// Normalises `rows` rows of `DIM` values:
/// `out = (x − mean) / √(var + eps) · weight + bias`.
///
/// `x`, `out`: `[rows, DIM]`; `weight`, `bias`: `[DIM]`.
#[inline]
pub fn layernorm<const DIM: usize>(out: &mut [f32], x: &[f32], weight: &[f32], bias: &[f32], eps: f32, rows: usize) {
    assert!(x.len() >= rows * DIM, "layernorm: x is shorter than {rows} rows of {DIM}");
    assert!(out.len() >= rows * DIM, "layernorm: out is shorter than {rows} rows of {DIM}");
    let (weight, bias) = (&weight[..DIM], &bias[..DIM]);
    for r in 0..rows {
        // SAFETY: the generated crate checks at start-up that the CPU has AVX2 and FMA.
        unsafe { row::<DIM>(&mut out[r * DIM..(r + 1) * DIM], &x[r * DIM..(r + 1) * DIM], weight, bias, eps) };
    }
}

/// One row of `DIM` values.
#[target_feature(enable = "avx2,fma")]
fn row<const DIM: usize>(out: &mut [f32], x: &[f32], weight: &[f32], bias: &[f32], eps: f32) {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut at = 0;
    while at < DIM {
        let lane = at / LANES % 4;
        acc[lane] = _mm256_add_ps(acc[lane], load_upto(x, at));
        at += LANES;
    }
    let mean = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]))) / DIM as f32;
    let mean_v = _mm256_set1_ps(mean);
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut at = 0;
    while at < DIM {
        let lane = at / LANES % 4;
        // Masked-off lanes load as 0 and must stay 0 after centring: mask the difference too.
        let valid = _mm256_castsi256_ps(lane_mask(DIM - at));
        let d = _mm256_and_ps(_mm256_sub_ps(load_upto(x, at), mean_v), valid);
        acc[lane] = _mm256_fmadd_ps(d, d, acc[lane]);
        at += LANES;
    }
    let var = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]))) / DIM as f32;
    let inv = _mm256_set1_ps(1.0 / (var + eps).sqrt());
    let mut at = 0;
    while at < DIM {
        let scaled = _mm256_mul_ps(_mm256_sub_ps(load_upto(x, at), mean_v), inv);
        store_upto(out, at, _mm256_fmadd_ps(scaled, load_upto(weight, at), load_upto(bias, at)));
        at += LANES;
    }
}
