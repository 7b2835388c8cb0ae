//! The matrix product with bfloat16 weights over weights that [`pack`] rewrote once, at load,
//! into the layout of the AMX tiles (Intel Advanced Matrix Extensions), for the `matmul<bf16>`
//! and `matmul<bf16act>` implementations that read that layout. Each implementation picks a
//! [`Mode`]: whether its activations are exact f32 ([`Exact`], `matmul<bf16>`) or rounded to
//! bfloat16 (the others, `matmul<bf16act>`), whether a call of [`AMX_ROWS`] rows or more (a
//! prefill) runs on the tiles, and whether the calls off the tiles (a decode step, or every call)
//! take AVX512_BF16 dot products or f32 multiply-adds.
//!
//! # On the tiles
//!
//! One `tdpbf16ps` multiplies a tile of 16 rows × 32 bfloat16 activations by a tile of 32 × 16
//! bfloat16 weights (stored as 16 rows of 16 pairs) and adds the 16 × 16 products into a tile of
//! f32 sums: 8192 multiply-adds per instruction. The products of two bfloat16 are exact in f32
//! and the sums are f32, but the activations must be bfloat16 to enter the tiles. For an exact
//! product, [`Amx::prepared`] writes each f32 activation as the sum of three bfloat16 (its value
//! cut to the top 8 significant bits, then what is left cut the same way, then the rest, which
//! fits: the three add up to the f32 value exactly), and the tiles multiply all three by the
//! same weights into the same sums: the result is the f32 product of `matmul<bf16>`, up to the
//! rounding of the f32 additions (values below about 2⁻¹⁰⁰, and subnormal bfloat16 weights,
//! aside: the tiles read those as zero). Rounded activations are one term each, a third of the
//! tiles' work.
//!
//! A prefill passes every 32 rows of activations over each packed block with 4 tiles of sums
//! (2 × 2 tiles of 16 × 16), 2 tiles of activations and 2 of weights: the 8 tiles there are.
//! Every step loads its 4 operand tiles with `tileloadd`, which is fast only from whole cache
//! lines: from 16 bytes off a line (each row of the tile straddling two), a load took about 20
//! ns against 3 on this session's machine, and 4 of them per 4 products (about 7 ns each) held
//! a 2 × 2 block to 37% of the products' peak (`bench/peaks`). The activations' tiles are
//! therefore kept on cache lines, and the weights must start on one: the crates' loader places
//! them so (a `Vec<u16>` as large as a matrix starts 16 bytes into its mapping).
//!
//! # The packed layout
//!
//! [`pack`] cuts the `[n, k]` weights into blocks of [`GRANULE`] weight rows (zero rows pad the
//! last), each block into steps of 32 values of K (zeros pad the last), and each step into the
//! two B tiles of its 16 + 16 weight rows: row `i` of a tile holds, for each of its 16 weight
//! rows, the values `2i` and `2i + 1` of the step (a 16 × 16 transpose of 32-bit pairs). A block
//! is one contiguous run of `steps × 2 × 16` vectors of 64 bytes, in the order a pass reads
//! them. Off the tiles the same vector serves too: its 16 pairs are two values of K for 16
//! output columns, which either widen to f32 with a shift and a mask and multiply a broadcast
//! activation each, or enter `vdpbf16ps` as they are with a broadcast pair of rounded
//! activations; either way with no reduction across lanes at the end.
//!
//! # Safety
//!
//! [`Amx::columns`] may be called only on a CPU with AVX-512F and AVX-512BW, and with what the
//! mode uses: AMX-TILE and AMX-BF16 in a process that the kernel has granted the tiles' state
//! (the crate's start-up check asks for it: `arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)` on Linux), AVX512_BF16; from inside [`Amx::prepared`], never twice at
//! once on overlapping column ranges of the same `out`, and on column ranges that start at a
//! multiple of [`GRANULE`].
#![allow(dead_code, clippy::missing_safety_doc)]

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::ops::Range;

use super::avx512_transpose::transpose;
use super::job::{Extent, Job};

/// Rows from which a call runs on the tiles.
pub const AMX_ROWS: usize = 32;

/// Weight rows (output columns) per block: two B tiles of 16. The team's shares start at a
/// multiple of it.
pub const GRANULE: usize = 32;

/// Rows of every tile, and f32 columns of a tile of sums.
const TILE: usize = 16;

