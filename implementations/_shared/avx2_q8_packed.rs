//! The AVX2 matrix product over blockwise int8 weights packed once, at load, so that each
//! thread reads its share of the weights as one stream, front to back: the layout of
//! `avx512_q8_packed.rs` at half the width, for CPUs without AVX-512 VNNI (x86-64-v3).
//!
//! # The layout ([`pack`])
//!
//! `q8_packed.rs`'s, in groups of 8 weight rows (a block's vector `s`, 32 bytes, holds values
//! `4s..4s + 4` of the block for the 8 rows), as signed bytes: `vpmaddubsw` would saturate on
//! bytes offset by 128, as the AVX-512 layout stores them for `vpdpbusd`.
//!
//! # The product
//!
//! Each row of the activations is quantized once per call, by the calling thread, as
//! `matmul_q8` defines it (`avx2_q8::quantize_row`), and its magnitudes |qx| kept beside it.
//! Without VNNI a step takes three instructions per activation row: `vpsignb` moves the signs
//! of 4 activations, broadcast to every lane, onto the 8 rows' 4 weights; `vpmaddubsw`
//! multiplies the activations' magnitudes (unsigned) by those and adds pairs into 16 bits (at
//! most 2 · 127 · 127, which cannot saturate); `vpmaddwd` by ones adds the pairs into each
//! lane's exact 32-bit sum of 4 products. At the end of a block, the lanes become f32 and are
//! multiplied into the row's accumulators by `dx · dw`. Nothing is reduced across lanes, and
//! the 8 results of a group are stored as one vector.
//!
//! - **A decode step** (one row) runs two blocks side by side, in two chains.
//! - **A prefill** passes up to [`ROWS`] activation rows at a time over a group's weights,
//!   each weight vector loaded once for all of them.
//!
//! # Safety
//!
//! [`Q8Packed::columns`] may be called only on a CPU with AVX2, FMA and F16C, from inside
//! [`Q8Packed::prepared`], with a pointer to `[n, k]` weights as [`pack`] wrote them and one to
//! `[rows, n]` outputs. It must never run twice at once on overlapping column ranges of the
//! same `out`.
#![allow(dead_code, clippy::missing_safety_doc, clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::avx2_math::lane_mask;
use super::avx2_q8::{BLOCK, quantize_row};
use super::q8_packed::Layout;

/// Weight rows per group: the lanes of a vector of i32.
pub const GROUP: usize = 8;

/// The packed layout, in groups of 8 rows.
type L = Layout<GROUP>;

/// Bytes of one block of a group: 8 rows of 32 values.
const BLOCK_BYTES: usize = L::BLOCK_BYTES;

/// Offset of block `b`'s values in a group of `blocks` blocks.
const fn block_at(b: usize, blocks: usize) -> usize {
    L::block_at(b, blocks)
}

/// Most activation rows that pass over a group's weights at once: each takes an i32 and an f32
/// accumulator, which with the weights and the step's temporaries fill the 16 registers.
pub const ROWS: usize = 4;

/// Bytes ahead of the one it reads that a decode step asks for: as far as
/// `avx2_bf16_packed.rs` asks (in the weights bench, 2048 to 10240 bytes read alike).
const AHEAD: usize = 6 << 10;

