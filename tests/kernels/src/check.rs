//! The conformance checks, one per family: an interface, or one element type of an interface
//! with `[[elements]]` (`matmul_bf16`, `kv_cache_f32`).
//!
//! Each check runs a candidate implementation and the interface's reference on the same
//! random inputs (never zeros) at many shapes, odd sizes included, and compares the outputs
//! within a tolerance relative to their magnitude. Outputs start as NaN, so a value a kernel
//! fails to write shows up, and scratch buffers start as NaN and longer than needed. Where
//! the interface's formula is simple to state, the candidate is also compared with an
//! independent f64 evaluation of it, so that a reference that drifts from the contract is
//! caught as well.
//!
//! Kernels are generic over const shapes, so every check has a macro,
//! `conform_<family>!(candidate_module, reference_module)`, that instantiates both
//! implementations at a fixed list of shapes and hands them to the generic function of the
//! same name here, which does the work.

use crate::rng::Rng;

/// Relative tolerance of attention, softmax and element-wise kernels: outputs may differ by
/// `TOLERANCE · (1 + |expected|)`.
pub const TOLERANCE: f32 = 1e-5;

/// Panics unless `|actual − expected| ≤ tolerance · (1 + |expected|)` everywhere.
pub fn assert_close(what: &str, actual: &[f32], expected: &[f32], tolerance: f32) {
    assert_eq!(actual.len(), expected.len(), "{what}: the lengths differ");
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        let allowed = tolerance * (1.0 + e.abs());
        let difference = (a - e).abs();
        if difference.is_nan() || difference > allowed {
            panic!(
                "{what}: at index {i} got {a}, expected {e} (difference {difference:e}, allowed {allowed:e})"
            );
        }
    }
}

/// Runs `kernel` on an output of `len` NaNs and returns the output.
pub(crate) fn output_of(len: usize, kernel: impl FnOnce(&mut [f32])) -> Vec<f32> {
    let mut out = vec![f32::NAN; len];
    kernel(&mut out);
    out
}

/// Scratch space of NaNs, a little longer than the `len` values a kernel may use.
pub(crate) fn scratch(len: usize) -> Vec<f32> {
    vec![f32::NAN; len + 3]
}

/// A value of a KV cache as the checks build and compare them: `f32`, or `u16` holding a
/// bfloat16 (the high 16 bits of an f32).
pub trait Cached: Copy + std::fmt::Debug {
    /// `v` as the cache holds it: itself, or the nearest bfloat16 (ties to even; NaN stays
    /// NaN).
    fn from_f32(v: f32) -> Self;
    /// The value, exactly.
    fn to_f32(self) -> f32;
}

impl Cached for f32 {
    fn from_f32(v: f32) -> f32 {
        v
    }

    fn to_f32(self) -> f32 {
        self
    }
}

impl Cached for u16 {
    /// Picks the nearer of the two bfloat16 values around `v` by comparing distances in f64
    /// (the even one on a tie): a model of rounding independent of the kernels' bit trick.
    fn from_f32(v: f32) -> u16 {
        if v.is_nan() {
            return 0x7fc0;
        }
        let down = (v.to_bits() >> 16) as u16;
        let up = down + 1;
        let value = |b: u16| f64::from(f32::from_bits(u32::from(b) << 16));
        if (v.to_bits() & 0xffff) == 0 {
            return down;
        }
        // `up` is one step away from zero; from the largest finite value it is the infinity.
        let (d, u) = ((f64::from(v) - value(down)).abs(), (value(up) - f64::from(v)).abs());
        if u.is_infinite() {
            // Beyond f32::MAX's bfloat16 neighbour: halfway to 2^128 or more rounds to ∞.
            let largest = value(down).abs();
            let halfway = largest + (2f64.powi(128) - largest) / 2.0;
            return if f64::from(v).abs() >= halfway { up } else { down };
        }
        if d < u || (d == u && down.is_multiple_of(2)) { down } else { up }
    }

    fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self) << 16)
    }
}

/// `values` as a cache of `E` holds them.
pub fn cached<E: Cached>(values: Vec<f32>) -> Vec<E> {
    values.into_iter().map(E::from_f32).collect()
}

/// The values of a cache of `E`, exactly, as f32.
pub fn widened<E: Cached>(values: &[E]) -> Vec<f32> {
    values.iter().map(|v| v.to_f32()).collect()
}

