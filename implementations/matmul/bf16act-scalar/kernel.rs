//! Reference matrix product `out = bf16(x) · wᵀ` with bfloat16 weights stored `[N, K]` and
//! activations rounded to bfloat16.
//!
//! Every activation is rounded to the nearest bfloat16 (ties to even), every weight is widened
//! exactly to f32 (a bfloat16 is the high half of an f32), and every output is one dot product
//! accumulated in f32 in order of increasing k: the definition the other implementations are
//! checked against.

/// Computes `out[r, n] = Σₖ bf16(x[r, k]) · f32(w[n, k])` for `rows` rows.
///
/// `x`: `[rows, K]`, `w`: `[N, K]` bfloat16 bits, `out`: `[rows, N]`, all row-major.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[u16], rows: usize) {
    assert!(x.len() >= rows * K, "matmul: x is shorter than {rows} rows of {K}");
    assert!(w.len() >= N * K, "matmul: w is shorter than {N} rows of {K}");
    assert!(out.len() >= rows * N, "matmul: out is shorter than {rows} rows of {N}");
    let mut rounded = vec![0.0f32; K];
    for r in 0..rows {
        for (to, &from) in rounded.iter_mut().zip(&x[r * K..(r + 1) * K]) {
            *to = round_bf16(from);
        }
        let out_row = &mut out[r * N..(r + 1) * N];
        for (n, o) in out_row.iter_mut().enumerate() {
            let w_row = &w[n * K..(n + 1) * K];
            let mut acc = 0.0f32;
            for (a, &b) in rounded.iter().zip(w_row) {
                acc += a * f32::from_bits(u32::from(b) << 16);
            }
            *o = acc;
        }
    }
}

/// `value` rounded to the nearest bfloat16 (ties to even), as an f32; a NaN stays a NaN.
fn round_bf16(value: f32) -> f32 {
    if value.is_nan() {
        return f32::from_bits((value.to_bits() | 0x0040_0000) & 0xffff_0000);
    }
    let bits = value.to_bits();
    f32::from_bits(bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000)
}
