//! Measures this machine's limits: read bandwidth over buffers of the sizes given on the command
//! line, the peak rate of f32 fused multiply-adds with AVX2 and AVX-512, and that of int8
//! products with AVX-512 VNNI (`vpdpbusd`: 64 multiply-adds of bytes into 16 i32 lanes), and,
//! where the CPU has AMX-BF16, that of bfloat16 tile products (`tdpbf16ps`: 16 × 16 × 32
//! multiply-adds into a tile of f32), alone and with the loads of a matrix product over 8 tiles
//! (the same 2 × 2 block of products, each step loading its 2 + 2 operand tiles from L1 with
//! `tileloadd`, from cache lines and 16 bytes off them), at 1 to `--threads` threads. Each figure
//! is the best of `--rounds` rounds (a peak is what the hardware can do, so the fastest round is
//! the estimate; noise only makes rounds slower).
//!
//! With `--read-only`, only the read bandwidth, and only at `--threads` threads: what
//! `bench/floor.py` measures between the runs of a crate. With `--fma-only`, only the FMA peak
//! (AVX-512 where the CPU has it, else AVX2) at `--threads` threads: what
//! `bench/prefill_peak.py` measures between the prefills of a crate. With `--amx-only`, only the
//! AMX bf16 peak at `--threads` threads (it exits with an error where the CPU or the kernel does
//! not grant the tiles): what `bench/prefill_peak.py --peak amx` measures.
//!
//! With `--gaps SECONDS`, none of these: instead, what the machine takes from threads that never
//! block. `--threads` threads read the clock in a loop for that long, all at once, and each
//! counts the gaps between two readings of more than 10 µs (an interrupt, or on a virtual
//! machine the host running something else on the virtual CPU's core). It prints the largest
//! share of its time that a thread lost in such gaps, then per thread that share, how many
//! gaps of more than 100 µs it saw per second and its longest gap. A crate's team meets at
//! every product: a gap on one thread holds up the other, so a machine that loses more is
//! noisier for the crates' decode than its read bandwidth alone says.
//!
//! Usage: monogen-peaks [--threads N] [--rounds R] [--read-only | --fma-only | --amx-only] [--json] SIZE...
//!        (SIZE like 64M, 2G)
//!        monogen-peaks [--threads N] [--json] --gaps SECONDS

use std::arch::x86_64::*;
use std::hint::black_box;
use std::time::{Duration, Instant};

fn main() {
    let mut threads = 2;
    let mut rounds = 5;
    let mut json = false;
    let mut read_only = false;
    let mut fma_only = false;
    let mut amx_only = false;
    let mut gap_seconds = None;
    let mut sizes = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--threads" => threads = args.next().and_then(|v| v.parse().ok()).expect("--threads N"),
            "--rounds" => rounds = args.next().and_then(|v| v.parse().ok()).expect("--rounds R"),
            "--json" => json = true,
            "--read-only" => read_only = true,
            "--fma-only" => fma_only = true,
            "--amx-only" => amx_only = true,
            "--gaps" => {
                gap_seconds = Some(
                    args.next().and_then(|v| v.parse::<f64>().ok()).filter(|&v| v > 0.0).expect("--gaps SECONDS"),
                )
            }
            size => sizes.push(parse_size(size).unwrap_or_else(|| panic!("not a size: {size}"))),
        }
    }
    if sizes.is_empty() {
        sizes = vec![32 << 20, 2 << 30];
    }
    if amx_only && !amx_bf16_usable() {
        eprintln!(
            "monogen-peaks: --amx-only: this CPU has no AMX-BF16, or the kernel does not grant the tiles"
        );
        std::process::exit(1);
    }
    let mut results = Vec::new();
    if let Some(seconds) = gap_seconds {
        let per_thread = gaps(threads, seconds);
        let most = per_thread.iter().map(|g| g.lost_share).fold(0.0, f64::max);
        results.push((format!("gaps_lost_pct_most {threads}t"), 100.0 * most));
        for (i, g) in per_thread.iter().enumerate() {
            results.push((format!("gaps_lost_pct thread{i}"), 100.0 * g.lost_share));
            results.push((format!("gaps_over_100us_per_s thread{i}"), g.over_100us_per_s));
            results.push((format!("gaps_longest_us thread{i}"), g.longest_us));
        }
        print(&results, json);
        return;
    }
    for t in if read_only || fma_only || amx_only { threads..=threads } else { 1..=threads } {
        if amx_only {
            results.push((format!("amx_bf16_gflop_s {t}t"), amx_peak(t, rounds, None)));
            continue;
        }
        if fma_only {
            let avx512 = is_x86_feature_detected!("avx512f");
            let name = if avx512 { "fma_avx512_gflop_s" } else { "fma_avx2_gflop_s" };
            results.push((format!("{name} {t}t"), fma_peak(t, rounds, avx512)));
            continue;
        }
        for &bytes in &sizes {
            let gbs = read_bandwidth(bytes, t, rounds);
            results.push((format!("read_gb_s {} {t}t", human(bytes)), gbs));
        }
        if read_only {
            continue;
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            results.push((format!("fma_avx2_gflop_s {t}t"), fma_peak(t, rounds, false)));
        }
        if is_x86_feature_detected!("avx512f") {
            results.push((format!("fma_avx512_gflop_s {t}t"), fma_peak(t, rounds, true)));
        }
        if is_x86_feature_detected!("avx512vnni") {
            results.push((format!("vnni_avx512_gop_s {t}t"), vnni_peak(t, rounds)));
        }
        if amx_bf16_usable() {
            results.push((format!("amx_bf16_gflop_s {t}t"), amx_peak(t, rounds, None)));
            results.push((format!("amx_bf16_loaded_gflop_s {t}t"), amx_peak(t, rounds, Some(0))));
            results.push((format!("amx_bf16_loaded_off_line_gflop_s {t}t"), amx_peak(t, rounds, Some(16))));
        }
    }
    print(&results, json);
}