/// The row counts a matmul check runs at `N`, `K`: `standard`, or at a shape of a real model's
/// size (more than 2M weights, where the kernels block and split K and N as they do in the
/// benchmark crates) a decode row and a short prefill, which an unoptimized test build still
/// computes in about a second.
fn rows_for(n: usize, k: usize, standard: &'static [usize]) -> &'static [usize] {
    if n * k > 1 << 21 { &[1, 3] } else { standard }
}

pub(crate) fn dot_f64(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum()
}

/// Checks a `matmul` at `N`, `K` for rows 1, 2, 7, 9 (a 1-row tile after two of 4), 10, 13, 32
/// and 100, with the weights in the layout the candidate reads (`layout`: its `pack`, or a copy).
/// The tolerance grows with K beyond 64, as the rounding of a dot product does.
pub fn matmul<const N: usize, const K: usize>(
    candidate: impl Fn(&mut [f32], &[f32], &[f32], usize),
    layout: impl Fn(&[f32]) -> Vec<f32>,
    reference: impl Fn(&mut [f32], &[f32], &[f32], usize),
) {
    let mut rng = Rng::for_shape(&[N, K]);
    let tolerance = TOLERANCE * (K as f32 / 64.0).max(1.0);
    let w = rng.vec(N * K, 1.0);
    let laid_out = layout(&w);
    for &rows in rows_for(N, K, &[1, 2, 7, 9, 10, 13, 32, 100]) {
        let x = rng.vec(rows * K, 1.0);
        let what = format!("matmul N={N} K={K} rows={rows}");
        let got = output_of(rows * N, |out| candidate(out, &x, &laid_out, rows));
        let want = output_of(rows * N, |out| reference(out, &x, &w, rows));
        assert_close(&format!("{what}, against the reference"), &got, &want, tolerance);
        let exact: Vec<f32> =
            (0..rows * N).map(|i| dot_f64(&x[i / N * K..][..K], &w[i % N * K..][..K]) as f32).collect();
        assert_close(&format!("{what}, against f64"), &got, &exact, tolerance);
    }
    candidate(&mut [], &[], &laid_out, 0);
}

#[macro_export]
macro_rules! conform_matmul_f32 {
    ($candidate:ident, $reference:ident) => {
        $crate::conform_matmul_f32!(@shapes $candidate, $reference,
            (1, 1) (1, 172) (5, 3) (5, 64) (32, 17) (32, 64) (33, 61) (33, 8)
            (64, 172) (172, 64) (512, 3) (512, 64) (8, 16) (3, 7) (384, 384) (100, 1000) (40, 1536)
            (640, 5632));
    };
    (@shapes $candidate:ident, $reference:ident, $(($n:literal, $k:literal))*) => {
        $(
            $crate::check::matmul::<$n, $k>(
                $crate::kernels::$candidate::matmul::<$n, $k>,
                |w| $crate::matmul_f32_weights::$candidate(w, $n, $k),
                $crate::kernels::$reference::matmul::<$n, $k>,
            );
        )*
    };
}

/// Checks a bf16 matmul at one shape against the reference and against f64 sums of the
/// widened weights, for several row counts, with the weights in the layout the candidate reads
/// (`layout`: its `pack`, or a copy).
pub fn matmul_bf16<const N: usize, const K: usize>(
    candidate: impl Fn(&mut [f32], &[f32], &[u16], usize),
    layout: impl Fn(&[u16]) -> Vec<u16>,
    reference: impl Fn(&mut [f32], &[f32], &[u16], usize),
) {
    bf16_weights::<N, K>("matmul<bf16>", candidate, layout, reference, |v| v);
}

/// As [`matmul_bf16`], for `matmul<bf16act>`: the f64 sums are of the activations rounded to
/// the nearest bfloat16 (ties to even), which the reference is checked against too.
pub fn matmul_bf16act<const N: usize, const K: usize>(
    candidate: impl Fn(&mut [f32], &[f32], &[u16], usize),
    layout: impl Fn(&[u16]) -> Vec<u16>,
    reference: impl Fn(&mut [f32], &[f32], &[u16], usize),
) {
    bf16_weights::<N, K>("matmul<bf16act>", candidate, layout, reference, round_bf16);
}

/// The nearest bfloat16 to `v` (ties to even), as an f32: what `matmul<bf16act>` reads each
/// activation as, computed here independently of the kernels.
pub fn round_bf16(v: f32) -> f32 {
    if v.is_nan() {
        return v;
    }
    let bits = v.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000;
    f32::from_bits(rounded)
}

fn bf16_weights<const N: usize, const K: usize>(
    interface: &str,
    candidate: impl Fn(&mut [f32], &[f32], &[u16], usize),
    layout: impl Fn(&[u16]) -> Vec<u16>,
    reference: impl Fn(&mut [f32], &[f32], &[u16], usize),
    activation: fn(f32) -> f32,
) {
    let mut rng = Rng::for_shape(&[N, K, 16]);
    let tolerance = TOLERANCE * (K as f32 / 64.0).max(1.0);
    let w: Vec<u16> = rng.vec(N * K, 1.0).iter().map(|v| (v.to_bits() >> 16) as u16).collect();
    let widened: Vec<f32> = w.iter().map(|&b| f32::from_bits(u32::from(b) << 16)).collect();
    let laid_out = layout(&w);
    for &rows in rows_for(N, K, &[1, 2, 5, 7, 9, 32, 100]) {
        let x = rng.vec(rows * K, 1.0);
        let what = format!("{interface} N={N} K={K} rows={rows}");
        let got = output_of(rows * N, |out| candidate(out, &x, &laid_out, rows));
        let want = output_of(rows * N, |out| reference(out, &x, &w, rows));
        assert_close(&format!("{what}, against the reference"), &got, &want, tolerance);
        let seen: Vec<f32> = x.iter().map(|&v| activation(v)).collect();
        let exact: Vec<f32> = (0..rows * N)
            .map(|i| dot_f64(&seen[i / N * K..][..K], &widened[i % N * K..][..K]) as f32)
            .collect();
        assert_close(&format!("{what}, against f64"), &got, &exact, tolerance);
        assert_close(&format!("{what}, the reference against f64"), &want, &exact, tolerance);
    }
    candidate(&mut [], &[], &laid_out, 0);
}

#[macro_export]
macro_rules! conform_matmul_bf16 {
    ($candidate:ident, $reference:ident) => {
        $crate::conform_matmul_bf16!(@shapes matmul_bf16, matmul_bf16_weights, $candidate, $reference);
    };
    (@shapes $interface:ident, $weights:ident, $candidate:ident, $reference:ident) => {
        $crate::conform_matmul_bf16!(@each $interface, $weights, $candidate, $reference,
            (1, 1) (1, 172) (5, 3) (5, 64) (32, 17) (33, 61) (64, 172) (172, 64) (512, 64) (3, 7)
            (384, 384) (100, 1000) (40, 1536) (13, 520) (7, 513) (640, 5632));
    };
    (@each $interface:ident, $weights:ident, $candidate:ident, $reference:ident, $(($n:literal, $k:literal))*) => {
        $(
            $crate::check::$interface::<$n, $k>(
                $crate::kernels::$candidate::matmul::<$n, $k>,
                |w| $crate::$weights::$candidate(w, $n, $k),
                $crate::kernels::$reference::matmul::<$n, $k>,
            );
        )*
    };
}

#[macro_export]
macro_rules! conform_matmul_bf16act {
    ($candidate:ident, $reference:ident) => {
        $crate::conform_matmul_bf16!(@shapes matmul_bf16act, matmul_bf16act_weights, $candidate, $reference);
    };
}

/// Quantizes a row of activations as `matmul<q8>` defines it (f32 arithmetic, ties to even):
/// the values and one scale per block of 32.
fn quantize_q8(x: &[f32]) -> (Vec<i8>, Vec<f32>) {
    let (mut q, mut d) = (Vec::with_capacity(x.len()), Vec::new());
    for block in x.chunks(32) {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let inverse = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        d.push(amax / 127.0);
        q.extend(block.iter().map(|&v| (v * inverse).round_ties_even() as i8));
    }
    (q, d)
}

/// Checks an int8 matmul at one shape against the reference, against an f64 evaluation of
/// the interface's formula (activations quantized in f32 as the interface says, the sums in
/// f64), and against the unquantized product of the dequantized weights within the error that
/// quantizing the activations allows, for several row counts, with the weights in the layout the
/// candidate reads (`layout`: its `pack`, or a copy). Some activation blocks are all zeros, and
/// the weights span −127..=127.
pub fn matmul_q8<const N: usize, const K: usize>(
    candidate: impl Fn(&mut [f32], &[f32], (&[i8], &[f32]), usize),
    layout: impl Fn((&[i8], &[f32])) -> (Vec<i8>, Vec<f32>),
    reference: impl Fn(&mut [f32], &[f32], (&[i8], &[f32]), usize),
) {
    let mut rng = Rng::for_shape(&[N, K, 8]);
    let tolerance = TOLERANCE * (K as f32 / 64.0).max(1.0);
    let blocks = K.div_ceil(32);
    let w: Vec<i8> = rng.vec(N * K, 1.0).iter().map(|v| (v * 127.0).round() as i8).collect();
    // binary16 values, as the interface requires: 10 bits of mantissa.
    let scales: Vec<f32> = rng
        .vec(N * blocks, 1.0)
        .iter()
        .map(|v| f32::from_bits((0.01 + v.abs() * 0.02).to_bits() & !0x1fff))
        .collect();
    let (laid_out, laid_out_scales) = layout((&w, &scales));
    for &rows in rows_for(N, K, &[1, 2, 5, 7, 32, 100]) {
        let mut x = rng.vec(rows * K, 1.0);
        if K > 32 {
            // A block of zeros, which quantizes with scale 0.
            x[..32].fill(0.0);
        }
        let what = format!("matmul<q8> N={N} K={K} rows={rows}");
        let got = output_of(rows * N, |out| candidate(out, &x, (&laid_out, &laid_out_scales), rows));
        let want = output_of(rows * N, |out| reference(out, &x, (&w, &scales), rows));
        assert_close(&format!("{what}, against the reference"), &got, &want, tolerance);
        let quantized: Vec<(Vec<i8>, Vec<f32>)> = x.chunks(K).map(quantize_q8).collect();
        let (mut exact, mut plain, mut bound) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..rows * N {
            let (r, n) = (i / N, i % N);
            let (q, d) = &quantized[r];
            let (mut sum, mut unquantized, mut error) = (0f64, 0f64, 0f64);
            for k in 0..K {
                let dw = f64::from(scales[n * blocks + k / 32]);
                let weight = dw * f64::from(w[n * K + k]);
                sum += f64::from(d[k / 32]) * f64::from(q[k]) * weight;
                unquantized += f64::from(x[r * K + k]) * weight;
                // Rounding moves a value by at most half its block's step.
                error += 0.5 * f64::from(d[k / 32]) * weight.abs();
            }
            exact.push(sum as f32);
            plain.push(unquantized);
            bound.push(error * 1.001 + 1e-6);
        }
        assert_close(&format!("{what}, against f64"), &got, &exact, tolerance);
        for (i, ((&g, &p), &b)) in got.iter().zip(&plain).zip(&bound).enumerate() {
            assert!(
                (f64::from(g) - p).abs() <= b,
                "{what}: at index {i} got {g}, the unquantized product is {p}, further than the {b} quantization allows"
            );
        }
    }
    candidate(&mut [], &[], (&laid_out, &laid_out_scales), 0);
}

#[macro_export]
macro_rules! conform_matmul_q8 {
    ($candidate:ident, $reference:ident) => {
        $crate::conform_matmul_q8!(@shapes $candidate, $reference,
            (1, 1) (1, 172) (5, 3) (5, 64) (9, 32) (32, 17) (33, 61) (64, 172) (172, 64) (512, 64)
            (3, 7) (8, 96) (384, 384) (100, 1000) (16, 2048) (640, 5632));
    };
    (@shapes $candidate:ident, $reference:ident, $(($n:literal, $k:literal))*) => {
        $(
            $crate::check::matmul_q8::<$n, $k>(
                $crate::kernels::$candidate::matmul::<$n, $k>,
                |w| $crate::matmul_q8_weights::$candidate(w, $n, $k),
                $crate::kernels::$reference::matmul::<$n, $k>,
            );
        )*
    };
}

/// The value of binary16 `bits`, exactly (the f16 scales of `matmul<q4>`; never infinite or
/// NaN here).
pub fn binary16(bits: u16) -> f32 {
    let magnitude = match (bits >> 10) & 0x1f {
        0 => f32::from(bits & 0x3ff) * 2f32.powi(-24),
        e => (1.0 + f32::from(bits & 0x3ff) / 1024.0) * 2f32.powi(i32::from(e) - 15),
    };
    if bits & 0x8000 != 0 { -magnitude } else { magnitude }
}

/// The four-bit value of `[n, k]` weights in `matmul<q4>`'s layout (GGML's Q4_1): block b's
/// byte i holds k = 32b + i in its low half and k = 32b + 16 + i in its high half.
pub fn q4_value(w: &[u8], k_len: usize, n: usize, k: usize) -> u8 {
    let (b, i) = (k / 32, k % 32);
    let byte = w[(n * k_len.div_ceil(32) + b) * 16 + i % 16];
    if i < 16 { byte & 0x0f } else { byte >> 4 }
}

/// Checks an int4 matmul at one shape against the reference, and against an f64 evaluation of
/// the interface's formula (activations quantized in f32 as the interface says, the sums in
/// f64) and the unquantized product of the dequantized weights within the error that
/// quantizing the activations allows, for several row counts. The bytes span every four-bit
/// value, a short last block's padding holds random bits (which the product must not read),
/// the scales and minimums are binary16 values of both signs, tiny ones (subnormal) among
/// them, and some activation blocks are all zeros.
pub fn matmul_q4<const N: usize, const K: usize>(
    candidate: impl Fn(&mut [f32], &[f32], (&[u8], &[u16]), usize),
    layout: impl Fn((&[u8], &[u16])) -> (Vec<u8>, Vec<u16>),
    reference: impl Fn(&mut [f32], &[f32], (&[u8], &[u16]), usize),
) {
    let mut rng = Rng::for_shape(&[N, K, 4]);
    let tolerance = TOLERANCE * (K as f32 / 64.0).max(1.0);
    let blocks = K.div_ceil(32);
    let w: Vec<u8> =
        rng.vec(N * blocks * 16, 1.0).iter().map(|v| ((v + 1.0) * 128.0).clamp(0.0, 255.0) as u8).collect();
    // Pairs of binary16 bits (a scale, then a minimum) of magnitude about 0.01 to 0.03, both
    // signs, and every 7th one subnormal.
    let scales: Vec<u16> = rng
        .vec(N * blocks * 2, 1.0)
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let sign = if *v < 0.0 { 0x8000 } else { 0 };
            let magnitude =
                if i % 7 == 3 { 1 + (v.abs() * 1000.0) as u16 } else { 0x2000 + (v.abs() * 2000.0) as u16 };
            sign | magnitude
        })
        .collect();
    let (laid_out, laid_out_scales) = layout((&w, &scales));
    for &rows in rows_for(N, K, &[1, 2, 5, 7, 32, 100]) {
        let mut x = rng.vec(rows * K, 1.0);
        if K > 32 {
            // A block of zeros, which quantizes with scale 0.
            x[..32].fill(0.0);
        }
        let what = format!("matmul<q4> N={N} K={K} rows={rows}");
        let got = output_of(rows * N, |out| candidate(out, &x, (&laid_out, &laid_out_scales), rows));
        let want = output_of(rows * N, |out| reference(out, &x, (&w, &scales), rows));
        assert_close(&format!("{what}, against the reference"), &got, &want, tolerance);
        let quantized: Vec<(Vec<i8>, Vec<f32>)> = x.chunks(K).map(quantize_q8).collect();
        let (mut exact, mut plain, mut bound) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..rows * N {
            let (r, n) = (i / N, i % N);
            let (q, d) = &quantized[r];
            let (mut sum, mut unquantized, mut error) = (0f64, 0f64, 0f64);
            for k in 0..K {
                let pair = 2 * (n * blocks + k / 32);
                let (dw, mw) = (f64::from(binary16(scales[pair])), f64::from(binary16(scales[pair + 1])));
                let weight = dw * f64::from(q4_value(&w, K, n, k)) + mw;
                sum += f64::from(d[k / 32]) * f64::from(q[k]) * weight;
                unquantized += f64::from(x[r * K + k]) * weight;
                error += 0.5 * f64::from(d[k / 32]) * weight.abs();
            }
            exact.push(sum as f32);
            plain.push(unquantized);
            bound.push(error * 1.001 + 1e-6);
        }
        assert_close(&format!("{what}, against f64"), &got, &exact, tolerance);
        for (i, ((&g, &p), &b)) in got.iter().zip(&plain).zip(&bound).enumerate() {
            assert!(
                (f64::from(g) - p).abs() <= b,
                "{what}: at index {i} got {g}, the unquantized product is {p}, further than the {b} quantization allows"
            );
        }
    }
    candidate(&mut [], &[], (&laid_out, &laid_out_scales), 0);
}

