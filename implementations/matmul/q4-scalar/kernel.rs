//! Reference matrix product `out = x · wᵀ` with blockwise int4 weights stored `[N, K]`, two to
//! a byte, each block with a scale and a minimum.
//!
//! Each activation row is quantized per block of 32 as the interface defines, each block's
//! four-bit weights are unpacked (low halves of its 16 bytes first, then high halves) and
//! multiplied in an exact i32 sum, beside the exact sum of the block's activations, and the
//! blocks' scaled sums are added in f32 in order of increasing k: the definition the other int4
//! implementations are checked against.

/// Values of K that share one scale; their weights fill `BLOCK / 2` bytes.
const BLOCK: usize = 32;

/// Computes `out[r, n] = Σ_b dx[r, b] · (d[n, b] · Σ_{k in b} qx[r, k] · q[n, k] + m[n, b] ·
/// Σ_{k in b} qx[r, k])` for `rows` rows.
///
/// `x`: `[rows, K]`, `w`: `[N, ⌈K/32⌉ · 16]` bytes of four-bit values and each block's
/// binary16 scale and minimum, `[N, ⌈K/32⌉, 2]`, `out`: `[rows, N]`, all row-major.
#[inline]
pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: (&[u8], &[u16]), rows: usize) {
    let (w, scales) = w;
    let blocks = K.div_ceil(BLOCK);
    assert!(x.len() >= rows * K, "matmul: x is shorter than {rows} rows of {K}");
    assert!(w.len() >= N * blocks * BLOCK / 2, "matmul: w is shorter than {N} rows of {blocks} blocks");
    assert!(scales.len() >= N * blocks * 2, "matmul: scales is shorter than {N} rows of {blocks} pairs");
    assert!(out.len() >= rows * N, "matmul: out is shorter than {rows} rows of {N}");
    let mut qx = vec![0i8; K];
    let mut dx = vec![0f32; blocks];
    for r in 0..rows {
        quantize(&x[r * K..(r + 1) * K], &mut qx, &mut dx);
        for (n, o) in out[r * N..(r + 1) * N].iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for b in 0..blocks {
                let bytes = &w[(n * blocks + b) * BLOCK / 2..][..BLOCK / 2];
                let (mut dot, mut sum) = (0i32, 0i32);
                for (i, &q) in qx[b * BLOCK..((b + 1) * BLOCK).min(K)].iter().enumerate() {
                    let nibble = if i < BLOCK / 2 { bytes[i] & 0x0f } else { bytes[i - BLOCK / 2] >> 4 };
                    dot += i32::from(q) * i32::from(nibble);
                    sum += i32::from(q);
                }
                let (d, m) = (binary16(scales[2 * (n * blocks + b)]), binary16(scales[2 * (n * blocks + b) + 1]));
                acc += dx[b] * (d * dot as f32 + m * sum as f32);
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

/// The value of binary16 `bits` (sign, 5 bits of exponent, 10 of mantissa), exactly.
fn binary16(bits: u16) -> f32 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exponent = i32::from((bits >> 10) & 0x1f);
    let mantissa = f32::from(bits & 0x3ff);
    // Exponent 31 (infinities and NaNs) never occurs: the crate writes finite scales only.
    let magnitude = match exponent {
        0 => mantissa * (2.0f32).powi(-24),
        e => (1.0 + mantissa / 1024.0) * (2.0f32).powi(e - 15),
    };
    sign * magnitude
}
