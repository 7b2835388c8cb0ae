//! Reference GELU with the exact error function, evaluated in f64 and rounded once.
//!
//! The standard library has no `erf`, so it is computed here: by its Maclaurin series below
//! 2.5, and above by the continued fraction of `erfc`, both accurate to about 1e-15.

/// Applies `x · ½ · (1 + erf(x / √2))` to `rows` rows of `N` values, in place.
#[inline]
pub fn gelu<const N: usize>(x: &mut [f32], rows: usize) {
    assert!(x.len() >= rows * N, "gelu: x is shorter than {rows} rows of {N}");
    for v in &mut x[..rows * N] {
        let t = f64::from(*v);
        *v = (0.5 * t * (1.0 + erf(t * std::f64::consts::FRAC_1_SQRT_2))) as f32;
    }
}

/// The error function.
fn erf(x: f64) -> f64 {
    let a = x.abs();
    let value = if a < 2.5 {
        // 2/√π · Σₙ (−1)ⁿ a²ⁿ⁺¹ / (n! (2n + 1))
        let a2 = a * a;
        let mut power = a;
        let mut sum = a;
        let mut n = 0.0;
        loop {
            n += 1.0;
            power *= -a2 / n;
            let term = power / (2.0 * n + 1.0);
            sum += term;
            if term.abs() <= 1e-17 * sum.abs() {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else {
        // erfc(a) = e^(−a²) / √π · 1 / (a + ½ / (a + 1 / (a + 3/2 / (a + …)))), from depth 60 up.
        let mut fraction = a;
        for k in (1..=60).rev() {
            fraction = a + f64::from(k) * 0.5 / fraction;
        }
        1.0 - (-a * a).exp() * std::f64::consts::FRAC_2_SQRT_PI * 0.5 / fraction
    };
    value.copysign(x)
}