/// Values of K per step: the 32 bfloat16 of a row of activations (64 bytes).
const STEP: usize = 32;

/// Activation rows per pass over a block: two A tiles.
const PASS: usize = 2 * TILE;

/// The bfloat16 terms that each activation is written as for an exact product.
const PARTS: usize = 3;

/// How many steps (of 2 KiB of packed weights each) ahead of the one it reads a pass fetches.
const AHEAD: usize = 2;

/// Most activation rows that share one pass of the dot products over a block: 2 accumulators
/// each, 16 in all.
const PAIRS_GROUP: usize = 8;

/// Most activation rows that share one pass of the decode path over a block: 4 accumulators
/// each (2 tiles' columns × the even and the odd values of K), 16 in all.
const GROUP: usize = 4;

/// The `u16` values of a packed `[n, k]` matrix: whole blocks of whole steps.
pub const fn packed_len(n: usize, k: usize) -> usize {
    n.div_ceil(GRANULE) * GRANULE * k.div_ceil(STEP) * STEP
}

/// The `[n, k]` row-major bfloat16 weights `w` in the packed layout (see the module's docs). The
/// products read the result fastest from an address that is a multiple of 64 bytes, which the
/// returned `Vec` does not promise.
///
/// # Safety
///
/// Only on a CPU with AVX-512F and AVX-512BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub fn pack(w: &[u16], n: usize, k: usize) -> Vec<u16> {
    assert!(w.len() >= n * k, "pack: w is shorter than {n} rows of {k}");
    let steps = k.div_ceil(STEP);
    let mut packed = vec![0u16; packed_len(n, k)];
    // One vector of 32 values per row of a B tile.
    for (b, block) in packed.chunks_exact_mut(GRANULE * steps * STEP).enumerate() {
        for (s, step) in block.chunks_exact_mut(2 * TILE * STEP).enumerate() {
            let k0 = s * STEP;
            let len = (k - k0).min(STEP);
            let mask: __mmask32 = if len == STEP { u32::MAX } else { (1u32 << len) - 1 };
            for (t, tile) in step.chunks_exact_mut(TILE * STEP).enumerate() {
                let first = b * GRANULE + t * TILE;
                let mut rows = [_mm512_setzero_ps(); TILE];
                for (i, row) in rows.iter_mut().enumerate().take(n.saturating_sub(first)) {
                    let at = (first + i) * k + k0;
                    // SAFETY: weight row `first + i` is below `n`, and the mask keeps the load
                    // to its values `k0..k0 + len`, inside `w`.
                    *row = _mm512_castsi512_ps(unsafe {
                        _mm512_maskz_loadu_epi16(mask, w.as_ptr().add(at).cast())
                    });
                }
                for (out, pairs) in tile.chunks_exact_mut(STEP).zip(transpose(rows)) {
                    // SAFETY: `out` holds the 32 values of one tile row.
                    unsafe { _mm512_storeu_ps(out.as_mut_ptr().cast(), pairs) };
                }
            }
        }
    }
    packed
}

/// How a product reads its activations and which instructions multiply them.
pub trait Mode: Copy + Send + Sync + 'static {
    /// The f32 product of the interface `matmul<bf16>` (each activation three bfloat16 terms on
    /// the tiles); otherwise each activation is rounded to the nearest bfloat16 (ties to even)
    /// first, as `matmul<bf16act>` defines.
    const EXACT: bool;
    /// From [`AMX_ROWS`] rows on, the AMX tiles; otherwise AVX-512 at every row count.
    const TILES: bool;
    /// Off the tiles, AVX512_BF16 dot products (`vdpbf16ps`) of the rounded activations' pairs
    /// by the weights' pairs (only without [`Mode::EXACT`]); otherwise f32 multiply-adds of the
    /// weights widened.
    const PAIRS: bool;
}

/// `matmul<bf16>` on AMX tiles: exact activations, f32 multiply-adds off the tiles.
#[derive(Clone, Copy)]
pub struct Exact;

impl Mode for Exact {
    const EXACT: bool = true;
    const TILES: bool = true;
    const PAIRS: bool = false;
}

/// `matmul<bf16act>` on AMX tiles, AVX512_BF16 dot products off them.
#[derive(Clone, Copy)]
pub struct RoundedTiles;

impl Mode for RoundedTiles {
    const EXACT: bool = false;
    const TILES: bool = true;
    const PAIRS: bool = true;
}

