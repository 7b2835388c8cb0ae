//! Matrices in the layout of this crate's matmul kernel, which reads its weights packed: each
//! matrix is rewritten once, at load, by the kernel's `pack`, into a copy that the storage
//! keeps (the mapped file's pages of it are then no longer read). A model that this crate saved
//! (`--save-model`) holds them packed already, and loading it maps them.

use safetensors::Dtype;

use crate::Error;
use crate::kernels::matmul::pack;
use crate::kernels::packed_len;
use crate::tensor_file::{Tensor, TensorFile};

impl TensorFile {
    /// The `[rows, cols]` matrix `name`, checked as [`TensorFile::f32`] checks it, packed for
    /// the matmul kernel into the huge pages that every packed matrix of the file shares (see
    /// [`TensorFile::pages_for`]), on a cache line, as the bf16 and int8 copies are; or, from a
    /// saved model that holds it packed in this kernel's layout, a slice of the file (see
    /// [`TensorFile::packed_entry`]).
    pub fn packed(&mut self, name: &str, shape: &[usize]) -> Result<Tensor, Error> {
        let [rows, cols] = shape else {
            unreachable!("a matrix has two dimensions, as the generated loader asks for")
        };
        let len = packed_len(*rows, *cols);
        if let Some(range) = self.packed_entry(name, Dtype::F32, "F32", len)? {
            return self.slice_f32(range);
        }
        let matrix = self.read_f32(name, shape)?;
        let packed = pack(&matrix, *rows, *cols);
        assert_eq!(packed.len(), len, "`packed_len` and `pack` disagree");
        self.save_packed(name, Dtype::F32, len, || packed.iter().flat_map(|v| v.to_le_bytes()).collect());
        self.in_pages(&packed)
    }
}
