//! Matrix product `out = x · wᵀ` by the `gemm` crate (version 0.19, the GEMM that candle runs
//! on CPU): it packs both operands into cache-blocked panels and runs the microkernel that it
//! picks at run time for this CPU, splitting the work over `THREADS` rayon threads. It stands
//! in the registry so that the benchmarking authority measures monogen's kernels against the
//! ecosystem's at each workload's shapes.

use gemm::{Parallelism, gemm};

/// Computes `out[r, n] = Σₖ x[r, k] · w[n, k]` for `rows` rows.
///
/// `x`: `[rows, K]`, `w`: `[N, K]`, `out`: `[rows, N]`, all row-major.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[f32], rows: usize) {
    assert!(x.len() >= rows * K, "matmul: x is shorter than {rows} rows of {K}");
    assert!(w.len() >= N * K, "matmul: w is shorter than {N} rows of {K}");
    assert!(out.len() >= rows * N, "matmul: out is shorter than {rows} rows of {N}");
    if rows == 0 {
        return;
    }
    let parallelism = if crate::THREADS > 1 { Parallelism::Rayon(crate::THREADS) } else { Parallelism::None };
    // out (rows × N, row-major) = x (rows × K, row-major) · wᵀ, where wᵀ is K × N with its
    // column n the row n of w: column stride K, row stride 1. Nothing of `out` is read
    // (read_dst false), and the product is scaled by 1.
    // SAFETY: the pointers cover rows × N, rows × K and N × K values (checked above), and
    // `out` does not overlap the inputs (a unique borrow).
    unsafe {
        gemm(
            rows,
            N,
            K,
            out.as_mut_ptr(),
            1,
            N as isize,
            false,
            x.as_ptr(),
            1,
            K as isize,
            w.as_ptr(),
            K as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        )
    }
}
