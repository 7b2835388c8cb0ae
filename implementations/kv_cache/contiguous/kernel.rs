//! One layer's KV cache: keys and values in two buffers of `[MAX_SEQ, KV_DIM]` of the cache's
//! element type (f32, or bfloat16 bit patterns: `KV`), position-major, so that the first `len`
//! positions are one contiguous slice, the layout the attention kernels read. A bfloat16 value
//! is rounded to the nearest bfloat16 (ties to even) once, when it is stored
//! (`shared/kv_store.rs`). Allocated once, never resized.

use super::shared::kv_store::Stored;

/// The keys and values of one layer for up to `MAX_SEQ` positions.
pub struct KvCache<const MAX_SEQ: usize, const KV_DIM: usize> {
    /// `[MAX_SEQ, KV_DIM]`
    keys: Vec<KV>,
    /// `[MAX_SEQ, KV_DIM]`
    values: Vec<KV>,
}

impl<const MAX_SEQ: usize, const KV_DIM: usize> KvCache<MAX_SEQ, KV_DIM> {
    /// An empty cache (all zeros), allocated for `MAX_SEQ` positions.
    pub fn new() -> Self {
        Self { keys: vec![KV::ZERO; MAX_SEQ * KV_DIM], values: vec![KV::ZERO; MAX_SEQ * KV_DIM] }
    }

    /// Writes the keys and values of `k.len() / KV_DIM` consecutive positions from `start`
    /// (`k`, `v`: `[rows, KV_DIM]`), as the cache's element type.
    #[inline]
    pub fn store(&mut self, start: usize, k: &[f32], v: &[f32]) {
        assert!(
            k.len() == v.len() && k.len().is_multiple_of(KV_DIM),
            "KvCache::store: k and v must be whole rows of KV_DIM, as many of each"
        );
        let from = start * KV_DIM;
        let to = from + k.len();
        assert!(to <= MAX_SEQ * KV_DIM, "KvCache::store: positions past MAX_SEQ = {MAX_SEQ}");
        KV::store(&mut self.keys[from..to], k);
        KV::store(&mut self.values[from..to], v);
    }

    /// The keys of the first `len` positions, `[len, KV_DIM]`.
    #[inline]
    pub fn keys(&self, len: usize) -> &[KV] {
        &self.keys[..len * KV_DIM]
    }

    /// The values of the first `len` positions, `[len, KV_DIM]`.
    #[inline]
    pub fn values(&self, len: usize) -> &[KV] {
        &self.values[..len * KV_DIM]
    }
}

impl<const MAX_SEQ: usize, const KV_DIM: usize> Default for KvCache<MAX_SEQ, KV_DIM> {
    fn default() -> Self {
        Self::new()
    }
}
