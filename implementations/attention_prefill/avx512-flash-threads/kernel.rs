//! Causal grouped-query attention for a chunk of new positions over the KV cache (f32, or
//! bfloat16: `KV`) with AVX-512 on `THREADS` threads: the attention of
//! `shared/avx512_flash.rs`, its kv heads (and the query heads that read them) cut into
//! `THREADS` shares that the crate's team of `shared/team.rs` computes, the calling thread
//! taking the first; each thread transposes the keys of its own kv heads (and widens a
//! bfloat16 cache's keys and values to f32 as it does, by `shared/avx512_kv.rs`).

use super::shared::avx512_flash::Flash;
use super::shared::team;

/// Causal attention of the queries of positions `start..start + rows` over the cache; see
/// `shared/avx512_flash.rs`.
///
/// `q`, `out`: `[rows, N_HEADS · HEAD_DIM]`; `keys`, `values`: `[start + rows, N_KV_HEADS ·
/// HEAD_DIM]` of the cache's element type; `scores`: scratch of at least `start + rows` values
/// (unused: the scores stay in registers). Query head h reads kv head `h / (N_HEADS / N_KV_HEADS)`.
#[inline]
pub fn attention_prefill<const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize>(
    out: &mut [f32],
    q: &[f32],
    keys: &[KV],
    values: &[KV],
    scores: &mut [f32],
    start: usize,
    rows: usize,
) {
    assert!(scores.len() >= start + rows, "attention_prefill: scores is shorter than start + rows");
    // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F (and BW and VL
    // for a bfloat16 cache); `prepared`
    // checks the slices, which stay borrowed until every share is done, and the team gives
    // each thread its own kv heads.
    unsafe {
        Flash::prepared(out, q, keys, values, (N_HEADS, N_KV_HEADS, HEAD_DIM), start, rows, |flash| {
            team::run(*flash)
        })
    }
}
