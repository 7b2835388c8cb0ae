//! Grouped-query attention of one new position over the KV cache (f32, or bfloat16: `KV`), with
//! AVX2 and FMA on `THREADS` threads: for CPUs without AVX-512 (x86-64-v3). The attention of
//! `shared/avx2_team_attention.rs` (a bfloat16 key or value widened to f32 as it is loaded), its
//! positions cut into `THREADS` chunks that the crate's team of `shared/team.rs` computes, the
//! calling thread taking the first, so that every thread streams one contiguous piece of the cache,
//! whole rows of it; the calling thread then merges the chunks' softmax parts (`Decode`).

use super::shared::avx2_team_attention::Decode;
use super::shared::team;

/// Attention of the query `q` of the newest position over all `len` cached positions.
///
/// `q`, `out`: `[N_HEADS · HEAD_DIM]`; `keys`, `values`: `[len, N_KV_HEADS · HEAD_DIM]` of the
/// cache's element type. `scores` is not used: each thread keeps its chunk's scores in a buffer of
/// its own. Query head h reads kv head `h / (N_HEADS / N_KV_HEADS)`.
#[inline]
pub fn attention_decode<const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize>(
    out: &mut [f32],
    q: &[f32],
    keys: &[KV],
    values: &[KV],
    scores: &mut [f32],
) {
    let kv_dim = N_KV_HEADS * HEAD_DIM;
    let len = keys.len() / kv_dim.max(1);
    assert!(
        len > 0 && keys.len() == len * kv_dim,
        "attention_decode: keys must hold whole positions, at least one"
    );
    assert!(values.len() == keys.len(), "attention_decode: values and keys differ in length");
    assert!(scores.len() >= len, "attention_decode: scores is shorter than len");
    // SAFETY: the generated crate checks at start-up that the CPU has AVX2 and FMA;
    // `Decode::attend` checks the slices, which stay borrowed until every chunk is done, and
    // `team::run` computes each chunk once, on one thread, before it returns.
    unsafe {
        Decode::attend::<N_HEADS, N_KV_HEADS, HEAD_DIM>(out, q, keys, values, crate::THREADS, |decode| {
            team::run(decode)
        })
    }
}
