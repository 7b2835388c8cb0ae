//! The AVX2 + FMA product `out = x · wᵀ` of a prefill, over weights kept as nn.Linear stores
//! them and packed block by block while the call runs: the AVX2 counterpart of
//! `shared/avx512_repack.rs`. What a block is packed from is an [`Operands`]: f32 or bfloat16
//! rows (`Product` of `shared/avx2_team_matmul.rs`), or the int8 rows of `matmul/q8-avx2-threads`
//! times their scales.
//!
//! The dot tiles of `shared/avx2_team_matmul.rs` load a vector of activations for every 2
//! multiply-adds and end each tile in a horizontal reduction. Here a call of [`REPACK_ROWS`] rows
//! or more packs each block of 16 weight rows when it reaches it, into a buffer of the thread
//! (`16 × K` f32, in L2): for each value of K, the 16 weights of that column of the block. Every
//! activation row then passes over the buffer in groups of at most [`GROUP`]: a step along K is
//! 2 vectors of weights that each row of the group multiplies by its value of K, broadcast, into
//! 12 accumulators (with the 2 weight vectors and the broadcast value, 15 of the 16 registers),
//! with no reduction and no shuffle. A step takes 8 loads (2 of weights, 6 broadcasts) for 12
//! multiply-adds, which two load ports issue in the 6 cycles that two FMA ports take.
//!
//! Packing transposes 8 × 8 tiles of weights (bfloat16 ones widened to f32 first) with
//! `shared/avx2_transpose.rs`, 24 shuffles per 64 weights, against the 16 multiply-adds that
//! each 8 packed weights take at 128 rows.
//! The steps ask for the buffer's lines 32 steps ahead, and for the lines of the weight rows of
//! the thread's next block into L2, a line every few steps, so that packing does not wait for
//! memory.
//!
//! The threads of a call take the blocks one at a time from a counter, each taking its next
//! block when it starts one (so that it knows which weight rows to ask for): a thread whose
//! core runs slower, as one of a shared machine's can, computes fewer blocks instead of
//! keeping the others waiting at the end of the call.
//!
//! On stories110M's matrices on one thread of an AMD EPYC (Zen 3), the packed blocks ran at
//! 72-80 GFLOP/s at 128 rows against 60-63 for the dot tiles (`cargo bench -p
//! monogen-kernel-tests --bench weights`, which measures both), 68.5 against 47.4 at 32 rows,
//! 57.3 against 43.7 at 16, 29.9 against 27.1 at 8, and as fast at 4, where both wait on
//! memory. Blocks of 24 weight rows by 4 activation rows, and running each group over K in
//! chunks of 256 steps (so that the chunk of the buffer stays in L1), were both slower.
//!
//! # Safety
//!
//! [`Repack::columns`] and [`Repack::packed`] may be called only on a CPU with AVX2 and FMA, on
//! operands whose pointers hold `[rows, k]`, `[n, k]` and `[rows, n]` values (as
//! `Product::new` checks). Below [`REPACK_ROWS`] rows `columns` computes the columns it is
//! given, which no other thread may compute at once; from there on (and in `packed` always)
//! every thread of a call shares the call's counter and computes the blocks it takes from it,
//! whatever columns it is given.
#![allow(dead_code, clippy::missing_safety_doc, clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;

use super::avx2_math::{LANES, lane_mask};
use super::avx2_team_matmul::{Product, Weight};
use super::avx2_transpose::transpose;
use super::job::{Extent, Job};

/// Weight rows (output columns) per block: 2 vectors.
const BLOCK: usize = 16;

/// Most activation rows that share one pass over a block: 12 accumulators, 2 weight vectors
/// and the broadcast value take 15 of the 16 registers.
const GROUP: usize = 6;

/// Rows from which a call packs its weights: fewer rows leave too few multiply-adds per packed
/// weight to pay for the packing, and keep to the dot tiles.
pub const REPACK_ROWS: usize = 8;

/// Steps along K between a prefetch of the block buffer (from L2) and the step that reads it.
const AHEAD: usize = 32;

/// The team's granule: shares start at a multiple of it, so that only the last block of the
/// share that ends at `n` is narrower than a whole number of vectors (any range is computed
/// right, a narrower block only wastes lanes).
pub const GRANULE: usize = LANES;

thread_local! {
    /// The block of weights that the calling thread is packing or reading, reused from block
    /// to block and from call to call.
    static BUFFER: RefCell<Vec<__m256>> = const { RefCell::new(Vec::new()) };
}

/// What a product packs its blocks from: `rows` activation rows `x` (`[rows, k]` f32), the
/// output `out` (`[rows, n]`), and `n` weight rows of `k` values that load as f32 lanes.
pub trait Operands: Copy {
    /// Bytes of one weight as the rows hold it.
    const WEIGHT_BYTES: usize;

    /// Activation rows, weight rows (output columns), and values per row.
    fn shape(&self) -> (usize, usize, usize);

