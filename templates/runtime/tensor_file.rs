//! Memory-mapped safetensors. The `safetensors` crate checks the header (size, JSON, offsets
//! inside the file, no overlaps); this module checks every tensor the model reads for its
//! name, dtype and shape before handing out a slice of it.
//!
//! A checkpoint comes as Hugging Face writes it: one `model.safetensors`, or shards listed by
//! `model.safetensors.index.json`; its tensors' names with the prefix of the model class that
//! saved it or without (`model.` of a LLaMA, `bert.` of a BERT), which [`canonical_names`]
//! maps to the names the crate reads.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::ops::{Deref, Range};
use std::path::{Path, PathBuf};

use memmap2::{Mmap, MmapMut, MmapOptions};
use safetensors::{Dtype, SafeTensors};

use crate::Error;

/// The suffix of a matrix's name in a saved model that holds it as the crate's matmul kernel
/// packed it (`--save-model` of a crate whose kernel packs its weights).
const PACKED: &str = ".packed";

/// The tensor of such a saved model that names the packing's layout (`kernels::PACKED_LAYOUT`
/// of the crate that saved it), as UTF-8 bytes (`U8`). A tensor rather than metadata: the header
/// keeps a single metadata entry, so that a save is the same byte for byte every time.
const PACKED_LAYOUT: &str = "monogen.packed_layout";

/// The index of a sharded checkpoint, in the model directory in place of `model.safetensors`.
const INDEX: &str = "model.safetensors.index.json";

/// A safetensors file mapped into memory, with its table of tensors.
pub struct TensorFile {
    pub(crate) path: PathBuf,
    /// The mapped file (the bf16 loader of a bf16 crate reads it too).
    pub(crate) map: Mmap,
    /// Name → dtype, shape and byte range in `map`.
    pub(crate) entries: BTreeMap<String, Entry>,
    /// Names handed out so far.
    used: BTreeSet<String>,
    /// Anonymous memory asked for in huge pages, each with the bytes handed out of it so far:
    /// every copy the crate makes of a tensor (f32 ones widened from BF16 or F16, or not 4-byte
    /// aligned in the file; packed matrices, bf16_tensor.rs's packed bfloat16 ones, an int8
    /// crate's quantized ones in q8_tensor.rs).
    pub(crate) pages: Vec<(MmapMut, usize)>,
    /// When the weights are being saved ([`TensorFile::saving`]): each tensor handed out so far,
    /// as the model holds it.
    saved: Option<Vec<Saved>>,
}

/// A tensor as the model holds it (its dtype, unpacked), for [`Storage::save`].
struct Saved {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl safetensors::View for &Saved {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.bytes)
    }

    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

pub(crate) struct Entry {
    pub(crate) dtype: Dtype,
    pub(crate) shape: Vec<usize>,
    bytes: Range<usize>,
}

/// An f32 tensor: a slice of the mapped file, or of a copy in the file's huge pages
/// ([`TensorFile::copy_f32`], [`TensorFile::in_pages`]).
///
/// It dereferences to `[f32]`. The memory belongs to the [`Storage`] that
/// [`TensorFile::finish`] returns; whoever holds tensors holds that storage too.
pub struct Tensor {
    ptr: *const f32,
    len: usize,
}

// SAFETY: a Tensor points into memory that is never written after loading (a read-only
// mapping, or a copy in the huge pages), owned by a Storage that lives as long as the tensor's
// owner.
unsafe impl Send for Tensor {}
// SAFETY: as above; shared reads of immutable memory.
unsafe impl Sync for Tensor {}

impl Deref for Tensor {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        // SAFETY: ptr is aligned for f32 and points to len initialised f32 values that stay
        // alive and unchanged while the Storage they came from is alive (see Tensor).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Keeps the memory behind every [`Tensor`] of a file alive.
pub struct Storage {
    _map: Mmap,
    _pages: Vec<(MmapMut, usize)>,
    saved: Vec<Saved>,
}

impl TensorFile {
    /// Maps `path` and reads its header; where `path` does not exist and the index of a sharded
    /// checkpoint does beside it, reads the shards it lists ([`TensorFile::open_sharded`]).
    pub fn open(path: &Path) -> Result<TensorFile, Error> {
        let index = path.with_file_name(INDEX);
        if !path.exists() && index.is_file() {
            return TensorFile::open_sharded(&index);
        }
        let (map, entries) = TensorFile::map_file(path)?;
        let entries =
            canonical_names(entries).map_err(|reason| Error::InvalidCheckpoint { path: path.to_path_buf(), reason })?;
        Ok(TensorFile { path: path.to_path_buf(), map, entries, used: BTreeSet::new(), pages: Vec::new(), saved: None })
    }

