//! LlamaRMSNorm with AVX-512F: per row, the mean of squares, then `weight · (x · 1/√(ms + eps))`.
//!
//! The squares are summed in four 16-lane accumulators (64 values a step, the last values of
//! the row under a mask), added together and reduced once, so the sum is taken in a different
//! order than the reference's in-order f32 sum: both are within a few ulp of the exact mean.
//! The inverse square root is computed once per row, in scalar f32 as the reference does, and
//! each output is `w · (x · inv)`, the reference's rounding.

use std::arch::x86_64::*;

/// f32 lanes of an AVX-512 register.
const LANES: usize = 16;

/// Normalizes `rows` rows of `DIM` values of `x` into `out`, scaled by `weight`.
///
/// `x`, `out`: `[rows, DIM]`; `weight`: `[DIM]`.
#[inline]
pub fn rmsnorm<const DIM: usize>(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32, rows: usize) {
    assert!(x.len() >= rows * DIM, "rmsnorm: x is shorter than {rows} rows of {DIM}");
    assert!(out.len() >= rows * DIM, "rmsnorm: out is shorter than {rows} rows of {DIM}");
    assert!(weight.len() >= DIM, "rmsnorm: weight is shorter than {DIM}");
    for (out_row, x_row) in out[..rows * DIM].chunks_exact_mut(DIM).zip(x[..rows * DIM].chunks_exact(DIM)) {
        // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F.
        unsafe { row_avx512(out_row, x_row, &weight[..DIM], eps) }
    }
}

/// The mask of the first `remaining` lanes, all 16 when at least 16 remain.
#[inline]
fn span_mask(remaining: usize) -> __mmask16 {
    if remaining >= LANES { u16::MAX } else { (1u16 << remaining) - 1 }
}

/// One row: `out`, `x` and `weight` have the same length.
#[target_feature(enable = "avx512f")]
fn row_avx512(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    let n = x.len();
    assert!(out.len() == n && weight.len() == n, "rmsnorm: a row, its output and the weight differ in length");
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut at = 0;
    while at + 4 * LANES <= n {
        for (u, lanes) in acc.iter_mut().enumerate() {
            // SAFETY: the 64 values from `at` lie inside `x`.
            let v = unsafe { _mm512_loadu_ps(x.as_ptr().add(at + u * LANES)) };
            *lanes = _mm512_fmadd_ps(v, v, *lanes);
        }
        at += 4 * LANES;
    }
    while at < n {
        let mask = span_mask(n - at);
        // SAFETY: the mask keeps the load inside `x`.
        let v = unsafe { _mm512_maskz_loadu_ps(mask, x.as_ptr().add(at)) };
        acc[0] = _mm512_fmadd_ps(v, v, acc[0]);
        at += LANES;
    }
    let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    let inv = 1.0 / (_mm512_reduce_add_ps(sum) / n as f32 + eps).sqrt();
    let inv = _mm512_set1_ps(inv);
    let mut at = 0;
    while at < n {
        let mask = span_mask(n - at);
        // SAFETY: the mask keeps every access inside the three slices of length n.
        unsafe {
            let v = _mm512_maskz_loadu_ps(mask, x.as_ptr().add(at));
            let w = _mm512_maskz_loadu_ps(mask, weight.as_ptr().add(at));
            _mm512_mask_storeu_ps(out.as_mut_ptr().add(at), mask, _mm512_mul_ps(w, _mm512_mul_ps(v, inv)));
        }
        at += LANES;
    }
}
