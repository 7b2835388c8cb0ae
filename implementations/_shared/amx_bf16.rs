//! The matrix product of a prefill with bfloat16 weights on AMX tiles (Intel Advanced Matrix
//! Extensions), for the `matmul_bf16` implementations that use them; a call of fewer than
//! [`AMX_ROWS`] rows (a decode step) takes the dot tiles of `shared/avx512_matmul.rs` instead.
//!
//! One `tdpbf16ps` multiplies a tile of 16 rows × 32 bfloat16 activations by a tile of 32 × 16
//! bfloat16 weights (stored as 16 rows of 16 pairs) and adds the 16 × 16 products into a tile of
//! f32 sums: 8192 multiply-adds per instruction. The products of two bfloat16 are exact in f32
//! and the sums are f32, but the activations are f32 and must be bfloat16 to enter the tiles.
//! [`Amx::prepared`] therefore writes each activation as the sum of three bfloat16 (its value
//! cut to the top 8 significant bits, then what is left cut the same way, then the rest, which
//! fits: the three add up to the f32 value exactly), and the tiles multiply all three by the
//! same weights into the same sums: the result is the f32 product of the interface, up to the
//! rounding of the f32 additions (values below about 2⁻¹⁰⁰, and subnormal bfloat16 weights,
//! aside: the tiles read those as zero).
//!
//! The weights stay as nn.Linear stores them: a thread packs each block of [`GRANULE`] weight
//! rows when it reaches it, 32 values of K at a time, into the tiles' layout (row `i` of a B
//! tile holds, for each of the block's 16 weight rows, its values `2i` and `2i + 1`: a 16 × 16
//! transpose of 32-bit pairs), then passes every 32 rows of activations over the packed block
//! with 4 tiles of sums (2 × 2 tiles of 16 × 16), 2 tiles of activations and 2 of weights: the
//! 8 tiles there are.
//!
//! # Safety
//!
//! [`Amx::columns`] may be called only on a CPU with AVX-512F, AVX-512BW, AMX-TILE and
//! AMX-BF16, in a process that the kernel has granted the tiles' state (the crate's start-up
//! check asks for it: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` on Linux), from
//! inside [`Amx::prepared`], on a product whose pointers hold `[rows, k]`, `[n, k]` and
//! `[rows, n]` values (as [`Product::new`] checks), and never twice at once on overlapping
//! column ranges of the same `out`.
#![allow(dead_code, clippy::missing_safety_doc)]

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::avx512_matmul::Product;
use super::avx512_transpose::transpose;

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

/// The bfloat16 terms that each activation is written as.
const PARTS: usize = 3;

thread_local! {
    /// The calling thread's activations as bfloat16 terms, tile by tile (see [`split_row`]).
    static SPLIT: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
    /// The block of weights that a thread is packing or reading: `[⌈k / STEP⌉, 2, TILE]` vectors
    /// of 16 pairs (each vector one row of a B tile).
    static BLOCK: RefCell<Vec<__m512i>> = const { RefCell::new(Vec::new()) };
}

/// A product that runs on the tiles from [`AMX_ROWS`] rows on.
#[derive(Clone, Copy)]
pub struct Amx {
    pub product: Product<u16>,
    /// The activations as bfloat16 terms (see [`SPLIT`]), or null: the dot tiles' path.
    split: *const u16,
}

// SAFETY: pointers to buffers that the caller keeps alive until every thread is done (the
// module's safety section).
unsafe impl Send for Amx {}
unsafe impl Sync for Amx {}

impl Amx {
    /// Runs `f` on the product, with its activations written as bfloat16 terms into this
    /// thread's buffer (alive until `f` returns) when it has [`AMX_ROWS`] rows or more, and as
    /// the dot tiles want them otherwise.
    ///
    /// # Safety
    ///
    /// Only on a CPU with AVX-512F and AVX-512BW, with `x` holding `[rows, k]` values.
    pub unsafe fn prepared<T>(product: Product<u16>, f: impl FnOnce(&Amx) -> T) -> T {
        if product.rows < AMX_ROWS {
            // SAFETY: the caller's contract.
            return unsafe {
                product.prepared::<false, _>(|product| f(&Amx { product: *product, split: std::ptr::null() }))
            };
        }
        SPLIT.with_borrow_mut(|split| {
            let (row_tiles, steps) = (product.rows.div_ceil(PASS) * 2, product.k.div_ceil(STEP));
            // `split_row` writes every value, the padding as zeros: no need to clear it first.
            split.resize(PARTS * row_tiles * steps * TILE * STEP, 0);
            for r in 0..row_tiles * TILE {
                let x = if r < product.rows {
                    // SAFETY: row `r` of x holds `product.k` values (the caller's contract).
                    unsafe { std::slice::from_raw_parts(product.x.add(r * product.k), product.k) }
                } else {
                    &[]
                };
                // SAFETY: the CPU has AVX-512F (the caller's contract).
                unsafe { split_row(x, split, r, row_tiles, steps) };
            }
            f(&Amx { product, split: split.as_ptr() })
        })
    }

