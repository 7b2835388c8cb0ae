//! Reference matrix product `out = x · wᵀ`, with the weight stored `[N, K]` as `nn.Linear`
//! stores it.
//!
//! Plain scalar loops: every output is one dot product accumulated in f32 in order of
//! increasing k. This is the definition every other matmul implementation is checked
//! against.

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
    for r in 0..rows {
        let x_row = &x[r * K..(r + 1) * K];
        let out_row = &mut out[r * N..(r + 1) * N];
        for (n, o) in out_row.iter_mut().enumerate() {
            let w_row = &w[n * K..(n + 1) * K];
            let mut acc = 0.0f32;
            for (a, b) in x_row.iter().zip(w_row) {
                acc += a * b;
            }
            *o = acc;
        }
    }
}
