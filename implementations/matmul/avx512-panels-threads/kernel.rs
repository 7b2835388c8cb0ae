//! Matrix product `out = x · wᵀ` with AVX-512F on `THREADS` threads: the product of
//! `shared/avx512_matmul.rs`, its weight rows cut into `THREADS` equal shares that the
//! persistent team of `shared/team.rs` computes, the calling thread taking the first.
//! From `TRANSPOSED_ROWS` rows on (a prefill) the shares run as panels on the activations
//! transposed once, by the calling thread, and shared.
//! Each thread reads only its share of the weights, which halves the memory traffic per
//! thread of a decode step as well as the work of a prefill.

use super::shared::avx512_matmul::Product;
use super::shared::team;

/// Computes `out[r, n] = Σₖ x[r, k] · w[n, k]` for `rows` rows.
///
/// `x`: `[rows, K]`, `w`: `[N, K]`, `out`: `[rows, N]`, all row-major.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[f32], rows: usize) {
    // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F, and the
    // product's pointers come from slices whose lengths `Product::new` checked; `out` and the
    // transposed activations stay alive until every share is done.
    unsafe { Product::new::<N, K>(out, x, w, rows).prepared::<true, _>(|product| team::run(*product)) }
}
