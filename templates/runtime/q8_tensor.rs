//! Blockwise int8 matrices, for a crate whose workload holds its weights in 8 bits
//! (`weights.dtype = "int8"`). Every matrix of the file (F32, BF16 or F16) is quantized once,
//! at load, on `THREADS` threads, into huge pages (`TensorFile::pages_for`): per block of
//! [`BLOCK`] consecutive values of a row, the scale `d` is `max|w| / 127` rounded up to a
//! binary16 value (as `matmul<q8>` requires, and as GGML's Q8_0 stores it) and the values are
//! `round(w / d)` (ties to even), so that no value is clipped.

use std::ops::Range;

use safetensors::Dtype;

use crate::tensor_file::{TensorFile, widened};
use crate::{Error, THREADS};

/// Values of a row that share one scale.
pub const BLOCK: usize = 32;

/// An int8 matrix of `[rows, cols]` values and `[rows, ⌈cols / BLOCK⌉]` scales (or, packed by
/// the matmul kernel, its bytes, scales included, and no scales). Both lie in the huge pages of
/// the [`Storage`](crate::tensor_file::Storage) that [`TensorFile::finish`] returns, or in its
/// mapping of a file that holds them already (as `--save-model` writes it); whoever holds the
/// matrix holds that storage too.
pub struct Q8Tensor {
    values: *const i8,
    len: usize,
    scales: *const f32,
    scales_len: usize,
}

// SAFETY: the values and scales are never written after loading, and their memory lives as
// long as the Storage that the matrix's owner holds.
unsafe impl Send for Q8Tensor {}
// SAFETY: as above; shared reads of immutable memory.
unsafe impl Sync for Q8Tensor {}

impl Q8Tensor {
    /// The quantized values, row-major.
    pub fn values(&self) -> &[i8] {
        // SAFETY: `values` points to `len` values, written once at load (or mapped) and alive
        // while the Storage is (see Q8Tensor).
        unsafe { std::slice::from_raw_parts(self.values, self.len) }
    }

    /// The scale of each block of each row, row-major (none for a packed matrix).
    pub fn scales(&self) -> &[f32] {
        // SAFETY: as for the values; `scales` is aligned for f32.
        unsafe { std::slice::from_raw_parts(self.scales, self.scales_len) }
    }

    /// Writes row `row`, dequantized (each value times its block's scale), into `out`, which
    /// holds a row (`cols` values).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        let cols = out.len();
        let blocks = cols.div_ceil(BLOCK);
        let values = &self.values()[row * cols..(row + 1) * cols];
        let scales = &self.scales()[row * blocks..(row + 1) * blocks];
        for ((out, values), &scale) in out.chunks_mut(BLOCK).zip(values.chunks(BLOCK)).zip(scales) {
            for (o, &v) in out.iter_mut().zip(values) {
                *o = scale * f32::from(v);
            }
        }
    }
}

/// The name of the scales of int8 matrix `name` in a file that holds it quantized:
/// `….weight_scale` for `….weight`.
pub fn scale_name(name: &str) -> String {
    format!("{name}_scale")
}

impl TensorFile {
    /// The matrix `name`, which must have exactly `shape` (`[rows, cols]`), as int8: quantized
    /// now from F32, BF16 or F16, or mapped where the file holds it as I8 with its scales
    /// (`scale_name`) as F32 `[rows, ⌈cols / BLOCK⌉]`, each a binary16 value.
    pub fn q8(&mut self, name: &str, shape: &[usize]) -> Result<Q8Tensor, Error> {
        let &[rows, cols] = shape else { panic!("q8: `{name}` is not a matrix") };
        let [matrix] = self.q8_many([(name, [rows, cols])])?;
        Ok(matrix)
    }

    /// The matrices `matrices` (name and `[rows, cols]`), read as [`TensorFile::q8`] reads
    /// each, those to quantize quantized together: one start of the `THREADS - 1` other
    /// threads for all of them, which a layer's matrices share (a scoped thread's start and
    /// join took 84-92 µs on a 2-vCPU VM, bench/RESULTS.md).
    pub fn q8_many<const M: usize>(&mut self, matrices: [(&str, [usize; 2]); M]) -> Result<[Q8Tensor; M], Error> {
        let read = self.read_q8_many(matrices)?;
        for (matrix, &(name, [rows, cols])) in read.iter().zip(&matrices) {
            self.save(name, Dtype::I8, &[rows, cols], || matrix.values().iter().map(|&v| v as u8).collect());
            self.save(&scale_name(name), Dtype::F32, &[rows, cols.div_ceil(BLOCK)], || {
                matrix.scales().iter().flat_map(|v| v.to_le_bytes()).collect()
            });
        }
        Ok(read)
    }

