//! The AVX-512 VNNI matrix product with blockwise int4 weights (two to a byte, each block with
//! a scale and a minimum: GGML's Q4_1 layout) that the `matmul<q4>` implementations share,
//! computed over a range of weight rows (output columns) so that threads can share a call.
//!
//! A step along K takes 64 values, two blocks: 32 bytes of weights, whose low halves are the
//! first 16 values of each block and whose high halves the last 16. One load broadcasts the 32
//! bytes to both halves of a register, and one `vpsrlvw` shifts the upper half by four bits, so
//! that after a mask the register holds, in this order, the first 16 values of each block and
//! then the last 16 of each. [`Q4Product::prepared`] quantizes the activations, once per call,
//! into buffers of the calling thread in that order (the middle 16-byte quarters of each step
//! swapped), each row padded with zeros to a multiple of 64, with their block scales spread
//! over the 16 lanes of a step in the same order (lanes 0–3 and 8–11 the first block, 4–7 and
//! 12–15 the second).
//!
//! Per activation row and step, one `vpdpbusd` multiplies the weights (unsigned, 0..=15) by the
//! activations (signed) and adds 4 products into each of 16 i32 lanes, exactly; each lane
//! becomes f32 and is multiplied into its accumulator by dx · d of its block. The scales and
//! minimums of 8 blocks (4 steps) of a weight row become f32 with one conversion, from which a
//! permutation spreads each step's two scales. The minimums' term, Σ_b m · dx · Σ qx, is one
//! multiply-add per 8 blocks: the converted pairs (d, m) times a vector of the activations'
//! (0, dx · Σ qx) pairs. At the end of K, the 16 lanes of both accumulators are added.
//!
//! A tile holds up to 4 activation rows × 4 weight rows; the 4 weight rows stay in L1 while
//! every tile of rows passes over them, so each weight is read from memory once per call. A
//! lone activation row (a decode step) takes one weight row at a time instead, so that each
//! thread streams its share of the weights front to back, and prefetches the bytes it reads 4
//! rows ahead: the hardware prefetcher alone finds a row's short stream too late.
//!
//! # Safety
//!
//! [`Q4Product::columns`] may be called only on a CPU with AVX-512F, AVX-512BW and AVX-512
//! VNNI, from inside [`Q4Product::prepared`], with pointers that hold `[n, ⌈k/32⌉ · 16]` bytes
//! of weights, their `[n, ⌈k/32⌉, 2]` scales and minimums and `[rows, n]` outputs, and never
//! twice at once on overlapping column ranges of the same `out`.
#![allow(dead_code, clippy::missing_safety_doc, clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::job::{self, Extent, Job};

/// Values of K that share one scale; their weights fill 16 bytes.
pub const BLOCK: usize = 32;

/// Values of K per step: the bytes of one AVX-512 register, two blocks.
pub const STEP: usize = 64;

/// Blocks whose scales and minimums one conversion reads: 8 pairs of binary16 values.
const GROUP: usize = 8;

/// Weight rows per tile.
const COLUMNS: usize = 4;

/// Activation rows per tile, when there are that many.
const ROWS: usize = 4;

/// How many weight rows ahead a tile prefetches the bytes it reads (at least a tile's).
const AHEAD: usize = 4;

/// The quantized activations of a thread's current product.
struct Quantized {
    /// The values, `[rows, steps · 64]`, each step's quarters in the weights' order.
    qx: Vec<i8>,
    /// The spread scales, `[rows, steps, 16]`.
    dx: Vec<f32>,
    /// Per group of 8 blocks, the pairs (0, dx · Σ qx), `[rows, groups, 16]`.
    sums: Vec<f32>,
    /// One row's block scales as quantized, `[blocks]`.
    scales: Vec<f32>,
}

