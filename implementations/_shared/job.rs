//! Work that can be cut into ranges of its columns: a matrix product's weight rows, an
//! attention's kv heads, a cache's keys and values. The thread team of `team.rs` shares a [`Job`]
//! between its threads; the shared module that defines a kernel's work implements it, so that
//! every kernel on that work (one implementation per thread count, per weight type) hands the
//! same type to the team. A module that defines such work does not depend on the team: a
//! kernel on the calling thread alone uses it too, and compiles without the team.
#![allow(dead_code)]

use std::ops::Range;

/// Work that a team can share: its operands, and the work of a range of its columns.
pub trait Job: Copy + Send + 'static {
    /// How the work can be cut, and how much of it there is.
    fn extent(&self) -> Extent;

    /// Computes the columns `cols` of the output.
    ///
    /// # Safety
    ///
    /// As the job's type requires; the team calls it on disjoint ranges at once.
    unsafe fn columns(&self, cols: Range<usize>);
}

/// A job's columns, and what the team needs to know to share them.
#[derive(Clone, Copy)]
pub struct Extent {
    /// The columns of the work (a product's weight rows, an attention's kv heads).
    pub columns: usize,
    /// The multiple of columns a share starts at (all but the last share are whole multiples
    /// of it): a kernel's block of weight rows, or 1.
    pub granule: usize,
    /// The size of the whole call, in multiply-adds or steps of similar cost.
    pub work: usize,
}

/// The granule of a product whose kernel has no block of weight rows of its own: 8 columns.
pub const GRANULE: usize = 8;

impl Extent {
    /// A matrix product's: `rows` activation rows by `n` weight rows of `k` values, shared by
    /// multiples of `granule` weight rows.
    pub fn product(rows: usize, n: usize, k: usize, granule: usize) -> Extent {
        Extent { columns: n, granule, work: rows * n * k }
    }
}
