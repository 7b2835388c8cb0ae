//! The AVX2 + FMA matrix product `out = x · wᵀ` that the team's AVX2 implementations share,
//! over f32 weights or bfloat16 ones (`u16` bits, widened to f32 in registers as they are
//! loaded: a zero extension to 32 bits and a shift left by 16, `vpmovzxwd` and `vpslld`).
//!
//! A call's weight rows are its columns: the team of `team.rs` cuts them into `THREADS`
//! shares, so that each thread streams its part of the weights, which a decode step is bound
//! by. A share is taken in blocks of about 16 KiB of weights, over which every activation row
//! passes while the block is in L1. Within a block the output is cut into tiles of 4
//! activation rows × 2 weight rows, so that each loaded weight vector serves 4 fused
//! multiply-adds; rows left over (fewer than 4, and a decode step's single row) take tiles of
//! 1 × 8, except over bfloat16 weights of at least `ROW_DOT_K` columns, which a single row
//! reads one weight row at a time, front to back, and a decode step's single row two at a
//! time (`rows_dot`), below. A tile's 8 accumulators of 8 lanes end in one transposed
//! horizontal-add tree (`sum8`). K that is not a multiple of 8 ends with a masked load of the
//! activations and a zero-padded copy of the weights' last values. A prefill's many rows take
//! the packed blocks of `shared/avx2_repack.rs` instead, where the implementation asks for them.
//!
//! Over such bfloat16 weights a decode step's single row reads its share as two streams, the
//! share's first half and its second half side by side (`Product::decode`), one weight row
//! from each half at a time. On an AMD EPYC (Zen 3, 2 threads, 256 MiB in huge pages, each
//! thread reading its half) a plain read ran at 33-36 GB/s as one stream per thread, 35-44 as
//! two and 36-46 as four, medians of 9 rounds in a program apart; a bfloat16 dot product row by
//! row at 30-33, the same over two streams at 35-40, and over two adjacent rows at once at
//! 20-25. Each stream is one the hardware's prefetchers follow, and two keep more of memory's
//! lines on their way.
//!
//! An int8 crate includes this module only for the `Weight` and `Product` that `avx2_repack.rs`
//! names, and calls none of its products, hence `allow(dead_code)`.
#![allow(dead_code, clippy::missing_safety_doc)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx2_math::{LANES, hsum, lane_mask, sum8};

/// Bytes of weights per block that the activation rows pass over while it is in L1.
const BLOCK_BYTES: usize = 16 * 1024;

/// From this many columns on, a decode step's single row over bfloat16 weights reads them one
/// weight row at a time (`rows_dot`); shorter rows take the tiles of 8 weight rows, whose
/// multiply-adds run 8 chains side by side instead of `rows_dot`'s 4 over a few steps.
const ROW_DOT_K: usize = 512;

/// A weight type: how 8 of them become 8 f32 lanes.
pub trait Weight: Copy + Default {
    /// The 8 weights at `p` as f32 lanes.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA, and 8 weights are readable at `p`.
    unsafe fn load(p: *const Self) -> __m256;
}

impl Weight for f32 {
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load(p: *const f32) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_loadu_ps(p) }
    }
}

/// bfloat16 bits: the high halves of f32s.
impl Weight for u16 {
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load(p: *const u16) -> __m256 {
        // SAFETY: the caller's contract.
        let bits = unsafe { _mm_loadu_si128(p.cast()) };
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bits)))
    }
}

/// The operands of one call: `out` is `[rows, n]`, `x` `[rows, k]`, `w` `[n, k]`.
#[derive(Clone, Copy)]
pub struct Product<W> {
    pub(super) out: *mut f32,
    pub(super) x: *const f32,
    pub(super) w: *const W,
    pub rows: usize,
    pub n: usize,
    pub k: usize,
}

// SAFETY: the team's threads write disjoint columns of `out` and only read `x` and `w`.
unsafe impl<W> Send for Product<W> {}