    /// The shards that the index at `index` lists, read into one block of memory (each shard
    /// at a multiple of 64 bytes, so that a tensor keeps its alignment), as one file: every
    /// tensor at most once, in the shard the index names. A shard that is missing, or that
    /// holds a tensor twice over, is an error naming it. The copy costs a read of the whole
    /// checkpoint at every start; `--save-model` writes the single file that later runs map.
    pub fn open_sharded(index: &Path) -> Result<TensorFile, Error> {
        let invalid = |path: &Path, reason: String| Error::InvalidCheckpoint { path: path.to_path_buf(), reason };
        let text = std::fs::read_to_string(index).map_err(|source| Error::Io { path: index.to_path_buf(), source })?;
        #[derive(serde::Deserialize)]
        struct Index {
            weight_map: BTreeMap<String, String>,
        }
        let parsed: Index = serde_json::from_str(&text).map_err(|e| invalid(index, format!("not a shard index: {e}")))?;
        let mut shards: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (tensor, shard) in &parsed.weight_map {
            shards.entry(shard.as_str()).or_default().push(tensor.as_str());
        }
        if shards.is_empty() {
            return Err(invalid(index, "its weight_map lists no tensor".into()));
        }
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut mapped = Vec::new();
        for (shard, tensors) in &shards {
            if shard.is_empty() || shard.contains(['/', '\\']) || *shard == ".." {
                return Err(invalid(index, format!("shard `{shard}` is not a file name in the model directory")));
            }
            let path = dir.join(shard);
            if !path.is_file() {
                return Err(invalid(
                    index,
                    format!("shard `{shard}` is missing (the index places {} tensor(s) there, `{}` first)", tensors.len(), tensors[0]),
                ));
            }
            mapped.push((path.clone(), TensorFile::map_file(&path)?));
        }
        let total = mapped.iter().map(|(_, (map, _))| map.len().next_multiple_of(64)).sum::<usize>();
        let io = |source| Error::Io { path: index.to_path_buf(), source };
        let mut block = MmapMut::map_anon(total.max(1)).map_err(io)?;
        // Huge pages when the kernel grants them; the copy works either way.
        #[cfg(target_os = "linux")]
        let _ = block.advise(memmap2::Advice::HugePage);
        let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
        let mut found_in: BTreeMap<String, PathBuf> = BTreeMap::new();
        let mut base = 0;
        for (path, (map, shard_entries)) in &mapped {
            block[base..base + map.len()].copy_from_slice(map);
            let shard = path.file_name().unwrap_or_default().to_string_lossy();
            for (name, entry) in shard_entries {
                if let Some(first) = found_in.get(name) {
                    let first = first.file_name().unwrap_or_default().to_string_lossy();
                    return Err(invalid(path, format!("tensor `{name}` is also in shard `{first}`: a checkpoint holds each tensor once")));
                }
                match parsed.weight_map.get(name) {
                    Some(listed) if *listed == shard => {}
                    Some(listed) => {
                        return Err(invalid(path, format!("holds tensor `{name}`, which the index places in shard `{listed}`")));
                    }
                    None => return Err(invalid(path, format!("holds tensor `{name}`, which the index does not list"))),
                }
                found_in.insert(name.clone(), path.clone());
                let bytes = base + entry.bytes.start..base + entry.bytes.end;
                entries.insert(name.clone(), Entry { dtype: entry.dtype, shape: entry.shape.clone(), bytes });
            }
            base += map.len().next_multiple_of(64);
        }
        if let Some((name, shard)) = parsed.weight_map.iter().find(|(name, _)| !found_in.contains_key(*name)) {
            return Err(invalid(index, format!("lists tensor `{name}` in shard `{shard}`, which does not hold it")));
        }
        let map = block.make_read_only().map_err(io)?;
        let entries = canonical_names(entries).map_err(|reason| invalid(index, reason))?;
        Ok(TensorFile { path: index.to_path_buf(), map, entries, used: BTreeSet::new(), pages: Vec::new(), saved: None })
    }

