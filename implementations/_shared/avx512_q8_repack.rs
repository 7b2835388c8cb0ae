//! The AVX-512 VNNI product `out = x · wᵀ` of a prefill over blockwise int8 weights, packed
//! block by block while the call runs.
//!
//! The panels of `shared/avx512_q8.rs` broadcast 4 weights of one weight row against 16
//! activation rows: each step along K loads the activations of 32 rows from L2 for 8
//! `vpdpbusd`, and every block of 32 values ends with a scaling epilogue per weight row and
//! a horizontal sum of the weights (the correction for the activations' offset). They ran at
//! about 30% of the VNNI peak. Here, as in `shared/avx512_repack.rs`, each thread packs the
//! weight rows of its share 48 at a time when it reaches them, into a buffer of its own: for
//! every 4 values of K, the 48 rows' 4 bytes side by side (3 vectors of 16 rows × 4 bytes),
//! which one 16 × 16 transpose of 32-bit lanes per 64 values of K writes. Each block of 32
//! values also gets its 48 weight scales as 3 vectors and its 48 corrections (128 · Σ w, one
//! `vpdpbusd` of 128s per 4 values), so that nothing is reduced across lanes. A step along K is
//! then 3 loads of packed weights, and per activation row one broadcast of its 4 offset values
//! (`qx + 128`, unsigned, as `vpdpbusd` takes them) and 3 `vpdpbusd`: 4 rows keep 12 sums and
//! 12 f32 accumulators in registers, and at the end of a block each sum becomes f32 and is
//! multiplied into its accumulator by the row's scale times the 16 weight rows' scales.
//!
//! Calls of fewer than [`REPACK_ROWS`] rows keep the dot tiles of [`Q8Product`], so a decode
//! step runs the same code as `matmul/q8-avx512-vnni-threads`. On stories110M's matrices at 128
//! rows (`cargo bench -p monogen-kernel-tests --bench weights`, 2 threads) the blocks ran at
//! 634-649 GOP/s against 411-427 for the panels. Asking for the next block's lines while a
//! block's tiles run, as `shared/avx512_repack.rs` does, made them slower here (573): the
//! packed block of int8 weights is a quarter of the f32 one.
//!
//! # Safety
//!
//! [`Q8Repack::columns`] may be called only on a CPU with AVX-512F, AVX-512BW and AVX-512
//! VNNI, from inside [`Q8Repack::prepared`], and never twice at once on overlapping column
//! ranges of the same `out`.
#![allow(dead_code, clippy::missing_safety_doc, clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::avx512_q8::{BLOCK, Q8Product, STEP, quantize_row};
use super::avx512_transpose::transpose;
use super::job::{Extent, Job};

/// The 32-bit lanes of an AVX-512 register.
const LANES: usize = 16;

/// Values of K in one 32-bit lane: the bytes `vpdpbusd` multiplies and adds at once.
const QUAD: usize = 4;

/// Weight rows (output columns) per packed block: 3 vectors.
const BLOCK_COLS: usize = 48;

/// Activation rows per tile: 12 sums and 12 accumulators, 3 weight vectors and a broadcast
/// fill 28 of the 32 registers.
const GROUP: usize = 4;

/// Rows from which a call packs its weights; fewer keep the dot tiles.
pub const REPACK_ROWS: usize = 32;

/// The team's granule: shares start at a multiple of it, so that only the last block of the
/// share that ends at `n` is narrower than a whole number of vectors (any range is computed
/// right, a narrower block only wastes lanes).
pub const GRANULE: usize = LANES;

