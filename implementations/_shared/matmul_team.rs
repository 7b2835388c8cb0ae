//! A persistent team of `crate::THREADS − 1` worker threads that share the matrix
//! products of the calling thread, each computing its own range of weight rows (output
//! columns), so that every thread reads its part of the weights and no more.
//!
//! The workers start at the first product that has enough work and live as long as the
//! process. Between products they spin for [`SPIN`] (a forward pass calls the next product
//! within microseconds, far sooner than a sleeping thread could be woken), then sleep on a
//! condition variable until the next product. The caller publishes a product, computes the
//! first share itself and waits for the others: every call splits the same way, into
//! `THREADS` shares fixed by the baked thread count, and nothing is decided at run time but
//! whether the call is large enough to share.
//!
//! Each implementation that uses a team wraps its product type in a [`Job`], which names the
//! team's `static`: the workers of one implementation share only its products.
//!
//! One product runs on the team at a time. A call made while the team is busy (sessions on
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


/// Multiply-adds below which a product stays on the calling thread: handing it over costs
/// about a microsecond.
const MIN_SHARED_MACS: usize = 1 << 16;

/// How long an idle worker spins before it sleeps.
const SPIN: Duration = Duration::from_micros(200);

/// A product that the team can share: its operands, and the work of a range of its columns.
pub trait Job: Copy + Send + 'static {
    /// The team that shares products of this type (one `static` per implementation).
    fn team() -> &'static Team<Self>;

    /// The multiple of columns a share starts at (all but the last share are whole multiples
    /// of it).
    const GRANULE: usize = 8;

    /// The columns (weight rows) of the product.
    fn n(&self) -> usize;

    /// The multiply-adds of the whole product.
    fn macs(&self) -> usize;

    /// Computes the columns `cols` of every row of the output.
    ///
    /// # Safety
    ///
    /// As the product's type requires; the team calls it on disjoint ranges at once.
    unsafe fn columns(&self, cols: Range<usize>);
}

/// The workers that share the products of one [`Job`] type.
pub struct Team<J: Job> {
    /// The product being shared; written by the caller only while every worker is idle.
    job: UnsafeCell<Option<J>>,
    /// Counts published products; workers wait for it to change.
    generation: AtomicUsize,
    /// Workers done with the current product.
    finished: AtomicUsize,
    /// Held by the caller whose product is on the team.
    busy: AtomicBool,
    /// Workers asleep (or about to sleep) on `wake`.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    /// Whether the workers started (`false` if the system refused a thread).
    started: OnceLock<bool>,
}

// SAFETY: `job` is written only by the holder of `busy` while no worker reads it (all have
// finished the previous product), and read by workers only after the `generation` increment
// that publishes it.
unsafe impl<J: Job> Sync for Team<J> {}

impl<J: Job> Team<J> {
    /// A team whose workers start with its first shared product.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Team<J> {
        Team {
            job: UnsafeCell::new(None),
            generation: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            started: OnceLock::new(),
        }
    }
}

/// Computes `product`, shared by the team when it is large enough and the team is free.
///
/// # Safety
///
/// As for [`Job::columns`] over all of the product's columns.
pub unsafe fn run<J: Job>(product: J) {
    let team = J::team();
    let threads = crate::THREADS;
    let n = product.n();
    let shared = threads > 1
        && product.macs() >= MIN_SHARED_MACS
        && !team.busy.swap(true, Acquire);
    if !shared {
        // SAFETY: the caller's contract.
        unsafe { product.columns(0..n) };
        return;
    }
    if !*team.started.get_or_init(start_workers::<J>) {
        team.busy.store(false, Release);
        // SAFETY: the caller's contract.
        unsafe { product.columns(0..n) };
        return;
    }
    team.finished.store(0, Relaxed);
    // SAFETY: this thread holds `busy` and every worker has finished the previous product.
    unsafe { *team.job.get() = Some(product) };
    team.generation.fetch_add(1, SeqCst);
    if team.sleepers.load(SeqCst) > 0 {
        let _guard = team.lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        team.wake.notify_all();
    }
    // SAFETY: the caller's contract; the shares are disjoint column ranges.
    unsafe { product.columns(share(0, n, J::GRANULE)) };
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
}

/// The columns of thread `index`: `THREADS` runs of equal length, rounded up to a multiple of
/// `granule` (the product's tiles or blocks of columns).
fn share(index: usize, n: usize, granule: usize) -> Range<usize> {
    let run = n.div_ceil(crate::THREADS).next_multiple_of(granule);
    let start = (index * run).min(n);
    start..(start + run).min(n)
}

fn start_workers<J: Job>() -> bool {
    (1..crate::THREADS).all(|index| {
        std::thread::Builder::new()
            .name(format!("matmul-{index}"))
            .spawn(move || work::<J>(index))
            .is_ok()
    })
}

/// A worker's life: wait for a product, compute share `index`, report, and again.
fn work<J: Job>(index: usize) {
    let team = J::team();
    let mut seen = 0;
    loop {
        seen = next_generation(team, seen);
        // SAFETY: the generation was published after the product was written (acquired in
        // `next_generation`), and the product stays unchanged until this worker reports.
        let product = unsafe { *team.job.get() }.expect("a product is published before its generation");
        // SAFETY: the publisher's contract, and the workers' shares are disjoint.
        unsafe { product.columns(share(index, product.n(), J::GRANULE)) };
        team.finished.fetch_add(1, Release);
    }
}

/// Waits until the generation differs from `seen`: spinning for [`SPIN`], then asleep.
fn next_generation<J: Job>(team: &Team<J>, seen: usize) -> usize {
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
