//! The AVX-512 matrix product `out = x · wᵀ` over weights packed once at load, computed over a
//! range of weight rows (output columns) so that threads can share a call.
//!
//! [`pack`] rewrites the `[n, k]` weights in blocks of [`BLOCK`] weight rows (the last block
//! holds the `n % 48` rows left, padded with zero rows to a multiple of 16), each block stored
//! column by column: for every value of K, the block's 48 weights of that column, contiguous.
//! One block is then one sequential stream of memory, and a step along K is 3 vectors of
//! weights that every activation row multiplies by its value of K, broadcast: `out[r, j..j +
//! 48]` gathers in 3 accumulators per row, lane by lane, with no reduction at the end and no
//! lane wasted whatever the number of rows. Up to [`GROUP`] rows share one pass over a block
//! (27 accumulators); up to [`WIDE`] take its first 2 vectors, then its third, so that each
//! line of the block is still read from memory once; more rows go in as few groups of at most
//! 9 as possible, of equal sizes, each a pass over the whole block: the first streams it from
//! memory, the others read it again from L2.
//!
//! Where the dot products of `shared/avx512_matmul.rs` spend a transposing reduction on every
//! 16 results, these tiles only multiply and add: 9 rows of all-MiniLM's 384 × 384 matrices,
//! resident in L2, ran at 169-170 GFLOP/s on one thread (97% of its FMA peak) against 111 for
//! the dot products, and 72 such matrices streamed from memory in 1.84-1.91 ms against
//! 2.27-2.33 (`tests/kernels/examples`, since removed).
//!
//! # Safety
//!
//! [`Packed::columns`] may be called only on a CPU with AVX-512F, with pointers that hold
//! `[rows, k]` activations, the packed `[n, k]` weights and `[rows, n]` outputs, never twice at
//! once on overlapping column ranges of the same `out`, and on column ranges that start at a
//! multiple of [`BLOCK`].
#![allow(dead_code, clippy::missing_safety_doc, clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::job::{Extent, Job};

/// The f32 lanes of an AVX-512 register.
const LANES: usize = 16;

/// Weight rows (output columns) per block: 3 vectors.
pub const BLOCK: usize = 48;

/// Most rows that share one pass over a block: 27 accumulators, 3 weight vectors and the
/// broadcast value fill the 32 registers.
const GROUP: usize = 9;

/// Most rows that still take one pass over a block's memory: 13 rows × 2 vectors are 26
/// accumulators.
const WIDE: usize = 13;

/// Steps along K between a prefetch and the step that reads its lines: 32 steps of a block
/// are 6 KiB ahead. On 72 of all-MiniLM's 384 × 384 matrices at 9 rows, one thread: no
/// prefetch 2.99-3.31 ms, 4 steps 2.41-2.64, 8 steps 2.15-2.27, 16 steps 1.92-1.97, 32 steps
/// 1.84-1.91, 64 steps 1.85-1.88.
const AHEAD: usize = 32;

/// The L2 cache of a core that the fetches of the next block count on, as in
/// `shared/avx512_repack.rs`: 1 MiB, the least of the server cores with AVX-512.
const L2_BYTES: usize = 1 << 20;

/// Steps along K in one run: each run of a group's pass over a block starts with its share of
/// the fetches of the next block, so that the steps carry only their own loads.
const RUN: usize = 16;

/// Values the packed form of `[n, k]` weights holds: `n` rounded up to a multiple of 16, by
/// `k`.
pub fn packed_len(n: usize, k: usize) -> usize {
    n.next_multiple_of(LANES) * k
}

/// The `[n, k]` row-major weights `w` (as nn.Linear stores them) in the packed layout that
/// [`Packed::columns`] reads: blocks of 48 weight rows, each column by column. A large matrix
/// is packed on `THREADS` threads, each taking whole blocks.
pub fn pack(w: &[f32], n: usize, k: usize) -> Vec<f32> {
    assert!(w.len() >= n * k, "pack: w is shorter than {n} rows of {k}");
    let mut packed = vec![0.0; packed_len(n, k)];
    let threads = if n * k >= 1 << 18 { crate::THREADS.max(1) } else { 1 };
    let blocks = n.div_ceil(BLOCK).div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        for (t, part) in packed.chunks_mut(blocks * BLOCK * k).enumerate() {
            let first = t * blocks * BLOCK;
            if t + 1 == threads || first + blocks * BLOCK >= n {
                pack_blocks(w, n, k, first, part);
            } else {
                scope.spawn(move || pack_blocks(w, n, k, first, part));
            }
        }
    });
    packed
}

