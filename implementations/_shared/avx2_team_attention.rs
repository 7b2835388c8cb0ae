//! Attention over an f32 or a bfloat16 KV cache with AVX2 and FMA: the core of the AVX2 decode
//! and prefill kernels, which the crate's team shares out, a prefill by kv heads and a decode
//! step by chunks of positions. Every key and value is loaded as f32 lanes (a bfloat16 one
//! widened exactly as it is loaded, `vpmovzxwd` and `vpslld`, or 16 at a time, below).
//!
//! **One row** (a head dim that is not a multiple of 8, or a call of one row shared by kv
//! heads): for each query head of a share, three passes over the positions the row attends to:
//! 1. scores: 8 positions at a time, 8 dot products accumulated lane-wise and reduced by one
//!    transposed horizontal-add tree (`sum8`), scaled by 1/√HEAD_DIM;
//! 2. softmax numerators `exp(score − max)` with the vectorised exp of `avx2_math`, and their
//!    sum;
//! 3. the values weighted by those numerators, scaled by 1/sum at the end.
//!
//! With a head dim of whole vectors (every decode step of such a model), each load is a whole
//! vector with no check of its bounds, and the values pass goes position by position, each
//! position's values (up to 8 vectors of them) read once into as many accumulators. At the
//! shapes of stories110M (12 heads of 64, a bfloat16 cache), a call over 160 positions took
//! 49-53 µs with the cache in L3 before, when every load was checked and the values pass read
//! all positions once per output vector, and 13-19 µs after; 92-157 µs from memory before,
//! 60-85 after (medians of runs, 2 threads, AMD EPYC Zen 3). Asking for the keys and values
//! ahead with `prefetcht1` (the share's whole row segment, 16 positions on) was slower in both
//! cases.
//!
//! A head dim that is not a multiple of 8 takes per-vector loads, the last masked (the query)
//! or from a zero-padded copy (the cache's values), and the values pass 8 output lanes at a
//! time over every position, into four accumulators.
//!
//! **A decode step** ([`Decode`]) cuts the positions into one chunk per thread and runs the
//! same three passes over a chunk for every query head at once, band by band: the scores of 8
//! positions of each head in turn, then the values of 16 positions of each head in turn, so
//! that a thread reads whole cache rows, front to back, in one contiguous piece of the cache.
//! Each chunk leaves per head its maximum, its sum and its weighted values unscaled, which the
//! calling thread merges (each chunk's scaled by `exp(its max − the overall max)`). A head dim
//! of whole pairs of vectors loads keys and values 16 at a time ([`Cached::load16`]: a
//! bfloat16 pair in one load, a shift and a mask, where two `vpmovzxwd` and two shifts took
//! six), the even values in one vector and the odd ones in the other, against a query split
//! the same way. Cut by kv heads, a decode step's thread read its heads' piece of every row
//! (at stories110M's shapes 768 of 1536 bytes), and with the cache evicted by the weights
//! streamed past it the attention waited on memory. One thread's half of a stories110M step
//! (12 heads of 64, 176 positions, a bfloat16 cache evicted first, 12 layers, medians of 40
//! rounds): 48-57 µs a layer by kv heads, 34-40 in a chunk read 16 at a time (a program apart,
//! AMD EPYC Zen 3).
//!
//! **Several rows** (a prefill) take the same three passes for blocks of 6 rows at once, each
//! load serving the block's 6 rows as a product's packed block does: the kv head's keys are
//! transposed once per call into a buffer of the thread (8 × 8 tiles, `shared/avx2_transpose.rs`),
//! so that a vector of them holds 8 positions of one dimension. A step of the scores then loads
//! 2 vectors of keys and broadcasts each row's query value, for 12 multiply-adds with no
//! reduction; a step of the values loads 2 vectors of values and broadcasts each row's
//! numerator. Row by row, the attention took 11.6% of a stories15M bf16 run's samples under
//! `perf` (the products 43%); in blocks, 3.1%. `bench/ab.py` measured the prefill 1.11-1.16x
//! faster at stories15M and 1.09-1.11x at stories110M (2 threads, AMD EPYC Zen 3).
//!
//! A crate whose prefill attention is this module's but whose decode attention is another's
//! leaves [`Decode`] and its helpers unused, hence `allow(dead_code)`.
#![allow(dead_code, clippy::missing_safety_doc, clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::avx2_math::{LANES, exp, hmax, hsum, lane_mask, sum8};
use super::avx2_transpose::transpose;
use super::job::{Extent, Job};

/// Query rows that the blocked path of a prefill attends together: each load of a transposed
/// key vector or of a value vector serves all of them.
const ROWS: usize = 6;

/// Positions of a block of scores, and output lanes of a block of values: two vectors.
const WIDE: usize = 2 * LANES;

