//! f32 values rounded to bfloat16 with AVX-512F, 16 at a time, as a bfloat16 KV cache stores
//! them: add half a unit of the last kept place (less one when that place is even), keep a NaN
//! quiet, narrow the 32-bit lanes with `vpmovdw`.
#![allow(dead_code)]

use std::arch::x86_64::*;

/// Writes `src` rounded to bfloat16 into `dst` (as long as `src`), 16 values at a time, the
/// rest one by one with the same arithmetic.
#[target_feature(enable = "avx512f")]
pub fn round_into(dst: &mut [u16], src: &[f32]) {
    assert_eq!(dst.len(), src.len());
    let whole = src.len() / 16 * 16;
    let (half, low_bit) = (_mm512_set1_epi32(0x7fff), _mm512_set1_epi32(1));
    for at in (0..whole).step_by(16) {
        // SAFETY: 16 values at `at` < whole ≤ len, in both slices.
        let v = unsafe { _mm512_loadu_ps(src.as_ptr().add(at)) };
        let bits = _mm512_castps_si512(v);
        let high = _mm512_srli_epi32::<16>(bits);
        let bias = _mm512_add_epi32(half, _mm512_and_si512(high, low_bit));
        let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(bits, bias));
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        let quiet_nan = _mm512_or_si512(high, _mm512_set1_epi32(0x0040));
        let lanes = _mm512_mask_mov_epi32(rounded, nan, quiet_nan);
        // SAFETY: as above, 16 u16 at `at`.
        unsafe { _mm256_storeu_si256(dst.as_mut_ptr().add(at).cast(), _mm512_cvtepi32_epi16(lanes)) };
    }
    for (cached, &value) in dst[whole..].iter_mut().zip(&src[whole..]) {
        let bits = value.to_bits();
        *cached = if value.is_nan() {
            ((bits >> 16) | 0x0040) as u16
        } else {
            (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16
        };
    }
}