    /// Maps the safetensors file at `path`: the mapping, and each tensor's dtype, shape and byte
    /// range in it.
    fn map_file(path: &Path) -> Result<(Mmap, BTreeMap<String, Entry>), Error> {
        let io = |source| Error::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the file is mapped read-only. Like every memory-mapped loader, this assumes
        // that no other process truncates or rewrites the file while the model is loaded.
        let map = unsafe { MmapOptions::new().map(&file) }.map_err(io)?;
        // Huge pages first: the pages that this mapping reads from disk then enter the page
        // cache as 2 MiB folios, which this run and every later one map with one entry each
        // (pages already cached in smaller folios stay as they are). A decode step streams
        // every weight: at stories110M's shapes, with a third of the file in huge folios, it ran
        // 1.17x slower than from a copy in anonymous huge pages, and with all of it as fast as
        // the copy; at stories15M's the mapping took 0.9 ms instead of 3.8 (bench/RESULTS.md).
        // Then every page is mapped now, in one call, rather than one page fault at a time
        // during the first forward pass. Both are advice: a
        // kernel without them (`MADV_POPULATE_READ` needs Linux 5.14) maps the same bytes.
        #[cfg(target_os = "linux")]
        {
            let _ = map.advise(memmap2::Advice::HugePage);
            let _ = map.advise(memmap2::Advice::PopulateRead);
        }
        let invalid = |reason: String| Error::InvalidWeights { path: path.to_path_buf(), reason };
        let parsed = SafeTensors::deserialize(&map).map_err(|e| invalid(e.to_string()))?;
        let base = map.as_ptr() as usize;
        let mut entries = BTreeMap::new();
        for (name, view) in parsed.iter() {
            let start = view.data().as_ptr() as usize - base;
            let entry = Entry {
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                bytes: start..start + view.data().len(),
            };
            entries.insert(name.to_string(), entry);
        }
        Ok((map, entries))
    }

    /// The same file, keeping a copy of each tensor it hands out, as the model holds it, for
    /// [`Storage::save`].
    pub fn saving(mut self) -> TensorFile {
        self.saved = Some(Vec::new());
        self
    }

    /// Keeps `bytes`, tensor `name` as the model holds it, when saving (once per name: a
    /// tied embedding is read twice).
    pub(crate) fn save(&mut self, name: &str, dtype: Dtype, shape: &[usize], bytes: impl FnOnce() -> Vec<u8>) {
        if let Some(saved) = &mut self.saved
            && saved.iter().all(|s| s.name != name)
        {
            saved.push(Saved { name: name.to_string(), dtype, shape: shape.to_vec(), bytes: bytes() });
        }
    }

    /// The tensor `name` as f32, which must have exactly `shape`: a slice of the file when it
    /// holds F32, a widened copy when it holds BF16 or F16 (exactly representable in f32).
    pub fn f32(&mut self, name: &str, shape: &[usize]) -> Result<Tensor, Error> {
        let tensor = self.read_f32(name, shape)?;
        self.save(name, Dtype::F32, shape, || tensor.iter().flat_map(|v| v.to_le_bytes()).collect());
        Ok(tensor)
    }

    /// [`TensorFile::f32`], without keeping a copy when saving.
    pub(crate) fn read_f32(&mut self, name: &str, shape: &[usize]) -> Result<Tensor, Error> {
        let (dtype, range) = self.checked(name, shape)?;
        let bytes = &self.map[range.clone()];
        if dtype == Dtype::F32 && bytes.as_ptr().align_offset(std::mem::align_of::<f32>()) == 0 {
            return Ok(Tensor { ptr: bytes.as_ptr().cast(), len: bytes.len() / 4 });
        }
        // BF16 and F16 (as Hugging Face checkpoints often are) widen to f32 once, here; an F32
        // tensor that the file placed at an offset that is not a multiple of 4 is copied.
        self.copy_f32(dtype, range)
    }

