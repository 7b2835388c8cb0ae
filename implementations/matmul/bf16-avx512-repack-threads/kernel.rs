//! Matrix product `out = x · wᵀ` with bfloat16 weights and AVX-512F on `THREADS` threads: the
//! dot tiles of `shared/avx512_matmul.rs` over `u16` weights for a few rows (a decode step),
//! and from `REPACK_ROWS` rows on (a prefill) the blocks of `shared/avx512_repack.rs`, each
//! thread widening and packing its own blocks of weight rows as it reaches them. The weight rows
//! are cut into `THREADS` equal shares that the persistent team of `shared/team.rs` computes,
//! the calling thread taking the first.

use super::shared::avx512_matmul::Product;
use super::shared::avx512_repack::{REPACK_ROWS, Repack};
use super::shared::team;

/// Computes `out[r, n] = Σₖ x[r, k] · f32(w[n, k])` for `rows` rows.
///
/// `x`: `[rows, K]`, `w`: `[N, K]` bfloat16 bits, `out`: `[rows, N]`, all row-major.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[u16], rows: usize) {
    let product = Product::new::<N, K>(out, x, w, rows);
    // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F, and the
    // product's pointers come from slices whose lengths `Product::new` checked; `out` and the
    // paired activations of the dot tiles stay alive until every share is done. The blocks
    // read `x` as it is, so a call of `REPACK_ROWS` rows or more is not paired.
    unsafe {
        if rows >= REPACK_ROWS {
            team::run(Repack(product))
        } else {
            product.prepared::<false, _>(|product| team::run(Repack(*product)))
        }
    }
}