/// The figures, one per line or (`json`) as one JSON object in their order.
fn print(results: &[(String, f64)], json: bool) {
    if json {
        let fields: Vec<String> = results.iter().map(|(k, v)| format!("\"{k}\": {v:.2}")).collect();
        println!("{{{}}}", fields.join(", "));
    } else {
        for (name, value) in results {
            println!("{name:<36} {value:>10.2}");
        }
    }
}

/// What [`gaps`] saw on one thread.
struct Gaps {
    /// Share of the thread's time spent in gaps of more than [`GAP`].
    lost_share: f64,
    /// Gaps of more than 100 µs per second.
    over_100us_per_s: f64,
    /// The longest gap, µs.
    longest_us: f64,
}

/// The shortest pause between two readings of the clock that [`gaps`] counts as one: far
/// longer than a reading (tens of nanoseconds), as short as a crate's shortest product.
const GAP: Duration = Duration::from_micros(10);

/// `threads` threads at once, each reading the clock in a loop for `seconds` and timing the
/// pauses between two readings.
fn gaps(threads: usize, seconds: f64) -> Vec<Gaps> {
    let span = Duration::from_secs_f64(seconds);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    let start = Instant::now();
                    let (mut last, mut lost, mut over_100us, mut longest) =
                        (start, Duration::ZERO, 0u64, Duration::ZERO);
                    loop {
                        let now = Instant::now();
                        let gap = now - last;
                        if gap > GAP {
                            lost += gap;
                            over_100us += u64::from(gap > Duration::from_micros(100));
                            longest = longest.max(gap);
                        }
                        last = now;
                        if now - start >= span {
                            break;
                        }
                    }
                    let elapsed = (last - start).as_secs_f64();
                    Gaps {
                        lost_share: lost.as_secs_f64() / elapsed,
                        over_100us_per_s: over_100us as f64 / elapsed,
                        longest_us: longest.as_secs_f64() * 1e6,
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a gap thread panicked")).collect()
    })
}

fn parse_size(s: &str) -> Option<usize> {
    let (digits, shift) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 10),
        b'M' | b'm' => (&s[..s.len() - 1], 20),
        b'G' | b'g' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    digits.parse::<usize>().ok().map(|n| n << shift)
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 => format!("{}M", b >> 20),
        b => format!("{}K", b >> 10),
    }
}

