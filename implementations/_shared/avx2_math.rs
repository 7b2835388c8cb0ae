//! AVX2 + FMA building blocks of the SIMD kernels: loads and stores of whole and partial
//! 8-lane vectors, tiles of dot products, horizontal reductions and a vectorised `exp`.
//!
//! Every helper is a safe `#[target_feature(enable = "avx2,fma")]` function. Kernels call
//! them from their own AVX2 code, which the generated crate enters only after checking at
//! start-up that the CPU has these features; inlined there, they cost no call.
//!
//! Memory is always reached through slices: loads and stores take a slice and an offset and
//! are bounds checked (checks that the compiler removes where the shapes are constants), and
//! the partial forms use masked loads and stores that touch only the lanes they keep.
//!
//! Code with `#[target_feature]`, here and in the kernels, uses loops rather than closures
//! (`array::map`, `array::from_fn`): a closure inherits the features of its function, so the
//! generic code that calls it, which lacks them, cannot inline it.
//!
//! A generated crate includes this module for whichever of its kernels use it, and those may
//! need only some of the helpers, hence `allow(dead_code)`; the safety condition below is the
//! same for every helper, hence `allow(clippy::missing_safety_doc)`.
//!
//! # Safety
//!
//! Code that does not itself enable AVX2 and FMA may call these helpers (in `unsafe`) only on
//! a CPU that has both features.
#![allow(dead_code, clippy::missing_safety_doc)]

use std::arch::x86_64::*;

/// The number of f32 lanes in an AVX register.
pub const LANES: usize = 8;

/// Loads the 8 values `src[at..at + 8]`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn load(src: &[f32], at: usize) -> __m256 {
    let lanes = &src[at..at + LANES];
    // SAFETY: `lanes` is 8 readable floats.
    unsafe { _mm256_loadu_ps(lanes.as_ptr()) }
}

/// Stores `v` to `dst[at..at + 8]`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn store(dst: &mut [f32], at: usize, v: __m256) {
    let lanes = &mut dst[at..at + LANES];
    // SAFETY: `lanes` is 8 writable floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) }
}

/// A mask whose first `len` lanes are set (all of them when `len >= 8`).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn lane_mask(len: usize) -> __m256i {
    let index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let len = len.min(LANES) as i32;
    _mm256_cmpgt_epi32(_mm256_set1_epi32(len), index)
}

/// Loads the first `min(src.len(), 8)` values of `src`; the other lanes are zero.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn load_partial(src: &[f32]) -> __m256 {
    // SAFETY: a masked load reads only the lanes its mask selects, here the first
    // `min(src.len(), 8)` elements of `src`.
    unsafe { _mm256_maskload_ps(src.as_ptr(), lane_mask(src.len())) }
}

/// Stores the first `min(dst.len(), 8)` lanes of `v` to `dst`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn store_partial(dst: &mut [f32], v: __m256) {
    let mask = lane_mask(dst.len());
    // SAFETY: a masked store writes only the lanes its mask selects, here the first
    // `min(dst.len(), 8)` elements of `dst`.
    unsafe { _mm256_maskstore_ps(dst.as_mut_ptr(), mask, v) }
}

/// Loads the 8 values at `src[at..]`, or the fewer that remain there, zero-padded.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn load_upto(src: &[f32], at: usize) -> __m256 {
    if at + LANES <= src.len() {
        load(src, at)
    } else {
        load_partial(&src[at..])
    }
}

/// Stores the first lanes of `v` to `dst[at..]`: 8 of them, or the fewer that fit.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn store_upto(dst: &mut [f32], at: usize, v: __m256) {
    if at + LANES <= dst.len() {
        store(dst, at, v);
    } else {
        store_partial(&mut dst[at..], v);
    }
}

/// Lane-wise partial dot products of `R` rows of `a` with `C` rows of `b`, `K` values each.
///
/// The 8 lanes of `result[i][j]` add up to `a[i] · b[j]`; reduce them with [`hsum`], or
/// 8 accumulators at once with [`sum8`]. Each step along K loads `R + C` vectors for `R · C`
/// fused multiply-adds, so the tile shape sets the ratio of arithmetic to loads; `R · C`
/// accumulators plus the loaded vectors must fit the 16 registers. When K is not a multiple
/// of 8 the last step uses masked loads.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn dot_tile<const K: usize, const R: usize, const C: usize>(
    a: [&[f32]; R],
    b: [&[f32]; C],
) -> [[__m256; C]; R] {
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let full = K - K % LANES;
    for k in (0..full).step_by(LANES) {
        fma_tile(&mut acc, load_rows(a, k), load_rows(b, k));
    }
    if full < K {
        fma_tile(&mut acc, load_row_tails(a, full), load_row_tails(b, full));
    }
    acc
}

