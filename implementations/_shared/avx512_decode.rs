//! Grouped-query attention of one new position over the KV cache with AVX-512F, reading the
//! cache row by row, for a range of kv heads: each thread's share of them on the crate's team
//! (`attention_decode/avx512-threads`, over an f32 or a bfloat16 cache: [`Decode`] is generic
//! over the cache's [`KvElement`]).
//!
//! The shapes are fields of [`Decode`], not consts: the team's `TeamJob` enum holds one job
//! type per kernel, which therefore cannot be generic over the kernel's consts. The scores
//! and the weighted values take four cache rows at a time, so that four independent chains of
//! fused multiply-adds hide each other's latency and a dot product costs a quarter of a
//! horizontal sum. `attention_decode/avx512` keeps its own copy with const shapes for one
//! thread: at stories110M's heads, this module on one thread took 22.1-22.7 µs a call
//! against its 18.5-19.3 (a throwaway loop, 160 positions).
//!
//! A cache row holds one position's keys (or values) of every kv head side by side. Walking
//! one head at a time, as the AVX2 kernel does, reads a short piece of every row once per
//! head, a strided pattern that the hardware prefetchers follow poorly. Here every row's piece
//! of the range's kv heads is read once, in order, for all of their query heads:
//! 1. scores: for each position, each query head's dot product with its kv head's key
//!    (HEAD_DIM / 16 fused multiply-adds and a horizontal sum), scaled by 1/√HEAD_DIM, into
//!    a buffer of the calling thread holding `[heads, len]` scores;
//! 2. softmax: per head, the maximum, the numerators `exp(score − max)` with the shared
//!    AVX-512 exp, 16 at a time, and their sum (a head with a NaN or +∞ score gets NaN
//!    outputs, as in the reference);
//! 3. output: the value rows, four positions at a time, each head's 16-lane pieces of the
//!    output gaining the four weighted values with fused multiply-adds (the output stays in
//!    the L1 cache), then each head is divided by its sum.
//!
//! Any HEAD_DIM works: the last vector of a head is masked when 16 does not divide it.
//!
//! # Safety
//!
//! A [`Decode`] is raw pointers to its caller's slices, whose lengths [`Decode::new`] checked
//! against the shapes. The caller keeps the slices alive, and `out` unused otherwise, until
//! every [`Decode::kv_heads`] call is done; calls running at once take disjoint ranges of kv
//! heads, so that each writes its own heads of `out`.

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::avx512_kv::KvElement;
use super::avx512_math::exp;
use super::job::{Extent, Job};

/// f32 lanes of an AVX-512 register.
const LANES: usize = 16;

/// How many quads of cache rows ahead the loops prefetch (4 measured the same).
const AHEAD: usize = 2;

