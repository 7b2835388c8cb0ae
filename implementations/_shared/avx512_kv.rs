//! The element types of a KV cache as AVX-512 kernels read them: 16 f32 lanes from 16 cached
//! values, which are f32 (`kv_cache`) or bfloat16 bit patterns (`kv_cache_bf16`), widened by
//! a shift into the high half of each lane. The attention modules
//! (`shared/avx512_decode.rs`, `shared/avx512_flash.rs`) are generic over it, so that the
//! f32 and the bf16 attention interfaces run the same code.
#![allow(dead_code)]

use std::arch::x86_64::*;

/// A value of a KV cache: `f32`, or `u16` holding a bfloat16 (the high 16 bits of an f32).
pub trait KvElement: Copy + Send + Sync + 'static {
    /// 16 values at `p`, as f32.
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512F, and 16 values are readable at `p`.
    unsafe fn load(p: *const Self) -> __m512;

    /// The values at `p` of the lanes in `mask`, as f32; the other lanes are zero.
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512F (and, for bfloat16, BW and VL), and the masked lanes' values are
    /// readable at `p` (the others are not read).
    unsafe fn maskz_load(mask: __mmask16, p: *const Self) -> __m512;

    /// `values` as f32: the slice itself, or its values widened into `buffer` (for a kernel
    /// that reads each value many times, so that it widens each once).
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512F.
    unsafe fn as_f32<'a>(values: &'a [Self], buffer: &'a mut Vec<f32>) -> &'a [f32];
}

impl KvElement for f32 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load(p: *const f32) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_loadu_ps(p) }
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn maskz_load(mask: __mmask16, p: *const f32) -> __m512 {
        // SAFETY: the caller's contract; masked-off lanes are not read.
        unsafe { _mm512_maskz_loadu_ps(mask, p) }
    }

    #[inline]
    unsafe fn as_f32<'a>(values: &'a [f32], _buffer: &'a mut Vec<f32>) -> &'a [f32] {
        values
    }
}

impl KvElement for u16 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load(p: *const u16) -> __m512 {
        // SAFETY: the caller's contract: 16 u16 are 32 readable bytes.
        let halves = unsafe { _mm256_loadu_si256(p.cast()) };
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(halves)))
    }

    /// Needs AVX-512BW and VL besides F (a 16-bit masked load), which the bf16 attention
    /// kernels declare.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn maskz_load(mask: __mmask16, p: *const u16) -> __m512 {
        // SAFETY: the caller's contract; masked-off lanes are not read.
        let halves = unsafe { _mm256_maskz_loadu_epi16(mask, p.cast()) };
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(halves)))
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn as_f32<'a>(values: &'a [u16], buffer: &'a mut Vec<f32>) -> &'a [f32] {
        // Every value is written below: only growth is zero-filled.
        buffer.resize(values.len(), 0.0);
        let whole = values.len() / 16 * 16;
        for at in (0..whole).step_by(16) {
            // SAFETY: 16 values at `at` < whole ≤ len, in both slices.
            unsafe { _mm512_storeu_ps(buffer.as_mut_ptr().add(at), Self::load(values.as_ptr().add(at))) };
        }
        for (wide, &value) in buffer[whole..].iter_mut().zip(&values[whole..]) {
            *wide = f32::from_bits(u32::from(value) << 16);
        }
        buffer
    }
}
