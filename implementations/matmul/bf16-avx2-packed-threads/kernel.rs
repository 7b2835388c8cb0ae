//! Matrix product `out = x · wᵀ` with bfloat16 weights and exact f32 activations on `THREADS`
//! threads, over weights packed once, at load: the broadcast tiles of
//! `shared/avx2_bf16_packed.rs`, their blocks of 32 weight rows cut into `THREADS` shares
//! that the persistent team of `shared/team.rs` computes, the calling thread taking the first.
//! Each thread streams only its share of the weights, front to back.

use super::shared::avx2_bf16_packed::{self, Packed};
use super::shared::team;

/// The `[n, k]` row-major bfloat16 weights `w` (as nn.Linear stores them) in the layout this
/// kernel reads: blocks of 32 weight rows, each stored column by column.
pub fn pack(w: &[u16], n: usize, k: usize) -> Vec<u16> {
    // SAFETY: the generated crate checks at start-up, before it loads any weights, that the CPU
    // has AVX2 and FMA.
    unsafe { avx2_bf16_packed::pack(w, n, k) }
}

/// Computes `out[r, n] = Σₖ x[r, k] · f32(w[n, k])` for `rows` rows.
///
/// `x`: `[rows, K]`, `w`: the `[N, K]` bfloat16 weights as `pack` wrote them, `out`:
/// `[rows, N]`, row-major.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[u16], rows: usize) {
    // SAFETY: the generated crate checks at start-up that the CPU has AVX2 and FMA, and the
    // product's pointers come from slices whose lengths `Packed::new` checked; `out` stays
    // borrowed until every share is done.
    unsafe { team::run(Packed::new::<N, K>(out, x, w, rows)) }
}
