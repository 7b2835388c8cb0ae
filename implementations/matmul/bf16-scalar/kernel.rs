//! Reference matrix product `out = x · wᵀ` with bfloat16 weights stored `[N, K]`.
//!
//! Every weight is widened exactly to f32 (a bfloat16 is the high half of an f32) and every
//! output is one dot product accumulated in f32 in order of increasing k: the definition the
//! other bf16 implementations are checked against.

/// Computes `out[r, n] = Σₖ x[r, k] · f32(w[n, k])` for `rows` rows.
///
/// `x`: `[rows, K]`, `w`: `[N, K]` bfloat16 bits, `out`: `[rows, N]`, all row-major.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[u16], rows: usize) {
    assert!(x.len() >= rows * K, "matmul: x is shorter than {rows} rows of {K}");
    assert!(w.len() >= N * K, "matmul: w is shorter than {N} rows of {K}");
    assert!(out.len() >= rows * N, "matmul: out is shorter than {rows} rows of {N}");
    for r in 0..rows {
        let x_row = &x[r * K..(r + 1) * K];
        let out_row = &mut out[r * N..(r + 1) * N];
        for (n, o) in out_row.iter_mut().enumerate() {
            let w_row = &w[n * K..(n + 1) * K];
            let mut acc = 0.0f32;
            for (a, &b) in x_row.iter().zip(w_row) {
                acc += a * f32::from_bits(u32::from(b) << 16);
            }
            *o = acc;
        }
    }
}
