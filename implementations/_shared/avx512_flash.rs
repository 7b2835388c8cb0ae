//! Causal grouped-query attention for a chunk of new positions with AVX-512F and its shapes at
//! run time, so that the crate's team can share a call by ranges of kv heads.
//!
//! Each thread takes its kv heads one at a time: it transposes the head's keys into a buffer of
//! its own (`[head_dim, padded]`, 32 KiB at 128 positions of 64 dimensions, in L1 while the
//! head's query rows read it), then runs the query heads that read that kv head, 8 rows at a
//! time, in three passes over the rows' scores, which a second buffer of the thread holds:
//! 1. the scores of positions 0..=the last row's own, 32 at a time: a step along the head dim
//!    loads two vectors of 16 positions' keys and broadcasts each row's query value, for 16
//!    multiply-adds into 16 sums in registers;
//! 2. each row's softmax over its own positions, exact, its maximum known from the first pass;
//! 3. the values weighted by it, 2 vectors of dimensions at a time for 8 rows (4 for 4 rows or
//!    fewer): a value vector loaded once serves every row, and past its own position a row
//!    takes no value.
//!
//! `attention_prefill/avx512-flash`, whose shapes are constants, walks the positions 16 at a
//! time with an online softmax instead (flash-style), each row's output in registers. This
//! module did too, until this layout measured faster: at stories110M's shapes (12 calls of 128
//! new positions, 12 heads of 64, 2 threads) 1.98 ms against 3.40-3.46, the keys transposed
//! whole by the calling thread before the team started taking 0.34 ms of that (bench/RESULTS.md).
//!
//! The cache may hold f32 or bfloat16 (`attention_prefill/avx512-flash-threads` serves both):
//! [`Flash`] is generic over its
//! [`KvElement`]: the keys are widened as they are transposed and, from bfloat16, each thread
//! widens its kv head's values into a buffer of its own ([`KvElement::head_values`]): 1.19-1.21x
//! the attention's speed of widening the whole cache on the calling thread before the team
//! starts, where for f32 such a copy measured 0.96-0.98x reading in place. So the loops of
//! [`Flash::kv_heads`] read f32 either way. Widening each value as the loop loads it instead,
//! once per block of query rows, made the prefill of 896 positions at stories110M's shapes 13%
//! slower than over an f32 cache.
//!
//! # Safety
//!
//! [`Flash::kv_heads`] may be called only on a CPU with AVX-512F, from inside
//! [`Flash::prepared`], and never twice at once on overlapping ranges of kv heads.
#![allow(dead_code, clippy::missing_safety_doc, clippy::needless_range_loop, clippy::too_many_arguments)]

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::avx512_kv::KvElement;
use super::avx512_math::exp;
use super::avx512_transpose::transpose;
use super::job::{Extent, Job};

/// The f32 lanes of an AVX-512 register.
const LANES: usize = 16;

/// Vectors of one head's output: HEAD_DIM up to 256.
pub const MAX_VECTORS: usize = 16;

/// Query rows that share each load of keys and values.
const ROWS: usize = 8;

/// Vectors of the output that a block of values updates at once, in registers.
const CHUNK: usize = 4;

