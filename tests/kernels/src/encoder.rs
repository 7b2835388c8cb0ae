//! The conformance checks of the encoder (BERT) interfaces: each candidate against the
//! interface's reference and, where the formula is simple to state, against an f64
//! evaluation of it, on random inputs (never zeros) at odd shapes too.

use crate::check::{TOLERANCE, assert_close, dot_f64, output_of, scratch};
use crate::rng::Rng;

/// Checks an `embed` at `DIM` with tables of 50 words, 40 positions and 2 types, for
/// sequences of 1 to 40 tokens.
pub fn embedding<const DIM: usize>(
    candidate: impl Fn(&mut [f32], &[u32], &[u32], &[f32], &[f32], &[f32]),
    reference: impl Fn(&mut [f32], &[u32], &[u32], &[f32], &[f32], &[f32]),
) {
    let mut rng = Rng::for_shape(&[11, DIM]);
    let (words, positions, types) = (rng.vec(50 * DIM, 1.0), rng.vec(40 * DIM, 0.5), rng.vec(2 * DIM, 0.1));
    for len in [1, 2, 7, 40] {
        let ids: Vec<u32> = (0..len).map(|_| rng.below(50) as u32).collect();
        let kinds: Vec<u32> = (0..len).map(|_| rng.below(2) as u32).collect();
        let what = format!("embed DIM={DIM} len={len}");
        let got = output_of(len * DIM, |out| candidate(out, &ids, &kinds, &words, &positions, &types));
        let want = output_of(len * DIM, |out| reference(out, &ids, &kinds, &words, &positions, &types));
        assert_close(&format!("{what}, against the reference"), &got, &want, 0.0);
        let exact: Vec<f32> = (0..len * DIM)
            .map(|i| {
                let (p, d) = (i / DIM, i % DIM);
                (f64::from(words[ids[p] as usize * DIM + d])
                    + f64::from(types[kinds[p] as usize * DIM + d])
                    + f64::from(positions[p * DIM + d])) as f32
            })
            .collect();
        assert_close(&format!("{what}, against f64"), &got, &exact, TOLERANCE);
    }
}

#[macro_export]
macro_rules! conform_embedding {
    ($candidate:ident, $reference:ident) => {
        $crate::conform_embedding!(@shapes $candidate, $reference, 1 3 8 17 64 384);
    };
    (@shapes $candidate:ident, $reference:ident, $($dim:literal)*) => {
        $(
            $crate::encoder::embedding::<$dim>(
                $crate::kernels::$candidate::embed::<$dim>,
                $crate::kernels::$reference::embed::<$dim>,
            );
        )*
    };
}

/// Checks a `layernorm` at `DIM`, with rows of ordinary, large (and offset) and tiny
/// magnitude, where the variance is small next to the mean or next to `eps`.
pub fn layernorm<const DIM: usize>(
    candidate: impl Fn(&mut [f32], &[f32], &[f32], &[f32], f32, usize),
    reference: impl Fn(&mut [f32], &[f32], &[f32], &[f32], f32, usize),
) {
    let mut rng = Rng::for_shape(&[12, DIM]);
    let (weight, bias) = (rng.vec(DIM, 2.0), rng.vec(DIM, 0.5));
    for (rows, eps, amplitude, offset) in
        [(1, 1e-12, 1.0, 0.0), (3, 1e-5, 30.0, 100.0), (7, 1e-12, 0.01, 0.0)]
    {
        let x: Vec<f32> = rng.vec(rows * DIM, amplitude).iter().map(|v| v + offset).collect();
        let what = format!("layernorm DIM={DIM} rows={rows} eps={eps} amplitude={amplitude} offset={offset}");
        let got = output_of(rows * DIM, |out| candidate(out, &x, &weight, &bias, eps, rows));
        let want = output_of(rows * DIM, |out| reference(out, &x, &weight, &bias, eps, rows));
        assert_close(&format!("{what}, against the reference"), &got, &want, TOLERANCE);
        if DIM > 1 {
            let mut exact = Vec::with_capacity(rows * DIM);
            for row in x.chunks_exact(DIM) {
                let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / DIM as f64;
                let var = row.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / DIM as f64;
                let inv = 1.0 / (var + f64::from(eps)).sqrt();
                exact.extend(row.iter().zip(&weight).zip(&bias).map(|((&v, &w), &b)| {
                    ((f64::from(v) - mean) * inv * f64::from(w) + f64::from(b)) as f32
                }));
            }
            assert_close(&format!("{what}, against f64"), &got, &exact, 1e-4);
        }
    }
}

