//! Matrix product `out = x · wᵀ` with f32 or bfloat16 weights (`W`) and AVX-512F on `THREADS`
//! threads: the product of `shared/avx512_matmul.rs`, its weight rows cut into `THREADS` equal
//! shares that the persistent team of `shared/team.rs` computes, the calling thread taking the
//! first; dot products at every row count. Each thread reads only its share of the weights, which
//! halves the memory traffic per thread of a decode step as well as the work of a prefill.

use super::shared::avx512_matmul::Product;
use super::shared::team;

/// Computes `out[r, n] = Σₖ x[r, k] · f32(w[n, k])` for `rows` rows.
///
/// `x`: `[rows, K]`, `w`: `[N, K]` of f32 or bfloat16 bits (`W`), `out`: `[rows, N]`, all
/// row-major.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[W], rows: usize) {
    // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F, and the
    // product's pointers come from slices whose lengths `Product::new` checked; `out` (and, for
    // f32 weights, the transposed activations) stay alive until every share is done.
    unsafe { Product::new::<N, K>(out, x, w, rows).prepared::<false, _>(|product| team::run(*product)) }
}