    /// The activations, `[rows, k]`.
    fn x(&self) -> *const f32;

    /// The output, `[rows, n]`.
    fn out(&self) -> *mut f32;

    /// Where weight `at` of weight row `row` lies, for a prefetch (which never faults).
    fn weight_at(&self, row: usize, at: usize) -> *const u8;

    /// The weights `at..at + len` (`len` ≤ 8) of weight row `row` as f32 lanes, the lanes
    /// past `len` zero.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA, `row` < n and `at + len` ≤ k.
    unsafe fn load(&self, row: usize, at: usize, len: usize) -> __m256;
}

impl<W: Weight> Operands for Product<W> {
    const WEIGHT_BYTES: usize = size_of::<W>();

    fn shape(&self) -> (usize, usize, usize) {
        (self.rows, self.n, self.k)
    }

    fn x(&self) -> *const f32 {
        self.x
    }

    fn out(&self) -> *mut f32 {
        self.out
    }

    fn weight_at(&self, row: usize, at: usize) -> *const u8 {
        self.w.wrapping_add(row * self.k + at).cast()
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load(&self, row: usize, at: usize, len: usize) -> __m256 {
        // SAFETY: the caller's contract: the weights lie inside the row.
        let from = unsafe { self.w.add(row * self.k + at) };
        if len == LANES {
            // SAFETY: as above, 8 values.
            unsafe { W::load(from) }
        } else {
            let mut last = [W::default(); LANES];
            // SAFETY: as above, `len` values.
            last[..len].copy_from_slice(unsafe { std::slice::from_raw_parts(from, len) });
            // SAFETY: `last` is 8 readable values.
            unsafe { W::load(last.as_ptr()) }
        }
    }
}

/// A product that packs its weights block by block.
#[derive(Clone, Copy)]
pub struct Repack<O: Operands> {
    /// The operands.
    pub operands: O,
    /// The blocks handed out so far, from zero, to the threads of a call with packed blocks.
    blocks: *const AtomicUsize,
}

// SAFETY: `blocks` is an atomic that outlives the call (`new`'s contract), and the operands
// are only read, but for the columns of `out` that the counter gives each thread.
unsafe impl<O: Operands> Send for Repack<O> {}

impl<W: Weight> Repack<Product<W>> {
    /// Computes the columns `cols` (weight rows) of every row of `out` with the dot tiles below
    /// [`REPACK_ROWS`] rows; from there on, [`Repack::packed`] (which ignores `cols`).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn columns(&self, cols: Range<usize>) {
        if self.operands.rows < REPACK_ROWS {
            // SAFETY: the caller's contract.
            unsafe { self.operands.columns(cols) };
        } else {
            // SAFETY: the caller's contract.
            unsafe { self.packed() };
        }
    }
}

impl<O: Operands> Repack<O> {
    /// The product of `operands`, whose blocks of packed weights the threads of the call take
    /// from `blocks` in turn: a counter at zero that lives until every thread is done with the
    /// call.
    pub fn new(operands: O, blocks: &AtomicUsize) -> Self {
        Repack { operands, blocks }
    }