/// `matmul<bf16act>` in AVX512_BF16 dot products at every row count.
#[derive(Clone, Copy)]
pub struct RoundedPairs;

impl Mode for RoundedPairs {
    const EXACT: bool = false;
    const TILES: bool = false;
    const PAIRS: bool = true;
}

/// `matmul<bf16act>` in f32 multiply-adds at every row count (AVX-512F alone).
#[derive(Clone, Copy)]
pub struct Rounded;

impl Mode for Rounded {
    const EXACT: bool = false;
    const TILES: bool = false;
    const PAIRS: bool = false;
}

thread_local! {
    /// The calling thread's activations as bfloat16 terms, tile by tile (see [`split_row`]), on
    /// whole cache lines: a `tileloadd` whose rows straddle two lines takes about 6 times as
    /// long as one whose rows are aligned to 64 bytes.
    static SPLIT: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
    /// The calling thread's activations for f32 multiply-adds, each row padded with zeros to
    /// whole steps.
    static PADDED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The calling thread's activations for dot products: each row's rounded values as pairs
    /// (value `2i` in the low half, `2i + 1` in the high one), padded with zeros to whole steps.
    static PAIRED: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// One row of an A tile: 32 bfloat16 on a cache line of their own.
#[derive(Clone, Copy)]
#[repr(align(64))]
struct Line([u16; STEP]);

/// A product over packed weights, ready to share out by columns.
#[derive(Clone, Copy)]
pub struct Amx<M: Mode> {
    out: *mut f32,
    /// The packed weights.
    w: *const u16,
    pub rows: usize,
    pub n: usize,
    pub k: usize,
    /// Steps of [`STEP`] values of K.
    steps: usize,
    /// From [`AMX_ROWS`] rows on, the activations as bfloat16 terms (see [`SPLIT`]); else null.
    split: *const u16,
    /// Off the tiles, the padded activations (see [`PADDED`]); else null.
    padded: *const f32,
    /// Off the tiles, the paired activations (see [`PAIRED`]); else null.
    paired: *const u32,
    mode: PhantomData<M>,
}

// SAFETY: pointers to buffers that the caller keeps alive until every thread is done (the
// module's safety section).
unsafe impl<M: Mode> Send for Amx<M> {}
unsafe impl<M: Mode> Sync for Amx<M> {}

impl<M: Mode> Amx<M> {
    /// The bfloat16 terms per activation on the tiles.
    const PARTS: usize = if M::EXACT { PARTS } else { 1 };

    /// Runs `f` on the product `out = x · wᵀ` of `rows` rows, for packed `[N, K]` weights `w`,
    /// with its activations written into this thread's buffer (alive until `f` returns): as
    /// bfloat16 terms on the tiles (from [`AMX_ROWS`] rows on, with [`Mode::TILES`]), as padded
    /// or paired rows off them.
    ///
    /// # Safety
    ///
    /// Only on a CPU with AVX-512F, and AVX512_BF16 for a mode with [`Mode::TILES`] and rounded
    /// activations.
    pub unsafe fn prepared<const N: usize, const K: usize, T>(
        out: &mut [f32],
        x: &[f32],
        w: &[u16],
        rows: usize,
        f: impl FnOnce(&Amx<M>) -> T,
    ) -> T {
        assert!(x.len() >= rows * K, "matmul: x is shorter than {rows} rows of {K}");
        assert!(w.len() == packed_len(N, K), "matmul: w is not {N} × {K} weights packed by `pack`");
        assert!(out.len() >= rows * N, "matmul: out is shorter than {rows} rows of {N}");
        let steps = K.div_ceil(STEP);
        let mut amx = Amx {
            out: out.as_mut_ptr(),
            w: w.as_ptr(),
            rows,
            n: N,
            k: K,
            steps,
            split: std::ptr::null(),
            padded: std::ptr::null(),
            paired: std::ptr::null(),
            mode: PhantomData,
        };
        if (!M::TILES || rows < AMX_ROWS) && M::PAIRS {
            return PAIRED.with_borrow_mut(|paired| {
                paired.clear();
                paired.resize(rows * steps * STEP / 2, 0);
                for (to, from) in paired.chunks_exact_mut(steps * STEP / 2).zip(x.chunks_exact(K.max(1))) {
                    for (i, to) in to.iter_mut().enumerate().take(K.div_ceil(2)) {
                        let even = bf16_bits(from[2 * i]);
                        let odd = from.get(2 * i + 1).map_or(0, |&v| bf16_bits(v));
                        *to = even | odd << 16;
                    }
                }
                amx.paired = paired.as_ptr();
                f(&amx)
            });
        }
        if !M::TILES || rows < AMX_ROWS {
            return PADDED.with_borrow_mut(|padded| {
                padded.clear();
                padded.resize(rows * steps * STEP, 0.0);
                for (to, from) in padded.chunks_exact_mut(steps * STEP).zip(x.chunks_exact(K.max(1))) {
                    if M::EXACT {
                        to[..K].copy_from_slice(from);
                    } else {
                        for (to, &from) in to.iter_mut().zip(from) {
                            *to = round_bf16(from);
                        }
                    }
                }
                amx.padded = padded.as_ptr();
                f(&amx)
            });
        }
        SPLIT.with_borrow_mut(|split| {
            let row_tiles = rows.div_ceil(PASS) * 2;
            // `split_row` writes every value, the padding as zeros: no need to clear it first.
            split.resize(Self::PARTS * row_tiles * steps * TILE, Line([0; STEP]));
            // SAFETY: a `Line` is 32 `u16` and nothing else.
            let split: &mut [u16] =
                unsafe { std::slice::from_raw_parts_mut(split.as_mut_ptr().cast(), split.len() * STEP) };
            for r in 0..row_tiles * TILE {
                let x = if r < rows { &x[r * K..(r + 1) * K] } else { &[] };
                // SAFETY: the CPU has AVX-512F, and AVX512_BF16 for rounded activations (the
                // caller's contract).
                unsafe { split_row::<M>(x, split, r, row_tiles, steps) };
            }
            amx.split = split.as_ptr();
            f(&amx)
        })
    }

    /// Computes the columns `cols` (weight rows) of every row of `out`, and no other.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn columns(&self, cols: Range<usize>) {
        if cols.is_empty() {
            return;
        }
        debug_assert!(cols.start.is_multiple_of(GRANULE));
        if self.split.is_null() && M::PAIRS {
            for j in cols.clone().step_by(GRANULE) {
                let width = (cols.end - j).min(GRANULE);
                for r in (0..self.rows).step_by(PAIRS_GROUP) {
                    // SAFETY: the caller's contract (the CPU has AVX512_BF16 for a mode with
                    // `PAIRS`); block `j / GRANULE` is packed and rows `r..` are in range.
                    unsafe {
                        match self.rows - r {
                            1 => self.dot_pairs::<1>(j, width, r),
                            2 => self.dot_pairs::<2>(j, width, r),
                            3 => self.dot_pairs::<3>(j, width, r),
                            4 => self.dot_pairs::<4>(j, width, r),
                            5 => self.dot_pairs::<5>(j, width, r),
                            6 => self.dot_pairs::<6>(j, width, r),
                            7 => self.dot_pairs::<7>(j, width, r),
                            _ => self.dot_pairs::<PAIRS_GROUP>(j, width, r),
                        }
                    }
                }
            }
            return;
        }
        if self.split.is_null() {
            for j in cols.clone().step_by(GRANULE) {
                let width = (cols.end - j).min(GRANULE);
                for r in (0..self.rows).step_by(GROUP) {
                    // SAFETY: the caller's contract; block `j / GRANULE` is packed and rows
                    // `r..` are in range.
                    unsafe {
                        match self.rows - r {
                            1 => self.dot::<1>(j, width, r),
                            2 => self.dot::<2>(j, width, r),
                            3 => self.dot::<3>(j, width, r),
                            _ => self.dot::<GROUP>(j, width, r),
                        }
                    }
                }
            }
            return;
        }
        // SAFETY: the CPU has AMX and the process may use it (the caller's contract).
        unsafe { configure() };
        for j in cols.clone().step_by(GRANULE) {
            // SAFETY: columns `j..` are in range (the caller's contract), and the tiles are
            // configured.
            unsafe { self.block(j, (cols.end - j).min(GRANULE)) };
        }
        // SAFETY: as above; the tiles' state goes back to the kernel's initial one.
        unsafe { asm!("tilerelease", options(nostack)) };
    }

    /// The packed block of weight rows `j..j + GRANULE`.
    fn block_ptr(&self, j: usize) -> *const u16 {
        self.w.wrapping_add(j / GRANULE * GRANULE * self.steps * STEP)
    }

    /// Columns `j..j + width` of rows `r..r + R`, from the packed block, on AVX-512: each tile
    /// row's 16 pairs widen to two vectors of f32 (the values `2i` and `2i + 1` of the step),
    /// each multiplied by that value of every row, broadcast.
    #[target_feature(enable = "avx512f")]
    unsafe fn dot<const R: usize>(&self, j: usize, width: usize, r: usize) {
        let block = self.block_ptr(j);
        let row_len = self.steps * STEP;
        // acc[row][tile][parity]
        let mut acc = [[[_mm512_setzero_ps(); 2]; 2]; R];
        let high = _mm512_set1_epi32(0xffff_0000u32 as i32);
        for s in 0..self.steps {
            let ahead = block.wrapping_add((s + AHEAD) * 2 * TILE * STEP);
            for i in 0..TILE {
                // The hardware's prefetchers fall behind one stream: fetch the step `AHEAD`
                // steps on (past the block, the next one, which follows it in memory).
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(i * STEP).cast());
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add((TILE + i) * STEP).cast());
                // SAFETY (loads): the block holds `steps` steps of two tiles of 16 rows of 32
                // values; each activation row `steps × 32` values.
                let (lo, hi) = unsafe {
                    let v0 = _mm512_loadu_si512(block.add(((s * 2) * TILE + i) * STEP).cast());
                    let v1 = _mm512_loadu_si512(block.add(((s * 2 + 1) * TILE + i) * STEP).cast());
                    (
                        [
                            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v0)),
                            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v1)),
                        ],
                        [
                            _mm512_castsi512_ps(_mm512_and_si512(v0, high)),
                            _mm512_castsi512_ps(_mm512_and_si512(v1, high)),
                        ],
                    )
                };
                for (row, acc) in acc.iter_mut().enumerate() {
                    let x = unsafe { self.padded.add((r + row) * row_len + s * STEP + 2 * i) };
                    // SAFETY: as above.
                    let (even, odd) = unsafe { (_mm512_set1_ps(*x), _mm512_set1_ps(*x.add(1))) };
                    for t in 0..2 {
                        acc[t][0] = _mm512_fmadd_ps(lo[t], even, acc[t][0]);
                        acc[t][1] = _mm512_fmadd_ps(hi[t], odd, acc[t][1]);
                    }
                }
            }
        }
        for (row, acc) in acc.iter().enumerate() {
            for (t, acc) in acc.iter().enumerate() {
                let valid = width.saturating_sub(t * TILE).min(TILE);
                if valid == 0 {
                    continue;
                }
                let mask: __mmask16 = if valid == TILE { u16::MAX } else { (1u16 << valid) - 1 };
                // SAFETY: row `r + row` is below `rows`, and the columns `j + 16·t..` up to
                // `valid` are in range and in this thread's columns.
                unsafe {
                    _mm512_mask_storeu_ps(
                        self.out.add((r + row) * self.n + j + t * TILE),
                        mask,
                        _mm512_add_ps(acc[0], acc[1]),
                    )
                };
            }
        }
    }

    /// Columns `j..j + width` of rows `r..r + R`, from the packed block, in AVX512_BF16 dot
    /// products: each tile row's 16 pairs of weights by the row's pair of rounded activations
    /// (the values `2i` and `2i + 1` of the step), broadcast, into 16 f32 sums.
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn dot_pairs<const R: usize>(&self, j: usize, width: usize, r: usize) {
        let block = self.block_ptr(j);
        let row_len = self.steps * STEP / 2;
        // acc[row][tile]
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        for s in 0..self.steps {
            let ahead = block.wrapping_add((s + AHEAD) * 2 * TILE * STEP);
            for i in 0..TILE {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(i * STEP).cast());
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add((TILE + i) * STEP).cast());
                // SAFETY (loads): the block holds `steps` steps of two tiles of 16 rows of 32
                // values; each paired row `steps × 16` pairs. The transmutes are between
                // vectors of 64 bytes.
                let w: [__m512bh; 2] = unsafe {
                    [
                        std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                            block.add((s * 2 * TILE + i) * STEP).cast(),
                        )),
                        std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                            block.add(((s * 2 + 1) * TILE + i) * STEP).cast(),
                        )),
                    ]
                };
                for (row, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: as above.
                    // A broadcast from memory, as f32 bits: one load, no shuffle.
                    let x: __m512bh = unsafe {
                        std::mem::transmute::<__m512, __m512bh>(_mm512_set1_ps(
                            *self.paired.add((r + row) * row_len + s * TILE + i).cast::<f32>(),
                        ))
                    };
                    for t in 0..2 {
                        acc[t] = _mm512_dpbf16_ps(acc[t], x, w[t]);
                    }
                }
            }
        }
        for (row, acc) in acc.iter().enumerate() {
            for (t, &sums) in acc.iter().enumerate() {
                let valid = width.saturating_sub(t * TILE).min(TILE);
                if valid == 0 {
                    continue;
                }
                let mask: __mmask16 = if valid == TILE { u16::MAX } else { (1u16 << valid) - 1 };
                // SAFETY: row `r + row` is below `rows`, and the columns `j + 16·t..` up to
                // `valid` are in range and in this thread's columns.
                unsafe { _mm512_mask_storeu_ps(self.out.add((r + row) * self.n + j + t * TILE), mask, sums) };
            }
        }
    }

    /// Columns `j..j + width` of every row, from the packed block, on the tiles: 32 rows at a
    /// time, each step loading the block's two B tiles and, per bfloat16 term, two A tiles,
    /// into four tiles of sums.
    #[target_feature(enable = "avx512f")]
    unsafe fn block(&self, j: usize, width: usize) {
        let steps = self.steps;
        let block = self.block_ptr(j);
        let part = self.rows.div_ceil(PASS) * 2 * steps * TILE * STEP;
        let mut sums = [[0.0f32; TILE * TILE]; 4];
        // The passes after the first read the block from L2 and leave the memory idle: they
        // fetch the next block into L2 meanwhile, a share of its lines at every step, so that
        // its first pass does not wait on memory (past this thread's columns or the matrix, the
        // lines fetched go unused).
        let next = self.block_ptr(j + GRANULE);
        let lines = steps * 2 * TILE;
        let per_step = lines.div_ceil((self.rows.div_ceil(PASS) - 1).max(1) * steps);
        let mut fetched = 0;
        for r in (0..self.rows).step_by(PASS) {
            // SAFETY (every tile instruction below): the tiles are configured as 16 rows of
            // 64 bytes; each B tile is 16 rows of the packed block, and each A tile 16 rows of
            // 64 bytes, one after the other, inside the terms' buffer.
            unsafe {
                asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack));
                for s in 0..steps {
                    let b0 = block.add(s * 2 * TILE * STEP);
                    let b1 = b0.add(TILE * STEP);
                    if r == 0 {
                        // The first pass reads the block from memory (or from L2, fetched by
                        // the previous block's passes): fetch the step `AHEAD` steps on.
                        let ahead = b0.wrapping_add(AHEAD * 2 * TILE * STEP);
                        for line in 0..2 * TILE {
                            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line * STEP).cast());
                        }
                    } else {
                        for _ in 0..per_step.min(lines - fetched) {
                            _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(fetched * STEP).cast());
                            fetched += 1;
                        }
                    }
                    asm!(
                        "tileloadd tmm6, [{b0} + {s64}*1]",
                        "tileloadd tmm7, [{b1} + {s64}*1]",
                        b0 = in(reg) b0,
                        b1 = in(reg) b1,
                        s64 = in(reg) 64usize,
                        options(nostack, readonly),
                    );
                    for term in 0..Self::PARTS {
                        let a0 = self.split.add(term * part + ((r / TILE) * steps + s) * TILE * STEP);
                        let a1 = a0.add(steps * TILE * STEP);
                        asm!(
                            "tileloadd tmm4, [{a0} + {s64}*1]",
                            "tileloadd tmm5, [{a1} + {s64}*1]",
                            "tdpbf16ps tmm0, tmm4, tmm6",
                            "tdpbf16ps tmm1, tmm4, tmm7",
                            "tdpbf16ps tmm2, tmm5, tmm6",
                            "tdpbf16ps tmm3, tmm5, tmm7",
                            a0 = in(reg) a0,
                            a1 = in(reg) a1,
                            s64 = in(reg) 64usize,
                            options(nostack, readonly),
                        );
                    }
                }
                if width == GRANULE && r + PASS <= self.rows {
                    // Whole tiles: stored straight into `out`, a row of 16 sums every `n`
                    // values (rows r.. and r + 16.., columns j.. and j + 16..).
                    let c0 = self.out.add(r * self.n + j);
                    asm!(
                        "tilestored [{c0} + {stride}*1], tmm0",
                        "tilestored [{c1} + {stride}*1], tmm1",
                        "tilestored [{c2} + {stride}*1], tmm2",
                        "tilestored [{c3} + {stride}*1], tmm3",
                        c0 = in(reg) c0,
                        c1 = in(reg) c0.add(TILE),
                        c2 = in(reg) c0.add(TILE * self.n),
                        c3 = in(reg) c0.add(TILE * self.n + TILE),
                        stride = in(reg) self.n * 4,
                        options(nostack),
                    );
                    continue;
                }
                asm!(
                    "tilestored [{c0} + {s64}*1], tmm0",
                    "tilestored [{c1} + {s64}*1], tmm1",
                    "tilestored [{c2} + {s64}*1], tmm2",
                    "tilestored [{c3} + {s64}*1], tmm3",
                    c0 = in(reg) sums[0].as_mut_ptr(),
                    c1 = in(reg) sums[1].as_mut_ptr(),
                    c2 = in(reg) sums[2].as_mut_ptr(),
                    c3 = in(reg) sums[3].as_mut_ptr(),
                    s64 = in(reg) 64usize,
                    options(nostack),
                );
            }
            // Tile 2·h + t holds rows r + 16·h.., columns j + 16·t.. .
            for (index, tile) in sums.iter().enumerate() {
                let (h, t) = (index / 2, index % 2);
                let valid = width.saturating_sub(t * TILE).min(TILE);
                if valid == 0 {
                    continue;
                }
                let mask: __mmask16 = if valid == TILE { u16::MAX } else { (1u16 << valid) - 1 };
                let col = j + t * TILE;
                for (i, row) in
                    tile.chunks_exact(TILE).enumerate().take(self.rows.saturating_sub(r + h * TILE))
                {
                    // SAFETY: row `r + 16·h + i` is below `rows`, and the columns
                    // `col..col + valid` are in range and in this thread's columns.
                    unsafe {
                        let v = _mm512_loadu_ps(row.as_ptr());
                        _mm512_mask_storeu_ps(self.out.add((r + h * TILE + i) * self.n + col), mask, v);
                    }
                }
            }
        }
    }
}

