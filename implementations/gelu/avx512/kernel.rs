//! GELU with AVX-512F, sixteen values at a time.
//!
//! The formula of `gelu/avx2-fma`: with z = |x| / √2, erfc(z) ≈ t · (a₁ + t · (a₂ + t · (a₃ +
//! t · (a₄ + t · a₅)))) · e^(−z²), t = 1 / (1 + p · z) (Abramowitz & Stegun 7.1.26, absolute
//! error below 1.5e-7); GELU(x) = x · (1 − erfc(z) / 2) for x ≥ 0 and x · erfc(z) / 2 for
//! x < 0. t is the 14-bit reciprocal estimate `vrcp14ps` refined by one Newton step
//! (relative error about 1e-8), where the AVX2 version divides, and e^(−z²) is the shared
//! AVX-512 exp of `avx512_math`, which scales by 2^n with `vscalefps`. Past z² = 87.3 that exp
//! gives about 1e-38 rather than 0, so GELU's far negative tail is a tiny negative number
//! (below 1e-36 for |x| up to 100) where f64 gives −0.

use std::arch::x86_64::*;

use super::shared::avx512_math::exp;

/// The f32 lanes of an AVX-512 register.
const LANES: usize = 16;

/// Applies `x · ½ · (1 + erf(x / √2))` to `rows` rows of `N` values, in place.
#[inline]
pub fn gelu<const N: usize>(x: &mut [f32], rows: usize) {
    assert!(x.len() >= rows * N, "gelu: x is shorter than {rows} rows of {N}");
    // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F.
    unsafe { gelu_avx512(&mut x[..rows * N]) }
}

#[target_feature(enable = "avx512f")]
fn gelu_avx512(x: &mut [f32]) {
    let mut at = 0;
    while at < x.len() {
        let len = (x.len() - at).min(LANES);
        let mask: __mmask16 = if len == LANES { u16::MAX } else { (1u16 << len) - 1 };
        // SAFETY: the mask covers `len` values from `at`, all inside `x`.
        unsafe {
            let p = x.as_mut_ptr().add(at);
            let v = _mm512_maskz_loadu_ps(mask, p);
            _mm512_mask_storeu_ps(p, mask, gelu16(v));
        }
        at += LANES;
    }
}

/// GELU of 16 values.
#[inline]
#[target_feature(enable = "avx512f")]
fn gelu16(v: __m512) -> __m512 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [0.254_829_6, -0.284_496_74, 1.421_413_8, -1.453_152, 1.061_405_4];
    let z = _mm512_mul_ps(_mm512_abs_ps(v), _mm512_set1_ps(std::f32::consts::FRAC_1_SQRT_2));
    // t = 1 / d, d = 1 + p · z ≥ 1: the estimate r, then r · (2 − d · r).
    let d = _mm512_fmadd_ps(_mm512_set1_ps(P), z, _mm512_set1_ps(1.0));
    let r = _mm512_rcp14_ps(d);
    let t = _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0)));
    let mut poly = _mm512_set1_ps(A[4]);
    for &a in A[..4].iter().rev() {
        poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(a));
    }
    poly = _mm512_mul_ps(poly, t);
    let half_erfc = _mm512_mul_ps(
        _mm512_mul_ps(poly, exp(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(z, z)))),
        _mm512_set1_ps(0.5),
    );
    // x ≥ 0: 1 − erfc/2; x < 0: erfc/2.
    let negative = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, _mm512_setzero_ps());
    let factor = _mm512_mask_blend_ps(negative, _mm512_sub_ps(_mm512_set1_ps(1.0), half_erfc), half_erfc);
    _mm512_mul_ps(v, factor)
}
