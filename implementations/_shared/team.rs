//! A persistent team of `crate::THREADS − 1` worker threads that share the work of the calling
//! thread's kernels: each call is cut into `THREADS` ranges of its columns (a matrix product's
//! weight rows, an attention's kv heads), so that every thread reads its part of the weights
//! or of the cache and no more.
//!
//! The workers start at the first call that has enough work and live as long as the process.
//! Between calls they spin for [`SPIN`] (a forward pass makes the next call within
//! microseconds, far sooner than a sleeping thread could be woken), then sleep on a condition
//! variable until the next call. The caller publishes its job, computes the first share itself
//! and waits for the others: every call splits the same way, into `THREADS` shares fixed by the
//! baked thread count, and nothing is decided at run time but whether the call is large enough
//! to share.
//!
//! The crate has one team, whatever kernels use it: each such kernel hands it a [`Job`]
//! (`job.rs`; most are the work types of shared modules, which a kernel's manifest names as its
//! `team_job`), and the crate's `kernels::TeamJob` enum (which monogen writes, one variant per
//! job type) is what the workers run. So the matrix products and the attention
//! of a forward pass take turns on the same two cores instead of bringing two sets of spinning
//! workers onto them.
//!
//! One job runs on the team at a time. A call made while the team is busy (sessions on
//! several threads) is computed whole on its own thread, which is then the better use of the
//! cores anyway.
#![allow(dead_code)]

use std::cell::UnsafeCell;
use std::ops::Range;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub use super::job::{Extent, Job};
use crate::kernels::TeamJob;

/// Work (multiply-adds, or as many of a kernel's steps) below which a call stays on the calling
/// thread: handing it over costs about a microsecond.
const MIN_SHARED_WORK: usize = 1 << 16;

/// How long an idle worker spins before it sleeps.
const SPIN: Duration = Duration::from_micros(200);

/// The workers, and the job they share.
struct Team {
    /// The job being shared; written by the caller only while every worker is idle.
    job: UnsafeCell<Option<TeamJob>>,
    /// Counts published jobs; workers wait for it to change.
    generation: AtomicUsize,
    /// Workers done with the current job.
    finished: AtomicUsize,
    /// Held by the caller whose job is on the team.
    busy: AtomicBool,
    /// Workers asleep (or about to sleep) on `wake`.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    /// Whether the workers started (`false` if the system refused a thread).
    started: OnceLock<bool>,
}

// SAFETY: `job` is written only by the holder of `busy` while no worker reads it (all have
// finished the previous job), and read by workers only after the `generation` increment that
// publishes it.
unsafe impl Sync for Team {}

/// The crate's team; its workers start with its first shared call.
static TEAM: Team = Team {
    job: UnsafeCell::new(None),
    generation: AtomicUsize::new(0),
    finished: AtomicUsize::new(0),
    busy: AtomicBool::new(false),
    sleepers: AtomicUsize::new(0),
    lock: Mutex::new(()),
    wake: Condvar::new(),
    started: OnceLock::new(),
};

/// Computes `job`, shared by the team when it is large enough and the team is free.
///
/// # Safety
///
/// As for [`Job::columns`] over all of the job's columns.
pub(crate) unsafe fn run<J: Job>(job: J)
where
    TeamJob: From<J>,
{
    let team = &TEAM;
    let threads = crate::THREADS;
    let extent = job.extent();
    let n = extent.columns;
    let shared = threads > 1 && extent.work >= MIN_SHARED_WORK && !team.busy.swap(true, Acquire);
    if !shared {
        // SAFETY: the caller's contract.
        unsafe { job.columns(0..n) };
        return;
    }
    if !*team.started.get_or_init(start_workers) {
        team.busy.store(false, Release);
        // SAFETY: the caller's contract.
        unsafe { job.columns(0..n) };
        return;
    }
    team.finished.store(0, Relaxed);
    // SAFETY: this thread holds `busy` and every worker has finished the previous job.
    unsafe { *team.job.get() = Some(TeamJob::from(job)) };
    team.generation.fetch_add(1, SeqCst);
    if team.sleepers.load(SeqCst) > 0 {
        let _guard = team.lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        team.wake.notify_all();
    }
    // The workers use the job's operands until they report: a panic that unwound past here
    // would free them first.
    let abort = AbortOnUnwind;
    // SAFETY: the caller's contract; the shares are disjoint column ranges.
    unsafe { job.columns(share(0, n, extent.granule)) };
    let mut spins = 0u32;
    while team.finished.load(Acquire) < threads - 1 {
        spins = spins.saturating_add(1);
        if spins < 1 << 11 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    team.busy.store(false, Release);
    drop(abort);
}

/// Aborts the process if dropped while its thread unwinds from a panic: a share that panics
/// (a bug) must neither leave its caller waiting forever for a worker that died nor unwind the
/// caller while the workers still use its operands.
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("a share of the thread team panicked; aborting");
            std::process::abort();
        }
    }
}

/// The columns of thread `index`: `THREADS` runs of equal length, rounded up to a multiple of
/// `granule` (the job's tiles or blocks of columns).
fn share(index: usize, n: usize, granule: usize) -> Range<usize> {
    let run = n.div_ceil(crate::THREADS).next_multiple_of(granule);
    let start = (index * run).min(n);
    start..(start + run).min(n)
}

fn start_workers() -> bool {
    (1..crate::THREADS).all(|index| {
        std::thread::Builder::new().name(format!("team-{index}")).spawn(move || work(index)).is_ok()
    })
}

/// A worker's life: wait for a job, compute share `index`, report, and again.
fn work(index: usize) {
    let team = &TEAM;
    let mut seen = 0;
    loop {
        seen = next_generation(team, seen);
        // SAFETY: the generation was published after the job was written (acquired in
        // `next_generation`), and the job stays unchanged until this worker reports.
        let job = unsafe { *team.job.get() }.expect("a job is published before its generation");
        let abort = AbortOnUnwind;
        let extent = job.extent();
        // SAFETY: the publisher's contract, and the workers' shares are disjoint.
        unsafe { job.columns(share(index, extent.columns, extent.granule)) };
        drop(abort);
        team.finished.fetch_add(1, Release);
    }
}

/// Waits until the generation differs from `seen`: spinning for [`SPIN`], then asleep.
fn next_generation(team: &Team, seen: usize) -> usize {
    let start = Instant::now();
    loop {
        for _ in 0..64 {
            let generation = team.generation.load(Acquire);
            if generation != seen {
                return generation;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() > SPIN {
            break;
        }
    }
    let mut guard = team.lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    team.sleepers.fetch_add(1, SeqCst);
    loop {
        let generation = team.generation.load(SeqCst);
        if generation != seen {
            team.sleepers.fetch_sub(1, SeqCst);
            return generation;
        }
        guard = team.wake.wait(guard).unwrap_or_else(|poisoned| poisoned.into_inner());
    }
}
