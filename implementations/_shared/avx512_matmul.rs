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
//! rows left over after the 4-row tiles take 3-, 2- or 1-row tiles. With a few rows (an
//! encoder's sentence), K is cut into chunks of at most [`DOT_CHUNK`] values, the tiles of a
//! chunk adding to `out`, so that the activation rows and the weight rows of a block stay in
//! L1 together.
//!
//! bfloat16 weights go 32 at a time ([`Weight::PAIRS`]): one load, a shift and a mask widen the
//! even- and odd-index weights into two vectors, and `x` is paired to match once per call
//! (each 32 values of a row rewritten as their 16 even, then their 16 odd ones). Widening 16 at
//! a time took a shuffle and a shift per 16 weights on the ports the multiply-adds use: in
//! pairs, the 128-row prefill of stories110M's bf16 matrices went from 171-173 to 209-230
//! GFLOP/s, its decode from 24.7-26.2 to 25.6-29.0 GB/s, and all-MiniLM's bf16 sentence of 9
//! tokens from 1.45-1.47 to 1.30 ms.
//!
//! From [`TRANSPOSED_ROWS`] rows on (a prefill), dot products spend a reduction on every 16
//! results, so the panel implementations run on the activations transposed instead:
//! [`Product::prepared`] writes `xᵀ` (`[k, rows]`, the rows padded with zeros to a multiple of 16) once per call into
//! a buffer of the calling thread, and a panel of 48 rows × 8 weight rows keeps 24
//! accumulators whose lanes are 16 rows each: every step along K loads 3 vectors of `xᵀ` and
//! broadcasts 8 weights for 24 fused multiply-adds, with no reduction at all. K is cut into
//! equal chunks of at most [`CHUNK_BYTES`] of `xᵀ`, so that the chunk every panel reads stays in L2; the
//! 8 weight rows of a panel stay in L1 while the panels of all the rows pass over them.
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
#![allow(dead_code, clippy::missing_safety_doc, clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::job::{self, Extent, Job};

/// The f32 lanes of an AVX-512 register.
const LANES: usize = 16;

/// Rows from which a product may run on transposed activations (`prepared::<true>`).
pub const TRANSPOSED_ROWS: usize = 32;

/// Most bytes of `xᵀ` per pass over K: well within one core's 2 MiB of L2 next to the weight
/// rows. Each further chunk costs a pass of read-modify-writes over `out`, so the chunks are as
/// long as this allows: K = 2048 at 128 rows in 2 chunks (it took 6 of 384 values before,
/// and the 128-row prefill of stories110M's matrices went 13-18% faster in `cargo bench -p
/// monogen-kernel-tests --bench weights`), K = 1536 at a 424-row batch in 4.
const CHUNK_BYTES: usize = 768 << 10;

/// Most values of K per pass of the dot-product tiles over 2 to 31 rows. A 4-row tile over K =
/// 1536 reads 24 KiB of activations and 24 KiB of weights, L1's whole 48 KiB, so the next
/// tile found neither there; in chunks of 384 both fit. all-MiniLM's down projection at 9
/// rows went from 645-667 to 490-530 µs of the calling thread per sentence (chunks of 256:
/// 503-515, of 768: 599-609; cutting K = 384 in two cost 17%), and bf16's whole sentence
/// from 1.52-1.55 to 1.44-1.48 ms.
const DOT_CHUNK: usize = 384;

/// The values of K that a paired step takes (see [`Weight::PAIRS`]).
const PAIR: usize = 2 * LANES;

thread_local! {
    /// The activations of the calling thread's current product in the layout its tiles read
    /// (`xᵀ` or `x` paired), reused from call to call.
    static LAYOUT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// A weight element the product reads and widens to f32: `f32` itself, or `u16` holding the
/// bits of a bfloat16 (the high half of an f32).
pub trait Weight: Copy + Send + Sync + 'static {
    /// Whether a decode step's tiles prefetch the next tile's weights: not for f32, whose
    /// loads the hardware prefetcher keeps up with, but for bfloat16, whose widening leaves
    /// the loads too far apart for it.
    const PREFETCH_DECODE: bool;

    /// Whether the dot-product tiles take the weights 32 at a time as even and odd halves
    /// ([`Weight::load_pair`]), on activations that [`Product::prepared`] has paired to match.
    const PAIRS: bool;

    /// The 16 weights at `p`, as f32.
    ///
    /// # Safety
    ///
    /// `p` points to 16 readable weights, on a CPU with AVX-512F.
    unsafe fn load16(p: *const Self) -> __m512;

    /// The first `len` (< 16) weights at `p`, as f32; the other lanes are zero.
    ///
    /// # Safety
    ///
    /// `p` points to `len` readable weights, on a CPU with AVX-512F.
    unsafe fn load_first(p: *const Self, len: usize) -> __m512;

    /// The 32 weights at `p` as f32: those of even index, then those of odd index.
    ///
    /// # Safety
    ///
    /// `p` points to 32 readable weights, on a CPU with AVX-512F.
    unsafe fn load_pair(p: *const Self) -> [__m512; 2];

    /// The weight at `p`, as f32.
    ///
    /// # Safety
    ///
    /// `p` points to a readable weight.
    unsafe fn get(p: *const Self) -> f32;
}

