//! SwiGLU with AVX-512F (`shared/avx512_swiglu.rs`: `gate = gate · up / (1 + e^(−gate))`, 16
//! values at a time), a prefill's rows split over the crate's team. Between its gate/up and
//! down products a prefill's SwiGLU ran on the calling thread while the team's other thread
//! waited: 1.1-1.3 ms of a 79 ms prefill of 128 tokens at stories110M's shapes (bench/RESULTS.md).
//! A decode step's single row stays on the calling thread.

use std::ops::Range;

use super::shared::avx512_swiglu::swiglu_avx512;
use super::shared::team::{self, Extent, Job};

/// What a value costs, counted in the team's steps (its threshold is 65 536): an exp of about
/// a dozen operations and a division. A decode step's row of stories110M (2048 values) or of
/// TinyLlama (5632) stays below the threshold; a prefill of a few rows is shared.
const STEPS_PER_VALUE: usize = 8;

/// Overwrites `gate` with `gate / (1 + e^(−gate)) · up` for `rows` rows of `HIDDEN` values.
///
/// `gate`, `up`: `[rows, HIDDEN]`.
#[inline]
pub fn swiglu<const HIDDEN: usize>(gate: &mut [f32], up: &[f32], rows: usize) {
    let n = rows * HIDDEN;
    assert!(gate.len() >= n && up.len() >= n, "swiglu: gate or up is shorter than {rows} rows of {HIDDEN}");
    let job = Shared { gate: gate.as_mut_ptr(), up: up.as_ptr(), rows, hidden: HIDDEN };
    // SAFETY: the generated crate checks at start-up that the CPU has AVX-512F; `gate` and
    // `up` hold `rows` rows (checked above) and stay borrowed until every share is done, and
    // the team gives each thread its own rows.
    unsafe { team::run(job) }
}

/// A call of this implementation, as the crate's team shares it: by rows.
#[derive(Clone, Copy)]
pub(crate) struct Shared {
    gate: *mut f32,
    up: *const f32,
    rows: usize,
    hidden: usize,
}

// SAFETY: pointers to slices that `swiglu` keeps borrowed until every share is done; the
// shares write disjoint rows.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Job for Shared {
    fn extent(&self) -> Extent {
        Extent { columns: self.rows, granule: 1, work: self.rows * self.hidden * STEPS_PER_VALUE }
    }

    unsafe fn columns(&self, rows: Range<usize>) {
        let (at, len) = (rows.start * self.hidden, rows.len() * self.hidden);
        // SAFETY: `swiglu` checked that both slices hold `self.rows` rows, and this share's
        // rows are its own (the caller's contract); the CPU has AVX-512F.
        unsafe {
            let gate = std::slice::from_raw_parts_mut(self.gate.add(at), len);
            let up = std::slice::from_raw_parts(self.up.add(at), len);
            swiglu_avx512(gate, up)
        }
    }
}
