//! The AVX-512 matrix product `out = x · wᵀ` that the AVX-512 matmul implementations share,
//! computed over a range of weight rows (output columns) so that threads can share a call.
//!
//! The weight rows are taken 8 at a time (4 when fewer are left, then 1), and every block of
//! activation rows passes over them while they are in L1, so each weight is read from memory
//! once however many rows there are. A tile holds 4 activation rows × 4 weight rows (1 × 8
//! for a lone row, a decode step): its 16 dot products are 16 accumulators of 16 lanes, and
//! every step of 16 along K loads 8 vectors for 16 fused multiply-adds, which keeps both FMA
//! units busy. At the end of K one transposing reduction tree turns the 16 accumulators into
//! one vector of the tile's 16 results. K that is not a multiple of 16 ends with masked loads;
//! rows left over after the 4-row tiles take 3-, 2- or 1-row tiles.
//!
//! The operands travel as raw pointers in a [`Product`], because the threads of one call
//! write interleaved parts of `out` (the same columns of every row): no two threads write the
//! same element, but their parts are not slices.
//!
//! # Safety
//!
//! [`Product::columns`] may be called only on a CPU with AVX-512F, with pointers that hold
//! `[rows, k]`, `[n, k]` and `[rows, n]` values, and never twice at once on overlapping
//! column ranges of the same `out`.
#![allow(dead_code, clippy::missing_safety_doc)]

use std::arch::x86_64::*;
use std::ops::Range;

/// The f32 lanes of an AVX-512 register.
const LANES: usize = 16;

/// One call's operands: `out[r, j] = Σₖ x[r, k] · w[j, k]` for `r < rows`, `j < n`.
#[derive(Clone, Copy)]
pub struct Product {
    pub out: *mut f32,
    pub x: *const f32,
    pub w: *const f32,
    pub rows: usize,
    pub n: usize,
    pub k: usize,
}

// SAFETY: a product is only pointers to buffers that its caller keeps alive and shares out
// by disjoint column ranges until every thread is done (see the module's safety section).
unsafe impl Send for Product {}
unsafe impl Sync for Product {}