    /// The tensor at `range` of the file, which holds it as `dtype` (F32, BF16 or F16), as f32
    /// values in the huge pages of [`TensorFile::pages_for`], on a cache line. A decode step
    /// streams such a copy as it streams the mapping; a `Box<[f32]>` would start 16 bytes into
    /// a 4 KiB page (bench/RESULTS.md: packed matrices in such copies decoded 1.26x slower).
    pub(crate) fn copy_f32(&mut self, dtype: Dtype, range: Range<usize>) -> Result<Tensor, Error> {
        let len = range.len() / if dtype == Dtype::F32 { 4 } else { 2 };
        let at = self.pages_for(len * size_of::<f32>())?.cast::<f32>();
        // SAFETY: `pages_for` handed out room for `len` values, on a cache line, that nothing
        // else points to.
        let copy = unsafe { std::slice::from_raw_parts_mut(at, len) };
        let bytes = &self.map[range];
        if dtype == Dtype::F32 {
            for (value, b) in copy.iter_mut().zip(bytes.chunks_exact(4)) {
                *value = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        } else {
            for (value, widened) in copy.iter_mut().zip(widened(dtype, bytes)) {
                *value = widened;
            }
        }
        Ok(Tensor { ptr: at, len })
    }

    /// The f32 values of `range` (in `map`): a slice of the mapping when it starts on a cache
    /// line, as a saved model places its packed matrices, else an aligned copy.
    pub(crate) fn slice_f32(&mut self, range: Range<usize>) -> Result<Tensor, Error> {
        let bytes = &self.map[range.clone()];
        if bytes.as_ptr().align_offset(64) == 0 {
            return Ok(Tensor { ptr: bytes.as_ptr().cast(), len: bytes.len() / 4 });
        }
        self.copy_f32(Dtype::F32, range)
    }

    /// A copy of `values` in the huge pages of [`TensorFile::pages_for`], on a cache line (a
    /// `Vec` of that size starts 16 bytes into a 4 KiB page).
    pub(crate) fn in_pages(&mut self, values: &[f32]) -> Result<Tensor, Error> {
        let at = self.pages_for(size_of_val(values))?.cast::<f32>();
        // SAFETY: `pages_for` handed out room for `values`, on a cache line, that nothing else
        // points to.
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), at, values.len()) };
        Ok(Tensor { ptr: at, len: values.len() })
    }

    /// The dtype and byte range (in `map`) of tensor `name` once it is known
    /// to exist with exactly `shape` and a dtype this crate reads (F32, BF16 or F16); marks it
    /// used.
    pub(crate) fn checked(&mut self, name: &str, shape: &[usize]) -> Result<(Dtype, Range<usize>), Error> {
        self.checked_as(name, shape, &[Dtype::F32, Dtype::BF16, Dtype::F16], "F32, BF16 or F16")
    }

    /// [`TensorFile::checked`], for a tensor that may hold one of `dtypes` (`expected` names
    /// them in an error).
    pub(crate) fn checked_as(
        &mut self,
        name: &str,
        shape: &[usize],
        dtypes: &[Dtype],
        expected: &'static str,
    ) -> Result<(Dtype, Range<usize>), Error> {
        let Some(entry) = self.entries.get(name) else {
            if self.entries.contains_key(&format!("{name}{PACKED}")) {
                // Saved by a crate whose matmul packs its weights.
                return Err(Error::WrongLayout {
                    name: format!("{name}{PACKED}"),
                    expected: "it unpacked",
                    found: self.packed_layout(),
                });
            }
            // A checkpoint of another architecture lacks every tensor: say that, not which.
            let found = self.entries.keys().find_map(|k| architecture_of(k));
            if let (Some(expected), Some(found)) = (architecture_of(name), found)
                && expected != found
            {
                return Err(Error::WrongArchitecture { path: self.path.clone(), expected, found });
            }
            return Err(Error::MissingTensor { path: self.path.clone(), name: name.to_string() });
        };
        if !dtypes.contains(&entry.dtype) {
            return Err(Error::WrongDtype { name: name.to_string(), expected, found: format!("{:?}", entry.dtype) });
        }
        if entry.shape != shape {
            return Err(Error::WrongShape {
                name: name.to_string(),
                expected: shape.to_vec(),
                found: entry.shape.clone(),
            });
        }
        self.used.insert(name.to_string());
        Ok((entry.dtype, entry.bytes.clone()))
    }

    /// The layout that the file's packed matrices are in, as its `monogen.packed_layout` names it.
    fn packed_layout(&self) -> String {
        self.entries.get(PACKED_LAYOUT).filter(|entry| entry.dtype == Dtype::U8).map_or_else(
            || format!("a layout that it does not name (it holds no {PACKED_LAYOUT} of U8)"),
            |entry| format!("`{}`", String::from_utf8_lossy(&self.map[entry.bytes.clone()])),
        )
    }

    /// The byte range (in `map`) of the `[rows, cols]` matrix `name` as this crate's matmul
    /// kernel packed it, when the file is a saved model that holds it so (`name.packed`, 1-D,
    /// `len` values of `dtype`, in the layout `kernels::PACKED_LAYOUT`); `None` when the file
    /// holds `name` unpacked, for the caller to pack. Marks it used, and keeps it when saving.
    pub(crate) fn packed_entry(
        &mut self,
        name: &str,
        dtype: Dtype,
        expected: &'static str,
        len: usize,
    ) -> Result<Option<Range<usize>>, Error> {
        let packed = format!("{name}{PACKED}");
        if !self.entries.contains_key(&packed) {
            return Ok(None);
        }
        let layout = crate::kernels::PACKED_LAYOUT;
        let named = self.entries.get(PACKED_LAYOUT);
        if !named.is_some_and(|e| e.dtype == Dtype::U8 && self.map[e.bytes.clone()] == *layout.as_bytes()) {
            return Err(Error::WrongLayout { name: packed, expected: layout, found: self.packed_layout() });
        }
        self.used.insert(PACKED_LAYOUT.to_string());
        let (_, range) = self.checked_as(&packed, &[len], &[dtype], expected)?;
        if self.saved.is_some() {
            let bytes = self.map[range.clone()].to_vec();
            self.save_packed(name, dtype, len, || bytes);
        }
        Ok(Some(range))
    }

    /// Keeps `bytes`, the `len` values of `dtype` into which this crate's matmul kernel packed
    /// matrix `name`, when saving: as `name.packed`, with the layout's name.
    pub(crate) fn save_packed(&mut self, name: &str, dtype: Dtype, len: usize, bytes: impl FnOnce() -> Vec<u8>) {
        let layout = crate::kernels::PACKED_LAYOUT;
        self.save(PACKED_LAYOUT, Dtype::U8, &[layout.len()], || layout.as_bytes().to_vec());
        self.save(&format!("{name}{PACKED}"), dtype, &[len], bytes);
    }

    /// Room for `bytes` bytes, 64-byte aligned and zero, in anonymous memory asked for in huge
    /// pages, which the storage keeps: chunks of 64 MiB (or one matrix, if larger), the
    /// matrices one after the other, so that the small ones share huge pages too. A decode step
    /// streams every matrix: at stories110M's shapes it ran 15% faster from these pages than
    /// from 4 KiB ones (bench/RESULTS.md), and the load takes a page fault per 2 MiB rather
    /// than per 4 KiB. Each matrix starts on a cache line: AMX tile loads from 16 bytes off one
    /// took about 6 times as long.
    pub(crate) fn pages_for(&mut self, bytes: usize) -> Result<*mut u8, Error> {
        const CHUNK: usize = 64 << 20;
        const HUGE_PAGE: usize = 2 << 20;
        let bytes = bytes.next_multiple_of(64);
        if self.pages.last().is_none_or(|(pages, used)| used + bytes > pages.len()) {
            let io = |source| Error::Io { path: self.path.clone(), source };
            let pages = MmapMut::map_anon(bytes.max(CHUNK).next_multiple_of(HUGE_PAGE)).map_err(io)?;
            // Huge pages when the kernel grants them; the copies work either way.
            #[cfg(target_os = "linux")]
            let _ = pages.advise(memmap2::Advice::HugePage);
            self.pages.push((pages, 0));
        }
        let (pages, used) = self.pages.last_mut().expect("a chunk with room was just added");
        let at = pages.as_mut_ptr().wrapping_add(*used);
        *used += bytes;
        Ok(at)
    }

    /// The bytes of `range` (in `map`) where they start on a cache line, as a saved model places
    /// its packed matrices (AMX tile loads ran about 6 times as long from 16 bytes off one), else
    /// a copy in huge pages.
    pub(crate) fn on_cache_line(&mut self, range: Range<usize>) -> Result<*const u8, Error> {
        if self.map[range.clone()].as_ptr().align_offset(64) == 0 {
            return Ok(self.map[range].as_ptr());
        }
        let at = self.pages_for(range.len())?;
        // SAFETY: `pages_for` handed out room for the range's bytes, aligned, that nothing else
        // points to; the mapping does not overlap it.
        unsafe { std::ptr::copy_nonoverlapping(self.map[range.clone()].as_ptr(), at, range.len()) };
        Ok(at)
    }

    /// Ends loading: the storage behind the tensors, and a warning for each tensor in the
    /// file that the model did not ask for and that is not in `ignored` (tensors a checkpoint
    /// of this architecture carries and the model knowingly leaves out).
    pub fn finish(self, ignored: &[&str]) -> (Storage, Vec<String>) {
        let warnings = self
            .entries
            .keys()
            .filter(|name| !self.used.contains(*name) && !ignored.contains(&name.as_str()))
            .map(|name| format!("tensor `{name}` in {} is not used by this model", self.path.display()))
            .collect();
        let saved = self.saved.unwrap_or_default();
        (Storage { _map: self.map, _pages: self.pages, saved }, warnings)
    }
}

