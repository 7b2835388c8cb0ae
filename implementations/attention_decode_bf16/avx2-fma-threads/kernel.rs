//! Grouped-query attention of one new position over a bfloat16 KV cache, with AVX2 and FMA on
//! `THREADS` threads: for CPUs without AVX-512 (x86-64-v3). The attention of
//! `shared/avx2_team_attention.rs` (every key and value widened to f32 as it is loaded), its kv
//! heads cut into `THREADS` shares that the crate's team of `shared/team.rs` computes, the
//! calling thread taking the first, so that every thread streams its heads' piece of each
//! cache row.

use std::ops::Range;

use super::shared::avx2_team_attention::Attention;
use super::shared::team::{self, Job};

/// Attention of the query `q` of the newest position over all `len` cached positions.
///
/// `q`, `out`: `[N_HEADS · HEAD_DIM]`; `keys`, `values`: `[len, N_KV_HEADS · HEAD_DIM]`
/// bfloat16 bits. `scores` is not used: each thread keeps its heads' scores in a buffer of its
/// own. Query head h reads kv head `h / (N_HEADS / N_KV_HEADS)`.
#[inline]
pub fn attention_decode_bf16<const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize>(
    out: &mut [f32],
    q: &[f32],
    keys: &[u16],
    values: &[u16],
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
    let attention = Attention::new::<N_HEADS, N_KV_HEADS, HEAD_DIM>(out, q, keys, values, len - 1, 1);
    // SAFETY: the generated crate checks at start-up that the CPU has AVX2 and FMA;
    // `Attention::new` checked the slices, which stay borrowed until every share is done, and
    // the team gives each thread its own kv heads (and so its own query heads of `out`).
    unsafe { team::run(Shared(attention)) }
}

/// A call of this implementation, as the crate's team shares it: by kv heads.
#[derive(Clone, Copy)]
pub(crate) struct Shared(Attention<u16>);

impl Job for Shared {
    fn n(&self) -> usize {
        self.0.n_kv_heads()
    }

    fn granule(&self) -> usize {
        1
    }

    fn work(&self) -> usize {
        self.0.work()
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract, which `run` keeps; the kernel enters only on a CPU
        // with AVX2 and FMA.
        unsafe { self.0.kv_heads(cols) }
    }
}