    /// The matrices `matrices` (name and `[rows, cols]`), read as [`TensorFile::q8_many`] reads
    /// them, then rewritten into copies in the layout of the matmul kernel, which reads its
    /// weights packed (its `pack`), in the huge pages of [`TensorFile::pages_for`]. From a saved
    /// model that holds them packed in this kernel's layout (see
    /// [`TensorFile::packed_entry`]), they are slices of the file instead. The kernel's layout
    /// holds the scales among the values: a matrix is one buffer of `packed_len` bytes.
    pub fn q8_packed_many<const M: usize>(
        &mut self,
        matrices: [(&str, [usize; 2]); M],
    ) -> Result<[Q8Tensor; M], Error> {
        let lens = matrices.map(|(_, [rows, cols])| crate::kernels::packed_len(rows, cols));
        if matrices.iter().all(|(name, _)| self.entries.contains_key(&format!("{name}.packed"))) {
            let mut read = Vec::with_capacity(M);
            for (&(name, shape), &len) in matrices.iter().zip(&lens) {
                read.push(self.mapped_packed_q8(name, shape, len)?);
            }
            return Ok(read.try_into().unwrap_or_else(|_| unreachable!("one matrix read per name")));
        }
        // Quantized into pages of their own, which are unmapped once the matrices are packed:
        // only the packed copies stay.
        let kept = std::mem::take(&mut self.pages);
        let unpacked = self.read_q8_many(matrices);
        let quantized = std::mem::replace(&mut self.pages, kept);
        let unpacked = unpacked?;
        let packed: [Vec<i8>; M] = std::array::from_fn(|i| {
            let [rows, cols] = matrices[i].1;
            crate::kernels::matmul::pack((unpacked[i].values(), unpacked[i].scales()), rows, cols)
        });
        // The quantized matrices point into these pages: both go together.
        drop((unpacked, quantized));
        let mut read = Vec::with_capacity(M);
        for ((values, &(name, _)), &len) in packed.iter().zip(&matrices).zip(&lens) {
            assert!(values.len() == len, "`packed_len` and `pack` disagree");
            self.save_packed(name, Dtype::I8, len, || values.iter().map(|&v| v as u8).collect());
            let at = self.pages_for(len)?.cast::<i8>();
            // SAFETY: `pages_for` handed out room for `len` bytes, aligned, that nothing else
            // points to.
            unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), at, len) };
            read.push(Q8Tensor { values: at, len, scales: std::ptr::NonNull::dangling().as_ptr(), scales_len: 0 });
        }
        Ok(read.try_into().unwrap_or_else(|_| unreachable!("one matrix read per name")))
    }

    /// The matrix `name`, read as [`TensorFile::q8_packed_many`] reads it.
    pub fn q8_packed(&mut self, name: &str, shape: &[usize]) -> Result<Q8Tensor, Error> {
        let &[rows, cols] = shape else { panic!("q8_packed: `{name}` is not a matrix") };
        let [matrix] = self.q8_packed_many([(name, [rows, cols])])?;
        Ok(matrix)
    }

    /// The packed `[rows, cols]` matrix `name` (`len` bytes, its scales among them), a slice
    /// of a saved model's mapping (see [`TensorFile::packed_entry`]) once the kernel finds its
    /// scales valid (its `check_packed`), copied into huge pages where the file does not place
    /// it on a cache line.
    fn mapped_packed_q8(&mut self, name: &str, [rows, cols]: [usize; 2], len: usize) -> Result<Q8Tensor, Error> {
        let Some(values) = self.packed_entry(name, Dtype::I8, "I8", len)? else {
            unreachable!("the caller found `{name}.packed`")
        };
        let bytes = &self.map[values.clone()];
        // SAFETY: i8 and u8 have the same size and alignment, and every bit pattern is valid.
        let packed = unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<i8>(), bytes.len()) };
        if let Err(why) = crate::kernels::matmul::check_packed(packed, rows, cols) {
            return Err(Error::InvalidWeights { path: self.path.clone(), reason: format!("tensor `{name}.packed` {why}") });
        }
        let values = self.on_cache_line(values)?.cast::<i8>();
        Ok(Q8Tensor { values, len, scales: std::ptr::NonNull::dangling().as_ptr(), scales_len: 0 })
    }

    /// [`TensorFile::q8_many`], without keeping copies when saving.
    fn read_q8_many<const M: usize>(&mut self, matrices: [(&str, [usize; 2]); M]) -> Result<[Q8Tensor; M], Error> {
        let dtypes = [Dtype::F32, Dtype::BF16, Dtype::F16, Dtype::I8];
        let expected = "F32, BF16, F16, or I8 with its scales (as `--save-model` writes them)";
        let mut read = Vec::with_capacity(M);
        // What to quantize: the file's dtype and bytes, and the matrix's rows and columns.
        let mut quantize = Vec::new();
        // The names of the matrices quantized here, with their scales.
        let mut quantized = Vec::new();
        for &(name, [rows, cols]) in &matrices {
            let (dtype, range) = self.checked_as(name, &[rows, cols], &dtypes, expected)?;
            if dtype == Dtype::I8 {
                read.push(self.mapped_q8(name, rows, cols, range)?);
            } else {
                let values = self.pages_for(rows * cols)?.cast::<i8>();
                let scales = self.pages_for(rows * cols.div_ceil(BLOCK) * 4)?.cast::<f32>();
                let matrix = Q8Tensor { values, len: rows * cols, scales, scales_len: rows * cols.div_ceil(BLOCK) };
                quantize.push((dtype, range, rows, cols, values, scales));
                quantized.push((name, read.len()));
                read.push(matrix);
            }
        }
        // Whole rows per thread: thread t quantizes the t-th part of every matrix's rows into
        // its parts of both buffers, this thread the first part.
        let mut parts: [Vec<Part>; THREADS] = std::array::from_fn(|_| Vec::new());
        for (dtype, range, rows, cols, values, scales) in quantize {
            let (blocks, width) = (cols.div_ceil(BLOCK), if dtype == Dtype::F32 { 4 } else { 2 });
            // SAFETY: `pages_for` handed out room for `rows · cols` values and `rows · blocks`
            // scales (aligned for f32) that nothing else points to; each part below is written
            // once, by one thread, before the matrix is handed out.
            let (values, scales) = unsafe {
                (std::slice::from_raw_parts_mut(values, rows * cols), std::slice::from_raw_parts_mut(scales, rows * blocks))
            };
            let rows_per_thread = rows.div_ceil(THREADS).max(1);
            let chunks = values.chunks_mut(rows_per_thread * cols).zip(scales.chunks_mut(rows_per_thread * blocks));
            for (i, (values, scales)) in chunks.enumerate() {
                let from = range.start + i * rows_per_thread * cols * width;
                let bytes = &self.map[from..from + values.len() * width];
                parts[i].push(Part { dtype, cols, bytes, values, scales });
            }
        }
        let [first, others @ ..] = parts;
        std::thread::scope(|scope| {
            for part in others.into_iter().filter(|p| !p.is_empty()) {
                scope.spawn(move || part.into_iter().for_each(Part::quantize));
            }
            first.into_iter().for_each(Part::quantize);
        });
        // A scale beyond binary16's largest: values of magnitude above 127 · 65504.
        for (name, at) in quantized {
            if read[at].scales().iter().fold(false, |over, &d| over | (d > MAX_SCALE)) {
                return Err(Error::InvalidWeights {
                    path: self.path.clone(),
                    reason: format!(
                        "tensor `{name}` holds a value of magnitude above {}, too large for the scale \
                         (binary16) of an int8 block",
                        127.0 * MAX_SCALE
                    ),
                });
            }
        }
        Ok(read.try_into().unwrap_or_else(|_| unreachable!("one matrix read per name")))
    }

    /// Whether every scale of tensor `name` (at `range`) is a binary16 value, not negative, as
    /// `matmul<q8>` requires (the scales that monogen's quantizer writes are).
    fn check_scales(&self, name: &str, range: Range<usize>) -> Result<(), Error> {
        // Or-ing the tests, with no early exit, vectorizes.
        let value = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if self.map[range].chunks_exact(4).fold(false, |bad, b| bad | !is_binary16(value(b))) {
            return Err(Error::InvalidWeights {
                path: self.path.clone(),
                reason: format!(
                    "tensor `{name}` holds a scale that is negative, NaN or not a binary16 value (a \
                     model that an earlier monogen saved needs saving again)"
                ),
            });
        }
        Ok(())
    }

    /// The I8 matrix `name` (at `range`, `[rows, cols]`) and its scales, slices of the mapping
    /// once they are known to be valid: no value -128 (the AVX-512 decode tile negates weights
    /// to carry the activations' signs, and -128 has no negation), every scale finite and not
    /// negative. The scales are copied if the file misaligns them.
    fn mapped_q8(&mut self, name: &str, rows: usize, cols: usize, range: Range<usize>) -> Result<Q8Tensor, Error> {
        let scales_name = scale_name(name);
        let blocks = rows * cols.div_ceil(BLOCK);
        let (_, scales) = self.checked_as(&scales_name, &[rows, cols.div_ceil(BLOCK)], &[Dtype::F32], "F32")?;
        let invalid = |reason: String| Error::InvalidWeights { path: self.path.clone(), reason };
        let values = &self.map[range];
        // With no early exit, so that it vectorizes: it reads every value once, about 1.2 ms of
        // a stories15M load (bench/RESULTS.md), on the path to the first token.
        if values.chunks(4096).any(|chunk| chunk.iter().fold(0u8, |found, &v| found | u8::from(v == 0x80)) != 0) {
            return Err(invalid(format!(
                "tensor `{name}` holds the value -128; int8 weights lie in -127..=127"
            )));
        }
        let values = values.as_ptr().cast::<i8>();
        self.check_scales(&scales_name, scales.clone())?;
        let scales = if self.map[scales.clone()].as_ptr().align_offset(std::mem::align_of::<f32>()) == 0 {
            self.map[scales].as_ptr().cast::<f32>()
        } else {
            let at = self.pages_for(scales.len())?;
            // SAFETY: `pages_for` handed out room for the scales' bytes, aligned for f32, that
            // nothing else points to; the mapping does not overlap it.
            unsafe { std::ptr::copy_nonoverlapping(self.map[scales.clone()].as_ptr(), at, scales.len()) };
            at.cast::<f32>()
        };
        Ok(Q8Tensor { values, len: rows * cols, scales, scales_len: blocks })
    }
}

