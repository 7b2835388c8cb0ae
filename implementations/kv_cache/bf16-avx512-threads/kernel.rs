//! One layer's KV cache in bfloat16 as `kv_cache/bf16-avx512` keeps it (two position-major
//! buffers of `[MAX_SEQ, KV_DIM]` bfloat16 bit patterns, rounded 16 values at a time by
//! `shared/avx512_bf16_round.rs`), whose `store` of several positions the crate's team shares:
//! the keys on one thread, the values on another (`shared/kv_split.rs` says why).

use super::shared::avx512_bf16_round::round_into;
use super::shared::kv_split::{Split, Write};
use super::shared::team;

/// The keys and values of one layer for up to `MAX_SEQ` positions, as bfloat16 bits.
pub struct KvCache<const MAX_SEQ: usize, const KV_DIM: usize> {
    /// `[MAX_SEQ, KV_DIM]`
    keys: Vec<u16>,
    /// `[MAX_SEQ, KV_DIM]`
    values: Vec<u16>,
}

impl<const MAX_SEQ: usize, const KV_DIM: usize> KvCache<MAX_SEQ, KV_DIM> {
    /// An empty cache (all zeros), allocated for `MAX_SEQ` positions.
    pub fn new() -> Self {
        Self { keys: vec![0; MAX_SEQ * KV_DIM], values: vec![0; MAX_SEQ * KV_DIM] }
    }

    /// Writes the keys and values of `k.len() / KV_DIM` consecutive positions from `start`
    /// (`k`, `v`: `[rows, KV_DIM]`), rounded to bfloat16.
    #[inline]
    pub fn store(&mut self, start: usize, k: &[f32], v: &[f32]) {
        assert!(
            k.len() == v.len() && k.len().is_multiple_of(KV_DIM),
            "KvCache::store: k and v must be whole rows of KV_DIM, as many of each"
        );
        let from = start * KV_DIM;
        let to = from + k.len();
        assert!(to <= MAX_SEQ * KV_DIM, "KvCache::store: positions past MAX_SEQ = {MAX_SEQ}");
        let split = Split::new(RoundBf16, &mut self.keys[from..to], &mut self.values[from..to], k, v);
        // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F; the slices
        // stay borrowed until every share is done, and the team gives the keys and the values
        // to one thread each.
        unsafe { team::run(split) }
    }

    /// The keys of the first `len` positions, `[len, KV_DIM]` bfloat16 bits.
    #[inline]
    pub fn keys(&self, len: usize) -> &[u16] {
        &self.keys[..len * KV_DIM]
    }

    /// The values of the first `len` positions, `[len, KV_DIM]` bfloat16 bits.
    #[inline]
    pub fn values(&self, len: usize) -> &[u16] {
        &self.values[..len * KV_DIM]
    }
}

impl<const MAX_SEQ: usize, const KV_DIM: usize> Default for KvCache<MAX_SEQ, KV_DIM> {
    fn default() -> Self {
        Self::new()
    }
}

/// f32 values stored as bfloat16 bits by [`round_into`].
#[derive(Clone, Copy)]
pub(crate) struct RoundBf16;

impl Write for RoundBf16 {
    type Element = u16;

    #[inline]
    unsafe fn write(self, dst: &mut [u16], src: &[f32]) {
        // SAFETY: the caller's contract: the CPU has AVX-512F.
        unsafe { round_into(dst, src) }
    }
}