/// GB/s of reading `bytes` (split evenly over `threads`), best of `rounds` rounds after one
/// warm-up round; the pages are written first so that they are really mapped, in huge pages
/// where the kernel gives them ([`Buffer`]). A round reads the buffer as many times as it takes
/// to read at least 1 GiB, so that starting the threads is negligible even for a cache-sized
/// buffer.
fn read_bandwidth(bytes: usize, threads: usize, rounds: usize) -> f64 {
    let len = bytes / 4 / 64 * 64;
    let mut buffer = Buffer::new(len);
    for (i, v) in buffer.iter_mut().enumerate() {
        *v = (i % 7) as f32;
    }
    let chunk = len / threads / 64 * 64;
    let passes = (1usize << 30).div_ceil(chunk * threads * 4);
    let mut best = f64::INFINITY;
    for round in 0..=rounds {
        let start = Instant::now();
        std::thread::scope(|s| {
            for part in buffer.chunks(chunk).take(threads) {
                s.spawn(move || {
                    for _ in 0..passes {
                        black_box(sum(black_box(part)));
                    }
                });
            }
        });
        let elapsed = start.elapsed().as_secs_f64();
        if round > 0 {
            best = best.min(elapsed);
        }
    }
    (passes * chunk * threads * 4) as f64 / best / 1e9
}

/// A buffer of f32 aligned to 2 MiB and, on Linux, asked for in transparent huge pages
/// (`madvise(MADV_HUGEPAGE)`) before it is first written. Under the usual `madvise` setting a
/// `Vec` gets 4 KiB pages, whose TLB misses slow a read over gigabytes, while the generated
/// crates ask for their weights' mapping in huge pages too (`runtime/tensor_file.rs`): a
/// TinyLlama bf16 crate decoded at up to 1.29x of the floor taken from a `Vec` of its
/// weights' size (`bench/floor.py`, bench/RESULTS.md).
struct Buffer {
    ptr: *mut f32,
    len: usize,
    layout: std::alloc::Layout,
}

impl Buffer {
    fn new(len: usize) -> Buffer {
        let layout = std::alloc::Layout::from_size_align(len.max(1) * 4, 2 << 20).expect("a buffer size");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) }.cast::<f32>();
        assert!(!ptr.is_null(), "out of memory for a {} byte buffer", layout.size());
        #[cfg(target_os = "linux")]
        {
            unsafe extern "C" {
                fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
            }
            const MADV_HUGEPAGE: i32 = 14;
            // SAFETY: the range is this allocation; advice only, whose failure changes nothing.
            unsafe { madvise(ptr.cast(), layout.size(), MADV_HUGEPAGE) };
        }
        Buffer { ptr, len, layout }
    }
}

impl std::ops::Deref for Buffer {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: `len` values, written before any read (`read_bandwidth` fills the buffer).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as above; `&mut self` is the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { std::alloc::dealloc(self.ptr.cast(), self.layout) };
    }
}

/// Sums `values` with four independent AVX-512 (or AVX2, or scalar) accumulators: a pure read
/// stream.
fn sum(values: &[f32]) -> f32 {
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F (checked just above).
        unsafe { sum_avx512(values) }
    } else if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe { sum_avx2(values) }
    } else {
        values.iter().sum()
    }
}

/// As [`sum_avx512`], 8 lanes at a time: a scalar sum waits on each addition in turn and
/// would measure the adder's latency, not the memory.
#[target_feature(enable = "avx2")]
fn sum_avx2(values: &[f32]) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut blocks = values.chunks_exact(32);
    for block in &mut blocks {
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: `block` holds 32 values, so 8 from 8 * i are in bounds.
            *a = _mm256_add_ps(*a, unsafe { _mm256_loadu_ps(block.as_ptr().add(8 * i)) });
        }
    }
    let total = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds 8 writable values.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), total) };
    lanes.iter().sum::<f32>() + blocks.remainder().iter().sum::<f32>()
}

#[target_feature(enable = "avx512f")]
fn sum_avx512(values: &[f32]) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut blocks = values.chunks_exact(64);
    for block in &mut blocks {
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: `block` holds 64 values, so 16 from 16 * i are in bounds.
            *a = _mm512_add_ps(*a, unsafe { _mm512_loadu_ps(block.as_ptr().add(16 * i)) });
        }
    }
    let total = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    _mm512_reduce_add_ps(total) + blocks.remainder().iter().sum::<f32>()
}

