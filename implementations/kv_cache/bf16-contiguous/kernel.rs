//! One layer's KV cache in bfloat16: keys and values in two buffers of `[MAX_SEQ, KV_DIM]`
//! bfloat16 bit patterns, position-major, so that the first `len` positions are one contiguous
//! slice, the layout the bf16 attention kernels read. Each value is rounded to the nearest
//! bfloat16 (ties to even) once, when it is stored. Allocated once, never resized.

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
        for (cached, value) in self.keys[from..to].iter_mut().zip(k) {
            *cached = to_bf16(*value);
        }
        for (cached, value) in self.values[from..to].iter_mut().zip(v) {
            *cached = to_bf16(*value);
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

/// `v` rounded to the nearest bfloat16, ties to even: the high half of its bits after adding
/// half a unit of the last kept place (less one when that place is even). A NaN stays a quiet
/// NaN instead of rounding into the infinity next to it.
#[inline]
fn to_bf16(v: f32) -> u16 {
    let bits = v.to_bits();
    if v.is_nan() {
        return ((bits >> 16) | 0x0040) as u16;
    }
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}
