//! The AMX product's split of each activation into three bfloat16 terms must keep what an f32
//! product does with values that are not finite: a signalling NaN whose payload lies wholly
//! below the first term's 16 bits (cut off, it would read as an infinity), a quiet NaN, and
//! both infinities.

use monogen_kernel_tests::{cpu_has, kernels};

#[test]
fn amx_products_keep_nans_and_infinities_as_the_reference_does() {
    if !cpu_has!("avx512f", "avx512bw", "amx-tile", "amx-bf16") {
        monogen_tests::skip::cpu(
            "amx_products_keep_nans_and_infinities_as_the_reference_does",
            &["avx512f", "avx512bw", "amx-tile", "amx-bf16"],
        );
        return;
    }
    const N: usize = 16;
    const K: usize = 64;
    let rows = 32;
    // Weights of 1.0 and -0.5, so that every row's sum has a known sign.
    let w: Vec<u16> = (0..N * K).map(|i| if i % 3 == 0 { 0xbf00 } else { 0x3f80 }).collect();
    let mut x = vec![0.25f32; rows * K];
    let specials = [
        f32::from_bits(0x7f80_0001),
        f32::from_bits(0xff80_0001),
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ];
    for (r, &v) in specials.iter().enumerate() {
        x[r * K + r] = v;
    }
    let (mut got, mut want) = (vec![0.0; rows * N], vec![0.0; rows * N]);
    let packed = kernels::matmul__bf16_amx_threads::pack(&w, N, K);
    kernels::matmul__bf16_amx_threads::matmul::<N, K>(&mut got, &x, &packed, rows);
    kernels::matmul__bf16_scalar::matmul::<N, K>(&mut want, &x, &w, rows);
    for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
        let same = if b.is_nan() { a.is_nan() } else { a == b || (a - b).abs() <= 1e-5 * (1.0 + b.abs()) };
        assert!(same, "row {}, column {}: {a} on AMX tiles, {b} in the reference", i / N, i % N);
    }
    assert!(want[0].is_nan() && want[3 * N].is_infinite(), "the cases are what they claim");
}
