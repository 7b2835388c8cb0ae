//! The AVX-512 product `out = x · wᵀ` of a prefill over weights kept as nn.Linear stores them
//! (f32, or bfloat16 bits), packed block by block while the call runs.
//!
//! `shared/avx512_packed.rs` shows what a prefill gains from weights laid out column by column
//! in blocks of 48 weight rows: a step along K is 3 vectors of weights that every activation
//! row multiplies by its value of K, broadcast, into 27 accumulators, with no reduction and
//! no shuffle. But packing the whole model at load costs a copy of every weight, and a decode
//! step read that layout slower than the dot tiles of `shared/avx512_matmul.rs`. Here the
//! matrices stay as they are, the dot tiles keep the calls of fewer than [`REPACK_ROWS`] rows
//! (a decode step, a short sentence), and a call of more rows packs each block of 48 weight
//! rows when it reaches it, into a buffer of the thread (`width × K` f32, in L2), then passes
//! every activation row over that buffer in groups of at most [`GROUP`]. Packing transposes
//! 16 × 16 tiles of weights (bfloat16 ones widened to f32 first), 64 shuffles per 256 weights,
//! against the 8 multiply-adds that each vector of 16 packed weights takes per 8 rows: at 128
//! rows they cost about 3% of the multiply-adds' issue slots. While the groups of rows pass over
//! a block, each asks for its share of the next block's weight rows, a line every few steps, so
//! that packing does not wait for memory. On stories110M's matrices at 128 rows (`cargo bench -p
//! monogen-kernel-tests --bench weights`, 2 threads), f32 and bf16 ran at 256 and 261 GFLOP/s
//! without these prefetches, 256 and 275 with all of them in the first group's pass, and 272 and
//! 274 spread over every group, as fast as weights packed at load (275). Those fetches went
//! into L2 only; into L1 where the working set fits in L2 (see [`Repack::tile`]), the f32
//! products of stories110M's 12 layers at 128 rows ran 1.01-1.19x faster (bench/RESULTS.md).
//!
//! # Safety
//!
//! [`Repack::columns`] may be called only on a CPU with AVX-512F, on a product whose pointers
//! hold `[rows, k]`, `[n, k]` and `[rows, n]` values (as [`Product::new`] checks), with `x`
//! unpaired (not through [`Product::prepared`]) when it has [`REPACK_ROWS`] rows or more, and
//! never twice at once on overlapping column ranges of the same `out`.
#![allow(dead_code, clippy::missing_safety_doc, clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::avx512_matmul::{Product, Weight};
use super::avx512_transpose::transpose;
use super::job::{Extent, Job};

/// The f32 lanes of an AVX-512 register.
const LANES: usize = 16;

/// Weight rows (output columns) per block: 3 vectors.
const BLOCK: usize = 48;

/// Most activation rows that share one pass over a block: 27 accumulators, 3 weight vectors
/// and the broadcast value fill the 32 registers.
const GROUP: usize = 9;

/// Rows from which a call packs its weights: fewer rows leave too few multiply-adds per packed
/// weight to pay for the packing, and keep to the dot tiles.
pub const REPACK_ROWS: usize = 32;

/// The L2 cache of a core that the fetches of the next block count on: 1 MiB, the least of
/// the server cores with AVX-512 (Skylake-SP, Zen 4 and 5; Ice Lake-SP and Sapphire Rapids
/// have more).
const L2_BYTES: usize = 1 << 20;

/// Steps along K between a prefetch of the block buffer (from L2) and the step that reads it.
const AHEAD: usize = 32;

/// The team's granule: shares start at a multiple of it, so that only the last block of the
/// share that ends at `n` is narrower than a whole number of vectors (any range is computed
/// right, a narrower block only wastes lanes).
pub const GRANULE: usize = LANES;

thread_local! {
    /// The block of weights that the calling thread is packing or reading, reused from block
    /// to block and from call to call.
    static BUFFER: RefCell<Vec<__m512>> = const { RefCell::new(Vec::new()) };
}