/// Rows of a matrix for one thread to quantize: `bytes` (the file's, in `dtype`, `cols` values a
/// row) into `values` and their `scales`.
struct Part<'a> {
    dtype: Dtype,
    cols: usize,
    bytes: &'a [u8],
    values: &'a mut [i8],
    scales: &'a mut [f32],
}

impl Part<'_> {
    fn quantize(self) {
        quantize_rows(self.dtype, self.cols, self.bytes, self.values, self.scales);
    }
}

/// Quantizes the rows of `cols` values of `bytes` (the file's, in `dtype`) into `values` and
/// their `scales`.
fn quantize_rows(dtype: Dtype, cols: usize, bytes: &[u8], values: &mut [i8], scales: &mut [f32]) {
    let width = if dtype == Dtype::F32 { 4 } else { 2 };
    let blocks = cols.div_ceil(BLOCK);
    let mut row = vec![0f32; cols];
    for ((bytes, values), scales) in
        bytes.chunks(cols * width).zip(values.chunks_mut(cols)).zip(scales.chunks_mut(blocks))
    {
        // The file's dtype is the checkpoint's, known only now; BF16 (the usual one) widens in
        // a loop of its own, which vectorizes.
        if dtype == Dtype::F32 {
            for (o, b) in row.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        } else if dtype == Dtype::BF16 {
            for (o, b) in row.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
            }
        } else {
            for (o, v) in row.iter_mut().zip(widened(dtype, bytes)) {
                *o = v;
            }
        }
        quantize(&row, values, scales);
    }
}

