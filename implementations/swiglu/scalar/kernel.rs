//! Reference SwiGLU activation: `gate = silu(gate) · up`, element by element.
//!
//! `silu(g) = g / (1 + e^(−g))`, as PyTorch's CPU kernel evaluates it, in f32.

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
    for (g, u) in gate[..n].iter_mut().zip(&up[..n]) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}
