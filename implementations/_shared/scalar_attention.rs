//! Attention of one query head over cached positions in plain scalar code: the definition
//! that the reference prefill and decode kernels run for every (row, head) pair ([`decode`],
//! [`prefill`]; the kernels of `attention_decode` and `attention_decode<bf16>` call them over
//! their cache's element type, as those of the prefill interfaces do).
//!
//! As Hugging Face's eager LLaMA attention computes it in f32: scores `q · k / √HEAD_DIM`
//! (each dot product accumulated in order), a softmax that subtracts the maximum score and
//! divides every `exp` by their sum, and the sum of the values weighted by those
//! probabilities, accumulated position by position. The cache holds f32 (`kv_cache`) or
//! bfloat16 values (`kv_cache<bf16>`), each widened exactly to f32 as it is read.

/// A value of a KV cache: `f32`, or `u16` holding a bfloat16 (the high 16 bits of an f32).
pub trait KvElement: Copy {
    fn to_f32(self) -> f32;
}

impl KvElement for f32 {
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
}

impl KvElement for u16 {
    #[inline]
    fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self) << 16)
    }
}

/// Attends the query head `q` (`HEAD_DIM` values) to the first `scores.len()` positions of
/// kv head `kv_head` in `keys` and `values` (`[positions, N_KV_HEADS · HEAD_DIM]`), writing
/// the `HEAD_DIM` outputs to `out`. `scores` is scratch space, one value per position.
#[inline]
pub fn attend<const N_KV_HEADS: usize, const HEAD_DIM: usize>(
    out: &mut [f32],
    q: &[f32],
    keys: &[impl KvElement],
    values: &[impl KvElement],
    scores: &mut [f32],
    kv_head: usize,
) {
    let kv_dim = N_KV_HEADS * HEAD_DIM;
    let q = &q[..HEAD_DIM];
    let out = &mut out[..HEAD_DIM];
    let offset = kv_head * HEAD_DIM;
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();

    for (j, score) in scores.iter_mut().enumerate() {
        let key = &keys[j * kv_dim + offset..][..HEAD_DIM];
        let mut dot = 0.0f32;
        for (a, b) in q.iter().zip(key) {
            dot += a * b.to_f32();
        }
        *score = dot * scale;
    }

    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for score in scores.iter_mut() {
        *score = (*score - max).exp();
        sum += *score;
    }

    out.fill(0.0);
    for (j, &e) in scores.iter().enumerate() {
        let p = e / sum;
        let value = &values[j * kv_dim + offset..][..HEAD_DIM];
        for (o, v) in out.iter_mut().zip(value) {
            *o += p * v.to_f32();
        }
    }
}

/// The reference decode attention over a cache of f32 or bfloat16; see `attention_decode/scalar`.
#[inline]
pub fn decode<const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize>(
    out: &mut [f32],
    q: &[f32],
    keys: &[impl KvElement],
    values: &[impl KvElement],
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
    let group = N_HEADS / N_KV_HEADS;
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
    for h in 0..N_HEADS {
        let at = h * HEAD_DIM;
        attend::<N_KV_HEADS, HEAD_DIM>(&mut out[at..], &q[at..], keys, values, &mut scores[..len], h / group);
    }
}

/// The reference causal prefill attention over a cache of f32 or bfloat16; see `attention_prefill/scalar`.
#[inline]
pub fn prefill<const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize>(
    out: &mut [f32],
    q: &[f32],
    keys: &[impl KvElement],
    values: &[impl KvElement],
    scores: &mut [f32],
    start: usize,
    rows: usize,
) {
    const {
        assert!(
            N_KV_HEADS > 0 && N_HEADS.is_multiple_of(N_KV_HEADS),
            "N_HEADS must be a multiple of N_KV_HEADS"
        )
    };
    let q_dim = N_HEADS * HEAD_DIM;
    let kv_dim = N_KV_HEADS * HEAD_DIM;
    let group = N_HEADS / N_KV_HEADS;
    assert!(q.len() >= rows * q_dim, "attention_prefill: q is shorter than {rows} rows");
    assert!(out.len() >= rows * q_dim, "attention_prefill: out is shorter than {rows} rows");
    assert!(
        keys.len() >= (start + rows) * kv_dim,
        "attention_prefill: keys hold fewer than start + rows positions"
    );
    assert!(
        values.len() >= (start + rows) * kv_dim,
        "attention_prefill: values hold fewer than start + rows positions"
    );
    assert!(scores.len() >= start + rows, "attention_prefill: scores is shorter than start + rows");
    for r in 0..rows {
        let len = start + r + 1;
        for h in 0..N_HEADS {
            let at = r * q_dim + h * HEAD_DIM;
            attend::<N_KV_HEADS, HEAD_DIM>(
                &mut out[at..],
                &q[at..],
                keys,
                values,
                &mut scores[..len],
                h / group,
            );
        }
    }
}