impl Weight for f32 {
    const PREFETCH_DECODE: bool = false;
    const PAIRS: bool = false;

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const f32) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_loadu_ps(p) }
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load_first(p: *const f32, len: usize) -> __m512 {
        // SAFETY: the caller's contract; masked-off lanes are not read.
        unsafe { _mm512_maskz_loadu_ps((1u16 << len) - 1, p) }
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load_pair(p: *const f32) -> [__m512; 2] {
        // SAFETY: the caller's contract: 32 values.
        let (low, high) = unsafe { (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(LANES))) };
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
        [_mm512_permutex2var_ps(low, even, high), _mm512_permutex2var_ps(low, odd, high)]
    }

    #[inline]
    unsafe fn get(p: *const f32) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { *p }
    }
}

impl Weight for u16 {
    const PREFETCH_DECODE: bool = true;
    const PAIRS: bool = true;

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const u16) -> __m512 {
        // SAFETY: the caller's contract: 16 values of 2 bytes.
        let halves = unsafe { _mm256_loadu_si256(p.cast()) };
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(halves)))
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load_first(p: *const u16, len: usize) -> __m512 {
        let mut halves = [0u16; LANES];
        // SAFETY: the caller's contract: `len` readable values.
        unsafe { std::ptr::copy_nonoverlapping(p, halves.as_mut_ptr(), len) };
        // SAFETY: `halves` holds 16 values.
        unsafe { Self::load16(halves.as_ptr()) }
    }

    /// One load and two single-cycle operations for 32 weights, where widening 16 at a time
    /// takes a zero-extending shuffle and a shift per 16 (on the ports the multiply-adds use):
    /// each 32-bit lane holds an even-index weight in its low half and the next one in its
    /// high half, so a shift by 16 makes the even ones f32 and masking the low half the odd.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load_pair(p: *const u16) -> [__m512; 2] {
        // SAFETY: the caller's contract: 32 values of 2 bytes.
        let both = unsafe { _mm512_loadu_si512(p.cast()) };
        [
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(both)),
            _mm512_castsi512_ps(_mm512_and_si512(both, _mm512_set1_epi32(0xFFFF_0000_u32 as i32))),
        ]
    }

    #[inline]
    unsafe fn get(p: *const u16) -> f32 {
        // SAFETY: the caller's contract.
        f32::from_bits(u32::from(unsafe { *p }) << 16)
    }
}

/// Which steps of a tile prefetch the next block's weight rows: those at `phase`, `phase +
/// period`, `phase + 2 · period`, ... (none when `period` is 0).
#[derive(Clone, Copy)]
struct Prefetch {
    phase: usize,
    period: usize,
}

impl Prefetch {
    /// Every step, or none.
    fn every_step(on: bool) -> Prefetch {
        Prefetch { phase: 0, period: usize::from(on) }
    }
}

/// One call's operands: `out[r, j] = Σₖ x[r, k] · w[j, k]` for `r < rows`, `j < n`.
#[derive(Clone, Copy)]
pub struct Product<W: Weight = f32> {
    pub out: *mut f32,
    pub x: *const f32,
    pub w: *const W,
    pub rows: usize,
    pub n: usize,
    pub k: usize,
    /// `xᵀ`, `[k, rows padded to 16]`, once [`Product::prepared`] has written it; null for
    /// the dot-product path.
    pub xt: *const f32,
}

// SAFETY: a product is only pointers to buffers that its caller keeps alive and shares out
// by disjoint column ranges until every thread is done (see the module's safety section).
unsafe impl<W: Weight> Send for Product<W> {}
unsafe impl<W: Weight> Sync for Product<W> {}