/// GFLOP/s of fused multiply-adds (2 flops per lane) on `threads` threads, best of `rounds`.
fn fma_peak(threads: usize, rounds: usize, avx512: bool) -> f64 {
    const ITERS: usize = 20_000_000;
    let lanes = if avx512 { 16 } else { 8 };
    let mut best = f64::INFINITY;
    for round in 0..=rounds {
        let start = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(move || {
                    // SAFETY: the caller checked the features.
                    if avx512 {
                        black_box(unsafe { fma_loop_avx512(ITERS) })
                    } else {
                        black_box(unsafe { fma_loop_avx2(ITERS) })
                    }
                });
            }
        });
        let elapsed = start.elapsed().as_secs_f64();
        if round > 0 {
            best = best.min(elapsed);
        }
    }
    (threads * ITERS * 12 * lanes * 2) as f64 / best / 1e9
}

/// GOP/s of int8 products (2 operations per multiply-add, 64 per `vpdpbusd`) on `threads`
/// threads, best of `rounds`.
fn vnni_peak(threads: usize, rounds: usize) -> f64 {
    const ITERS: usize = 20_000_000;
    let mut best = f64::INFINITY;
    for round in 0..=rounds {
        let start = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                // SAFETY: the caller checked the feature.
                s.spawn(|| black_box(unsafe { vnni_loop(ITERS) }));
            }
        });
        let elapsed = start.elapsed().as_secs_f64();
        if round > 0 {
            best = best.min(elapsed);
        }
    }
    (threads * ITERS * 12 * 64 * 2) as f64 / best / 1e9
}

/// 12 independent chains of `vpdpbusd`.
#[target_feature(enable = "avx512f,avx512vnni")]
fn vnni_loop(iters: usize) -> i32 {
    let a = _mm512_set1_epi8(black_box(3));
    let b = _mm512_set1_epi8(black_box(-2));
    let mut acc = [_mm512_setzero_si512(); 12];
    for _ in 0..iters {
        for v in acc.iter_mut() {
            *v = _mm512_dpbusd_epi32(*v, a, b);
        }
    }
    let mut total = _mm512_setzero_si512();
    for v in acc {
        total = _mm512_add_epi32(total, v);
    }
    _mm512_reduce_add_epi32(total)
}

/// 12 independent chains of fused multiply-adds: enough to cover the latency of two FMA units.
#[target_feature(enable = "avx512f")]
fn fma_loop_avx512(iters: usize) -> f32 {
    let a = _mm512_set1_ps(black_box(0.999_999));
    let b = _mm512_set1_ps(black_box(1e-7));
    let mut acc = [_mm512_set1_ps(1.0); 12];
    for _ in 0..iters {
        for v in acc.iter_mut() {
            *v = _mm512_fmadd_ps(*v, a, b);
        }
    }
    let mut total = _mm512_setzero_ps();
    for v in acc {
        total = _mm512_add_ps(total, v);
    }
    _mm512_reduce_add_ps(total)
}

#[target_feature(enable = "avx2,fma")]
fn fma_loop_avx2(iters: usize) -> f32 {
    let a = _mm256_set1_ps(black_box(0.999_999));
    let b = _mm256_set1_ps(black_box(1e-7));
    let mut acc = [_mm256_set1_ps(1.0); 12];
    for _ in 0..iters {
        for v in acc.iter_mut() {
            *v = _mm256_fmadd_ps(*v, a, b);
        }
    }
    let mut lanes = [0.0f32; 8];
    let mut total = _mm256_setzero_ps();
    for v in acc {
        total = _mm256_add_ps(total, v);
    }
    // SAFETY: `lanes` holds 8 values.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), total) };
    lanes.iter().sum()
}