impl Product {
    /// The product of `rows` rows over `[N, K]` weights, with the slices' lengths checked.
    #[inline]
    pub fn new<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[f32], rows: usize) -> Product {
        assert!(x.len() >= rows * K, "matmul: x is shorter than {rows} rows of {K}");
        assert!(w.len() >= N * K, "matmul: w is shorter than {N} rows of {K}");
        assert!(out.len() >= rows * N, "matmul: out is shorter than {rows} rows of {N}");
        Product { out: out.as_mut_ptr(), x: x.as_ptr(), w: w.as_ptr(), rows, n: N, k: K }
    }

    /// Computes the columns `cols` (weight rows) of every row of `out`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn columns(&self, cols: Range<usize>) {
        let mut j = cols.start;
        while j + 8 <= cols.end {
            if self.rows == 1 {
                // SAFETY: the columns and the row are in range (the caller's contract).
                unsafe { self.tile::<1, 8>(0, j, true) };
            } else {
                // SAFETY: as above.
                unsafe {
                    self.all_rows::<4>(j);
                    self.all_rows::<4>(j + 4);
                }
            }
            j += 8;
        }
        if j + 4 <= cols.end {
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

    /// Columns `j..j + C` of every row: 4-row tiles, then one smaller tile for the rest. The
    /// first tile also prefetches the weight rows 8 further on, which the next block needs.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn all_rows<const C: usize>(&self, j: usize) {
        let mut r = 0;
        while r + 4 <= self.rows {
            // SAFETY: rows `r..r + 4` and the columns are in range.
            unsafe { self.tile::<4, C>(r, j, r == 0) };
            r += 4;
        }
        // SAFETY: as above, for the rows that are left.
        match self.rows - r {
            3 => unsafe { self.tile::<3, C>(r, j, r == 0) },
            2 => unsafe { self.tile::<2, C>(r, j, r == 0) },
            1 => unsafe { self.tile::<1, C>(r, j, r == 0) },
            _ => {}
        }
    }

    /// The `R × C` block of `out` at row `r`, column `j` (`R · C ≤ 16`). With `prefetch`, each
    /// step along K also asks for the same cache line of the weight rows 8 further on: the
    /// hardware prefetcher alone leaves a block of rows waiting on memory when several
    /// activation rows share it.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile<const R: usize, const C: usize>(&self, r: usize, j: usize, prefetch: bool) {
        let k = self.k;
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        // SAFETY (every pointer below): rows `r..r + R` of x and `j..j + C` of w hold `k`
        // values each, and the loads read at most up to the end of a row.
        let xs: [*const f32; R] = std::array::from_fn(|i| unsafe { self.x.add((r + i) * k) });
        let ws: [*const f32; C] = std::array::from_fn(|c| unsafe { self.w.add((j + c) * k) });
        let mut at = 0;
        while at + LANES <= k {
            let mut xv = [_mm512_setzero_ps(); R];
            for i in 0..R {
                xv[i] = unsafe { _mm512_loadu_ps(xs[i].add(at)) };
            }
            for c in 0..C {
                let wv = unsafe { _mm512_loadu_ps(ws[c].add(at)) };
                for i in 0..R {
                    acc[i][c] = _mm512_fmadd_ps(xv[i], wv, acc[i][c]);
                }
            }
            if prefetch {
                for w in ws {
                    // A prefetch never faults, even past the end of the weights.
                    _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(8 * k + at).cast());
                }
            }
            at += LANES;
        }
        if at < k {
            let mask: __mmask16 = (1u16 << (k - at)) - 1;
            let mut xv = [_mm512_setzero_ps(); R];
            for i in 0..R {
                xv[i] = unsafe { _mm512_maskz_loadu_ps(mask, xs[i].add(at)) };
            }
            for c in 0..C {
                let wv = unsafe { _mm512_maskz_loadu_ps(mask, ws[c].add(at)) };
                for i in 0..R {
                    acc[i][c] = _mm512_fmadd_ps(xv[i], wv, acc[i][c]);
                }
            }
        }
        let mut flat = [_mm512_setzero_ps(); LANES];
        for i in 0..R {
            for c in 0..C {
                flat[i * C + c] = acc[i][c];
            }
        }
        let mut sums = [0.0f32; LANES];
        // SAFETY: `sums` holds 16 floats.
        unsafe { _mm512_storeu_ps(sums.as_mut_ptr(), sum16(flat)) };
        for i in 0..R {
            for c in 0..C {
                // SAFETY: row `r + i`, column `j + c` of `out` is in range and in this
                // thread's columns.
                unsafe { *self.out.add((r + i) * self.n + j + c) = sums[i * C + c] };
            }
        }
    }
}

/// The 16 horizontal sums of `v`, as one vector: lane `i` is the sum of `v[i]`'s lanes.
///
/// Three levels of a transposing tree (15 additions, against 64 for 16 separate
/// reductions): within each 128-bit lane, pairs and then quadruples of vectors are
/// interleaved and added, so that 4 vectors become one whose lane `4q + i` holds a partial
/// sum of vector `i` of the quadruple; then the 128-bit lanes of 4 such vectors are added
/// across in two shuffle-and-add steps.
#[inline]
#[target_feature(enable = "avx512f")]
fn sum16(v: [__m512; LANES]) -> __m512 {
    let mut quads = [_mm512_setzero_ps(); 4];
    for (q, quad) in quads.iter_mut().enumerate() {
        let [a, b, c, d] = [v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]];
        // Per 128-bit lane: ab = [a0+a2, b0+b2, a1+a3, b1+b3], cd likewise.
        let ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
        let cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
        // Per 128-bit lane: [Σa, Σb, Σc, Σd] over that lane's 4 values.
        let low = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd)));
        let high = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd)));
        *quad = _mm512_add_ps(low, high);
    }
    // 128-bit lanes [q0.0 + q0.1, q0.2 + q0.3, q1.0 + q1.1, q1.2 + q1.3], and q2, q3 likewise.
    const EVEN: i32 = 0b10_00_10_00;
    const ODD: i32 = 0b11_01_11_01;
    let q01 = _mm512_add_ps(
        _mm512_shuffle_f32x4::<EVEN>(quads[0], quads[1]),
        _mm512_shuffle_f32x4::<ODD>(quads[0], quads[1]),
    );
    let q23 = _mm512_add_ps(
        _mm512_shuffle_f32x4::<EVEN>(quads[2], quads[3]),
        _mm512_shuffle_f32x4::<ODD>(quads[2], quads[3]),
    );
    _mm512_add_ps(_mm512_shuffle_f32x4::<EVEN>(q01, q23), _mm512_shuffle_f32x4::<ODD>(q01, q23))
}
