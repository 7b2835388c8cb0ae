//! Weights copied into anonymous memory at load, for a model too large for any cache: a decode
//! step streams every weight from DRAM, and it streams them faster from the process's own
//! memory (asked for in huge pages) than through the file's page-cache mapping. The copy
//! costs load time (seconds for gigabytes); the generator chooses it only for large weights,
//! and the crate makes it only of a file that holds the matrices as it keeps them (a
//! checkpoint it converts is read once, into copies in anonymous memory already).

use memmap2::MmapMut;
use safetensors::Dtype;

use crate::Error;
use crate::tensor_file::TensorFile;

impl TensorFile {
    /// The same file with its bytes copied from the mapping into anonymous memory (the tensors'
    /// offsets are unchanged), if it holds a matrix in `dtype`, the crate's; else unchanged.
    pub fn resident(mut self, dtype: Dtype) -> Result<TensorFile, Error> {
        if self.map.is_empty() || !self.entries.values().any(|e| e.dtype == dtype && e.shape.len() == 2) {
            return Ok(self);
        }
        let io = |source| Error::Io { path: self.path.clone(), source };
        let mut copy = MmapMut::map_anon(self.map.len()).map_err(io)?;
        // Huge pages when the kernel grants them; the copy works either way.
        #[cfg(target_os = "linux")]
        let _ = copy.advise(memmap2::Advice::HugePage);
        copy.copy_from_slice(&self.map);
        self.map = copy.make_read_only().map_err(io)?;
        Ok(self)
    }
}
