//! Matrix product `out = x · wᵀ` with f32 or bfloat16 weights (`W`), AVX2 and FMA on `THREADS`
//! threads, on the persistent team of `shared/team.rs`: for CPUs without AVX-512 (x86-64-v3), where
//! bfloat16 weights halve what a decode step reads. Below 8 rows the dot tiles of
//! `shared/avx2_team_matmul.rs` (a bfloat16 weight widened to f32 in registers as it is loaded),
//! the weight rows cut into `THREADS` shares, the calling thread taking the first; from 8 rows on
//! the blocks of `shared/avx2_repack.rs`, widened and packed as the call reaches them and handed to
//! the threads one by one. Unlike `avx2-fma-threads`, which splits the activation rows over threads
//! it starts for each call, a decode step's single row is shared too (each thread streams its part
//! of the weights), and no call starts a thread.

use std::sync::atomic::AtomicUsize;

use super::shared::avx2_repack::Repack;
use super::shared::avx2_team_matmul::Product;
use super::shared::team;

/// Computes `out[r, n] = Σₖ x[r, k] · f32(w[n, k])` for `rows` rows.
///
/// `x`: `[rows, K]`, `w`: `[N, K]` of f32 or bfloat16 bits (`W`), `out`: `[rows, N]`, all
/// row-major.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[W], rows: usize) {
    let product = Product::new::<N, K>(out, x, w, rows);
    let blocks = AtomicUsize::new(0);
    // SAFETY: the generated crate checks at start-up that the CPU has AVX2 and FMA;
    // `Product::new` checked the slices, and `out` stays borrowed until every share is done.
    unsafe { team::run(Repack::new(product, &blocks)) }
}