thread_local! {
    /// The calling thread's current kv head's keys, widened to f32 and transposed: for each
    /// dimension, its value at every position, zero past the last one up to a whole `WIDE`.
    static KEYS_T: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The scores, then the softmax numerators, of a block of `ROWS` query rows, each row as
    /// long as a row of `KEYS_T`.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// A value type of the KV cache: how up to 8 of them become f32 lanes.
pub trait Cached: Copy + Default {
    /// The 8 values of `src` at `at`, or the fewer left there, zero-padded, as f32 lanes.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA.
    unsafe fn load(src: &[Self], at: usize) -> __m256;

    /// The 8 values from `src` as f32 lanes.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA, and 8 values from `src` are readable.
    unsafe fn load8(src: *const Self) -> __m256;

    /// The 16 values from `src` as two vectors of f32 lanes, in the order of this type's
    /// [`Cached::split16`] (a bfloat16 pair of vectors is loaded and widened in three
    /// instructions, where two `load8` take six).
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA, and 16 values from `src` are readable.
    unsafe fn load16(src: *const Self) -> (__m256, __m256);

    /// The 16 f32 values from `src` as two vectors, each lane holding the value that lane of
    /// [`Cached::load16`] holds of 16 cached ones: a query split so, multiplied lane by lane,
    /// meets the right keys.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA, and 16 values from `src` are readable.
    unsafe fn split16(src: *const f32) -> (__m256, __m256);

    /// The inverse of [`Cached::split16`]: 16 values in `load16`'s order back in their own.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA.
    unsafe fn join16(pair: (__m256, __m256)) -> (__m256, __m256);
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

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load8(src: *const f32) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_loadu_ps(src) }
    }

    /// In order: values 0-7, then 8-15.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load16(src: *const f32) -> (__m256, __m256) {
        // SAFETY: the caller's contract.
        unsafe { (_mm256_loadu_ps(src), _mm256_loadu_ps(src.add(LANES))) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn split16(src: *const f32) -> (__m256, __m256) {
        // SAFETY: the caller's contract.
        unsafe { Self::load16(src) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn join16(pair: (__m256, __m256)) -> (__m256, __m256) {
        pair
    }
}

/// bfloat16 bits: the high halves of f32s.
impl Cached for u16 {
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load(src: &[u16], at: usize) -> __m256 {
        load_bf16(src, at)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load8(src: *const u16) -> __m256 {
        // SAFETY: the caller's contract.
        let bits = unsafe { _mm_loadu_si128(src.cast()) };
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bits)))
    }

    /// The even values (0, 2, ..., 14), then the odd ones: one load of the 16, each 32-bit
    /// lane holding an even value in its low half and the next odd one in its high half, so
    /// that a shift makes the first an f32 and a mask the second.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load16(src: *const u16) -> (__m256, __m256) {
        // SAFETY: the caller's contract.
        let bits = unsafe { _mm256_loadu_si256(src.cast()) };
        let high = _mm256_set1_epi32(0xffff_0000_u32 as i32);
        (
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(bits)),
            _mm256_castsi256_ps(_mm256_and_si256(bits, high)),
        )
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn split16(src: *const f32) -> (__m256, __m256) {
        // SAFETY: the caller's contract.
        let (a, b) = unsafe { (_mm256_loadu_ps(src), _mm256_loadu_ps(src.add(LANES))) };
        // [a0 a2 b0 b2 | a4 a6 b4 b6], then its 64-bit quarters in the order 0, 2, 1, 3.
        let even = _mm256_shuffle_ps::<0b10_00_10_00>(a, b);
        let odd = _mm256_shuffle_ps::<0b11_01_11_01>(a, b);
        let order = |v: __m256| _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(v)));
        (order(even), order(odd))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn join16((even, odd): (__m256, __m256)) -> (__m256, __m256) {
        // [0 1 2 3 | 8 9 10 11] and [4 5 6 7 | 12 13 14 15].
        let (low, high) = (_mm256_unpacklo_ps(even, odd), _mm256_unpackhi_ps(even, odd));
        (_mm256_permute2f128_ps::<0x20>(low, high), _mm256_permute2f128_ps::<0x31>(low, high))
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
        if self.rows > 1 && self.head_dim.is_multiple_of(LANES) {
            // SAFETY: the caller's contract.
            return unsafe { self.blocked(kv_heads) };
        }
        let group = self.n_heads / self.n_kv_heads;
        let mut scores = vec![0f32; self.start + self.rows];
        let whole = self.head_dim.is_multiple_of(LANES);
        for r in 0..self.rows {
            for kv_head in kv_heads.clone() {
                for h in kv_head * group..(kv_head + 1) * group {
                    let scores = &mut scores[..self.start + r + 1];
                    // SAFETY: the caller's contract; query head h reads kv head h / group.
                    unsafe {
                        if whole {
                            self.row(r, h, kv_head, scores)
                        } else {
                            self.attend(r, h, kv_head, scores)
                        }
                    }
                }
            }
        }
    }

    /// The blocked path of [`Attention::kv_heads`], for several rows and a head dim of whole
    /// vectors: for each kv head, its keys transposed once (so that a vector holds 8
    /// positions' values of one dimension), then each of its query heads in blocks of `ROWS`
    /// rows.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn blocked(&self, kv_heads: Range<usize>) {
        let padded = (self.start + self.rows).next_multiple_of(WIDE);
        let group = self.n_heads / self.n_kv_heads;
        KEYS_T.with_borrow_mut(|keys_t| {
            SCORES.with_borrow_mut(|scores| {
                keys_t.resize(keys_t.len().max(self.head_dim * padded), 0.0);
                scores.resize(scores.len().max(ROWS * padded), 0.0);
                for kv_head in kv_heads {
                    // SAFETY: the caller's contract; the buffers hold the sizes asked for.
                    unsafe { self.transpose_keys(kv_head, keys_t, padded) };
                    for h in kv_head * group..(kv_head + 1) * group {
                        for r in (0..self.rows).step_by(ROWS) {
                            // SAFETY: as above.
                            unsafe { self.block(r, h, kv_head, keys_t, padded, scores) };
                        }
                    }
                }
            })
        })
    }

    /// Writes the keys of kv head `kv_head` into `keys_t` as f32, transposed: dimension d's
    /// value at position p at `d · padded + p`, zero from `start + rows` to `padded`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn transpose_keys(&self, kv_head: usize, keys_t: &mut [f32], padded: usize) {
        let len = self.start + self.rows;
        let kv_dim = self.n_kv_heads * self.head_dim;
        assert!(keys_t.len() >= self.head_dim * padded);
        for p in (0..padded).step_by(LANES) {
            for d in (0..self.head_dim).step_by(LANES) {
                let mut tile = [_mm256_setzero_ps(); LANES];
                for (i, row) in tile.iter_mut().enumerate().take(len.saturating_sub(p)) {
                    // SAFETY: position p + i < len holds `kv_dim` values, of which this head's
                    // 8 from d (a head dim of whole vectors).
                    *row = unsafe { C::load8(self.keys.add((p + i) * kv_dim + kv_head * self.head_dim + d)) };
                }
                for (c, column) in transpose(tile).into_iter().enumerate() {
                    // SAFETY: d + c < head_dim and p + 8 <= padded, inside `keys_t`.
                    unsafe { _mm256_storeu_ps(keys_t.as_mut_ptr().add((d + c) * padded + p), column) };
                }
            }
        }
    }

    /// Attends query head `h` of rows `r..r + ROWS` (those of them below `rows`) to kv head
    /// `kv_head`, whose keys `keys_t` holds transposed.
    ///
    /// The block's scores cover the positions of its last row, `WIDE` at a time: a step over
    /// the head dim loads 2 vectors of keys and broadcasts each row's query value, for 12
    /// multiply-adds. The softmax runs row by row over each row's own positions. The values,
    /// `WIDE` output lanes at a time, run over the positions that every row of the block
    /// attends: a step loads 2 vectors of values and broadcasts each row's numerator. Then
    /// the at most `ROWS − 1` positions that only the later rows attend. A block with fewer
    /// rows repeats its last one and does not store it.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block(
        &self,
        r: usize,
        h: usize,
        kv_head: usize,
        keys_t: &[f32],
        padded: usize,
        scores: &mut [f32],
    ) {
        let head_dim = self.head_dim;
        let q_dim = self.n_heads * head_dim;
        let real = (self.rows - r).min(ROWS);
        // Row i of the block attends positions 0..=start + r + i; the last row, `reach`.
        let reach = self.start + r + real;
        assert!(keys_t.len() >= head_dim * padded && scores.len() >= ROWS * padded && reach <= padded);
        let mut qs = [self.q; ROWS];
        for (i, q) in qs.iter_mut().enumerate() {
            // SAFETY: row r + min(i, real − 1) < rows of `q`, head h.
            *q = unsafe { self.q.add((r + i.min(real - 1)) * q_dim + h * head_dim) };
        }

        // Scores, WIDE positions at a time (up to `padded`, whose keys are zero past `len`).
        let scale = _mm256_set1_ps(1.0 / (head_dim as f32).sqrt());
        for p in (0..reach).step_by(WIDE) {
            let mut acc = [[_mm256_setzero_ps(); 2]; ROWS];
            for d in 0..head_dim {
                // SAFETY: d < head_dim and p + WIDE <= padded: inside `keys_t`.
                let (k0, k1) = unsafe {
                    let at = keys_t.as_ptr().add(d * padded + p);
                    (_mm256_loadu_ps(at), _mm256_loadu_ps(at.add(LANES)))
                };
                for i in 0..ROWS {
                    // SAFETY: value d of a query row's head.
                    let qd = unsafe { _mm256_broadcast_ss(&*qs[i].add(d)) };
                    acc[i][0] = _mm256_fmadd_ps(qd, k0, acc[i][0]);
                    acc[i][1] = _mm256_fmadd_ps(qd, k1, acc[i][1]);
                }
            }
            for (i, [a0, a1]) in acc.into_iter().enumerate() {
                // SAFETY: p + WIDE <= padded, inside row i of `scores`.
                unsafe {
                    let at = scores.as_mut_ptr().add(i * padded + p);
                    _mm256_storeu_ps(at, _mm256_mul_ps(a0, scale));
                    _mm256_storeu_ps(at.add(LANES), _mm256_mul_ps(a1, scale));
                }
            }
        }

        // Softmax numerators of each real row over its own positions.
        let mut inv_sums = [0f32; ROWS];
        for (i, inv_sum) in inv_sums.iter_mut().enumerate().take(real) {
            let row = &mut scores[i * padded..(i + 1) * padded];
            let n = self.start + r + i + 1;
            let mut max_lanes = _mm256_set1_ps(f32::NEG_INFINITY);
            let mut p = 0;
            while p + LANES <= n {
                // SAFETY: 8 scores from p < n.
                max_lanes = _mm256_max_ps(max_lanes, unsafe { _mm256_loadu_ps(row.as_ptr().add(p)) });
                p += LANES;
            }
            let max = row[p..n].iter().fold(hmax(max_lanes), |m, &s| m.max(s));
            let max_lanes = _mm256_set1_ps(max);
            let mut sum_lanes = _mm256_setzero_ps();
            let mut p = 0;
            while p < n {
                let mask = lane_mask(n - p);
                // SAFETY: p < n <= padded − 8 or p + 8 <= padded (both multiples of 8): the
                // 8 lanes lie inside the row; the lanes from n on are set to zero.
                let e = unsafe {
                    let s = _mm256_maskload_ps(row.as_ptr().add(p), mask);
                    let e = _mm256_and_ps(exp(_mm256_sub_ps(s, max_lanes)), _mm256_castsi256_ps(mask));
                    _mm256_storeu_ps(row.as_mut_ptr().add(p), e);
                    e
                };
                sum_lanes = _mm256_add_ps(sum_lanes, e);
                p += LANES;
            }
            *inv_sum = 1.0 / hsum(sum_lanes);
        }

        // The weighted values, WIDE output lanes at a time (the last 8 alone).
        let mut d = 0;
        while d + WIDE <= head_dim {
            // SAFETY: as this function's.
            unsafe { self.values::<2>(r, h, kv_head, d, reach, padded, scores, &inv_sums) };
            d += WIDE;
        }
        if d < head_dim {
            // SAFETY: as this function's.
            unsafe { self.values::<1>(r, h, kv_head, d, reach, padded, scores, &inv_sums) };
        }
    }

    /// Output lanes `d..d + 8 · V` of query head `h` in rows `r..r + ROWS` (those below
    /// `rows`): the values of positions `0..reach` weighted by the block's numerators, times
    /// each row's `inv_sums`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn values<const V: usize>(
        &self,
        r: usize,
        h: usize,
        kv_head: usize,
        d: usize,
        reach: usize,
        padded: usize,
        scores: &[f32],
        inv_sums: &[f32; ROWS],
    ) {
        let head_dim = self.head_dim;
        let kv_dim = self.n_kv_heads * head_dim;
        let mut acc = [[_mm256_setzero_ps(); V]; ROWS];
        // SAFETY: this head's values from d, at position 0.
        let base = unsafe { self.values.add(kv_head * head_dim + d) };
        // Positions up to the block's first row's own are every row's.
        let shared = self.start + r + 1;
        for p in 0..shared {
            // SAFETY: position p < start + rows holds this head's values d..d + 8 · V.
            let v: [__m256; V] =
                std::array::from_fn(|j| unsafe { C::load8(base.add(p * kv_dim + j * LANES)) });
            for i in 0..ROWS {
                // SAFETY: p < reach <= padded, inside row i of `scores`.
                let w = unsafe { _mm256_broadcast_ss(scores.get_unchecked(i * padded + p)) };
                for j in 0..V {
                    acc[i][j] = _mm256_fmadd_ps(w, v[j], acc[i][j]);
                }
            }
        }
        // Past them, row i attends i more, and the others skip them: their numerators are
        // not theirs, and a NaN value must not reach them.
        for p in shared..reach {
            // SAFETY: as above.
            let v: [__m256; V] =
                std::array::from_fn(|j| unsafe { C::load8(base.add(p * kv_dim + j * LANES)) });
            for i in 0..ROWS {
                if p >= shared + i {
                    continue;
                }
                // SAFETY: as above.
                let w = unsafe { _mm256_broadcast_ss(scores.get_unchecked(i * padded + p)) };
                for j in 0..V {
                    acc[i][j] = _mm256_fmadd_ps(w, v[j], acc[i][j]);
                }
            }
        }
        for i in 0..(self.rows - r).min(ROWS) {
            let inv_sum = _mm256_set1_ps(inv_sums[i]);
            for j in 0..V {
                // SAFETY: row r + i < rows of `out`, head h, lanes d + 8j.. inside the head; this
                // share owns the head.
                unsafe {
                    let at = self.out.add((r + i) * self.n_heads * head_dim + h * head_dim + d + j * LANES);
                    _mm256_storeu_ps(at, _mm256_mul_ps(acc[i][j], inv_sum));
                }
            }
        }
    }

    /// [`Attention::attend`] for a head dim of whole vectors (every decode step of such a
    /// model): the same three passes, each load a whole vector with no check of its bounds, and
    /// the values weighted position by position into up to 8 output vectors at once (each
    /// position's values read once, one after the other, rather than once per output vector).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn row(&self, r: usize, h: usize, kv_head: usize, scores: &mut [f32]) {
        let head_dim = self.head_dim;
        let kv_dim = self.n_kv_heads * head_dim;
        let at = r * self.n_heads * head_dim + h * head_dim;
        // SAFETY (for every pointer below): head h of row r of `q` and `out` (which this share
        // owns), and the cache's `scores.len()` rows of `kv_dim` values, of which kv head
        // `kv_head`'s `head_dim` columns are read, whole vectors of them.
        let (q, out) = unsafe { (self.q.add(at), self.out.add(at)) };
        let (keys, values) =
            unsafe { (self.keys.add(kv_head * head_dim), self.values.add(kv_head * head_dim)) };
        let scale = 1.0 / (head_dim as f32).sqrt();

        let query = |d: usize| unsafe { _mm256_loadu_ps(q.add(d)) };
        let term = |qv, p: usize, d: usize, acc| unsafe {
            _mm256_fmadd_ps(qv, C::load8(keys.add(p * kv_dim + d)), acc)
        };
        let max = scores_of(scores, head_dim, LANES, scale, query, term);

        let inv_sum = 1.0 / numerators(scores, max);

        // The weighted sum of the values into the zeroed output: 8 output vectors at a time,
        // then 4, then 1; then times 1 / the sum.
        // SAFETY: the head's `head_dim` outputs, which this share owns.
        let out = unsafe { std::slice::from_raw_parts_mut(out, head_dim) };
        out.fill(0.0);
        let at = out.as_mut_ptr();
        let mut d = 0;
        while d + 8 * LANES <= head_dim {
            unsafe { accumulate::<8, C>(at.add(d), values.add(d), kv_dim, scores) };
            d += 8 * LANES;
        }
        while d + 4 * LANES <= head_dim {
            unsafe { accumulate::<4, C>(at.add(d), values.add(d), kv_dim, scores) };
            d += 4 * LANES;
        }
        while d < head_dim {
            unsafe { accumulate::<1, C>(at.add(d), values.add(d), kv_dim, scores) };
            d += LANES;
        }
        out.iter_mut().for_each(|o| *o *= inv_sum);
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

        // SAFETY (the keys): the CPU has AVX2 and FMA, as this function requires.
        let key = |p: usize, d: usize| unsafe { C::load(&keys[p * kv_dim + offset..][..head_dim], d) };
        let term = |qv, p, d, acc| _mm256_fmadd_ps(qv, key(p, d), acc);
        let max = scores_of(scores, head_dim, LANES, scale, |d| load_f32(q, d), term);

        let inv_sum = _mm256_set1_ps(1.0 / numerators(scores, max));

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