#[macro_export]
macro_rules! conform_matmul_q4 {
    ($candidate:ident, $reference:ident) => {
        $crate::conform_matmul_q4!(@shapes $candidate, $reference,
            (1, 1) (1, 172) (5, 3) (5, 64) (9, 32) (32, 17) (33, 61) (64, 172) (172, 64) (512, 64)
            (3, 7) (8, 96) (384, 384) (100, 1000) (16, 2048) (640, 5632)
            // Odd block counts past the first group of 8 blocks' scales: 9, 25 and 19 blocks.
            (3, 288) (9, 800) (13, 600));
    };
    (@shapes $candidate:ident, $reference:ident, $(($n:literal, $k:literal))*) => {
        $(
            $crate::check::matmul_q4::<$n, $k>(
                $crate::kernels::$candidate::matmul::<$n, $k>,
                |w| $crate::matmul_q4_weights::$candidate(w, $n, $k),
                $crate::kernels::$reference::matmul::<$n, $k>,
            );
        )*
    };
}

/// Attention of one query row (`[n_heads · head_dim]`) over `len` positions, in f64.
fn attention_f64(q: &[f32], keys: &[f32], values: &[f32], len: usize, heads: [usize; 3]) -> Vec<f32> {
    let [n_heads, n_kv_heads, head_dim] = heads;
    let kv_dim = n_kv_heads * head_dim;
    let scale = 1.0 / (head_dim as f64).sqrt();
    let mut out = Vec::with_capacity(n_heads * head_dim);
    for h in 0..n_heads {
        let offset = h / (n_heads / n_kv_heads) * head_dim;
        let q = &q[h * head_dim..][..head_dim];
        let scores: Vec<f64> =
            (0..len).map(|j| dot_f64(q, &keys[j * kv_dim + offset..][..head_dim]) * scale).collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum: f64 = weights.iter().sum();
        for d in 0..head_dim {
            let total: f64 =
                weights.iter().enumerate().map(|(j, w)| w * f64::from(values[j * kv_dim + offset + d])).sum();
            out.push((total / sum) as f32);
        }
    }
    out
}

