//! Matrix product `out = x · wᵀ` with f32 or bfloat16 weights (`W`) and AVX-512F on the
//! calling thread: the weight-blocked, register-blocked product of `shared/avx512_matmul.rs`
//! (whose documentation describes it) over every column, by dot products at every row count.
//! bfloat16 weights are widened to f32 in registers 32 at a time as they load: the even ones by
//! a shift, the odd ones by a mask, each multiplied with the matching half of the activations,
//! paired once per call.

use super::shared::avx512_matmul::Product;

/// Computes `out[r, n] = Σₖ x[r, k] · f32(w[n, k])` for `rows` rows.
///
/// `x`: `[rows, K]`, `w`: `[N, K]` of f32 or bfloat16 bits (`W`), `out`: `[rows, N]`, all
/// row-major.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[W], rows: usize) {
    // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F, and the
    // product's pointers come from slices whose lengths `Product::new` checked.
    unsafe { Product::new::<N, K>(out, x, w, rows).prepared::<false, _>(|product| product.columns(0..N)) }
}
