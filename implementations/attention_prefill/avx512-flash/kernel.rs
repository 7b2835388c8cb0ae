//! Causal grouped-query attention for a chunk of `rows` new positions, flash-style, with
//! AVX-512F.
//!
//! The keys are first transposed, once per call, into a buffer of the calling thread
//! (`[N_KV_HEADS · HEAD_DIM, positions padded to 16]`), so that one vector holds one value of
//! 16 consecutive keys. Then the query rows of each head, up to 4 at a time (as many as keep
//! their outputs in registers), walk the positions they attend to, 16 at a time, with an
//! online softmax:
//! 1. each row's 16 scores are one vector: HEAD_DIM fused multiply-adds of a broadcast query
//!    value and a row of the transposed keys, which every row of the block shares (so the
//!    rows' chains hide each other's latency), scaled by 1/√HEAD_DIM; positions past the
//!    row's own are masked off;
//! 2. when the block raises a row's running maximum, its running sum and output are rescaled
//!    by exp(old − new), and the block's weights are exp(score − maximum) (a vectorised exp);
//!    one compare tells whether any score rose above the maximum, and the sum is kept in 16
//!    lanes, so the common block needs no horizontal reduction (a row that meets a NaN or +∞
//!    score gets NaN outputs, as in the reference);
//! 3. each value of the block is loaded once and added to every row's output with the row's
//!    weight, the outputs staying in registers (HEAD_DIM / 16 vectors a row).
//!
//! No score leaves the registers, so `scores` is not used, and each output row is written
//! once, divided by the sum. Any HEAD_DIM up to 256 works (the last vector of a head is
//! masked when 16 does not divide it).

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::shared::avx512_flash::transpose_keys;
use super::shared::avx512_math::exp;

/// f32 lanes of an AVX-512 register.
const LANES: usize = 16;

/// Vectors of one head's output that a row keeps in registers: HEAD_DIM up to 256.
const MAX_VECTORS: usize = 16;

