//! The AVX-512 matrix product `out = x · wᵀ` with bfloat16 weights and f32 activations, over
//! weights packed once at load, computed over a range of weight rows (output columns) so that
//! threads can share a call.
//!
//! [`pack`] rewrites the `[n, k]` weights in blocks of [`BLOCK`] weight rows (the last block
//! holds the rows left, padded with zero rows to a multiple of 32), each block stored column
//! by column: for every value of K, one vector of 64 bytes per 32 weight rows, whose 32-bit
//! lane `i` holds row `i` of the 32 in its low half and row `16 + i` in its high half. A
//! shift by 16 makes the low halves 16 exact f32 weights, and masking off the low halves the
//! other 16: two instructions widen 32 weights, already in the order of `out`, so a step
//! along K is one broadcast activation per row multiplied into 4 vectors of weights, with no
//! reduction across lanes at the end (the dot products of `shared/avx512_matmul.rs` end each
//! row with one) and no lane wasted whatever the number of rows.
//!
//! Each block is one sequential stream of memory. A decode step reads a thread's share as two
//! streams, the blocks of its first half each beside the block as far on in its second half
//! ([`Packed::streams`]), fetching [`AHEAD_BYTES`] ahead of the line it reads in each. Up to
//! [`GROUP`] activation rows share one pass over a block (24 accumulators); more rows go in
//! as few groups as possible, of equal sizes, each a pass over the whole block: the first
//! streams it from memory, the others read it again from L2.
//!
//! # Safety
//!
//! [`pack`] and [`Packed::columns`] may be called only on a CPU with AVX-512F;
//! [`Packed::columns`] with pointers that hold `[rows, k]` activations, the packed `[n, k]`
//! weights and `[rows, n]` outputs, never twice at once on overlapping column ranges of the
//! same `out`, and on column ranges that start at a multiple of [`BLOCK`].
#![allow(dead_code, clippy::missing_safety_doc, clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx512_transpose::transpose;
use super::job::{Extent, Job};

/// The f32 lanes of an AVX-512 register.
const LANES: usize = 16;

/// Weight rows in one vector of a step: 16 lanes of two bfloat16 each.
const PAIRS: usize = 2 * LANES;

/// Weight rows (output columns) per block: two vectors per step along K.
pub const BLOCK: usize = 2 * PAIRS;

/// Most activation rows that share one pass over a block: 6 rows × 4 vectors of sums, the 4
/// widened weight vectors and the broadcast value fill 29 of the 32 registers.
const GROUP: usize = 6;

/// How far ahead of the line a pass reads it fetches: 6 KiB, 48 steps of a whole block.
const AHEAD_BYTES: usize = 6 << 10;

/// Values the packed form of `[n, k]` weights holds: `n` rounded up to a multiple of 32, by
/// `k`.
pub const fn packed_len(n: usize, k: usize) -> usize {
    n.next_multiple_of(PAIRS) * k
}

/// The `[n, k]` row-major bfloat16 weights `w` (as nn.Linear stores them) in the packed layout
/// that [`Packed::columns`] reads (see the module's docs). The product reads the result fastest
/// from an address that is a multiple of 64 bytes, which the returned `Vec` does not promise.
///
/// # Safety
///
/// Only on a CPU with AVX-512F.
#[target_feature(enable = "avx512f")]
pub fn pack(w: &[u16], n: usize, k: usize) -> Vec<u16> {
    assert!(w.len() >= n * k, "pack: w is shorter than {n} rows of {k}");
    let mut packed = vec![0u16; packed_len(n, k)];
    for j0 in (0..n).step_by(BLOCK) {
        let width = (n - j0).min(BLOCK).next_multiple_of(PAIRS);
        // The blocks before are whole: this one starts `j0 · k` values in.
        let block = &mut packed[j0 * k..(j0 + width) * k];
        for v in 0..width / PAIRS {
            let first = j0 + v * PAIRS;
            for k0 in (0..k).step_by(LANES) {
                let len = (k - k0).min(LANES);
                // Lane `c` of vector `i`: value `k0 + c` of rows `first + i` (low half) and
                // `first + 16 + i` (high half).
                let rows: [__m512; LANES] = std::array::from_fn(|i| {
                    let low = widened(w, n, k, first + i, k0, len);
                    let high = widened(w, n, k, first + LANES + i, k0, len);
                    _mm512_castsi512_ps(_mm512_or_si512(low, _mm512_slli_epi32::<16>(high)))
                });
                for (c, column) in transpose(rows).into_iter().enumerate().take(len) {
                    let at = (k0 + c) * width + v * PAIRS;
                    // SAFETY: `block` holds `k` steps of `width` values, and vector `v` of a
                    // step is its values `v · 32..v · 32 + 32`.
                    unsafe { _mm512_storeu_ps(block.as_mut_ptr().add(at).cast(), column) };
                }
            }
        }
    }
    packed
}