thread_local! {
    /// The calling thread's scores, `[heads, len]`, then each head's reciprocal sum.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// One call's operands and shapes, over a cache of `E`.
#[derive(Clone, Copy)]
pub struct Decode<E> {
    out: *mut f32,
    q: *const f32,
    keys: *const E,
    values: *const E,
    len: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
}

// SAFETY: pointers to buffers that the caller keeps alive and shares out by disjoint ranges of
// kv heads until every thread is done (the module's safety section).
unsafe impl<E> Send for Decode<E> {}
unsafe impl<E> Sync for Decode<E> {}

impl<E: KvElement> Decode<E> {
    /// Cached positions, the new one included.
    pub fn positions(&self) -> usize {
        self.len
    }

    /// The kv heads, which [`Decode::kv_heads`] takes ranges of.
    pub fn n_kv_heads(&self) -> usize {
        self.n_kv_heads
    }

    /// Multiply-adds of the whole call: one per query value and cached position, for the
    /// scores and again for the output.
    pub fn work(&self) -> usize {
        2 * self.len * self.n_heads * self.head_dim
    }

    /// The attention of `q` (`[N_HEADS · HEAD_DIM]`) over `keys` and `values` (`[len,
    /// N_KV_HEADS · HEAD_DIM]`) into `out` (`[N_HEADS · HEAD_DIM]`), with the slices' lengths
    /// checked.
    pub fn new<const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize>(
        out: &mut [f32],
        q: &[f32],
        keys: &[E],
        values: &[E],
    ) -> Decode<E> {
        const {
            assert!(
                N_KV_HEADS > 0 && N_HEADS.is_multiple_of(N_KV_HEADS),
                "N_HEADS must be a multiple of N_KV_HEADS"
            )
        };
        let q_dim = N_HEADS * HEAD_DIM;
        let kv_dim = N_KV_HEADS * HEAD_DIM;
        let len = keys.len() / kv_dim;
        assert!(
            len > 0 && keys.len() == len * kv_dim,
            "attention_decode: keys must hold whole positions, at least one"
        );
        assert!(values.len() == keys.len(), "attention_decode: values and keys differ in length");
        assert!(
            q.len() >= q_dim && out.len() >= q_dim,
            "attention_decode: q or out is shorter than N_HEADS · HEAD_DIM"
        );
        Decode {
            out: out.as_mut_ptr(),
            q: q.as_ptr(),
            keys: keys.as_ptr(),
            values: values.as_ptr(),
            len,
            n_heads: N_HEADS,
            n_kv_heads: N_KV_HEADS,
            head_dim: HEAD_DIM,
        }
    }

    /// Computes the output of the query heads that read kv heads `heads`.
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512F, and the module's safety section holds.
    pub unsafe fn kv_heads(&self, heads: Range<usize>) {
        assert!(heads.start <= heads.end && heads.end <= self.n_kv_heads);
        let count = heads.len() * (self.n_heads / self.n_kv_heads);
        if count == 0 {
            return;
        }
        SCORES.with_borrow_mut(|buffer| {
            if buffer.len() < count * (self.len + 1) {
                buffer.resize(count * (self.len + 1), 0.0);
            }
            let (scores, inverse_sums) = buffer[..count * (self.len + 1)].split_at_mut(count * self.len);
            // SAFETY: the caller's contract.
            unsafe { self.heads_avx512(heads, scores, inverse_sums) }
        });
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn heads_avx512(&self, heads: Range<usize>, scores: &mut [f32], inverse_sums: &mut [f32]) {
        let Decode { len, n_heads, n_kv_heads, head_dim, .. } = *self;
        let kv_dim = n_kv_heads * head_dim;
        let group = n_heads / n_kv_heads;
        let first = heads.start * group;
        let count = heads.len() * group;
        // What the raw-pointer accesses below rely on.
        assert!(scores.len() == count * len && inverse_sums.len() == count);
        // SAFETY: `new` checked the lengths; this call's query heads are its own, so no other
        // thread writes (or reads) these values of `out`.
        let (out, q, keys, values) = unsafe {
            (
                std::slice::from_raw_parts_mut(self.out.add(first * head_dim), count * head_dim),
                std::slice::from_raw_parts(self.q.add(first * head_dim), count * head_dim),
                std::slice::from_raw_parts(self.keys, len * kv_dim),
                std::slice::from_raw_parts(self.values, len * kv_dim),
            )
        };
        let vectors = head_dim.div_ceil(LANES);
        let last = span_mask(head_dim - (vectors - 1) * LANES);
        let mask = |v: usize| if v + 1 == vectors { last } else { u16::MAX };
        // Whole vectors of a head, and the lanes of the masked one after them (0: none).
        let (full, rest) = (head_dim / LANES, span_mask(head_dim % LANES));
        let scale = 1.0 / (head_dim as f32).sqrt();

        // 1. Scores, four key rows at a time: scores[h · len + position], the query heads of
        //    each kv head in turn (h counts this call's query heads).
        let quads = keys.chunks_exact(4 * kv_dim);
        let remainder = quads.remainder();
        let span = heads.start * head_dim..heads.end * head_dim;
        for (quad, rows) in quads.enumerate() {
            prefetch_rows(keys, 4 * (quad + AHEAD), kv_dim, span.clone());
            let mut h = 0;
            for kv in heads.clone() {
                let key = rows[kv * head_dim..3 * kv_dim + (kv + 1) * head_dim].as_ptr();
                for _ in 0..group {
                    let query = q[h * head_dim..][..head_dim].as_ptr();
                    let at = &mut scores[h * len + 4 * quad..][..4];
                    // SAFETY: whole vectors, then the masked rest, inside the head's values of
                    // the query and of the four key rows (kv_dim apart); four scores at `at`.
                    unsafe {
                        let dots = dot4::<E>(key, kv_dim, query, full, rest);
                        _mm_storeu_ps(at.as_mut_ptr(), _mm_mul_ps(dots, _mm_set1_ps(scale)));
                    }
                    h += 1;
                }
            }
        }
        let first_rest = len - remainder.len() / kv_dim;
        for (i, row) in remainder.chunks_exact(kv_dim).enumerate() {
            let mut h = 0;
            for kv in heads.clone() {
                let key = row[kv * head_dim..][..head_dim].as_ptr();
                for _ in 0..group {
                    let query = q[h * head_dim..][..head_dim].as_ptr();
                    // SAFETY: whole vectors, then the masked rest, inside the head's values.
                    let dot = unsafe { dot::<E>(key, query, full, rest) };
                    scores[h * len + first_rest + i] = dot * scale;
                    h += 1;
                }
            }
        }

        // 2. Softmax numerators per head, in place, and the reciprocal of their sum.
        for (head, inverse) in scores.chunks_exact_mut(len).zip(inverse_sums.iter_mut()) {
            let mut max = _mm512_set1_ps(f32::NEG_INFINITY);
            let mut not_finite: __mmask16 = 0;
            for at in (0..len).step_by(LANES) {
                let m = span_mask(len - at);
                // SAFETY: the mask keeps the load inside the head's scores.
                let s = unsafe { _mm512_maskz_loadu_ps(m, head.as_ptr().add(at)) };
                max = _mm512_mask_max_ps(max, m, max, s);
                not_finite |= _mm512_mask_cmp_ps_mask::<_CMP_NLT_UQ>(m, s, _mm512_set1_ps(f32::INFINITY));
            }
            let top = _mm512_reduce_max_ps(max);
            // A NaN or +∞ score, or no score above −∞, makes the reference's softmax NaN, and
            // so this head's output (the vectorised exp would turn NaN into a tiny number).
            if not_finite != 0 || top == f32::NEG_INFINITY {
                *inverse = f32::NAN;
                continue;
            }
            let max = _mm512_set1_ps(top);
            let mut sum = _mm512_setzero_ps();
            for at in (0..len).step_by(LANES) {
                let m = span_mask(len - at);
                // SAFETY: the mask keeps the load and the store inside the head's scores.
                unsafe {
                    let e = exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, head.as_ptr().add(at)), max));
                    _mm512_mask_storeu_ps(head.as_mut_ptr().add(at), m, e);
                    sum = _mm512_mask_add_ps(sum, m, sum, e);
                }
            }
            *inverse = 1.0 / _mm512_reduce_add_ps(sum);
        }

        // 3. The weighted values, four value rows at a time.
        out.fill(0.0);
        let scores = &*scores;
        let quads = values.chunks_exact(4 * kv_dim);
        let remainder = quads.remainder();
        for (quad, rows) in quads.enumerate() {
            prefetch_rows(values, 4 * (quad + AHEAD), kv_dim, span.clone());
            let position = 4 * quad;
            let mut h = 0;
            for kv in heads.clone() {
                let value = rows[kv * head_dim..3 * kv_dim + (kv + 1) * head_dim].as_ptr();
                for _ in 0..group {
                    let p = &scores[h * len + position..][..4];
                    let weights = [
                        _mm512_set1_ps(p[0]),
                        _mm512_set1_ps(p[1]),
                        _mm512_set1_ps(p[2]),
                        _mm512_set1_ps(p[3]),
                    ];
                    let o = out[h * head_dim..][..head_dim].as_mut_ptr();
                    // SAFETY: head h's HEAD_DIM values of its row of `out` and of the four
                    // value rows (`value` starts the kv head's piece of the first, each next
                    // one kv_dim further).
                    unsafe { add_weighted::<E>(o, value, kv_dim, &weights, full, rest) };
                    h += 1;
                }
            }
        }
        let first_rest = len - remainder.len() / kv_dim;
        for (i, row) in remainder.chunks_exact(kv_dim).enumerate() {
            let mut h = 0;
            for kv in heads.clone() {
                let value = row[kv * head_dim..][..head_dim].as_ptr();
                for _ in 0..group {
                    let w = _mm512_set1_ps(scores[h * len + first_rest + i]);
                    let o = out[h * head_dim..][..head_dim].as_mut_ptr();
                    for v in 0..vectors {
                        let at = v * LANES;
                        // SAFETY: as above, for one value row.
                        unsafe {
                            let x = E::maskz_load(mask(v), value.add(at));
                            let acc = _mm512_fmadd_ps(w, x, _mm512_maskz_loadu_ps(mask(v), o.add(at)));
                            _mm512_mask_storeu_ps(o.add(at), mask(v), acc);
                        }
                    }
                    h += 1;
                }
            }
        }
        for (head, &inverse) in out.chunks_exact_mut(head_dim).zip(inverse_sums.iter()) {
            for x in head {
                *x *= inverse;
            }
        }
    }
}