/// The largest binary16 value, and so the largest scale.
const MAX_SCALE: f32 = 65504.0;

/// binary16's smallest normal value, 2⁻¹⁴.
const MIN_NORMAL: f32 = 6.103_515_6e-5;

/// binary16's smallest step, 2⁻²⁴: the spacing of its values below [`MIN_NORMAL`].
const SMALLEST: f32 = 5.960_464_5e-8;

/// Whether `v` is a binary16 value and not negative.
// `&`, not the `&&` of `Range::contains`: no branches (see below).
#[allow(clippy::manual_range_contains)]
fn is_binary16(v: f32) -> bool {
    // 10 bits of mantissa among the normal values; a multiple of 2⁻²⁴ below them: a whole
    // number below 1024 once scaled by 2²⁴ (exact, a power of two), which adding and taking
    // away 2²³ leaves as it is. Comparisons and arithmetic only, with no conversion to an
    // integer, so that the check of a file's scales vectorizes (`check_scales`): with a
    // conversion it took about half of an int8 load's checks at stories15M (bench/RESULTS.md).
    const WHOLE: f32 = 8_388_608.0;
    let normal = (MIN_NORMAL <= v) & (v <= MAX_SCALE) & (v.to_bits() & 0x1fff == 0);
    let steps = v * (1.0 / SMALLEST);
    let small = (0.0 <= v) & (v < MIN_NORMAL) & ((steps + WHOLE) - WHOLE == steps);
    normal | small
}