/// Checks an `attention_prefill` (or `attention_prefill<bf16>`: a cache of `E`) at the given
/// heads for chunks from the first one (`start` 0) to late ones (`start` 250, 300 positions),
/// with inputs of growing magnitude. The f64 evaluation reads the cached values exactly.
pub fn attention_prefill<E: Cached, const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize>(
    candidate: impl Fn(&mut [f32], &[f32], &[E], &[E], &mut [f32], usize, usize),
    reference: impl Fn(&mut [f32], &[f32], &[E], &[E], &mut [f32], usize, usize),
) {
    let (q_dim, kv_dim) = (N_HEADS * HEAD_DIM, N_KV_HEADS * HEAD_DIM);
    let mut rng = Rng::for_shape(&[1, N_HEADS, N_KV_HEADS, HEAD_DIM]);
    let chunks = [(0, 1), (0, 2), (0, 7), (0, 33), (3, 1), (5, 4), (17, 9), (64, 64), (100, 28), (250, 50)];
    for (case, (start, rows)) in chunks.into_iter().enumerate() {
        let len = start + rows;
        let amplitude = [1.0, 2.0, 6.0][case % 3];
        let q = rng.vec(rows * q_dim, amplitude);
        let keys = cached::<E>(rng.vec(len * kv_dim, amplitude));
        let values = cached::<E>(rng.vec(len * kv_dim, 1.0));
        let what = format!(
            "attention_prefill N_HEADS={N_HEADS} N_KV_HEADS={N_KV_HEADS} HEAD_DIM={HEAD_DIM} start={start} rows={rows}"
        );
        let got =
            output_of(rows * q_dim, |out| candidate(out, &q, &keys, &values, &mut scratch(len), start, rows));
        let want =
            output_of(rows * q_dim, |out| reference(out, &q, &keys, &values, &mut scratch(len), start, rows));
        assert_close(&format!("{what}, against the reference"), &got, &want, TOLERANCE);
        let heads = [N_HEADS, N_KV_HEADS, HEAD_DIM];
        let (keys, values) = (widened(&keys), widened(&values));
        let exact: Vec<f32> = (0..rows)
            .flat_map(|r| attention_f64(&q[r * q_dim..][..q_dim], &keys, &values, start + r + 1, heads))
            .collect();
        assert_close(&format!("{what}, against f64"), &got, &exact, TOLERANCE);
    }
    // A NaN in the first kv head's key at position 30 (rows from there on are NaN in the
    // reference), and, with two kv heads or more, an infinite key in the last one: every output
    // the reference makes NaN is NaN, the others agree.
    let (start, rows) = (9, 40);
    let len = start + rows;
    let q = rng.vec(rows * q_dim, 1.0);
    let mut keys = cached::<E>(rng.vec(len * kv_dim, 1.0));
    let values = cached::<E>(rng.vec(len * kv_dim, 1.0));
    keys[30 * kv_dim] = E::from_f32(f32::NAN);
    if N_KV_HEADS > 1 {
        keys[4 * kv_dim + kv_dim - 1] = E::from_f32(f32::INFINITY);
    }
    let got =
        output_of(rows * q_dim, |out| candidate(out, &q, &keys, &values, &mut scratch(len), start, rows));
    let want =
        output_of(rows * q_dim, |out| reference(out, &q, &keys, &values, &mut scratch(len), start, rows));
    assert_same_nans("attention_prefill with a NaN and an infinite key", &got, &want);
    // A NaN value at position 30: the rows before it never read it, even where they share a
    // block of rows or of positions with those that do.
    let keys = cached::<E>(rng.vec(len * kv_dim, 1.0));
    let mut values = values;
    values[30 * kv_dim] = E::from_f32(f32::NAN);
    let got =
        output_of(rows * q_dim, |out| candidate(out, &q, &keys, &values, &mut scratch(len), start, rows));
    let want =
        output_of(rows * q_dim, |out| reference(out, &q, &keys, &values, &mut scratch(len), start, rows));
    assert_same_nans("attention_prefill with a NaN value", &got, &want);
}