/// A decode step's attention (one query row) cut by positions: chunk c of `chunks` covers a
/// run of the cached positions for every head, so that each of the team's threads streams one
/// contiguous piece of the cache, whole rows of it, front to back. Each chunk leaves per query
/// head its own softmax maximum, the sum of its numerators and its weighted values, unscaled;
/// [`Decode::attend`] then merges the chunks' parts, each scaled by `exp(its max − the
/// overall max)`.
///
/// Cut by kv heads instead, each thread read only its heads' piece of every cache row (768 of
/// 1536 bytes at stories110M's shapes, 128 bytes per head at a stride of 1536), and a decode
/// step's attention, whose cache the weights streamed past it have evicted from the caches,
/// waited on memory: a program apart read such pieces of 176 bfloat16 rows, from memory, at
/// 9.2-9.4 GB/s on one thread, and whole rows at 15.1 (AMD EPYC Zen 3).
#[derive(Clone, Copy)]
pub struct Decode<C> {
    attention: Attention<C>,
    /// Chunks of positions: the crate's thread count.
    chunks: usize,
    /// Every chunk's parts, `head_stride` floats per query head: at 0 the chunk's maximum
    /// score, at 1 the sum of its numerators, from `LANES` on its weighted values (the head
    /// dim rounded up to whole vectors; with a head dim of whole pairs of vectors, each 16 in
    /// the order of [`Cached::load16`]), then the head's query in that order.
    parts: *mut f32,
    head_stride: usize,
}