/// Whether the CPU has AMX-TILE and AMX-BF16 (CPUID leaf 7, EDX bits 24 and 22) and the kernel
/// grants this process the tiles' state (Linux: `arch_prctl(ARCH_REQ_XCOMP_PERM,
/// XFEATURE_XTILEDATA)`, asked before the first tile instruction of any thread).
fn amx_bf16_usable() -> bool {
    let bits = (1 << 24) | (1 << 22);
    if __cpuid(0).eax < 7 || __cpuid_count(7, 0).edx & bits != bits {
        return false;
    }
    #[cfg(target_os = "linux")]
    {
        let result: isize;
        // SAFETY: this Linux system call only changes which register state the kernel lets the
        // process use; it reads and writes none of the process's memory.
        unsafe {
            std::arch::asm!(
                "syscall",
                inlateout("rax") 158isize => result,
                in("rdi") 0x1023usize,
                in("rsi") 18usize,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            )
        };
        result == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// GFLOP/s of bfloat16 tile products (2 per multiply-add, 16 × 16 × 32 per `tdpbf16ps`) on
/// `threads` threads, best of `rounds`; with `loaded`, each step of 4 products also loads the 4
/// operand tiles they read, from that many bytes past the start of a cache line.
fn amx_peak(threads: usize, rounds: usize, loaded: Option<usize>) -> f64 {
    const ITERS: usize = 1_000_000;
    let mut best = f64::INFINITY;
    for round in 0..=rounds {
        let start = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                // SAFETY: the caller checked the features and was granted the tiles.
                s.spawn(|| unsafe { amx_loop(ITERS, loaded) });
            }
        });
        let elapsed = start.elapsed().as_secs_f64();
        if round > 0 {
            best = best.min(elapsed);
        }
    }
    (threads * ITERS * 4 * 16 * 16 * 32 * 2) as f64 / best / 1e9
}

/// 4 independent chains of `tdpbf16ps` (tiles 0-3 of sums, from tiles 4-5 and 6-7 of bfloat16
/// operands, each 16 rows of 64 bytes), as a 2 × 2 block of a matrix product holds them. With
/// `loaded`, every step first loads its operand tiles (4 KiB, always the same, so from L1), in
/// the order a product interleaves them with the products that read them, from that many bytes
/// (below 64) past the start of a cache line: off a line, each row of a tile straddles two.
///
/// # Safety
///
/// Only on a CPU with AMX-TILE and AMX-BF16, in a process granted the tiles' state.
unsafe fn amx_loop(iters: usize, loaded: Option<usize>) {
    let mut config = [0u8; 64];
    config[0] = 1;
    for tile in 0..8 {
        config[16 + 2 * tile..18 + 2 * tile].copy_from_slice(&64u16.to_le_bytes());
        config[48 + tile] = 16;
    }
    // Operands of small finite values (0x3f80 is 1.0), so that the sums stay finite: 4 tiles
    // from a cache line on, and a line to spare for an offset.
    #[repr(align(64))]
    struct Operands([u32; 4 * 256 + 16]);
    let operands = Operands([0x3f80_3f80u32; 4 * 256 + 16]);
    let operand = &operands.0[loaded.unwrap_or(0) / 4..];
    // SAFETY: the caller's contract; the configuration is valid, each load reads the 1 KiB
    // of `operand` (16 rows of 64 bytes).
    unsafe {
        std::arch::asm!(
            "ldtilecfg [{config}]",
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "tileloadd tmm4, [{a} + {stride}*1]",
            "tileloadd tmm5, [{a} + {stride}*1]",
            "tileloadd tmm6, [{a} + {stride}*1]",
            "tileloadd tmm7, [{a} + {stride}*1]",
            config = in(reg) config.as_ptr(),
            a = in(reg) operand.as_ptr(),
            stride = in(reg) 64usize,
            options(nostack, readonly),
        );
        if loaded.is_some() {
            for _ in 0..iters {
                std::arch::asm!(
                    "tileloadd tmm4, [{a0} + {stride}*1]",
                    "tileloadd tmm6, [{b0} + {stride}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tileloadd tmm7, [{b1} + {stride}*1]",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tileloadd tmm5, [{a1} + {stride}*1]",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    a0 = in(reg) operand.as_ptr(),
                    a1 = in(reg) operand[256..].as_ptr(),
                    b0 = in(reg) operand[512..].as_ptr(),
                    b1 = in(reg) operand[768..].as_ptr(),
                    stride = in(reg) 64usize,
                    options(nostack, readonly),
                );
            }
            std::arch::asm!("tilerelease", options(nostack, nomem));
            return;
        }
        for _ in 0..iters {
            std::arch::asm!(
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                options(nostack, nomem),
            );
        }
        std::arch::asm!("tilerelease", options(nostack, nomem));
    }
}
