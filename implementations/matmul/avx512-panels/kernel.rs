//! Matrix product `out = x · wᵀ` with AVX-512F on the calling thread: the product of
//! `shared/avx512_matmul.rs` (whose documentation describes it) over every column, by dot
//! products below `TRANSPOSED_ROWS` rows and by panels on transposed activations from there
//! on (a prefill).

use super::shared::avx512_matmul::Product;

/// Computes `out[r, n] = Σₖ x[r, k] · w[n, k]` for `rows` rows.
///
/// `x`: `[rows, K]`, `w`: `[N, K]`, `out`: `[rows, N]`, all row-major.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[f32], rows: usize) {
    // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F, and the
    // product's pointers come from slices whose lengths `Product::new` checked.
    unsafe { Product::new::<N, K>(out, x, w, rows).prepared::<true, _>(|product| product.columns(0..N)) }
}
