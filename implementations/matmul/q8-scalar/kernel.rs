//! Reference matrix product `out = x · wᵀ` with blockwise int8 weights stored `[N, K]`.
//!
//! Each activation row is quantized per block of 32 as the interface defines, each block's
//! dot product is an exact i32 sum, and the blocks' scaled sums are added in f32 in order of
//! increasing k: the definition the other int8 implementations are checked against.

/// Values of K that share one scale.
const BLOCK: usize = 32;

/// Computes `out[r, n] = Σ_b dx[r, b] · dw[n, b] · Σ_{k in b} qx[r, k] · w[n, k]` for `rows`
/// rows.
///
/// `x`: `[rows, K]`, `w`: `[N, K]` int8 values and their `[N, ⌈K/32⌉]` scales, `out`:
/// `[rows, N]`, all row-major.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: (&[i8], &[f32]), rows: usize) {
    product::<N, K>(out, x, w.0, w.1, rows)
}

/// [`matmul`] of the values `w` and their `scales`.
#[inline]
fn product<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[i8], scales: &[f32], rows: usize) {
    let blocks = K.div_ceil(BLOCK);
    assert!(x.len() >= rows * K, "matmul: x is shorter than {rows} rows of {K}");
    assert!(w.len() >= N * K, "matmul: w is shorter than {N} rows of {K}");
    assert!(scales.len() >= N * blocks, "matmul: scales is shorter than {N} rows of {blocks}");
    assert!(out.len() >= rows * N, "matmul: out is shorter than {rows} rows of {N}");
    let mut qx = vec![0i8; K];
    let mut dx = vec![0f32; blocks];
    for r in 0..rows {
        quantize(&x[r * K..(r + 1) * K], &mut qx, &mut dx);
        for (n, o) in out[r * N..(r + 1) * N].iter_mut().enumerate() {
            let w_row = &w[n * K..(n + 1) * K];
            let mut acc = 0.0f32;
            for b in 0..blocks {
                let ks = b * BLOCK..((b + 1) * BLOCK).min(K);
                let dot: i32 = qx[ks.clone()].iter().zip(&w_row[ks]).map(|(&a, &c)| i32::from(a) * i32::from(c)).sum();
                acc += (dx[b] * scales[n * blocks + b]) * dot as f32;
            }
            *o = acc;
        }
    }
}

/// Quantizes one row: per block of 32, `d = max|x| / 127` and `q = round(x · (127 / max|x|))`.
fn quantize(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    for ((xs, qs), d) in x.chunks(BLOCK).zip(q.chunks_mut(BLOCK)).zip(d) {
        let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let inverse = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        *d = amax / 127.0;
        for (q, &v) in qs.iter_mut().zip(xs) {
            *q = (v * inverse).round_ties_even() as i8;
        }
    }
}