// SAFETY: the team's threads write disjoint chunks' parts and only read the rest.
unsafe impl<C> Send for Decode<C> {}

thread_local! {
    /// The calling thread's [`Decode::parts`].
    static PARTS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl<C: Cached> Decode<C> {
    /// The attention of the query `q` (`[N_HEADS · HEAD_DIM]`) of the newest position over
    /// all the positions that `keys` and `values` hold (`[len, N_KV_HEADS · HEAD_DIM]`, len at
    /// least 1), into `out`. `run` computes every chunk of the `Decode` it gets (calls
    /// [`Decode::chunk`] for each of its `n()` chunks, on the team or not); then the chunks'
    /// parts are merged. Panics where a slice is shorter.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA, and `run` computes each chunk exactly once, returning only
    /// once all are done.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn attend<const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize>(
        out: &mut [f32],
        q: &[f32],
        keys: &[C],
        values: &[C],
        chunks: usize,
        run: impl FnOnce(Decode<C>),
    ) {
        let kv_dim = N_KV_HEADS * HEAD_DIM;
        let len = keys.len() / kv_dim.max(1);
        assert!(len > 0, "attention_decode: the cache holds no position");
        let attention = Attention::new::<N_HEADS, N_KV_HEADS, HEAD_DIM>(out, q, keys, values, len - 1, 1);
        let head_stride = LANES + 2 * HEAD_DIM.next_multiple_of(LANES);
        let chunks = chunks.max(1);
        PARTS.with_borrow_mut(|parts| {
            let size = chunks * N_HEADS * head_stride;
            if parts.len() < size {
                parts.resize(size, 0.0);
            }
            let decode = Decode { attention, chunks, parts: parts.as_mut_ptr(), head_stride };
            run(decode);
            // SAFETY: the caller's contract: every chunk's parts are written.
            unsafe { decode.merge() };
        })
    }

    /// The chunks of positions, each of which [`Decode::chunk`] computes.
    pub fn n(&self) -> usize {
        self.chunks
    }

    /// Multiply-adds of the whole call.
    pub fn work(&self) -> usize {
        self.attention.work()
    }

    /// The first position of chunk `c`: an even share of the positions, rounded down to a
    /// whole vector of them (the last chunk ends at the last position).
    fn bound(&self, c: usize) -> usize {
        let len = self.attention.start + 1;
        if c >= self.chunks { len } else { c * len / self.chunks / LANES * LANES }
    }

    /// The parts of query head `h` in chunk `c`.
    fn part(&self, c: usize, h: usize) -> *mut f32 {
        self.parts.wrapping_add((c * self.attention.n_heads + h) * self.head_stride)
    }

    /// Computes chunk `c`'s parts, for every query head: the scores of its positions, 8
    /// positions at a time for every head in turn (so that the keys are read row by row), the
    /// numerators against the chunk's own maximum, then the values weighted by them, 16
    /// positions at a time for every head in turn. With a head dim of whole pairs of vectors,
    /// keys and values are read 16 at a time ([`Cached::load16`]).
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA, `c < n()`, the operands of [`Decode::attend`] are alive, and
    /// no other thread computes chunk `c` meanwhile.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn chunk(&self, c: usize) {
        const BAND: usize = 16;
        // Bytes of cache rows between the rows a step reads and those whose lines it asks for.
        const AHEAD_BYTES: usize = 24 * 1024;
        let a = &self.attention;
        let (first, end) = (self.bound(c), self.bound(c + 1));
        let n = end - first;
        let head_dim = a.head_dim;
        let kv_dim = a.n_kv_heads * head_dim;
        let group = a.n_heads / a.n_kv_heads;
        let whole = head_dim.is_multiple_of(LANES);
        let paired = head_dim.is_multiple_of(2 * LANES);
        let padded_dim = head_dim.next_multiple_of(LANES);
        let scale = 1.0 / (head_dim as f32).sqrt();
        // SAFETY (every pointer below): the query and output rows hold `n_heads · head_dim`
        // values and the cache `len` rows of `kv_dim`, as `Attention::new` checked; a chunk's
        // parts lie in the buffer `attend` sized.
        let keys = unsafe { a.keys.add(first * kv_dim) };
        let values = unsafe { a.values.add(first * kv_dim) };
        SCORES.with_borrow_mut(|scores| {
            let padded = n.next_multiple_of(LANES);
            if scores.len() < a.n_heads * padded {
                scores.resize(a.n_heads * padded, 0.0);
            }
            for h in 0..a.n_heads {
                // SAFETY: as above.
                unsafe {
                    let part = self.part(c, h);
                    *part = f32::NEG_INFINITY;
                    *part.add(1) = 0.0;
                    std::ptr::write_bytes(part.add(LANES), 0, padded_dim);
                    if paired {
                        // The query in `load16`'s order.
                        let (q, split) = (a.q.add(h * head_dim), part.add(LANES + padded_dim));
                        for d in (0..head_dim).step_by(2 * LANES) {
                            let (first, second) = C::split16(q.add(d));
                            _mm256_storeu_ps(split.add(d), first);
                            _mm256_storeu_ps(split.add(d + LANES), second);
                        }
                    }
                }
            }

            // Scores, 8 positions of every head at a time. Each head reads a few lines of each
            // of the 8 rows (2 at 64 bfloat16 values a head), so while it does, it also asks
            // for its share of the lines of the rows `AHEAD_BYTES` on (`ask_ahead`).
            let row_bytes = kv_dim * size_of::<C>();
            // Only over a bfloat16 cache: see `ask_ahead`.
            let asks = size_of::<C>() == 2;
            let ahead = (AHEAD_BYTES / row_bytes).max(1);
            for p in (0..n).step_by(LANES) {
                let m = (n - p).min(LANES);
                for h in 0..a.n_heads {
                    if asks {
                        ask_ahead(keys.wrapping_add((p + ahead) * kv_dim), LANES * row_bytes, h, a.n_heads);
                    }
                    let row = &mut scores[h * padded + p..][..m];
                    // SAFETY: as above.
                    let (q, keys) =
                        unsafe { (a.q.add(h * head_dim), keys.add(p * kv_dim + (h / group) * head_dim)) };
                    let max = if paired {
                        // SAFETY: as above; whole pairs of vectors of the head, and its query
                        // split in `load16`'s order.
                        let split = unsafe { self.part(c, h).add(LANES + padded_dim) };
                        let query = |d: usize| unsafe {
                            (_mm256_loadu_ps(split.add(d)), _mm256_loadu_ps(split.add(d + LANES)))
                        };
                        let term = |(q0, q1), i: usize, d: usize, acc| {
                            let (k0, k1) = unsafe { C::load16(keys.add(i * kv_dim + d)) };
                            _mm256_fmadd_ps(q1, k1, _mm256_fmadd_ps(q0, k0, acc))
                        };
                        scores_of(row, head_dim, 2 * LANES, scale, query, term)
                    } else if whole {
                        // SAFETY: as above; whole vectors of the head.
                        let query = |d: usize| unsafe { _mm256_loadu_ps(q.add(d)) };
                        let term = |qv, i: usize, d: usize, acc| unsafe {
                            _mm256_fmadd_ps(qv, C::load8(keys.add(i * kv_dim + d)), acc)
                        };
                        scores_of(row, head_dim, LANES, scale, query, term)
                    } else {
                        // SAFETY: as above.
                        let q = unsafe { std::slice::from_raw_parts(q, head_dim) };
                        let key =
                            |i: usize| unsafe { std::slice::from_raw_parts(keys.add(i * kv_dim), head_dim) };
                        let term =
                            |qv, i: usize, d, acc| _mm256_fmadd_ps(qv, unsafe { C::load(key(i), d) }, acc);
                        scores_of(row, head_dim, LANES, scale, |d| load_f32(q, d), term)
                    };
                    // SAFETY: as above.
                    // (A NaN, once there, stays: the head's output is NaN.)
                    unsafe {
                        let part = self.part(c, h);
                        if max > *part || max.is_nan() {
                            *part = max;
                        }
                    }
                }
            }

            // Numerators against the chunk's maximum. A head whose scores here are all −∞
            // adds nothing (exp(−∞ − −∞) would be a NaN that the whole row does not have):
            // its parts stay −∞, 0 and zeros.
            for h in 0..a.n_heads {
                let part = self.part(c, h);
                // SAFETY: as above.
                let max = unsafe { *part };
                if max == f32::NEG_INFINITY {
                    continue;
                }
                // SAFETY: as above.
                unsafe { *part.add(1) = numerators(&mut scores[h * padded..h * padded + n], max) };
            }

            // The values weighted by the numerators, a band of positions of every head at a
            // time, into the parts.
            for p in (0..n).step_by(BAND) {
                let band = (n - p).min(BAND);
                for h in 0..a.n_heads {
                    if asks {
                        ask_ahead(values.wrapping_add((p + ahead) * kv_dim), BAND * row_bytes, h, a.n_heads);
                    }
                    let part = self.part(c, h);
                    // SAFETY: as above.
                    if unsafe { *part } == f32::NEG_INFINITY {
                        continue;
                    }
                    let numerators = &scores[h * padded + p..][..band];
                    // SAFETY: as above.
                    let (acc, values) =
                        unsafe { (part.add(LANES), values.add(p * kv_dim + (h / group) * head_dim)) };
                    let mut d = 0;
                    // SAFETY (the calls below): as above; `acc` holds the head dim in whole
                    // vectors, and each call reads whole vectors of the head's values.
                    while paired && d < head_dim {
                        if d + 8 * LANES <= head_dim {
                            unsafe {
                                accumulate_paired::<4, C>(acc.add(d), values.add(d), kv_dim, numerators)
                            };
                            d += 8 * LANES;
                        } else {
                            unsafe {
                                accumulate_paired::<1, C>(acc.add(d), values.add(d), kv_dim, numerators)
                            };
                            d += 2 * LANES;
                        }
                    }
                    while d + 8 * LANES <= head_dim {
                        unsafe { accumulate::<8, C>(acc.add(d), values.add(d), kv_dim, numerators) };
                        d += 8 * LANES;
                    }
                    while d + 4 * LANES <= head_dim {
                        unsafe { accumulate::<4, C>(acc.add(d), values.add(d), kv_dim, numerators) };
                        d += 4 * LANES;
                    }
                    while d + LANES <= head_dim {
                        unsafe { accumulate::<1, C>(acc.add(d), values.add(d), kv_dim, numerators) };
                        d += LANES;
                    }
                    if d < head_dim {
                        // The last, partial vector: bounded loads of each position's values.
                        let mut sum = unsafe { _mm256_loadu_ps(acc.add(d)) };
                        for (i, &w) in numerators.iter().enumerate() {
                            // SAFETY: as above.
                            let v = unsafe {
                                C::load(std::slice::from_raw_parts(values.add(i * kv_dim), head_dim), d)
                            };
                            sum = _mm256_fmadd_ps(_mm256_set1_ps(w), v, sum);
                        }
                        unsafe { _mm256_storeu_ps(acc.add(d), sum) };
                    }
                }
            }
        })
    }

    /// Merges the chunks' parts into the output: for each query head, every chunk's weighted
    /// values and sum scaled by `exp(its max − the overall max)`, their total over the total
    /// sum.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA, and every chunk's parts are written.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn merge(&self) {
        let a = &self.attention;
        let head_dim = a.head_dim;
        for h in 0..a.n_heads {
            // SAFETY: the parts of every chunk lie in the buffer `attend` sized.
            let max = (0..self.chunks).map(|c| unsafe { *self.part(c, h) }).fold(f32::NEG_INFINITY, f32::max);
            let weight = |c: usize| unsafe { (*self.part(c, h) - max).exp() };
            let sum: f32 = (0..self.chunks).map(|c| weight(c) * unsafe { *self.part(c, h).add(1) }).sum();
            let inv_sum = 1.0 / sum;
            // SAFETY: head h of the output row, which `Attention::new` checked.
            let out = unsafe { std::slice::from_raw_parts_mut(a.out.add(h * head_dim), head_dim) };
            let total = |d: usize| {
                let mut total = _mm256_setzero_ps();
                for c in 0..self.chunks {
                    // SAFETY: whole vectors of the chunk's weighted values.
                    let v = unsafe { _mm256_loadu_ps(self.part(c, h).add(LANES + d)) };
                    total = _mm256_fmadd_ps(_mm256_set1_ps(weight(c) * inv_sum), v, total);
                }
                total
            };
            if head_dim.is_multiple_of(2 * LANES) {
                for d in (0..head_dim).step_by(2 * LANES) {
                    // Back from `load16`'s order.
                    let (first, second) = unsafe { C::join16((total(d), total(d + LANES))) };
                    // SAFETY: 16 outputs from d < head_dim.
                    unsafe {
                        _mm256_storeu_ps(out.as_mut_ptr().add(d), first);
                        _mm256_storeu_ps(out.as_mut_ptr().add(d + LANES), second);
                    }
                }
            } else {
                for d in (0..head_dim).step_by(LANES) {
                    let mask = lane_mask(head_dim - d);
                    // SAFETY: the masked store writes only the outputs before `head_dim`.
                    unsafe { _mm256_maskstore_ps(out.as_mut_ptr().add(d), mask, total(d)) };
                }
            }
        }
    }
}

