//! Blockwise int4 matrices, for a crate whose workload holds its weights in 4 bits
//! (`weights.dtype = "int4"`), in the layout of GGML's Q4_1. Every matrix of the file (F32,
//! BF16 or F16) is quantized once, at load, on `THREADS` threads, into huge pages
//! (`TensorFile::pages_for`): per block of [`BLOCK`] consecutive values of a row, the smallest
//! value is the minimum `m` and the range over 15 the scale `d`, each rounded to the nearest
//! binary16 value, and each value `v` becomes `round((v − m) / d)`, kept in 0..=15, in four
//! bits. A block's 16 bytes hold its first 16 values in their low halves and its last 16 in
//! their high halves, as `matmul<q4>` reads them. A checkpoint that GGML's reference Q4_1
//! quantizer made (a Q4_1 GGUF, dequantized), whose blocks span their whole range, comes back
//! in the same blocks, up to the rounding of each block's range.

use std::ops::Range;

use safetensors::Dtype;

use crate::tensor_file::{TensorFile, widened};
use crate::{Error, THREADS};

/// Values of a row that share one scale; they fill `BLOCK / 2` bytes.
pub const BLOCK: usize = 32;

/// An int4 matrix of `[rows, cols]` values (`[rows, ⌈cols / BLOCK⌉ · 16]` bytes) and
/// `[rows, ⌈cols / BLOCK⌉, 2]` binary16 scales and minimums. Both lie in the huge pages of the
/// [`Storage`](crate::tensor_file::Storage) that [`TensorFile::finish`] returns, or in its
/// mapping of a file that holds them already (as `--save-model` writes it); whoever holds the
/// matrix holds that storage too.
pub struct Q4Tensor {
    values: *const u8,
    len: usize,
    scales: *const u16,
    scales_len: usize,
}

// SAFETY: the values and scales are never written after loading, and their memory lives as
// long as the Storage that the matrix's owner holds.
unsafe impl Send for Q4Tensor {}
// SAFETY: as above; shared reads of immutable memory.
unsafe impl Sync for Q4Tensor {}

impl Q4Tensor {
    /// The bytes of the four-bit values, row-major.
    pub fn values(&self) -> &[u8] {
        // SAFETY: `values` points to `len` bytes, written once at load (or mapped) and alive
        // while the Storage is (see Q4Tensor).
        unsafe { std::slice::from_raw_parts(self.values, self.len) }
    }

    /// The binary16 scale and minimum of each block of each row, row-major.
    pub fn scales(&self) -> &[u16] {
        // SAFETY: as for the values; `scales` is aligned for u16.
        unsafe { std::slice::from_raw_parts(self.scales, self.scales_len) }
    }

    /// Writes row `row`, dequantized (each value times its block's scale, plus its minimum),
    /// into `out`, which holds a row (`cols` values).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        let blocks = out.len().div_ceil(BLOCK);
        let bytes = &self.values()[row * blocks * BLOCK / 2..(row + 1) * blocks * BLOCK / 2];
        let pairs = &self.scales()[row * blocks * 2..(row + 1) * blocks * 2];
        // The value of binary16 `bits`, exactly (finite, as every scale of a loaded matrix is).
        let binary16_value = |bits: u16| {
            let magnitude = match (bits >> 10) & 0x1f {
                0 => f32::from(bits & 0x3ff) * SMALLEST,
                e => f32::from_bits(((u32::from(e) + 127 - 15) << 23) | (u32::from(bits & 0x3ff) << 13)),
            };
            if bits & 0x8000 != 0 { -magnitude } else { magnitude }
        };
        for ((out, bytes), pair) in out.chunks_mut(BLOCK).zip(bytes.chunks_exact(BLOCK / 2)).zip(pairs.chunks_exact(2)) {
            let (scale, minimum) = (binary16_value(pair[0]), binary16_value(pair[1]));
            for (i, o) in out.iter_mut().enumerate() {
                let nibble = if i < BLOCK / 2 { bytes[i] & 0x0f } else { bytes[i - BLOCK / 2] >> 4 };
                *o = scale * f32::from(nibble) + minimum;
            }
        }
    }
}

