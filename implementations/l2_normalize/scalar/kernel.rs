//! Reference L2 normalization, as `torch.nn.functional.normalize(p=2, eps=1e-12)`.

/// Divides each of `rows` rows of `DIM` values by `max(‖row‖₂, 1e-12)`, in place.
#[inline]
pub fn l2_normalize<const DIM: usize>(x: &mut [f32], rows: usize) {
    assert!(x.len() >= rows * DIM, "l2_normalize: x is shorter than {rows} rows of {DIM}");
    for row in x[..rows * DIM].chunks_exact_mut(DIM) {
        let mut sum_sq = 0.0f32;
        for v in row.iter() {
            sum_sq += v * v;
        }
        let norm = sum_sq.sqrt().max(1e-12);
        for v in row.iter_mut() {
            *v /= norm;
        }
    }
}