thread_local! {
    /// The transposed keys of the calling thread's current call.
    static KEYS_T: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Causal attention of the queries of positions `start..start + rows` over the cache.
///
/// `q`, `out`: `[rows, N_HEADS · HEAD_DIM]`; `keys`, `values`: `[start + rows,
/// N_KV_HEADS · HEAD_DIM]`; `scores`: scratch of at least `start + rows` values (unused: the
/// scores stay in registers). Query head h reads kv head `h / (N_HEADS / N_KV_HEADS)`.
#[inline]
pub fn attention_prefill<const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize>(
    out: &mut [f32],
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut [f32],
    start: usize,
    rows: usize,
) {
    const {
        assert!(
            N_KV_HEADS > 0 && N_HEADS.is_multiple_of(N_KV_HEADS),
            "N_HEADS must be a multiple of N_KV_HEADS"
        );
        assert!(HEAD_DIM > 0 && HEAD_DIM <= MAX_VECTORS * LANES, "HEAD_DIM must be 1..=256");
    };
    let (q_dim, kv_dim) = (N_HEADS * HEAD_DIM, N_KV_HEADS * HEAD_DIM);
    let len = start + rows;
    assert!(q.len() >= rows * q_dim, "attention_prefill: q is shorter than {rows} rows");
    assert!(out.len() >= rows * q_dim, "attention_prefill: out is shorter than {rows} rows");
    assert!(keys.len() >= len * kv_dim, "attention_prefill: keys hold fewer than start + rows positions");
    assert!(values.len() >= len * kv_dim, "attention_prefill: values hold fewer than start + rows positions");
    assert!(scores.len() >= len, "attention_prefill: scores is shorter than start + rows");
    let group = N_HEADS / N_KV_HEADS;
    let padded = len.next_multiple_of(LANES);
    KEYS_T.with_borrow_mut(|keys_t| {
        // `transpose_keys` writes all of it (zeros past `len`): only growth is zero-filled.
        keys_t.resize(kv_dim * padded, 0.0);
        // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F; `keys`
        // holds `len` positions and `keys_t` `kv_dim · padded` values (checked above).
        unsafe { transpose_keys(keys_t, &keys[..len * kv_dim], kv_dim, padded) };
        // Rows of one head go R at a time (as many as keep their outputs in registers), so
        // that each row of transposed keys loaded serves R independent chains.
        let vectors = HEAD_DIM.div_ceil(LANES);
        for h in 0..N_HEADS {
            let kv_head = h / group;
            let keys_t = &keys_t[kv_head * HEAD_DIM * padded..(kv_head + 1) * HEAD_DIM * padded];
            let values = &values[..len * kv_dim];
            let mut r = 0;
            while r < rows {
                let left = rows - r;
                // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F;
                // the slices hold what `block` reads (checked above).
                r += unsafe {
                    if vectors <= 4 && left >= 4 {
                        block::<N_HEADS, N_KV_HEADS, HEAD_DIM, 4>(out, q, keys_t, values, h, start, r, padded)
                    } else if vectors <= 8 && left >= 2 {
                        block::<N_HEADS, N_KV_HEADS, HEAD_DIM, 2>(out, q, keys_t, values, h, start, r, padded)
                    } else {
                        block::<N_HEADS, N_KV_HEADS, HEAD_DIM, 1>(out, q, keys_t, values, h, start, r, padded)
                    }
                };
            }
        }
    });
}

/// Rows `r0..r0 + R` of query head `h` (positions `start + r0..`), each over the positions up
/// to its own: `keys_t` holds the head's kv head's keys transposed (`[HEAD_DIM, padded]`),
/// `values` the cache (`[start + r0 + R or more, N_KV_HEADS · HEAD_DIM]`). Returns R.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f")]
fn block<const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize, const R: usize>(
    out: &mut [f32],
    q: &[f32],
    keys_t: &[f32],
    values: &[f32],
    h: usize,
    start: usize,
    r0: usize,
    padded: usize,
) -> usize {
    let (q_dim, kv_dim) = (N_HEADS * HEAD_DIM, N_KV_HEADS * HEAD_DIM);
    let kv_head = h / (N_HEADS / N_KV_HEADS);
    let vectors = HEAD_DIM.div_ceil(LANES);
    let last_mask = lanes(HEAD_DIM - (vectors - 1) * LANES);
    let mask_of = |v: usize| if v + 1 == vectors { last_mask } else { u16::MAX };
    // Row i attends to positions 0..lens[i]; the last row to the most.
    let lens: [usize; R] = std::array::from_fn(|i| start + r0 + i + 1);
    let end = lens[R - 1];
    assert!(keys_t.len() >= HEAD_DIM * padded && padded >= end.next_multiple_of(LANES));
    assert!(values.len() >= end * kv_dim);
    assert!(q.len() >= (r0 + R) * q_dim && out.len() >= (r0 + R) * q_dim);
    // Arrays of HEAD_DIM values, so that `queries[i][d]` for d < HEAD_DIM needs no check.
    let queries: [&[f32; HEAD_DIM]; R] = std::array::from_fn(|i| {
        q[(r0 + i) * q_dim + h * HEAD_DIM..][..HEAD_DIM].try_into().expect("a slice of HEAD_DIM values")
    });
    let scale = _mm512_set1_ps(1.0 / (HEAD_DIM as f32).sqrt());
    let mut acc = [[_mm512_setzero_ps(); MAX_VECTORS]; R];
    // Each row's running maximum, and its running sum as 16 lanes reduced once at the end.
    let (mut max, mut sum) = ([f32::NEG_INFINITY; R], [_mm512_setzero_ps(); R]);
    // Whether a row met a NaN or +∞ score: the reference's softmax is then NaN, and so is the
    // row's output (the vectorised exp would turn NaN into a tiny number).
    let mut not_finite: [__mmask16; R] = [0; R];
    let mut j0 = 0;
    while j0 < end {
        // 1. Scores of positions j0..j0 + 16 for every row: one load of transposed keys feeds
        //    R rows, each row summing even and odd d apart, so that 2R chains of fused
        //    multiply-adds hide each other's latency.
        let (mut even, mut odd) = ([_mm512_setzero_ps(); R], [_mm512_setzero_ps(); R]);
        for d in (0..HEAD_DIM - HEAD_DIM % 2).step_by(2) {
            // SAFETY: rows d and d + 1 of the transposed keys hold `padded` ≥ j0 + 16 values.
            let (k0, k1) = unsafe {
                let at = keys_t.as_ptr().add(d * padded + j0);
                (_mm512_loadu_ps(at), _mm512_loadu_ps(at.add(padded)))
            };
            for i in 0..R {
                even[i] = _mm512_fmadd_ps(_mm512_set1_ps(queries[i][d]), k0, even[i]);
                odd[i] = _mm512_fmadd_ps(_mm512_set1_ps(queries[i][d + 1]), k1, odd[i]);
            }
        }
        if HEAD_DIM % 2 == 1 {
            let d = HEAD_DIM - 1;
            // SAFETY: as above, for the last row of the transposed keys.
            let k = unsafe { _mm512_loadu_ps(keys_t.as_ptr().add(d * padded + j0)) };
            for i in 0..R {
                even[i] = _mm512_fmadd_ps(_mm512_set1_ps(queries[i][d]), k, even[i]);
            }
        }
        let mut dots = even;
        for i in 0..R {
            dots[i] = _mm512_add_ps(even[i], odd[i]);
        }
        // 2. The online softmax of each row: the block's weights (zero past the row's own
        //    position), with the row's sum and output rescaled when its maximum grows.
        let mut w = [[0.0f32; LANES]; R];
        for i in 0..R {
            if j0 >= lens[i] {
                continue;
            }
            let live = lanes(lens[i] - j0);
            let s =
                _mm512_mask_mov_ps(_mm512_set1_ps(f32::NEG_INFINITY), live, _mm512_mul_ps(dots[i], scale));
            not_finite[i] |= _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(s, _mm512_set1_ps(f32::INFINITY));
            // Only a score above the running maximum (one compare; masked lanes hold −∞)
            // needs the block's maximum and a rescale.
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

        // 3. The block's values, each loaded once and added to every row's output with the
        //    row's weight.
        // Past its own position a row takes no value, not even with weight 0: 0 times an
        // infinite or NaN value would be NaN where the reference never reads that value.
        let all_live = j0 + LANES <= lens[0];
        for jj in 0..(end - j0).min(LANES) {
            // SAFETY: position j0 + jj < end, and its kv head lies inside its row.
            let value = unsafe { values.as_ptr().add((j0 + jj) * kv_dim + kv_head * HEAD_DIM) };
            let mut x = [_mm512_setzero_ps(); MAX_VECTORS];
            for v in 0..vectors {
                // SAFETY: the mask keeps the load inside the head.
                x[v] = unsafe { _mm512_maskz_loadu_ps(mask_of(v), value.add(v * LANES)) };
            }
            for i in 0..R {
                if !all_live && j0 + jj >= lens[i] {
                    continue;
                }
                let p = _mm512_set1_ps(w[i][jj]);
                for v in 0..vectors {
                    acc[i][v] = _mm512_fmadd_ps(p, x[v], acc[i][v]);
                }
            }
        }
        j0 += LANES;
    }
    for i in 0..R {
        let nan = not_finite[i] != 0 || max[i] == f32::NEG_INFINITY;
        let inverse = _mm512_set1_ps(if nan { f32::NAN } else { 1.0 / _mm512_reduce_add_ps(sum[i]) });
        let at = (r0 + i) * q_dim + h * HEAD_DIM;
        for v in 0..vectors {
            let o = _mm512_mul_ps(acc[i][v], inverse);
            // SAFETY: the mask keeps the store inside the head's HEAD_DIM values of `out`.
            unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr().add(at + v * LANES), mask_of(v), o) };
        }
    }
    R
}

/// A mask of the first `n` (≤ 16) lanes.
fn lanes(n: usize) -> __mmask16 {
    if n >= LANES { u16::MAX } else { (1u16 << n) - 1 }
}