/// `acc[i][j] += a[i] · b[j]`, lane by lane.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn fma_tile<const R: usize, const C: usize>(
    acc: &mut [[__m256; C]; R],
    a: [__m256; R],
    b: [__m256; C],
) {
    for (acc_row, a_lanes) in acc.iter_mut().zip(a) {
        for (acc_lanes, &b_lanes) in acc_row.iter_mut().zip(&b) {
            *acc_lanes = _mm256_fmadd_ps(a_lanes, b_lanes, *acc_lanes);
        }
    }
}

/// The 8 values at `at` of each row.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn load_rows<const R: usize>(rows: [&[f32]; R], at: usize) -> [__m256; R] {
    let mut lanes = [_mm256_setzero_ps(); R];
    for (v, row) in lanes.iter_mut().zip(rows) {
        *v = load(row, at);
    }
    lanes
}

/// The fewer than 8 values from `at` to the end of each row, zero-padded.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn load_row_tails<const R: usize>(rows: [&[f32]; R], at: usize) -> [__m256; R] {
    let mut lanes = [_mm256_setzero_ps(); R];
    for (v, row) in lanes.iter_mut().zip(rows) {
        *v = load_partial(&row[at..]);
    }
    lanes
}

/// The sum of the 8 lanes of `v`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn hsum(v: __m256) -> f32 {
    let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    let single = _mm_add_ss(pair, _mm_movehdup_ps(pair));
    _mm_cvtss_f32(single)
}

/// The largest of the 8 lanes of `v`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn hmax(v: __m256) -> f32 {
    let quad = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let pair = _mm_max_ps(quad, _mm_movehl_ps(quad, quad));
    let single = _mm_max_ss(pair, _mm_movehdup_ps(pair));
    _mm_cvtss_f32(single)
}

/// The lane sums of 8 vectors at once: lane i of the result is the sum of the lanes of `v[i]`.
///
/// A transposed tree of horizontal adds: two levels of `hadd` leave, in each 128-bit half,
/// four partial sums of four vectors; one 128-bit swap and an add finish all eight.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn sum8(v: [__m256; 8]) -> __m256 {
    // Pairs: [v0 01, v0 23, v1 01, v1 23 | v0 45, v0 67, v1 45, v1 67], and so on.
    let t0 = _mm256_hadd_ps(v[0], v[1]);
    let t1 = _mm256_hadd_ps(v[2], v[3]);
    let t2 = _mm256_hadd_ps(v[4], v[5]);
    let t3 = _mm256_hadd_ps(v[6], v[7]);
    // Quads: [v0 0..4, v1 0..4, v2 0..4, v3 0..4 | v0 4..8, v1 4..8, v2 4..8, v3 4..8].
    let u0 = _mm256_hadd_ps(t0, t1);
    let u1 = _mm256_hadd_ps(t2, t3);
    // Low halves of v0..v7 plus their high halves.
    let low = _mm256_permute2f128_ps::<0x20>(u0, u1);
    let high = _mm256_permute2f128_ps::<0x31>(u0, u1);
    _mm256_add_ps(low, high)
}

/// `e^x` lane by lane, within 2 ulp of the exact value over the whole clamped range.
///
/// Cephes' `expf`: with `n = round(x / ln 2)` and `r = x − n · ln 2` (ln 2 split in two
/// parts so that `r` is exact), `e^r` is a degree-7 polynomial on |r| ≤ ln 2 / 2 and
/// `2^n` is built in the exponent bits. Inputs are clamped to [-87.34, 88.0], so `n` stays
/// within [-126, 127] and the result is always a finite normal float; NaN stays NaN.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn exp(x: __m256) -> __m256 {
    const LOWEST: f32 = -87.336_55;
    const HIGHEST: f32 = 88.0;
    // ln 2 = LN2_HIGH + LN2_LOW, where LN2_HIGH has few enough bits that n · LN2_HIGH is exact.
    const LN2_HIGH: f32 = 355.0 / 512.0;
    const LN2_LOW: f32 = -2.121_944_4e-4;
    // Cephes' minimax coefficients of (e^r − 1 − r) / r², highest degree first.
    const P: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_6e-1,
        5e-1,
    ];
    // With x second, a NaN x passes through max and min unchanged.
    let x = _mm256_min_ps(
        _mm256_set1_ps(HIGHEST),
        _mm256_max_ps(_mm256_set1_ps(LOWEST), x),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HIGH), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LOW), r);
    // e^r = 1 + r + r² · p(r)
    let mut p = _mm256_set1_ps(P[0]);
    for &c in &P[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let r2 = _mm256_mul_ps(r, r);
    let e_r = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0));
    // 2^n: n + 127 in the exponent field.
    let biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    let two_n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(biased));
    _mm256_mul_ps(e_r, two_n)
}
