//! Causal grouped-query attention of a chunk of new positions over the KV cache (f32, or
//! bfloat16: `KV`), with AVX2 and FMA on `THREADS` threads: for CPUs without AVX-512
//! (x86-64-v3). The attention of `shared/avx2_team_attention.rs` for the rows of the chunk in
//! blocks (row r over positions `0..=start + r`, a bfloat16 key or value widened to f32 as it
//! is loaded), its kv heads cut into `THREADS` shares that the crate's team of
//! `shared/team.rs` computes, the calling thread taking the first. Unlike `avx2-fma`, which
//! runs on the calling thread while the team's workers wait for the next product, every
//! thread attends its own heads.

use super::shared::avx2_team_attention::Attention;
use super::shared::team;

/// Causal attention of the `rows` queries of `q` (positions `start..start + rows`) over the
/// cache.
///
/// `q`, `out`: `[rows, N_HEADS · HEAD_DIM]`; `keys`, `values`: `[start + rows, N_KV_HEADS ·
/// HEAD_DIM]` of the cache's element type. `scores` is not used: each thread keeps its heads'
/// scores in a buffer of its own. Query head h reads kv head `h / (N_HEADS / N_KV_HEADS)`.
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
    let attention = Attention::new::<N_HEADS, N_KV_HEADS, HEAD_DIM>(out, q, keys, values, start, rows);
    // SAFETY: the generated crate checks at start-up that the CPU has AVX2 and FMA;
    // `Attention::new` checked the slices, which stay borrowed until every share is done, and
    // the team gives each thread its own kv heads (and so its own query heads of `out`).
    unsafe { team::run(attention) }
}
