//! The fixed part of every benchmark harness: random inputs, the comparison with the
//! reference, timing, and the JSON lines `monogen bench` reads.
//!
//! Each interface has a trait with the interface's functions (here for matmul, which every
//! architecture calls; in `passes.rs` for the others) and a pass: the calls one forward pass of
//! the workload makes to that interface, on buffers of the workload's real shapes
//! (`passes.rs`, per architecture). `main.rs` implements the traits once per candidate, so
//! every kernel call is static, as it is in the generated crate.

use std::io::Write;
use std::time::Instant;

use crate::{DECODE_STEPS, THREADS};

/// How long to measure: `--samples N` (timed rounds), `--warm-up N` (untimed rounds) and
/// `--min-sample-us N` (a timing repeats a pass until it has run this long).
pub struct Options {
    pub samples: usize,
    pub warm_up: usize,
    pub min_sample_ns: u64,
}

impl Options {
    pub fn from_args() -> Options {
        let mut options = Options { samples: 21, warm_up: 3, min_sample_ns: 2_000_000 };
        let args: Vec<String> = std::env::args().skip(1).collect();
        for pair in args.chunks(2) {
            let value = pair.get(1).and_then(|v| v.parse::<u64>().ok());
            match (pair[0].as_str(), value) {
                ("--samples", Some(v)) => options.samples = v.max(1) as usize,
                ("--warm-up", Some(v)) => options.warm_up = v as usize,
                ("--min-sample-us", Some(v)) => options.min_sample_ns = v * 1000,
                _ => {
                    eprintln!(
                        "usage: {} [--samples N] [--warm-up N] [--min-sample-us N]",
                        std::env::args().next().unwrap_or_default()
                    );
                    std::process::exit(2);
                }
            }
        }
        options
    }
}

/// Announces how many rounds the whole run has, for the progress bar.
pub fn begin(interfaces: usize, options: &Options) {
    emit(&format!(
        "{{\"event\":\"begin\",\"interfaces\":{interfaces},\"threads\":{THREADS},\"rounds\":{}}}",
        interfaces * (options.samples + options.warm_up)
    ));
}

fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_numbers(values: &[f64]) -> String {
    let items: Vec<String> = values.iter().map(|v| format!("{v:.1}")).collect();
    format!("[{}]", items.join(","))
}

/// A small, fast generator (SplitMix64): the same inputs on every run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// A value of magnitude 0.05 to 1 times `amplitude`, of either sign: never zero.
    pub fn value(&mut self, amplitude: f32) -> f32 {
        let magnitude = 0.05 + 0.95 * self.unit();
        if self.next_u64() & 1 == 0 { magnitude * amplitude } else { -magnitude * amplitude }
    }

    pub fn vec(&mut self, len: usize, amplitude: f32) -> Vec<f32> {
        (0..len).map(|_| self.value(amplitude)).collect()
    }
}

