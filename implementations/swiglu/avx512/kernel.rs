//! SwiGLU with AVX-512F, sixteen values at a time (`shared/avx512_swiglu.rs`): `gate = gate ·
//! up / (1 + e^(−gate))`, each value within a few ulp of the f64 result for gates above −88.

use super::shared::avx512_swiglu::swiglu_avx512;

/// Overwrites `gate` with `gate / (1 + e^(−gate)) · up` for `rows` rows of `HIDDEN` values.
///
/// `gate`, `up`: `[rows, HIDDEN]`.
#[inline]
pub fn swiglu<const HIDDEN: usize>(gate: &mut [f32], up: &[f32], rows: usize) {
    let n = rows * HIDDEN;
    assert!(gate.len() >= n && up.len() >= n, "swiglu: gate or up is shorter than {rows} rows of {HIDDEN}");
    // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F.
    unsafe { swiglu_avx512(&mut gate[..n], &up[..n]) }
}
