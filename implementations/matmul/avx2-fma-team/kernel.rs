//! Matrix product `out = x · wᵀ` with f32 or bfloat16 weights (`W`), AVX2 and FMA on `THREADS`
//! threads, on the persistent team of `shared/team.rs`: for CPUs without AVX-512 (x86-64-v3), where
//! bfloat16 weights halve what a decode step reads. Below 8 rows the dot tiles of
//! `shared/avx2_team_matmul.rs` (a bfloat16 weight widened to f32 in registers as it is loaded),
//! the weight rows cut into `THREADS` shares, the calling thread taking the first; from 8 rows on
//! the blocks of `shared/avx2_repack.rs`, widened and packed as the call reaches them and handed to
//! the threads one by one. Unlike `avx2-fma-threads`, which splits the activation rows over threads
//! it starts for each call, a decode step's single row is shared too (each thread streams its part
//! of the weights), and no call starts a thread.

use std::ops::Range;
use std::sync::atomic::AtomicUsize;

use super::shared::avx2_repack::{GRANULE, Repack};
use super::shared::avx2_team_matmul::Product;
use super::shared::team::{self, Job};

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
    unsafe { team::run(Shared(Repack::new(product, &blocks))) }
}

/// A product of this implementation, as the crate's team shares it.
#[derive(Clone, Copy)]
pub(crate) struct Shared(Repack<Product<W>>);

impl Job for Shared {
    fn n(&self) -> usize {
        self.0.operands.n
    }

    fn granule(&self) -> usize {
        GRANULE
    }

    fn work(&self) -> usize {
        self.0.operands.rows * self.0.operands.n * self.0.operands.k
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract, which `run` keeps; `matmul` enters only on a CPU
        // with AVX2 and FMA.
        unsafe { self.0.columns(cols) }
    }
}
