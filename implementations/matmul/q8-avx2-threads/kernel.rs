//! Matrix product `out = x · wᵀ` with blockwise int8 weights, AVX2 and FMA, on `THREADS`
//! threads: for CPUs without AVX-512 VNNI (x86-64-v3), where a byte per weight quarters what
//! a decode step reads.
//!
//! The calling thread quantizes the activations once, as the interface defines (per block of
//! 32: d = max|x| / 127, q = round(x · 127 / max|x|), ties to even). From 8 rows on (a
//! prefill), the product then runs on the packed blocks of `shared/avx2_repack.rs`: the
//! activations written out as their terms dx · q in f32, each weight widened to f32 and
//! multiplied by its block's scale as its block is packed (`Dequantized`). Below 8 rows (a
//! decode step), the integer tiles below: the weight rows are cut into `THREADS` shares that
//! the persistent team of `shared/team.rs` computes, the calling thread taking the first; each
//! share is taken in blocks of about 16 KiB of weights, over which every activation row passes
//! while the block is in L1.
//!
//! A block of 32 products of signed bytes takes three instructions without VNNI: `vpsignb`
//! moves the activations' signs onto the weights (so that the activations can be read as
//! unsigned magnitudes), `vpmaddubsw` multiplies and adds pairs into 16 bits (at most
//! 2 · 127 · 127, which cannot saturate) and `vpmaddwd` by ones adds pairs into 8 exact 32-bit
//! sums. Those become f32 and are multiplied by the block's two scales into the tile's
//! accumulators, lane by lane, so a dot product's blocks are added in f32 as the interface
//! allows. Tiles are 2 activation rows × 4 weight rows; a row left over takes one weight row at
//! a time, front to back, and a decode step's single row two at once, one from each half of its
//! share, so that its thread reads two streams (`rows_dot`). A row's last block, when 32
//! does not divide K, is zero-padded in the quantized activations and copied zero-padded from
//! the weights.

use std::arch::x86_64::*;
use std::ops::Range;
use std::sync::atomic::AtomicUsize;

use super::shared::avx2_math::{LANES, hsum, sum8};
use super::shared::avx2_q8::{BLOCK, quantize_row};
use super::shared::avx2_repack::{Operands, REPACK_ROWS, Repack};
use super::shared::job;
use super::shared::team::{self, Extent, Job};

/// Bytes of weights per block that the activation rows pass over while it is in L1.
const BLOCK_BYTES: usize = 16 * 1024;

/// Computes `out[r, n] = Σ_b dx[r, b] · dw[n, b] · Σ_{k in b} qx[r, k] · w[n, k]` for `rows`
/// rows.
///
/// `x`: `[rows, K]`, `w`: `[N, K]` int8 values and their `[N, ⌈K/32⌉]` scales, `out`:
/// `[rows, N]`, all row-major.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: (&[i8], &[f32]), rows: usize) {
    let (w, scales) = w;
    let blocks = K.div_ceil(BLOCK);
    assert!(x.len() >= rows * K, "matmul: x is shorter than {rows} rows of {K}");
    assert!(w.len() >= N * K, "matmul: w is shorter than {N} rows of {K}");
    assert!(scales.len() >= N * blocks, "matmul: scales is shorter than {N} rows of {blocks}");
    assert!(out.len() >= rows * N, "matmul: out is shorter than {rows} rows of {N}");
    // Each activation row quantized into whole blocks (the last one zero-padded).
    let mut qx = vec![0i8; rows * blocks * BLOCK];
    let mut dx = vec![0f32; rows * blocks];
    for r in 0..rows {
        // SAFETY: the generated crate checks at start-up that the CPU has AVX2 and FMA.
        unsafe {
            quantize_row(
                &x[r * K..][..K],
                &mut qx[r * blocks * BLOCK..][..blocks * BLOCK],
                &mut dx[r * blocks..][..blocks],
            )
        };
    }
    if rows >= REPACK_ROWS {
        // The activations as the interface's terms dx · qx, in f32.
        let mut terms = vec![0f32; rows * K];
        // SAFETY: as above.
        unsafe { dequantize(&qx, &dx, &mut terms, K) };
        let operands = Dequantized {
            out: out.as_mut_ptr(),
            x: terms.as_ptr(),
            w: w.as_ptr(),
            scales: scales.as_ptr(),
            rows,
            n: N,
            k: K,
        };
        let blocks = AtomicUsize::new(0);
        // SAFETY: as above; the pointers come from slices just checked to hold the operands,
        // and `out`, `terms` and the counter stay alive until every thread is done.
        unsafe { team::run(Shared(Path::Packed(Repack::new(operands, &blocks)))) };
        return;
    }
    let product = Product {
        out: out.as_mut_ptr(),
        qx: qx.as_ptr(),
        dx: dx.as_ptr(),
        w: w.as_ptr(),
        scales: scales.as_ptr(),
        rows,
        n: N,
        k: K,
    };
    // SAFETY: as above; the pointers come from slices just checked to hold the operands, and
    // `out`, `qx` and `dx` stay alive until every share is done.
    unsafe { team::run(Shared(Path::Tiles(product))) }
}

