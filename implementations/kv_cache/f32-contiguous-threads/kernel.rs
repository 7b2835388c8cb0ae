//! One layer's KV cache as `kv_cache/contiguous` lays it out at f32 (two position-major f32
//! buffers of `[MAX_SEQ, KV_DIM]`), whose `store` of several positions the crate's team shares:
//! the keys on one thread, the values on another (`shared/kv_split.rs` says why).

use super::shared::kv_split::{AsIs, Split};
use super::shared::team;

/// The keys and values of one layer for up to `MAX_SEQ` positions.
pub struct KvCache<const MAX_SEQ: usize, const KV_DIM: usize> {
    /// `[MAX_SEQ, KV_DIM]`
    keys: Vec<f32>,
    /// `[MAX_SEQ, KV_DIM]`
    values: Vec<f32>,
}

impl<const MAX_SEQ: usize, const KV_DIM: usize> KvCache<MAX_SEQ, KV_DIM> {
    /// An empty cache (all zeros), allocated for `MAX_SEQ` positions.
    pub fn new() -> Self {
        Self { keys: vec![0.0; MAX_SEQ * KV_DIM], values: vec![0.0; MAX_SEQ * KV_DIM] }
    }

    /// Writes the keys and values of `k.len() / KV_DIM` consecutive positions from `start`
    /// (`k`, `v`: `[rows, KV_DIM]`).
    #[inline]
    pub fn store(&mut self, start: usize, k: &[f32], v: &[f32]) {
        assert!(
            k.len() == v.len() && k.len().is_multiple_of(KV_DIM),
            "KvCache::store: k and v must be whole rows of KV_DIM, as many of each"
        );
        let from = start * KV_DIM;
        let to = from + k.len();
        assert!(to <= MAX_SEQ * KV_DIM, "KvCache::store: positions past MAX_SEQ = {MAX_SEQ}");
        let split = Split::new(AsIs, &mut self.keys[from..to], &mut self.values[from..to], k, v);
        // SAFETY: the slices stay borrowed until every share is done, and the team gives the
        // keys and the values to one thread each.
        unsafe { team::run(split) }
    }

    /// The keys of the first `len` positions, `[len, KV_DIM]`.
    #[inline]
    pub fn keys(&self, len: usize) -> &[f32] {
        &self.keys[..len * KV_DIM]
    }

    /// The values of the first `len` positions, `[len, KV_DIM]`.
    #[inline]
    pub fn values(&self, len: usize) -> &[f32] {
        &self.values[..len * KV_DIM]
    }
}

impl<const MAX_SEQ: usize, const KV_DIM: usize> Default for KvCache<MAX_SEQ, KV_DIM> {
    fn default() -> Self {
        Self::new()
    }
}
