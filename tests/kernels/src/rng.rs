//! A small deterministic random generator for test inputs (SplitMix64).

/// SplitMix64: every seed gives a fixed, well-mixed sequence.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// A seed made of shape parameters, so that every shape gets its own inputs.
    pub fn for_shape(parts: &[usize]) -> Self {
        let seed = parts.iter().fold(0x243f_6a88_85a3_08d3_u64, |s, &p| s.rotate_left(17) ^ p as u64);
        Self::new(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), on a grid of 2⁻²⁴.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in (-amplitude, amplitude), never zero.
    pub fn value(&mut self, amplitude: f32) -> f32 {
        let bits = self.next_u64();
        let magnitude = ((bits >> 41) as f32 + 0.5) / (1u64 << 23) as f32;
        if bits & 1 == 0 { amplitude * magnitude } else { -amplitude * magnitude }
    }

    /// `len` values from [`Rng::value`].
    pub fn vec(&mut self, len: usize, amplitude: f32) -> Vec<f32> {
        (0..len).map(|_| self.value(amplitude)).collect()
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}