/// `v` rounded to the nearest bfloat16 (ties to even) as its bit pattern, as the crates round
/// an F32 file's matrices at load and a bf16 KV cache's values when stored (the inputs here are
/// finite).
pub fn bf16_bits(v: f32) -> u16 {
    let bits = v.to_bits();
    (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// The scale of an int8 block whose largest magnitude is `amax` (at most 127 · 65504), as the
/// crates quantize: `amax / 127` rounded up to a binary16 value, so that no value is clipped.
pub fn q8_scale(amax: f32) -> f32 {
    let scale = amax / 127.0;
    if scale < 6.103_515_6e-5 {
        // Below binary16's normal range: a multiple of its smallest step, 2⁻²⁴.
        (scale * 16_777_216.0).ceil() / 16_777_216.0
    } else {
        // 10 bits of mantissa, rounded up.
        f32::from_bits((scale.to_bits() + 0x1fff) & !0x1fff)
    }
}

/// `[n, k]` weights quantized to int4 as the crates quantize them at load (q4_tensor.rs): the
/// bytes of their four-bit values (16 per block of 32 of a row, GGML's Q4_1 layout) and each
/// block's binary16 scale and minimum (the block's smallest value, and its range over 15, each
/// rounded to nearest). The inputs here are finite and small.
pub fn q4_quantize(w: &[f32], n: usize, k: usize) -> (Vec<u8>, Vec<u16>) {
    let blocks = k.div_ceil(32);
    let (mut values, mut scales) = (vec![0u8; n * blocks * 16], Vec::with_capacity(n * blocks * 2));
    for (row, bytes) in w.chunks(k).zip(values.chunks_mut(blocks * 16)) {
        for (block, out) in row.chunks(32).zip(bytes.chunks_mut(16)) {
            let (low, high) = block.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
            let (scale, scale_bits) = binary16((high - low) / 15.0);
            let (minimum, minimum_bits) = binary16(low);
            scales.extend([scale_bits, minimum_bits]);
            let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            let nibble = |i: usize| {
                let v = block.get(i).copied().unwrap_or(minimum);
                ((v - minimum) * inverse).round_ties_even().clamp(0.0, 15.0) as u8
            };
            for (i, byte) in out.iter_mut().enumerate() {
                *byte = nibble(i) | (nibble(i + 16) << 4);
            }
        }
    }
    (values, scales)
}

/// `v` (finite, well inside binary16's range) rounded to the nearest binary16 value, ties to
/// even: the value and its bits.
fn binary16(v: f32) -> (f32, u16) {
    let (sign, magnitude) = (if v < 0.0 { 0x8000u16 } else { 0 }, v.abs());
    let (rounded, bits) = if magnitude < 6.103_515_6e-5 {
        let steps = (magnitude * 16_777_216.0).round_ties_even();
        (steps / 16_777_216.0, steps as u16)
    } else {
        let b = magnitude.to_bits();
        let rounded = f32::from_bits((b + 0xfff + ((b >> 13) & 1)) & !0x1fff);
        let exponent = ((rounded.to_bits() >> 23) as i32 - 127 + 15) as u16;
        (rounded, (exponent << 10) | ((rounded.to_bits() >> 13) & 0x3ff) as u16)
    };
    (if sign != 0 { -rounded } else { rounded }, sign | bits)
}

/// Ok unless `|got − want| > tolerance · (1 + |want|)` somewhere (NaN included).
pub fn compare(what: &str, got: &[f32], want: &[f32], tolerance: f32) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} values, the reference gives {}", got.len(), want.len()));
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let allowed = tolerance * (1.0 + w.abs());
        let difference = (g - w).abs();
        if difference.is_nan() || difference > allowed {
            return Err(format!(
                "{what}: at index {i} got {g}, the reference gives {w} (difference {difference:e}, allowed {allowed:e})"
            ));
        }
    }
    Ok(())
}

/// Relative tolerance of element-wise and attention kernels.
pub const TOLERANCE: f32 = 1e-5;

/// Nanoseconds per call of `f`, repeated until `min_ns` have passed, after one call untimed
/// if `untimed_first`.
///
/// The rounds interleave the candidates, so each timing follows another candidate's, whose
/// weights and buffers then hold the caches. In a crate, a decode step follows the step
/// before, of the same kernels. The untimed call gives the timed ones that state: timed from a
/// cold start instead (at most a few calls in 2 ms), a stories15M int8 request of
/// `matmul/q8-avx512-vnni-packed-threads` measured 1.23x the time of `avx512-vnni-threads`,
/// where its crate decodes 1.08x and prefills 1.3x as fast (bench/RESULTS.md).
fn time(min_ns: u64, untimed_first: bool, mut f: impl FnMut()) -> f64 {
    if untimed_first {
        f();
    }
    let start = Instant::now();
    let mut calls = 0u64;
    loop {
        f();
        calls += 1;
        let elapsed = start.elapsed().as_nanos() as u64;
        if elapsed >= min_ns {
            return elapsed as f64 / calls as f64;
        }
    }
}

/// Which phases of a request an interface takes part in: (prefill, decode).
pub type Phases = (bool, bool);

enum State {
    Live,
    Skipped(String),
    Failed(String),
}

/// The candidates of one interface: validated first, then timed in interleaved rounds so
/// that a slow moment of the machine hits all of them alike.
pub struct Bench<'o> {
    interface: &'static str,
    names: Vec<&'static str>,
    states: Vec<State>,
    prefill: Vec<Vec<f64>>,
    decode: Vec<Vec<f64>>,
    /// Each candidate's last prefill and decode times (0 before the first).
    last: Vec<[f64; 2]>,
    /// What each candidate that packs its weights took to pack the pass's matrices.
    packing: Vec<Option<Packing>>,
    /// Sequences one timed decode step serves: a batched step's rows, which a record's decode
    /// time is divided among.
    decode_rows: usize,
    round: usize,
    options: &'o Options,
}

/// A pass whose last call took longer than this is timed without a call untimed first (the
/// scalar references' prefill at stories110M's shapes takes seconds); every faster one runs
/// once untimed right before, so that each candidate is timed with the caches as its own pass
/// leaves them, as a crate's next pass finds them. With 50 ms here (harness version 2), a
/// stories110M prefill pass was timed cold: on an Intel Xeon whose L3 (480 MiB) holds most of
/// that model, the eight f32 candidates that read the same unpacked matrices each found them
/// as the one before had left them, and a candidate that packs its own copy did not; it timed
/// 110-117 ms against the repacking product's 104-108, where a crate of each, in a fresh
/// process, prefilled 1.13x faster with the packed copy (bench/RESULTS.md).
const UNTIMED_FIRST_UNDER_NS: f64 = 1e9;

