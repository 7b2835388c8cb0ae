//! Matrix product `out = x · wᵀ` with blockwise int8 weights and AVX-512 VNNI on `THREADS`
//! threads: the product of `shared/avx512_q8.rs`, its activations quantized once by the
//! calling thread, and its weight rows cut into `THREADS` equal shares that the persistent
//! team of `shared/team.rs` computes, the calling thread taking the first.

use std::ops::Range;

use super::shared::avx512_q8::Q8Product;
use super::shared::team::{self, Job};

/// Computes `out[r, n] = Σ_b dx[r, b] · dw[n, b] · Σ_{k in b} qx[r, k] · w[n, k]` for `rows`
/// rows.
///
/// `x`: `[rows, K]`, `w`: `[N, K]` int8, `scales`: `[N, ⌈K/32⌉]`, `out`: `[rows, N]`, all
/// row-major.
#[inline]
pub fn matmul<const N: usize, const K: usize>(
    out: &mut [f32],
    x: &[f32],
    w: &[i8],
    scales: &[f32],
    rows: usize,
) {
    // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F, AVX-512BW and
    // AVX-512 VNNI, and the product's pointers come from slices whose lengths
    // `Q8Product::new` checked; `out` and the quantized activations stay alive until every
    // share is done.
    unsafe {
        Q8Product::new::<N, K>(out, x, w, scales, rows).prepared(|product| team::run(Shared(*product)))
    }
}

/// A product of this implementation, as the crate's team shares it.
#[derive(Clone, Copy)]
pub(crate) struct Shared(Q8Product);

impl Job for Shared {
    fn n(&self) -> usize {
        self.0.n
    }

    fn work(&self) -> usize {
        self.0.rows * self.0.n * self.0.k
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract, which `run` keeps.
        unsafe { self.0.columns(cols) }
    }
}
