//! Matrix product `out = x · wᵀ` with blockwise int8 weights and AVX-512 VNNI on `THREADS`
//! threads, over weights packed once, at load (`pack`): groups of 16 weight rows, each its
//! binary16 scales and then its blocks of 32 values, which each thread reads front to back
//! (`shared/avx512_q8_packed.rs`). The activations are quantized once, by the calling thread; the
//! groups are cut into `THREADS` equal shares that the persistent team of `shared/team.rs`
//! computes, the calling thread taking the first.

use super::shared::avx512_q8_packed::{self, Q8Packed};
use super::shared::team;

/// The `[n, k]` int8 weights and their `[n, ⌈k/32⌉]` scales (`w`) in the layout [`matmul<q8>`]
/// reads: groups of 16 weight rows, each value offset by 128, each group led by its scales in
/// binary16.
pub fn pack(w: (&[i8], &[f32]), n: usize, k: usize) -> Vec<i8> {
    let (w, scales) = w;
    avx512_q8_packed::pack(w, scales, n, k)
}

/// Ok when `packed` (a saved model's, mapped as it is) holds the `[n, k]` matrix in the layout
/// [`pack`] writes with finite scales, not negative; else why not.
pub fn check_packed(packed: &[i8], n: usize, k: usize) -> Result<(), String> {
    avx512_q8_packed::check_packed(packed, n, k)
}

/// Computes `out[r, n] = Σ_b dx[r, b] · dw[n, b] · Σ_{k in b} qx[r, k] · w[n, k]` for `rows`
/// rows.
///
/// `x`: `[rows, K]` and `out`: `[rows, N]`, row-major; `w`: the `[N, K]` weights and their
/// scales as [`pack`] wrote them, and no scales apart.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: (&[i8], &[f32]), rows: usize) {
    let (w, scales) = w;
    // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F, AVX-512BW and
    // AVX-512 VNNI, and the product's pointers come from slices whose lengths `Q8Packed::new`
    // checked; `out` and the quantized activations stay alive until every share is done.
    unsafe { Q8Packed::new::<N, K>(out, x, w, scales, rows).prepared(|product| team::run(*product)) }
}
