//! Vector math with AVX-512F that several kernels share.

#![allow(dead_code)]
use std::arch::x86_64::*;

/// e^x in every lane (Cephes' single-precision polynomial, within 2 ulp; −∞, NaN and values
/// below −87.3 give about 1e-38, which callers mask or scale away): x = n·ln 2 + r with
/// |r| ≤ ln 2 / 2, e^r by a degree-6 polynomial, then scaled by 2^n with `vscalefps`.
///
/// # Safety
///
/// Only on a CPU with AVX-512F: callable without `unsafe` from functions that enable it.
#[inline]
#[target_feature(enable = "avx512f")]
pub fn exp(x: __m512) -> __m512 {
    let x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.336_55)), _mm512_set1_ps(88.722_83));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
        x,
        _mm512_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm512_set1_ps(1.987_569_1e-4);
    for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0)));
    _mm512_scalef_ps(p, n)
}
