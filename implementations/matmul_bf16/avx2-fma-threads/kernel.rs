//! Matrix product `out = x · wᵀ` with bfloat16 weights, AVX2 and FMA, on `THREADS` threads:
//! for CPUs without AVX-512 (x86-64-v3), where halving the weights' bytes halves what a
//! decode step reads. The product of `shared/avx2_team_matmul.rs` over `u16` weights (each
//! bfloat16 widened to f32 in registers as it is loaded), its weight rows cut into `THREADS`
//! shares that the persistent team of `shared/team.rs` computes, the calling thread taking the
//! first.

use std::ops::Range;

use super::shared::avx2_team_matmul::Product;
use super::shared::team::{self, Job};

/// Computes `out[r, n] = Σₖ x[r, k] · f32(w[n, k])` for `rows` rows.
///
/// `x`: `[rows, K]`, `w`: `[N, K]` bfloat16 bits, `out`: `[rows, N]`, all row-major.
#[inline]
pub fn matmul_bf16<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[u16], rows: usize) {
    let product = Product::new::<N, K>(out, x, w, rows);
    // SAFETY: the generated crate checks at start-up that the CPU has AVX2 and FMA;
    // `Product::new` checked the slices, and `out` stays borrowed until every share is done.
    unsafe { team::run(Shared(product)) }
}

/// A product of this implementation, as the crate's team shares it.
#[derive(Clone, Copy)]
pub(crate) struct Shared(Product<u16>);

impl Job for Shared {
    fn n(&self) -> usize {
        self.0.n
    }

    fn work(&self) -> usize {
        self.0.rows * self.0.n * self.0.k
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract, which `run` keeps; `matmul_bf16` enters only on a CPU
        // with AVX2 and FMA.
        unsafe { self.0.columns(cols) }
    }
}
