//! Matrices in the layout of this crate's matmul kernel, which reads its weights packed: each
//! matrix is rewritten once, at load, by the kernel's `pack`, into a copy that the storage
//! keeps (the mapped file's pages of it are then no longer read).

use crate::Error;
use crate::kernels::matmul::pack;
use crate::tensor_file::{Tensor, TensorFile};

impl TensorFile {
    /// The `[rows, cols]` matrix `name`, checked as [`TensorFile::f32`] checks it, packed for
    /// the matmul kernel.
    pub fn packed(&mut self, name: &str, shape: &[usize]) -> Result<Tensor, Error> {
        let matrix = self.f32(name, shape)?;
        let [rows, cols] = shape else {
            unreachable!("a matrix has two dimensions, as the generated loader asks for")
        };
        Ok(self.keep(pack(&matrix, *rows, *cols).into_boxed_slice()))
    }
}
