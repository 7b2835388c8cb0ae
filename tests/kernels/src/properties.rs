//! Properties of particular implementations that the conformance checks, which compare
//! implementations with each other, cannot see.

use crate::check::{TOLERANCE, assert_close};
use crate::kernels;
use crate::rng::Rng;

/// Prefill of one row at `start` must equal decode over `start + 1` positions.
macro_rules! prefill_of_one_row_is_decode {
    ($prefill:ident, $decode:ident, $(($h:literal, $kv:literal, $d:literal))*) => {
        $({
            let (q_dim, kv_dim) = ($h * $d, $kv * $d);
            let mut rng = Rng::for_shape(&[8, $h, $kv, $d]);
            for len in [1, 2, 9, 100, 192] {
                let q = rng.vec(q_dim, 2.0);
                let keys = rng.vec(len * kv_dim, 2.0);
                let values = rng.vec(len * kv_dim, 1.0);
                let mut prefill = vec![f32::NAN; q_dim];
                let mut scores = vec![f32::NAN; len];
                kernels::$prefill::attention_prefill::<$h, $kv, $d>(&mut prefill, &q, &keys, &values, &mut scores, len - 1, 1);
                let mut decode = vec![f32::NAN; q_dim];
                kernels::$decode::attention_decode::<$h, $kv, $d>(&mut decode, &q, &keys, &values, &mut scores);
                let what = format!("{} rows=1 against {}, heads ({}, {}, {}) len={len}", stringify!($prefill), stringify!($decode), $h, $kv, $d);
                assert_close(&what, &prefill, &decode, TOLERANCE);
            }
        })*
    };
}

#[test]
fn scalar_prefill_of_one_row_is_decode() {
    prefill_of_one_row_is_decode!(
        attention_prefill__scalar__f32,
        attention_decode__scalar__f32,
        (8, 4, 8)(9, 3, 12)(2, 1, 64)
    );
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_prefill_of_one_row_is_decode() {
    if !crate::cpu_has!("avx2", "fma") {
        monogen_tests::skip::cpu("avx2_prefill_of_one_row_is_decode", &["avx2", "fma"]);
        return;
    }
    prefill_of_one_row_is_decode!(
        attention_prefill__avx2_fma,
        attention_decode__avx2_fma,
        (8, 4, 8)(9, 3, 12)(2, 1, 64)(3, 1, 6)
    );
}

/// The vectorised exp of `avx2_math` stays within 2 ulp of the exact value in its range.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_exp_is_accurate() {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    fn exp8(x: [f32; 8]) -> [f32; 8] {
        let mut out = [0.0; 8];
        // SAFETY: `x` and `out` are 8 floats each.
        unsafe {
            _mm256_storeu_ps(out.as_mut_ptr(), kernels::shared::avx2_math::exp(_mm256_loadu_ps(x.as_ptr())))
        };
        out
    }

    /// The distance from `got` to the exact `e^x`, in units of the last place of `e^x` in f32.
    fn ulps(got: f32, x: f32) -> f64 {
        let exact = f64::from(x).exp();
        let ulp = f64::from(f32::from_bits((exact as f32).to_bits() + 1) - exact as f32);
        (f64::from(got) - exact).abs() / ulp
    }

    if !crate::cpu_has!("avx2", "fma") {
        monogen_tests::skip::cpu("avx2_exp_is_accurate", &["avx2", "fma"]);
        return;
    }
    // SAFETY (of every `exp8` call): this CPU has AVX2 and FMA, checked above.
    let exp = |x: [f32; 8]| unsafe { exp8(x) };
    let (low, high) = (-87.0f32, 88.0f32);
    let steps = 200_000;
    let mut worst = (0.0f64, 0.0f32);
    for chunk in 0..steps / 8 {
        let x: [f32; 8] = std::array::from_fn(|i| low + (high - low) * (chunk * 8 + i) as f32 / steps as f32);
        for (&x, got) in x.iter().zip(exp(x)) {
            let error = ulps(got, x);
            if error > worst.0 {
                worst = (error, x);
            }
        }
    }
    assert!(worst.0 <= 2.0, "exp is {} ulp off at {}", worst.0, worst.1);
    let special = exp([0.0, -0.0, 1.0, -1.0, f32::NAN, -1000.0, 1000.0, f32::NEG_INFINITY]);
    assert_eq!(&special[..2], &[1.0, 1.0]);
    assert!(ulps(special[2], 1.0) <= 1.0 && ulps(special[3], -1.0) <= 1.0);
    assert!(special[4].is_nan());
    assert!(special[5] > 0.0 && special[5] < 1e-37, "clamped below: {}", special[5]);
    assert!(special[6].is_finite() && special[6] > 1e38, "clamped above: {}", special[6]);
    assert!(special[7] >= 0.0 && special[7] < 1e-37);
}

mod sampler {
    use crate::kernels::sampler__scalar::sample;
    use crate::rng::Rng;

    fn greedy<const VOCAB: usize>(logits: &[f32]) -> u32 {
        sample::<VOCAB>(logits, 0.0, 0, 1.0, 0.5, &mut Vec::new())
    }

