//! Matrix product `out = x · wᵀ` with blockwise int4 weights and AVX-512 VNNI on `THREADS`
//! threads: the product of `shared/avx512_q4.rs`, its activations quantized once by the
//! calling thread, and its weight rows cut into `THREADS` equal shares that the persistent
//! team of `shared/team.rs` computes, the calling thread taking the first.

use super::shared::avx512_q4::Q4Product;
use super::shared::team;

/// Computes `out[r, n] = Σ_b dx[r, b] · (d[n, b] · Σ_{k in b} qx[r, k] · q[n, k] + m[n, b] ·
/// Σ_{k in b} qx[r, k])` for `rows` rows.
///
/// `x`: `[rows, K]`, `w`: `[N, ⌈K/32⌉ · 16]` bytes of four-bit values and each block's
/// binary16 scale and minimum, `[N, ⌈K/32⌉, 2]`, `out`: `[rows, N]`, all row-major.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: (&[u8], &[u16]), rows: usize) {
    let (w, scales) = w;
    // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F, AVX-512BW and
    // AVX-512 VNNI, and the product's pointers come from slices whose lengths
    // `Q4Product::new` checked; `out` and the quantized activations stay alive until every
    // share is done.
    unsafe {
        Q4Product::new::<N, K>(out, x, w, scales, rows).prepared(|product| team::run(*product))
    }
}
