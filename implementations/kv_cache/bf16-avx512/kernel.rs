//! One layer's KV cache in bfloat16, as `kv_cache/contiguous` lays it out at bf16 (two
//! position-major buffers of `[MAX_SEQ, KV_DIM]` bfloat16 bit patterns), with the rounding of
//! `store` done 16 values at a time with AVX-512F (`shared/avx512_bf16_round.rs`). The portable
//! loop runs scalar (a crate is not compiled for AVX-512 as a whole), 3.5x slower than the f32
//! cache's copy in a prefill of stories15M's shapes.

use super::shared::avx512_bf16_round::round_into;

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
        // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F.
        unsafe {
            round_into(&mut self.keys[from..to], k);
            round_into(&mut self.values[from..to], v);
        }
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
