//! The AVX2 matrix product `out = x · wᵀ` with bfloat16 weights and f32 activations, over weights
//! packed once at load, computed over a range of weight rows (output columns) so that threads
//! can share a call: the layout of `shared/avx512_bf16_packed.rs` at half the width.
//!
//! [`pack`] rewrites the `[n, k]` weights in blocks of [`BLOCK`] weight rows (the last block
//! holds the rows left, padded with zero rows to a multiple of 16), each block stored column
//! by column: for every value of K, one vector of 32 bytes per 16 weight rows, whose 32-bit
//! lane `i` holds row `i` of the 16 in its low half and row `8 + i` in its high half. A shift
//! by 16 makes the low halves 8 exact f32 weights, and masking off the low halves the other 8,
//! already in the order of `out`. A step along K is one cache line of a block: each activation
//! row's value, broadcast, multiplied into 4 vectors of weights, with no reduction across lanes
//! at the end and no lane wasted whatever the number of rows.
//!
//! Each block is one sequential stream of memory: a decode step streams a thread's share once,
//! front to back, and fetches [`AHEAD_BYTES`] ahead of the line it reads. Up to [`GROUP`]
//! activation rows share one pass over a block (8 accumulators of the 16 registers); more rows
//! go in as few groups as possible, of equal sizes, each a pass over the whole block: the first
//! streams it from memory, the others read it again from L2.
//!
//! # Safety
//!
//! [`pack`] and [`Packed::columns`] may be called only on a CPU with AVX2 and FMA;
//! [`Packed::columns`] with pointers that hold `[rows, k]` activations, the packed `[n, k]`
//! weights and `[rows, n]` outputs, never twice at once on overlapping column ranges of the
//! same `out`, and on column ranges that start at a multiple of [`BLOCK`].
#![allow(dead_code, clippy::missing_safety_doc, clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx2_transpose::transpose;
use super::job::{Extent, Job};

/// The f32 lanes of an AVX2 register.
const LANES: usize = 8;

/// Weight rows in one vector of a step: 8 lanes of two bfloat16 each.
const PAIRS: usize = 2 * LANES;

/// Weight rows (output columns) per block: two vectors, one cache line, per step along K.
pub const BLOCK: usize = 2 * PAIRS;

/// Most activation rows that share one pass over a block: 2 rows × 4 vectors of sums, the
/// widened weights and the broadcast values fill the 16 registers.
const GROUP: usize = 2;

/// How far ahead of the line a pass reads it fetches: 6 KiB, 96 steps of a whole block.
const AHEAD_BYTES: usize = 6 << 10;

/// Values the packed form of `[n, k]` weights holds: `n` rounded up to a multiple of 16, by
/// `k`.
pub const fn packed_len(n: usize, k: usize) -> usize {
    n.next_multiple_of(PAIRS) * k
}

/// The `[n, k]` row-major bfloat16 weights `w` (as nn.Linear stores them) in the packed layout
/// that [`Packed::columns`] reads (see the module's docs).
///
/// # Safety
///
/// Only on a CPU with AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
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
                // `first + 8 + i` (high half).
                let rows: [__m256; LANES] = std::array::from_fn(|i| {
                    let low = widened(w, n, k, first + i, k0, len);
                    let high = widened(w, n, k, first + LANES + i, k0, len);
                    _mm256_castsi256_ps(_mm256_or_si256(low, _mm256_slli_epi32::<16>(high)))
                });
                for (c, column) in transpose(rows).into_iter().enumerate().take(len) {
                    let at = (k0 + c) * width + v * PAIRS;
                    // SAFETY: `block` holds `k` steps of `width` values, and vector `v` of a
                    // step is its values `v · 16..v · 16 + 16`.
                    unsafe { _mm256_storeu_ps(block.as_mut_ptr().add(at).cast(), column) };
                }
            }
        }
    }
    packed
}