/// Writes each quantized activation times its block's scale, `dx · qx`, into `terms` (`k` per
/// row, from rows of whole blocks in `qx`).
#[target_feature(enable = "avx2,fma")]
fn dequantize(qx: &[i8], dx: &[f32], terms: &mut [f32], k: usize) {
    let blocks = k.div_ceil(BLOCK);
    for ((q, d), row) in
        qx.chunks_exact(blocks * BLOCK).zip(dx.chunks_exact(blocks)).zip(terms.chunks_exact_mut(k))
    {
        for ((q, &d), row) in q.chunks_exact(BLOCK).zip(d).zip(row.chunks_mut(BLOCK)) {
            for (t, &q) in row.iter_mut().zip(q) {
                *t = d * f32::from(q);
            }
        }
    }
}

/// The operands of a call of [`REPACK_ROWS`] rows or more, for the packed blocks of
/// `shared/avx2_repack.rs`: the activations as their terms `dx · qx`, and each weight loaded as
/// `dw · w`. The products of those f32 values are the interface's terms up to the rounding of
/// each factor (a relative 2⁻²⁴); the sums are f32 multiply-adds.
#[derive(Clone, Copy)]
pub(crate) struct Dequantized {
    out: *mut f32,
    x: *const f32,
    w: *const i8,
    scales: *const f32,
    rows: usize,
    n: usize,
    k: usize,
}

impl Operands for Dequantized {
    const WEIGHT_BYTES: usize = 1;

    fn shape(&self) -> (usize, usize, usize) {
        (self.rows, self.n, self.k)
    }

    fn x(&self) -> *const f32 {
        self.x
    }

    fn out(&self) -> *mut f32 {
        self.out
    }

    fn weight_at(&self, row: usize, at: usize) -> *const u8 {
        self.w.wrapping_add(row * self.k + at).cast()
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load(&self, row: usize, at: usize, len: usize) -> __m256 {
        // SAFETY: the caller's contract: the weights lie inside the row.
        let from = unsafe { self.w.add(row * self.k + at) };
        let bytes = if len == LANES {
            // SAFETY: as above, 8 bytes.
            unsafe { _mm_loadl_epi64(from.cast()) }
        } else {
            let mut last = [0i8; LANES];
            // SAFETY: as above, `len` bytes.
            last[..len].copy_from_slice(unsafe { std::slice::from_raw_parts(from, len) });
            // SAFETY: `last` is 8 readable bytes.
            unsafe { _mm_loadl_epi64(last.as_ptr().cast()) }
        };
        // `at` is a multiple of 8, so the 8 weights share one block's scale.
        // SAFETY: the row's scale of block at / 32 lies inside `scales`.
        let scale = unsafe { *self.scales.add(row * self.k.div_ceil(BLOCK) + at / BLOCK) };
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), _mm256_set1_ps(scale))
    }
}

