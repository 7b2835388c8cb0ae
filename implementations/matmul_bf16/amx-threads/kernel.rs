//! Matrix product `out = x · wᵀ` with bfloat16 weights on `THREADS` threads: the dot tiles of
//! `shared/avx512_matmul.rs` over `u16` weights for a few rows (a decode step), and from
//! `AMX_ROWS` rows on (a prefill) the AMX tiles of `shared/amx_bf16.rs`, each thread packing its
//! own blocks of weight rows into the tiles' layout as it reaches them. The activations are
//! rewritten once, by the calling thread; the weight rows are cut into `THREADS` equal shares
//! that the persistent team of `shared/team.rs` computes, the calling thread taking the first.

use std::ops::Range;

use super::shared::amx_bf16::{Amx, GRANULE};
use super::shared::avx512_matmul::Product;
use super::shared::team::{self, Job};

/// Computes `out[r, n] = Σₖ x[r, k] · f32(w[n, k])` for `rows` rows.
///
/// `x`: `[rows, K]`, `w`: `[N, K]` bfloat16 bits, `out`: `[rows, N]`, all row-major.
#[inline]
pub fn matmul_bf16<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[u16], rows: usize) {
    let product = Product::new::<N, K>(out, x, w, rows);
    // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F, AVX-512BW,
    // AMX-TILE and AMX-BF16, and asks the kernel for the tiles' state; the product's pointers
    // come from slices whose lengths `Product::new` checked, and `out` and the rewritten
    // activations stay alive until every share is done.
    unsafe { Amx::prepared(product, |product| team::run(Shared(*product))) }
}

/// A product of this implementation, as the crate's team shares it.
#[derive(Clone, Copy)]
pub(crate) struct Shared(Amx);

impl Job for Shared {
    fn n(&self) -> usize {
        self.0.product.n
    }

    fn granule(&self) -> usize {
        GRANULE
    }

    fn work(&self) -> usize {
        self.0.product.rows * self.0.product.n * self.0.product.k
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract, which `run` keeps.
        unsafe { self.0.columns(cols) }
    }
}