impl<'o> Bench<'o> {
    pub fn new(interface: &'static str, names: &[&'static str], options: &'o Options) -> Bench<'o> {
        Bench {
            interface,
            names: names.to_vec(),
            states: names.iter().map(|_| State::Live).collect(),
            prefill: names.iter().map(|_| Vec::new()).collect(),
            decode: names.iter().map(|_| Vec::new()).collect(),
            last: names.iter().map(|_| [0.0; 2]).collect(),
            packing: names.iter().map(|_| None).collect(),
            decode_rows: 1,
            round: 0,
            options,
        }
    }

    /// The decode passes time a step of `rows` sequences at once.
    pub fn decode_rows(&mut self, rows: usize) {
        self.decode_rows = rows;
    }

    /// Runs candidate `i`'s comparison with the reference, unless this machine cannot run it.
    /// A panic counts as a failure.
    pub fn validate(&mut self, i: usize, available: Result<(), String>, check: impl FnOnce() -> Result<(), String>) {
        if let Err(why) = available {
            self.states[i] = State::Skipped(why);
            return;
        }
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(check));
        self.states[i] = match outcome {
            Ok(Ok(())) => State::Live,
            Ok(Err(why)) => State::Failed(why),
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a panic".into());
                State::Failed(format!("panicked: {message}"))
            }
        };
    }

    /// Records what candidate `i` took to pack every matrix of a forward pass (the model's):
    /// the time it adds to a crate's load.
    pub fn packed(&mut self, i: usize, packing: Packing) {
        self.packing[i] = Some(packing);
    }

    pub fn rounds(&self) -> usize {
        self.options.warm_up + self.options.samples
    }

    pub fn live(&self, i: usize) -> bool {
        matches!(self.states[i], State::Live)
    }

    /// Times one prefill pass and one decode step of candidate `i` (`run(false)` and
    /// `run(true)`); warm-up rounds are thrown away.
    pub fn sample(&mut self, i: usize, phases: Phases, mut run: impl FnMut(bool)) {
        let min = self.options.min_sample_ns;
        let untimed_first = self.last[i].map(|ns| ns < UNTIMED_FIRST_UNDER_NS);
        let prefill = if phases.0 { time(min, untimed_first[0], || run(false)) } else { 0.0 };
        let decode = if phases.1 { time(min, untimed_first[1], || run(true)) } else { 0.0 };
        self.last[i] = [prefill, decode];
        if self.round >= self.options.warm_up {
            self.prefill[i].push(prefill);
            self.decode[i].push(decode);
        }
    }

    pub fn end_round(&mut self) {
        self.round += 1;
        emit(&format!("{{\"event\":\"round\",\"interface\":{}}}", json_string(self.interface)));
    }

    /// Prints one result line per candidate.
    pub fn finish(self) {
        for (i, name) in self.names.iter().enumerate() {
            let head = format!(
                "{{\"event\":\"result\",\"interface\":{},\"implementation\":{}",
                json_string(self.interface),
                json_string(name)
            );
            let line = match &self.states[i] {
                State::Live => format!(
                    "{head},\"status\":\"ok\",\"decode_steps\":{DECODE_STEPS},\"decode_rows\":{},\"prefill_ns\":{},\"decode_ns\":{}{}}}",
                    self.decode_rows,
                    json_numbers(&self.prefill[i]),
                    json_numbers(&self.decode[i]),
                    self.packing[i].map_or(String::new(), |p| format!(
                        ",\"load_ns\":{:.1},\"load_max_ns\":{:.1}",
                        p.median_ns, p.slowest_ns
                    ))
                ),
                State::Failed(why) => format!("{head},\"status\":\"failed\",\"reason\":{}}}", json_string(why)),
                State::Skipped(why) => format!("{head},\"status\":\"skipped\",\"reason\":{}}}", json_string(why)),
            };
            emit(&line);
        }
    }
}

/// The linear layers' product, for every weight dtype: `matmul` (f32), `matmul<bf16>` and
/// `matmul<q8>` each hold a matrix their own way.
pub trait Matmul {
    /// One `[N, K]` matrix as the interface holds it.
    type Weights;
    /// The `[n, k]` f32 values `w` as the interface holds them (as the generated crate
    /// converts them at load), placed in `storage` as the crate's loader places them.
    fn weights(storage: &mut Storage, w: &[f32], n: usize, k: usize) -> Self::Weights;
    fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &Self::Weights, rows: usize);
}

