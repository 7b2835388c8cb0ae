//! Matrix product `out = x · wᵀ` with AVX2 and FMA on `THREADS` threads: the product of
//! `shared/avx2_team_matmul.rs`, its weight rows cut into `THREADS` shares that the
//! persistent team of `shared/team.rs` computes, the calling thread taking the first. Unlike
//! `avx2-fma-threads`, which splits the activation rows over threads it starts for each call, a
//! decode step's single row is shared too (each thread streams its part of the weights), and
//! no call starts a thread.

use std::ops::Range;

use super::shared::avx2_team_matmul::Product;
use super::shared::team::{self, Job};

/// Computes `out[r, n] = Σₖ x[r, k] · w[n, k]` for `rows` rows.
///
/// `x`: `[rows, K]`, `w`: `[N, K]`, `out`: `[rows, N]`, all row-major.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[f32], rows: usize) {
    let product = Product::new::<N, K>(out, x, w, rows);
    // SAFETY: the generated crate checks at start-up that the CPU has AVX2 and FMA;
    // `Product::new` checked the slices, and `out` stays borrowed until every share is done.
    unsafe { team::run(Shared(product)) }
}

/// A product of this implementation, as the crate's team shares it.
#[derive(Clone, Copy)]
pub(crate) struct Shared(Product<f32>);

impl Job for Shared {
    fn n(&self) -> usize {
        self.0.n
    }

    fn work(&self) -> usize {
        self.0.rows * self.0.n * self.0.k
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract, which `run` keeps; `matmul` enters only on a CPU
        // with AVX2 and FMA.
        unsafe { self.0.columns(cols) }
    }
}