thread_local! {
    /// The keys of the kv head that the thread is on, transposed.
    static KEYS_T: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The values of the kv head that the thread is on, widened to f32 from a bfloat16 cache
    /// (each is read once per block of query rows; widening each once is cheaper), `head_dim`
    /// per position.
    static VALUES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The scores, then the softmax weights, of the block of query rows that the thread is on.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// One call's operands and shapes, over a cache of `E` (f32 or bfloat16).
#[derive(Clone, Copy)]
pub struct Flash<E = f32> {
    out: *mut f32,
    q: *const f32,
    /// The cache's keys, which each thread transposes kv head by kv head.
    keys: *const E,
    /// The cache's values, which each thread reads in place (f32) or widens kv head by kv head.
    values: *const E,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    start: usize,
    rows: usize,
    padded: usize,
}

// SAFETY: a call is only pointers to buffers that its caller keeps alive and shares out by
// disjoint ranges of kv heads until every thread is done (see the module's safety section).
unsafe impl<E> Send for Flash<E> {}
unsafe impl<E> Sync for Flash<E> {}

impl<E: KvElement> Flash<E> {
    /// Checks the slices' lengths and runs `f` on the call.
    ///
    /// `q`, `out`: `[rows, n_heads · head_dim]`; `keys`, `values`: `[start + rows, n_kv_heads ·
    /// head_dim]`.
    ///
    /// # Safety
    ///
    /// Only on a CPU with AVX-512F (and, over a bfloat16 cache, BW and VL).
    pub unsafe fn prepared<T>(
        out: &mut [f32],
        q: &[f32],
        keys: &[E],
        values: &[E],
        (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
        start: usize,
        rows: usize,
        f: impl FnOnce(&Flash<E>) -> T,
    ) -> T {
        assert!(
            n_kv_heads > 0 && n_heads.is_multiple_of(n_kv_heads),
            "n_heads must be a multiple of n_kv_heads"
        );
        assert!(head_dim > 0 && head_dim <= MAX_VECTORS * LANES, "head_dim must be 1..=256");
        let (q_dim, kv_dim, len) = (n_heads * head_dim, n_kv_heads * head_dim, start + rows);
        assert!(q.len() >= rows * q_dim, "attention_prefill: q is shorter than {rows} rows");
        assert!(out.len() >= rows * q_dim, "attention_prefill: out is shorter than {rows} rows");
        assert!(keys.len() >= len * kv_dim, "attention_prefill: keys hold fewer than start + rows positions");
        assert!(
            values.len() >= len * kv_dim,
            "attention_prefill: values hold fewer than start + rows positions"
        );
        f(&Flash {
            out: out.as_mut_ptr(),
            q: q.as_ptr(),
            keys: keys.as_ptr(),
            values: values.as_ptr(),
            n_heads,
            n_kv_heads,
            head_dim,
            start,
            rows,
            padded: len.next_multiple_of(LANES),
        })
    }

    /// Kv heads of the call (the columns a team shares).
    pub fn n_kv_heads(&self) -> usize {
        self.n_kv_heads
    }

    /// The call's work, in multiply-adds of scores and outputs.
    pub fn work(&self) -> usize {
        let len = self.start + self.rows;
        2 * self.rows * len * self.n_heads * self.head_dim
    }

    /// Every row of the query heads that read the kv heads `kv_heads`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn kv_heads(&self, kv_heads: Range<usize>) {
        let (group, head_dim, padded) = (self.n_heads / self.n_kv_heads, self.head_dim, self.padded);
        let (kv_dim, len) = (self.n_kv_heads * head_dim, self.start + self.rows);
        // SAFETY: `prepared` checked that the cache holds `start + rows` positions.
        let keys = unsafe { std::slice::from_raw_parts(self.keys, len * kv_dim) };
        KEYS_T.with_borrow_mut(|keys_t| {
            VALUES.with_borrow_mut(|buffer| {
                SCORES.with_borrow_mut(|scores| {
                    // Only ever grown: the transposition writes all it reads (zeros from `start +
                    // rows` to `padded`), and every block writes the scores it reads.
                    if keys_t.len() < head_dim * padded {
                        keys_t.resize(head_dim * padded, 0.0);
                    }
                    if scores.len() < ROWS * padded {
                        scores.resize(ROWS * padded, 0.0);
                    }
                    let scores = scores.as_mut_ptr();
                    for kv_head in kv_heads {
                        let channels = kv_head * head_dim..(kv_head + 1) * head_dim;
                        // SAFETY: the caller's contract (the features); the channels are in
                        // range, and the cache holds `len` positions.
                        let (values, stride) = unsafe {
                            transpose_channels(keys_t, keys, kv_dim, channels.clone(), padded);
                            E::head_values(self.values, kv_dim, channels, len, buffer)
                        };
                        let head = Head { keys_t: keys_t.as_ptr(), values, stride };
                        for h in kv_head * group..(kv_head + 1) * group {
                            let mut r = 0;
                            while r < self.rows {
                                // SAFETY: head `h` and the rows are in range (checked by
                                // `prepared`), `head` holds its kv head's keys and values, and
                                // `scores` ROWS rows of `padded` values.
                                r += unsafe {
                                    match self.rows - r {
                                        1 => self.block::<1>(h, r, head, scores),
                                        2 => self.block::<2>(h, r, head, scores),
                                        3 => self.block::<3>(h, r, head, scores),
                                        4 => self.block::<4>(h, r, head, scores),
                                        5 => self.block::<5>(h, r, head, scores),
                                        6 => self.block::<6>(h, r, head, scores),
                                        7 => self.block::<7>(h, r, head, scores),
                                        _ => self.block::<ROWS>(h, r, head, scores),
                                    }
                                };
                            }
                        }
                    }
                })
            })
        });
    }

    /// Rows `r0..r0 + R` of query head `h` (positions `start + r0..`), each over the positions
    /// up to its own, in three passes over the block's scores, which `scores` holds (`R` rows
    /// of `padded` values, in L1): the scores, each pair of key vectors loaded once for the R
    /// rows; each row's softmax, exact, its maximum known; the weighted sum of the values, each
    /// value vector loaded once for the R rows. Returns R.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn block<const R: usize>(&self, h: usize, r0: usize, head: Head, scores: *mut f32) -> usize {
        let (head_dim, padded) = (self.head_dim, self.padded);
        let q_dim = self.n_heads * head_dim;
        let Head { keys_t, values, stride } = head;
        let vectors = head_dim.div_ceil(LANES);
        let last_mask = lanes(head_dim - (vectors - 1) * LANES);
        let mask_of = |v: usize| if v + 1 == vectors { last_mask } else { u16::MAX };
        // Row i attends to positions 0..lens[i]; the last row to the most.
        let lens: [usize; R] = std::array::from_fn(|i| self.start + r0 + i + 1);
        let end = lens[R - 1];
        // SAFETY (every pointer below): `prepared` checked that q holds the rows' heads, that
        // the cache holds `end` positions and wrote `padded` ≥ end positions of every channel
        // of the transposed keys; `scores` holds R rows of `padded` values (`kv_heads`).
        let queries: [*const f32; R] =
            std::array::from_fn(|i| unsafe { self.q.add((r0 + i) * q_dim + h * head_dim) });
        let rows: [*mut f32; R] = std::array::from_fn(|i| unsafe { scores.add(i * padded) });
        let scale = _mm512_set1_ps(1.0 / (head_dim as f32).sqrt());
        let minus_infinity = _mm512_set1_ps(f32::NEG_INFINITY);

        // 1. The scores of positions 0..end, 32 at a time (16 for a last odd vector), times
        //    1/√HEAD_DIM, −∞ past each row's own position; each row's running maximum by lane.
        let mut max = [minus_infinity; R];
        let mut j0 = 0;
        while j0 < end {
            let pair = j0 + LANES < end;
            let (mut a, mut b) = ([_mm512_setzero_ps(); R], [_mm512_setzero_ps(); R]);
            for d in 0..head_dim {
                let at = unsafe { keys_t.add(d * padded + j0) };
                let k0 = unsafe { _mm512_loadu_ps(at) };
                if pair {
                    let k1 = unsafe { _mm512_loadu_ps(at.add(LANES)) };
                    for i in 0..R {
                        let qv = _mm512_set1_ps(unsafe { *queries[i].add(d) });
                        a[i] = _mm512_fmadd_ps(qv, k0, a[i]);
                        b[i] = _mm512_fmadd_ps(qv, k1, b[i]);
                    }
                } else {
                    for i in 0..R {
                        a[i] = _mm512_fmadd_ps(_mm512_set1_ps(unsafe { *queries[i].add(d) }), k0, a[i]);
                    }
                }
            }
            for i in 0..R {
                let live = lanes(lens[i].saturating_sub(j0));
                let s = _mm512_mask_mul_ps(minus_infinity, live, a[i], scale);
                max[i] = _mm512_max_ps(max[i], s);
                unsafe { _mm512_storeu_ps(rows[i].add(j0), s) };
                if pair {
                    let live = lanes(lens[i].saturating_sub(j0 + LANES));
                    let s = _mm512_mask_mul_ps(minus_infinity, live, b[i], scale);
                    max[i] = _mm512_max_ps(max[i], s);
                    unsafe { _mm512_storeu_ps(rows[i].add(j0 + LANES), s) };
                }
            }
            j0 += if pair { 2 * LANES } else { LANES };
        }

        // 2. Each row's softmax weights over its own positions, in place, and their sum. A NaN
        //    or +∞ score makes the row's output NaN, as in the reference.
        let mut inverse = [_mm512_setzero_ps(); R];
        for i in 0..R {
            let m = _mm512_reduce_max_ps(max[i]);
            let mv = _mm512_set1_ps(m);
            let mut sum = _mm512_setzero_ps();
            let mut not_finite: __mmask16 = 0;
            for j0 in (0..lens[i]).step_by(LANES) {
                let live = lanes(lens[i] - j0);
                let s = unsafe { _mm512_loadu_ps(rows[i].add(j0)) };
                not_finite |= _mm512_mask_cmp_ps_mask::<_CMP_NLT_UQ>(live, s, _mm512_set1_ps(f32::INFINITY));
                let w = _mm512_maskz_mov_ps(live, exp(_mm512_sub_ps(s, mv)));
                sum = _mm512_add_ps(sum, w);
                unsafe { _mm512_storeu_ps(rows[i].add(j0), w) };
            }
            let nan = not_finite != 0 || m == f32::NEG_INFINITY;
            inverse[i] = _mm512_set1_ps(if nan { f32::NAN } else { 1.0 / _mm512_reduce_add_ps(sum) });
        }

        // 3. The weighted sums of the values, 2 vectors of dimensions at a time in registers (4
        //    for 4 rows or fewer).
        //    Past its own position a row takes no value, not even with weight 0: 0 times an
        //    infinite or NaN value would be NaN where the reference never reads that value.
        // More than 4 rows keep 2 vectors each in registers.
        let chunk = if R > 4 { CHUNK / 2 } else { CHUNK };
        for v0 in (0..vectors).step_by(chunk) {
            let mut o = [[_mm512_setzero_ps(); CHUNK]; R];
            for j in 0..end {
                // SAFETY: position j < end, and the masks keep the loads inside its kv head.
                let value = unsafe { values.add(j * stride + v0 * LANES) };
                let mut x = [_mm512_setzero_ps(); CHUNK];
                for u in 0..CHUNK {
                    if u < chunk && v0 + u < vectors {
                        x[u] = unsafe { _mm512_maskz_loadu_ps(mask_of(v0 + u), value.add(u * LANES)) };
                    }
                }
                for i in 0..R {
                    if j >= lens[0] && j >= lens[i] {
                        continue;
                    }
                    let p = _mm512_set1_ps(unsafe { *rows[i].add(j) });
                    for u in 0..CHUNK {
                        if u < chunk && v0 + u < vectors {
                            o[i][u] = _mm512_fmadd_ps(p, x[u], o[i][u]);
                        }
                    }
                }
            }
            for i in 0..R {
                let at = (r0 + i) * q_dim + h * head_dim;
                for u in 0..CHUNK {
                    let v = v0 + u;
                    if u < chunk && v < vectors {
                        // SAFETY: the mask keeps the store inside the head's values of this row
                        // of `out`, which only this thread writes (its kv heads' query heads).
                        unsafe {
                            _mm512_mask_storeu_ps(
                                self.out.add(at + v * LANES),
                                mask_of(v),
                                _mm512_mul_ps(o[i][u], inverse[i]),
                            )
                        };
                    }
                }
            }
        }
        R
    }
}