/// A product that packs its weights block by block from [`REPACK_ROWS`] rows on.
#[derive(Clone, Copy)]
pub struct Repack<W: Weight>(pub Product<W>);

impl<W: Weight> Repack<W> {
    /// Computes the columns `cols` (weight rows) of every row of `out`, and no other.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn columns(&self, cols: Range<usize>) {
        let p = &self.0;
        if p.rows < REPACK_ROWS {
            // SAFETY: the caller's contract.
            unsafe { p.columns(cols) };
            return;
        }
        if cols.is_empty() {
            return;
        }
        BUFFER.with_borrow_mut(|buffer| {
            // Only ever grown: a call of a shorter K uses the front of the buffer (resizing to
            // each call's K wrote zeros over the back at every call that grew it again).
            if buffer.len() < BLOCK / LANES * p.k {
                buffer.resize(BLOCK / LANES * p.k, _mm512_setzero_ps());
            }
            let packed: *mut f32 = buffer.as_mut_ptr().cast();
            let mut j = cols.start;
            while j < cols.end {
                let width = (cols.end - j).min(BLOCK);
                let next = (j + width)..(j + width + BLOCK).min(cols.end);
                // SAFETY: columns `j..j + width` are in range and the buffer holds a block.
                unsafe {
                    match width.div_ceil(LANES) {
                        3 => self.block::<3>(packed, j, width, next),
                        2 => self.block::<2>(packed, j, width, next),
                        1 => self.block::<1>(packed, j, width, next),
                        _ => unreachable!("blocks of at most 3 vectors"),
                    }
                }
                j += width;
            }
        });
    }

    /// Columns `j..j + width` (`V` vectors, the last one short only at `n`) of every row:
    /// packed into `packed`, then computed in groups of rows of equal sizes, each group
    /// prefetching its share of the weight rows `next` for the next block.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn block<const V: usize>(&self, packed: *mut f32, j: usize, width: usize, next: Range<usize>) {
        // SAFETY: the caller's contract.
        unsafe { self.pack::<V>(packed, j, width) };
        let rows = self.0.rows;
        let groups = rows.div_ceil(GROUP);
        let mut r = 0;
        for g in 0..groups {
            let count = (rows - r).div_ceil(groups - g);
            let next = next.start + next.len() * g / groups..next.start + next.len() * (g + 1) / groups;
            // SAFETY: the block is packed and the rows are in range.
            unsafe {
                match count {
                    9 => self.tile::<9, V>(packed, r, j, width, next),
                    8 => self.tile::<8, V>(packed, r, j, width, next),
                    7 => self.tile::<7, V>(packed, r, j, width, next),
                    6 => self.tile::<6, V>(packed, r, j, width, next),
                    5 => self.tile::<5, V>(packed, r, j, width, next),
                    4 => self.tile::<4, V>(packed, r, j, width, next),
                    3 => self.tile::<3, V>(packed, r, j, width, next),
                    2 => self.tile::<2, V>(packed, r, j, width, next),
                    1 => self.tile::<1, V>(packed, r, j, width, next),
                    _ => unreachable!("groups of at most {GROUP} rows"),
                }
            }
            r += count;
        }
    }

    /// Writes weight rows `j..j + width` into `packed` as f32, step by step along K: for each
    /// value of K, the block's `16 · V` weights of that column, the rows past `width` zero.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn pack<const V: usize>(&self, packed: *mut f32, j: usize, width: usize) {
        let (k, w) = (self.0.k, self.0.w);
        for v in 0..V {
            let first = j + v * LANES;
            let rows = width.saturating_sub(v * LANES).min(LANES);
            let mut k0 = 0;
            while k0 < k {
                let len = (k - k0).min(LANES);
                let mut tile = [_mm512_setzero_ps(); LANES];
                for i in 0..rows {
                    // SAFETY: weight row `first + i` is below `j + width`, in range, and holds
                    // values `k0..k0 + len`.
                    let at = unsafe { w.add((first + i) * k + k0) };
                    tile[i] = unsafe { if len == LANES { W::load16(at) } else { W::load_first(at, len) } };
                }
                let columns = transpose(tile);
                for c in 0..len {
                    // SAFETY: step `k0 + c` of the block is inside the buffer (V vectors per
                    // step, K steps).
                    unsafe { _mm512_store_ps(packed.add(((k0 + c) * V + v) * LANES), columns[c]) };
                }
                k0 += len;
            }
        }
    }

    /// The `R × 16·V` block of `out` at row `r`, column `j`, from the packed block. With a
    /// non-empty `next`, the steps also fetch the lines of weight rows `next`, a line of each
    /// row every 64 bytes of weights along K, so that all of them are on their way by the last
    /// step. They are asked for into L1 (and so into L2) where the activation rows, this block
    /// and the next fit in [`L2_BYTES`], and into L2 only where they do not. Asked for into L2
    /// everywhere, packing waited for its weights in 17% of the product's samples (`perf
    /// annotate` of a stories110M prefill), and in 8% asked for into L1. Where the working set
    /// overflows L2 (the down projection's 2048 steps at 128 rows), into L1 did no better (0.95x).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile<const R: usize, const V: usize>(
        &self,
        packed: *const f32,
        r: usize,
        j: usize,
        width: usize,
        next: Range<usize>,
    ) {
        let p = &self.0;
        let k = p.k;
        let stride = V * LANES;
        // Steps per line of a weight row: at the first step of each run of that many, one line
        // of each of the weight rows `next`, at the run's place along K. The inner steps then
        // carry nothing but their own loads and multiply-adds (with the fetches' arithmetic in
        // every step, the compiled step spilled the rows' pointers to the stack).
        let per_line = 64 / size_of::<W>();
        let near = (p.rows + BLOCK) * k * size_of::<f32>() + BLOCK * k * size_of::<W>() <= L2_BYTES;
        // SAFETY (every pointer below): rows `r..r + R` of x hold `k` values each; the buffer
        // holds `k` steps of `stride` values.
        let xs: [*const f32; R] = std::array::from_fn(|i| unsafe { p.x.add((r + i) * k) });
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        for run in (0..k).step_by(per_line) {
            for row in next.clone() {
                // A prefetch never faults, even past the end of the weights.
                let line = p.w.wrapping_add(row * k + run).cast();
                if near { _mm_prefetch::<_MM_HINT_T0>(line) } else { _mm_prefetch::<_MM_HINT_T1>(line) }
            }
            for at in run..(run + per_line).min(k) {
                let step = unsafe { packed.add(at * stride) };
                for v in 0..V {
                    _mm_prefetch::<_MM_HINT_T0>(step.wrapping_add(AHEAD * stride + v * LANES).cast());
                }
                let mut wv = [_mm512_setzero_ps(); V];
                for v in 0..V {
                    wv[v] = unsafe { _mm512_load_ps(step.add(v * LANES)) };
                }
                for i in 0..R {
                    let xv = _mm512_set1_ps(unsafe { *xs[i].add(at) });
                    for v in 0..V {
                        acc[i][v] = _mm512_fmadd_ps(xv, wv[v], acc[i][v]);
                    }
                }
            }
        }
        for i in 0..R {
            for v in 0..V {
                let col = j + v * LANES;
                let valid = (j + width).saturating_sub(col).min(LANES);
                let mask: __mmask16 = if valid == LANES { u16::MAX } else { (1u16 << valid) - 1 };
                // SAFETY: row `r + i`, columns `col..col + valid` of `out` are in range and in
                // this thread's columns; the lanes past `valid` are masked off.
                unsafe { _mm512_mask_storeu_ps(p.out.add((r + i) * p.n + col), mask, acc[i][v]) };
            }
        }
    }
}

/// A product as a team shares it, by multiples of [`GRANULE`] weight rows.
impl<W: Weight> Job for Repack<W> {
    fn extent(&self) -> Extent {
        Extent::product(self.0.rows, self.0.n, self.0.k, GRANULE)
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract, which `team::run` keeps.
        unsafe { self.columns(cols) }
    }
}
