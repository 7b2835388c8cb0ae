//! The AVX-512 VNNI matrix product with blockwise int4 weights (two to a byte, GGML's Q4_0
//! layout) that the `matmul<q4>` implementations share, computed over a range of weight rows
//! (output columns) so that threads can share a call.
//!
//! [`Q4Product::prepared`] first quantizes the activations, once per call, into buffers of the
//! calling thread: each row's int8 values, padded with zeros to a multiple of 64, their block
//! scales spread over the 16 lanes of a step (8 lanes a block), and per lane minus 8 times the
//! sum of the lane's 4 values, which is where each lane's sum starts.
//!
//! A step along K takes 64 values, two blocks: 32 bytes of weights. Their low halves are the
//! first 16 values of each block, their high halves the last 16; masking and a shift give both,
//! and one `vpermt2q` puts the 64 four-bit values in the order of K. Then, per activation row,
//! one `vpdpbusd` multiplies the weights (unsigned, 0..=15) by the activations (signed) and adds
//! 4 products into each of 16 i32 lanes (lanes 0–7 the first block, 8–15 the second). Started
//! at −8 · Σ qx, a lane holds Σ qx · (q − 8) exactly. It becomes f32 and is multiplied into its
//! accumulator by dx · dw of its block. At the end of K, the 16 lanes of each accumulator are
//! added.
//!
//! A tile holds up to 4 activation rows × 4 weight rows; the 4 weight rows stay in L1 while
//! every tile of rows passes over them, so each weight is read from memory once per call.
//!
//! # Safety
//!
//! [`Q4Product::columns`] may be called only on a CPU with AVX-512F, AVX-512BW and AVX-512
//! VNNI, from inside [`Q4Product::prepared`], with pointers that hold `[n, ⌈k/32⌉ · 16]` bytes
//! of weights, their `[n, ⌈k/32⌉]` scales and `[rows, n]` outputs, and never twice at once on
//! overlapping column ranges of the same `out`.
#![allow(dead_code, clippy::missing_safety_doc, clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::job::{self, Extent, Job};

/// Values of K that share one scale; their weights fill 16 bytes.
pub const BLOCK: usize = 32;

/// Values of K per step: the bytes of one AVX-512 register, two blocks.
pub const STEP: usize = 64;

/// Weight rows per tile.
const COLUMNS: usize = 4;

/// Activation rows per tile, when there are that many.
const ROWS: usize = 4;