/// The name of the scales and minimums of int4 matrix `name` in a file that holds it quantized:
/// `….weight_scale` for `….weight`.
pub fn scale_name(name: &str) -> String {
    format!("{name}_scale")
}

impl TensorFile {
    /// The matrix `name`, which must have exactly `shape` (`[rows, cols]`), as int4: quantized
    /// now from F32, BF16 or F16, or mapped where the file holds it as U8 `[rows, ⌈cols / 32⌉ ·
    /// 16]` with its scales and minimums (`scale_name`) as F16 `[rows, ⌈cols / 32⌉, 2]`.
    pub fn q4(&mut self, name: &str, shape: &[usize]) -> Result<Q4Tensor, Error> {
        let &[rows, cols] = shape else { panic!("q4: `{name}` is not a matrix") };
        let [matrix] = self.q4_many([(name, [rows, cols])])?;
        Ok(matrix)
    }

    /// The matrices `matrices` (name and `[rows, cols]`), read as [`TensorFile::q4`] reads
    /// each, those to quantize quantized together: one start of the `THREADS - 1` other
    /// threads for all of them, which a layer's matrices share.
    pub fn q4_many<const M: usize>(&mut self, matrices: [(&str, [usize; 2]); M]) -> Result<[Q4Tensor; M], Error> {
        let dtypes = [Dtype::F32, Dtype::BF16, Dtype::F16, Dtype::U8];
        let expected = "F32, BF16, F16, or U8 with its scales (as `--save-model` writes them)";
        let mut read = Vec::with_capacity(M);
        // What to quantize: the file's dtype and bytes, and the matrix's rows and columns.
        let mut quantize = Vec::new();
        for &(name, [rows, cols]) in &matrices {
            let blocks = cols.div_ceil(BLOCK);
            // A saved model holds the bytes, `[rows, blocks · 16]`; a checkpoint the values.
            let saved = self.entries.get(name).is_some_and(|e| e.dtype == Dtype::U8);
            let shape = if saved { [rows, blocks * BLOCK / 2] } else { [rows, cols] };
            let (dtype, range) = self.checked_as(name, &shape, &dtypes, expected)?;
            if dtype == Dtype::U8 {
                read.push(self.mapped_q4(name, rows, blocks, range)?);
            } else {
                let values = self.pages_for(rows * blocks * BLOCK / 2)?;
                let scales = self.pages_for(rows * blocks * 2 * 2)?.cast::<u16>();
                let matrix = Q4Tensor { values, len: rows * blocks * BLOCK / 2, scales, scales_len: rows * blocks * 2 };
                quantize.push((name, dtype, range, rows, cols, values, scales));
                read.push(matrix);
            }
        }
        // Whole rows per thread: thread t quantizes the t-th part of every matrix's rows into
        // its parts of both buffers, this thread the first part.
        let mut parts: [Vec<Part>; THREADS] = std::array::from_fn(|_| Vec::new());
        for &(name, dtype, ref range, rows, cols, values, scales) in &quantize {
            let (blocks, width) = (cols.div_ceil(BLOCK), if dtype == Dtype::F32 { 4 } else { 2 });
            // SAFETY: `pages_for` handed out room for the values' bytes and the scales (aligned
            // for u16) that nothing else points to; each part below is written once, by one
            // thread, before the matrix is handed out.
            let (values, scales) = unsafe {
                (
                    std::slice::from_raw_parts_mut(values, rows * blocks * BLOCK / 2),
                    std::slice::from_raw_parts_mut(scales, rows * blocks * 2),
                )
            };
            let rows_per_thread = rows.div_ceil(THREADS).max(1);
            let chunks =
                values.chunks_mut(rows_per_thread * blocks * BLOCK / 2).zip(scales.chunks_mut(rows_per_thread * blocks * 2));
            for (i, (values, scales)) in chunks.enumerate() {
                let from = range.start + i * rows_per_thread * cols * width;
                let bytes = &self.map[from..from + scales.len() / (blocks * 2) * cols * width];
                parts[i].push(Part { name, dtype, cols, bytes, values, scales });
            }
        }
        let [first, others @ ..] = parts;
        let fits = std::thread::scope(|scope| {
            let others: Vec<_> =
                others.into_iter().filter(|p| !p.is_empty()).map(|part| scope.spawn(move || Part::all(part))).collect();
            let fits = Part::all(first);
            others.into_iter().map(|t| t.join().expect("quantizing does not panic")).fold(fits, Result::and)
        });
        if let Err(name) = fits {
            // A minimum or a scale beyond binary16's largest.
            return Err(Error::InvalidWeights {
                path: self.path.clone(),
                reason: format!(
                    "tensor `{name}` holds a value that is not finite or a block whose range is too wide \
                     for the minimum and scale (binary16, at most {MAX_SCALE}) of an int4 block"
                ),
            });
        }
        for (matrix, &(name, [rows, cols])) in read.iter().zip(&matrices) {
            let blocks = cols.div_ceil(BLOCK);
            self.save(name, Dtype::U8, &[rows, blocks * BLOCK / 2], || matrix.values().to_vec());
            self.save(&scale_name(name), Dtype::F16, &[rows, blocks, 2], || {
                matrix.scales().iter().flat_map(|v| v.to_le_bytes()).collect()
            });
        }
        Ok(read.try_into().unwrap_or_else(|_| unreachable!("one matrix read per name")))
    }

