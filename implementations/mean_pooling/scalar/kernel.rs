//! Reference mean pooling over a sentence's valid tokens.

/// Writes the mean of the first `len` rows of `x` into `out` (zeros when `len` is 0).
///
/// `x`: at least `[len, DIM]`; `out`: `[DIM]`.
#[inline]
pub fn mean_pool<const DIM: usize>(out: &mut [f32], x: &[f32], len: usize) {
    assert!(x.len() >= len * DIM, "mean_pool: x is shorter than {len} rows of {DIM}");
    let out = &mut out[..DIM];
    out.fill(0.0);
    for row in x[..len * DIM].chunks_exact(DIM) {
        for (o, v) in out.iter_mut().zip(row) {
            *o += v;
        }
    }
    if len > 0 {
        let count = len as f32;
        for o in out.iter_mut() {
            *o /= count;
        }
    }
}