/// Asks for share `h` of `n_heads` of the cache lines of the `bytes` at `rows` into L1.
///
/// A decode step's pass over 8 (or 16) cache rows reads them head by head, a few lines of
/// each row at a time, which the hardware's prefetchers do not follow as a stream: each head
/// asks for its share of the rows 24 KiB on, so that the whole of them is on its way by the
/// time the pass reaches them. On an AMD EPYC (Zen 3, 2 threads) the stories110M int8
/// crate's decode attention (bfloat16 cache, 1536-byte rows) took 0.76-0.94 of its time
/// without this over 256 tokens from a 128-id prompt (six alternating runs of a timed copy);
/// 48 KiB ahead was no faster, and 96 KiB slower. An f32 cache keeps to the hardware's
/// prefetchers: the stories110M f32 crate (3 KiB rows) decoded 0.973x as fast with 48 KiB
/// ahead and 0.952x with 24 (`bench/ab.py`, 600 tokens).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn ask_ahead<C>(rows: *const C, bytes: usize, h: usize, n_heads: usize) {
    let lines = (bytes / 64).div_ceil(n_heads);
    let from = rows.cast::<u8>().wrapping_add(h * lines * 64);
    for line in 0..lines {
        // A prefetch never faults, even past the end of the cache.
        _mm_prefetch::<_MM_HINT_T0>(from.wrapping_add(line * 64).cast());
    }
}