impl Storage {
    /// Writes `path`, a safetensors file of every tensor the model read from a file opened
    /// with [`TensorFile::saving`], each as the model holds it (matrices converted to the
    /// workload's dtype, unpacked), so that loading it maps them rather than converting them
    /// again. The file appears whole or not at all: it is written beside `path`, then renamed.
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        use std::io::Write;
        let io = |source| Error::Io { path: path.to_path_buf(), source };
        // One entry: the crate writes the header's metadata from a hash map, and a single entry
        // keeps the file the same, byte for byte, from one run to the next.
        let metadata = [("monogen.workload".to_string(), crate::WORKLOAD.to_string())];
        let bytes = safetensors::serialize(self.saved.iter().map(|s| (s.name.as_str(), s)), Some(metadata.into()))
            .map_err(|e| Error::InvalidWeights { path: path.to_path_buf(), reason: e.to_string() })?;
        let mut partial = path.as_os_str().to_owned();
        partial.push(".partial");
        let partial = PathBuf::from(partial);
        // Written 2 MiB at a time, at offsets that are multiples of 2 MiB: a file system that
        // caches files in large folios (ext4 on Linux 6.18, here) then keeps this one in 2 MiB folios,
        // which every run maps by the entry (see `TensorFile::open`), where writes of 1 MiB (the
        // safetensors crate's own writer) left it in smaller ones. A stories15M int8 file came
        // out 16 of 16 MiB in huge folios instead of 8 (bench/RESULTS.md).
        // The header padded with spaces (as the format allows) so that the data start 64 bytes
        // into the file: a packed matrix at an offset in the data that is a multiple of 64 (they
        // all are, where every tensor before it has a length that is one) is then mapped on a
        // cache line, where the products read it fastest.
        let header = u64::from_le_bytes(bytes[..8].try_into().expect("a serialized file starts with its header's length"));
        let header = 8 + usize::try_from(header).expect("the header was serialized in memory");
        let padded = header.next_multiple_of(64);
        let mut head = Vec::with_capacity(padded);
        head.extend_from_slice(&((padded - 8) as u64).to_le_bytes());
        head.extend_from_slice(&bytes[8..header]);
        head.resize(padded, b' ');
        let data = &bytes[header..];
        let first = data.len().min((2 << 20) - padded % (2 << 20));
        let written = File::create(&partial).and_then(|mut file| {
            file.write_all(&head)?;
            file.write_all(&data[..first])?;
            for chunk in data[first..].chunks(2 << 20) {
                file.write_all(chunk)?;
            }
            file.sync_data()
        });
        if let Err(source) = written {
            let _ = std::fs::remove_file(&partial);
            return Err(io(source));
        }
        std::fs::rename(&partial, path).map_err(io)
    }
}

