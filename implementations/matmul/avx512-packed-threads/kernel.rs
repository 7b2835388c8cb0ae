//! Matrix product `out = x · wᵀ` with AVX-512F on `THREADS` threads, over weights packed at
//! load: the broadcast tiles of `shared/avx512_packed.rs`, their blocks of 48 weight rows
//! cut into `THREADS` shares that the persistent team of `shared/team.rs` computes,
//! the calling thread taking the first. Each thread streams only its share of the weights.

use super::shared::avx512_packed::{self, Packed};
use super::shared::team;

/// The `[n, k]` row-major weights `w` in the layout [`matmul`] reads: blocks of 48 weight
/// rows, each stored column by column.
pub fn pack(w: &[f32], n: usize, k: usize) -> Vec<f32> {
    avx512_packed::pack(w, n, k)
}

/// Computes `out[r, n] = Σₖ x[r, k] · w[n, k]` for `rows` rows.
///
/// `x`: `[rows, K]` and `out`: `[rows, N]`, row-major; `w`: `[N, K]` as [`pack`] wrote it.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[f32], rows: usize) {
    // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F, and the
    // product's pointers come from slices whose lengths `Packed::new` checked; `out` stays
    // borrowed until every share is done.
    unsafe { team::run(Packed::new::<N, K>(out, x, w, rows)) }
}
