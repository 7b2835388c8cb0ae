//! Matrix product `out = x · wᵀ` with AVX2 and FMA on `THREADS` threads.
//!
//! The activation rows are cut into `THREADS` runs of nearly equal length (even lengths, so
//! that every thread keeps the two-row tiles), and each run is computed by the weight-blocked,
//! register-blocked product of `shared/avx2_matmul.rs`: the caller's thread takes the last run,
//! scoped threads the others. A call with fewer rows than threads (a decode step) or less than
//! `MIN_PARALLEL_MACS` multiply-adds runs on the calling thread, where starting a thread
//! would cost more than it saves.

use super::shared::avx2_matmul::matmul_avx2;

/// Multiply-adds below which a call stays on one thread.
const MIN_PARALLEL_MACS: usize = 1 << 18;

/// Computes `out[r, n] = Σₖ x[r, k] · w[n, k]` for `rows` rows.
///
/// `x`: `[rows, K]`, `w`: `[N, K]`, `out`: `[rows, N]`, all row-major.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[f32], rows: usize) {
    assert!(x.len() >= rows * K, "matmul: x is shorter than {rows} rows of {K}");
    assert!(w.len() >= N * K, "matmul: w is shorter than {N} rows of {K}");
    assert!(out.len() >= rows * N, "matmul: out is shorter than {rows} rows of {N}");
    let threads = crate::THREADS;
    if threads < 2 || rows < 2 * threads || rows * N * K < MIN_PARALLEL_MACS {
        // SAFETY: the generated crate checks at start-up that the CPU has AVX2 and FMA.
        unsafe { matmul_avx2::<N, K>(out, x, w, rows) };
        return;
    }
    // THREADS − 1 runs of an even number of rows on new threads, the rest on this one.
    let run = (rows / threads).next_multiple_of(2);
    std::thread::scope(|scope| {
        let mut out = &mut out[..rows * N];
        let mut x = &x[..rows * K];
        let mut left = rows;
        for _ in 1..threads {
            if left <= run {
                break;
            }
            let (out_run, out_rest) = out.split_at_mut(run * N);
            let (x_run, x_rest) = x.split_at(run * K);
            // SAFETY: as above; the thread runs on the same CPU.
            scope.spawn(move || unsafe { matmul_avx2::<N, K>(out_run, x_run, w, run) });
            (out, x, left) = (out_rest, x_rest, left - run);
        }
        // SAFETY: as above.
        unsafe { matmul_avx2::<N, K>(out, x, w, left) };
    });
}
