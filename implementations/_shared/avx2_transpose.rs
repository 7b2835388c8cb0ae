//! The 8 × 8 transpose of AVX2 registers that the kernels which repack operands while a call
//! runs share: `shared/avx2_repack.rs` (blocks of weight rows) and
//! `shared/avx2_team_attention.rs` (one head's keys, so that its scores come out 8 positions to
//! a vector).
#![allow(dead_code)]

use std::arch::x86_64::*;

use super::avx2_math::LANES;

/// The 8 × 8 transpose of `rows`: vector `c` of the result holds lane `c` of every row, in
/// 24 shuffles.
///
/// # Safety
///
/// Only on a CPU with AVX2.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn transpose(rows: [__m256; LANES]) -> [__m256; LANES] {
    // Pairs of rows interleaved: in each 128-bit half, vector 2i holds lanes 0-1 of rows 2i and
    // 2i + 1, vector 2i + 1 their lanes 2-3.
    let mut pairs = [_mm256_setzero_ps(); LANES];
    for i in 0..LANES / 2 {
        pairs[2 * i] = _mm256_unpacklo_ps(rows[2 * i], rows[2 * i + 1]);
        pairs[2 * i + 1] = _mm256_unpackhi_ps(rows[2 * i], rows[2 * i + 1]);
    }
    // Fours: in each half, vector 4m + q holds lane q of rows 4m..4m + 4 (lane 4 + q in the
    // high half).
    let mut fours = [_mm256_setzero_ps(); LANES];
    for m in 0..2 {
        let (a, b, c, d) = (pairs[4 * m], pairs[4 * m + 1], pairs[4 * m + 2], pairs[4 * m + 3]);
        fours[4 * m] = _mm256_shuffle_ps::<0x44>(a, c);
        fours[4 * m + 1] = _mm256_shuffle_ps::<0xEE>(a, c);
        fours[4 * m + 2] = _mm256_shuffle_ps::<0x44>(b, d);
        fours[4 * m + 3] = _mm256_shuffle_ps::<0xEE>(b, d);
    }
    // Column q is the low halves of fours q (rows 0-3) and 4 + q (rows 4-7); column 4 + q their
    // high halves.
    let mut columns = [_mm256_setzero_ps(); LANES];
    for q in 0..4 {
        columns[q] = _mm256_permute2f128_ps::<0x20>(fours[q], fours[4 + q]);
        columns[4 + q] = _mm256_permute2f128_ps::<0x31>(fours[q], fours[4 + q]);
    }
    columns
}
