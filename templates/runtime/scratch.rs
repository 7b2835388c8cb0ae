//! A session's activation buffers, one after the other in one region of anonymous memory asked
//! for in huge pages. A fresh buffer's every 4 KiB page faults on its first write, and a
//! session's first prefill writes them all: at stories15M's shapes (2 threads, an AMD EPYC of
//! Zen 3 under KVM) the faults of the activations and of the KV cache took about 3.7 ms of a
//! 22 ms prefill of 128 tokens (bench/RESULTS.md). In huge pages the activations fault once per
//! 2 MiB instead. The kernel's zero pages make every buffer start at zero, as `vec![0.0; n]`
//! did.
//!
//! A buffer that is copied to or from other memory in large pieces can start at that memory's
//! offset within a 4 KiB page (`Room::like`): glibc's `memcpy` (2.36, Debian 12) copies them
//! with `rep movsb` on CPUs with fast short `rep movsb` (FSRM), which on an AMD EPYC (Zen 3)
//! moved 147 KB at about 2 GB/s instead of about 45 when the destination lay 4 to 28 bytes past
//! the source modulo 4096. A session's new keys and values, whose prefill copies them into the
//! KV cache (a `Vec` that the allocator placed 16 bytes into a page), then started on a page:
//! at stories15M's shapes those stores took 2.4 ms of a 24 ms prefill, and 1.5 ms after.

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use memmap2::MmapMut;

/// Bytes of a huge page: a region of at least half of one is rounded up to whole ones, so that
/// all of it can be mapped by them.
const HUGE_PAGE: usize = 2 << 20;

/// Bytes of a small page, within which `Room::like` places a buffer.
const PAGE: usize = 4096;

/// The region the buffers are cut from.
pub struct Scratch {
    _map: MmapMut,
}

/// A buffer that [`Scratch::buffers`] cuts out: its length in f32 values, and where it starts.
#[derive(Clone, Copy)]
pub struct Room {
    len: usize,
    /// The offset within a page to start at; `None` for the next cache line.
    page_offset: Option<usize>,
}

impl Room {
    /// `len` values on a cache line of their own.
    pub fn new(len: usize) -> Room {
        Room { len, page_offset: None }
    }

    /// `len` values that start at the offset within a page of `like`'s first value (rounded
    /// down to a whole f32), for a buffer copied to or from `like` in large pieces.
    pub fn like<T>(len: usize, like: &[T]) -> Room {
        let offset = like.as_ptr() as usize % PAGE;
        Room { len, page_offset: Some(offset - offset % size_of::<f32>()) }
    }

    /// Where the room starts at or after byte `at` of the region, whose start is page-aligned.
    fn start(self, at: usize) -> usize {
        match self.page_offset {
            None => at.next_multiple_of(64),
            Some(offset) => at + (offset + PAGE - at % PAGE) % PAGE,
        }
    }
}

impl Scratch {
    /// Buffers of `rooms`' lengths in f32 values, all zero, each where its room says, and the
    /// region that holds them. Aborts the process if the memory cannot be mapped, as a failed
    /// allocation does.
    pub fn buffers<const N: usize>(rooms: [Room; N]) -> (Scratch, [Buffer; N]) {
        let mut starts = [0; N];
        let mut at = 0;
        for (start, room) in starts.iter_mut().zip(&rooms) {
            *start = room.start(at);
            at = *start + room.len * size_of::<f32>();
        }
        let bytes = at.max(1);
        let bytes = if bytes >= HUGE_PAGE / 2 { bytes.next_multiple_of(HUGE_PAGE) } else { bytes };
        let Ok(mut map) = MmapMut::map_anon(bytes) else {
            let layout = std::alloc::Layout::from_size_align(bytes, 64).expect("a region's size");
            std::alloc::handle_alloc_error(layout);
        };
        // Huge pages when the kernel grants them; the buffers work either way.
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        let base = map.as_mut_ptr();
        let buffers = std::array::from_fn(|i| {
            // SAFETY: the rooms, one after the other, fill at most the mapping, whose start is
            // page-aligned: each buffer starts on a multiple of 4 bytes inside it.
            let ptr = unsafe { base.add(starts[i]) }.cast::<f32>();
            Buffer { ptr: NonNull::new(ptr).expect("a mapping is never at address 0"), len: rooms[i].len }
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
