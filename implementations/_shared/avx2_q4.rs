//! The AVX2 matrix product with blockwise int4 weights (two to a byte, each block with a scale
//! and a minimum: GGML's Q4_1 layout) that
//! the AVX2 `matmul<q4>` implementations share, for CPUs without AVX-512 VNNI, computed over a
//! range of weight rows (output columns) so that threads can share a call.
//!
//! [`Q4Product::prepared`] first quantizes the activations, once per call, into buffers of the
//! calling thread (`avx2_q8::quantize_row`): each row's int8 values in whole blocks of 32 (the
//! last zero-padded), one scale per block, and per block 8 lanes of each lane's sum of its 4
//! values times their scale, which the blocks' minimums multiply.
//!
//! A block's 16 bytes of weights hold its first 16 values in their low halves and its last 16
//! in their high halves: masking and a shift give both, in the order of K, as one 32-byte
//! register. Per activation row, `vpmaddubsw` multiplies the weights (unsigned, 0..=15) by the
//! activations (signed) and adds pairs into 16 bits (at most 2 · 15 · 128, which cannot
//! saturate), and `vpmaddwd` by ones adds pairs into 8 exact 32-bit sums. Each becomes f32 and
//! is multiplied into its accumulator by dx · d of the block, and the lane's dx · Σ qx by the
//! block's minimum m. At the end of K, the 8 lanes of each accumulator are added.
//!
//! A tile holds up to 4 activation rows × 4 weight rows; the 4 weight rows stay in L1 while
//! every tile of rows passes over them, so each weight is read from memory once per call. A
//! lone activation row (a decode step) takes one weight row at a time instead, so that each
//! thread streams its share of the weights front to back, and prefetches the bytes it reads 4
//! rows ahead: the hardware prefetcher alone finds a row's short stream too late.
//!
//! # Safety
//!
//! [`Q4Product::columns`] may be called only on a CPU with AVX2, FMA and F16C, from inside
//! [`Q4Product::prepared`], with pointers that hold `[n, ⌈k/32⌉ · 16]` bytes of weights, their
//! `[n, ⌈k/32⌉, 2]` scales and minimums and `[rows, n]` outputs, and never twice at once on overlapping column
//! ranges of the same `out`.
#![allow(dead_code, clippy::missing_safety_doc, clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::avx2_math::hsum;
use super::avx2_q8::{BLOCK, quantize_row};
use super::job::{self, Extent, Job};

/// Weight rows per tile.
const COLUMNS: usize = 4;

/// Activation rows per tile, when there are that many.
const ROWS: usize = 4;

/// How many weight rows ahead a tile prefetches the bytes it reads (at least a tile's).
const AHEAD: usize = 4;

