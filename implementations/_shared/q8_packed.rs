//! The layout of blockwise int8 weights packed once, at load, that the packed `matmul<q8>`
//! products read: `avx512_q8_packed.rs` in groups of 16 weight rows, `avx2_q8_packed.rs` in
//! groups of 8, the rows of a group one per 32-bit lane of a vector. Plain Rust: packing and
//! checking run at load, on any CPU.
//!
//! Each group holds its scales, then its blocks of 32 values of K one after the other, so that
//! a thread reads its share as one stream with nothing beside it:
//!
//! - **The scales**: per block, the group's rows' scales as binary16 (the interface's scales
//!   are binary16 values, so this is exact), padded to whole cache lines. Kept together, they
//!   are what a load of a saved model reads to check them, in runs of lines.
//! - **A block**: 8 vectors; vector `s` holds values `4s..4s + 4` of the block for the
//!   group's rows, lane by lane, as signed bytes or (`Layout::pack`'s `offset`) plus 128, as
//!   unsigned bytes (the bits of the int8 value with the sign bit flipped).
//!
//! So a block of 32 values of a row takes 34 bytes, against 36 with its scale in f32. Rows past
//! `n` and values past `k` are zero weights with scale 0.
#![allow(dead_code)]

/// Values of K that share one scale.
pub const BLOCK: usize = 32;

/// The packed layout of groups of `GROUP` weight rows.
pub struct Layout<const GROUP: usize>;

impl<const GROUP: usize> Layout<GROUP> {
    /// Bytes of one block of a group: its rows' 32 values.
    pub const BLOCK_BYTES: usize = GROUP * BLOCK;

    /// Bytes of one block's scales: a binary16 value per row.
    const SCALES: usize = 2 * GROUP;

    /// Bytes of the scales of a group over `blocks` blocks, in whole cache lines.
    pub const fn scale_bytes(blocks: usize) -> usize {
        (blocks * Self::SCALES).next_multiple_of(64)
    }

    /// Bytes of one group over `blocks` blocks: its scales, then its blocks.
    pub const fn group_bytes(blocks: usize) -> usize {
        Self::scale_bytes(blocks) + blocks * Self::BLOCK_BYTES
    }

    /// Offset of block `b`'s values in a group of `blocks` blocks.
    pub const fn block_at(b: usize, blocks: usize) -> usize {
        Self::scale_bytes(blocks) + b * Self::BLOCK_BYTES
    }

    /// Offset of block `b`'s scales in its group.
    pub const fn scales_at(b: usize) -> usize {
        b * Self::SCALES
    }

    /// Bytes of the packed form of `[n, k]` weights: `n` rounded up to a multiple of `GROUP`
    /// by `k` rounded up to a multiple of 32, and each group's lines of scales.
    pub const fn packed_len(n: usize, k: usize) -> usize {
        n.div_ceil(GROUP) * Self::group_bytes(k.div_ceil(BLOCK))
    }

    /// The `[n, k]` int8 weights `w` (values in −127..=127) and their `[n, ⌈k/32⌉]` binary16
    /// scales in this layout, each value plus 128 where `offset` says so: [`Self::packed_len`]
    /// bytes.
    pub fn pack(w: &[i8], scales: &[f32], n: usize, k: usize, offset: bool) -> Vec<i8> {
        let blocks = k.div_ceil(BLOCK);
        assert!(w.len() >= n * k, "pack: w is shorter than {n} rows of {k}");
        assert!(scales.len() >= n * blocks, "pack: scales is shorter than {n} rows of {blocks}");
        // Flipping the sign bit adds 128; a zero weight is then 128, -128 as i8 bits.
        let flip = if offset { i8::MIN } else { 0 };
        let mut values = vec![flip; Self::packed_len(n, k)];
        for (g, group) in values.chunks_exact_mut(Self::group_bytes(blocks)).enumerate() {
            group[..Self::scale_bytes(blocks)].fill(0);
            for lane in 0..GROUP.min(n - g * GROUP) {
                let row = g * GROUP + lane;
                let weights = &w[row * k..(row + 1) * k];
                for b in 0..blocks {
                    let part = &weights[b * BLOCK..k.min((b + 1) * BLOCK)];
                    // 4 values at a time, in the row's lane of each vector.
                    for (s, quad) in part.chunks(4).enumerate() {
                        let at = Self::block_at(b, blocks) + s * 4 * GROUP + lane * 4;
                        for (out, &v) in group[at..at + quad.len()].iter_mut().zip(quad) {
                            *out = v ^ flip;
                        }
                    }
                    let at = Self::scales_at(b) + lane * 2;
                    let [low, high] = binary16(scales[row * blocks + b]).to_le_bytes();
                    group[at] = low as i8;
                    group[at + 1] = high as i8;
                }
            }
        }
        values
    }

    /// Ok when the `packed_len(n, k)` bytes `packed` hold scales (binary16) that are all finite
    /// and not negative, as [`Self::pack`] writes them; else which row and block holds a bad
    /// one.
    pub fn check_packed(packed: &[i8], n: usize, k: usize) -> Result<(), String> {
        if packed.len() != Self::packed_len(n, k) {
            return Err(format!(
                "holds {} bytes, not the {} of {n} × {k} packed weights",
                packed.len(),
                Self::packed_len(n, k)
            ));
        }
        let blocks = k.div_ceil(BLOCK);
        // A scale's bits: finite and not negative is below +∞'s, with the sign bit clear.
        let bad = |s: &[i8]| u16::from_le_bytes([s[0] as u8, s[1] as u8]) >= 0x7c00;
        for (g, group) in packed.chunks_exact(Self::group_bytes(blocks)).enumerate() {
            let scales = &group[..blocks * Self::SCALES];
            // Or-ing the tests, with no early exit, vectorizes; the bad scale is looked for only
            // once there is one.
            if scales.chunks_exact(2).fold(false, |any, s| any | bad(s)) {
                let at = scales.chunks_exact(2).position(bad).unwrap_or(0);
                return Err(format!(
                    "holds a scale that is negative, infinite or NaN (row {}, block {})",
                    g * GROUP + at % GROUP,
                    at / GROUP
                ));
            }
        }
        Ok(())
    }
}

/// `v` as binary16 bits: exact for the binary16 values that `matmul<q8>`'s scales are, rounded
/// to nearest (ties to even) for any other.
pub fn binary16(v: f32) -> u16 {
    let x = v.to_bits();
    // The usual case, a normal binary16 value: the exponent rebiased, the mantissa's top bits.
    let magnitude = x & 0x7fff_ffff;
    if (0x3880_0000..0x4780_0000).contains(&magnitude) && magnitude & 0x1fff == 0 {
        return (((x >> 16) & 0x8000) | ((magnitude >> 13) - (112 << 10))) as u16;
    }
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let mant = x & 0x7f_ffff;
    if exp == 255 {
        return sign | 0x7c00 | if mant != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    let (m, shift) = if e >= 1 { (mant, 13) } else { (mant | 0x80_0000, (14 - e) as u32) };
    if shift > 24 {
        return sign;
    }
    let base = if e >= 1 { ((e as u32) << 10) | (m >> 13) } else { m >> shift };
    let dropped = m & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    let rounded = base + u32::from(dropped > half || (dropped == half && base & 1 == 1));
    sign | rounded.min(0x7c00) as u16
}