thread_local! {
    /// The calling thread's buffers, reused from call to call.
    static QUANTIZED: RefCell<Quantized> =
        const { RefCell::new(Quantized { qx: Vec::new(), dx: Vec::new(), sums: Vec::new(), scales: Vec::new() }) };
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
    /// The quantized activations, `[rows, steps · 64]`, once `prepared` has written them.
    pub qx: *const i8,
    /// Their scales, `[rows, steps, 16]`: lanes 0–3 and 8–11 the first block of a step, 4–7 and
    /// 12–15 the second.
    pub dx: *const f32,
    /// Per group of 8 blocks, (0, dx · Σ qx) for each block, `[rows, groups, 16]`.
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

    /// Steps of 64 along K.
    fn steps(&self) -> usize {
        self.k.div_ceil(STEP)
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
    /// Only on a CPU with AVX-512F and AVX-512BW, with `x` holding `[rows, k]` values.
    pub unsafe fn prepared<T>(mut self, f: impl FnOnce(&Q4Product) -> T) -> T {
        QUANTIZED.with_borrow_mut(|Quantized { qx, dx, sums, scales }| {
            let (steps, blocks) = (self.steps(), self.blocks());
            let groups = blocks.div_ceil(GROUP);
            qx.clear();
            qx.resize(self.rows * steps * STEP, 0);
            dx.clear();
            dx.resize(self.rows * steps * 16, 0.0);
            sums.clear();
            sums.resize(self.rows * groups * 16, 0.0);
            scales.clear();
            scales.resize(blocks, 0.0);
            for r in 0..self.rows {
                let q = &mut qx[r * steps * STEP..(r + 1) * steps * STEP];
                // SAFETY: row `r` of x holds k values (the caller's contract), and `q` holds
                // whole steps.
                unsafe { quantize_row(std::slice::from_raw_parts(self.x.add(r * self.k), self.k), q, scales) };
                for (b, &d) in scales.iter().enumerate() {
                    let sum: i32 = q[b * BLOCK..(b + 1) * BLOCK].iter().map(|&v| i32::from(v)).sum();
                    sums[(r * groups + b / GROUP) * 16 + 2 * (b % GROUP) + 1] = d * sum as f32;
                    // Lanes 0–3 and 8–11 of a step the first block, 4–7 and 12–15 the second.
                    let lanes = &mut dx[(r * steps + b / 2) * 16..][..16];
                    for half in [0, 8] {
                        lanes[half + 4 * (b % 2)..][..4].fill(d);
                    }
                }
                // The first 16 values of the step's second block before the last 16 of its first.
                for step in q.chunks_exact_mut(STEP) {
                    let (first, second) = step.split_at_mut(32);
                    first[16..].swap_with_slice(&mut second[..16]);
                }
            }
            self.qx = qx.as_ptr();
            self.dx = dx.as_ptr();
            self.sums = sums.as_ptr();
            f(&self)
        })
    }

    /// Computes the columns `cols` (weight rows) of every row of `out`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
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
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn tile<const R: usize, const C: usize>(&self, r: usize, j: usize) {
        let (steps, blocks) = (self.steps(), self.blocks());
        let groups = blocks.div_ceil(GROUP);
        let nibble = _mm512_set1_epi8(0x0f);
        // The upper 256 bits' 16-bit lanes shift by 4: the high halves of the bytes.
        let shifts = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(4));
        // Per step of a group, the lanes of its two scales among the group's (d, m) pairs.
        let spread: [__m512i; 4] = std::array::from_fn(|t| {
            let (a, b) = (4 * t as i32, 4 * t as i32 + 2);
            _mm512_setr_epi32(a, a, a, a, b, b, b, b, a, a, a, a, b, b, b, b)
        });
        // Even and odd steps add into accumulators of their own: two chains of additions, which a
        // lone weight row (a decode step's tile) would otherwise wait on.
        let mut acc = [[[_mm512_setzero_ps(); C]; R]; 2];
        for g in 0..groups {
            let mut pairs = [_mm512_setzero_ps(); C];
            for c in 0..C {
                let row = (j + c) * blocks;
                let count = (blocks - g * GROUP).min(GROUP);
                // SAFETY: weight row j + c holds `blocks` pairs; a last group of fewer than 8
                // is copied to a buffer of zeros first.
                pairs[c] = unsafe {
                    let at = self.scales.add((row + g * GROUP) * 2);
                    // The next tile's pairs, as its weights below.
                    if g % 2 == 0 {
                        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(AHEAD.max(C) * blocks * 2).cast());
                    }
                    let bits = if count == GROUP {
                        _mm256_loadu_si256(at.cast())
                    } else {
                        let mut padded = [0u16; 2 * GROUP];
                        std::ptr::copy_nonoverlapping(at, padded.as_mut_ptr(), 2 * count);
                        _mm256_loadu_si256(padded.as_ptr().cast())
                    };
                    _mm512_cvtph_ps(bits)
                };
            }
            for i in 0..R {
                // SAFETY: row r + i holds `groups` groups of pairs.
                let sums = unsafe { _mm512_loadu_ps(self.sums.add(((r + i) * groups + g) * 16)) };
                for c in 0..C {
                    acc[1][i][c] = _mm512_fmadd_ps(pairs[c], sums, acc[1][i][c]);
                }
            }
            for t in 0..4 {
                let s = g * 4 + t;
                if s == steps {
                    break;
                }
                // A last step of one block, when the row has an odd number of blocks.
                let both = 2 * s + 1 < blocks;
                let mut x = [_mm512_setzero_si512(); R];
                let mut dx = [_mm512_setzero_ps(); R];
                for i in 0..R {
                    // SAFETY: row r + i holds `steps` steps of values and scales.
                    unsafe {
                        let at = (r + i) * steps + s;
                        x[i] = _mm512_loadu_si512(self.qx.add(at * STEP).cast());
                        dx[i] = _mm512_loadu_ps(self.dx.add(at * 16));
                    }
                }
                // One weight row at a time, each used as soon as it is unpacked: with the
                // unpacked rows kept for a second loop, the 8 rows of a decode tile spilled.
                for c in 0..C {
                    // SAFETY: weight row j + c holds `blocks` blocks of 16 bytes; step s reads
                    // blocks 2s and, where there is one, 2s + 1.
                    let bytes = unsafe {
                        let at = self.w.add((j + c) * blocks * 16 + s * 32);
                        // The same bytes of the next tile's rows, whose short streams (a row of
                        // TinyLlama's is 1 KiB) the hardware prefetcher would find too late. A
                        // prefetch never faults, past the matrix's end either.
                        if s % 2 == 0 {
                            _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(AHEAD.max(C) * blocks * 16).cast());
                        }
                        if both {
                            _mm512_broadcast_i64x4(_mm256_loadu_si256(at.cast()))
                        } else {
                            _mm512_broadcast_i64x4(_mm256_zextsi128_si256(_mm_loadu_si128(at.cast())))
                        }
                    };
                    let weights = _mm512_and_si512(_mm512_srlv_epi16(bytes, shifts), nibble);
                    let dw = _mm512_permutexvar_ps(spread[t], pairs[c]);
                    for i in 0..R {
                        let exact = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), weights, x[i]));
                        acc[t % 2][i][c] = _mm512_fmadd_ps(exact, _mm512_mul_ps(dx[i], dw), acc[t % 2][i][c]);
                    }
                }
            }
        }
        for i in 0..R {
            for c in 0..C {
                // SAFETY: row r + i is below `rows`, and column j + c is in range and in this
                // thread's columns.
                unsafe { *self.out.add((r + i) * self.n + j + c) = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][i][c], acc[1][i][c])) };
            }
        }
    }
}

/// Quantizes one row of activations: per block of 32, `d = max|x| / 127` and
/// `q = round(x · (127 / max|x|))` (ties to even, as the CPU rounds by default), into `q`, padded
/// with zeros to whole steps, and each block's `d`.
#[target_feature(enable = "avx512f,avx512bw")]
pub fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    assert!(q.len() >= x.len().div_ceil(STEP) * STEP && d.len() >= x.len().div_ceil(BLOCK));
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
        d[b] = amax / 127.0;
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