impl<W: Weight> Product<W> {
    /// The product `out[r, n] = Σₖ x[r, k] · w[n, k]` of `rows` rows: `x` `[rows, K]`, `w`
    /// `[N, K]`, `out` `[rows, N]`. Panics where a slice is shorter.
    pub fn new<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[W], rows: usize) -> Self {
        assert!(x.len() >= rows * K, "matmul: x is shorter than {rows} rows of {K}");
        assert!(w.len() >= N * K, "matmul: w is shorter than {N} rows of {K}");
        assert!(out.len() >= rows * N, "matmul: out is shorter than {rows} rows of {N}");
        Product { out: out.as_mut_ptr(), x: x.as_ptr(), w: w.as_ptr(), rows, n: N, k: K }
    }

    /// Computes the columns `cols` of every row of `out`.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA, the pointers hold the operands' sizes, and no other thread
    /// writes these columns meanwhile.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn columns(&self, cols: Range<usize>) {
        if self.rows == 1 && size_of::<W>() == 2 && self.k >= ROW_DOT_K {
            // SAFETY: the caller's contract.
            unsafe { self.decode(cols) };
            return;
        }
        // A multiple of 8, which both tile widths divide: no column of a block is left to
        // the single-column tiles, whose one chain of multiply-adds waits on each in turn.
        let block = (BLOCK_BYTES / (2 * self.k)).max(1).next_multiple_of(8);
        let mut n0 = cols.start;
        while n0 < cols.end {
            let n1 = (n0 + block).min(cols.end);
            let mut r = 0;
            while r + 4 <= self.rows {
                // SAFETY: rows r..r + 4 and weight rows n0..n1 lie inside the operands.
                unsafe { self.row_block::<4, 2>(r, n0..n1) };
                r += 4;
            }
            while r < self.rows {
                if size_of::<W>() == 2 && self.k >= ROW_DOT_K {
                    for n in n0..n1 {
                        // SAFETY: as above, for row r and weight row n.
                        unsafe { self.rows_dot(r, [n]) };
                    }
                } else {
                    // SAFETY: as above, for row r.
                    unsafe { self.row_block::<1, 8>(r, n0..n1) };
                }
                r += 1;
            }
            n0 = n1;
        }
    }

    /// Computes the columns `cols` of a single activation row (a decode step) over bfloat16
    /// weights of at least `ROW_DOT_K` columns, as two streams: each weight row of the first
    /// half of `cols` together with the row as far on in the second half, and the last row
    /// alone when their number is odd (`rows_dot`).
    ///
    /// Against one stream, measured on an AMD EPYC (Zen 3, 2 threads), the decode of `cargo
    /// bench -p monogen-kernel-tests --bench weights` as a share of the read in the same run,
    /// one stream then two, in alternating runs: at stories110M's shapes 0.87, 0.82, 0.93, 0.81
    /// against 0.99, 1.06, 0.94, 1.04; at TinyLlama's (`-- --tinyllama`) 0.84, 0.89 against
    /// 0.99, 0.98. `bench/ab.py --rounds 12 --max-tokens 64`, decode per round: the stories110M
    /// bf16 crate 1.140x [0.886-1.253] as fast.
    ///
    /// f32 weights keep the tiles of 8 weight rows, which read 8 streams already: tiles of 4
    /// rows from each half measured 0.97-1.07 of the read against 0.93-0.99 at stories110M's
    /// shapes, and the stories110M f32 crate decoded 1.056x as fast, but the TinyLlama f32 crate
    /// 0.903x [0.835-1.098] (6 rounds).
    ///
    /// # Safety
    ///
    /// As for [`Product::columns`], with one activation row.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn decode(&self, cols: Range<usize>) {
        let half = cols.len() / 2;
        for n in cols.start..cols.start + half {
            // SAFETY: the caller's contract; weight rows n and n + half lie in `cols`.
            unsafe { self.rows_dot(0, [n, n + half]) };
        }
        if cols.len() % 2 == 1 {
            // SAFETY: as above, for the last weight row of `cols`.
            unsafe { self.rows_dot(0, [cols.end - 1]) };
        }
    }

    /// Writes `out[r, n]` for each weight row `n` of `ns`: the dot products of activation row
    /// `r` with those weight rows, read front to back side by side, each line asked for into
    /// L1 `AHEAD` bytes before it is reached (past a row's end into the next one). A row's sums
    /// are the same, term for term, whichever rows it is read beside. Over bfloat16 weights:
    /// two rows for a decode step ([`Product::decode`]), one for the row of a share's odd end
    /// and for a few rows' leftover row.
    ///
    /// A share's weight rows lie one after the other, so one row at a time reads it as one
    /// stream from start to end. On an AMD EPYC (Zen 3, 2 threads) that streamed stories110M's
    /// bf16 matrices 1.015-1.097x as fast as the tiles of 8 weight rows with the next tile
    /// asked for into L2 (medians of paired rounds of `cargo bench -p monogen-kernel-tests
    /// --bench weights`, 5 runs), and the stories110M bf16 crate decoded 1.144x as fast
    /// (`bench/ab.py --rounds 10`). 512 and 1536 bytes ahead were no better than 1024, two
    /// adjacent rows at a time was 0.7-0.9x, and f32 weights lose with it (0.85x in the bench,
    /// 0.945x in the stories110M f32 crate), so they keep the tiles. So do rows shorter than
    /// `ROW_DOT_K`: the stories15M bf16 crate (K = 288 but for its down projections) decoded at
    /// 0.76-0.99x with one row at a time on every matrix (`bench/ab.py`, 10-50 rounds).
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA, row `r` lies inside `x` and the weight rows `ns` inside `w`,
    /// and no other thread writes `out[r, n]` for them meanwhile.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows_dot<const S: usize>(&self, r: usize, ns: [usize; S]) {
        const AHEAD: usize = 1024;
        const STEP: usize = 4 * LANES;
        let k = self.k;
        // SAFETY: the caller's contract.
        let x = unsafe { self.x.add(r * k) };
        let ws = ns.map(|n| self.w.wrapping_add(n * k));
        let mut acc = [[_mm256_setzero_ps(); 4]; S];
        let mut at = 0;
        while at + STEP <= k {
            for w in ws {
                // A prefetch never faults, even past the end of the weights.
                _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(at).cast::<u8>().wrapping_add(AHEAD).cast());
            }
            for i in 0..4 {
                let d = at + i * LANES;
                // SAFETY: 8 activations at `d` < k lie inside the row.
                let xv = unsafe { _mm256_loadu_ps(x.add(d)) };
                for (acc, w) in acc.iter_mut().zip(ws) {
                    // SAFETY: as above, 8 weights of each weight row.
                    acc[i] = _mm256_fmadd_ps(xv, unsafe { W::load(w.add(d)) }, acc[i]);
                }
            }
            at += STEP;
        }
        while at < k {
            let len = LANES.min(k - at);
            // SAFETY: the masked load reads only the row's `len` activations from `at`.
            let xv = unsafe { _mm256_maskload_ps(x.add(at), lane_mask(len)) };
            for (acc, w) in acc.iter_mut().zip(ws) {
                let mut last = [W::default(); LANES];
                // SAFETY: the weight row's `len` weights from `at`.
                last[..len].copy_from_slice(unsafe { std::slice::from_raw_parts(w.add(at), len) });
                // SAFETY: `last` is 8 readable values.
                acc[0] = _mm256_fmadd_ps(xv, unsafe { W::load(last.as_ptr()) }, acc[0]);
            }
            at += len;
        }
        for (acc, n) in acc.iter().zip(ns) {
            let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            // SAFETY: `out[r, n]` lies inside `out`, and the caller's contract.
            unsafe { *self.out.add(r * self.n + n) = hsum(sum) };
        }
    }

    /// Columns `cols` of rows `r..r + R`: `C` columns per tile, then the rest one at a time.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn row_block<const R: usize, const C: usize>(&self, r: usize, cols: Range<usize>) {
        let mut n = cols.start;
        while n + C <= cols.end {
            // SAFETY: the caller's contract.
            unsafe { self.tile::<R, C>(r, n) };
            n += C;
        }
        while n < cols.end {
            // SAFETY: the caller's contract.
            unsafe { self.tile::<R, 1>(r, n) };
            n += 1;
        }
    }

    /// Writes the `R × C` block of `out` at row `r`, column `n`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const R: usize, const C: usize>(&self, r: usize, n: usize) {
        let k = self.k;
        let mut xs = [self.x; R];
        for (i, row) in xs.iter_mut().enumerate() {
            // SAFETY: row r + i is inside `x`.
            *row = unsafe { self.x.add((r + i) * k) };
        }
        let mut ws = [self.w; C];
        for (j, row) in ws.iter_mut().enumerate() {
            // SAFETY: weight row n + j is inside `w`.
            *row = unsafe { self.w.add((n + j) * k) };
        }
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let full = k - k % LANES;
        // A single row's tile of bfloat16 weights (a decode step) streams its C weight rows,
        // which lie one after the other: it asks for the next tile's as many bytes per step
        // into L2, so that memory keeps streaming across tiles instead of each row's few lines
        // (24 at K = 768) starting a stream afresh. On one thread of an AMD EPYC (Zen 3) that
        // took a decode over stories110M's matrices from 11.4 to 14.4 GB/s (`cargo bench -p
        // monogen-kernel-tests --bench weights`); f32 weights, whose rows are twice as long,
        // fell from 17.8 to 13.9 with it, and do without.
        let prefetch = R == 1 && size_of::<W>() == 2;
        let next = self.w.wrapping_add((n + C) * k).cast::<u8>();
        let per_step = C * LANES * size_of::<W>();
        let mut at = 0;
        while at < full {
            if prefetch {
                let ahead = next.wrapping_add(at / LANES * per_step);
                let mut line = 0;
                while line < per_step {
                    // A prefetch never faults, even past the end of the weights.
                    _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(line).cast());
                    line += 64;
                }
            }
            let mut wv = [_mm256_setzero_ps(); C];
            for (v, &row) in wv.iter_mut().zip(&ws) {
                // SAFETY: 8 weights at `at` < `full` ≤ k lie inside the row.
                *v = unsafe { W::load(row.add(at)) };
            }
            for (acc_row, &row) in acc.iter_mut().zip(&xs) {
                // SAFETY: 8 activations at `at` lie inside the row.
                let xv = unsafe { _mm256_loadu_ps(row.add(at)) };
                for (a, &wl) in acc_row.iter_mut().zip(&wv) {
                    *a = _mm256_fmadd_ps(xv, wl, *a);
                }
            }
            at += LANES;
        }
        if full < k {
            let tail = k - full;
            let mut wv = [_mm256_setzero_ps(); C];
            for (v, &row) in wv.iter_mut().zip(&ws) {
                let mut last = [W::default(); LANES];
                // SAFETY: the row's last `tail` weights.
                last[..tail].copy_from_slice(unsafe { std::slice::from_raw_parts(row.add(full), tail) });
                // SAFETY: `last` is 8 readable values.
                *v = unsafe { W::load(last.as_ptr()) };
            }
            let mask = lane_mask(tail);
            for (acc_row, &row) in acc.iter_mut().zip(&xs) {
                // SAFETY: the masked load reads only the row's last `tail` activations.
                let xv = unsafe { _mm256_maskload_ps(row.add(full), mask) };
                for (a, &wl) in acc_row.iter_mut().zip(&wv) {
                    *a = _mm256_fmadd_ps(xv, wl, *a);
                }
            }
        }
        let out_row = |i: usize| {
            // SAFETY: row r + i, columns n..n + C of `out`, which this share owns.
            unsafe { std::slice::from_raw_parts_mut(self.out.add((r + i) * self.n + n), C) }
        };
        if R * C == LANES {
            let mut flat = [_mm256_setzero_ps(); LANES];
            for (v, &a) in flat.iter_mut().zip(acc.as_flattened()) {
                *v = a;
            }
            let mut sums = [0.0f32; LANES];
            // SAFETY: `sums` is 8 writable floats.
            unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), sum8(flat)) };
            for (i, row_sums) in sums.chunks_exact(C).enumerate() {
                out_row(i).copy_from_slice(row_sums);
            }
        } else {
            for (i, acc_row) in acc.iter().enumerate() {
                let dst = out_row(i);
                for (d, &lanes) in dst.iter_mut().zip(acc_row) {
                    *d = hsum(lanes);
                }
            }
        }
    }
}