/// `got` is NaN exactly where `want` is, and close to it elsewhere.
fn assert_same_nans(what: &str, got: &[f32], want: &[f32]) {
    assert!(
        want.iter().any(|v| v.is_nan()) && want.iter().any(|v| !v.is_nan()),
        "{what}: the case tests nothing"
    );
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.is_nan(), w.is_nan(), "{what}: output {i} is {g}, the reference's {w}");
    }
    let finite = |v: &[f32]| v.iter().map(|x| if x.is_nan() { 0.0 } else { *x }).collect::<Vec<f32>>();
    assert_close(what, &finite(got), &finite(want), TOLERANCE);
}

/// Checks an `attention_decode` (or `attention_decode<bf16>`: a cache of `E`) at the given
/// heads for contexts of 1 to 1000 positions. At
/// 1000, every head shape with two kv heads or more has the 65536 multiply-adds from which the
/// team of `shared/team.rs` shares a call, so that a multi-threaded kernel splitting by kv
/// heads runs split too (evenly, and 2 + 1 at three kv heads).
pub fn attention_decode<E: Cached, const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize>(
    candidate: impl Fn(&mut [f32], &[f32], &[E], &[E], &mut [f32]),
    reference: impl Fn(&mut [f32], &[f32], &[E], &[E], &mut [f32]),
) {
    let (q_dim, kv_dim) = (N_HEADS * HEAD_DIM, N_KV_HEADS * HEAD_DIM);
    let mut rng = Rng::for_shape(&[2, N_HEADS, N_KV_HEADS, HEAD_DIM]);
    let lens = [1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 64, 100, 192, 300, 1000];
    for (case, len) in lens.into_iter().enumerate() {
        let amplitude = [1.0, 2.0, 6.0][case % 3];
        let q = rng.vec(q_dim, amplitude);
        let keys = cached::<E>(rng.vec(len * kv_dim, amplitude));
        let values = cached::<E>(rng.vec(len * kv_dim, 1.0));
        let what = format!(
            "attention_decode N_HEADS={N_HEADS} N_KV_HEADS={N_KV_HEADS} HEAD_DIM={HEAD_DIM} len={len}"
        );
        let got = output_of(q_dim, |out| candidate(out, &q, &keys, &values, &mut scratch(len)));
        let want = output_of(q_dim, |out| reference(out, &q, &keys, &values, &mut scratch(len)));
        assert_close(&format!("{what}, against the reference"), &got, &want, TOLERANCE);
        let exact =
            attention_f64(&q, &widened(&keys), &widened(&values), len, [N_HEADS, N_KV_HEADS, HEAD_DIM]);
        assert_close(&format!("{what}, against f64"), &got, &exact, TOLERANCE);
    }
    // A NaN in the first kv head's keys (its query heads' outputs are NaN in the reference),
    // and, with three kv heads or more, an infinite key in the last one; a context long
    // enough to be split where a kernel splits.
    let len = 1000;
    let q = rng.vec(q_dim, 1.0);
    let mut keys = cached::<E>(rng.vec(len * kv_dim, 1.0));
    let values = cached::<E>(rng.vec(len * kv_dim, 1.0));
    keys[7 * kv_dim] = E::from_f32(f32::NAN);
    if N_KV_HEADS > 2 {
        keys[20 * kv_dim + kv_dim - 1] = E::from_f32(f32::INFINITY);
    }
    let got = output_of(q_dim, |out| candidate(out, &q, &keys, &values, &mut scratch(len)));
    let want = output_of(q_dim, |out| reference(out, &q, &keys, &values, &mut scratch(len)));
    if N_KV_HEADS > 1 {
        assert_same_nans("attention_decode with a NaN and an infinite key", &got, &want);
    } else {
        assert!(got.iter().chain(&want).all(|v| v.is_nan()), "attention_decode with a NaN key: {got:?}");
    }
}

/// The head shapes `(N_HEADS, N_KV_HEADS, HEAD_DIM)` both attention checks run: head counts
/// that are not powers of two, grouped-query attention, head dims that are not multiples of 8.
#[macro_export]
macro_rules! attention_shapes {
    ($callback:ident!($($args:tt)*)) => {
        $crate::$callback!($($args)*,
            (1, 1, 8) (3, 3, 16) (3, 1, 6) (6, 3, 6) (9, 3, 12) (8, 4, 8) (4, 2, 32) (2, 1, 64) (2, 1, 3));
    };
}