    /// Computes the columns `cols` (weight rows) of every row of `out`, and no other.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn columns(&self, cols: Range<usize>) {
        if self.split.is_null() {
            // SAFETY: the caller's contract; `prepared` readied the dot tiles' activations.
            unsafe { self.product.columns(cols) };
            return;
        }
        if cols.is_empty() {
            return;
        }
        BLOCK.with_borrow_mut(|block| {
            let steps = self.product.k.div_ceil(STEP);
            // `pack` writes every vector of the block before `block` reads it: only growth is
            // zero-filled.
            block.resize(steps * 2 * TILE, _mm512_setzero_si512());
            // SAFETY: the CPU has AMX and the process may use it (the caller's contract).
            unsafe { configure() };
            let mut j = cols.start;
            while j < cols.end {
                let width = (cols.end - j).min(GRANULE);
                // SAFETY: columns `j..j + width` are in range (the caller's contract), the
                // block holds `steps` steps of two B tiles, and the tiles are configured.
                unsafe {
                    self.pack(block, j, width);
                    self.block(block, j, width);
                }
                j += width;
            }
            // SAFETY: as above; the tiles' state goes back to the kernel's initial one.
            unsafe { asm!("tilerelease", options(nostack)) };
        });
    }

    /// Packs weight rows `j..j + width` into `block`: for each step of 32 values of K and each
    /// of the two tiles, 16 vectors of 16 pairs, weight rows past `width` and values past `k`
    /// zero.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn pack(&self, block: &mut [__m512i], j: usize, width: usize) {
        let (k, w) = (self.product.k, self.product.w);
        for (s, step) in block.chunks_exact_mut(2 * TILE).enumerate() {
            let k0 = s * STEP;
            let len = (k - k0).min(STEP);
            let mask: __mmask32 = if len == STEP { u32::MAX } else { (1u32 << len) - 1 };
            for (t, tile) in step.chunks_exact_mut(TILE).enumerate() {
                let mut rows = [_mm512_setzero_ps(); TILE];
                let first = j + t * TILE;
                for (i, row) in rows.iter_mut().enumerate().take(width.saturating_sub(t * TILE)) {
                    // SAFETY: weight row `first + i` is below `j + width`, in range, and the
                    // mask keeps the load to its values `k0..k0 + len`.
                    *row = _mm512_castsi512_ps(unsafe {
                        _mm512_maskz_loadu_epi16(mask, w.add((first + i) * k + k0).cast())
                    });
                }
                for (out, pairs) in tile.iter_mut().zip(transpose(rows)) {
                    *out = _mm512_castps_si512(pairs);
                }
            }
        }
    }

    /// Columns `j..j + width` of every row, from the packed block: 32 rows at a time, each
    /// step loading the block's two B tiles and, per bfloat16 term, two A tiles, into four
    /// tiles of sums.
    #[target_feature(enable = "avx512f")]
    unsafe fn block(&self, block: &[__m512i], j: usize, width: usize) {
        let p = &self.product;
        let steps = p.k.div_ceil(STEP);
        let part = p.rows.div_ceil(PASS) * 2 * steps * TILE * STEP;
        let mut sums = [[0.0f32; TILE * TILE]; 4];
        for r in (0..p.rows).step_by(PASS) {
            // SAFETY (every tile instruction below): the tiles are configured as 16 rows of
            // 64 bytes; each B tile is 16 vectors of the block, and each A tile 16 rows of 64
            // bytes, one after the other, inside the terms' buffer.
            unsafe {
                asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack));
                for (s, step) in block.chunks_exact(2 * TILE).enumerate() {
                    let (b0, b1) = (step.as_ptr(), step[TILE..].as_ptr());
                    asm!(
                        "tileloadd tmm6, [{b0} + {s64}*1]",
                        "tileloadd tmm7, [{b1} + {s64}*1]",
                        b0 = in(reg) b0,
                        b1 = in(reg) b1,
                        s64 = in(reg) 64usize,
                        options(nostack, readonly),
                    );
                    for term in 0..PARTS {
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
                let col = j + t * TILE;
                let valid = (j + width).saturating_sub(col).min(TILE);
                if valid == 0 {
                    continue;
                }
                let mask: __mmask16 = if valid == TILE { u16::MAX } else { (1u16 << valid) - 1 };
                for (i, row) in tile.chunks_exact(TILE).enumerate().take(p.rows.saturating_sub(r + h * TILE))
                {
                    // SAFETY: row `r + 16·h + i` is below `rows`, and the columns
                    // `col..col + valid` are in range and in this thread's columns.
                    unsafe {
                        let v = _mm512_loadu_ps(row.as_ptr());
                        _mm512_mask_storeu_ps(p.out.add((r + h * TILE + i) * p.n + col), mask, v);
                    }
                }
            }
        }
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
/// `out`, laid out as `[PARTS, row_tiles, steps, 16, 32]`: each A tile's 16 rows of 32 values
/// one after the other; values past the end of `x` are zeros. Each term is the top 16 bits of
/// what the previous terms leave (exact in f32), so that the three add up to the value; an
/// infinite or NaN value is its first term alone (a NaN made quiet, so that cutting its low
/// bits cannot turn it into an infinity).
#[target_feature(enable = "avx512f")]
fn split_row(x: &[f32], out: &mut [u16], r: usize, row_tiles: usize, steps: usize) {
    let part = row_tiles * steps * TILE * STEP;
    assert!(out.len() >= PARTS * part && r < row_tiles * TILE && x.len() <= steps * STEP);
    let first = (r / TILE) * steps * TILE * STEP + (r % TILE) * STEP;
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