    /// The U8 matrix `name` (at `range`, `rows` rows of `blocks` blocks) and its F16 scales and
    /// minimums, slices of the mapping once every one is known to be finite. The scales are copied if
    /// the file misaligns them.
    fn mapped_q4(&mut self, name: &str, rows: usize, blocks: usize, range: Range<usize>) -> Result<Q4Tensor, Error> {
        let scales_name = scale_name(name);
        let (_, scales) = self.checked_as(&scales_name, &[rows, blocks, 2], &[Dtype::F16], "F16")?;
        let finite = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]) & 0x7c00 != 0x7c00;
        // With no early exit, so that it vectorizes.
        if !self.map[scales.clone()].chunks_exact(2).fold(true, |ok, b| ok & finite(b)) {
            return Err(Error::InvalidWeights {
                path: self.path.clone(),
                reason: format!("tensor `{scales_name}` holds a scale or minimum that is infinite or NaN"),
            });
        }
        let values = self.map[range].as_ptr();
        let scales = if self.map[scales.clone()].as_ptr().align_offset(std::mem::align_of::<u16>()) == 0 {
            self.map[scales].as_ptr().cast::<u16>()
        } else {
            let at = self.pages_for(scales.len())?;
            // SAFETY: `pages_for` handed out room for the scales' bytes, aligned, that nothing
            // else points to; the mapping does not overlap it.
            unsafe { std::ptr::copy_nonoverlapping(self.map[scales.clone()].as_ptr(), at, scales.len()) };
            at.cast::<u16>()
        };
        Ok(Q4Tensor { values, len: rows * blocks * BLOCK / 2, scales, scales_len: rows * blocks * 2 })
    }
}

/// Rows of a matrix for one thread to quantize: `bytes` (the file's, in `dtype`, `cols` values a
/// row) into `values` (16 bytes a block) and their `scales` (a scale and a minimum a block).
struct Part<'a> {
    /// The matrix's name, for an error.
    name: &'a str,
    dtype: Dtype,
    cols: usize,
    bytes: &'a [u8],
    values: &'a mut [u8],
    scales: &'a mut [u16],
}