/// Writes model directory `out` from model directory `dir` (`Model::save_model`): creates it,
/// copies the JSON files of `dir` (config, tokenizer) into it, then has `save` read
/// `dir/model.safetensors` and write `out/model.safetensors`; returns `save`'s warnings. `out`
/// must not be `dir`, whose weights it would replace.
pub fn save_model(
    dir: &Path,
    out: &Path,
    save: impl FnOnce(&Path, &Path) -> Result<Vec<String>, Error>,
) -> Result<Vec<String>, Error> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    std::fs::create_dir_all(out).map_err(io(out))?;
    if std::fs::canonicalize(dir).map_err(io(dir))? == std::fs::canonicalize(out).map_err(io(out))? {
        return Err(Error::InvalidParameter {
            name: "output directory",
            reason: format!("{} is the model directory itself; give a new one", out.display()),
        });
    }
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let path = entry.map_err(io(dir))?.path();
        // A sharded checkpoint's index stays behind: `out` gets one file, which it maps.
        if path.is_file() && path.extension().is_some_and(|e| e == "json") && !path.ends_with(INDEX) {
            // Read and written rather than copied, so that `out` gets files it can write again
            // (a copy keeps the permissions of read-only models).
            let to = out.join(path.file_name().expect("a file read from a directory has a name"));
            std::fs::write(&to, std::fs::read(&path).map_err(io(&path))?).map_err(io(&to))?;
        }
    }
    save(&dir.join("model.safetensors"), &out.join("model.safetensors"))
}

