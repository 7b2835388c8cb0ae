//! GELU with AVX2 and FMA, eight values at a time.
//!
//! With z = |x| / √2, erfc(z) ≈ t · (a₁ + t · (a₂ + t · (a₃ + t · (a₄ + t · a₅)))) · e^(−z²),
//! t = 1 / (1 + p · z) (Abramowitz & Stegun 7.1.26, absolute error below 1.5e-7). Then
//! GELU(x) = x · (1 − erfc(z) / 2) for x ≥ 0 and x · erfc(z) / 2 for x < 0: the negative side
//! never subtracts two nearly equal numbers.

use std::arch::x86_64::*;

use super::shared::avx2_math::{LANES, exp, load_upto, store_upto};

/// Applies `x · ½ · (1 + erf(x / √2))` to `rows` rows of `N` values, in place.
#[inline]
pub fn gelu<const N: usize>(x: &mut [f32], rows: usize) {
    assert!(x.len() >= rows * N, "gelu: x is shorter than {rows} rows of {N}");
    // SAFETY: the generated crate checks at start-up that the CPU has AVX2 and FMA.
    unsafe { gelu_avx2(&mut x[..rows * N]) }
}

#[target_feature(enable = "avx2,fma")]
fn gelu_avx2(x: &mut [f32]) {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [0.254_829_6, -0.284_496_74, 1.421_413_8, -1.453_152, 1.061_405_4];
    let mut at = 0;
    while at < x.len() {
        let v = load_upto(x, at);
        let z = _mm256_mul_ps(
            _mm256_andnot_ps(_mm256_set1_ps(-0.0), v),
            _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2),
        );
        let t = _mm256_div_ps(_mm256_set1_ps(1.0), _mm256_fmadd_ps(_mm256_set1_ps(P), z, _mm256_set1_ps(1.0)));
        let mut poly = _mm256_set1_ps(A[4]);
        for &a in A[..4].iter().rev() {
            poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(a));
        }
        poly = _mm256_mul_ps(poly, t);
        let half_erfc = _mm256_mul_ps(
            _mm256_mul_ps(poly, exp(_mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), z), z))),
            _mm256_set1_ps(0.5),
        );
        // x ≥ 0: 1 − erfc/2; x < 0: erfc/2 (the sign bit of x picks the lane).
        let factor = _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(1.0), half_erfc), half_erfc, v);
        store_upto(x, at, _mm256_mul_ps(v, factor));
        at += LANES;
    }
}