thread_local! {
    /// The quantized activations of the calling thread's current product: the values
    /// (`[rows, blocks · 32]`), the scales (`[rows, blocks]`) and each lane's scaled sum
    /// (`[rows, blocks, 8]`).
    static QUANTIZED: RefCell<(Vec<i8>, Vec<f32>, Vec<f32>)> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// One call's operands: `out[r, j]` for `r < rows`, `j < n`, from `x: [rows, k]` and the
/// weights `w: [n, ⌈k/32⌉ · 16]` with their scales and minimums, `scales: [n, ⌈k/32⌉, 2]`.
#[derive(Clone, Copy)]
pub struct Q4Product {
    pub out: *mut f32,
    pub x: *const f32,
    pub w: *const u8,
    pub scales: *const u16,
    pub rows: usize,
    pub n: usize,
    pub k: usize,
    /// The quantized activations, `[rows, blocks · 32]`, once `prepared` has written them.
    pub qx: *const i8,
    /// Their scales, `[rows, blocks]`.
    pub dx: *const f32,
    /// Each lane's sum of its 4 activations times their scale, dx · Σ qx, `[rows, blocks, 8]`.
    pub sums: *const f32,
}

// SAFETY: a product is only pointers to buffers that its caller keeps alive and shares out
// by disjoint column ranges until every thread is done (see the module's safety section).
unsafe impl Send for Q4Product {}
unsafe impl Sync for Q4Product {}

impl Q4Product {
    /// The product of `rows` rows over `[N, K]` weights, with the slices' lengths checked.
    #[inline]
    pub fn new<const N: usize, const K: usize>(
        out: &mut [f32],
        x: &[f32],
        w: &[u8],
        scales: &[u16],
        rows: usize,
    ) -> Q4Product {
        let blocks = K.div_ceil(BLOCK);
        assert!(x.len() >= rows * K, "matmul: x is shorter than {rows} rows of {K}");
        assert!(w.len() >= N * blocks * BLOCK / 2, "matmul: w is shorter than {N} rows of {blocks} blocks");
        assert!(scales.len() >= N * blocks * 2, "matmul: scales is shorter than {N} rows of {blocks} pairs");
        assert!(out.len() >= rows * N, "matmul: out is shorter than {rows} rows of {N}");
        Q4Product {
            out: out.as_mut_ptr(),
            x: x.as_ptr(),
            w: w.as_ptr(),
            scales: scales.as_ptr(),
            rows,
            n: N,
            k: K,
            qx: std::ptr::null(),
            dx: std::ptr::null(),
            sums: std::ptr::null(),
        }
    }

    /// Blocks of 32 along K.
    fn blocks(&self) -> usize {
        self.k.div_ceil(BLOCK)
    }

    /// Quantizes the activations into this thread's buffers (alive until `f` returns), then
    /// runs `f` on the product.
    ///
    /// # Safety
    ///
    /// Only on a CPU with AVX2 and FMA, with `x` holding `[rows, k]` values.
    pub unsafe fn prepared<T>(mut self, f: impl FnOnce(&Q4Product) -> T) -> T {
        QUANTIZED.with_borrow_mut(|(qx, dx, sums)| {
            let blocks = self.blocks();
            qx.clear();
            qx.resize(self.rows * blocks * BLOCK, 0);
            dx.clear();
            dx.resize(self.rows * blocks, 0.0);
            sums.clear();
            sums.resize(self.rows * blocks * 8, 0.0);
            for r in 0..self.rows {
                let q = &mut qx[r * blocks * BLOCK..(r + 1) * blocks * BLOCK];
                // SAFETY: row `r` of x holds k values (the caller's contract); the CPU has AVX2
                // and FMA (the caller's contract).
                unsafe {
                    quantize_row(
                        std::slice::from_raw_parts(self.x.add(r * self.k), self.k),
                        q,
                        &mut dx[r * blocks..(r + 1) * blocks],
                    )
                };
                let lanes = sums[r * blocks * 8..(r + 1) * blocks * 8].iter_mut().zip(q.chunks_exact(4));
                for (i, (lane, four)) in lanes.enumerate() {
                    *lane = dx[r * blocks + i / 8] * four.iter().map(|&v| i32::from(v)).sum::<i32>() as f32;
                }
            }
            self.qx = qx.as_ptr();
            self.dx = dx.as_ptr();
            self.sums = sums.as_ptr();
            f(&self)
        })
    }

    /// Computes the columns `cols` (weight rows) of every row of `out`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn columns(&self, cols: Range<usize>) {
        let mut j = cols.start;
        // A lone row (a decode step) takes one weight row at a time, below: the thread then
        // reads its share of the weights front to back, one stream that the prefetch keeps
        // ahead of (in tiles of 4 rows, TinyLlama's int4 decode ran at 36.4 tok/s against 39.1,
        // bench/RESULTS.md).
        while self.rows > 1 && j + COLUMNS <= cols.end {
            let mut r = 0;
            while r + ROWS <= self.rows {
                // SAFETY: the rows and columns are in range (the caller's contract).
                unsafe { self.tile::<ROWS, COLUMNS>(r, j) };
                r += ROWS;
            }
            for r in r..self.rows {
                // SAFETY: as above.
                unsafe { self.tile::<1, COLUMNS>(r, j) };
            }
            j += COLUMNS;
        }
        for j in j..cols.end {
            for r in 0..self.rows {
                // SAFETY: as above.
                unsafe { self.tile::<1, 1>(r, j) };
            }
        }
    }

    /// Rows `r..r + R` of columns `j..j + C`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const R: usize, const C: usize>(&self, r: usize, j: usize) {
        let blocks = self.blocks();
        let nibble = _mm_set1_epi8(0x0f);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        for b in 0..blocks {
            let mut weights = [_mm256_setzero_si256(); C];
            let mut dw = [0.0f32; C];
            let mut mw = [0.0f32; C];
            for c in 0..C {
                // SAFETY: weight row j + c holds `blocks` blocks of 16 bytes and `blocks` pairs
                // of a scale and a minimum.
                unsafe {
                    let at = (j + c) * blocks + b;
                    // The same line AHEAD weight rows on (a prefetch never faults): a row of
                    // a small model is a short stream, which the hardware prefetcher finds late.
                    if b % 4 == 0 {
                        _mm_prefetch::<_MM_HINT_T0>(self.w.wrapping_add((at + AHEAD.max(C) * blocks) * 16).cast());
                    }
                    let bytes = _mm_loadu_si128(self.w.add(at * 16).cast());
                    let low = _mm_and_si128(bytes, nibble);
                    let high = _mm_and_si128(_mm_srli_epi16::<4>(bytes), nibble);
                    weights[c] = _mm256_set_m128i(high, low);
                    let pair = std::ptr::read_unaligned(self.scales.add(2 * at).cast::<i32>());
                    let both = _mm_cvtph_ps(_mm_cvtsi32_si128(pair));
                    dw[c] = _mm_cvtss_f32(both);
                    mw[c] = _mm_cvtss_f32(_mm_movehdup_ps(both));
                }
            }
            for i in 0..R {
                // SAFETY: row r + i holds `blocks` blocks of values, scales and sums.
                let (x, dx, sums) = unsafe {
                    let at = (r + i) * blocks + b;
                    (
                        _mm256_loadu_si256(self.qx.add(at * BLOCK).cast()),
                        *self.dx.add(at),
                        _mm256_loadu_ps(self.sums.add(at * 8)),
                    )
                };
                for c in 0..C {
                    let pairs = _mm256_maddubs_epi16(weights[c], x);
                    let exact = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
                    acc[i][c] = _mm256_fmadd_ps(exact, _mm256_set1_ps(dx * dw[c]), acc[i][c]);
                    acc[i][c] = _mm256_fmadd_ps(sums, _mm256_set1_ps(mw[c]), acc[i][c]);
                }
            }
        }
        for i in 0..R {
            for c in 0..C {
                // SAFETY: row r + i is below `rows`, and column j + c is in range and in this
                // thread's columns.
                unsafe { *self.out.add((r + i) * self.n + j + c) = hsum(acc[i][c]) };
            }
        }
    }
}

/// A product as a team shares it, by weight rows.
impl Job for Q4Product {
    fn extent(&self) -> Extent {
        Extent::product(self.rows, self.n, self.k, job::GRANULE)
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract, which `team::run` keeps.
        unsafe { self.columns(cols) }
    }
}