#[macro_export]
macro_rules! conform_attention_prefill_f32 {
    ($candidate:ident, $reference:ident) => {
        $crate::attention_shapes!(conform_attention_prefill_f32!(@shapes $candidate, $reference, attention_prefill));
    };
    (@shapes $candidate:ident, $reference:ident, $function:ident, $(($h:literal, $kv:literal, $d:literal))*) => {
        $(
            $crate::check::attention_prefill::<_, $h, $kv, $d>(
                $crate::kernels::$candidate::$function::<$h, $kv, $d>,
                $crate::kernels::$reference::$function::<$h, $kv, $d>,
            );
        )*
    };
}

/// `attention_prefill<bf16>`: the check of `attention_prefill` over a bfloat16 cache.
#[macro_export]
macro_rules! conform_attention_prefill_bf16 {
    ($candidate:ident, $reference:ident) => {
        $crate::attention_shapes!(conform_attention_prefill_f32!(@shapes $candidate, $reference, attention_prefill));
    };
}

#[macro_export]
macro_rules! conform_attention_decode_f32 {
    ($candidate:ident, $reference:ident) => {
        $crate::attention_shapes!(conform_attention_decode_f32!(@shapes $candidate, $reference, attention_decode));
    };
    (@shapes $candidate:ident, $reference:ident, $function:ident, $(($h:literal, $kv:literal, $d:literal))*) => {
        $(
            $crate::check::attention_decode::<_, $h, $kv, $d>(
                $crate::kernels::$candidate::$function::<$h, $kv, $d>,
                $crate::kernels::$reference::$function::<$h, $kv, $d>,
            );
        )*
    };
}

/// `attention_decode<bf16>`: the check of `attention_decode` over a bfloat16 cache.
#[macro_export]
macro_rules! conform_attention_decode_bf16 {
    ($candidate:ident, $reference:ident) => {
        $crate::attention_shapes!(conform_attention_decode_f32!(@shapes $candidate, $reference, attention_decode));
    };
}

/// Checks an `rmsnorm` at `DIM`, with rows of ordinary, large and tiny magnitude (where
/// `eps` matters).
pub fn rmsnorm<const DIM: usize>(
    candidate: impl Fn(&mut [f32], &[f32], &[f32], f32, usize),
    reference: impl Fn(&mut [f32], &[f32], &[f32], f32, usize),
) {
    let mut rng = Rng::for_shape(&[3, DIM]);
    let weight = rng.vec(DIM, 2.0);
    for (rows, eps, amplitude) in [(1, 1e-5, 1.0), (2, 1e-6, 30.0), (7, 1e-5, 0.01)] {
        let x = rng.vec(rows * DIM, amplitude);
        let what = format!("rmsnorm DIM={DIM} rows={rows} eps={eps} amplitude={amplitude}");
        let got = output_of(rows * DIM, |out| candidate(out, &x, &weight, eps, rows));
        let want = output_of(rows * DIM, |out| reference(out, &x, &weight, eps, rows));
        assert_close(&format!("{what}, against the reference"), &got, &want, TOLERANCE);
        let mut exact = Vec::with_capacity(rows * DIM);
        for row in x.chunks_exact(DIM) {
            let mean_square = dot_f64(row, row) / DIM as f64;
            let inv = 1.0 / (mean_square + f64::from(eps)).sqrt();
            exact.extend(row.iter().zip(&weight).map(|(&v, &w)| (f64::from(w) * f64::from(v) * inv) as f32));
        }
        assert_close(&format!("{what}, against f64"), &got, &exact, TOLERANCE);
    }
}

#[macro_export]
macro_rules! conform_rmsnorm {
    ($candidate:ident, $reference:ident) => {
        $crate::conform_rmsnorm!(@shapes $candidate, $reference, 1 3 8 17 64 172 288);
    };
    (@shapes $candidate:ident, $reference:ident, $($dim:literal)*) => {
        $(
            $crate::check::rmsnorm::<$dim>(
                $crate::kernels::$candidate::rmsnorm::<$dim>,
                $crate::kernels::$reference::rmsnorm::<$dim>,
            );
        )*
    };
}

/// Checks a `rope` implementation at the given heads: its tables against the reference's
/// (and against angles computed in f64, within the rounding of an f32 angle), and its
/// rotation, applied with the reference's tables, against the reference's rotation.
#[allow(clippy::type_complexity)]
pub fn rope<const N_HEADS: usize, const HEAD_DIM: usize>(
    candidate_table: impl Fn(f32, usize) -> (Vec<f32>, Vec<f32>),
    candidate_from: impl Fn(&[f32], usize) -> (Vec<f32>, Vec<f32>),
    candidate: impl Fn(&mut [f32], &[f32], &[f32], usize, usize),
    reference_table: impl Fn(f32, usize) -> (Vec<f32>, Vec<f32>),
    reference: impl Fn(&mut [f32], &[f32], &[f32], usize, usize),
) {
    const POSITIONS: usize = 300;
    let half = HEAD_DIM / 2;
    let row_len = N_HEADS * HEAD_DIM;
    let mut rng = Rng::for_shape(&[4, N_HEADS, HEAD_DIM]);
    // Tables from given (scaled) inverse frequencies, against f64 angles.
    let inv_freq: Vec<f32> = (0..half).map(|i| 0.7f32.powi(i as i32) / 3.0).collect();
    let (cos, sin) = candidate_from(&inv_freq, POSITIONS);
    let angles: Vec<f64> =
        (0..POSITIONS * half).map(|at| f64::from((at / half) as f32 * inv_freq[at % half])).collect();
    let what = format!("rope_table_from HEAD_DIM={HEAD_DIM}");
    assert_close(
        &format!("{what}: cos"),
        &cos,
        &angles.iter().map(|a| a.cos() as f32).collect::<Vec<_>>(),
        1e-6,
    );
    assert_close(
        &format!("{what}: sin"),
        &sin,
        &angles.iter().map(|a| a.sin() as f32).collect::<Vec<_>>(),
        1e-6,
    );
    for theta in [10_000.0f32, 500_000.0] {
        let what = format!("rope N_HEADS={N_HEADS} HEAD_DIM={HEAD_DIM} theta={theta}");
        let (cos, sin) = candidate_table(theta, POSITIONS);
        let (ref_cos, ref_sin) = reference_table(theta, POSITIONS);
        assert_close(&format!("{what}: cos table, against the reference"), &cos, &ref_cos, 1e-6);
        assert_close(&format!("{what}: sin table, against the reference"), &sin, &ref_sin, 1e-6);
        let angles: Vec<f64> = (0..POSITIONS * half)
            .map(|at| {
                let (p, i) = (at / half, at % half);
                p as f64 * f64::from(theta).powf(-((2 * i) as f64) / HEAD_DIM as f64)
            })
            .collect();
        let exact_cos: Vec<f32> = angles.iter().map(|a| a.cos() as f32).collect();
        let exact_sin: Vec<f32> = angles.iter().map(|a| a.sin() as f32).collect();
        assert_close(&format!("{what}: cos table, against f64 angles"), &cos, &exact_cos, 1e-4);
        assert_close(&format!("{what}: sin table, against f64 angles"), &sin, &exact_sin, 1e-4);

        for (start, rows) in [(0, 1), (0, 7), (5, 3), (290, 10)] {
            let what = format!("{what} start={start} rows={rows}");
            let x = rng.vec(rows * row_len, 2.0);
            let mut got = x.clone();
            candidate(&mut got, &ref_cos, &ref_sin, start, rows);
            let mut want = x.clone();
            reference(&mut want, &ref_cos, &ref_sin, start, rows);
            assert_close(&format!("{what}, against the reference"), &got, &want, 1e-6);
            let mut exact = x.clone();
            for (r, row) in exact.chunks_exact_mut(row_len).enumerate() {
                let at = (start + r) * half;
                for head in row.chunks_exact_mut(HEAD_DIM) {
                    for i in 0..half {
                        let (c, s) = (f64::from(ref_cos[at + i]), f64::from(ref_sin[at + i]));
                        let (x0, x1) = (f64::from(head[i]), f64::from(head[i + half]));
                        head[i] = (x0 * c - x1 * s) as f32;
                        head[i + half] = (x1 * c + x0 * s) as f32;
                    }
                }
            }
            assert_close(&format!("{what}, against f64"), &got, &exact, 1e-6);
        }
    }
}