/// Values `k0..k0 + len` of weight row `row` (zeros past `n` rows and past the `len` values),
/// each in the low half of a 32-bit lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn widened(w: &[u16], n: usize, k: usize, row: usize, k0: usize, len: usize) -> __m512i {
    if row >= n {
        return _mm512_setzero_si512();
    }
    let values = &w[row * k + k0..row * k + k0 + len];
    if len == LANES {
        // SAFETY: `values` holds 16 values of 2 bytes.
        return _mm512_cvtepu16_epi32(unsafe { _mm256_loadu_si256(values.as_ptr().cast()) });
    }
    let mut padded = [0u16; LANES];
    padded[..len].copy_from_slice(values);
    // SAFETY: `padded` holds 16 values of 2 bytes.
    _mm512_cvtepu16_epi32(unsafe { _mm256_loadu_si256(padded.as_ptr().cast()) })
}

/// One call's operands: `out[r, j] = Σₖ x[r, k] · f32(w[j, k])` for `r < rows`, `j < n`,
/// with `w` packed.
#[derive(Clone, Copy)]
pub struct Packed {
    pub out: *mut f32,
    pub x: *const f32,
    pub w: *const u16,
    pub rows: usize,
    pub n: usize,
    pub k: usize,
}

// SAFETY: a product is only pointers to buffers that its caller keeps alive and shares out
// by disjoint column ranges until every thread is done (see the module's safety section).
unsafe impl Send for Packed {}
unsafe impl Sync for Packed {}

