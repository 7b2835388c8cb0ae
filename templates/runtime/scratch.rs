//! A session's activation buffers, one after the other in one region of anonymous memory asked
//! for in huge pages. A fresh buffer's every 4 KiB page faults on its first write, and a
//! session's first prefill writes them all: at stories15M's shapes (2 threads, an AMD EPYC of
//! Zen 3 under KVM) the faults of the activations and of the KV cache took about 3.7 ms of a
//! 22 ms prefill of 128 tokens (bench/RESULTS.md). In huge pages the activations fault once per
//! 2 MiB instead. The kernel's zero pages make every buffer start at zero, as `vec![0.0; n]`
//! did.

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use memmap2::MmapMut;

/// Bytes of a huge page: a region of at least half of one is rounded up to whole ones, so that
/// all of it can be mapped by them.
const HUGE_PAGE: usize = 2 << 20;

/// The region the buffers are cut from.
pub struct Scratch {
    _map: MmapMut,
}

impl Scratch {
    /// Buffers of `lens` f32 values, all zero, each on a cache line of its own, and the region
    /// that holds them. Aborts the process if the memory cannot be mapped, as a failed
    /// allocation does.
    pub fn buffers<const N: usize>(lens: [usize; N]) -> (Scratch, [Buffer; N]) {
        let room = |len: usize| (len * size_of::<f32>()).next_multiple_of(64);
        let bytes = lens.iter().map(|&len| room(len)).sum::<usize>().max(1);
        let bytes = if bytes >= HUGE_PAGE / 2 { bytes.next_multiple_of(HUGE_PAGE) } else { bytes };
        let Ok(mut map) = MmapMut::map_anon(bytes) else {
            let layout = std::alloc::Layout::from_size_align(bytes, 64).expect("a region's size");
            std::alloc::handle_alloc_error(layout);
        };
        // Huge pages when the kernel grants them; the buffers work either way.
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        let base = map.as_mut_ptr();
        let mut at = 0;
        let buffers = lens.map(|len| {
            // SAFETY: the buffers' rooms, one after the other, fill at most the mapping, whose
            // start is page-aligned: each buffer starts on a 64-byte boundary inside it.
            let ptr = unsafe { base.add(at) }.cast::<f32>();
            at += room(len);
            Buffer { ptr: NonNull::new(ptr).expect("a mapping is never at address 0"), len }
        });
        (Scratch { _map: map }, buffers)
    }
}

/// Values in a [`Scratch`], which must outlive it: the session that holds both holds them
/// together. It dereferences to `[f32]`.
pub struct Buffer {
    ptr: NonNull<f32>,
    len: usize,
}

// SAFETY: a Buffer is the only way to its values (no two buffers share a byte),
// like a Vec<f32> of its own, and its Scratch lives as long as it does.
unsafe impl Send for Buffer {}
// SAFETY: as above; shared references only read.
unsafe impl Sync for Buffer {}

impl Deref for Buffer {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        // SAFETY: `len` values, zero or written since, alive while the Scratch is (see Buffer).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference to the values.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}
