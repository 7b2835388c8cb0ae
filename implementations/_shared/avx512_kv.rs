//! The element types of a KV cache as AVX-512 kernels read them: 16 f32 lanes from 16 cached
//! values, which are f32 (`kv_cache`) or bfloat16 bit patterns (`kv_cache<bf16>`), widened by
//! a shift into the high half of each lane. The attention modules
//! (`shared/avx512_decode.rs`, `shared/avx512_flash.rs`) are generic over it, so that the
//! f32 and the bf16 attention interfaces run the same code.
#![allow(dead_code)]

use std::arch::x86_64::*;
use std::ops::Range;

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

    /// The values of `channels` (one kv head's) of positions `0..len` of `values` (`[len,
    /// kv_dim]`) as f32, for a kernel that reads each value many times: a pointer to position
    /// 0's and the stride between positions. f32 values are read in place; bfloat16 ones are
    /// widened into `buffer` first, `channels.len()` per position, so that each is widened once.
    ///
    /// # Safety
    ///
    /// As for [`KvElement::maskz_load`]; `values` holds `len · kv_dim` values and `channels`
    /// ends at `kv_dim` or before.
    unsafe fn head_values(
        values: *const Self,
        kv_dim: usize,
        channels: Range<usize>,
        len: usize,
        buffer: &mut Vec<f32>,
    ) -> (*const f32, usize);
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

    unsafe fn head_values(
        values: *const f32,
        kv_dim: usize,
        channels: Range<usize>,
        _: usize,
        _: &mut Vec<f32>,
    ) -> (*const f32, usize) {
        (values.wrapping_add(channels.start), kv_dim)
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

    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn head_values(
        values: *const u16,
        kv_dim: usize,
        channels: Range<usize>,
        len: usize,
        buffer: &mut Vec<f32>,
    ) -> (*const f32, usize) {
        let head_dim = channels.len();
        // Every value read is written below: only growth is zero-filled.
        if buffer.len() < len * head_dim {
            buffer.resize(len * head_dim, 0.0);
        }
        for p in 0..len {
            for d in (0..head_dim).step_by(16) {
                let mask: __mmask16 = if head_dim - d >= 16 { u16::MAX } else { (1 << (head_dim - d)) - 1 };
                // SAFETY: the masked lanes are channels `channels.start + d..` of position p,
                // before `channels.end` ≤ kv_dim, and inside the buffer's `len · head_dim`.
                unsafe {
                    let wide = Self::maskz_load(mask, values.add(p * kv_dim + channels.start + d));
                    _mm512_mask_storeu_ps(buffer.as_mut_ptr().add(p * head_dim + d), mask, wide);
                }
            }
        }
        (buffer.as_ptr(), head_dim)
    }
}