/// The values of `bytes`, a tensor of 2-byte `dtype` (BF16 or F16), as f32.
pub(crate) fn widened(dtype: Dtype, bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
    let bf16 = dtype == Dtype::BF16;
    bytes.chunks_exact(2).map(move |b| {
        let bits = u16::from_le_bytes([b[0], b[1]]);
        if bf16 { bf16_to_f32(bits) } else { f16_to_f32(bits) }
    })
}

/// The f32 value of a bfloat16: its 16 bits are the high half of an f32.
fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// The f32 value of an IEEE half: sign, then a 5-bit exponent (bias 15) and 10-bit fraction,
/// with subnormals, infinities and NaN.
fn f16_to_f32(bits: u16) -> f32 {
    let sign = if bits & 0x8000 == 0 { 1.0 } else { -1.0 };
    let exponent = i32::from((bits >> 10) & 0x1f);
    let fraction = f32::from(bits & 0x3ff);
    if exponent == 0 {
        sign * fraction * (-24f32).exp2()
    } else if exponent < 31 {
        sign * (1.0 + fraction / 1024.0) * ((exponent - 15) as f32).exp2()
    } else if fraction == 0.0 {
        sign * f32::INFINITY
    } else {
        f32::NAN
    }
}

/// The tensors of a checkpoint under the names this crate reads: a BERT checkpoint saved with
/// its task head (`BertForMaskedLM` and the like) prefixes its encoder's names with `bert.`,
/// and a LLaMA saved without its head (`LlamaModel`) leaves out the `model.` that
/// `LlamaForCausalLM` puts before every name but `lm_head`'s. A checkpoint that holds a tensor
/// under both names is refused, naming it.
fn canonical_names(entries: BTreeMap<String, Entry>) -> Result<BTreeMap<String, Entry>, String> {
    let headless_llama = !entries.keys().any(|k| k.starts_with("model."))
        && entries.keys().any(|k| k.starts_with("layers.") || k.starts_with("embed_tokens."));
    let mut out = BTreeMap::new();
    let mut from: BTreeMap<String, String> = BTreeMap::new();
    for (name, entry) in entries {
        let canonical = if let Some(rest) = name.strip_prefix("bert.") {
            rest.to_string()
        } else if headless_llama && !name.starts_with("lm_head.") {
            format!("model.{name}")
        } else {
            name.clone()
        };
        if let Some(other) = from.get(&canonical) {
            return Err(format!("holds `{canonical}` twice over, as `{other}` and as `{name}`"));
        }
        from.insert(canonical.clone(), name);
        out.insert(canonical, entry);
    }
    Ok(out)
}

/// The kind of model a Hugging Face tensor name belongs to, where the name tells.
fn architecture_of(name: &str) -> Option<&'static str> {
    let name = name.strip_prefix("bert.").unwrap_or(name);
    if name.starts_with("model.layers.") || name.starts_with("model.embed_tokens.") || name.starts_with("lm_head.")
    {
        Some("a LLaMA-style decoder")
    } else if name.starts_with("encoder.layer.") || name.starts_with("embeddings.word_embeddings.") {
        Some("a BERT encoder")
    } else {
        None
    }
}