/// Writes the scores of one query row over `scores.len()` positions (its dot products with
/// their keys, times `scale`) and returns their maximum: 8 positions at a time, as 8 lane-wise
/// dot products reduced by one `sum8`, then the rest one at a time. The head dim goes `step`
/// dimensions at a time: `query(d)` is the query's part from dimension d (a vector, or a pair
/// of them), `term(query(d), p, d, acc)` adds to the lanes `acc` the products of that part with
/// position p's key's.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn scores_of<Q: Copy>(
    scores: &mut [f32],
    head_dim: usize,
    step: usize,
    scale: f32,
    query: impl Fn(usize) -> Q,
    term: impl Fn(Q, usize, usize, __m256) -> __m256,
) -> f32 {
    let len = scores.len();
    let mut max_lanes = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut p = 0;
    while p + LANES <= len {
        let mut acc = [_mm256_setzero_ps(); LANES];
        for d in (0..head_dim).step_by(step) {
            let part = query(d);
            for (i, a) in acc.iter_mut().enumerate() {
                *a = term(part, p + i, d, *a);
            }
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
        for d in (0..head_dim).step_by(step) {
            acc = term(query(d), p, d, acc);
        }
        scores[p] = hsum(acc) * scale;
        max = max.max(scores[p]);
        p += 1;
    }
    max
}

/// [`accumulate`] 16 values at a time: `V` pairs of vectors at `acc`, in the order of
/// [`Cached::load16`].
///
/// # Safety
///
/// As [`accumulate`]'s, for `2 · V` vectors.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn accumulate_paired<const V: usize, C: Cached>(
    acc: *mut f32,
    values: *const C,
    stride: usize,
    numerators: &[f32],
) {
    // SAFETY: the caller's contract.
    let mut sums: [[__m256; 2]; V] = std::array::from_fn(|j| unsafe {
        [_mm256_loadu_ps(acc.add(2 * j * LANES)), _mm256_loadu_ps(acc.add((2 * j + 1) * LANES))]
    });
    for (i, &n) in numerators.iter().enumerate() {
        let n = _mm256_set1_ps(n);
        for (j, [s0, s1]) in sums.iter_mut().enumerate() {
            // SAFETY: the caller's contract.
            let (v0, v1) = unsafe { C::load16(values.add(i * stride + 2 * j * LANES)) };
            *s0 = _mm256_fmadd_ps(n, v0, *s0);
            *s1 = _mm256_fmadd_ps(n, v1, *s1);
        }
    }
    for (j, [s0, s1]) in sums.iter().enumerate() {
        // SAFETY: the caller's contract.
        unsafe {
            _mm256_storeu_ps(acc.add(2 * j * LANES), *s0);
            _mm256_storeu_ps(acc.add((2 * j + 1) * LANES), *s1);
        }
    }
}

