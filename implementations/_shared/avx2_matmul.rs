//! The AVX2 + FMA matrix product `out = x · wᵀ` that the AVX2 matmul implementations share:
//! single-threaded, register blocked, weight blocked.
//!
//! The weight rows are taken in blocks of about 16 KiB, and every activation row passes over a
//! block while it is in L1, so each weight is read from memory once however many rows there
//! are. Within a block the output is cut into tiles of 2 activation rows × 4 weight rows, or
//! 1 × 8 for a single leftover row (a decode step). A tile keeps its 8 dot products in 8
//! accumulators of 8 lanes, so every step of 8 along K loads 6 (or 9) vectors for 8 fused
//! multiply-adds. At the end of K one transposed horizontal-add tree turns the 8 accumulators
//! into one vector of the tile's 8 results. K that is not a multiple of 8 ends with masked
//! loads; N that is not a multiple of the tile width ends with single weight rows.
//!
//! # Safety
//!
//! Code that does not itself enable AVX2 and FMA may call [`matmul_avx2`] (in `unsafe`) only
//! on a CPU that has both features.
#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use super::avx2_math::{LANES, dot_tile, hsum, store, sum8};

/// `out[r, n] = Σₖ x[r, k] · w[n, k]` for `rows` rows; the slices hold at least
/// `[rows, K]`, `[N, K]` and `[rows, N]` values.
#[target_feature(enable = "avx2,fma")]
pub fn matmul_avx2<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[f32], rows: usize) {
    // Weight rows go in blocks of about 16 KiB, and every activation row passes over a block
    // while it is in L1: each weight is read from memory once, however many rows there are.
    let block = (16 * 1024 / (4 * K)).max(1).next_multiple_of(8);
    let mut n0 = 0;
    while n0 < N {
        let n1 = (n0 + block).min(N);
        let mut r = 0;
        while r + 2 <= rows {
            row_block::<N, K, 2, 4>(out, x, w, r, n0..n1);
            r += 2;
        }
        if r < rows {
            row_block::<N, K, 1, 8>(out, x, w, r, n0..n1);
        }
        n0 = n1;
    }
}

/// Computes columns `cols` of rows `r..r + R` of `out`: `C` columns per tile, then the
/// leftover columns one at a time.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn row_block<const N: usize, const K: usize, const R: usize, const C: usize>(
    out: &mut [f32],
    x: &[f32],
    w: &[f32],
    r: usize,
    cols: std::ops::Range<usize>,
) {
    let mut n = cols.start;
    while n + C <= cols.end {
        tile::<N, K, R, C>(out, x, w, r, n);
        n += C;
    }
    while n < cols.end {
        tile::<N, K, R, 1>(out, x, w, r, n);
        n += 1;
    }
}

/// Computes the `R × C` block of `out` at row `r`, column `n`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn tile<const N: usize, const K: usize, const R: usize, const C: usize>(
    out: &mut [f32],
    x: &[f32],
    w: &[f32],
    r: usize,
    n: usize,
) {
    let acc = dot_tile::<K, R, C>(rows_from::<K, R>(x, r), rows_from::<K, C>(w, n));
    if R * C == LANES {
        // One transposed reduction yields the tile's 8 results, row by row.
        let flat: [__m256; LANES] = acc
            .as_flattened()
            .try_into()
            .expect("a tile of 8 accumulators");
        let mut sums = [0.0; LANES];
        store(&mut sums, 0, sum8(flat));
        for (i, row_sums) in sums.chunks_exact(C).enumerate() {
            out[(r + i) * N + n..][..C].copy_from_slice(row_sums);
        }
    } else {
        for (i, row_acc) in acc.iter().enumerate() {
            for (j, &lanes) in row_acc.iter().enumerate() {
                out[(r + i) * N + n + j] = hsum(lanes);
            }
        }
    }
}

/// Rows `first..first + COUNT` of the row-major matrix `m` with rows of `K` values.
#[inline]
fn rows_from<const K: usize, const COUNT: usize>(m: &[f32], first: usize) -> [&[f32]; COUNT] {
    let mut rows: [&[f32]; COUNT] = [&[]; COUNT];
    for (i, row) in rows.iter_mut().enumerate() {
        *row = &m[(first + i) * K..][..K];
    }
    rows
}