/// A product as the crate's team shares it, by blocks of [`GRANULE`] weight rows: each
/// implementation names its `Amx<Mode>` as its `team_job`, one mode per implementation.
impl<M: Mode> Job for Amx<M> {
    fn extent(&self) -> Extent {
        Extent::product(self.rows, self.n, self.k, GRANULE)
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract, which `team::run` keeps (disjoint ranges, each starting
        // at a multiple of the granule). The inherent method, compiled for AVX-512F.
        unsafe { Amx::columns(self, cols) }
    }
}

/// Loads the tile configuration: palette 1, the 8 tiles each 16 rows of 64 bytes.
///
/// # Safety
///
/// Only on a CPU with AMX-TILE, in a process granted the tiles' state.
unsafe fn configure() {
    let mut config = [0u8; 64];
    config[0] = 1;
    for tile in 0..8 {
        config[16 + 2 * tile..18 + 2 * tile].copy_from_slice(&64u16.to_le_bytes());
        config[48 + tile] = TILE as u8;
    }
    // SAFETY: the caller's contract; `config` is a valid configuration of 64 bytes.
    unsafe { asm!("ldtilecfg [{0}]", in(reg) config.as_ptr(), options(nostack, readonly)) };
}

/// Writes row `r` of the activations (`x`; empty for a row of padding) as bfloat16 terms into
/// `out`, laid out as `[parts, row_tiles, steps, 16, 32]`: each A tile's 16 rows of 32 values
/// one after the other; values past the end of `x` are zeros.
///
/// With [`Mode::EXACT`], [`PARTS`] terms, each the top 16 bits of what the previous terms leave (exact
/// in f32), so that the three add up to the value; an infinite or NaN value is its first term
/// alone (a NaN made quiet, so that cutting its low bits cannot turn it into an infinity).
/// Without, one term: the value rounded to the nearest bfloat16, ties to even, by
/// `vcvtne2ps2bf16` (see [`round_row`]).
///
/// # Safety
///
/// Without [`Mode::EXACT`], only on a CPU with AVX512_BF16 (every rounded mode on the tiles
/// uses it off them as well).
#[target_feature(enable = "avx512f")]
unsafe fn split_row<M: Mode>(x: &[f32], out: &mut [u16], r: usize, row_tiles: usize, steps: usize) {
    let part = row_tiles * steps * TILE * STEP;
    let parts = Amx::<M>::PARTS;
    assert!(out.len() >= parts * part && r < row_tiles * TILE && x.len() <= steps * STEP);
    let first = (r / TILE) * steps * TILE * STEP + (r % TILE) * STEP;
    if !M::EXACT {
        // SAFETY: the caller's contract.
        unsafe { round_row(x, &mut out[first..], steps) };
        return;
    }
    let high = _mm512_set1_epi32(0xffff_0000u32 as i32);
    let exponent = _mm512_set1_epi32(0x7f80_0000);
    // Halves of a tile row: 16 values each.
    for half in 0..2 * steps {
        let k0 = half * TILE;
        let len = x.len().saturating_sub(k0).min(TILE);
        let mask: __mmask16 = if len == TILE { u16::MAX } else { (1u16 << len) - 1 };
        // SAFETY: the mask keeps the load inside `x` (none at all past its end, where the
        // address is never read).
        let v = unsafe { _mm512_maskz_loadu_ps(mask, x.as_ptr().wrapping_add(k0)) };
        let finite = _mm512_cmpneq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), exponent), exponent);
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        let v = _mm512_castsi512_ps(_mm512_mask_or_epi32(
            _mm512_castps_si512(v),
            nan,
            _mm512_castps_si512(v),
            _mm512_set1_epi32(0x0040_0000),
        ));
        let at = first + (half / 2) * TILE * STEP + (half % 2) * TILE;
        let mut rest = v;
        for term in 0..PARTS {
            let bits = _mm512_and_si512(_mm512_castps_si512(rest), high);
            let terms = _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(bits));
            // SAFETY: the assertion above keeps the 16 values inside `out`.
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(term * part + at).cast(), terms) };
            rest = _mm512_maskz_sub_ps(finite, rest, _mm512_castsi512_ps(bits));
        }
    }
}