/// Adds to the `V` vectors at `acc` the values `V` vectors wide at `values` (position i's at
/// `values + i · stride`) weighted by `numerators`.
///
/// # Safety
///
/// The CPU has AVX2 and FMA; `V` vectors are readable and writable at `acc` and readable at
/// each position's values.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn accumulate<const V: usize, C: Cached>(
    acc: *mut f32,
    values: *const C,
    stride: usize,
    numerators: &[f32],
) {
    // SAFETY: the caller's contract.
    let mut sums: [__m256; V] = std::array::from_fn(|j| unsafe { _mm256_loadu_ps(acc.add(j * LANES)) });
    for (i, &n) in numerators.iter().enumerate() {
        let n = _mm256_set1_ps(n);
        for (j, s) in sums.iter_mut().enumerate() {
            // SAFETY: the caller's contract.
            *s = _mm256_fmadd_ps(n, unsafe { C::load8(values.add(i * stride + j * LANES)) }, *s);
        }
    }
    for (j, s) in sums.iter().enumerate() {
        // SAFETY: the caller's contract.
        unsafe { _mm256_storeu_ps(acc.add(j * LANES), *s) };
    }
}

/// Turns `scores` into the softmax numerators `exp(s − max)`, in place, and returns their sum.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn numerators(scores: &mut [f32], max: f32) -> f32 {
    let len = scores.len();
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
    hsum(sum_lanes)
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

/// A prefill as a team shares it: by kv heads, each thread the query heads of its own.
impl<C: Cached + 'static> Job for Attention<C> {
    fn extent(&self) -> Extent {
        Extent { columns: self.n_kv_heads(), granule: 1, work: self.work() }
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract, which `team::run` keeps.
        unsafe { self.kv_heads(cols) }
    }
}

/// A decode step as a team shares it: by chunks of positions (`Decode::n`).
impl<C: Cached + 'static> Job for Decode<C> {
    fn extent(&self) -> Extent {
        Extent { columns: self.n(), granule: 1, work: self.work() }
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        for chunk in cols {
            // SAFETY: the caller's contract, which `team::run` keeps (each chunk on one
            // thread); a kernel hands the team a decode only on a CPU with AVX2 and FMA.
            unsafe { self.chunk(chunk) }
        }
    }
}
