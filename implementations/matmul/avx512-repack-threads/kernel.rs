//! Matrix product `out = x · wᵀ` with AVX-512F on `THREADS` threads: the dot tiles of
//! `shared/avx512_matmul.rs` for a few rows (a decode step), and from `REPACK_ROWS` rows on (a
//! prefill) the blocks of `shared/avx512_repack.rs`, each thread packing its own blocks of
//! weight rows as it reaches them. The weight rows are cut into `THREADS` equal shares that the
//! persistent team of `shared/team.rs` computes, the calling thread taking the first.

use super::shared::avx512_matmul::Product;
use super::shared::avx512_repack::Repack;
use super::shared::team;

/// Computes `out[r, n] = Σₖ x[r, k] · w[n, k]` for `rows` rows.
///
/// `x`: `[rows, K]`, `w`: `[N, K]`, `out`: `[rows, N]`, all row-major.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[f32], rows: usize) {
    let product = Product::new::<N, K>(out, x, w, rows);
    // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F, and the
    // product's pointers come from slices whose lengths `Product::new` checked; `out` stays
    // borrowed until every share is done.
    unsafe { team::run(Repack(product)) }
}