/// Values `k0..k0 + len` of weight row `row` (zeros past `n` rows and past the `len` values),
/// each in the low half of a 32-bit lane.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn widened(w: &[u16], n: usize, k: usize, row: usize, k0: usize, len: usize) -> __m256i {
    if row >= n {
        return _mm256_setzero_si256();
    }
    let values = &w[row * k + k0..row * k + k0 + len];
    if len == LANES {
        // SAFETY: `values` holds 8 values of 2 bytes.
        return _mm256_cvtepu16_epi32(unsafe { _mm_loadu_si128(values.as_ptr().cast()) });
    }
    let mut padded = [0u16; LANES];
    padded[..len].copy_from_slice(values);
    // SAFETY: `padded` holds 8 values of 2 bytes.
    _mm256_cvtepu16_epi32(unsafe { _mm_loadu_si128(padded.as_ptr().cast()) })
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
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn columns(&self, cols: Range<usize>) {
        debug_assert!(cols.is_empty() || cols.start.is_multiple_of(BLOCK), "a share starts at a block");
        for j in (cols.start..cols.end).step_by(BLOCK) {
            // SAFETY (both arms): block `j` is in range (the caller's contract).
            if cols.end - j > PAIRS { unsafe { self.block::<2>(j) } } else { unsafe { self.block::<1>(j) } }
        }
    }

    /// Columns `j..j + 16·V` (those below `n`) of every row, in groups of at most [`GROUP`]
    /// rows of equal sizes, the first group fetching the block ahead for the others.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block<const V: usize>(&self, j: usize) {
        let groups = self.rows.div_ceil(GROUP);
        let mut r = 0;
        for g in 0..groups {
            let rows = (self.rows - r).div_ceil(groups - g);
            // SAFETY (both arms): the block and the rows are in range.
            if rows == 2 {
                unsafe { self.tile::<2, V>(r, j, g == 0) }
            } else {
                unsafe { self.tile::<1, V>(r, j, g == 0) }
            }
            r += rows;
        }
    }

    /// The `R × 16·V` block of `out` at row `r`, column `j`. With `prefetch`, every step also
    /// asks for its line [`AHEAD_BYTES`] further on.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const R: usize, const V: usize>(&self, r: usize, j: usize, prefetch: bool) {
        let k = self.k;
        let width = V * PAIRS;
        let ahead = AHEAD_BYTES / 2;
        // SAFETY (every pointer below): the blocks before `j` are whole, so block `j` starts
        // `j · k` values into the packed weights and holds `k` steps of `width` values; rows
        // `r..r + R` of x hold `k` values each.
        let block = unsafe { self.w.add(j * k) };
        let xs: [*const f32; R] = std::array::from_fn(|i| unsafe { self.x.add((r + i) * k) });
        let high = _mm256_set1_epi32(0xffff_0000_u32 as i32);
        // acc[row][vector][half]
        let mut acc = [[[_mm256_setzero_ps(); 2]; V]; R];
        for at in 0..k {
            let step = unsafe { block.add(at * width) };
            if prefetch {
                // A prefetch never faults, even past the end of the weights.
                _mm_prefetch::<_MM_HINT_T0>(step.wrapping_add(ahead).cast());
            }
            let xv: [__m256; R] = std::array::from_fn(|i| _mm256_set1_ps(unsafe { *xs[i].add(at) }));
            for v in 0..V {
                let pairs = unsafe { _mm256_loadu_si256(step.add(v * PAIRS).cast()) };
                let wv = [
                    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(pairs)),
                    _mm256_castsi256_ps(_mm256_and_si256(pairs, high)),
                ];
                for i in 0..R {
                    for h in 0..2 {
                        acc[i][v][h] = _mm256_fmadd_ps(xv[i], wv[h], acc[i][v][h]);
                    }
                }
            }
        }
        for i in 0..R {
            for v in 0..V {
                for h in 0..2 {
                    let col = j + v * PAIRS + h * LANES;
                    let valid = self.n.saturating_sub(col).min(LANES);
                    if valid == 0 {
                        continue;
                    }
                    // SAFETY: row `r + i`, columns `col..col + valid` of `out` are in range and
                    // in this thread's columns.
                    let out = unsafe { self.out.add((r + i) * self.n + col) };
                    if valid == LANES {
                        unsafe { _mm256_storeu_ps(out, acc[i][v][h]) };
                    } else {
                        let mut lanes = [0f32; LANES];
                        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[i][v][h]) };
                        // SAFETY: as above, `valid` values.
                        unsafe { std::ptr::copy_nonoverlapping(lanes.as_ptr(), out, valid) };
                    }
                }
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