thread_local! {
    /// The calling thread's quantized activations: `qx + 128` (`[rows, k padded to 64]`) and
    /// the spread block scales that `quantize_row` writes (`[rows, steps, 16]`).
    static ACTIVATIONS: RefCell<(Vec<u8>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    /// A thread's packed block: the weights (`[quads, V]` vectors), and per block of 32 values
    /// the weight scales and the negated corrections (`[blocks, V]` vectors each).
    static PACKED: RefCell<(Vec<__m512i>, Vec<__m512>, Vec<__m512i>)> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// A product that packs its weights block by block from [`REPACK_ROWS`] rows on.
#[derive(Clone, Copy)]
pub struct Q8Repack {
    /// The operands, prepared for the dot tiles when the call has fewer rows.
    pub product: Q8Product,
    /// From [`REPACK_ROWS`] rows on, the offset quantized activations (`[rows, stride]`);
    /// null otherwise.
    xo: *const u8,
    /// Their spread block scales (`[rows, steps, 16]`).
    dx: *const f32,
    /// Values per row of `xo`: K padded to a multiple of 64.
    stride: usize,
}

// SAFETY: a product is only pointers to buffers that its caller keeps alive and shares out
// by disjoint column ranges until every thread is done (see the module's safety section).
unsafe impl Send for Q8Repack {}
unsafe impl Sync for Q8Repack {}

impl Q8Repack {
    /// Quantizes the activations into this thread's buffers (alive until `f` returns), as the
    /// dot tiles or the packed blocks read them, then runs `f` on the product.
    ///
    /// # Safety
    ///
    /// Only on a CPU with AVX-512F and AVX-512BW, with `product.x` holding `[rows, k]` values.
    pub unsafe fn prepared<T>(product: Q8Product, f: impl FnOnce(&Q8Repack) -> T) -> T {
        let (rows, k) = (product.rows, product.k);
        if rows < REPACK_ROWS {
            // SAFETY: the caller's contract.
            return unsafe {
                product.prepared(|product| {
                    f(&Q8Repack { product: *product, xo: std::ptr::null(), dx: std::ptr::null(), stride: 0 })
                })
            };
        }
        let stride = k.div_ceil(STEP) * STEP;
        let spread = stride / STEP * LANES;
        ACTIVATIONS.with_borrow_mut(|(xo, dx)| {
            xo.clear();
            xo.resize(rows * stride, 0);
            dx.clear();
            dx.resize(rows * spread, 0.0);
            for r in 0..rows {
                let row = &mut xo[r * stride..(r + 1) * stride];
                // SAFETY: row `r` of x holds k values (the caller's contract); `i8` and `u8`
                // have one layout, and the row's buffers have the sizes `quantize_row` writes.
                unsafe {
                    let x = std::slice::from_raw_parts(product.x.add(r * k), k);
                    let q = std::slice::from_raw_parts_mut(row.as_mut_ptr().cast::<i8>(), stride);
                    quantize_row(x, q, &mut dx[r * spread..(r + 1) * spread]);
                }
                for value in row.iter_mut() {
                    *value ^= 0x80;
                }
            }
            f(&Q8Repack { product, xo: xo.as_ptr(), dx: dx.as_ptr(), stride })
        })
    }

    /// Computes the columns `cols` (weight rows) of every row of `out`, and no other.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn columns(&self, cols: Range<usize>) {
        if self.xo.is_null() {
            // SAFETY: the caller's contract; `prepared` prepared the dot tiles.
            unsafe { self.product.columns(cols) };
            return;
        }
        if cols.is_empty() {
            return;
        }
        let k = self.product.k;
        let (quads, blocks) = (k.div_ceil(QUAD), k.div_ceil(BLOCK));
        PACKED.with_borrow_mut(|(weights, scales, corrections)| {
            let vectors = BLOCK_COLS / LANES;
            weights.resize(quads.next_multiple_of(LANES) * vectors, _mm512_setzero_si512());
            scales.resize(blocks * vectors, _mm512_setzero_ps());
            corrections.resize(blocks * vectors, _mm512_setzero_si512());
            let packed = Packed {
                weights: weights.as_mut_ptr(),
                scales: scales.as_mut_ptr(),
                corrections: corrections.as_mut_ptr(),
            };
            let mut j = cols.start;
            while j < cols.end {
                let width = (cols.end - j).min(BLOCK_COLS);
                // SAFETY: columns `j..j + width` are in range and the buffers hold a block.
                unsafe {
                    match width.div_ceil(LANES) {
                        3 => self.block::<3>(&packed, j, width),
                        2 => self.block::<2>(&packed, j, width),
                        1 => self.block::<1>(&packed, j, width),
                        _ => unreachable!("blocks of at most 3 vectors"),
                    }
                }
                j += width;
            }
        });
    }

    /// Columns `j..j + width` (`V` vectors, the last one short only at `n`) of every row:
    /// packed, then computed [`GROUP`] rows at a time.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn block<const V: usize>(&self, packed: &Packed, j: usize, width: usize) {
        // SAFETY: the caller's contract.
        unsafe { self.pack::<V>(packed, j, width) };
        let rows = self.product.rows;
        let mut r = 0;
        while r < rows {
            let count = (rows - r).min(GROUP);
            // SAFETY: the block is packed and rows `r..r + count` are in range.
            unsafe {
                match count {
                    4 => self.tile::<4, V>(packed, r, j, width),
                    3 => self.tile::<3, V>(packed, r, j, width),
                    2 => self.tile::<2, V>(packed, r, j, width),
                    1 => self.tile::<1, V>(packed, r, j, width),
                    _ => unreachable!("tiles of at most {GROUP} rows"),
                }
            }
            r += count;
        }
    }

    /// Packs weight rows `j..j + width` (rows past `width` zero): for each 4 values of K, `V`
    /// vectors of 16 rows' 4 bytes; for each block of 32 values, the rows' scales and their
    /// corrections `−128 · Σ w`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn pack<const V: usize>(&self, packed: &Packed, j: usize, width: usize) {
        let p = &self.product;
        let (k, quads, blocks) = (p.k, p.k.div_ceil(QUAD), p.k.div_ceil(BLOCK));
        for v in 0..V {
            let first = j + v * LANES;
            let rows = width.saturating_sub(v * LANES).min(LANES);
            let mut q0 = 0;
            while q0 < quads {
                // 16 quads: 64 values of K of each row, masked past K.
                let len = (k - q0 * QUAD).min(STEP);
                let mask: __mmask64 = if len == STEP { u64::MAX } else { (1u64 << len) - 1 };
                let mut tile = [_mm512_setzero_ps(); LANES];
                for i in 0..rows {
                    // SAFETY: weight row `first + i` is in range and holds values `4·q0..4·q0 +
                    // len`; the mask keeps the load inside them.
                    tile[i] = unsafe {
                        _mm512_castsi512_ps(_mm512_maskz_loadu_epi8(
                            mask,
                            p.w.add((first + i) * k + q0 * QUAD).cast(),
                        ))
                    };
                }
                let columns = transpose(tile);
                for c in 0..len.div_ceil(QUAD) {
                    // SAFETY: quad `q0 + c` < quads of the block is inside the buffer.
                    unsafe { packed.weights.add((q0 + c) * V + v).write(_mm512_castps_si512(columns[c])) };
                }
                q0 += LANES;
            }
            let offsets = _mm512_set1_epi8(-128);
            for b in 0..blocks {
                let mut sum = _mm512_setzero_si512();
                for q in b * BLOCK / QUAD..((b + 1) * BLOCK / QUAD).min(quads) {
                    // SAFETY: quad `q` was packed above.
                    sum = _mm512_dpbusd_epi32(sum, offsets, unsafe { packed.weights.add(q * V + v).read() });
                }
                let mut lanes = [0.0f32; LANES];
                for (i, lane) in lanes.iter_mut().enumerate().take(rows) {
                    // SAFETY: weight row `first + i` has `blocks` scales.
                    *lane = unsafe { *p.scales.add((first + i) * blocks + b) };
                }
                // SAFETY: block `b` of the buffers holds `V` vectors.
                unsafe {
                    packed.corrections.add(b * V + v).write(_mm512_sub_epi32(_mm512_setzero_si512(), sum));
                    packed.scales.add(b * V + v).write(_mm512_loadu_ps(lanes.as_ptr()));
                }
            }
        }
    }

    /// The `R × 16·V` block of `out` at row `r`, column `j`, from the packed block.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn tile<const R: usize, const V: usize>(&self, packed: &Packed, r: usize, j: usize, width: usize) {
        let p = &self.product;
        let (quads, blocks) = (p.k.div_ceil(QUAD), p.k.div_ceil(BLOCK));
        let spread = self.stride / STEP * LANES;
        // SAFETY (every pointer below): rows `r..r + R` of the activations hold `stride` values
        // and `spread` scales; the packed block holds `quads` steps and `blocks` scales.
        let xs: [*const u8; R] = std::array::from_fn(|i| unsafe { self.xo.add((r + i) * self.stride) });
        let ds: [*const f32; R] = std::array::from_fn(|i| unsafe { self.dx.add((r + i) * spread) });
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        for b in 0..blocks {
            let mut sums = [[_mm512_setzero_si512(); V]; R];
            for v in 0..V {
                let correction = unsafe { packed.corrections.add(b * V + v).read() };
                for i in 0..R {
                    sums[i][v] = correction;
                }
            }
            for q in b * BLOCK / QUAD..((b + 1) * BLOCK / QUAD).min(quads) {
                let mut wv = [_mm512_setzero_si512(); V];
                for v in 0..V {
                    wv[v] = unsafe { packed.weights.add(q * V + v).read() };
                }
                for i in 0..R {
                    let xv = _mm512_set1_epi32(unsafe { xs[i].add(q * QUAD).cast::<i32>().read_unaligned() });
                    for v in 0..V {
                        sums[i][v] = _mm512_dpbusd_epi32(sums[i][v], xv, wv[v]);
                    }
                }
            }
            for i in 0..R {
                // The spread scales hold each block's scale in 8 lanes: the first of them.
                let dx = _mm512_set1_ps(unsafe { *ds[i].add(b * 8) });
                for v in 0..V {
                    let scale = _mm512_mul_ps(dx, unsafe { packed.scales.add(b * V + v).read() });
                    acc[i][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[i][v]), scale, acc[i][v]);
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

/// A thread's packed block (see `PACKED`).
struct Packed {
    weights: *mut __m512i,
    scales: *mut __m512,
    corrections: *mut __m512i,
}

/// A product as a team shares it, by multiples of [`GRANULE`] weight rows.
impl Job for Q8Repack {
    fn extent(&self) -> Extent {
        Extent::product(self.product.rows, self.product.n, self.product.k, GRANULE)
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract, which `team::run` keeps.
        unsafe { self.columns(cols) }
    }
}