thread_local! {
    /// The quantized activations of the calling thread's current product: the values
    /// (`[rows, steps · 64]`), the spread scales (`[rows, steps, 16]`) and each lane's start
    /// (`[rows, steps, 16]`).
    static QUANTIZED: RefCell<(Vec<i8>, Vec<f32>, Vec<i32>)> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// One call's operands: `out[r, j]` for `r < rows`, `j < n`, from `x: [rows, k]` and the
/// weights `w: [n, ⌈k/32⌉ · 16]` with their `scales: [n, ⌈k/32⌉]`.
#[derive(Clone, Copy)]
pub struct Q4Product {
    pub out: *mut f32,
    pub x: *const f32,
    pub w: *const u8,
    pub scales: *const u16,
    pub rows: usize,
    pub n: usize,
    pub k: usize,
    /// The quantized activations, `[rows, steps · 64]`, once `prepared` has written them.
    pub qx: *const i8,
    /// Their scales, `[rows, steps, 16]`: lanes 0–7 the first block of a step, 8–15 the second.
    pub dx: *const f32,
    /// Each lane's start, −8 times the sum of its 4 activations, `[rows, steps, 16]`.
    pub start: *const i32,
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
        assert!(scales.len() >= N * blocks, "matmul: scales is shorter than {N} rows of {blocks}");
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
            start: std::ptr::null(),
        }
    }

    /// Steps of 64 along K.
    fn steps(&self) -> usize {
        self.k.div_ceil(STEP)
    }

    /// Quantizes the activations into this thread's buffers (alive until `f` returns), then
    /// runs `f` on the product.
    ///
    /// # Safety
    ///
    /// Only on a CPU with AVX-512F and AVX-512BW, with `x` holding `[rows, k]` values.
    pub unsafe fn prepared<T>(mut self, f: impl FnOnce(&Q4Product) -> T) -> T {
        QUANTIZED.with_borrow_mut(|(qx, dx, start)| {
            let steps = self.steps();
            qx.clear();
            qx.resize(self.rows * steps * STEP, 0);
            dx.clear();
            dx.resize(self.rows * steps * 16, 0.0);
            start.clear();
            start.resize(self.rows * steps * 16, 0);
            for r in 0..self.rows {
                let q = &mut qx[r * steps * STEP..(r + 1) * steps * STEP];
                // SAFETY: row `r` of x holds k values (the caller's contract), and the rows of
                // the buffers have the sizes `quantize_row` writes.
                unsafe {
                    quantize_row(
                        std::slice::from_raw_parts(self.x.add(r * self.k), self.k),
                        q,
                        &mut dx[r * steps * 16..(r + 1) * steps * 16],
                    )
                };
                for (lane, four) in start[r * steps * 16..(r + 1) * steps * 16].iter_mut().zip(q.chunks_exact(4)) {
                    *lane = -8 * four.iter().map(|&v| i32::from(v)).sum::<i32>();
                }
            }
            self.qx = qx.as_ptr();
            self.dx = dx.as_ptr();
            self.start = start.as_ptr();
            f(&self)
        })
    }

    /// Computes the columns `cols` (weight rows) of every row of `out`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn columns(&self, cols: Range<usize>) {
        let mut j = cols.start;
        while j + COLUMNS <= cols.end {
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
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn tile<const R: usize, const C: usize>(&self, r: usize, j: usize) {
        let (steps, blocks) = (self.steps(), self.k.div_ceil(BLOCK));
        let nibble = _mm256_set1_epi8(0x0f);
        // Low halves of both blocks' bytes, then high halves: the values in the order of K.
        let order = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        for s in 0..steps {
            // A last step of one block, when the row has an odd number of blocks.
            let both = 2 * s + 1 < blocks;
            let mut weights = [_mm512_setzero_si512(); C];
            let mut dw = [_mm512_setzero_ps(); C];
            for c in 0..C {
                // SAFETY: weight row j + c holds `blocks` blocks of 16 bytes and `blocks`
                // scales; step s reads blocks 2s and, where there is one, 2s + 1.
                unsafe {
                    let at = self.w.add((j + c) * blocks * 16 + s * 32);
                    let bytes = if both {
                        _mm256_loadu_si256(at.cast())
                    } else {
                        _mm256_zextsi128_si256(_mm_loadu_si128(at.cast()))
                    };
                    let low = _mm256_and_si256(bytes, nibble);
                    let high = _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), nibble);
                    weights[c] =
                        _mm512_permutex2var_epi64(_mm512_castsi256_si512(low), order, _mm512_castsi256_si512(high));
                    let scales = self.scales.add((j + c) * blocks + 2 * s);
                    let (first, second) = (*scales, if both { *scales.add(1) } else { 0 });
                    let halves = _mm256_inserti128_si256::<1>(
                        _mm256_castsi128_si256(_mm_set1_epi16(first as i16)),
                        _mm_set1_epi16(second as i16),
                    );
                    dw[c] = _mm512_cvtph_ps(halves);
                }
            }
            for i in 0..R {
                // SAFETY: row r + i holds `steps` steps of values, scales and starts.
                let (x, dx, start) = unsafe {
                    let at = (r + i) * steps + s;
                    (
                        _mm512_loadu_si512(self.qx.add(at * STEP).cast()),
                        _mm512_loadu_ps(self.dx.add(at * 16)),
                        _mm512_loadu_si512(self.start.add(at * 16).cast()),
                    )
                };
                for c in 0..C {
                    let exact = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, weights[c], x));
                    acc[i][c] = _mm512_fmadd_ps(exact, _mm512_mul_ps(dx, dw[c]), acc[i][c]);
                }
            }
        }
        for i in 0..R {
            for c in 0..C {
                // SAFETY: row r + i is below `rows`, and column j + c is in range and in this
                // thread's columns.
                unsafe { *self.out.add((r + i) * self.n + j + c) = _mm512_reduce_add_ps(acc[i][c]) };
            }
        }
    }
}

/// Quantizes one row of activations: per block of 32, `d = max|x| / 127` and
/// `q = round(x · (127 / max|x|))` (ties to even, as the CPU rounds by default); `q` is padded
/// with zeros to whole steps and `d` spread over 8 lanes per block.
#[target_feature(enable = "avx512f,avx512bw")]
pub fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    assert!(q.len() >= x.len().div_ceil(STEP) * STEP && d.len() >= x.len().div_ceil(STEP) * 16);
    for (b, block) in x.chunks(BLOCK).enumerate() {
        let (low, high) = block.split_at(block.len().min(16));
        // SAFETY: the masks limit each load to the values of the block.
        let (low, high) = unsafe {
            (
                _mm512_maskz_loadu_ps(mask16(low.len()), low.as_ptr()),
                _mm512_maskz_loadu_ps(mask16(high.len()), high.as_ptr()),
            )
        };
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(low), _mm512_abs_ps(high)));
        let inverse = _mm512_set1_ps(if amax > 0.0 { 127.0 / amax } else { 0.0 });
        for (half, v) in [low, high].into_iter().enumerate() {
            let bytes = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v, inverse)));
            // SAFETY: block `b`'s half lies inside `q`, whose length was checked above.
            unsafe { _mm_storeu_si128(q.as_mut_ptr().add(b * BLOCK + half * 16).cast(), bytes) };
        }
        d[b * 8..(b + 1) * 8].fill(amax / 127.0);
    }
}

/// A mask of the first `len` (≤ 16) lanes.
fn mask16(len: usize) -> __mmask16 {
    if len >= 16 { u16::MAX } else { (1u16 << len) - 1 }
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
