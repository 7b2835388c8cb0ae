//! Causal grouped-query attention for a chunk of new positions, flash-style, with AVX-512F and
//! its shapes at run time, so that the crate's team can share a call by ranges of kv heads.
//!
//! It computes what `attention_prefill/avx512-flash` computes, in the same way: the keys
//! transposed once per call (by the calling thread, into a buffer the team reads), then the
//! query rows of each head, 4 at a time, walk their positions 16 at a time with an online
//! softmax, each row's 16 scores one vector (even and odd dimensions in separate chains). That
//! kernel keeps each row's output in registers, which needs HEAD_DIM as a constant; a team job
//! cannot be generic over the kernel's constants (see `shared/team.rs`), so here the outputs
//! live in a small array and are taken 4 vectors of 16 dimensions at a time: the 4 rows'
//! values of those vectors stay in registers while the block's 16 positions are added in, one
//! load of each value vector for the 4 rows. On one thread it runs 1.15x slower than
//! `avx512-flash` (one layer of stories110M, 128 new positions: 0.49-0.51 against 0.43-0.45
//! ms).
//!
//! The cache may hold f32 (`attention_prefill/avx512-flash-threads`) or bfloat16
//! (`attention_prefill_bf16/avx512-flash-threads`): [`Flash::prepared`] is generic over its
//! [`KvElement`], widening the keys as it transposes them and, from bfloat16, the values into
//! a buffer of the calling thread, so that the loops of [`Flash::kv_heads`] read f32 either way.
//! Widening each value as the loop loads it instead, once per block of query rows, made the
//! prefill of 896 positions at stories110M's shapes 13% slower than over an f32 cache.
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

/// The f32 lanes of an AVX-512 register.
const LANES: usize = 16;

/// Vectors of one head's output: HEAD_DIM up to 256.
pub const MAX_VECTORS: usize = 16;

/// Query rows that share each load of keys and values.
const ROWS: usize = 4;

/// Vectors of the output that a block of values updates at once, in registers.
const CHUNK: usize = 4;