/// The dot product of `full` whole vectors at `a` (cached) and `b` and the lanes `rest` of
/// the next.
///
/// # Safety
///
/// `full · 16` values, and those of `rest` after them, are readable at both.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn dot<E: KvElement>(a: *const E, b: *const f32, full: usize, rest: __mmask16) -> f32 {
    let mut sum = _mm512_setzero_ps();
    for v in 0..full {
        // SAFETY: the caller's contract.
        unsafe { sum = _mm512_fmadd_ps(E::load(a.add(v * LANES)), _mm512_loadu_ps(b.add(v * LANES)), sum) };
    }
    if rest != 0 {
        // SAFETY: the caller's contract; the mask keeps the loads inside it.
        unsafe {
            let (x, y) =
                (E::maskz_load(rest, a.add(full * LANES)), _mm512_maskz_loadu_ps(rest, b.add(full * LANES)));
            sum = _mm512_fmadd_ps(x, y, sum);
        }
    }
    _mm512_reduce_add_ps(sum)
}

/// The dot products of the query at `query` with the four keys at `keys + u · stride`, over
/// `full` whole vectors and the lanes `rest` of the next, as one vector of 4.
///
/// # Safety
///
/// Those values are readable at `query` and at each key.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn dot4<E: KvElement>(
    keys: *const E,
    stride: usize,
    query: *const f32,
    full: usize,
    rest: __mmask16,
) -> __m128 {
    let mut sums = [_mm512_setzero_ps(); 4];
    for v in 0..full {
        let at = v * LANES;
        // SAFETY: the caller's contract.
        unsafe {
            let x = _mm512_loadu_ps(query.add(at));
            for (u, sum) in sums.iter_mut().enumerate() {
                *sum = _mm512_fmadd_ps(E::load(keys.add(u * stride + at)), x, *sum);
            }
        }
    }
    if rest != 0 {
        let at = full * LANES;
        // SAFETY: the caller's contract; the mask keeps the loads inside it.
        unsafe {
            let x = _mm512_maskz_loadu_ps(rest, query.add(at));
            for (u, sum) in sums.iter_mut().enumerate() {
                *sum = _mm512_fmadd_ps(E::maskz_load(rest, keys.add(u * stride + at)), x, *sum);
            }
        }
    }
    // Halve each sum to 8 lanes, then pairwise horizontal adds leave the four totals.
    let [a, b, c, d] = sums.map(|v| {
        let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        _mm256_add_ps(_mm512_castps512_ps256(v), high)
    });
    let abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps::<1>(abcd))
}

