//! The AVX-512 VNNI matrix product with blockwise int8 weights that the `matmul_q8`
//! implementations share, computed over a range of weight rows (output columns) so that
//! threads can share a call.
//!
//! [`Q8Product::prepared`] first quantizes the activations, once per call, into buffers of the
//! calling thread: each row's int8 values, padded with zeros to a multiple of 64, and its
//! block scales, each pair of them spread over the 16 lanes of a vector (8 lanes each) so
//! that they line up with the sums below.
//!
//! A step along K takes 64 values: one load of 64 weights, and per activation row one
//! `vpdpbusd`, which adds 4 products of unsigned by signed bytes into each of 16 i32 lanes
//! (lanes 0–7 hold the first block of 32, lanes 8–15 the second). The activations are signed,
//! so the row's magnitudes |qx| are the unsigned operand and the weights take the row's signs
//! (negated, with a mask, where qx is negative): |qx| · ±w = qx · w. Each lane's sum becomes
//! f32 and is multiplied into its accumulator by dx · dw of its block. At the end of K, the
//! 16 lanes of each accumulator are added.
//!
//! A tile holds 4 activation rows × 4 weight rows (1 × 8 for a lone row, a decode step); the
//! 4 weight rows stay in L1 while every tile of rows passes over them, so each weight is read
//! from memory once per call. The last step of a row whose K is not a multiple of 64 loads
//! its weights and scales with masks.
//!
//! # Safety
//!
//! [`Q8Product::columns`] may be called only on a CPU with AVX-512F, AVX-512BW and AVX-512
//! VNNI, from inside [`Q8Product::prepared`], with pointers that hold `[n, k]` weights, their
//! `[n, ⌈k/32⌉]` scales and `[rows, n]` outputs, and never twice at once on overlapping column
//! ranges of the same `out`.
#![allow(dead_code, clippy::missing_safety_doc, clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

/// Values of K that share one scale.
pub const BLOCK: usize = 32;

/// Values of K per step: the bytes of one AVX-512 register, two blocks.
const STEP: usize = 64;

