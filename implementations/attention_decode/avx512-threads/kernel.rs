//! Grouped-query attention of one new position over the KV cache (f32, or bfloat16: `KV`)
//! with AVX-512 on `THREADS` threads: the row-by-row attention of `shared/avx512_decode.rs`
//! (a bfloat16 key or value widened to f32 as it is loaded, by `shared/avx512_kv.rs`), its
//! kv heads cut into
//! `THREADS` shares that the crate's team of `shared/team.rs` computes, the calling thread
//! taking the first. Each thread reads its heads' piece of every cache row, so the cache
//! streams at the read bandwidth of all the threads instead of one.

use super::shared::avx512_decode::Decode;
use super::shared::team;

/// Attends each query head of `q` to every cached position; see `shared/avx512_decode.rs`.
///
/// `q`, `out`: `[N_HEADS · HEAD_DIM]`; `keys`, `values`: `[len, N_KV_HEADS · HEAD_DIM]` of
/// the cache's element type.
/// `scores` is not used: each thread keeps its heads' scores in a buffer of its own.
#[inline]
pub fn attention_decode<const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize>(
    out: &mut [f32],
    q: &[f32],
    keys: &[KV],
    values: &[KV],
    scores: &mut [f32],
) {
    let decode = Decode::new::<N_HEADS, N_KV_HEADS, HEAD_DIM>(out, q, keys, values);
    assert!(scores.len() >= decode.positions(), "attention_decode: scores is shorter than len");
    // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F (and BW and VL
    // for a bfloat16 cache); `Decode::new`
    // checked the slices, which stay borrowed until every share is done, and the team gives
    // each thread its own kv heads.
    unsafe { team::run(decode) }
}
