//! The AVX-512 VNNI matrix product over blockwise int8 weights packed once, at load, so that each
//! thread reads its share of the weights as one stream, front to back.
//!
//! # The layout ([`pack`])
//!
//! `q8_packed.rs`'s, in groups of 16 weight rows (a block's vector `s`, 64 bytes, holds values
//! `4s..4s + 4` of the block for the 16 rows), each value stored plus 128, as an unsigned byte.
//!
//! # The product
//!
//! Each row of the activations is quantized once per call, by the calling thread, as
//! `matmul<q8>` defines it (`avx512_q8::quantize_row`). A step is one `vpdpbusd` per activation
//! row. It multiplies the 16 rows' 4 offset weights by 4 activations of the row, broadcast to
//! every lane, and adds the 4 products into each lane. Each lane then sums `(w + 128) · qx`, so
//! every block's sum starts at `-128 · Σ qx` of the block, which is the same for all 16 rows. At
//! the end of a block, the lanes become f32 and are multiplied into the row's accumulators by
//! `dx · dw`. Nothing is reduced across lanes, and the 16 results of a group are stored as
//! one vector.
//!
//! - **A decode step** (one row) runs two blocks side by side, in two chains.
//! - **A prefill** passes up to [`ROWS`] activation rows at a time over a group's weights,
//!   which stay in the caches while every pass over them runs.
//!
//! # Safety
//!
//! [`Q8Packed::columns`] may be called only on a CPU with AVX-512F, AVX-512BW and AVX-512 VNNI,
//! from inside [`Q8Packed::prepared`], with a pointer to `[n, k]` weights as [`pack`] wrote them
//! and one to `[rows, n]` outputs. It must never run twice at once on overlapping
//! column ranges of the same `out`.
#![allow(dead_code, clippy::missing_safety_doc, clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::avx512_q8::{BLOCK, STEP, quantize_row};
use super::job::{Extent, Job};
use super::q8_packed::Layout;

/// Weight rows per group: the lanes of a vector of i32.
pub const GROUP: usize = 16;

/// The packed layout, in groups of 16 rows.
type L = Layout<GROUP>;

/// Bytes of one block of a group: 16 rows of 32 values.
const BLOCK_BYTES: usize = L::BLOCK_BYTES;

/// Offset of block `b`'s values in a group of `blocks` blocks.
const fn block_at(b: usize, blocks: usize) -> usize {
    L::block_at(b, blocks)
}

/// Most activation rows that pass over a group's weights at once: each takes an i32 and an f32
/// accumulator.
pub const ROWS: usize = 8;

/// Bytes ahead of the one it reads that a decode step asks for.
const AHEAD: usize = 2048;