/// Packs the blocks of `w` from weight row `first` (a multiple of 48) into `part`, which
/// starts with the first of them: step by step along K, each step's 48 values written in a
/// row, read from the block's 48 weight rows, whose current lines stay in L1 from step to step.
fn pack_blocks(w: &[f32], n: usize, k: usize, first: usize, part: &mut [f32]) {
    for j0 in (first..n).step_by(BLOCK) {
        let rows = (n - j0).min(BLOCK);
        let width = rows.next_multiple_of(LANES);
        // The blocks before are whole: this one starts `(j0 - first) · k` values into `part`.
        let Some(block) = part.get_mut((j0 - first) * k..(j0 - first + width) * k) else { return };
        let weights = &w[j0 * k..(j0 + rows) * k];
        for (at, step) in block.chunks_exact_mut(width).enumerate() {
            for (slot, row) in step.iter_mut().zip(weights.chunks_exact(k)) {
                *slot = row[at];
            }
        }
    }
}

/// One call's operands: `out[r, j] = Σₖ x[r, k] · w[j, k]` for `r < rows`, `j < n`, with `w`
/// packed.
#[derive(Clone, Copy)]
pub struct Packed {
    pub out: *mut f32,
    pub x: *const f32,
    pub w: *const f32,
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
    pub fn new<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[f32], rows: usize) -> Packed {
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
        for j in (cols.start..cols.end).step_by(BLOCK) {
            // The next block of these columns, which the groups of rows fetch while they pass
            // over this one: `j + 48` up to the share's end, rounded up to whole vectors as
            // `pack` stores it.
            let next = j + BLOCK..(j + 2 * BLOCK).min(cols.end).max(j + BLOCK);
            let next = self.block_values(next);
            // SAFETY: block `j` is in range (the caller's contract).
            match (cols.end - j).min(BLOCK).div_ceil(LANES) {
                3 => unsafe { self.block::<3>(j, next) },
                2 => unsafe { self.block::<2>(j, next) },
                _ => unsafe { self.block::<1>(j, next) },
            }
        }
    }

    /// Where the packed values of weight rows `rows` (whole blocks but the last) lie, as a
    /// range of offsets into the packed weights: `pack` rounds the rows up to whole vectors.
    fn block_values(&self, rows: Range<usize>) -> Range<usize> {
        let end = rows.end.next_multiple_of(LANES).min(self.n.next_multiple_of(LANES));
        rows.start * self.k..end.max(rows.start) * self.k
    }

    /// Columns `j..j + 16·V` (those below `n`) of every row. Up to [`GROUP`] rows take one
    /// pass over the block; up to [`WIDE`] rows take its first 2 vectors, then its third,
    /// still reading each line of the block once; more rows go in groups of at most [`GROUP`]
    /// of equal sizes, the first group prefetching the block for the others.
    ///
    /// With several groups, each also fetches its share of the packed values `next` (the
    /// next block of the thread's columns), a few lines at the start of each [`RUN`] of
    /// steps, so that the next block's first group finds them in the caches. The first group's
    /// own prefetches, [`AHEAD`] steps ahead, come too late for a block from memory: on
    /// stories110M's 12 layers at 128 rows, 2 threads (`cargo bench -p monogen-kernel-tests
    /// --bench weights`), the product ran at 246-249 GFLOP/s without these fetches and 268-272
    /// with them, alternating (1.09x), the decode as fast (bench/RESULTS.md).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn block<const V: usize>(&self, j: usize, next: Range<usize>) {
        let width = V * LANES;
        if V == 3 && self.rows > GROUP && self.rows <= WIDE {
            // SAFETY: the block and the rows are in range.
            unsafe {
                self.wide::<2>(j, width, 0);
                self.wide::<1>(j, width, 2);
            }
            return;
        }
        let groups = self.rows.div_ceil(GROUP);
        // Into L1 (and so L2) where the activation rows, this block and the next fit in
        // [`L2_BYTES`], else into L2 only, as `shared/avx512_repack.rs` decides.
        let near = (self.rows + 2 * BLOCK) * self.k * size_of::<f32>() <= L2_BYTES;
        let lines = if groups > 1 { next.len() * size_of::<f32>() / 64 } else { 0 };
        let mut r = 0;
        for g in 0..groups {
            let rows = (self.rows - r).div_ceil(groups - g);
            // Only ever prefetched, never read: past the weights after the last block.
            let fetch = Fetch {
                first: self.w.wrapping_add(next.start),
                lines: lines * g / groups..lines * (g + 1) / groups,
                near,
            };
            // SAFETY: the block and the rows are in range.
            unsafe { self.rows_of::<V>(r, rows, j, width, g == 0, fetch) };
            r += rows;
        }
    }

    /// `rows` rows from `r` (at most [`GROUP`]) of the block's columns.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn rows_of<const V: usize>(&self, r: usize, rows: usize, j: usize, width: usize, prefetch: bool, fetch: Fetch) {
        // SAFETY (every arm): the caller's contract.
        match rows {
            9 => unsafe { self.tile::<9, V>(r, j, width, 0, prefetch, fetch) },
            8 => unsafe { self.tile::<8, V>(r, j, width, 0, prefetch, fetch) },
            7 => unsafe { self.tile::<7, V>(r, j, width, 0, prefetch, fetch) },
            6 => unsafe { self.tile::<6, V>(r, j, width, 0, prefetch, fetch) },
            5 => unsafe { self.tile::<5, V>(r, j, width, 0, prefetch, fetch) },
            4 => unsafe { self.tile::<4, V>(r, j, width, 0, prefetch, fetch) },
            3 => unsafe { self.tile::<3, V>(r, j, width, 0, prefetch, fetch) },
            2 => unsafe { self.tile::<2, V>(r, j, width, 0, prefetch, fetch) },
            1 => unsafe { self.tile::<1, V>(r, j, width, 0, prefetch, fetch) },
            _ => {}
        }
    }

    /// Every row (10 to [`WIDE`] of them) of the block's `U` vectors from vector `first`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn wide<const U: usize>(&self, j: usize, width: usize, first: usize) {
        // SAFETY (every arm): the caller's contract.
        let none = Fetch::NONE;
        match self.rows {
            13 => unsafe { self.tile::<13, U>(0, j, width, first, true, none) },
            12 => unsafe { self.tile::<12, U>(0, j, width, first, true, none) },
            11 => unsafe { self.tile::<11, U>(0, j, width, first, true, none) },
            10 => unsafe { self.tile::<10, U>(0, j, width, first, true, none) },
            _ => {}
        }
    }

    /// The `R × 16·U` block of `out` at row `r`, column `j + 16 · first`: vectors `first..first
    /// + U` of the block at `j`, whose steps along K are `width` values each. With
    /// `prefetch`, every step also asks for its lines of the step [`AHEAD`] further on; at the
    /// start of each [`RUN`] of steps, the tile asks for its share of `fetch`'s lines.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile<const R: usize, const U: usize>(
        &self,
        r: usize,
        j: usize,
        width: usize,
        first: usize,
        prefetch: bool,
        fetch: Fetch,
    ) {
        let k = self.k;
        // SAFETY (every pointer below): the blocks before `j` are whole, so block `j` starts
        // `j · k` values into the packed weights and holds `k` steps of `width` values, of
        // which this tile reads vectors `first..first + U`; rows `r..r + R` of x hold `k`
        // values each.
        let block = unsafe { self.w.add(j * k + first * LANES) };
        let xs: [*const f32; R] = std::array::from_fn(|i| unsafe { self.x.add((r + i) * k) });
        let mut acc = [[_mm512_setzero_ps(); U]; R];
        // The fetch's lines, spread evenly over the runs: `per_run` at the start of each.
        let per_run = fetch.lines.len().div_ceil(k.div_ceil(RUN));
        let mut line = fetch.lines.start;
        for run in (0..k).step_by(RUN) {
            for _ in 0..per_run.min(fetch.lines.end - line) {
                // A prefetch never faults, even past the end of the weights.
                let at = fetch.first.wrapping_add(line * 16).cast();
                if fetch.near { _mm_prefetch::<_MM_HINT_T0>(at) } else { _mm_prefetch::<_MM_HINT_T1>(at) }
                line += 1;
            }
            for at in run..(run + RUN).min(k) {
                let step = unsafe { block.add(at * width) };
                if prefetch {
                    for v in 0..U {
                        _mm_prefetch::<_MM_HINT_T0>(step.wrapping_add(AHEAD * width + v * LANES).cast());
                    }
                }
                let mut wv = [_mm512_setzero_ps(); U];
                for v in 0..U {
                    wv[v] = unsafe { _mm512_loadu_ps(step.add(v * LANES)) };
                }
                for i in 0..R {
                    let xv = _mm512_set1_ps(unsafe { *xs[i].add(at) });
                    for v in 0..U {
                        acc[i][v] = _mm512_fmadd_ps(xv, wv[v], acc[i][v]);
                    }
                }
            }
        }
        for i in 0..R {
            for v in 0..U {
                let col = j + (first + v) * LANES;
                let valid = self.n.saturating_sub(col).min(LANES);
                let mask: __mmask16 = if valid == LANES { u16::MAX } else { (1u16 << valid) - 1 };
                // SAFETY: row `r + i`, columns `col..col + valid` of `out` are in range and in
                // this thread's columns; the lanes past `valid` are masked off.
                unsafe { _mm512_mask_storeu_ps(self.out.add((r + i) * self.n + col), mask, acc[i][v]) };
            }
        }
    }
}

/// Lines of packed weights that a tile asks for while it runs: lines `lines` (of 64 bytes) from
/// `first`, into L1 where `near`, else into L2.
struct Fetch {
    first: *const f32,
    lines: Range<usize>,
    near: bool,
}

impl Fetch {
    /// Nothing to ask for.
    const NONE: Fetch = Fetch { first: std::ptr::null(), lines: 0..0, near: false };
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