/// Adds `Σ_u weights[u] · values[u · stride ..]` to the `full` whole vectors and the lanes
/// `rest` of the next at `out`.
///
/// # Safety
///
/// Those values are readable at `values + u · stride` for u < 4, and writable at `out`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn add_weighted<E: KvElement>(
    out: *mut f32,
    values: *const E,
    stride: usize,
    weights: &[__m512; 4],
    full: usize,
    rest: __mmask16,
) {
    for v in 0..full {
        let at = v * LANES;
        // SAFETY: the caller's contract.
        unsafe {
            let mut acc = _mm512_loadu_ps(out.add(at));
            for (u, w) in weights.iter().enumerate() {
                acc = _mm512_fmadd_ps(*w, E::load(values.add(u * stride + at)), acc);
            }
            _mm512_storeu_ps(out.add(at), acc);
        }
    }
    if rest != 0 {
        let at = full * LANES;
        // SAFETY: the caller's contract; the mask keeps every access inside it.
        unsafe {
            let mut acc = _mm512_maskz_loadu_ps(rest, out.add(at));
            for (u, w) in weights.iter().enumerate() {
                acc = _mm512_fmadd_ps(*w, E::maskz_load(rest, values.add(u * stride + at)), acc);
            }
            _mm512_mask_storeu_ps(out.add(at), rest, acc);
        }
    }
}

/// Asks for the pieces `span` of the 4 cache rows from `first` (those that exist) to be brought
/// into the L1 cache: the rows that a quad `AHEAD` quads later reads. The cache of every layer
/// stays in the L3 cache from one step to the next, and without this its reads waited on
/// each line (a step at 850 positions of stories110M's shapes read its bfloat16 cache at
/// 15.6 GB/s, against 37 GB/s for the weights).
#[inline]
#[target_feature(enable = "avx512f")]
fn prefetch_rows<E>(cache: &[E], first: usize, kv_dim: usize, span: Range<usize>) {
    let bytes = span.len() * size_of::<E>();
    for row in first..(first + 4).min(cache.len() / kv_dim) {
        let start = cache[row * kv_dim + span.start..].as_ptr().cast::<i8>();
        for offset in (0..bytes).step_by(64).chain([bytes - 1]) {
            // A prefetch reads nothing and never faults; the address stays inside the piece.
            _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(offset));
        }
    }
}

/// The mask of the first `remaining` lanes, all 16 when at least 16 remain.
#[inline]
fn span_mask(remaining: usize) -> __mmask16 {
    if remaining >= LANES { u16::MAX } else { (1u16 << remaining) - 1 }
}

/// A decode step as a team shares it: by kv heads, each thread the query heads of its own.
impl<E: KvElement> Job for Decode<E> {
    fn extent(&self) -> Extent {
        Extent { columns: self.n_kv_heads(), granule: 1, work: self.work() }
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract, which `team::run` keeps.
        unsafe { self.kv_heads(cols) }
    }
}