thread_local! {
    /// The transposed keys of the calling thread's current call.
    static KEYS_T: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The values of the calling thread's current call, widened to f32 when the cache holds
    /// bfloat16 (each is read once per query row block; widening each once is cheaper).
    static VALUES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// One call's operands and shapes.
#[derive(Clone, Copy)]
pub struct Flash {
    out: *mut f32,
    q: *const f32,
    /// The values as f32: the cache's own, or their widened copy.
    values: *const f32,
    /// The keys transposed, `[kv_dim, padded]`, once `prepared` has written them.
    keys_t: *const f32,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    start: usize,
    rows: usize,
    padded: usize,
}

// SAFETY: a call is only pointers to buffers that its caller keeps alive and shares out by
// disjoint ranges of kv heads until every thread is done (see the module's safety section).
unsafe impl Send for Flash {}
unsafe impl Sync for Flash {}

impl Flash {
    /// Checks the slices' lengths, transposes the keys into this thread's buffer (and, from a
    /// bfloat16 cache, widens the values into another; both alive until `f` returns) and runs
    /// `f` on the call.
    ///
    /// `q`, `out`: `[rows, n_heads · head_dim]`; `keys`, `values`: `[start + rows, n_kv_heads ·
    /// head_dim]`.
    ///
    /// # Safety
    ///
    /// Only on a CPU with AVX-512F (and, over a bfloat16 cache, BW and VL).
    pub unsafe fn prepared<E: KvElement, T>(
        out: &mut [f32],
        q: &[f32],
        keys: &[E],
        values: &[E],
        (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
        start: usize,
        rows: usize,
        f: impl FnOnce(&Flash) -> T,
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
        let padded = len.next_multiple_of(LANES);
        KEYS_T.with_borrow_mut(|keys_t| {
            // `transpose_keys` writes all of it (zeros past `len`): only growth is zero-filled.
            keys_t.resize(kv_dim * padded, 0.0);
            // SAFETY: the caller's contract; `keys` holds `len` positions and `keys_t` `kv_dim ·
            // padded` values (checked above).
            unsafe { transpose_keys(keys_t, &keys[..len * kv_dim], kv_dim, padded) };
            VALUES.with_borrow_mut(|buffer| {
                // SAFETY: the caller's contract.
                let values = unsafe { E::as_f32(&values[..len * kv_dim], buffer) };
                f(&Flash {
                    out: out.as_mut_ptr(),
                    q: q.as_ptr(),
                    values: values.as_ptr(),
                    keys_t: keys_t.as_ptr(),
                    n_heads,
                    n_kv_heads,
                    head_dim,
                    start,
                    rows,
                    padded,
                })
            })
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
        let group = self.n_heads / self.n_kv_heads;
        for h in kv_heads.start * group..kv_heads.end * group {
            let mut r = 0;
            while r < self.rows {
                // SAFETY: head `h` and the rows are in range (checked by `prepared`).
                r += unsafe {
                    match self.rows - r {
                        1 => self.block::<1>(h, r),
                        2 => self.block::<2>(h, r),
                        3 => self.block::<3>(h, r),
                        _ => self.block::<ROWS>(h, r),
                    }
                };
            }
        }
    }

    /// Rows `r0..r0 + R` of query head `h` (positions `start + r0..`), each over the positions
    /// up to its own. Returns R.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn block<const R: usize>(&self, h: usize, r0: usize) -> usize {
        let (head_dim, padded) = (self.head_dim, self.padded);
        let (q_dim, kv_dim) = (self.n_heads * head_dim, self.n_kv_heads * head_dim);
        let kv_head = h / (self.n_heads / self.n_kv_heads);
        let vectors = head_dim.div_ceil(LANES);
        let last_mask = lanes(head_dim - (vectors - 1) * LANES);
        let mask_of = |v: usize| if v + 1 == vectors { last_mask } else { u16::MAX };
        // Row i attends to positions 0..lens[i]; the last row to the most.
        let lens: [usize; R] = std::array::from_fn(|i| self.start + r0 + i + 1);
        let end = lens[R - 1];
        // SAFETY (every pointer below): `prepared` checked that q holds the rows' heads, that
        // the cache holds `end` positions and wrote `padded` ≥ end positions of every channel
        // of the transposed keys.
        let queries: [*const f32; R] =
            std::array::from_fn(|i| unsafe { self.q.add((r0 + i) * q_dim + h * head_dim) });
        let keys_t = unsafe { self.keys_t.add(kv_head * head_dim * padded) };
        let scale = _mm512_set1_ps(1.0 / (head_dim as f32).sqrt());
        let mut acc = [[_mm512_setzero_ps(); MAX_VECTORS]; R];
        // Each row's running maximum, and its running sum as 16 lanes reduced once at the end.
        let (mut max, mut sum) = ([f32::NEG_INFINITY; R], [_mm512_setzero_ps(); R]);
        // Whether a row met a NaN or +∞ score: its output is then NaN, as in the reference.
        let mut not_finite: [__mmask16; R] = [0; R];
        let mut j0 = 0;
        while j0 < end {
            // 1. Scores of positions j0..j0 + 16 for every row, even and odd d apart.
            let (mut even, mut odd) = ([_mm512_setzero_ps(); R], [_mm512_setzero_ps(); R]);
            for d in (0..head_dim - head_dim % 2).step_by(2) {
                let (k0, k1) = unsafe {
                    let at = keys_t.add(d * padded + j0);
                    (_mm512_loadu_ps(at), _mm512_loadu_ps(at.add(padded)))
                };
                for i in 0..R {
                    even[i] = _mm512_fmadd_ps(_mm512_set1_ps(unsafe { *queries[i].add(d) }), k0, even[i]);
                    odd[i] = _mm512_fmadd_ps(_mm512_set1_ps(unsafe { *queries[i].add(d + 1) }), k1, odd[i]);
                }
            }
            if head_dim % 2 == 1 {
                let d = head_dim - 1;
                let k = unsafe { _mm512_loadu_ps(keys_t.add(d * padded + j0)) };
                for i in 0..R {
                    even[i] = _mm512_fmadd_ps(_mm512_set1_ps(unsafe { *queries[i].add(d) }), k, even[i]);
                }
            }
            // 2. The online softmax of each row: the block's weights (zero past the row's own
            //    position), with the row's sum and output rescaled when its maximum grows.
            let mut w = [[0.0f32; LANES]; R];
            for i in 0..R {
                if j0 >= lens[i] {
                    continue;
                }
                let live = lanes(lens[i] - j0);
                let dots = _mm512_add_ps(even[i], odd[i]);
                let s =
                    _mm512_mask_mov_ps(_mm512_set1_ps(f32::NEG_INFINITY), live, _mm512_mul_ps(dots, scale));
                not_finite[i] |= _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(s, _mm512_set1_ps(f32::INFINITY));
                if _mm512_cmp_ps_mask::<_CMP_GT_OQ>(s, _mm512_set1_ps(max[i])) != 0 {
                    let new_max = _mm512_reduce_max_ps(s);
                    let c = _mm512_set1_ps((max[i] - new_max).exp());
                    sum[i] = _mm512_mul_ps(sum[i], c);
                    for v in 0..vectors {
                        acc[i][v] = _mm512_mul_ps(acc[i][v], c);
                    }
                    max[i] = new_max;
                }
                let weights = _mm512_maskz_mov_ps(live, exp(_mm512_sub_ps(s, _mm512_set1_ps(max[i]))));
                sum[i] = _mm512_add_ps(sum[i], weights);
                // SAFETY: `w[i]` holds 16 floats.
                unsafe { _mm512_storeu_ps(w[i].as_mut_ptr(), weights) };
            }
            // 3. The block's values, 4 vectors of dimensions at a time: the rows' outputs of
            //    those vectors stay in registers over the block's positions, and each value
            //    vector loaded serves the 4 rows.
            let positions = (end - j0).min(LANES);
            // Past its own position a row takes no value, not even with weight 0: 0 times an
            // infinite or NaN value would be NaN where the reference never reads that value.
            let all_live = j0 + positions <= lens[0];
            for v0 in (0..vectors).step_by(CHUNK) {
                let mut o = [[_mm512_setzero_ps(); CHUNK]; R];
                for i in 0..R {
                    for u in 0..CHUNK {
                        if v0 + u < vectors {
                            o[i][u] = acc[i][v0 + u];
                        }
                    }
                }
                for jj in 0..positions {
                    // SAFETY: position j0 + jj < end, and the masks keep the loads inside its
                    // kv head.
                    let value =
                        unsafe { self.values.add((j0 + jj) * kv_dim + kv_head * head_dim + v0 * LANES) };
                    let mut x = [_mm512_setzero_ps(); CHUNK];
                    for u in 0..CHUNK {
                        if v0 + u < vectors {
                            x[u] = unsafe { _mm512_maskz_loadu_ps(mask_of(v0 + u), value.add(u * LANES)) };
                        }
                    }
                    for i in 0..R {
                        if !all_live && j0 + jj >= lens[i] {
                            continue;
                        }
                        let p = _mm512_set1_ps(w[i][jj]);
                        for u in 0..CHUNK {
                            if v0 + u < vectors {
                                o[i][u] = _mm512_fmadd_ps(p, x[u], o[i][u]);
                            }
                        }
                    }
                }
                for i in 0..R {
                    for u in 0..CHUNK {
                        if v0 + u < vectors {
                            acc[i][v0 + u] = o[i][u];
                        }
                    }
                }
            }
            j0 += LANES;
        }
        for i in 0..R {
            let nan = not_finite[i] != 0 || max[i] == f32::NEG_INFINITY;
            let inverse = _mm512_set1_ps(if nan { f32::NAN } else { 1.0 / _mm512_reduce_add_ps(sum[i]) });
            let at = (r0 + i) * q_dim + h * head_dim;
            for v in 0..vectors {
                let o = _mm512_mul_ps(acc[i][v], inverse);
                // SAFETY: the mask keeps the store inside the head's values of this row of
                // `out`, which only this thread writes (its kv heads' query heads).
                unsafe { _mm512_mask_storeu_ps(self.out.add(at + v * LANES), mask_of(v), o) };
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
    let len = keys.len() / kv_dim;
    assert!(keys_t.len() >= kv_dim * padded && padded >= len.next_multiple_of(LANES));
    assert!(keys.len() == len * kv_dim);
    for p0 in (0..len).step_by(LANES) {
        let live = (len - p0).min(LANES);
        for c0 in (0..kv_dim).step_by(LANES) {
            let (channels, mask) = ((kv_dim - c0).min(LANES), lanes(kv_dim - c0));
            let mut rows = [_mm512_setzero_ps(); LANES];
            for (i, row) in rows.iter_mut().enumerate().take(live) {
                // SAFETY: position p0 + i < len; the mask keeps the load inside its channels
                // c0.. < kv_dim (and the caller's contract, the features).
                *row = unsafe { E::maskz_load(mask, keys.as_ptr().add((p0 + i) * kv_dim + c0)) };
            }
            let columns = transpose(rows);
            for (c, column) in columns.iter().enumerate().take(channels) {
                // SAFETY: 16 values of row c0 + c < kv_dim, inside it as `padded` is a multiple
                // of 16 above p0 (asserted above).
                unsafe { _mm512_storeu_ps(keys_t.as_mut_ptr().add((c0 + c) * padded + p0), *column) };
            }
        }
    }
}

/// A mask of the first `n` (≤ 16) lanes.
fn lanes(n: usize) -> __mmask16 {
    if n >= LANES { u16::MAX } else { (1u16 << n) - 1 }
}
