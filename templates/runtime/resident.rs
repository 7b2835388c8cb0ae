//! Weights copied into anonymous memory at load, for a model too large for any cache, where
//! the page cache does not hold the file in huge pages. A decode step streams every weight
//! from DRAM: through a mapping of 4 KiB pages it pays a TLB miss every few lines, from a copy
//! in huge pages it does not. `TensorFile::open` asks for the file in huge pages, and a
//! kernel whose page cache holds the file in 2 MiB folios (as Linux 6.18 did on ext4 for a file
//! read after that advice) maps it as they are. The copy is then made only where less than
//! `HUGE_SHARE` of the mapping is in huge pages, as a file cached in small folios before, or a
//! file system without large folios, leaves it.
//!
//! The generator chooses this only for large weights, and the crate copies only a file that
//! holds the matrices as it keeps them (a checkpoint it converts is read once, into copies in
//! anonymous memory already).

use memmap2::MmapMut;
use safetensors::Dtype;

use crate::Error;
use crate::huge_pages;
use crate::tensor_file::TensorFile;

/// The share of the mapping in huge pages from which the crate reads the weights through it
/// rather than copy them. On an AMD EPYC (Zen 3, Linux 6.18, ext4), TinyLlama's weights
/// decoded as fast from a mapping 87-100% in huge pages as from the copy (bf16 1.035x, f32
/// 0.973x, `bench/ab.py`), whose load took 5.6-15.6 s against 10-54 ms; with a third of
/// stories110M's file in huge pages, decode ran 1.17x slower than from the copy.
const HUGE_SHARE: f64 = 0.75;

impl TensorFile {
    /// The same file with its bytes copied from the mapping into anonymous memory (the tensors'
    /// offsets are unchanged), if it holds a matrix in `dtype`, the crate's, and less than
    /// `HUGE_SHARE` of its mapping is in huge pages; else unchanged.
    pub fn resident(mut self, dtype: Dtype) -> Result<TensorFile, Error> {
        if self.map.is_empty() || !self.entries.values().any(|e| e.dtype == dtype && e.shape.len() == 2) {
            return Ok(self);
        }
        if huge_pages::share(&self.map).is_some_and(|share| share >= HUGE_SHARE) {
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