    #[test]
    fn greedy_takes_the_first_of_equal_maxima() {
        assert_eq!(greedy::<5>(&[0.5, 2.0, -1.0, 2.0, 2.0]), 1);
        assert_eq!(greedy::<4>(&[3.0; 4]), 0);
        assert_eq!(greedy::<3>(&[f32::NEG_INFINITY, -5.0, -5.0]), 1);
        assert_eq!(greedy::<1>(&[7.0]), 0);
    }

    #[test]
    fn top_k_of_one_is_greedy() {
        let mut rng = Rng::new(1);
        let mut scratch = Vec::new();
        for _ in 0..50 {
            let logits = rng.vec(512, 5.0);
            let best = greedy::<512>(&logits);
            for temperature in [0.3, 1.0, 2.5] {
                let coin = rng.unit();
                assert_eq!(sample::<512>(&logits, temperature, 1, 1.0, coin, &mut scratch), best);
            }
        }
    }

    #[test]
    fn a_tiny_temperature_is_greedy() {
        let mut rng = Rng::new(3);
        let mut scratch = Vec::new();
        for _ in 0..50 {
            let logits = rng.vec(512, 5.0);
            let best = greedy::<512>(&logits);
            for temperature in [1e-40, 1e-30, 1e-6] {
                let coin = rng.unit();
                assert_eq!(
                    sample::<512>(&logits, temperature, 0, 1.0, coin, &mut scratch),
                    best,
                    "T = {temperature}"
                );
            }
        }
    }

    #[test]
    fn a_tiny_top_p_is_greedy() {
        let mut rng = Rng::new(2);
        let mut scratch = Vec::new();
        for _ in 0..50 {
            let logits = rng.vec(64, 5.0);
            let coin = rng.unit();
            assert_eq!(sample::<64>(&logits, 1.0, 0, 1e-6, coin, &mut scratch), greedy::<64>(&logits));
        }
    }

    #[test]
    fn the_same_coin_gives_the_same_token() {
        let mut rng = Rng::new(3);
        let logits = rng.vec(512, 3.0);
        let mut scratch = Vec::new();
        for _ in 0..20 {
            let coin = rng.unit();
            let first = sample::<512>(&logits, 0.8, 40, 0.9, coin, &mut scratch);
            for _ in 0..3 {
                assert_eq!(sample::<512>(&logits, 0.8, 40, 0.9, coin, &mut scratch), first);
            }
        }
    }

    #[test]
    fn different_coins_cover_different_tokens() {
        // Equal logits: every token is equally likely, in id order, so coin c picks ⌊8c⌋.
        let mut scratch = Vec::new();
        for id in 0..8u32 {
            let coin = (id as f32 + 0.5) / 8.0;
            assert_eq!(sample::<8>(&[1.5; 8], 1.0, 0, 1.0, coin, &mut scratch), id);
        }
        // Random logits: a sweep of coins visits many tokens, most likely first, so the
        // probability of the picked token never grows along the sweep.
        let mut rng = Rng::new(4);
        let logits = rng.vec(32, 1.0);
        let mut picked = Vec::new();
        for i in 0..1000 {
            let id = sample::<32>(&logits, 1.0, 0, 1.0, i as f32 / 1000.0, &mut scratch);
            if picked.last() != Some(&id) {
                picked.push(id);
            }
        }
        assert!(picked.len() >= 20, "a sweep of coins visited only {picked:?}");
        assert!(
            picked.windows(2).all(|w| logits[w[0] as usize] >= logits[w[1] as usize]),
            "not in order of descending probability: {picked:?}"
        );
        // top_k = 3 keeps the sweep to the 3 most likely tokens.
        let mut kept: Vec<u32> =
            (0..1000).map(|i| sample::<32>(&logits, 1.0, 3, 1.0, i as f32 / 1000.0, &mut scratch)).collect();
        kept.dedup();
        assert_eq!(kept, picked[..3].to_vec());
    }
}

/// The int8 packing kernel stores each scale in binary16: exactly for the binary16 values that
/// `matmul<q8>`'s scales are, and otherwise rounded to nearest as F16C's `vcvtps2ph` rounds
/// (which this compares with, over every binary16 value and values near each).
#[cfg(target_arch = "x86_64")]
#[test]
fn int8_packed_scales_convert_to_binary16_as_f16c_does() {
    use std::arch::x86_64::*;

    use kernels::shared::q8_packed::binary16;
    if !std::arch::is_x86_feature_detected!("f16c") {
        monogen_tests::skip::cpu("int8_packed_scales_convert_to_binary16_as_f16c_does", &["f16c"]);
        return;
    }
    #[target_feature(enable = "f16c")]
    fn narrow(v: f32) -> u16 {
        _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set1_ps(v))) as u16
    }
    #[target_feature(enable = "f16c")]
    fn widen(bits: u16) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(bits as i16)))
    }
    let mut rng = Rng::for_shape(&[16]);
    for bits in 0..=u16::MAX {
        // SAFETY: the CPU has F16C (checked above).
        let v = unsafe { widen(bits) };
        if v.is_nan() {
            continue;
        }
        assert_eq!(binary16(v), bits, "{v:e} is binary16 {bits:#06x}");
        let near = v * (1.0 + rng.vec(1, 1e-3)[0]);
        // SAFETY: as above.
        assert_eq!(binary16(near), unsafe { narrow(near) }, "{near:e}");
    }
    // Ties, below the smallest step, the largest value and past it.
    for v in [1e-9f32, 2.980_232_2e-8, 8.940_697e-8, 6.1e-5, 65504.0, 65519.0, 65520.0, 1e6, f32::INFINITY] {
        // SAFETY: as above.
        assert_eq!(binary16(v), unsafe { narrow(v) }, "{v:e}");
    }
}

