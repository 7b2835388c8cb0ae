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
//! `matmul<q8>` defines it (`avx2_q8::quantize_row`), and kept beside it as unsigned bytes: its
//! magnitudes |qx|, or with AVX-VNNI `qx + 128`.
//!
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
//! With AVX-VNNI ([`Q8Packed::columns_vnni`]) a step is one `vpdpbusd` per activation row, of
//! the activations offset by 128 (unsigned bytes) by the signed weights, and one more per step
//! for all the rows, of ones by the weights: each block's sums then lose 128 times the weights'
//! sum.
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
use super::job::{Extent, Job};
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
/// accumulator. In the weights bench, 6 rather than 4 took a 128-row prefill from 347 to 359
/// GFLOP/s with AVX2 alone and from 477 to 604 with AVX-VNNI.
pub const ROWS: usize = 6;

/// Bytes ahead of the one it reads that a decode step asks for, as far as `avx2_bf16_packed.rs`
/// asks. In the weights bench (stories110M's matrices, 2 threads), a decode took 1.93-2.0 ms
/// asking 2048 bytes ahead, 1.68 ms at 4096 and 1.52-1.58 ms at 6144; further made no
/// difference that the bench could tell.
const AHEAD: usize = 6 << 10;

thread_local! {
    /// The quantized activations of the calling thread's current product: the values and the
    /// same as unsigned bytes (`[rows, blocks · 32]` each; see [`Q8Packed::unsigned`]) and the
    /// block scales (`[rows, blocks]`).
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
    /// The same as unsigned bytes, laid out alike: their magnitudes |qx| for the AVX2 step, or
    /// `qx + 128` for AVX-VNNI's (`vnni`).
    pub unsigned: *const i8,
    /// Their scales, `[rows, blocks]`.
    pub dx: *const f32,
    /// Whether the product runs with AVX-VNNI ([`Q8Packed::with_vnni`]).
    pub vnni: bool,
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
            w: w.as_ptr(),
            rows,
            n: N,
            k: K,
            qx: std::ptr::null(),
            unsigned: std::ptr::null(),
            dx: std::ptr::null(),
            vnni: false,
        }
    }

    /// Blocks of 32 along K.
    fn blocks(&self) -> usize {
        self.k.div_ceil(BLOCK)
    }

    /// The product for [`Q8Packed::columns_vnni`], which reads the activations offset by 128.
    pub fn with_vnni(self) -> Q8Packed {
        Q8Packed { vnni: true, ..self }
    }

    /// Quantizes the activations into this thread's buffers (alive until `f` returns), then
    /// runs `f` on the product.
    ///
    /// # Safety
    ///
    /// Only on a CPU with AVX2 and FMA, with `x` holding `[rows, k]` values.
    pub unsafe fn prepared<T>(mut self, f: impl FnOnce(&Q8Packed) -> T) -> T {
        QUANTIZED.with_borrow_mut(|(qx, unsigned, dx)| {
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
            unsigned.clear();
            if self.vnni {
                // Plus 128: the sign bit flipped.
                unsigned.extend(qx.iter().map(|&q| q ^ i8::MIN));
            } else {
                unsigned.extend(qx.iter().map(|&q| q.unsigned_abs() as i8));
            }
            self.qx = qx.as_ptr();
            self.unsigned = unsigned.as_ptr();
            self.dx = dx.as_ptr();
            f(&self)
        })
    }

    /// Computes the output columns `cols` (weight rows), a range whose start is a multiple of
    /// [`GROUP`], for every row, with AVX2 alone.
    ///
    /// # Safety
    ///
    /// See the module's docs.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract.
        unsafe { self.columns_with::<Maddubs>(cols) }
    }

    /// [`Q8Packed::columns`] with AVX-VNNI's `vpdpbusd`.
    ///
    /// # Safety
    ///
    /// See the module's docs; the CPU also has AVX-VNNI.
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    pub unsafe fn columns_vnni(&self, cols: Range<usize>) {
        debug_assert!(self.vnni, "columns_vnni: the product was prepared without `with_vnni`");
        // SAFETY: the caller's contract.
        unsafe { self.columns_with::<Vnni>(cols) }
    }

    /// The columns `cols`, each step's products added with `D`: inlined into the caller, whose
    /// CPU features it uses.
    #[inline(always)]
    unsafe fn columns_with<D: Dot>(&self, cols: Range<usize>) {
        for g in cols.start / GROUP..cols.end.div_ceil(GROUP) {
            let lanes = GROUP.min(self.n - g * GROUP);
            // SAFETY: the caller's contract.
            unsafe {
                if self.rows == 1 {
                    self.decode::<D>(g, lanes);
                } else {
                    let mut r = 0;
                    while r + ROWS <= self.rows {
                        self.rows_of::<D, ROWS>(g, r, lanes);
                        r += ROWS;
                    }
                    match self.rows - r {
                        0 => {}
                        1 => self.rows_of::<D, 1>(g, r, lanes),
                        2 => self.rows_of::<D, 2>(g, r, lanes),
                        3 => self.rows_of::<D, 3>(g, r, lanes),
                        4 => self.rows_of::<D, 4>(g, r, lanes),
                        _ => self.rows_of::<D, 5>(g, r, lanes),
                    }
                }
            }
        }
    }

    /// `acc` plus the 8 rows' sums of the 4 products of step `s` of block `b`: weights `w`
    /// (that step's vector) by the activations `4s..4s + 4` of the block in row `r` (offset by
    /// 128 with AVX-VNNI: see [`Dot::finish`]).
    #[inline(always)]
    unsafe fn step<D: Dot>(&self, acc: __m256i, w: __m256i, r: usize, b: usize, s: usize) -> __m256i {
        let at = (r * self.blocks() + b) * BLOCK + s * 4;
        // SAFETY: row `r` holds whole blocks, and block `b` lies inside them; the caller's CPU
        // has what `D` uses.
        unsafe {
            let quad = |x: *const i8| _mm256_set1_epi32(x.add(at).cast::<i32>().read_unaligned());
            D::add(acc, w, quad(self.unsigned), || quad(self.qx))
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
    #[inline(always)]
    unsafe fn decode<D: Dot>(&self, g: usize, lanes: usize) {
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
                let (mut sums0, mut sums1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for s in 0..8 {
                    let w0 = _mm256_loadu_si256(w.add(s * 32).cast());
                    let w1 = _mm256_loadu_si256(w.add(BLOCK_BYTES + s * 32).cast());
                    (a0, sums0) = (self.step::<D>(a0, w0, 0, b, s), D::weight_sums(sums0, w0));
                    (a1, sums1) = (self.step::<D>(a1, w1, 0, b + 1, s), D::weight_sums(sums1, w1));
                }
                (a0, a1) = (D::finish(a0, sums0), D::finish(a1, sums1));
                let d0 = _mm256_mul_ps(self.weight_scales(base, b), self.row_scale(0, b));
                let d1 = _mm256_mul_ps(self.weight_scales(base, b + 1), self.row_scale(0, b + 1));
                sum0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0), d0, sum0);
                sum1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a1), d1, sum1);
                b += 2;
            }
            if b < blocks {
                let w = base.add(block_at(b, blocks));
                let (mut a0, mut sums0) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for s in 0..8 {
                    let w0 = _mm256_loadu_si256(w.add(s * 32).cast());
                    (a0, sums0) = (self.step::<D>(a0, w0, 0, b, s), D::weight_sums(sums0, w0));
                }
                a0 = D::finish(a0, sums0);
                let d0 = _mm256_mul_ps(self.weight_scales(base, b), self.row_scale(0, b));
                sum0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0), d0, sum0);
            }
            self.store(0, g, lanes, _mm256_add_ps(sum0, sum1));
        }
    }

    /// `R` activation rows from `first` over group `g`, each weight vector loaded once for
    /// all of them.
    #[inline(always)]
    unsafe fn rows_of<D: Dot, const R: usize>(&self, g: usize, first: usize, lanes: usize) {
        let blocks = self.blocks();
        // SAFETY: group `g`'s blocks lie inside the packed weights, rows `first..first + R`
        // inside the activations and the output.
        unsafe {
            let base = self.w.add(g * L::group_bytes(blocks));
            let mut sums = [_mm256_setzero_ps(); R];
            for b in 0..blocks {
                let w = base.add(block_at(b, blocks));
                let mut acc = [_mm256_setzero_si256(); R];
                let mut weight_sums = _mm256_setzero_si256();
                for s in 0..8 {
                    let weights = _mm256_loadu_si256(w.add(s * 32).cast());
                    weight_sums = D::weight_sums(weight_sums, weights);
                    for i in 0..R {
                        acc[i] = self.step::<D>(acc[i], weights, first + i, b, s);
                    }
                }
                for i in 0..R {
                    acc[i] = D::finish(acc[i], weight_sums);
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

/// How a step multiplies 4 activations of a row, broadcast to every lane, by 4 signed weights
/// of each lane's row, and adds the products into the lane's 32-bit sum of the block.
trait Dot {
    /// `acc` plus, in each lane, the step's 4 products: `weights` by the activations as unsigned
    /// bytes (`unsigned`, broadcast) and as signed ones (`signed()`, if needed).
    ///
    /// # Safety
    ///
    /// The CPU has the instructions the implementation uses; inlined, it runs with its
    /// caller's features.
    unsafe fn add(acc: __m256i, weights: __m256i, unsigned: __m256i, signed: impl Fn() -> __m256i)
    -> __m256i;

    /// `sums` plus each lane's 4 weights, where [`Dot::finish`] needs them (else `sums`).
    ///
    /// # Safety
    ///
    /// As for [`Dot::add`].
    unsafe fn weight_sums(sums: __m256i, weights: __m256i) -> __m256i;

    /// A block's sums `acc` as the interface's, given its `weight_sums`.
    ///
    /// # Safety
    ///
    /// As for [`Dot::add`].
    unsafe fn finish(acc: __m256i, weight_sums: __m256i) -> __m256i;
}

/// AVX2 alone, from the activations' magnitudes: `vpsignb` moves the activations' signs onto
/// the weights, `vpmaddubsw` multiplies and adds pairs into 16 bits (at most 2 · 127 · 127,
/// which cannot saturate, where offset activations could), `vpmaddwd` by ones adds them into
/// 32 bits, then `vpaddd`.
struct Maddubs;

impl Dot for Maddubs {
    #[inline(always)]
    unsafe fn add(
        acc: __m256i,
        weights: __m256i,
        unsigned: __m256i,
        signed: impl Fn() -> __m256i,
    ) -> __m256i {
        // SAFETY: the caller's CPU has AVX2.
        unsafe {
            let pairs = _mm256_maddubs_epi16(unsigned, _mm256_sign_epi8(weights, signed()));
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }

    #[inline(always)]
    unsafe fn weight_sums(sums: __m256i, _: __m256i) -> __m256i {
        sums
    }

    #[inline(always)]
    unsafe fn finish(acc: __m256i, _: __m256i) -> __m256i {
        acc
    }
}

/// AVX-VNNI, from the activations offset by 128: one `vpdpbusd` per row adds the 4 products
/// into the lane in 32 bits, each sum `Σ (qx + 128) · w`; one more per step, of ones by the
/// weights, gives the `Σ w` whose 128 times `finish` takes off.
struct Vnni;

impl Dot for Vnni {
    #[inline(always)]
    unsafe fn add(acc: __m256i, weights: __m256i, unsigned: __m256i, _: impl Fn() -> __m256i) -> __m256i {
        // SAFETY: the caller's CPU has AVX-VNNI.
        unsafe { _mm256_dpbusd_avx_epi32(acc, unsigned, weights) }
    }

    #[inline(always)]
    unsafe fn weight_sums(sums: __m256i, weights: __m256i) -> __m256i {
        // SAFETY: the caller's CPU has AVX-VNNI.
        unsafe { _mm256_dpbusd_avx_epi32(sums, _mm256_set1_epi8(1), weights) }
    }

    #[inline(always)]
    unsafe fn finish(acc: __m256i, weight_sums: __m256i) -> __m256i {
        // SAFETY: the caller's CPU has AVX2.
        unsafe { _mm256_sub_epi32(acc, _mm256_slli_epi32::<7>(weight_sums)) }
    }
}

/// A product as a team shares it, by groups of [`GROUP`] weight rows, with AVX2 alone: a
/// product prepared [`Q8Packed::with_vnni`] holds its activations for `vpdpbusd`, and its kernel
/// hands the team a job of its own, which calls [`Q8Packed::columns_vnni`].
impl Job for Q8Packed {
    fn extent(&self) -> Extent {
        Extent::product(self.rows, self.n, self.k, GROUP)
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        debug_assert!(!self.vnni, "Q8Packed: a product prepared with_vnni is shared by its kernel's own job");
        // SAFETY: the caller's contract, which `team::run` keeps.
        unsafe { self.columns(cols) }
    }
}