thread_local! {
    /// The quantized activations of the calling thread's current product: the values and
    /// their magnitudes (`[rows, blocks · 32]` each) and the block scales (`[rows, blocks]`).
    static QUANTIZED: RefCell<(Vec<i8>, Vec<i8>, Vec<f32>)> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// Bytes of the packed form of `[n, k]` weights: `n` rounded up to a multiple of 8 by `k`
/// rounded up to a multiple of 32, and each group's lines of scales.
pub const fn packed_len(n: usize, k: usize) -> usize {
    L::packed_len(n, k)
}

/// The `[n, k]` int8 weights `w` (values in −127..=127) and their `[n, ⌈k/32⌉]` binary16 scales
/// in the packed layout (see the module's docs): [`packed_len`] bytes.
pub fn pack(w: &[i8], scales: &[f32], n: usize, k: usize) -> Vec<i8> {
    L::pack(w, scales, n, k, false)
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
    /// The packed values and scales, as [`pack`] wrote them.
    pub w: *const i8,
    pub rows: usize,
    pub n: usize,
    pub k: usize,
    /// The quantized activations, `[rows, blocks · 32]`, once `prepared` has written them.
    pub qx: *const i8,
    /// Their magnitudes |qx|, laid out alike.
    pub magnitudes: *const i8,
    /// Their scales, `[rows, blocks]`.
    pub dx: *const f32,
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
        assert!(x.len() >= rows * K, "matmul_q8: x is shorter than {rows} rows of {K}");
        assert!(w.len() == packed_len(N, K), "matmul_q8: w is not {N} × {K} weights packed by `pack`");
        assert!(scales.is_empty(), "matmul_q8: the packed weights hold their scales; `scales` is empty");
        assert!(out.len() >= rows * N, "matmul_q8: out is shorter than {rows} rows of {N}");
        Q8Packed {
            out: out.as_mut_ptr(),
            x: x.as_ptr(),
            w: w.as_ptr(),
            rows,
            n: N,
            k: K,
            qx: std::ptr::null(),
            magnitudes: std::ptr::null(),
            dx: std::ptr::null(),
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
    pub unsafe fn prepared<T>(mut self, f: impl FnOnce(&Q8Packed) -> T) -> T {
        QUANTIZED.with_borrow_mut(|(qx, magnitudes, dx)| {
            let blocks = self.blocks();
            let len = self.rows * blocks * BLOCK;
            qx.clear();
            qx.resize(len, 0);
            dx.clear();
            dx.resize(self.rows * blocks, 0.0);
            for r in 0..self.rows {
                // SAFETY: row `r` of x holds k values (the caller's contract), and the rows of
                // the buffers have the sizes `quantize_row` writes.
                unsafe {
                    quantize_row(
                        std::slice::from_raw_parts(self.x.add(r * self.k), self.k),
                        &mut qx[r * blocks * BLOCK..(r + 1) * blocks * BLOCK],
                        &mut dx[r * blocks..(r + 1) * blocks],
                    )
                };
            }
            magnitudes.clear();
            magnitudes.extend(qx.iter().map(|&q| q.unsigned_abs() as i8));
            self.qx = qx.as_ptr();
            self.magnitudes = magnitudes.as_ptr();
            self.dx = dx.as_ptr();
            f(&self)
        })
    }

    /// Computes the output columns `cols` (weight rows), a range whose start is a multiple of
    /// [`GROUP`], for every row.
    ///
    /// # Safety
    ///
    /// See the module's docs.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn columns(&self, cols: Range<usize>) {
        for g in cols.start / GROUP..cols.end.div_ceil(GROUP) {
            let lanes = GROUP.min(self.n - g * GROUP);
            // SAFETY: the caller's contract.
            unsafe {
                if self.rows == 1 {
                    self.decode(g, lanes);
                } else {
                    let mut r = 0;
                    while r + ROWS <= self.rows {
                        self.rows_of::<ROWS>(g, r, lanes);
                        r += ROWS;
                    }
                    match self.rows - r {
                        0 => {}
                        1 => self.rows_of::<1>(g, r, lanes),
                        2 => self.rows_of::<2>(g, r, lanes),
                        _ => self.rows_of::<3>(g, r, lanes),
                    }
                }
            }
        }
    }

    /// The 8 rows' sums of the 4 products of step `s` of block `b`: weights `w` (that step's
    /// vector) by the activations `4s..4s + 4` of the block in row `r`, one i32 per lane.
    #[inline(always)]
    unsafe fn step(&self, w: __m256i, r: usize, b: usize, s: usize) -> __m256i {
        let at = (r * self.blocks() + b) * BLOCK + s * 4;
        // SAFETY: row `r` holds whole blocks, and block `b` lies inside them.
        let (signs, magnitudes) = unsafe {
            (
                _mm256_set1_epi32(self.qx.add(at).cast::<i32>().read_unaligned()),
                _mm256_set1_epi32(self.magnitudes.add(at).cast::<i32>().read_unaligned()),
            )
        };
        // SAFETY: the caller's CPU has AVX2 (the module's safety section).
        unsafe {
            let pairs = _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(w, signs));
            _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
        }
    }

    /// The 8 weight rows' scales of block `b` in the group at `base`.
    #[inline(always)]
    unsafe fn weight_scales(&self, base: *const i8, b: usize) -> __m256 {
        // SAFETY: the group's scales lie inside the packed weights.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(base.add(L::scales_at(b)).cast())) }
    }

    /// Activation row `r`'s scale of block `b`, in every lane.
    #[inline(always)]
    unsafe fn row_scale(&self, r: usize, b: usize) -> __m256 {
        // SAFETY: the row's block scales lie inside `dx`.
        unsafe { _mm256_set1_ps(*self.dx.add(r * self.blocks() + b)) }
    }

    /// Stores the 8 results `sums` of row `r` for group `g`, the first `lanes` of them.
    #[inline(always)]
    unsafe fn store(&self, r: usize, g: usize, lanes: usize, sums: __m256) {
        // SAFETY: the group's columns of row `r` lie inside `out` (`lanes` of them).
        unsafe {
            let at = self.out.add(r * self.n + g * GROUP);
            if lanes == GROUP {
                _mm256_storeu_ps(at, sums);
            } else {
                _mm256_maskstore_ps(at, lane_mask(lanes), sums);
            }
        }
    }

    /// One decode row over group `g`: two blocks side by side, in two chains, with the weights
    /// asked for [`AHEAD`] bytes early.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(&self, g: usize, lanes: usize) {
        let blocks = self.blocks();
        // SAFETY: group `g`'s blocks lie inside the packed weights; prefetches never fault.
        unsafe {
            let base = self.w.add(g * L::group_bytes(blocks));
            let (mut sum0, mut sum1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut b = 0;
            while b + 2 <= blocks {
                let w = base.add(block_at(b, blocks));
                for line in (0..2 * BLOCK_BYTES).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(AHEAD + line).cast());
                }
                let (mut a0, mut a1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for s in 0..8 {
                    let w0 = _mm256_loadu_si256(w.add(s * 32).cast());
                    let w1 = _mm256_loadu_si256(w.add(BLOCK_BYTES + s * 32).cast());
                    a0 = _mm256_add_epi32(a0, self.step(w0, 0, b, s));
                    a1 = _mm256_add_epi32(a1, self.step(w1, 0, b + 1, s));
                }
                let d0 = _mm256_mul_ps(self.weight_scales(base, b), self.row_scale(0, b));
                let d1 = _mm256_mul_ps(self.weight_scales(base, b + 1), self.row_scale(0, b + 1));
                sum0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0), d0, sum0);
                sum1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a1), d1, sum1);
                b += 2;
            }
            if b < blocks {
                let w = base.add(block_at(b, blocks));
                let mut a0 = _mm256_setzero_si256();
                for s in 0..8 {
                    a0 = _mm256_add_epi32(a0, self.step(_mm256_loadu_si256(w.add(s * 32).cast()), 0, b, s));
                }
                let d0 = _mm256_mul_ps(self.weight_scales(base, b), self.row_scale(0, b));
                sum0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0), d0, sum0);
            }
            self.store(0, g, lanes, _mm256_add_ps(sum0, sum1));
        }
    }

    /// `R` activation rows from `first` over group `g`, each weight vector loaded once for
    /// all of them.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn rows_of<const R: usize>(&self, g: usize, first: usize, lanes: usize) {
        let blocks = self.blocks();
        // SAFETY: group `g`'s blocks lie inside the packed weights, rows `first..first + R`
        // inside the activations and the output.
        unsafe {
            let base = self.w.add(g * L::group_bytes(blocks));
            let mut sums = [_mm256_setzero_ps(); R];
            for b in 0..blocks {
                let w = base.add(block_at(b, blocks));
                let mut acc = [_mm256_setzero_si256(); R];
                for s in 0..8 {
                    let weights = _mm256_loadu_si256(w.add(s * 32).cast());
                    for i in 0..R {
                        acc[i] = _mm256_add_epi32(acc[i], self.step(weights, first + i, b, s));
                    }
                }
                let dw = self.weight_scales(base, b);
                for i in 0..R {
                    let d = _mm256_mul_ps(dw, self.row_scale(first + i, b));
                    sums[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i]), d, sums[i]);
                }
            }
            for i in 0..R {
                self.store(first + i, g, lanes, sums[i]);
            }
        }
    }
}