impl Packed {
    /// The product of `rows` rows over packed `[N, K]` weights, with the slices' lengths
    /// checked.
    #[inline]
    pub fn new<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[u16], rows: usize) -> Packed {
        assert!(x.len() >= rows * K, "matmul: x is shorter than {rows} rows of {K}");
        assert!(w.len() >= packed_len(N, K), "matmul: w is shorter than {N} packed rows of {K}");
        assert!(out.len() >= rows * N, "matmul: out is shorter than {rows} rows of {N}");
        Packed { out: out.as_mut_ptr(), x: x.as_ptr(), w: w.as_ptr(), rows, n: N, k: K }
    }

    /// Computes the columns `cols` (weight rows) of every row of `out`; `cols.start` is a
    /// multiple of [`BLOCK`] unless `cols` is empty.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn columns(&self, cols: Range<usize>) {
        debug_assert!(cols.is_empty() || cols.start.is_multiple_of(BLOCK), "a share starts at a block");
        let mut cols = cols;
        if self.rows == 1 {
            // A decode step: the share's whole blocks in two halves, side by side; an odd one and
            // a last, narrower block below.
            let half = (cols.end - cols.start) / BLOCK / 2;
            for b in 0..half {
                let j = cols.start + b * BLOCK;
                // SAFETY: blocks `j` and `j + half · BLOCK` are whole and in range.
                unsafe { self.streams([j, j + half * BLOCK]) };
            }
            cols.start += 2 * half * BLOCK;
        }
        for j in (cols.start..cols.end).step_by(BLOCK) {
            // SAFETY (both arms): block `j` is in range (the caller's contract).
            if cols.end - j > PAIRS { unsafe { self.block::<2>(j) } } else { unsafe { self.block::<1>(j) } }
        }
    }

    /// Columns `j..j + 32·V` (those below `n`) of every row, in groups of at most [`GROUP`]
    /// rows of equal sizes, the first group fetching the block ahead for the others.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn block<const V: usize>(&self, j: usize) {
        let groups = self.rows.div_ceil(GROUP);
        let mut r = 0;
        for g in 0..groups {
            let rows = (self.rows - r).div_ceil(groups - g);
            // SAFETY (every arm): the block and the rows are in range.
            match rows {
                6 => unsafe { self.tile::<6, V>(r, j, g == 0) },
                5 => unsafe { self.tile::<5, V>(r, j, g == 0) },
                4 => unsafe { self.tile::<4, V>(r, j, g == 0) },
                3 => unsafe { self.tile::<3, V>(r, j, g == 0) },
                2 => unsafe { self.tile::<2, V>(r, j, g == 0) },
                _ => unsafe { self.tile::<1, V>(r, j, g == 0) },
            }
            r += rows;
        }
    }

    /// Columns `j..j + 64` of a single row for each whole block `j` of `js`, the blocks read side
    /// by side, each fetched [`AHEAD_BYTES`] ahead: `S` streams of memory for one thread. The sums
    /// are those of [`Packed::tile`] for one row, term for term.
    ///
    /// Measured on an Intel Xeon with AMX (2 threads, `cargo bench -p monogen-kernel-tests
    /// --bench weights -- --tinyllama`, decode at TinyLlama's shapes as a share of the read in
    /// the same run): two streams 0.93 against one stream's 0.74; that CPU's core keeps fewer
    /// lines in flight for one stream than the memory needs.
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512F, every block of `js` is whole (`BLOCK` columns below `n`) and in
    /// this thread's columns, and `x` holds a row of `k` values.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn streams<const S: usize>(&self, js: [usize; S]) {
        let k = self.k;
        let ahead = AHEAD_BYTES / 2;
        // SAFETY: the blocks before each `j` are whole, so block `j` starts `j · k` values into
        // the packed weights and holds `k` steps of `BLOCK` values.
        let blocks = js.map(|j| unsafe { self.w.add(j * k) });
        let high = _mm512_set1_epi32(0xffff_0000_u32 as i32);
        // acc[block][vector][half]
        let mut acc = [[[_mm512_setzero_ps(); 2]; 2]; S];
        for at in 0..k {
            // SAFETY: row 0 of x holds `k` values.
            let xv = _mm512_set1_ps(unsafe { *self.x.add(at) });
            for (acc, block) in acc.iter_mut().zip(blocks) {
                // SAFETY: step `at` of the block.
                let step = unsafe { block.add(at * BLOCK) };
                for (v, acc) in acc.iter_mut().enumerate() {
                    // A prefetch never faults, even past the end of the weights.
                    _mm_prefetch::<_MM_HINT_T0>(step.wrapping_add(ahead + v * PAIRS).cast());
                    // SAFETY: vector `v` of the step.
                    let pairs = unsafe { _mm512_loadu_si512(step.add(v * PAIRS).cast()) };
                    let low = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(pairs));
                    let high = _mm512_castsi512_ps(_mm512_and_si512(pairs, high));
                    acc[0] = _mm512_fmadd_ps(xv, low, acc[0]);
                    acc[1] = _mm512_fmadd_ps(xv, high, acc[1]);
                }
            }
        }
        for (acc, j) in acc.iter().zip(js) {
            // SAFETY: the caller's contract.
            unsafe { self.store(0, j, acc) };
        }
    }

    /// The `R × 32·V` block of `out` at row `r`, column `j`. With `prefetch`, every step also
    /// asks for its lines [`AHEAD_BYTES`] further on.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile<const R: usize, const V: usize>(&self, r: usize, j: usize, prefetch: bool) {
        let k = self.k;
        let width = V * PAIRS;
        let ahead = AHEAD_BYTES / 2;
        // SAFETY (every pointer below): the blocks before `j` are whole, so block `j` starts
        // `j · k` values into the packed weights and holds `k` steps of `width` values; rows
        // `r..r + R` of x hold `k` values each.
        let block = unsafe { self.w.add(j * k) };
        let xs: [*const f32; R] = std::array::from_fn(|i| unsafe { self.x.add((r + i) * k) });
        let high = _mm512_set1_epi32(0xffff_0000_u32 as i32);
        // acc[row][vector][half]
        let mut acc = [[[_mm512_setzero_ps(); 2]; V]; R];
        for at in 0..k {
            let step = unsafe { block.add(at * width) };
            let mut wv = [[_mm512_setzero_ps(); 2]; V];
            for v in 0..V {
                if prefetch {
                    // A prefetch never faults, even past the end of the weights.
                    _mm_prefetch::<_MM_HINT_T0>(step.wrapping_add(ahead + v * PAIRS).cast());
                }
                let pairs = unsafe { _mm512_loadu_si512(step.add(v * PAIRS).cast()) };
                wv[v] = [
                    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(pairs)),
                    _mm512_castsi512_ps(_mm512_and_si512(pairs, high)),
                ];
            }
            for i in 0..R {
                let xv = _mm512_set1_ps(unsafe { *xs[i].add(at) });
                for v in 0..V {
                    for h in 0..2 {
                        acc[i][v][h] = _mm512_fmadd_ps(xv, wv[v][h], acc[i][v][h]);
                    }
                }
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            // SAFETY: the caller's contract.
            unsafe { self.store(r + i, j, acc) };
        }
    }

    /// Writes the sums `acc[vector][half]` of row `r`, columns `j..j + 32·V`, those below `n`.
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512F, and row `r`, columns `j..j + 32·V` of `out` (those below `n`) are
    /// in range and in this thread's columns.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn store<const V: usize>(&self, r: usize, j: usize, acc: &[[__m512; 2]; V]) {
        for (v, acc) in acc.iter().enumerate() {
            for (h, &sums) in acc.iter().enumerate() {
                let col = j + v * PAIRS + h * LANES;
                let valid = self.n.saturating_sub(col).min(LANES);
                if valid == 0 {
                    continue;
                }
                let mask: __mmask16 = if valid == LANES { u16::MAX } else { (1u16 << valid) - 1 };
                // SAFETY: row `r`, columns `col..col + valid` of `out` are in range and in this
                // thread's columns (the caller's contract); the lanes past `valid` are masked off.
                unsafe { _mm512_mask_storeu_ps(self.out.add(r * self.n + col), mask, sums) };
            }
        }
    }
}

/// A product as a team shares it, by blocks of [`BLOCK`] weight rows.
impl Job for Packed {
    fn extent(&self) -> Extent {
        Extent::product(self.rows, self.n, self.k, BLOCK)
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract, which `team::run` keeps.
        unsafe { self.columns(cols) }
    }
}
