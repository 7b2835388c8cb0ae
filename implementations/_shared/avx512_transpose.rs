//! A 16 × 16 transpose of AVX-512 registers, which the kernels that pack weights while a call
//! runs (`shared/avx512_repack.rs`, `shared/avx512_q8_repack.rs`) share: 64 shuffles turn 16
//! rows of 16 lanes into 16 columns.
#![allow(dead_code)]

use std::arch::x86_64::*;

/// The 32-bit lanes of an AVX-512 register.
const LANES: usize = 16;

/// The 16 × 16 transpose of `rows` (of f32 or of any 32-bit lanes): vector `c` of the result
/// holds lane `c` of every row.
///
/// # Safety
///
/// Only on a CPU with AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
pub fn transpose(rows: [__m512; LANES]) -> [__m512; LANES] {
    // Pairs of rows interleaved: vector 2i holds lanes 0-1 of each 128-bit quarter of rows 2i
    // and 2i + 1, vector 2i + 1 their lanes 2-3.
    let mut pairs = [_mm512_setzero_ps(); LANES];
    for i in 0..LANES / 2 {
        pairs[2 * i] = _mm512_unpacklo_ps(rows[2 * i], rows[2 * i + 1]);
        pairs[2 * i + 1] = _mm512_unpackhi_ps(rows[2 * i], rows[2 * i + 1]);
    }
    // Fours: vector 4m + q holds, in quarter l, lane 4l + q of rows 4m..4m + 4.
    let mut fours = [_mm512_setzero_ps(); LANES];
    for m in 0..LANES / 4 {
        let (a, b, c, d) = (pairs[4 * m], pairs[4 * m + 1], pairs[4 * m + 2], pairs[4 * m + 3]);
        let (a, b, c, d) =
            (_mm512_castps_pd(a), _mm512_castps_pd(b), _mm512_castps_pd(c), _mm512_castps_pd(d));
        fours[4 * m] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        fours[4 * m + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        fours[4 * m + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        fours[4 * m + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    // Quarters gathered across the four groups of rows: column 4l + q is quarter l of vectors
    // q, 4 + q, 8 + q and 12 + q.
    let mut columns = [_mm512_setzero_ps(); LANES];
    for q in 0..4 {
        let even_low = _mm512_shuffle_f32x4::<0x88>(fours[q], fours[4 + q]);
        let odd_low = _mm512_shuffle_f32x4::<0xDD>(fours[q], fours[4 + q]);
        let even_high = _mm512_shuffle_f32x4::<0x88>(fours[8 + q], fours[12 + q]);
        let odd_high = _mm512_shuffle_f32x4::<0xDD>(fours[8 + q], fours[12 + q]);
        columns[q] = _mm512_shuffle_f32x4::<0x88>(even_low, even_high);
        columns[8 + q] = _mm512_shuffle_f32x4::<0xDD>(even_low, even_high);
        columns[4 + q] = _mm512_shuffle_f32x4::<0x88>(odd_low, odd_high);
        columns[12 + q] = _mm512_shuffle_f32x4::<0xDD>(odd_low, odd_high);
    }
    columns
}