/// Writes one row of activations (`x`; empty for a row of padding) rounded to the nearest
/// bfloat16, ties to even, into `out`: the values of step `s` (zeros past the end of `x`) at
/// `s × 16 × 32`, the row's place in each A tile of its row of tiles. `vcvtne2ps2bf16` rounds as
/// [`bf16_bits`] does, NaNs made quiet, except that it reads f32 subnormals as zero: the tiles
/// read the bfloat16 subnormals that they would round to as zero anyway, and the largest of them
/// (from 2⁻¹²⁶ · (1 − 2⁻⁹)), which round up to the smallest normal bfloat16, count for less than
/// 2⁻¹²⁶ times their weight.
///
/// # Safety
///
/// Only on a CPU with AVX-512F and AVX512_BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn round_row(x: &[f32], out: &mut [u16], steps: usize) {
    assert!(x.len() <= steps * STEP && (steps == 0 || out.len() >= (steps - 1) * TILE * STEP + STEP));
    for s in 0..steps {
        let k0 = s * STEP;
        let masks = [0, TILE].map(|h| {
            let len = x.len().saturating_sub(k0 + h).min(TILE);
            if len == TILE { u16::MAX } else { (1u16 << len) - 1 }
        });
        // SAFETY: the masks keep the loads inside `x` (none at all past its end, where the
        // address is never read); the assertion keeps the 32 values inside `out`.
        unsafe {
            let low = _mm512_maskz_loadu_ps(masks[0], x.as_ptr().wrapping_add(k0));
            let high = _mm512_maskz_loadu_ps(masks[1], x.as_ptr().wrapping_add(k0 + TILE));
            let pairs: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(high, low));
            _mm512_storeu_si512(out.as_mut_ptr().add(s * TILE * STEP).cast(), pairs);
        }
    }
}

/// `value` rounded to the nearest bfloat16 (ties to even), as an f32; a NaN stays a NaN (made
/// quiet, its payload cut).
pub fn round_bf16(value: f32) -> f32 {
    f32::from_bits(bf16_bits(value) << 16)
}

/// The bits of the bfloat16 nearest to `value` (ties to even); a NaN stays a NaN (made quiet,
/// its payload cut).
pub fn bf16_bits(value: f32) -> u32 {
    let bits = value.to_bits();
    if value.is_nan() {
        return (bits | 0x0040_0000) >> 16;
    }
    bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16
}