#[macro_export]
macro_rules! conform_rope {
    ($candidate:ident, $reference:ident) => {
        $crate::conform_rope!(@shapes $candidate, $reference, (1, 2) (3, 6) (8, 8) (4, 16) (9, 12) (2, 64));
    };
    (@shapes $candidate:ident, $reference:ident, $(($h:literal, $d:literal))*) => {
        $(
            $crate::check::rope::<$h, $d>(
                $crate::kernels::$candidate::rope_table::<$d>,
                $crate::kernels::$candidate::rope_table_from::<$d>,
                $crate::kernels::$candidate::rope::<$h, $d>,
                $crate::kernels::$reference::rope_table::<$d>,
                $crate::kernels::$reference::rope::<$h, $d>,
            );
        )*
    };
}

/// Checks a `swiglu` at `HIDDEN`, with gates reaching into both tails of the sigmoid.
pub fn swiglu<const HIDDEN: usize>(
    candidate: impl Fn(&mut [f32], &[f32], usize),
    reference: impl Fn(&mut [f32], &[f32], usize),
) {
    let mut rng = Rng::for_shape(&[5, HIDDEN]);
    for rows in [1, 2, 7] {
        let gate = rng.vec(rows * HIDDEN, 12.0);
        let up = rng.vec(rows * HIDDEN, 2.0);
        let what = format!("swiglu HIDDEN={HIDDEN} rows={rows}");
        let mut got = gate.clone();
        candidate(&mut got, &up, rows);
        let mut want = gate.clone();
        reference(&mut want, &up, rows);
        assert_close(&format!("{what}, against the reference"), &got, &want, TOLERANCE);
        let exact: Vec<f32> = gate
            .iter()
            .zip(&up)
            .map(|(&g, &u)| {
                let g = f64::from(g);
                (g / (1.0 + (-g).exp()) * f64::from(u)) as f32
            })
            .collect();
        assert_close(&format!("{what}, against f64"), &got, &exact, TOLERANCE);
    }
}

#[macro_export]
macro_rules! conform_swiglu {
    ($candidate:ident, $reference:ident) => {
        // At the last width, 7 rows are enough work for a SwiGLU that shares its rows with the
        // team (`swiglu/avx512-threads`) to share them.
        $crate::conform_swiglu!(@shapes $candidate, $reference, 1 3 8 17 64 172 1376);
    };
    (@shapes $candidate:ident, $reference:ident, $($hidden:literal)*) => {
        $(
            $crate::check::swiglu::<$hidden>(
                $crate::kernels::$candidate::swiglu::<$hidden>,
                $crate::kernels::$reference::swiglu::<$hidden>,
            );
        )*
    };
}

/// One step of a script that a KV cache replays.
pub enum KvStep {
    /// `store(start, k, v)`.
    Store { start: usize, k: Vec<f32>, v: Vec<f32> },
    /// Read `keys(len)` and `values(len)`.
    Read(usize),
}

/// Values whose rounding to bfloat16 is easy to get wrong, stored first by the KV cache check:
/// NaN (one whose low payload bits would carry into the exponent, and one whose would overflow
/// the whole word), infinities, signed zeros, ties to even in both directions, the largest f32
/// (which rounds to ∞), a subnormal.
const SPECIAL_VALUES: [f32; 12] = [
    f32::NAN,
    f32::from_bits(0x7f80_0001),
    f32::from_bits(0xffff_ffff),
    f32::INFINITY,
    f32::NEG_INFINITY,
    -0.0,
    1.0 + 1.0 / 256.0,
    1.0 + 3.0 / 256.0,
    -(1.0 + 3.0 / 256.0),
    f32::MAX,
    1e-40,
    0.0,
];

