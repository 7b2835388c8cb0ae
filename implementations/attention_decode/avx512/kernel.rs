//! Grouped-query attention of one new position over the KV cache with AVX-512F, reading the
//! cache row by row.
//!
//! A cache row holds one position's keys (or values) of every kv head side by side. Walking
//! one head at a time, as the AVX2 kernel does, reads a short piece of every row once per
//! head, a strided pattern that the hardware prefetchers follow poorly. Here every row is
//! read once, in order, for all heads:
//! 1. scores: for each position, each query head's dot product with its kv head's key
//!    (HEAD_DIM / 16 fused multiply-adds and a horizontal sum), scaled by 1/√HEAD_DIM, into
//!    a buffer of the calling thread holding `[N_HEADS, len]` scores;
//! 2. softmax: per head, the maximum, the numerators `exp(score − max)` with the shared
//!    AVX-512 exp, 16 at a time, and their sum (a head with a NaN or +∞ score gets NaN
//!    outputs, as in the reference);
//! 3. output: the value rows, four positions at a time, each head's 16-lane pieces of the
//!    output gaining the four weighted values with fused multiply-adds (the output, N_HEADS ·
//!    HEAD_DIM values, stays in the L1 cache), then each head is divided by its sum.
//!
//! Any HEAD_DIM works: the last vector of a head is masked when 16 does not divide it.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::shared::avx512_math::exp;

/// f32 lanes of an AVX-512 register.
const LANES: usize = 16;

thread_local! {
    /// The calling thread's scores, `[N_HEADS, len]`.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Attends each query head of `q` to every cached position; see the module documentation.
///
/// `q`, `out`: `[N_HEADS · HEAD_DIM]`; `keys`, `values`: `[len, N_KV_HEADS · HEAD_DIM]`.
/// `scores` is not used: the scores of all heads live in a buffer of the calling thread.
#[inline]
pub fn attention_decode<const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize>(
    out: &mut [f32],
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut [f32],
) {
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
    assert!(scores.len() >= len, "attention_decode: scores is shorter than len");
    SCORES.with_borrow_mut(|buffer| {
        if buffer.len() < N_HEADS * len {
            buffer.resize(N_HEADS * len, 0.0);
        }
        // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F.
        unsafe {
            decode_avx512::<N_HEADS, N_KV_HEADS, HEAD_DIM>(
                &mut out[..q_dim],
                &q[..q_dim],
                keys,
                values,
                &mut buffer[..N_HEADS * len],
            )
        }
    });
}

#[target_feature(enable = "avx512f")]
fn decode_avx512<const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize>(
    out: &mut [f32],
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut [f32],
) {
    let kv_dim = N_KV_HEADS * HEAD_DIM;
    let group = N_HEADS / N_KV_HEADS;
    let len = scores.len() / N_HEADS;
    // What the raw-pointer accesses below rely on.
    assert!(len > 0 && scores.len() == N_HEADS * len && keys.len() == len * kv_dim && values.len() == keys.len());
    assert!(q.len() == N_HEADS * HEAD_DIM && out.len() == N_HEADS * HEAD_DIM);
    let vectors = HEAD_DIM.div_ceil(LANES);
    let last = span_mask(HEAD_DIM - (vectors - 1) * LANES);
    let mask = |v: usize| if v + 1 == vectors { last } else { u16::MAX };
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();

    // 1. Scores, one key row at a time: scores[h · len + position].
    for (position, row) in keys.chunks_exact(kv_dim).enumerate() {
        for h in 0..N_HEADS {
            let key = &row[(h / group) * HEAD_DIM..][..HEAD_DIM];
            let query = &q[h * HEAD_DIM..][..HEAD_DIM];
            let mut dot = _mm512_setzero_ps();
            for v in 0..vectors {
                // SAFETY: the mask keeps the loads inside the head's HEAD_DIM values.
                unsafe {
                    let k = _mm512_maskz_loadu_ps(mask(v), key.as_ptr().add(v * LANES));
                    let x = _mm512_maskz_loadu_ps(mask(v), query.as_ptr().add(v * LANES));
                    dot = _mm512_fmadd_ps(k, x, dot);
                }
            }
            scores[h * len + position] = _mm512_reduce_add_ps(dot) * scale;
        }
    }

    // 2. Softmax numerators per head, in place, and the reciprocal of their sum.
    let mut inverse_sums = [0.0f32; N_HEADS];
    for (h, head) in scores.chunks_exact_mut(len).enumerate() {
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
            inverse_sums[h] = f32::NAN;
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
        inverse_sums[h] = 1.0 / _mm512_reduce_add_ps(sum);
    }

    // 3. The weighted values, four value rows at a time.
    out.fill(0.0);
    let scores = &*scores;
    let quads = values.chunks_exact(4 * kv_dim);
    let rest = quads.remainder();
    for (quad, rows) in quads.enumerate() {
        let position = 4 * quad;
        for h in 0..N_HEADS {
            let p = &scores[h * len + position..][..4];
            let weights = [_mm512_set1_ps(p[0]), _mm512_set1_ps(p[1]), _mm512_set1_ps(p[2]), _mm512_set1_ps(p[3])];
            let offset = (h / group) * HEAD_DIM;
            for v in 0..vectors {
                let at = v * LANES;
                // SAFETY: the mask keeps every access inside head h's HEAD_DIM values of its
                // row of `out` and of the four value rows.
                unsafe {
                    let o = out.as_mut_ptr().add(h * HEAD_DIM + at);
                    let mut acc = _mm512_maskz_loadu_ps(mask(v), o);
                    for (u, w) in weights.iter().enumerate() {
                        let value = rows.as_ptr().add(u * kv_dim + offset + at);
                        acc = _mm512_fmadd_ps(*w, _mm512_maskz_loadu_ps(mask(v), value), acc);
                    }
                    _mm512_mask_storeu_ps(o, mask(v), acc);
                }
            }
        }
    }
    let first = len - rest.len() / kv_dim;
    for (i, row) in rest.chunks_exact(kv_dim).enumerate() {
        for h in 0..N_HEADS {
            let w = _mm512_set1_ps(scores[h * len + first + i]);
            let offset = (h / group) * HEAD_DIM;
            for v in 0..vectors {
                let at = v * LANES;
                // SAFETY: as above, for one value row.
                unsafe {
                    let o = out.as_mut_ptr().add(h * HEAD_DIM + at);
                    let value = _mm512_maskz_loadu_ps(mask(v), row.as_ptr().add(offset + at));
                    let acc = _mm512_fmadd_ps(w, value, _mm512_maskz_loadu_ps(mask(v), o));
                    _mm512_mask_storeu_ps(o, mask(v), acc);
                }
            }
        }
    }
    for (head, &inverse) in out.chunks_exact_mut(HEAD_DIM).zip(&inverse_sums) {
        for x in head {
            *x *= inverse;
        }
    }
}

/// The mask of the first `remaining` lanes, all 16 when at least 16 remain.
#[inline]
fn span_mask(remaining: usize) -> __mmask16 {
    if remaining >= LANES { u16::MAX } else { (1u16 << remaining) - 1 }
}
