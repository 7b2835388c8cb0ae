//! SwiGLU with AVX2 and FMA, eight values at a time: `gate = gate · up / (1 + e^(−gate))`.
//!
//! e^(−gate) is the shared AVX2 exp of `avx2_math`, and the quotient is a true division.
//! The exp clamps its argument, so a gate below about −88 gives a tiny number of the right
//! sign, and a gate above 87 gives gate · up. The last values of the slice, fewer than 8, go
//! through a partial load and store.

use std::arch::x86_64::*;

use super::shared::avx2_math::{LANES, exp, load_upto, store_upto};

/// Overwrites `gate` with `gate / (1 + e^(−gate)) · up` for `rows` rows of `HIDDEN` values.
///
/// `gate`, `up`: `[rows, HIDDEN]`.
#[inline]
pub fn swiglu<const HIDDEN: usize>(gate: &mut [f32], up: &[f32], rows: usize) {
    let n = rows * HIDDEN;
    assert!(
        gate.len() >= n && up.len() >= n,
        "swiglu: gate or up is shorter than {rows} rows of {HIDDEN}"
    );
    // SAFETY: the generated crate checks at start-up that the CPU has AVX2 and FMA.
    unsafe { swiglu_avx2(&mut gate[..n], &up[..n]) }
}

#[target_feature(enable = "avx2,fma")]
fn swiglu_avx2(gate: &mut [f32], up: &[f32]) {
    let mut at = 0;
    while at < gate.len() {
        let g = load_upto(gate, at);
        let u = load_upto(up, at);
        let denominator = _mm256_add_ps(_mm256_set1_ps(1.0), exp(_mm256_sub_ps(_mm256_setzero_ps(), g)));
        store_upto(gate, at, _mm256_div_ps(_mm256_mul_ps(g, u), denominator));
        at += LANES;
    }
}