/// Checks a `KvCache` (of `kv_cache`, or of `kv_cache<bf16>`: values of `E`) at `MAX_SEQ`,
/// `KV_DIM`: both replay the same script of stores (a prompt in chunks, the first holding
/// [`SPECIAL_VALUES`], decode steps, a rewind that overwrites) and reads, and every read must
/// match the reference and a plain model of the cache exactly (each value as
/// [`Cached::from_f32`] holds it; NaN as any NaN).
pub fn kv_cache<E: Cached, const MAX_SEQ: usize, const KV_DIM: usize>(
    candidate: impl Fn(&[KvStep]) -> Vec<(Vec<E>, Vec<E>)>,
    reference: impl Fn(&[KvStep]) -> Vec<(Vec<E>, Vec<E>)>,
) {
    let mut rng = Rng::for_shape(&[6, MAX_SEQ, KV_DIM]);
    let mut script = vec![KvStep::Read(0)];
    let mut model_keys = vec![0.0; MAX_SEQ * KV_DIM];
    let mut model_values = vec![0.0; MAX_SEQ * KV_DIM];
    let mut expected = vec![(Vec::new(), Vec::new())];
    let mut end = 0;
    let rewind_at = MAX_SEQ / 2;
    let mut rewound = false;
    while end < MAX_SEQ {
        // A chunk of up to 17 positions, then a rewind to the middle once.
        let rows = 1 + rng.below((MAX_SEQ - end).min(17));
        let (mut k, mut v) = (rng.vec(rows * KV_DIM, 1.0), rng.vec(rows * KV_DIM, 1.0));
        if end == 0 {
            for (slot, special) in k.iter_mut().zip(SPECIAL_VALUES) {
                *slot = special;
            }
            for (slot, special) in v.iter_mut().rev().zip(SPECIAL_VALUES) {
                *slot = special;
            }
        }
        model_keys[end * KV_DIM..][..k.len()].copy_from_slice(&k);
        model_values[end * KV_DIM..][..v.len()].copy_from_slice(&v);
        script.push(KvStep::Store { start: end, k, v });
        end += rows;
        for len in [end, rng.below(end) + 1] {
            script.push(KvStep::Read(len));
            expected.push((
                cached::<E>(model_keys[..len * KV_DIM].to_vec()),
                cached::<E>(model_values[..len * KV_DIM].to_vec()),
            ));
        }
        if !rewound && end > rewind_at {
            rewound = true;
            end = rewind_at;
        }
    }
    let what = format!("kv_cache MAX_SEQ={MAX_SEQ} KV_DIM={KV_DIM}");
    let same = |a: &[(Vec<E>, Vec<E>)], b: &[(Vec<E>, Vec<E>)]| {
        let equal = |x: &[E], y: &[E]| {
            x.len() == y.len()
                && x.iter().zip(y).all(|(p, q)| {
                    let (p, q) = (p.to_f32(), q.to_f32());
                    (p.is_nan() && q.is_nan()) || p.to_bits() == q.to_bits()
                })
        };
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| equal(&x.0, &y.0) && equal(&x.1, &y.1))
    };
    let got = candidate(&script);
    assert!(same(&got, &reference(&script)), "{what}: the reads differ from the reference's");
    assert!(same(&got, &expected), "{what}: the reads differ from what was stored");
}

#[macro_export]
macro_rules! conform_kv_cache_f32 {
    ($candidate:ident, $reference:ident) => {
        // The last shape's chunks of 8 positions and more are large enough for a cache that
        // shares its stores with the team (`shared/kv_split.rs`) to share them.
        $crate::conform_kv_cache_f32!(@shapes $candidate, $reference, (1, 1) (7, 6) (16, 8) (300, 32) (160, 256));
    };
    (@shapes $candidate:ident, $reference:ident, $(($max:literal, $dim:literal))*) => {
        $(
            $crate::check::kv_cache::<_, $max, $dim>(
                $crate::conform_kv_cache_f32!(@replay $candidate, $max, $dim),
                $crate::conform_kv_cache_f32!(@replay $reference, $max, $dim),
            );
        )*
    };
    (@replay $module:ident, $max:literal, $dim:literal) => {
        |script: &[$crate::check::KvStep]| {
            let mut cache = $crate::kernels::$module::KvCache::<$max, $dim>::new();
            let mut reads = Vec::new();
            for step in script {
                match step {
                    $crate::check::KvStep::Store { start, k, v } => cache.store(*start, k, v),
                    $crate::check::KvStep::Read(len) => {
                        reads.push((cache.keys(*len).to_vec(), cache.values(*len).to_vec()))
                    }
                }
            }
            reads
        }
    };
}

/// `kv_cache<bf16>`: the check of `kv_cache`, each value as the nearest bfloat16.
#[macro_export]
macro_rules! conform_kv_cache_bf16 {
    ($candidate:ident, $reference:ident) => {
        $crate::conform_kv_cache_f32!($candidate, $reference);
    };
}

/// Checks a `sample` at `VOCAB`: over random logits (some with ties) and a grid of
/// temperatures, top-k, top-p and coins, it must pick exactly the reference's token.
pub fn sampler<const VOCAB: usize>(
    candidate: impl Fn(&[f32], f32, usize, f32, f32, &mut Vec<(f32, u32)>) -> u32,
    reference: impl Fn(&[f32], f32, usize, f32, f32, &mut Vec<(f32, u32)>) -> u32,
) {
    let mut rng = Rng::for_shape(&[7, VOCAB]);
    let (mut scratch, mut reference_scratch) = (Vec::new(), Vec::new());
    for trial in 0..6 {
        let mut logits = rng.vec(VOCAB, 4.0);
        if trial % 2 == 1 {
            // Logits on a grid of 0.5, so that many are equal.
            for logit in &mut logits {
                *logit = (*logit * 2.0).round() / 2.0;
            }
        }
        for temperature in [0.0, 0.5, 1.0, 1.7] {
            for top_k in [0, 1, 3, 40] {
                for top_p in [1.0, 0.9, 0.5, 0.05] {
                    for coin in [0.0, rng.unit(), 0.999_999] {
                        let id = candidate(&logits, temperature, top_k, top_p, coin, &mut scratch);
                        let want =
                            reference(&logits, temperature, top_k, top_p, coin, &mut reference_scratch);
                        assert!((id as usize) < VOCAB, "sampler VOCAB={VOCAB}: id {id} is out of range");
                        assert_eq!(
                            id, want,
                            "sampler VOCAB={VOCAB} trial={trial} temperature={temperature} top_k={top_k} top_p={top_p} coin={coin}"
                        );
                    }
                }
            }
        }
    }
}

#[macro_export]
macro_rules! conform_sampler {
    ($candidate:ident, $reference:ident) => {
        $crate::conform_sampler!(@shapes $candidate, $reference, 1 2 5 32 512);
    };
    (@shapes $candidate:ident, $reference:ident, $($vocab:literal)*) => {
        $(
            $crate::check::sampler::<$vocab>(
                $crate::kernels::$candidate::sample::<$vocab>,
                $crate::kernels::$reference::sample::<$vocab>,
            );
        )*
    };
}
