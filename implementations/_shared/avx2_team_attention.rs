//! Attention over an f32 or a bfloat16 KV cache with AVX2 and FMA, row by row and head by
//! head: the core of the AVX2 decode and prefill kernels that share it out by kv heads on the
//! crate's team.
//!
//! For each query row and each query head of a share, three passes over the positions the row
//! attends to, every key and value loaded as f32 lanes (a bfloat16 one widened exactly as it is
//! loaded, `vpmovzxwd` and `vpslld`):
//! 1. scores: 8 positions at a time, 8 dot products accumulated lane-wise and reduced by one
//!    transposed horizontal-add tree (`sum8`), scaled by 1/√HEAD_DIM;
//! 2. softmax numerators `exp(score − max)` with the vectorised exp of `avx2_math`, and their
//!    sum;
//! 3. the values weighted by those numerators, 8 output lanes at a time, into four
//!    accumulators, scaled by 1/sum at the end.
//!
//! A head dim that is not a multiple of 8 ends with a masked load of the query and a
//! zero-padded copy of the cache's last values.
#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx2_math::{LANES, exp, hmax, hsum, lane_mask, sum8};

/// A value type of the KV cache: how up to 8 of them become f32 lanes.
pub trait Cached: Copy + Default {
    /// The 8 values of `src` at `at`, or the fewer left there, zero-padded, as f32 lanes.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA.
    unsafe fn load(src: &[Self], at: usize) -> __m256;
}

impl Cached for f32 {
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load(src: &[f32], at: usize) -> __m256 {
        if at + LANES <= src.len() {
            // SAFETY: 8 values from `at` lie inside `src`.
            unsafe { _mm256_loadu_ps(src.as_ptr().add(at)) }
        } else {
            load_f32(src, at)
        }
    }
}

/// bfloat16 bits: the high halves of f32s.
impl Cached for u16 {
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load(src: &[u16], at: usize) -> __m256 {
        load_bf16(src, at)
    }
}

/// The operands of one call: `q` and `out` `[rows, n_heads · head_dim]` (the positions
/// `start..start + rows`), `keys` and `values` `[start + rows, n_kv_heads · head_dim]`. Row r
/// attends to positions `0..=start + r`.
#[derive(Clone, Copy)]
pub struct Attention<C> {
    out: *mut f32,
    q: *const f32,
    keys: *const C,
    values: *const C,
    start: usize,
    rows: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
}

// SAFETY: the team's threads write the outputs of disjoint heads and only read the rest.
unsafe impl<C> Send for Attention<C> {}

impl<C: Cached> Attention<C> {
    /// The attention of `rows` new positions from `start` on: `q` and `out` hold `rows` rows of
    /// `N_HEADS · HEAD_DIM`, `keys` and `values` `start + rows` rows of `N_KV_HEADS ·
    /// HEAD_DIM`. Panics where a slice is shorter.
    pub fn new<const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize>(
        out: &mut [f32],
        q: &[f32],
        keys: &[C],
        values: &[C],
        start: usize,
        rows: usize,
    ) -> Attention<C> {
        const {
            assert!(
                N_KV_HEADS > 0 && N_HEADS.is_multiple_of(N_KV_HEADS),
                "N_HEADS must be a multiple of N_KV_HEADS"
            )
        };
        let (q_dim, kv_dim) = (N_HEADS * HEAD_DIM, N_KV_HEADS * HEAD_DIM);
        assert!(q.len() >= rows * q_dim, "attention: q is shorter than {rows} rows");
        assert!(out.len() >= rows * q_dim, "attention: out is shorter than {rows} rows");
        assert!(
            keys.len() >= (start + rows) * kv_dim,
            "attention: keys hold fewer than start + rows positions"
        );
        assert!(
            values.len() >= (start + rows) * kv_dim,
            "attention: values hold fewer than start + rows positions"
        );
        Attention {
            out: out.as_mut_ptr(),
            q: q.as_ptr(),
            keys: keys.as_ptr(),
            values: values.as_ptr(),
            start,
            rows,
            n_heads: N_HEADS,
            n_kv_heads: N_KV_HEADS,
            head_dim: HEAD_DIM,
        }
    }

    /// The kv heads, the columns by which the team shares a call.
    pub fn n_kv_heads(&self) -> usize {
        self.n_kv_heads
    }

    /// Multiply-adds of the whole call.
    pub fn work(&self) -> usize {
        let positions = self.rows * self.start + self.rows * (self.rows + 1) / 2;
        2 * self.n_heads * self.head_dim * positions
    }