#[macro_export]
macro_rules! conform_layernorm {
    ($candidate:ident, $reference:ident) => {
        $crate::conform_layernorm!(@shapes $candidate, $reference, 1 3 8 17 64 384 1536);
    };
    (@shapes $candidate:ident, $reference:ident, $($dim:literal)*) => {
        $(
            $crate::encoder::layernorm::<$dim>(
                $crate::kernels::$candidate::layernorm::<$dim>,
                $crate::kernels::$reference::layernorm::<$dim>,
            );
        )*
    };
}

/// Checks an `attention_encoder` at the given heads for sequences of 1 to 70 valid rows,
/// with padding rows after them that must be neither read nor written.
pub fn attention_encoder<const N_HEADS: usize, const HEAD_DIM: usize>(
    candidate: impl Fn(&mut [f32], &[f32], &[f32], &[f32], &mut [f32], usize),
    reference: impl Fn(&mut [f32], &[f32], &[f32], &[f32], &mut [f32], usize),
) {
    let width = N_HEADS * HEAD_DIM;
    let mut rng = Rng::for_shape(&[13, N_HEADS, HEAD_DIM]);
    for (case, len) in [1, 2, 7, 16, 33, 70].into_iter().enumerate() {
        let padded = len + 3;
        let amplitude = [1.0, 3.0][case % 2];
        let mut q = rng.vec(padded * width, amplitude);
        let mut k = rng.vec(padded * width, amplitude);
        let mut v = rng.vec(padded * width, 1.0);
        // Padding rows hold NaN: reading them would poison the result.
        for buffer in [&mut q, &mut k, &mut v] {
            buffer[len * width..].fill(f32::NAN);
        }
        let what = format!("attention_encoder N_HEADS={N_HEADS} HEAD_DIM={HEAD_DIM} len={len}");
        let mut got = vec![-7.0; padded * width];
        candidate(&mut got, &q, &k, &v, &mut scratch(len), len);
        assert!(got[len * width..].iter().all(|&x| x == -7.0), "{what}: padding rows of out were written");
        let got = &got[..len * width];
        let want = output_of(len * width, |out| reference(out, &q, &k, &v, &mut scratch(len), len));
        assert_close(&format!("{what}, against the reference"), got, &want, TOLERANCE);
        let scale = 1.0 / (HEAD_DIM as f64).sqrt();
        let mut exact = vec![0.0f32; len * width];
        for i in 0..len {
            for h in 0..N_HEADS {
                let at = |m: &[f32], row: usize| -> Vec<f32> {
                    m[row * width + h * HEAD_DIM..][..HEAD_DIM].to_vec()
                };
                let qi = at(&q, i);
                let scores: Vec<f64> = (0..len).map(|j| dot_f64(&qi, &at(&k, j)) * scale).collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = weights.iter().sum();
                for d in 0..HEAD_DIM {
                    let total: f64 =
                        (0..len).map(|j| weights[j] * f64::from(v[j * width + h * HEAD_DIM + d])).sum();
                    exact[i * width + h * HEAD_DIM + d] = (total / sum) as f32;
                }
            }
        }
        assert_close(&format!("{what}, against f64"), got, &exact, TOLERANCE);
    }
}

#[macro_export]
macro_rules! conform_attention_encoder {
    ($candidate:ident, $reference:ident) => {
        $crate::conform_attention_encoder!(@shapes $candidate, $reference, (1, 8) (3, 6) (12, 32) (4, 16) (2, 64) (2, 3));
    };
    (@shapes $candidate:ident, $reference:ident, $(($h:literal, $d:literal))*) => {
        $(
            $crate::encoder::attention_encoder::<$h, $d>(
                $crate::kernels::$candidate::attention_encoder::<$h, $d>,
                $crate::kernels::$reference::attention_encoder::<$h, $d>,
            );
        )*
    };
}