/// Where a pass keeps its weights: as a generated crate's loader places the matrices it
/// converts or packs (`TensorFile::pages_for` in its `tensor_file.rs`), one after the other in
/// chunks of 64 MiB (or one matrix, if larger) asked for in huge pages, each matrix on a cache
/// line. A `Vec` would start 16 bytes off a cache line in 4 KiB pages: there a stories15M int8
/// request of `matmul/q8-avx512-vnni-packed-threads` measured 1.4x its time on cache lines
/// (bench/RESULTS.md), and AMX tile loads off a cache line take several times as long.
#[derive(Default)]
pub struct Storage {
    /// Each chunk and the bytes of it handed out.
    chunks: Vec<(Chunk, usize)>,
    /// The time spent in [`Storage::place_packed`]: what a kernel that packs its weights adds
    /// to a crate's load.
    packing: Packing,
}

/// What packing a pass's matrices took, in nanoseconds: the sum of each matrix's median of
/// three packings, and the sum of each one's slowest (how far a pause of the machine may have
/// moved the first).
#[derive(Debug, Clone, Copy, Default)]
pub struct Packing {
    pub median_ns: f64,
    pub slowest_ns: f64,
}

/// Memory aligned to a huge page, freed on drop.
struct Chunk {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc` with `layout`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

impl Storage {
    const CHUNK: usize = 64 << 20;
    const HUGE_PAGE: usize = 2 << 20;

    /// A matrix packed by `pack`, a kernel's packing (as the crate runs it at load, on one
    /// thread), placed here. Adds the packing's time to [`Storage::packing`]: the median of
    /// three runs (a single run of a few ms moves by 2x with a pause of the machine), and the
    /// slowest of them. The copy into this storage is not counted: every candidate's matrices
    /// are placed alike.
    pub fn place_packed<T: Copy>(&mut self, pack: impl Fn() -> Vec<T>) -> Placed<T> {
        let mut times = [0.0f64; 3];
        let mut packed = Vec::new();
        for time in &mut times {
            drop(std::mem::take(&mut packed));
            let start = Instant::now();
            packed = pack();
            *time = start.elapsed().as_nanos() as f64;
        }
        times.sort_by(f64::total_cmp);
        self.packing.median_ns += times[1];
        self.packing.slowest_ns += times[2];
        self.place(&packed)
    }

    /// The time every [`Storage::place_packed`] took so far.
    pub fn packing(&self) -> Packing {
        self.packing
    }

    /// A copy of `values` in this storage, on a cache line.
    pub fn place<T: Copy>(&mut self, values: &[T]) -> Placed<T> {
        let bytes = std::mem::size_of_val(values).next_multiple_of(64);
        assert!(std::mem::align_of::<T>() <= 64, "weights align to at most a cache line");
        if self.chunks.last().is_none_or(|(chunk, used)| used + bytes > chunk.layout.size()) {
            let size = bytes.max(Self::CHUNK).next_multiple_of(Self::HUGE_PAGE);
            let layout = std::alloc::Layout::from_size_align(size, Self::HUGE_PAGE).expect("a chunk's layout");
            // Not `alloc_zeroed`: for this alignment it writes every page before the advice
            // below could apply, and they stay 4 KiB pages. Only the bytes `place` writes are
            // ever read.
            // SAFETY: the layout's size is not zero.
            let ptr = unsafe { std::alloc::alloc(layout) };
            if ptr.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            advise_huge_pages(ptr, size);
            self.chunks.push((Chunk { ptr, layout }, 0));
        }
        let (chunk, used) = self.chunks.last_mut().expect("a chunk with room was just added");
        let at = chunk.ptr.wrapping_add(*used).cast::<T>();
        *used += bytes;
        // SAFETY: the chunk has room for `bytes` at `at` (a multiple of 64 bytes into memory
        // aligned to 2 MiB), which nothing else points to; the values, then zeros to the end of
        // their last cache line.
        unsafe {
            std::ptr::copy_nonoverlapping(values.as_ptr(), at, values.len());
            let end = std::mem::size_of_val(values);
            at.cast::<u8>().add(end).write_bytes(0, bytes - end);
        }
        Placed { ptr: at, len: values.len() }
    }
}

/// Asks the kernel for huge pages over `len` bytes at `ptr` (advice only: the weights work
/// without them).
#[cfg(target_os = "linux")]
fn advise_huge_pages(ptr: *mut u8, len: usize) {
    unsafe extern "C" {
        fn madvise(addr: *mut u8, len: usize, advice: i32) -> i32;
    }
    const MADV_HUGEPAGE: i32 = 14;
    // SAFETY: the range is one allocation of this process, not yet written.
    unsafe { madvise(ptr, len, MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_ptr: *mut u8, _len: usize) {}

/// A matrix in a [`Storage`], read as a slice; valid while the storage lives (a pass keeps both).
pub struct Placed<T> {
    ptr: *const T,
    len: usize,
}

impl<T> std::ops::Deref for Placed<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: `Storage::place` copied `len` values to `ptr`, and its chunk lives as long as
        // the pass that holds this matrix.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}