    /// Attends every query head of the kv heads `kv_heads`, in every row.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA, the pointers hold the operands' sizes, and no other thread
    /// writes these heads' outputs meanwhile.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn kv_heads(&self, kv_heads: Range<usize>) {
        let group = self.n_heads / self.n_kv_heads;
        let mut scores = vec![0f32; self.start + self.rows];
        for r in 0..self.rows {
            for kv_head in kv_heads.clone() {
                for h in kv_head * group..(kv_head + 1) * group {
                    // SAFETY: the caller's contract; query head h reads kv head h / group.
                    unsafe { self.attend(r, h, kv_head, &mut scores[..self.start + r + 1]) };
                }
            }
        }
    }

    /// Attends head `h` of row `r` to kv head `kv_head` over the first `scores.len()` positions.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn attend(&self, r: usize, h: usize, kv_head: usize, scores: &mut [f32]) {
        let (len, head_dim) = (scores.len(), self.head_dim);
        let kv_dim = self.n_kv_heads * head_dim;
        let at = r * self.n_heads * head_dim + h * head_dim;
        // SAFETY: head h of row r of `q` and `out`, which this share owns.
        let q = unsafe { std::slice::from_raw_parts(self.q.add(at), head_dim) };
        let out = unsafe { std::slice::from_raw_parts_mut(self.out.add(at), head_dim) };
        // SAFETY: the cache holds `len` rows of `kv_dim` values.
        let (keys, values) = unsafe {
            (
                std::slice::from_raw_parts(self.keys, len * kv_dim),
                std::slice::from_raw_parts(self.values, len * kv_dim),
            )
        };
        let offset = kv_head * head_dim;
        let scale = 1.0 / (head_dim as f32).sqrt();

        // Scores of 8 positions at a time, and their running maximum.
        let mut max_lanes = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut p = 0;
        while p + LANES <= len {
            let mut acc = [_mm256_setzero_ps(); LANES];
            let mut d = 0;
            while d < head_dim {
                let qv = load_f32(q, d);
                for (i, a) in acc.iter_mut().enumerate() {
                    // SAFETY: the CPU has AVX2 and FMA, as this function requires.
                    let k = unsafe { C::load(&keys[(p + i) * kv_dim + offset..][..head_dim], d) };
                    *a = _mm256_fmadd_ps(qv, k, *a);
                }
                d += LANES;
            }
            let s = _mm256_mul_ps(sum8(acc), _mm256_set1_ps(scale));
            // SAFETY: `scores` holds `len` values.
            unsafe { _mm256_storeu_ps(scores.as_mut_ptr().add(p), s) };
            max_lanes = _mm256_max_ps(max_lanes, s);
            p += LANES;
        }
        let mut max = hmax(max_lanes);
        while p < len {
            let mut acc = _mm256_setzero_ps();
            let mut d = 0;
            while d < head_dim {
                // SAFETY: the CPU has AVX2 and FMA, as this function requires.
                let k = unsafe { C::load(&keys[p * kv_dim + offset..][..head_dim], d) };
                acc = _mm256_fmadd_ps(load_f32(q, d), k, acc);
                d += LANES;
            }
            scores[p] = hsum(acc) * scale;
            max = max.max(scores[p]);
            p += 1;
        }

        // Softmax numerators exp(s − max), in place, and their sum.
        let max_lanes = _mm256_set1_ps(max);
        let mut sum_lanes = _mm256_setzero_ps();
        let mut p = 0;
        while p < len {
            let mask = lane_mask(len - p);
            // SAFETY: the masked load and store touch only the scores before `len`.
            let e = unsafe {
                let e = exp(_mm256_sub_ps(_mm256_maskload_ps(scores.as_ptr().add(p), mask), max_lanes));
                _mm256_maskstore_ps(scores.as_mut_ptr().add(p), mask, e);
                e
            };
            // Lanes past the end hold exp(−max): keep them out of the sum.
            sum_lanes = _mm256_add_ps(sum_lanes, _mm256_and_ps(e, _mm256_castsi256_ps(mask)));
            p += LANES;
        }
        let inv_sum = _mm256_set1_ps(1.0 / hsum(sum_lanes));

        // The weighted sum of the values, 8 output lanes at a time, over 4 positions at a
        // time into 4 accumulators.
        let mut d = 0;
        while d < head_dim {
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut p = 0;
            while p + 4 <= len {
                for (u, a) in acc.iter_mut().enumerate() {
                    // SAFETY: the CPU has AVX2 and FMA, as this function requires.
                    let v = unsafe { C::load(&values[(p + u) * kv_dim + offset..][..head_dim], d) };
                    *a = _mm256_fmadd_ps(_mm256_set1_ps(scores[p + u]), v, *a);
                }
                p += 4;
            }
            while p < len {
                // SAFETY: the CPU has AVX2 and FMA, as this function requires.
                let v = unsafe { C::load(&values[p * kv_dim + offset..][..head_dim], d) };
                acc[0] = _mm256_fmadd_ps(_mm256_set1_ps(scores[p]), v, acc[0]);
                p += 1;
            }
            let total = _mm256_mul_ps(
                _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])),
                inv_sum,
            );
            let mask = lane_mask(head_dim - d);
            // SAFETY: the masked store writes only the outputs before `head_dim`.
            unsafe { _mm256_maskstore_ps(out.as_mut_ptr().add(d), mask, total) };
            d += LANES;
        }
    }
}

/// The 8 values of `src` at `at`, or the fewer left there, zero-padded.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn load_f32(src: &[f32], at: usize) -> __m256 {
    let lanes = &src[at..];
    // SAFETY: the masked load reads only the lanes inside `lanes`.
    unsafe { _mm256_maskload_ps(lanes.as_ptr(), lane_mask(lanes.len())) }
}

/// The 8 bfloat16 values of `src` at `at` (or the fewer left there, zero-padded) as f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn load_bf16(src: &[u16], at: usize) -> __m256 {
    let bits = if at + LANES <= src.len() {
        // SAFETY: 8 values from `at` lie inside `src`.
        unsafe { _mm_loadu_si128(src.as_ptr().add(at).cast()) }
    } else {
        let mut last = [0u16; LANES];
        last[..src.len() - at].copy_from_slice(&src[at..]);
        // SAFETY: `last` is 8 readable values.
        unsafe { _mm_loadu_si128(last.as_ptr().cast()) }
    };
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bits)))
}
