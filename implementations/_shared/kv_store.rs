//! How a KV cache stores the f32 keys and values it is given, by its element type: an f32 cache
//! copies them; a bfloat16 cache rounds each to the nearest bfloat16 (ties to even) once, as it
//! stores it, and keeps a NaN a quiet NaN instead of rounding it into the infinity beside it.

/// An element type of the cache.
pub trait Stored: Copy {
    /// A value before anything is stored.
    const ZERO: Self;

    /// Stores `values` into `cached` (of the same length).
    fn store(cached: &mut [Self], values: &[f32]);
}

impl Stored for f32 {
    const ZERO: f32 = 0.0;

    #[inline]
    fn store(cached: &mut [f32], values: &[f32]) {
        cached.copy_from_slice(values);
    }
}

impl Stored for u16 {
    const ZERO: u16 = 0;

    #[inline]
    fn store(cached: &mut [u16], values: &[f32]) {
        for (cached, value) in cached.iter_mut().zip(values) {
            *cached = to_bf16(*value);
        }
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