thread_local! {
    /// The quantized activations of the calling thread's current product: the values
    /// (`[rows, k padded to 64]`) and the spread scales (`[rows, steps, 16]`).
    static QUANTIZED: RefCell<(Vec<i8>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// One call's operands: `out[r, j]` for `r < rows`, `j < n`, from `x: [rows, k]` and the
/// weights `w: [n, k]` with their `scales: [n, ⌈k/32⌉]`.
#[derive(Clone, Copy)]
pub struct Q8Product {
    pub out: *mut f32,
    pub x: *const f32,
    pub w: *const i8,
    pub scales: *const f32,
    pub rows: usize,
    pub n: usize,
    pub k: usize,
    /// The quantized activations, `[rows, steps · 64]`, once `prepared` has written them.
    pub qx: *const i8,
    /// Their scales, `[rows, steps, 16]`: lanes 0–7 the first block of a step, 8–15 the second.
    pub dx: *const f32,
}

// SAFETY: a product is only pointers to buffers that its caller keeps alive and shares out
// by disjoint column ranges until every thread is done (see the module's safety section).
unsafe impl Send for Q8Product {}
unsafe impl Sync for Q8Product {}

impl Q8Product {
    /// The product of `rows` rows over `[N, K]` weights, with the slices' lengths checked.
    #[inline]
    pub fn new<const N: usize, const K: usize>(
        out: &mut [f32],
        x: &[f32],
        w: &[i8],
        scales: &[f32],
        rows: usize,
    ) -> Q8Product {
        let blocks = K.div_ceil(BLOCK);
        assert!(x.len() >= rows * K, "matmul_q8: x is shorter than {rows} rows of {K}");
        assert!(w.len() >= N * K, "matmul_q8: w is shorter than {N} rows of {K}");
        assert!(scales.len() >= N * blocks, "matmul_q8: scales is shorter than {N} rows of {blocks}");
        assert!(out.len() >= rows * N, "matmul_q8: out is shorter than {rows} rows of {N}");
        Q8Product {
            out: out.as_mut_ptr(),
            x: x.as_ptr(),
            w: w.as_ptr(),
            scales: scales.as_ptr(),
            rows,
            n: N,
            k: K,
            qx: std::ptr::null(),
            dx: std::ptr::null(),
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
    pub unsafe fn prepared<T>(mut self, f: impl FnOnce(&Q8Product) -> T) -> T {
        QUANTIZED.with_borrow_mut(|(qx, dx)| {
            let steps = self.steps();
            qx.clear();
            qx.resize(self.rows * steps * STEP, 0);
            dx.clear();
            dx.resize(self.rows * steps * 16, 0.0);
            for r in 0..self.rows {
                // SAFETY: row `r` of x holds k values (the caller's contract), and the rows of
                // the buffers have the sizes `quantize_row` writes.
                unsafe {
                    quantize_row(
                        std::slice::from_raw_parts(self.x.add(r * self.k), self.k),
                        &mut qx[r * steps * STEP..(r + 1) * steps * STEP],
                        &mut dx[r * steps * 16..(r + 1) * steps * 16],
                    )
                };
            }
            self.qx = qx.as_ptr();
            self.dx = dx.as_ptr();
            f(&self)
        })
    }

    /// Computes the columns `cols` (weight rows) of every row of `out`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn columns(&self, cols: Range<usize>) {
        let mut j = cols.start;
        if self.rows == 1 {
            while j + 8 <= cols.end {
                // SAFETY: the columns and the row are in range (the caller's contract).
                unsafe { self.tile::<1, 8>(0, j) };
                j += 8;
            }
        }
        while j + 4 <= cols.end {
            // SAFETY: as above.
            unsafe { self.all_rows::<4>(j) };
            j += 4;
        }
        while j < cols.end {
            // SAFETY: as above.
            unsafe { self.all_rows::<1>(j) };
            j += 1;
        }
    }

    /// Columns `j..j + C` of every row: 4-row tiles, then one smaller tile for the rest.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn all_rows<const C: usize>(&self, j: usize) {
        let mut r = 0;
        while r + 4 <= self.rows {
            // SAFETY: rows `r..r + 4` and the columns are in range.
            unsafe { self.tile::<4, C>(r, j) };
            r += 4;
        }
        // SAFETY: as above, for the rows that are left.
        match self.rows - r {
            3 => unsafe { self.tile::<3, C>(r, j) },
            2 => unsafe { self.tile::<2, C>(r, j) },
            1 => unsafe { self.tile::<1, C>(r, j) },
            _ => {}
        }
    }

    /// The `R × C` block of `out` at row `r`, column `j`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn tile<const R: usize, const C: usize>(&self, r: usize, j: usize) {
        let (k, steps) = (self.k, self.steps());
        let blocks = k.div_ceil(BLOCK);
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        // SAFETY (every pointer below): rows `r..r + R` of the quantized activations hold
        // `steps` steps, weight rows `j..j + C` hold `k` values and `blocks` scales, and the
        // last step's loads are masked to the end of the row.
        let qx: [*const i8; R] = std::array::from_fn(|i| unsafe { self.qx.add((r + i) * steps * STEP) });
        let dx: [*const f32; R] = std::array::from_fn(|i| unsafe { self.dx.add((r + i) * steps * 16) });
        let ws: [*const i8; C] = std::array::from_fn(|c| unsafe { self.w.add((j + c) * k) });
        let ss: [*const f32; C] = std::array::from_fn(|c| unsafe { self.scales.add((j + c) * blocks) });
        for s in 0..steps {
            let at = s * STEP;
            let left = k - at;
            let mut magnitude = [_mm512_setzero_si512(); R];
            let mut negative = [0 as __mmask64; R];
            for i in 0..R {
                let q = unsafe { _mm512_loadu_si512(qx[i].add(at).cast()) };
                negative[i] = _mm512_movepi8_mask(q);
                magnitude[i] = _mm512_abs_epi8(q);
            }
            for c in 0..C {
                let (wv, dw) = if left >= STEP {
                    let w = unsafe { _mm512_loadu_si512(ws[c].add(at).cast()) };
                    let d = unsafe {
                        _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(*ss[c].add(2 * s)), _mm512_set1_ps(*ss[c].add(2 * s + 1)))
                    };
                    (w, d)
                } else {
                    let w = unsafe { _mm512_maskz_loadu_epi8(u64::MAX >> (STEP - left), ws[c].add(at)) };
                    let second = if left > BLOCK { unsafe { *ss[c].add(2 * s + 1) } } else { 0.0 };
                    let d = unsafe { _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(*ss[c].add(2 * s)), _mm512_set1_ps(second)) };
                    (w, d)
                };
                for i in 0..R {
                    let signed = _mm512_mask_sub_epi8(wv, negative[i], _mm512_setzero_si512(), wv);
                    let sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), magnitude[i], signed);
                    let scale = _mm512_mul_ps(dw, unsafe { _mm512_loadu_ps(dx[i].add(s * 16)) });
                    acc[i][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scale, acc[i][c]);
                }
            }
        }
        for i in 0..R {
            for c in 0..C {
                // SAFETY: row `r + i`, column `j + c` of `out` is in range and in this
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
fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32]) {
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
        let scale = amax / 127.0;
        d[b * 8..(b + 1) * 8].fill(scale);
    }
}

/// A mask of the first `len` (≤ 16) lanes.
fn mask16(len: usize) -> __mmask16 {
    if len >= 16 { u16::MAX } else { (1u16 << len) - 1 }
}