mod speculator {
    use crate::kernels::speculator__prompt_lookup::draft;
    use crate::rng::Rng;

    fn drafted<const MAX: usize, const MIN: usize>(context: &[u32], max: usize) -> Vec<u32> {
        let mut out = vec![99];
        draft::<MAX, MIN>(context, max, &mut out);
        assert_eq!(out[0], 99, "draft appends, and leaves what `out` held");
        out.split_off(1)
    }

    #[test]
    fn copies_what_followed_the_latest_occurrence_of_the_longest_suffix() {
        // "5 6" recurs at 1 (followed by 7 8 9) and at 6 (followed by 1 2): the latest wins.
        let context = [4, 5, 6, 7, 8, 9, 5, 6, 1, 2, 3, 5, 6];
        assert_eq!(drafted::<3, 1>(&context, 2), [1, 2]);
        // Past the context's end the copy reads itself: the period of 5 tokens goes on.
        assert_eq!(drafted::<3, 1>(&context, 12), [1, 2, 3, 5, 6, 1, 2, 3, 5, 6, 1, 2]);
        // "3 5 6" recurs nowhere, "5 6" does: a longer n is tried first, then shorter ones.
        let context = [3, 5, 6, 0, 5, 6, 7, 9, 3, 5, 6];
        assert_eq!(drafted::<3, 1>(&context, 3), [0, 5, 6], "the 3-gram 3 5 6 wins over the later 5 6");
        assert_eq!(drafted::<2, 1>(&context, 3), [7, 9, 3], "without 3-grams, the latest 5 6");
    }

    #[test]
    fn drafts_nothing_without_a_recurring_n_gram() {
        assert!(drafted::<3, 1>(&[1, 2, 3, 4, 5], 4).is_empty());
        assert!(drafted::<3, 2>(&[1, 2, 3, 1, 9, 2, 3, 1, 4, 1], 4).is_empty(), "only the 1-gram 1 recurs");
        assert_eq!(drafted::<3, 1>(&[1, 2, 3, 1, 9, 2, 3, 1, 4, 1], 4), [4, 1, 4, 1]);
        assert!(drafted::<3, 1>(&[], 4).is_empty());
        assert!(drafted::<3, 1>(&[7], 4).is_empty());
        assert!(drafted::<3, 1>(&[1, 2, 1, 2], 0).is_empty(), "max 0 drafts nothing");
    }

    #[test]
    fn a_repeated_token_drafts_more_of_itself() {
        assert_eq!(drafted::<3, 1>(&[8, 8, 8, 8, 8], 6), [8; 6], "a period of one token");
        assert_eq!(drafted::<1, 1>(&[2, 8, 8], 4), [8; 4]);
        assert_eq!(drafted::<2, 2>(&[5, 1, 2, 1, 2], 5), [1, 2, 1, 2, 1], "a period of two");
    }

    #[test]
    fn every_draft_is_a_copy_of_context_following_a_match() {
        let mut rng = Rng::new(11);
        for _ in 0..500 {
            let len = 1 + (rng.unit() * 60.0) as usize;
            let context: Vec<u32> = (0..len).map(|_| (rng.unit() * 4.0) as u32).collect();
            let max = (rng.unit() * 6.0) as usize;
            let out = drafted::<3, 2>(&context, max);
            if max == 0 {
                assert!(out.is_empty());
                continue;
            }
            if out.is_empty() {
                // no 2- or 3-gram suffix recurs with a token after it
                for n in 2..=3.min(len.saturating_sub(1)) {
                    let suffix = &context[len - n..];
                    assert!(!(0..len - n).any(|s| &context[s..s + n] == suffix), "{context:?} max {max}");
                }
                continue;
            }
            assert_eq!(out.len(), max, "a match drafts `max` tokens");
            // out is what followed an earlier occurrence of a 2- or 3-token suffix, the copy
            // reading itself past the context's end
            let hit = (0..len).any(|from| {
                (2..=3).any(|n| {
                    let copy =
                        |i: usize| if from + i < len { context[from + i] } else { out[from + i - len] };
                    from >= n
                        && from < len
                        && context[from - n..from] == context[len - n..]
                        && (0..max).all(|i| out[i] == copy(i))
                })
            });
            assert!(hit, "{context:?} drafted {out:?}");
        }
    }
}