/// The scale of a block whose largest magnitude is `amax`: `amax / 127` rounded up to a
/// binary16 value (above [`MAX_SCALE`] when `amax` is too large for one).
fn block_scale(amax: f32) -> f32 {
    let scale = amax / 127.0;
    if scale < MIN_NORMAL {
        return small_scale(scale);
    }
    // Rounded up to 10 bits of mantissa.
    f32::from_bits((scale.to_bits() + 0x1fff) & !0x1fff)
}

/// `scale` (below [`MIN_NORMAL`]) rounded up to a multiple of [`SMALLEST`]; out of the way of
/// the quantizer's loop, which rarely comes here.
#[cold]
#[inline(never)]
fn small_scale(scale: f32) -> f32 {
    (scale / SMALLEST).ceil() * SMALLEST
}

/// Quantizes one row: per block, `scale = max|x| / 127` rounded up to binary16 and
/// `q = round(x / scale)`. Every whole block's scale comes first, then its values: each value's
/// multiplier (`1 / scale`) waits on the block's two divisions, and with the scales apart, those
/// of one block no longer wait on the values of the one before. On stories110M's classifier
/// (one thread) that took 6.1-6.4 ms against 7.9-8.0 block by block (bench/RESULTS.md).
fn quantize(row: &[f32], values: &mut [i8], scales: &mut [f32]) {
    for (block, scale) in row.chunks_exact(BLOCK).zip(scales.iter_mut()) {
        *scale = block_scale(amax(block.try_into().expect("a whole block")));
    }
    let mut blocks = row.chunks_exact(BLOCK);
    let mut outs = values.chunks_exact_mut(BLOCK);
    for ((block, out), &scale) in (&mut blocks).zip(&mut outs).zip(scales.iter()) {
        let (block, out) = (block.try_into().expect("a whole block"), out.try_into().expect("a whole block"));
        quantize_block(block, out, scale);
    }
    // A last block shorter than BLOCK, padded with zeros.
    let (block, out) = (blocks.remainder(), outs.into_remainder());
    if let Some(scale) = scales.last_mut()
        && !block.is_empty()
    {
        let mut padded = [0.0f32; BLOCK];
        padded[..block.len()].copy_from_slice(block);
        let mut values = [0i8; BLOCK];
        *scale = block_scale(amax(&padded));
        quantize_block(&padded, &mut values, *scale);
        out.copy_from_slice(&values[..out.len()]);
    }
}

/// The largest magnitude of a block. Written as fixed-size loops of plain arithmetic so that
/// the compiler vectorizes them on the baseline target (the load time of a large model is
/// mostly this and [`quantize_block`]).
fn amax(block: &[f32; BLOCK]) -> f32 {
    // `f32::max` (which passes over a NaN) becomes `maxps`; the `if a > lane` this replaced,
    // as NaN-blind, was compiled as scalar compares and branches: 0.95 against 0.52 ns per
    // weight, quantizing a 4M-value buffer on an AMD EPYC (Zen 3).
    let mut lanes = [0.0f32; 8];
    for chunk in block.chunks_exact(8) {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(v.abs());
        }
    }
    lanes.iter().fold(0.0f32, |m, &a| m.max(a))
}

/// Quantizes one block with its scale (as [`block_scale`] gives it).
fn quantize_block(block: &[f32; BLOCK], out: &mut [i8; BLOCK], scale: f32) {
    // |v / scale| ≤ 127 (f32 rounding takes it at most an ulp past, which rounds to 127).
    let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    for (q, &v) in out.iter_mut().zip(block) {
        *q = round_to_int(v * inverse) as i8;
    }
}

/// `v` rounded to the nearest integer, ties to even, for |v| ≤ 2²²: adding 1.5 · 2²³ leaves
/// no fraction bits (the addition rounds as the FPU does by default) and puts the integer in
/// the low bits of the sum. The same as `f32::round_ties_even` there, but plain arithmetic
/// that vectorizes, where the baseline x86-64 target calls a library function for that.
fn round_to_int(v: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32
}