impl<W: Weight> Product<W> {
    /// The product of `rows` rows over `[N, K]` weights, with the slices' lengths checked.
    #[inline]
    pub fn new<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[W], rows: usize) -> Product<W> {
        assert!(x.len() >= rows * K, "matmul: x is shorter than {rows} rows of {K}");
        assert!(w.len() >= N * K, "matmul: w is shorter than {N} rows of {K}");
        assert!(out.len() >= rows * N, "matmul: out is shorter than {rows} rows of {N}");
        Product { out: out.as_mut_ptr(), x: x.as_ptr(), w: w.as_ptr(), rows, n: N, k: K, xt: std::ptr::null() }
    }

    /// Runs `f` on this product, its activations first rewritten into this thread's buffer
    /// (alive until `f` returns) when the tiles need another layout: with `PANELS`, `xᵀ` when
    /// the product has [`TRANSPOSED_ROWS`] rows or more, so that [`Product::columns`] takes
    /// the panels; for [`Weight::PAIRS`] weights on the dot-product path, `x` paired.
    ///
    /// # Safety
    ///
    /// Only on a CPU with AVX-512F.
    pub unsafe fn prepared<const PANELS: bool, T>(mut self, f: impl FnOnce(&Product<W>) -> T) -> T {
        if PANELS && self.rows >= TRANSPOSED_ROWS {
            return LAYOUT.with_borrow_mut(|buffer| {
                buffer.clear();
                buffer.resize(self.k * self.rows.next_multiple_of(LANES), 0.0);
                // SAFETY: the caller's contract; the buffer has the size `transpose` writes.
                unsafe { self.transpose(buffer) };
                self.xt = buffer.as_ptr();
                f(&self)
            });
        }
        if W::PAIRS && self.k >= PAIR {
            return LAYOUT.with_borrow_mut(|buffer| {
                buffer.clear();
                buffer.resize(self.rows * self.k, 0.0);
                // SAFETY: the caller's contract; the buffer holds `rows · k` values.
                unsafe { self.pair(buffer) };
                self.x = buffer.as_ptr();
                f(&self)
            });
        }
        f(&self)
    }

    /// Writes `x` paired into `paired` (`[rows, k]`): in each row, every whole group of 32
    /// values from the start becomes its 16 values of even index, then its 16 of odd index, as
    /// [`Weight::load_pair`] widens the weights; the last `k % 32` values stay in place.
    #[target_feature(enable = "avx512f")]
    unsafe fn pair(&self, paired: &mut [f32]) {
        assert!(paired.len() >= self.rows * self.k, "paired x buffer too small");
        for r in 0..self.rows {
            let (from, to) = (r * self.k, &mut paired[r * self.k..(r + 1) * self.k]);
            let groups = self.k / PAIR * PAIR;
            for at in (0..groups).step_by(PAIR) {
                // SAFETY: values `at..at + 32` of row `r` are in x, and in `to`.
                unsafe {
                    let [even, odd] = f32::load_pair(self.x.add(from + at));
                    _mm512_storeu_ps(to.as_mut_ptr().add(at), even);
                    _mm512_storeu_ps(to.as_mut_ptr().add(at + LANES), odd);
                }
            }
            for at in groups..self.k {
                // SAFETY: value `at` of row `r` is in x.
                to[at] = unsafe { *self.x.add(from + at) };
            }
        }
    }

    /// Writes `xᵀ` into `xt` (`[k, rows padded to 16]`): for every 16 rows, one gather per
    /// value of K collects its column, and the rows past the end stay zero.
    #[target_feature(enable = "avx512f")]
    unsafe fn transpose(&self, xt: &mut [f32]) {
        let padded = self.rows.next_multiple_of(LANES);
        assert!(xt.len() >= self.k * padded, "xᵀ buffer too small");
        let stride = i32::try_from(self.k).expect("K fits in i32");
        let index = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(stride),
        );
        for r0 in (0..self.rows).step_by(LANES) {
            let valid = (self.rows - r0).min(LANES);
            let mask: __mmask16 = if valid == LANES { u16::MAX } else { (1u16 << valid) - 1 };
            for at in 0..self.k {
                // SAFETY: the gathered lanes are rows `r0..r0 + valid` of x at column `at`,
                // all in x; the store is 16 values of xᵀ's row `at`, inside `xt`.
                unsafe {
                    let base = self.x.add(r0 * self.k + at);
                    let column = _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), mask, index, base.cast());
                    _mm512_storeu_ps(xt.as_mut_ptr().add(at * padded + r0), column);
                }
            }
        }
    }

    /// Computes the columns `cols` (weight rows) of every row of `out`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn columns(&self, cols: Range<usize>) {
        if !self.xt.is_null() {
            // SAFETY: the caller's contract; `xt` was written by `prepared`.
            unsafe { self.columns_transposed(cols) };
            return;
        }
        if self.rows == 1 {
            let mut j = cols.start;
            while j + 8 <= cols.end {
                // A decode step streams its weights once: the hardware prefetcher keeps up
                // with the 8 rows of a tile better without software prefetches taking L1
                // fill buffers (measured: 31.5 against 28.1 GB/s over 1 GiB on two threads).
                // SAFETY: the columns and the row are in range (the caller's contract).
                unsafe { self.tile::<1, 8>(0, j, 0..self.k, Prefetch::every_step(W::PREFETCH_DECODE)) };
                j += 8;
            }
            if j + 4 <= cols.end {
                // SAFETY: as above.
                unsafe { self.tile::<1, 4>(0, j, 0..self.k, Prefetch::every_step(false)) };
                j += 4;
            }
            while j < cols.end {
                // SAFETY: as above.
                unsafe { self.tile::<1, 1>(0, j, 0..self.k, Prefetch::every_step(false)) };
                j += 1;
            }
            return;
        }
        // Equal chunks of K, each a whole number of 16-value steps but the last. Many rows
        // read their activations from L2 whatever the chunks, and each chunk costs the tiles
        // a reduction and `out` a pass: a 128-row prefill of stories110M's bf16 matrices went
        // from 183-189 to 166-176 GFLOP/s in chunks of 384.
        let chunk_len = if self.rows < TRANSPOSED_ROWS {
            let step = if W::PAIRS { PAIR } else { LANES };
            self.k.div_ceil(self.k.div_ceil(DOT_CHUNK)).next_multiple_of(step)
        } else {
            self.k
        };
        let mut k0 = 0;
        while k0 < self.k {
            let ks = k0..(k0 + chunk_len).min(self.k);
            let mut j = cols.start;
            while j + 4 <= cols.end {
                // SAFETY: the columns and the chunk are in range (the caller's contract).
                unsafe { self.all_rows::<4>(j, ks.clone()) };
                j += 4;
            }
            while j < cols.end {
                // SAFETY: as above.
                unsafe { self.all_rows::<1>(j, ks.clone()) };
                j += 1;
            }
            k0 = ks.end;
        }
    }

    /// The columns `cols` of every row, from `xᵀ`: K in chunks, 8 weight rows at a time.
    #[target_feature(enable = "avx512f")]
    unsafe fn columns_transposed(&self, cols: Range<usize>) {
        // Equal chunks of at most CHUNK_BYTES of xᵀ (a short last chunk would cost a pass of
        // read-modify-writes over `out` for little work).
        let most = (CHUNK_BYTES / (self.rows.next_multiple_of(LANES) * 4)).max(LANES);
        let chunk_len = self.k.div_ceil(self.k.div_ceil(most));
        let mut k0 = 0;
        while k0 < self.k {
            let chunk = k0..(k0 + chunk_len).min(self.k);
            let mut j = cols.start;
            while j + 8 <= cols.end {
                // SAFETY: the columns and the chunk are in range.
                unsafe { self.panels::<8>(j, chunk.clone()) };
                j += 8;
            }
            while j < cols.end {
                // SAFETY: as above.
                unsafe { self.panels::<1>(j, chunk.clone()) };
                j += 1;
            }
            k0 = chunk.end;
        }
    }

    /// Columns `j..j + C` of every row over the values `ks` of K: panels of 48 rows, and of
    /// 32 for the rest (two of 32 rather than 48 and a 16-row panel, whose single vector per
    /// step would leave the loads, not the multiply-adds, setting the pace).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn panels<const C: usize>(&self, j: usize, ks: Range<usize>) {
        let mut left = self.rows.div_ceil(LANES);
        let mut r = 0;
        while left > 0 {
            let vectors = if left == 4 || left == 2 { 2 } else { left.min(3) };
            // SAFETY: rows `r..r + 16 · vectors` of xᵀ exist (padded) and the columns are in
            // range.
            match vectors {
                3 => unsafe { self.panel::<3, C>(r, j, ks.clone()) },
                2 => unsafe { self.panel::<2, C>(r, j, ks.clone()) },
                _ => unsafe { self.panel::<1, C>(r, j, ks.clone()) },
            }
            r += vectors * LANES;
            left -= vectors;
        }
    }

    /// Rows `r..r + 16·V` (those below `rows`) of columns `j..j + C`, over the values `ks` of
    /// K, added to `out` unless `ks` starts at 0.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn panel<const V: usize, const C: usize>(&self, r: usize, j: usize, ks: Range<usize>) {
        let padded = self.rows.next_multiple_of(LANES);
        let mut acc = [[_mm512_setzero_ps(); V]; C];
        // SAFETY (every pointer below): weight rows `j..j + C` hold `k` values, and xᵀ holds
        // `padded` values for every value of K.
        let ws: [*const W; C] = std::array::from_fn(|c| unsafe { self.w.add((j + c) * self.k) });
        let first = ks.start == 0;
        for at in ks {
            if r == 0 && at % LANES == 0 {
                for w in ws {
                    // The next block's weight rows, one cache line each per 16 steps, while
                    // this block's first panel runs (a prefetch never faults).
                    _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(C * self.k + at).cast());
                }
            }
            let column = unsafe { self.xt.add(at * padded + r) };
            let mut xv = [_mm512_setzero_ps(); V];
            for v in 0..V {
                xv[v] = unsafe { _mm512_loadu_ps(column.add(v * LANES)) };
            }
            for c in 0..C {
                let weight = _mm512_set1_ps(unsafe { W::get(ws[c].add(at)) });
                for v in 0..V {
                    acc[c][v] = _mm512_fmadd_ps(xv[v], weight, acc[c][v]);
                }
            }
        }
        let mut lanes = [0.0f32; LANES];
        for c in 0..C {
            for v in 0..V {
                // SAFETY: `lanes` holds 16 floats.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc[c][v]) };
                let row0 = r + v * LANES;
                for (i, &value) in lanes.iter().enumerate().take(self.rows.saturating_sub(row0)) {
                    // SAFETY: row `row0 + i` is below `rows`, and column `j + c` is in range
                    // and in this thread's columns.
                    let out = unsafe { &mut *self.out.add((row0 + i) * self.n + j + c) };
                    *out = if first { value } else { *out + value };
                }
            }
        }
    }

    /// Columns `j..j + C` of every row over the values `ks` of K: 4-row tiles, then one
    /// smaller tile for the rest. The tiles share the prefetches of the next block's weight
    /// rows: of T tiles, tile t asks for the lines of steps t, t + T, t + 2T, ...
    ///
    /// The first tile used to ask for all of them. It then waited on memory while the later
    /// tiles, reading the block from L1, left memory idle: all-MiniLM's sentence of 9 rows (3
    /// tiles) went from 1.64-1.71 to 1.52-1.60 ms with the prefetches shared, 12 rows from
    /// 1.85 to 1.69, 28 rows from 4.94 to 4.63; 5 and 8 rows (2 tiles) did not change.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn all_rows<const C: usize>(&self, j: usize, ks: Range<usize>) {
        let tiles = self.rows.div_ceil(4);
        let mut r = 0;
        while r + 4 <= self.rows {
            // SAFETY: rows `r..r + 4`, the columns and the chunk are in range.
            unsafe { self.tile::<4, C>(r, j, ks.clone(), Prefetch { phase: r / 4, period: tiles }) };
            r += 4;
        }
        let prefetch = Prefetch { phase: r / 4, period: tiles };
        // SAFETY: as above, for the rows that are left.
        match self.rows - r {
            3 => unsafe { self.tile::<3, C>(r, j, ks, prefetch) },
            2 => unsafe { self.tile::<2, C>(r, j, ks, prefetch) },
            1 => unsafe { self.tile::<1, C>(r, j, ks, prefetch) },
            _ => {}
        }
    }

    /// The `R × C` block of `out` at row `r`, column `j` (`R · C ≤ 16`) over the values `ks`
    /// of K, added to `out` unless `ks` starts at 0. At the steps `prefetch` names, a step
    /// along K also asks for the same cache line of the next block's weight rows (`C` further
    /// on): the hardware prefetcher alone leaves a block of rows waiting on memory when several
    /// activation rows share it. With several rows, that block is the next one their tiles
    /// read; 8 rows ahead, then 12, 16, 32 and 64, were each slower at all-MiniLM's 9 rows
    /// (its matrices of K = 384 took 455, 505, 510, 530 and 570 µs per sentence against 445).
    ///
    /// A tile of fewer than 8 products would wait on the 4-cycle latency of its few chains of
    /// multiply-adds, so it alternates steps between two sets of accumulators.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile<const R: usize, const C: usize>(
        &self,
        r: usize,
        j: usize,
        ks: Range<usize>,
        prefetch: Prefetch,
    ) {
        let k = self.k;
        let mut countdown = prefetch.phase;
        let first = ks.start == 0;
        let end = ks.end;
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        // SAFETY (every pointer below): rows `r..r + R` of x and `j..j + C` of w hold `k`
        // values each, and the loads read at most up to the end of a row.
        let xs: [*const f32; R] = std::array::from_fn(|i| unsafe { self.x.add((r + i) * k) });
        let ws: [*const W; C] = std::array::from_fn(|c| unsafe { self.w.add((j + c) * k) });
        let mut at = ks.start;
        // At the steps `prefetch` names, the cache line at `at` of each of the next block's
        // weight rows.
        macro_rules! prefetch_next {
            () => {
                if prefetch.period > 0 {
                    if countdown == 0 {
                        for w in ws {
                            // A prefetch never faults, even past the end of the weights.
                            _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(C * k + at).cast());
                        }
                        countdown = prefetch.period;
                    }
                    countdown -= 1;
                }
            };
        }
        // One step of 16 values of K into the accumulators `$acc`, and its prefetches.
        macro_rules! step {
            ($acc:ident) => {
                let mut xv = [_mm512_setzero_ps(); R];
                for i in 0..R {
                    xv[i] = unsafe { _mm512_loadu_ps(xs[i].add(at)) };
                }
                for c in 0..C {
                    let wv = unsafe { W::load16(ws[c].add(at)) };
                    for i in 0..R {
                        $acc[i][c] = _mm512_fmadd_ps(xv[i], wv, $acc[i][c]);
                    }
                }
                prefetch_next!();
                at += LANES;
            };
        }
        // One step of 32 values of K (paired weights), the even ones into `$even`, the odd
        // ones into `$odd`, and its prefetches (one cache line of each weight row).
        macro_rules! pair {
            ($even:ident, $odd:ident) => {
                let mut xv = [[_mm512_setzero_ps(); 2]; R];
                for i in 0..R {
                    xv[i] =
                        unsafe { [_mm512_loadu_ps(xs[i].add(at)), _mm512_loadu_ps(xs[i].add(at + LANES))] };
                }
                for c in 0..C {
                    let [we, wo] = unsafe { W::load_pair(ws[c].add(at)) };
                    for i in 0..R {
                        $even[i][c] = _mm512_fmadd_ps(xv[i][0], we, $even[i][c]);
                        $odd[i][c] = _mm512_fmadd_ps(xv[i][1], wo, $odd[i][c]);
                    }
                }
                prefetch_next!();
                at += PAIR;
            };
        }
        let small = R * C < 8;
        let mut odd = [[_mm512_setzero_ps(); C]; R];
        if W::PAIRS {
            while at + PAIR <= end {
                if small {
                    pair!(acc, odd);
                } else {
                    pair!(acc, acc);
                }
            }
        } else if small {
            while at + 2 * LANES <= end {
                step!(acc);
                step!(odd);
            }
        }
        if small {
            for i in 0..R {
                for c in 0..C {
                    acc[i][c] = _mm512_add_ps(acc[i][c], odd[i][c]);
                }
            }
        }
        while at + LANES <= end {
            step!(acc);
        }
        if at < end {
            let mask: __mmask16 = (1u16 << (end - at)) - 1;
            let mut xv = [_mm512_setzero_ps(); R];
            for i in 0..R {
                xv[i] = unsafe { _mm512_maskz_loadu_ps(mask, xs[i].add(at)) };
            }
            for c in 0..C {
                let wv = unsafe { W::load_first(ws[c].add(at), end - at) };
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
                let out = unsafe { &mut *self.out.add((r + i) * self.n + j + c) };
                *out = if first { sums[i * C + c] } else { *out + sums[i * C + c] };
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

/// A product as a team shares it, by weight rows.
impl<W: Weight> Job for Product<W> {
    fn extent(&self) -> Extent {
        Extent::product(self.rows, self.n, self.k, job::GRANULE)
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract, which `team::run` keeps.
        unsafe { self.columns(cols) }
    }
}
