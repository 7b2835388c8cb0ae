//! Matrix product `out = bf16(x) · wᵀ` with bfloat16 weights and activations rounded to bfloat16 on
//! `THREADS` threads, over weights packed once, at load, into the AMX tiles' layout (`pack`):
//! AVX-512 multiply-adds over the packed blocks of `shared/amx_bf16.rs` (without its AMX tiles), at
//! every row count. Each activation is rounded to the nearest bfloat16 (ties to even) once, by the
//! calling thread, as it rewrites them; the blocks of 32 weight rows are cut into `THREADS` equal
//! shares that the persistent team of `shared/team.rs` computes, the calling thread taking the
//! first.

use super::shared::amx_bf16::{self, Amx, Rounded};
use super::shared::team;

/// The `[n, k]` row-major bfloat16 weights `w` (as nn.Linear stores them) in the layout this
/// kernel reads: blocks of 32 weight rows, each step of 32 values of K two AMX B tiles.
pub fn pack(w: &[u16], n: usize, k: usize) -> Vec<u16> {
    // SAFETY: the generated crate checks at start-up, before it loads any weights, that the CPU
    // has AVX-512F and AVX-512BW.
    unsafe { amx_bf16::pack(w, n, k) }
}

/// Computes `out[r, n] = Σₖ bf16(x[r, k]) · f32(w[n, k])` for `rows` rows.
///
/// `x`: `[rows, K]`, `w`: the `[N, K]` bfloat16 weights as `pack` wrote them, `out`:
/// `[rows, N]`, row-major.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[u16], rows: usize) {
    // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F and AVX-512BW;
    // `prepared` checks the slices' lengths, and `out` and the rewritten activations stay alive
    // until every share is done.
    unsafe { Amx::<Rounded>::prepared::<N, K, _>(out, x, w, rows, |product| team::run(*product)) }
}
