//! Attention over an f32 or a bfloat16 KV cache with AVX2 and FMA, head by head: the core of
//! the AVX2 decode and prefill kernels that share it out by kv heads on the crate's team.
//! Every key and value is loaded as f32 lanes (a bfloat16 one widened exactly as it is loaded,
//! `vpmovzxwd` and `vpslld`).
//!
//! **One row** (a decode step, or a head dim that is not a multiple of 8): for each query
//! head of a share, three passes over the positions the row attends to:
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
//! **Several rows** (a prefill) take the same three passes for blocks of 6 rows at once, each
//! load serving the block's 6 rows as a product's packed block does: the kv head's keys are
//! transposed once per call into a buffer of the thread (8 × 8 tiles, `shared/avx2_transpose.rs`),
//! so that a vector of them holds 8 positions of one dimension. A step of the scores then loads
//! 2 vectors of keys and broadcasts each row's query value, for 12 multiply-adds with no
//! reduction; a step of the values loads 2 vectors of values and broadcasts each row's
//! numerator. Row by row, the attention took 11.6% of a stories15M bf16 run's samples under
//! `perf` (the products 43%); in blocks, 3.1%. `bench/ab.py` measured the prefill 1.11-1.16x
//! faster at stories15M and 1.09-1.11x at stories110M (2 threads, AMD EPYC Zen 3).
#![allow(clippy::missing_safety_doc, clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::avx2_math::{LANES, exp, hmax, hsum, lane_mask, sum8};
use super::avx2_transpose::transpose;

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
        let max =
            scores_of(scores, head_dim, scale, query, |p, d| unsafe { C::load8(keys.add(p * kv_dim + d)) });

        let inv_sum = _mm256_set1_ps(numerators(scores, max));

        // The weighted sum of the values: 8 output vectors at a time, then 4, then 1.
        let mut d = 0;
        while d + 8 * LANES <= head_dim {
            unsafe { weighted::<8, C>(out.add(d), values.add(d), kv_dim, scores, inv_sum) };
            d += 8 * LANES;
        }
        while d + 4 * LANES <= head_dim {
            unsafe { weighted::<4, C>(out.add(d), values.add(d), kv_dim, scores, inv_sum) };
            d += 4 * LANES;
        }
        while d < head_dim {
            unsafe { weighted::<1, C>(out.add(d), values.add(d), kv_dim, scores, inv_sum) };
            d += LANES;
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

        // SAFETY (the keys): the CPU has AVX2 and FMA, as this function requires.
        let key = |p: usize, d: usize| unsafe { C::load(&keys[p * kv_dim + offset..][..head_dim], d) };
        let max = scores_of(scores, head_dim, scale, |d| load_f32(q, d), key);

        let inv_sum = _mm256_set1_ps(numerators(scores, max));

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

/// Writes the scores of one query row over `scores.len()` positions (its dot products with
/// their keys, times `scale`) and returns their maximum: 8 positions at a time, as 8 lane-wise
/// dot products reduced by one `sum8`, then the rest one at a time. `query(d)` is the query's
/// vector of dimensions `d..d + 8`, `key(p, d)` position p's key's.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn scores_of(
    scores: &mut [f32],
    head_dim: usize,
    scale: f32,
    query: impl Fn(usize) -> __m256,
    key: impl Fn(usize, usize) -> __m256,
) -> f32 {
    let len = scores.len();
    let mut max_lanes = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut p = 0;
    while p + LANES <= len {
        let mut acc = [_mm256_setzero_ps(); LANES];
        let mut d = 0;
        while d < head_dim {
            let qv = query(d);
            for (i, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(qv, key(p + i, d), *a);
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
            acc = _mm256_fmadd_ps(query(d), key(p, d), acc);
            d += LANES;
        }
        scores[p] = hsum(acc) * scale;
        max = max.max(scores[p]);
        p += 1;
    }
    max
}

/// Writes `V` vectors of one row's output at `out`: the values `V` vectors wide at `values`
/// (position p's at `values + p · stride`) weighted by `numerators`, times `inv_sum`.
///
/// # Safety
///
/// The CPU has AVX2 and FMA; `V` vectors are writable at `out` and readable at each position's
/// values.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted<const V: usize, C: Cached>(
    out: *mut f32,
    values: *const C,
    stride: usize,
    numerators: &[f32],
    inv_sum: __m256,
) {
    let mut acc = [_mm256_setzero_ps(); V];
    for (p, &n) in numerators.iter().enumerate() {
        let n = _mm256_set1_ps(n);
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: the caller's contract.
            *a = _mm256_fmadd_ps(n, unsafe { C::load8(values.add(p * stride + j * LANES)) }, *a);
        }
    }
    for (j, a) in acc.iter().enumerate() {
        // SAFETY: the caller's contract.
        unsafe { _mm256_storeu_ps(out.add(j * LANES), _mm256_mul_ps(*a, inv_sum)) };
    }
}

/// Turns `scores` into the softmax numerators `exp(s − max)`, in place, and returns 1 / their
/// sum.
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
    1.0 / hsum(sum_lanes)
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