impl<'a> Part<'a> {
    /// Quantizes every part; the name of a matrix that [`Part::quantize`] refuses.
    fn all(parts: Vec<Part<'a>>) -> Result<(), &'a str> {
        parts.into_iter().try_for_each(Part::quantize)
    }

    /// Quantizes the part's rows; the matrix's name if a value is not finite or a block's
    /// minimum or scale is beyond binary16's range.
    fn quantize(self) -> Result<(), &'a str> {
        let width = if self.dtype == Dtype::F32 { 4 } else { 2 };
        let blocks = self.cols.div_ceil(BLOCK);
        let mut row = vec![0f32; self.cols];
        let mut fits = true;
        for ((bytes, values), scales) in self
            .bytes
            .chunks(self.cols * width)
            .zip(self.values.chunks_mut(blocks * BLOCK / 2))
            .zip(self.scales.chunks_mut(blocks * 2))
        {
            if self.dtype == Dtype::F32 {
                for (o, b) in row.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            } else {
                for (o, v) in row.iter_mut().zip(widened(self.dtype, bytes)) {
                    *o = v;
                }
            }
            let blocks = row.chunks(BLOCK).zip(values.chunks_exact_mut(BLOCK / 2)).zip(scales.chunks_exact_mut(2));
            for ((block, out), pair) in blocks {
                match quantize_block(block, out.try_into().expect("16 bytes")) {
                    Some(bits) => pair.copy_from_slice(&bits),
                    None => fits = false,
                }
            }
        }
        if fits { Ok(()) } else { Err(self.name) }
    }
}

/// The largest binary16 value.
const MAX_SCALE: f32 = 65504.0;

/// binary16's smallest normal value, 2⁻¹⁴.
const MIN_NORMAL: f32 = 6.103_515_6e-5;

/// binary16's smallest step, 2⁻²⁴: the spacing of its values below [`MIN_NORMAL`].
const SMALLEST: f32 = 5.960_464_5e-8;

/// Quantizes one block into `out`, and returns the bits of its binary16 scale and minimum;
/// `None` if a value is not finite or they do not fit binary16. A short last block takes the
/// row's last values only; its padding holds the minimum's four bits, 0.
fn quantize_block(block: &[f32], out: &mut [u8; BLOCK / 2]) -> Option<[u16; 2]> {
    if !block.iter().fold(true, |finite, v| finite & v.is_finite()) {
        return None;
    }
    let (low, high) = block.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
    let (minimum, minimum_bits) = binary16_nearest(low)?;
    let (scale, scale_bits) = binary16_nearest((high - low) / 15.0)?;
    let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let nibble = |i: usize| {
        let v = block.get(i).map_or(minimum, |&v| v);
        round_to_int(((v - minimum) * inverse).clamp(0.0, 15.0)) as u8
    };
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = nibble(i) | (nibble(i + BLOCK / 2) << 4);
    }
    Some([scale_bits, minimum_bits])
}

/// `v` rounded to the nearest binary16 value (ties to even): that value, and its bits; `None`
/// beyond [`MAX_SCALE`].
fn binary16_nearest(v: f32) -> Option<(f32, u16)> {
    let (sign, magnitude) = (if v < 0.0 { 0x8000u16 } else { 0 }, v.abs());
    let (rounded, bits) = if magnitude < MIN_NORMAL {
        // A multiple of the smallest step (1024 of them are MIN_NORMAL, whose bits are 0x0400).
        let steps = (magnitude / SMALLEST).round_ties_even();
        (steps * SMALLEST, steps as u16)
    } else {
        // 10 bits of mantissa, to nearest, ties to even.
        let b = magnitude.to_bits();
        let rounded = f32::from_bits((b + 0xfff + ((b >> 13) & 1)) & !0x1fff);
        if rounded > MAX_SCALE {
            return None;
        }
        let exponent = (rounded.to_bits() >> 23) as i32 - 127 + 15;
        (rounded, ((exponent as u16) << 10) | ((rounded.to_bits() >> 13) & 0x3ff) as u16)
    };
    Some((if sign != 0 { -rounded } else { rounded }, sign | bits))
}


/// `v` rounded to the nearest integer, ties to even, for |v| ≤ 2²²: adding 1.5 · 2²³ leaves
/// no fraction bits (the addition rounds as the FPU does by default) and puts the integer in
/// the low bits of the sum. The same as `f32::round_ties_even` there, but plain arithmetic
/// that vectorizes, where the baseline x86-64 target calls a library function for that (which
/// took a sixth of a TinyLlama int4 crate's load).
fn round_to_int(v: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32
}
