//! The activations of the AVX2 `matmul<q8>` products, quantized as the interface defines them:
//! per block of 32 values of a row, `d = max|x| / 127` and `q = round(x · (127 / max|x|))`
//! (f32 arithmetic, ties to even; a block of zeros gets `d = 0` and `q = 0`).
//!
//! # Safety
//!
//! Code that does not itself enable AVX2 and FMA may call [`quantize_row`] (in `unsafe`) only
//! on a CPU that has both features.
#![allow(dead_code, clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use super::avx2_math::{LANES, hmax};

/// Values of K that share one scale.
pub const BLOCK: usize = 32;

/// Quantizes one row of activations per block of 32 into `q` (whole blocks, the last one
/// zero-padded) and their scales into `d`.
#[target_feature(enable = "avx2,fma")]
pub fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    let magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    // `vpackssdw` and `vpacksswb` interleave their 128-bit halves: this puts the 8 groups of
    // 4 bytes back in order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for ((xs, qs), d) in x.chunks(BLOCK).zip(q.chunks_exact_mut(BLOCK)).zip(d) {
        if xs.len() < BLOCK {
            let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let inverse = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            *d = amax / 127.0;
            for (q, &v) in qs.iter_mut().zip(xs) {
                *q = (v * inverse).round_ties_even() as i8;
            }
            continue;
        }
        let mut v = [_mm256_setzero_ps(); 4];
        let mut top = _mm256_setzero_ps();
        for (i, lanes) in v.iter_mut().enumerate() {
            // SAFETY: `xs` holds 32 values.
            *lanes = unsafe { _mm256_loadu_ps(xs.as_ptr().add(i * LANES)) };
            top = _mm256_max_ps(top, _mm256_and_ps(*lanes, magnitude));
        }
        let amax = hmax(top);
        let inverse = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        *d = amax / 127.0;
        let scale = _mm256_set1_ps(inverse);
        let mut ints = [_mm256_setzero_si256(); 4];
        for (int, &lanes) in ints.iter_mut().zip(&v) {
            let rounded = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(lanes, scale),
            );
            *int = _mm256_cvtps_epi32(rounded);
        }
        let words = [_mm256_packs_epi32(ints[0], ints[1]), _mm256_packs_epi32(ints[2], ints[3])];
        let bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(words[0], words[1]), order);
        // SAFETY: `qs` is 32 writable bytes.
        unsafe { _mm256_storeu_si256(qs.as_mut_ptr().cast(), bytes) };
    }
}
