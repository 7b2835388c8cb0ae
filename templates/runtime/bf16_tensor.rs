//! bfloat16 matrices, for a crate whose workload holds its weights in bfloat16
//! (`weights.dtype = "bf16"`). A BF16 tensor of the file is a slice of the mapping; an F32 or
//! F16 one is converted once, at load, rounding to the nearest bfloat16 (ties to even).

use std::ops::Deref;

use safetensors::Dtype;

use crate::Error;
use crate::tensor_file::{TensorFile, widened};

/// A bfloat16 tensor (its values' bit patterns): a slice of the mapped file or its own copy.
///
/// It dereferences to `[u16]`. Like [`crate::tensor_file::Tensor`], the mapped memory belongs
/// to the `Storage` of its file, which its owner holds too.
pub struct Bf16Tensor {
    ptr: *const u16,
    len: usize,
    /// The converted values, when the file does not hold this tensor as BF16.
    _copy: Option<Box<[u16]>>,
}

// SAFETY: a Bf16Tensor points into memory that is never written after loading (a read-only
// mapping, the pages of packed matrices, or its own copy), alive as long as the tensor's owner.
unsafe impl Send for Bf16Tensor {}
// SAFETY: as above; shared reads of immutable memory.
unsafe impl Sync for Bf16Tensor {}

impl Deref for Bf16Tensor {
    type Target = [u16];

    fn deref(&self) -> &[u16] {
        // SAFETY: ptr is aligned for u16 and points to len values that stay alive and
        // unchanged while the Storage (or the copy) they came from is alive.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl TensorFile {
    /// The tensor `name` as bfloat16, which must have exactly `shape`.
    pub fn bf16(&mut self, name: &str, shape: &[usize]) -> Result<Bf16Tensor, Error> {
        let tensor = self.read_bf16(name, shape)?;
        self.save(name, Dtype::BF16, shape, || tensor.iter().flat_map(|v| v.to_le_bytes()).collect());
        Ok(tensor)
    }

    /// [`TensorFile::bf16`], without keeping a copy when saving.
    fn read_bf16(&mut self, name: &str, shape: &[usize]) -> Result<Bf16Tensor, Error> {
        let (dtype, range) = self.checked(name, shape)?;
        let bytes = &self.map[range];
        if dtype == Dtype::BF16 && bytes.as_ptr().align_offset(std::mem::align_of::<u16>()) == 0 {
            return Ok(Bf16Tensor { ptr: bytes.as_ptr().cast(), len: bytes.len() / 2, _copy: None });
        }
        let copy: Box<[u16]> = if dtype == Dtype::F32 {
            bytes.chunks_exact(4).map(|b| to_bf16(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))).collect()
        } else {
            widened(dtype, bytes).map(to_bf16).collect()
        };
        Ok(Bf16Tensor { ptr: copy.as_ptr(), len: copy.len(), _copy: Some(copy) })
    }

    /// The `[rows, cols]` matrix `name`, as [`TensorFile::bf16`] reads it, rewritten into a copy
    /// in the layout of the matmul kernel, which reads its weights packed (its `pack`). The copy
    /// goes into the huge pages that every packed matrix of the file shares (see
    /// [`TensorFile::pages_for`]). From a saved model that holds it packed in this kernel's
    /// layout (see [`TensorFile::packed_entry`]), it is a slice of the file instead, which
    /// touches no fresh memory: most of a packing load's time went to the kernel zeroing the
    /// copies' pages (bench/RESULTS.md).
    pub fn bf16_packed(&mut self, name: &str, shape: &[usize]) -> Result<Bf16Tensor, Error> {
        let [rows, cols] = shape else {
            unreachable!("a matrix has two dimensions, as the generated loader asks for")
        };
        let len = crate::kernels::packed_len(*rows, *cols);
        if let Some(range) = self.packed_entry(name, Dtype::BF16, "BF16", len)? {
            return Ok(Bf16Tensor { ptr: self.on_cache_line(range)?.cast(), len, _copy: None });
        }
        let matrix = self.read_bf16(name, shape)?;
        let packed = crate::kernels::matmul::pack(&matrix, *rows, *cols);
        assert_eq!(packed.len(), len, "`packed_len` and `pack` disagree");
        self.save_packed(name, Dtype::BF16, len, || packed.iter().flat_map(|v| v.to_le_bytes()).collect());
        let at = self.pages_for(len * 2)?.cast::<u16>();
        // SAFETY: `pages_for` handed out room for `len` values, aligned, that nothing else
        // points to.
        unsafe { std::ptr::copy_nonoverlapping(packed.as_ptr(), at, len) };
        Ok(Bf16Tensor { ptr: at, len, _copy: None })
    }
}

/// The bfloat16 nearest to `value` (ties to even); NaN stays a quiet NaN.
fn to_bf16(value: f32) -> u16 {
    if value.is_nan() {
        return 0x7fc0;
    }
    let bits = value.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1));
    (rounded >> 16) as u16
}