thread_local! {
    /// The quantized activations of the calling thread's current product: the values
    /// (`[rows, k padded to 64]`), the scales spread over 8 lanes per block
    /// (`[rows, steps, 16]`), and each block's `-128 · Σ qx` (`[rows, blocks]`).
    static QUANTIZED: RefCell<(Vec<i8>, Vec<f32>, Vec<i32>)> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// Bytes of the packed form of `[n, k]` weights: `n` rounded up to a multiple of 16 by `k`
/// rounded up to a multiple of 32, and each group's lines of scales.
pub const fn packed_len(n: usize, k: usize) -> usize {
    L::packed_len(n, k)
}

/// The `[n, k]` int8 weights `w` (values in −127..=127) and their `[n, ⌈k/32⌉]` binary16 scales
/// in the packed layout (see the module's docs), each value offset by 128: [`packed_len`] bytes.
pub fn pack(w: &[i8], scales: &[f32], n: usize, k: usize) -> Vec<i8> {
    L::pack(w, scales, n, k, true)
}

/// Ok when the `packed_len(n, k)` bytes `packed` hold scales (binary16) that are all finite and
/// not negative, as [`pack`] writes them; else which row and block holds a bad one.
pub fn check_packed(packed: &[i8], n: usize, k: usize) -> Result<(), String> {
    L::check_packed(packed, n, k)
}

/// One call's operands: `out[r, j]` for `r < rows`, `j < n`, from `x: [rows, k]` and packed
/// weights with their scales.
#[derive(Clone, Copy)]
pub struct Q8Packed {
    pub out: *mut f32,
    pub x: *const f32,
    /// The packed values (offset by 128) and scales, as [`pack`] wrote them.
    pub w: *const u8,
    pub rows: usize,
    pub n: usize,
    pub k: usize,
    /// The quantized activations, `[rows, steps · 64]`, once `prepared` has written them.
    pub qx: *const i8,
    /// Their scales, `[rows, steps, 16]` (8 lanes per block).
    pub dx: *const f32,
    /// Each block's `-128 · Σ qx`, `[rows, blocks]`.
    pub offsets: *const i32,
}

// SAFETY: a product is only pointers to buffers that its caller keeps alive and shares out
// by disjoint column ranges until every thread is done (see the module's safety section).
unsafe impl Send for Q8Packed {}
unsafe impl Sync for Q8Packed {}

impl Q8Packed {
    /// The product of `rows` rows of `x` with the `[N, K]` weights `w` as [`pack`] wrote them
    /// (scales included: `scales` is empty), into `out`, after checking the slices' lengths.
    pub fn new<const N: usize, const K: usize>(
        out: &mut [f32],
        x: &[f32],
        w: &[i8],
        scales: &[f32],
        rows: usize,
    ) -> Q8Packed {
        assert!(x.len() >= rows * K, "matmul: x is shorter than {rows} rows of {K}");
        assert!(w.len() == packed_len(N, K), "matmul: w is not {N} × {K} weights packed by `pack`");
        assert!(scales.is_empty(), "matmul: the packed weights hold their scales; `scales` is empty");
        assert!(out.len() >= rows * N, "matmul: out is shorter than {rows} rows of {N}");
        Q8Packed {
            out: out.as_mut_ptr(),
            x: x.as_ptr(),
            w: w.as_ptr().cast(),
            rows,
            n: N,
            k: K,
            qx: std::ptr::null(),
            dx: std::ptr::null(),
            offsets: std::ptr::null(),
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
    /// Only on a CPU with AVX-512F and AVX-512BW, with `x` holding `[rows, k]` values.
    pub unsafe fn prepared<T>(mut self, f: impl FnOnce(&Q8Packed) -> T) -> T {
        QUANTIZED.with_borrow_mut(|(qx, dx, offsets)| {
            let (steps, blocks) = (self.k.div_ceil(STEP), self.blocks());
            qx.clear();
            qx.resize(self.rows * steps * STEP, 0);
            dx.clear();
            dx.resize(self.rows * steps * 16, 0.0);
            offsets.clear();
            offsets.resize(self.rows * blocks, 0);
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
                for (b, offset) in offsets[r * blocks..(r + 1) * blocks].iter_mut().enumerate() {
                    *offset = -128 * q[b * BLOCK..(b + 1) * BLOCK].iter().map(|&v| i32::from(v)).sum::<i32>();
                }
            }
            self.qx = qx.as_ptr();
            self.dx = dx.as_ptr();
            self.offsets = offsets.as_ptr();
            f(&self)
        })
    }

    /// Computes the output columns `cols` (weight rows), a range whose start is a multiple of
    /// [`GROUP`], for every row.
    ///
    /// # Safety
    ///
    /// See the module's docs.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn columns(&self, cols: Range<usize>) {
        for g in cols.start / GROUP..cols.end.div_ceil(GROUP) {
            let lanes = GROUP.min(self.n - g * GROUP);
            let mask: __mmask16 = if lanes == GROUP { u16::MAX } else { (1u16 << lanes) - 1 };
            // SAFETY: the caller's contract.
            unsafe {
                if self.rows == 1 {
                    self.decode(g, mask);
                } else {
                    let mut r = 0;
                    while r + ROWS <= self.rows {
                        self.rows_of::<ROWS>(g, r, mask);
                        r += ROWS;
                    }
                    match self.rows - r {
                        0 => {}
                        1 => self.rows_of::<1>(g, r, mask),
                        2 => self.rows_of::<2>(g, r, mask),
                        3 => self.rows_of::<3>(g, r, mask),
                        4 => self.rows_of::<4>(g, r, mask),
                        5 => self.rows_of::<5>(g, r, mask),
                        6 => self.rows_of::<6>(g, r, mask),
                        _ => self.rows_of::<7>(g, r, mask),
                    }
                }
            }
        }
    }

    /// The 4 activations `4s..4s + 4` of block `b` of row `r`, as one i32 in every lane.
    #[inline(always)]
    unsafe fn quad(&self, r: usize, b: usize, s: usize) -> __m512i {
        let steps = self.k.div_ceil(STEP);
        // SAFETY: row `r` holds `steps · 64` values, and block `b` lies inside them.
        unsafe {
            _mm512_set1_epi32(
                self.qx.add(r * steps * STEP + b * BLOCK + s * 4).cast::<i32>().read_unaligned(),
            )
        }
    }

    /// `dx · dw` of block `b` for row `r`, the 16 weight rows of group `g`.
    #[inline(always)]
    unsafe fn scale(&self, g: usize, r: usize, b: usize) -> __m512 {
        let (steps, blocks) = (self.k.div_ceil(STEP), self.blocks());
        // SAFETY: the group's scales and the row's block scale lie inside their buffers.
        unsafe {
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(
                self.w.add(g * L::group_bytes(blocks) + L::scales_at(b)).cast(),
            ));
            _mm512_mul_ps(dw, _mm512_set1_ps(*self.dx.add(r * steps * 16 + b * 8)))
        }
    }

    /// One decode row over group `g`: two blocks side by side, in two chains, with the weights
    /// asked for [`AHEAD`] bytes early.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn decode(&self, g: usize, mask: __mmask16) {
        let blocks = self.blocks();
        // SAFETY: group `g`'s blocks lie inside the packed weights; prefetches never fault.
        unsafe {
            let base = self.w.add(g * L::group_bytes(blocks));
            let (mut sum0, mut sum1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            let mut b = 0;
            while b + 2 <= blocks {
                let w = base.add(block_at(b, blocks));
                for line in (0..2 * BLOCK_BYTES).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(w.add(AHEAD + line).cast());
                }
                let mut a0 = _mm512_set1_epi32(*self.offsets.add(b));
                let mut a1 = _mm512_set1_epi32(*self.offsets.add(b + 1));
                for s in 0..8 {
                    let w0 = _mm512_loadu_si512(w.add(s * 64).cast());
                    let w1 = _mm512_loadu_si512(w.add(BLOCK_BYTES + s * 64).cast());
                    a0 = _mm512_dpbusd_epi32(a0, w0, self.quad(0, b, s));
                    a1 = _mm512_dpbusd_epi32(a1, w1, self.quad(0, b + 1, s));
                }
                sum0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0), self.scale(g, 0, b), sum0);
                sum1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1), self.scale(g, 0, b + 1), sum1);
                b += 2;
            }
            if b < blocks {
                let w = base.add(block_at(b, blocks));
                let mut a0 = _mm512_set1_epi32(*self.offsets.add(b));
                for s in 0..8 {
                    a0 =
                        _mm512_dpbusd_epi32(a0, _mm512_loadu_si512(w.add(s * 64).cast()), self.quad(0, b, s));
                }
                sum0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0), self.scale(g, 0, b), sum0);
            }
            _mm512_mask_storeu_ps(self.out.add(g * GROUP), mask, _mm512_add_ps(sum0, sum1));
        }
    }

    /// `R` activation rows from `first` over group `g`, each weight vector loaded once for
    /// all of them.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn rows_of<const R: usize>(&self, g: usize, first: usize, mask: __mmask16) {
        let blocks = self.blocks();
        // SAFETY: group `g`'s blocks lie inside the packed weights, rows `first..first + R`
        // inside the activations and the output.
        unsafe {
            let base = self.w.add(g * L::group_bytes(blocks));
            let mut sums = [_mm512_setzero_ps(); R];
            for b in 0..blocks {
                let w = base.add(block_at(b, blocks));
                let mut acc: [__m512i; R] =
                    std::array::from_fn(|i| _mm512_set1_epi32(*self.offsets.add((first + i) * blocks + b)));
                for s in 0..8 {
                    let weights = _mm512_loadu_si512(w.add(s * 64).cast());
                    for i in 0..R {
                        acc[i] = _mm512_dpbusd_epi32(acc[i], weights, self.quad(first + i, b, s));
                    }
                }
                for i in 0..R {
                    sums[i] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i]), self.scale(g, first + i, b), sums[i]);
                }
            }
            for i in 0..R {
                _mm512_mask_storeu_ps(self.out.add((first + i) * self.n + g * GROUP), mask, sums[i]);
            }
        }
    }
}

/// A product as a team shares it, by groups of [`GROUP`] weight rows.
impl Job for Q8Packed {
    fn extent(&self) -> Extent {
        Extent::product(self.rows, self.n, self.k, GROUP)
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract, which `team::run` keeps.
        unsafe { self.columns(cols) }
    }
}