    /// Takes blocks of columns from the counter and computes them until none is left, so that
    /// every thread of a call computes as many blocks as its pace allows (on a shared machine
    /// one core can run slower than the other) and each block is computed once, whatever the
    /// threads that call.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn packed(&self) {
        let (_, n, k) = self.operands.shape();
        // SAFETY: the counter outlives the call (`new`'s contract).
        let blocks = unsafe { &*self.blocks };
        let count = n.div_ceil(BLOCK);
        let columns = |b: usize| b * BLOCK..(b * BLOCK + BLOCK).min(n);
        BUFFER.with_borrow_mut(|buffer| {
            buffer.resize(BLOCK / LANES * k, _mm256_setzero_ps());
            let packed: *mut f32 = buffer.as_mut_ptr().cast();
            // Each block taken with the next one this thread will compute, whose weight rows
            // it asks for while it computes this one.
            let mut b = blocks.fetch_add(1, Relaxed);
            while b < count {
                let following = blocks.fetch_add(1, Relaxed);
                let next = if following < count { columns(following) } else { 0..0 };
                let Range { start: j, end } = columns(b);
                // SAFETY: columns `j..end` are in range, no other thread takes block `b`, and
                // the buffer holds a block.
                unsafe {
                    if end - j > LANES {
                        self.block::<2>(packed, j, end - j, next)
                    } else {
                        self.block::<1>(packed, j, end - j, next)
                    }
                }
                b = following;
            }
        });
    }

    /// Columns `j..j + width` (`V` vectors, the last one short only at `n`) of every row:
    /// packed into `packed`, then computed in groups of rows of equal sizes, each group
    /// prefetching its share of the weight rows `next` for the next block.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block<const V: usize>(&self, packed: *mut f32, j: usize, width: usize, next: Range<usize>) {
        // SAFETY: the caller's contract.
        unsafe { self.pack::<V>(packed, j, width) };
        let (rows, _, _) = self.operands.shape();
        let groups = rows.div_ceil(GROUP);
        let mut r = 0;
        for g in 0..groups {
            let count = (rows - r).div_ceil(groups - g);
            let next = next.start + next.len() * g / groups..next.start + next.len() * (g + 1) / groups;
            // SAFETY: the block is packed and the rows are in range.
            unsafe {
                match count {
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
    /// value of K, the block's `8 · V` weights of that column, the rows past `width` zero.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn pack<const V: usize>(&self, packed: *mut f32, j: usize, width: usize) {
        let (_, _, k) = self.operands.shape();
        for v in 0..V {
            let first = j + v * LANES;
            let rows = width.saturating_sub(v * LANES).min(LANES);
            let mut k0 = 0;
            while k0 < k {
                let len = (k - k0).min(LANES);
                let mut tile = [_mm256_setzero_ps(); LANES];
                for i in 0..rows {
                    // SAFETY: weight row `first + i` is below `j + width`, in range, and holds
                    // values `k0..k0 + len`.
                    tile[i] = unsafe { self.operands.load(first + i, k0, len) };
                }
                let columns = transpose(tile);
                for c in 0..len {
                    // SAFETY: step `k0 + c` of the block is inside the buffer (V vectors per
                    // step, K steps), and every step starts on a whole vector.
                    unsafe { _mm256_store_ps(packed.add(((k0 + c) * V + v) * LANES), columns[c]) };
                }
                k0 += len;
            }
        }
    }

    /// The `R × 8·V` block of `out` at row `r`, column `j`, from the packed block. With a
    /// non-empty `next`, the steps also ask for the lines of weight rows `next` into L2, a line
    /// of each row every 64 bytes of weights along K, so that all of them are on their way by
    /// the last step.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const R: usize, const V: usize>(
        &self,
        packed: *const f32,
        r: usize,
        j: usize,
        width: usize,
        next: Range<usize>,
    ) {
        let p = &self.operands;
        let (_, n, k) = p.shape();
        let stride = V * LANES;
        // Steps per line of a weight row: at the first step of each run of that many, one line
        // of each of the weight rows `next`, at the run's place along K, so that the inner
        // steps carry nothing but their own loads and multiply-adds.
        let per_line = 64 / O::WEIGHT_BYTES;
        let mut xs = [p.x(); R];
        for i in 0..R {
            // SAFETY: row `r + i` of x holds `k` values.
            xs[i] = unsafe { p.x().add((r + i) * k) };
        }
        let mut acc = [[_mm256_setzero_ps(); V]; R];
        for run in (0..k).step_by(per_line) {
            for row in next.clone() {
                // A prefetch never faults, even past the end of the weights.
                _mm_prefetch::<_MM_HINT_T1>(p.weight_at(row, run).cast());
            }
            for at in run..(run + per_line).min(k) {
                // SAFETY: the buffer holds `k` steps of `stride` values, each on whole vectors.
                let step = unsafe { packed.add(at * stride) };
                _mm_prefetch::<_MM_HINT_T0>(step.wrapping_add(AHEAD * stride).cast());
                let mut wv = [_mm256_setzero_ps(); V];
                for v in 0..V {
                    // SAFETY: as above.
                    wv[v] = unsafe { _mm256_load_ps(step.add(v * LANES)) };
                }
                for i in 0..R {
                    // SAFETY: `at` < k, inside row `r + i`.
                    let xv = unsafe { _mm256_broadcast_ss(&*xs[i].add(at)) };
                    for v in 0..V {
                        acc[i][v] = _mm256_fmadd_ps(xv, wv[v], acc[i][v]);
                    }
                }
            }
        }
        for v in 0..V {
            let col = j + v * LANES;
            let valid = (j + width).saturating_sub(col).min(LANES);
            for i in 0..R {
                // SAFETY: row `r + i`, columns `col..col + valid` of `out` are in range and in
                // this thread's columns.
                let at = unsafe { p.out().add((r + i) * n + col) };
                if valid == LANES {
                    // SAFETY: as above, 8 lanes.
                    unsafe { _mm256_storeu_ps(at, acc[i][v]) };
                } else {
                    // SAFETY: as above; the lanes past `valid` are masked off.
                    unsafe { _mm256_maskstore_ps(at, lane_mask(valid), acc[i][v]) };
                }
            }
        }
    }
}

/// A product as a team shares it, by multiples of [`GRANULE`] weight rows.
impl<W: Weight + 'static> Job for Repack<Product<W>> {
    fn extent(&self) -> Extent {
        Extent::product(self.operands.rows, self.operands.n, self.operands.k, GRANULE)
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract, which `team::run` keeps.
        unsafe { self.columns(cols) }
    }
}