/// Writes `keys` (`[len, kv_dim]`, f32 or bfloat16) transposed into `keys_t` (`[kv_dim,
/// padded]`, f32): each block of 16 positions × 16 channels is 16 row loads, the register
/// transpose of `shared/avx512_transpose.rs` and 16 contiguous stores of one channel's 16
/// positions (zero past `len`). A store per value, to rows `padded` apart, was a third of the
/// const-shaped kernel's time. `attention_prefill/avx512-flash` uses it too.
///
/// # Safety
///
/// The CPU has AVX-512F (and, for bfloat16 keys, BW and VL).
#[target_feature(enable = "avx512f")]
pub unsafe fn transpose_keys<E: KvElement>(keys_t: &mut [f32], keys: &[E], kv_dim: usize, padded: usize) {
    // SAFETY: the caller's contract.
    unsafe { transpose_channels(keys_t, keys, kv_dim, 0..kv_dim, padded) }
}

/// [`transpose_keys`] for the channels `channels` of every position only (one kv head's, say):
/// channel `c` goes to row `c − channels.start` of `keys_t` (`[channels.len(), padded]`).
///
/// # Safety
///
/// As for [`transpose_keys`].
#[target_feature(enable = "avx512f")]
pub unsafe fn transpose_channels<E: KvElement>(
    keys_t: &mut [f32],
    keys: &[E],
    kv_dim: usize,
    channels: Range<usize>,
    padded: usize,
) {
    let len = keys.len() / kv_dim;
    assert!(keys_t.len() >= channels.len() * padded && padded >= len.next_multiple_of(LANES));
    assert!(keys.len() == len * kv_dim && channels.end <= kv_dim);
    for p0 in (0..len).step_by(LANES) {
        let live = (len - p0).min(LANES);
        for c0 in channels.clone().step_by(LANES) {
            let (count, mask) = ((channels.end - c0).min(LANES), lanes(channels.end - c0));
            let mut rows = [_mm512_setzero_ps(); LANES];
            for (i, row) in rows.iter_mut().enumerate().take(live) {
                // SAFETY: position p0 + i < len; the mask keeps the load inside its channels
                // c0.. < channels.end ≤ kv_dim (and the caller's contract, the features).
                *row = unsafe { E::maskz_load(mask, keys.as_ptr().add((p0 + i) * kv_dim + c0)) };
            }
            let columns = transpose(rows);
            for (c, column) in columns.iter().enumerate().take(count) {
                // SAFETY: 16 values of row c0 + c − channels.start < channels.len(), inside it
                // as `padded` is a multiple of 16 above p0 (asserted above).
                unsafe {
                    _mm512_storeu_ps(
                        keys_t.as_mut_ptr().add((c0 + c - channels.start) * padded + p0),
                        *column,
                    )
                };
            }
        }
    }
}

/// One kv head's keys and values as a block of query rows reads them.
#[derive(Clone, Copy)]
struct Head {
    /// The keys, transposed: `[head_dim, padded]`.
    keys_t: *const f32,
    /// The values of position 0; those of position j at `j · stride`.
    values: *const f32,
    stride: usize,
}

/// A mask of the first `n` (≤ 16) lanes.
fn lanes(n: usize) -> __mmask16 {
    if n >= LANES { u16::MAX } else { (1u16 << n) - 1 }
}

/// A prefill as a team shares it: by kv heads, each thread the query heads of its own.
impl<E: KvElement> Job for Flash<E> {
    fn extent(&self) -> Extent {
        Extent { columns: self.n_kv_heads(), granule: 1, work: self.work() }
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract, which `team::run` keeps.
        unsafe { self.kv_heads(cols) }
    }
}
