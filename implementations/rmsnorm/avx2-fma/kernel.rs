//! LlamaRMSNorm with AVX2 and FMA: per row, the mean of squares, then
//! `weight · (x · 1/√(ms + eps))`.
//!
//! The squares are summed in four 8-lane accumulators (32 values a step, the last values of
//! the row through a zero-padded partial load), added together and reduced once, so the sum is
//! taken in a different order than the reference's in-order f32 sum: both are within a few ulp
//! of the exact mean. The inverse square root is computed once per row in scalar f32, as the
//! reference does, and each output is `w · (x · inv)`, the reference's rounding.

use std::arch::x86_64::*;

use super::shared::avx2_math::{LANES, hsum, load, load_upto, store_upto};

/// Normalizes `rows` rows of `DIM` values of `x` into `out`, scaled by `weight`.
///
/// `x`, `out`: `[rows, DIM]`; `weight`: `[DIM]`.
#[inline]
pub fn rmsnorm<const DIM: usize>(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32, rows: usize) {
    assert!(x.len() >= rows * DIM, "rmsnorm: x is shorter than {rows} rows of {DIM}");
    assert!(out.len() >= rows * DIM, "rmsnorm: out is shorter than {rows} rows of {DIM}");
    assert!(weight.len() >= DIM, "rmsnorm: weight is shorter than {DIM}");
    for (out_row, x_row) in out[..rows * DIM].chunks_exact_mut(DIM).zip(x[..rows * DIM].chunks_exact(DIM)) {
        // SAFETY: the generated crate checks at start-up that the CPU has AVX2 and FMA.
        unsafe { row_avx2(out_row, x_row, &weight[..DIM], eps) }
    }
}

/// One row: `out`, `x` and `weight` have the same length.
#[target_feature(enable = "avx2,fma")]
fn row_avx2(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    let n = x.len();
    assert!(
        out.len() == n && weight.len() == n,
        "rmsnorm: a row, its output and the weight differ in length"
    );
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut at = 0;
    while at + 4 * LANES <= n {
        for (u, lanes) in acc.iter_mut().enumerate() {
            let v = load(x, at + u * LANES);
            *lanes = _mm256_fmadd_ps(v, v, *lanes);
        }
        at += 4 * LANES;
    }
    while at < n {
        let v = load_upto(x, at);
        acc[0] = _mm256_fmadd_ps(v, v, acc[0]);
        at += LANES;
    }
    let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let inv = _mm256_set1_ps(1.0 / (hsum(sum) / n as f32 + eps).sqrt());
    let mut at = 0;
    while at < n {
        let scaled = _mm256_mul_ps(load_upto(weight, at), _mm256_mul_ps(load_upto(x, at), inv));
        store_upto(out, at, scaled);
        at += LANES;
    }
}
