//! Rotary position embedding in the rotate-half layout of Hugging Face LLaMA checkpoints.
//!
//! `rope_table` reproduces what PyTorch computes in f32: `inv_freq[i] = 1 / θ^(2i / HEAD_DIM)`,
//! `angle = p · inv_freq[i]` (an f32 product), and the cos and sin of that f32 angle,
//! evaluated in f64 and rounded to f32. `rope` pairs element i of every head with element
//! `i + HEAD_DIM / 2` and rotates the pair by the angle of the row's position.

/// Builds the cos and sin tables, each `[positions, HEAD_DIM / 2]`, for base `theta`.
#[inline]
pub fn rope_table<const HEAD_DIM: usize>(theta: f32, positions: usize) -> (Vec<f32>, Vec<f32>) {
    let inv_freq: Vec<f32> = (0..HEAD_DIM / 2)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / HEAD_DIM as f32))
        .collect();
    rope_table_from::<HEAD_DIM>(&inv_freq, positions)
}

/// Builds the cos and sin tables, each `[positions, HEAD_DIM / 2]`, for the given inverse
/// frequencies (`HEAD_DIM / 2` of them).
#[inline]
pub fn rope_table_from<const HEAD_DIM: usize>(inv_freq: &[f32], positions: usize) -> (Vec<f32>, Vec<f32>) {
    let half = HEAD_DIM / 2;
    let inv_freq = &inv_freq[..half];
    let mut cos = Vec::with_capacity(positions * half);
    let mut sin = Vec::with_capacity(positions * half);
    for p in 0..positions {
        for &f in inv_freq {
            let angle = f64::from(p as f32 * f);
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (cos, sin)
}

/// Rotates, in place, every head of `rows` rows of `x` (`[rows, N_HEADS · HEAD_DIM]`) that
/// sit at positions `start..start + rows`, with tables from [`rope_table`].
#[inline]
pub fn rope<const N_HEADS: usize, const HEAD_DIM: usize>(
    x: &mut [f32],
    cos: &[f32],
    sin: &[f32],
    start: usize,
    rows: usize,
) {
    const { assert!(HEAD_DIM.is_multiple_of(2), "HEAD_DIM must be even") };
    let half = HEAD_DIM / 2;
    let row_len = N_HEADS * HEAD_DIM;
    assert!(
        x.len() >= rows * row_len,
        "rope: x is shorter than {rows} rows"
    );
    assert!(
        cos.len() >= (start + rows) * half && sin.len() >= (start + rows) * half,
        "rope: the tables hold fewer than start + rows positions"
    );
    for (r, row) in x[..rows * row_len].chunks_exact_mut(row_len).enumerate() {
        let at = (start + r) * half;
        let (cos, sin) = (&cos[at..at + half], &sin[at..at + half]);
        for head in row.chunks_exact_mut(HEAD_DIM) {
            let (first, second) = head.split_at_mut(half);
            for (((x0, x1), &c), &s) in first.iter_mut().zip(second).zip(cos).zip(sin) {
                let (a, b) = (*x0, *x1);
                *x0 = a * c - b * s;
                *x1 = b * c + a * s;
            }
        }
    }
}
