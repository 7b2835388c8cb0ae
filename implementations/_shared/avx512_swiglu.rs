//! SwiGLU with AVX-512F, sixteen values at a time: `gate = gate · up / (1 + e^(−gate))`.
//!
//! e^(−gate) is the shared AVX-512 exp of `avx512_math` (within 2 ulp), and the quotient is
//! a true division, so for gates above −88 each value is within a few ulp of the f64 result.
//! The exp clamps its argument to about ±88: a gate below −88 gives gate · up / 3.4e38, where
//! f64 gives a smaller number (the two differ when `up` is huge), and a gate above 87 gives
//! gate · up.
//! The last values of the slice, fewer than 16, go through a masked load and store.
#![allow(dead_code)]

use std::arch::x86_64::*;

use super::avx512_math::exp;

/// The f32 lanes of an AVX-512 register.
const LANES: usize = 16;

/// Overwrites `gate` with `gate / (1 + e^(−gate)) · up`, value by value; the two are as long.
#[target_feature(enable = "avx512f")]
pub fn swiglu_avx512(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: gate and up differ in length");
    let mut at = 0;
    while at < gate.len() {
        let len = (gate.len() - at).min(LANES);
        let mask: __mmask16 = if len == LANES { u16::MAX } else { (1u16 << len) - 1 };
        // SAFETY: the mask covers `len` values from `at`, inside both slices (equal lengths).
        unsafe {
            let g = _mm512_maskz_loadu_ps(mask, gate.as_ptr().add(at));
            let u = _mm512_maskz_loadu_ps(mask, up.as_ptr().add(at));
            let denominator = _mm512_add_ps(_mm512_set1_ps(1.0), exp(_mm512_sub_ps(_mm512_setzero_ps(), g)));
            let out = _mm512_div_ps(_mm512_mul_ps(g, u), denominator);
            _mm512_mask_storeu_ps(gate.as_mut_ptr().add(at), mask, out);
        }
        at += LANES;
    }
}