/// Checks a `gelu` at `N` over inputs from −12 to 12 (both tails of erf), against the
/// reference and against known values.
pub fn gelu<const N: usize>(candidate: impl Fn(&mut [f32], usize), reference: impl Fn(&mut [f32], usize)) {
    let mut rng = Rng::for_shape(&[14, N]);
    for (rows, amplitude) in [(1, 1.0), (3, 4.0), (5, 12.0)] {
        let x = rng.vec(rows * N, amplitude);
        let what = format!("gelu N={N} rows={rows} amplitude={amplitude}");
        let (mut got, mut want) = (x.clone(), x.clone());
        candidate(&mut got, rows);
        reference(&mut want, rows);
        assert_close(&format!("{what}, against the reference"), &got, &want, TOLERANCE);
    }
    // 0.5 · x · (1 + erf(x / √2)) at these points, from Python's math.erf in f64.
    let known = [
        (-3.0f32, -0.004_049_694_f32),
        (-1.0, -0.158_655_25),
        (0.5, 0.345_731_23),
        (1.0, 0.841_344_7),
        (2.5, 2.484_475_8),
    ];
    let mut x: Vec<f32> = (0..N).map(|i| known[i % known.len()].0).collect();
    candidate(&mut x, 1);
    for (i, got) in x.iter().enumerate() {
        let want = known[i % known.len()].1;
        assert!(
            (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
            "gelu N={N}: gelu({}) = {got}, expected {want}",
            known[i % known.len()].0
        );
    }
}

#[macro_export]
macro_rules! conform_gelu {
    ($candidate:ident, $reference:ident) => {
        $crate::conform_gelu!(@shapes $candidate, $reference, 1 5 8 17 1536);
    };
    (@shapes $candidate:ident, $reference:ident, $($n:literal)*) => {
        $(
            $crate::encoder::gelu::<$n>(
                $crate::kernels::$candidate::gelu::<$n>,
                $crate::kernels::$reference::gelu::<$n>,
            );
        )*
    };
}

/// Checks a `mean_pool` at `DIM` for 0 to 40 valid rows out of a padded buffer.
pub fn mean_pooling<const DIM: usize>(
    candidate: impl Fn(&mut [f32], &[f32], usize),
    reference: impl Fn(&mut [f32], &[f32], usize),
) {
    let mut rng = Rng::for_shape(&[15, DIM]);
    for len in [0, 1, 2, 9, 40] {
        let mut x = rng.vec((len + 2) * DIM, 3.0);
        x[len * DIM..].fill(f32::NAN);
        let what = format!("mean_pool DIM={DIM} len={len}");
        let got = output_of(DIM, |out| candidate(out, &x, len));
        let want = output_of(DIM, |out| reference(out, &x, len));
        assert_close(&format!("{what}, against the reference"), &got, &want, TOLERANCE);
        let exact: Vec<f32> = (0..DIM)
            .map(|d| {
                if len == 0 {
                    0.0
                } else {
                    ((0..len).map(|r| f64::from(x[r * DIM + d])).sum::<f64>() / len as f64) as f32
                }
            })
            .collect();
        assert_close(&format!("{what}, against f64"), &got, &exact, TOLERANCE);
    }
}

#[macro_export]
macro_rules! conform_mean_pooling {
    ($candidate:ident, $reference:ident) => {
        $crate::conform_mean_pooling!(@shapes $candidate, $reference, 1 3 8 17 384);
    };
    (@shapes $candidate:ident, $reference:ident, $($dim:literal)*) => {
        $(
            $crate::encoder::mean_pooling::<$dim>(
                $crate::kernels::$candidate::mean_pool::<$dim>,
                $crate::kernels::$reference::mean_pool::<$dim>,
            );
        )*
    };
}

/// Checks an `l2_normalize` at `DIM`: ordinary rows, tiny rows and an all-zero row (which
/// must stay zero, not become NaN).
pub fn l2_normalize<const DIM: usize>(
    candidate: impl Fn(&mut [f32], usize),
    reference: impl Fn(&mut [f32], usize),
) {
    let mut rng = Rng::for_shape(&[16, DIM]);
    let mut x = rng.vec(4 * DIM, 2.0);
    for v in &mut x[DIM..2 * DIM] {
        *v *= 1e-20;
    }
    x[3 * DIM..].fill(0.0);
    let what = format!("l2_normalize DIM={DIM}");
    let (mut got, mut want) = (x.clone(), x.clone());
    candidate(&mut got, 4);
    reference(&mut want, 4);
    assert_close(&format!("{what}, against the reference"), &got, &want, TOLERANCE);
    let mut exact = Vec::new();
    for row in x.chunks_exact(DIM) {
        let norm = dot_f64(row, row).sqrt().max(1e-12);
        exact.extend(row.iter().map(|&v| (f64::from(v) / norm) as f32));
    }
    assert_close(&format!("{what}, against f64"), &got, &exact, TOLERANCE);
}

#[macro_export]
macro_rules! conform_l2_normalize {
    ($candidate:ident, $reference:ident) => {
        $crate::conform_l2_normalize!(@shapes $candidate, $reference, 1 3 8 17 384);
    };
    (@shapes $candidate:ident, $reference:ident, $($dim:literal)*) => {
        $(
            $crate::encoder::l2_normalize::<$dim>(
                $crate::kernels::$candidate::l2_normalize::<$dim>,
                $crate::kernels::$reference::l2_normalize::<$dim>,
            );
        )*
    };
}
