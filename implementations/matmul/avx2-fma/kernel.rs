//! Matrix product `out = x · wᵀ` with AVX2 and FMA on the calling thread: the weight-blocked,
//! register-blocked product of `shared/avx2_matmul.rs` (whose documentation describes it).

use super::shared::avx2_matmul::matmul_avx2;

/// Computes `out[r, n] = Σₖ x[r, k] · w[n, k]` for `rows` rows.
///
/// `x`: `[rows, K]`, `w`: `[N, K]`, `out`: `[rows, N]`, all row-major.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[f32], rows: usize) {
    assert!(
        x.len() >= rows * K,
        "matmul: x is shorter than {rows} rows of {K}"
    );
    assert!(
        w.len() >= N * K,
        "matmul: w is shorter than {N} rows of {K}"
    );
    assert!(
        out.len() >= rows * N,
        "matmul: out is shorter than {rows} rows of {N}"
    );
    // SAFETY: the generated crate checks at start-up that the CPU has AVX2 and FMA.
    unsafe { matmul_avx2::<N, K>(out, x, w, rows) }
}