/// The operands of one call: `out` is `[rows, n]`; `qx` `[rows, blocks · 32]` and `dx`
/// `[rows, blocks]` the quantized activations; `w` `[n, k]` and `scales` `[n, blocks]`.
#[derive(Clone, Copy)]
pub(crate) struct Product {
    out: *mut f32,
    qx: *const i8,
    dx: *const f32,
    w: *const i8,
    scales: *const f32,
    rows: usize,
    n: usize,
    k: usize,
}

// SAFETY: the team's threads write disjoint columns of `out` and only read the rest.
unsafe impl Send for Product {}

impl Product {
    /// Computes the columns `cols` of every row of `out`.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA, the pointers hold the operands' sizes, and no other thread
    /// writes these columns meanwhile.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn columns(&self, cols: Range<usize>) {
        if self.rows == 1 {
            // A decode step: the share's two halves side by side (`rows_dot`).
            let half = cols.len() / 2;
            for n in cols.start..cols.start + half {
                // SAFETY: row 0 and weight rows n and n + half lie inside the operands.
                unsafe { self.rows_dot(0, [n, n + half]) };
            }
            if cols.len() % 2 == 1 {
                // SAFETY: as above, for the share's last weight row.
                unsafe { self.rows_dot(0, [cols.end - 1]) };
            }
            return;
        }
        // A multiple of 8, which both tile widths divide: no column of a block is left to
        // the single-column tiles, whose one chain of multiply-adds waits on each in turn.
        let block = (BLOCK_BYTES / self.k).max(1).next_multiple_of(8);
        let mut n0 = cols.start;
        while n0 < cols.end {
            let n1 = (n0 + block).min(cols.end);
            let mut r = 0;
            while r + 2 <= self.rows {
                // SAFETY: rows r..r + 2 and weight rows n0..n1 lie inside the operands.
                unsafe { self.row_block::<2, 4>(r, n0..n1) };
                r += 2;
            }
            if r < self.rows {
                for n in n0..n1 {
                    // SAFETY: as above, for row r and weight row n.
                    unsafe { self.rows_dot(r, [n]) };
                }
            }
            n0 = n1;
        }
    }

    /// Writes `out[r, n]` for each weight row `n` of `ns`: the dot products of activation row
    /// `r` with those weight rows, read front to back side by side, each line asked for into
    /// L1 `AHEAD` bytes before it is reached (past a row's end into the next one), as
    /// `rows_dot` in `shared/avx2_team_matmul.rs` does for bfloat16 weights. A row's sums are
    /// the same, term for term, whichever rows it is read beside: two rows for a decode step,
    /// one from each half of its share ([`Product::columns`]), so that its thread reads two
    /// streams; one for the row of a share's odd end and for a few rows' leftover row.
    ///
    /// Measured on an AMD EPYC (Zen 3, 2 threads): one row at a time, the stories110M int8
    /// crate decoded 1.188x as fast as with tiles of 8 weight rows that asked for the next tile
    /// into L2 (`bench/ab.py --rounds 10`, from the saved weights). Two rows, one from each
    /// half, against one: the decode of `cargo bench -p monogen-kernel-tests --bench weights`
    /// at TinyLlama's shapes, as a share of the read in the same run, 1.03 and 1.03 against
    /// 0.91 and 0.96 (at stories110M's, whose int8 matrices are 0.6-1.6 MB, 0.92, 0.99, 0.86,
    /// 0.96 against 0.93, 0.83, 0.93, 1.01); the stories110M int8 crate decoded 1.120x
    /// [0.964-1.283] as fast (`bench/ab.py --rounds 12 --max-tokens 64`, from its saved
    /// weights).
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA, row `r` lies inside `qx` and `dx`, the weight rows `ns` inside
    /// `w` and `scales`, and no other thread writes `out[r, n]` for them meanwhile.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows_dot<const S: usize>(&self, r: usize, ns: [usize; S]) {
        const AHEAD: usize = 1024;
        let (k, blocks) = (self.k, self.k.div_ceil(BLOCK));
        let ones = _mm256_set1_epi16(1);
        // SAFETY: the caller's contract.
        let (qx, dx) = unsafe { (self.qx.add(r * blocks * BLOCK), self.dx.add(r * blocks)) };
        let ws = ns.map(|n| self.w.wrapping_add(n * k));
        let dws = ns.map(|n| self.scales.wrapping_add(n * blocks));
        // Block `at` of every weight row (`wl`: its weights) times its two scales, into `sums`.
        let block = |sums: &mut [__m256; S], at: usize, wl: [__m256i; S]| {
            // SAFETY: block `at` of the quantized row (zero-padded to whole blocks) and its
            // scale lie inside `qx` and `dx`.
            let (xv, d) = unsafe { (_mm256_loadu_si256(qx.add(at * BLOCK).cast()), *dx.add(at)) };
            let magnitudes = _mm256_sign_epi8(xv, xv);
            for ((sum, wl), dw) in sums.iter_mut().zip(wl).zip(dws) {
                let pairs = _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(wl, xv));
                let terms = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
                // SAFETY: the weight row's scale of block `at` lies inside `scales`.
                *sum = _mm256_fmadd_ps(terms, _mm256_set1_ps(d * unsafe { *dw.add(at) }), *sum);
            }
        };
        // The 32 weights of block `at` of every weight row.
        let load = |at: usize| {
            let mut wl = [_mm256_setzero_si256(); S];
            for (v, w) in wl.iter_mut().zip(ws) {
                // SAFETY: block `at` < `full` lies inside the weight row.
                *v = unsafe { _mm256_loadu_si256(w.add(at * BLOCK).cast()) };
            }
            wl
        };
        let full = k / BLOCK;
        let mut acc = [[_mm256_setzero_ps(); S]; 2];
        let mut at = 0;
        while at + 2 <= full {
            for w in ws {
                // A prefetch never faults, even past the end of the weights.
                _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(at * BLOCK + AHEAD).cast());
            }
            for (i, sums) in acc.iter_mut().enumerate() {
                block(sums, at + i, load(at + i));
            }
            at += 2;
        }
        if at < full {
            block(&mut acc[0], at, load(at));
            at += 1;
        }
        if at < blocks {
            let len = k - at * BLOCK;
            let mut wl = [_mm256_setzero_si256(); S];
            for (v, w) in wl.iter_mut().zip(ws) {
                let mut last = [0i8; BLOCK];
                // SAFETY: the weight row's last `len` weights.
                last[..len].copy_from_slice(unsafe { std::slice::from_raw_parts(w.add(at * BLOCK), len) });
                // SAFETY: `last` is 32 readable bytes.
                *v = unsafe { _mm256_loadu_si256(last.as_ptr().cast()) };
            }
            block(&mut acc[1], at, wl);
        }
        for (s, n) in ns.into_iter().enumerate() {
            // SAFETY: `out[r, n]` lies inside `out`, and the caller's contract.
            unsafe { *self.out.add(r * self.n + n) = hsum(_mm256_add_ps(acc[0][s], acc[1][s])) };
        }
    }

    /// Columns `cols` of rows `r..r + R`: `C` columns per tile, then the rest one at a time.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn row_block<const R: usize, const C: usize>(&self, r: usize, cols: Range<usize>) {
        let mut n = cols.start;
        while n + C <= cols.end {
            // SAFETY: the caller's contract.
            unsafe { self.tile::<R, C>(r, n) };
            n += C;
        }
        while n < cols.end {
            // SAFETY: the caller's contract.
            unsafe { self.tile::<R, 1>(r, n) };
            n += 1;
        }
    }

    /// Writes the `R × C` block of `out` at row `r`, column `n`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const R: usize, const C: usize>(&self, r: usize, n: usize) {
        let (k, blocks) = (self.k, self.k.div_ceil(BLOCK));
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        for b in 0..blocks {
            let start = b * BLOCK;
            let len = BLOCK.min(k - start);
            let mut wv = [_mm256_setzero_si256(); C];
            let mut dw = [0f32; C];
            for (j, (v, d)) in wv.iter_mut().zip(&mut dw).enumerate() {
                // SAFETY: weight row n + j and its scales lie inside `w` and `scales`.
                let row = unsafe { self.w.add((n + j) * k + start) };
                *d = unsafe { *self.scales.add((n + j) * blocks + b) };
                *v = if len == BLOCK {
                    // SAFETY: 32 weights from `start` lie inside the row.
                    unsafe { _mm256_loadu_si256(row.cast()) }
                } else {
                    let mut last = [0i8; BLOCK];
                    // SAFETY: the row's last `len` weights.
                    last[..len].copy_from_slice(unsafe { std::slice::from_raw_parts(row, len) });
                    // SAFETY: `last` is 32 readable bytes.
                    unsafe { _mm256_loadu_si256(last.as_ptr().cast()) }
                };
            }
            for (i, acc_row) in acc.iter_mut().enumerate() {
                let row = (r + i) * blocks;
                // SAFETY: row r + i's quantized block b and its scale lie inside `qx` and `dx`.
                let (xv, d) = unsafe {
                    (_mm256_loadu_si256(self.qx.add((row + b) * BLOCK).cast()), *self.dx.add(row + b))
                };
                let magnitudes = _mm256_sign_epi8(xv, xv);
                for ((a, &wl), &dwj) in acc_row.iter_mut().zip(&wv).zip(&dw) {
                    let pairs = _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(wl, xv));
                    let sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
                    *a = _mm256_fmadd_ps(sums, _mm256_set1_ps(d * dwj), *a);
                }
            }
        }
        let out_row = |i: usize| {
            // SAFETY: row r + i, columns n..n + C of `out`, which this share owns.
            unsafe { std::slice::from_raw_parts_mut(self.out.add((r + i) * self.n + n), C) }
        };
        if R * C == LANES {
            let mut flat = [_mm256_setzero_ps(); LANES];
            for (v, &a) in flat.iter_mut().zip(acc.as_flattened()) {
                *v = a;
            }
            let mut sums = [0.0f32; LANES];
            // SAFETY: `sums` is 8 writable floats.
            unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), sum8(flat)) };
            for (i, row_sums) in sums.chunks_exact(C).enumerate() {
                out_row(i).copy_from_slice(row_sums);
            }
        } else {
            for (i, acc_row) in acc.iter().enumerate() {
                let dst = out_row(i);
                for (d, &lanes) in dst.iter_mut().zip(acc_row) {
                    *d = hsum(lanes);
                }
            }
        }
    }
}

/// A product of this implementation, as the crate's team shares it.
#[derive(Clone, Copy)]
pub(crate) struct Shared(Path);

/// How a call is shared: the integer tiles by fixed shares of the weight rows, or the packed
/// blocks that the threads take in turn.
#[derive(Clone, Copy)]
pub(crate) enum Path {
    Tiles(Product),
    Packed(Repack<Dequantized>),
}

impl Job for Shared {
    fn extent(&self) -> Extent {
        let (rows, n, k) = match self.0 {
            Path::Tiles(p) => (p.rows, p.n, p.k),
            Path::Packed(repack) => repack.operands.shape(),
        };
        Extent::product(rows, n, k, job::GRANULE)
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract, which `run` keeps; `matmul<q8>` enters only on a CPU
        // with AVX2 and FMA, and the packed blocks' threads share the call's counter.
        unsafe {
            match self.0 {
                Path::Tiles(product) => product.columns(cols),
                Path::Packed(repack) => repack.packed(),
            }
        }
    }
}
