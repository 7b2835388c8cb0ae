//! A KV cache's `store` of several positions, shared by the crate's team (`shared/team.rs`):
//! one thread writes the keys, another the values.
//!
//! Why: a session's first prefill writes pages of the cache that the process has never
//! touched, and each of them faults and is zeroed on its first write. Under KVM on an AMD EPYC
//! (Zen 5) that cost about 5 µs per 4 KiB page, so that the store of a 128-token prefill at
//! stories110M's shapes (9.4 MB of f32 keys and values over 12 layers) took 4.4-4.9 ms of a
//! 79 ms prefill on the calling thread, while the team's other thread waited. Touching 9.4 MB
//! of fresh pages took 3.2-4.4 ms on one thread and 1.8-2.0 ms on two (bench/RESULTS.md).
//!
//! A store is two columns of work, the keys (0) and the values (1); with one thread, or for a
//! store too small to share (a decode step's one position), the calling thread writes both.
#![allow(dead_code)]

use std::ops::Range;

use super::job::{Extent, Job};

/// How a cache writes the f32 values it is given into its elements.
pub trait Write: Copy + Send + Sync + 'static {
    /// An element of the cache.
    type Element: Copy;

    /// Writes `src` into `dst`, which is as long.
    ///
    /// # Safety
    ///
    /// The CPU has what the implementation's constraints declare.
    unsafe fn write(self, dst: &mut [Self::Element], src: &[f32]);
}

/// f32 values stored as they are.
#[derive(Clone, Copy)]
pub struct AsIs;

impl Write for AsIs {
    type Element = f32;

    #[inline]
    unsafe fn write(self, dst: &mut [f32], src: &[f32]) {
        dst.copy_from_slice(src);
    }
}

/// Each value stored counts as this many multiply-adds of the team's threshold: a store of a
/// few positions or more is shared, and a decode step's single position stays on the calling
/// thread (at stories110M, 768 keys and 768 values: 24 576 against the team's 65 536; from 3
/// positions on, a store is shared).
const STEPS_PER_VALUE: usize = 16;

/// One store: the keys and values of consecutive positions, and where they go.
#[derive(Clone, Copy)]
pub struct Split<W: Write> {
    how: W,
    dst: [*mut W::Element; 2],
    src: [*const f32; 2],
    len: usize,
}

// SAFETY: pointers to slices that the caller of `Split::new` keeps borrowed until every share
// is done; the two columns write disjoint slices.
unsafe impl<W: Write> Send for Split<W> {}
unsafe impl<W: Write> Sync for Split<W> {}

impl<W: Write> Split<W> {
    /// The store of `k` into `keys` and of `v` into `values`, all four as long.
    pub fn new(how: W, keys: &mut [W::Element], values: &mut [W::Element], k: &[f32], v: &[f32]) -> Self {
        assert!(
            keys.len() == k.len() && values.len() == v.len() && k.len() == v.len(),
            "kv_split: the keys, the values and their places must be as long"
        );
        Split {
            how,
            dst: [keys.as_mut_ptr(), values.as_mut_ptr()],
            src: [k.as_ptr(), v.as_ptr()],
            len: k.len(),
        }
    }

    /// The columns: the keys and the values.
    pub fn n(&self) -> usize {
        2
    }

    /// The size of the store, in the team's steps.
    pub fn work(&self) -> usize {
        2 * self.len * STEPS_PER_VALUE
    }

    /// Writes the keys (column 0) and the values (column 1) of `cols`.
    ///
    /// # Safety
    ///
    /// The slices given to `new` are still borrowed, no other call writes the same columns at
    /// once, and the CPU has what `W` needs.
    pub unsafe fn columns(&self, cols: Range<usize>) {
        for c in cols.start..cols.end.min(2) {
            // SAFETY: `new` checked that both slices of column c hold `len` values; the
            // caller's contract keeps them alive and this column's destination unshared.
            unsafe {
                let dst = std::slice::from_raw_parts_mut(self.dst[c], self.len);
                let src = std::slice::from_raw_parts(self.src[c], self.len);
                self.how.write(dst, src);
            }
        }
    }
}

/// A cache's store as a team shares it: two columns, the keys and the values.
impl<W: Write> Job for Split<W> {
    fn extent(&self) -> Extent {
        Extent { columns: self.n(), granule: 1, work: self.work() }
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract, which `team::run` keeps.
        unsafe { self.columns(cols) }
    }
}
