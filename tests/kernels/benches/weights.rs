//! The matrix products of the three weight dtypes at the shapes of stories110M's layers
//! (hidden 768, MLP 2048), on the team's two threads: how fast a decode step streams the
//! weights (GB/s of the bytes each dtype holds, over 12 layers' matrices, far more than the
//! caches) and how many GFLOP/s a 128-row prefill reaches. With `--tinyllama`, the decode at
//! TinyLlama-1.1B's shapes instead (hidden 2048, MLP 5632, k and v 256 wide, 22 layers: 3.9 GB
//! of f32 weights, the DRAM-sized floor that issue "Fast CPU kernels" asks for; about 10 GB of
//! memory in all), without the prefill.
//!
//! Each implementation computes the same product from the same values (bf16 and int8 are
//! that of the f32 weights converted), alternating round by round; the report gives the median
//! of the rounds. Each round also reads the f32 weights' bytes as a plain stream (`read`), and
//! each decode row is given as a share of that: how close the product comes to its floor.
//!
//! `cargo bench -p monogen-kernel-tests --bench weights [-- [--tinyllama] [--rows 1,16] WORD...]`
//! (only the rows whose names hold one of the words; `--rows` the activation rows of each pass,
//! 1 and 128 unless given); without `--bench` (as `cargo test --benches` runs
//! it) it does a quick smoke run over one layer.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::OnceLock;
use std::time::Instant;

use monogen_kernel_tests::kernels;
use monogen_kernel_tests::kernels::shared::avx2_team_matmul::Weight;
use monogen_kernel_tests::rng::Rng;

/// Every allocation of 256 KiB or more (each matrix) in transparent huge pages, as the crates
/// map their weights (`runtime/tensor_file.rs`): rounded up to whole 2 MiB pages, aligned to
/// them and, on Linux, advised `MADV_HUGEPAGE` before it is first written. Under the usual
/// `madvise` setting a `Vec` gets 4 KiB pages, whose TLB misses held this bench's decode rows at
/// about 23 GB/s on an AMD EPYC (Zen 3, 2 threads) where a read of the same size in huge pages
/// ran at 33-38. The matrices under 2 MiB (stories110M's int8 and bf16 attention projections)
/// had kept 4 KiB pages until the bench rounded them up too.
struct HugePages;

const HUGE: usize = 2 << 20;

/// The smallest allocation put in huge pages.
const HUGE_FROM: usize = 256 << 10;

impl HugePages {
    fn layout(layout: Layout) -> Layout {
        if layout.size() >= HUGE_FROM {
            Layout::from_size_align(layout.size().next_multiple_of(HUGE), HUGE.max(layout.align()))
                .expect("a huge-page layout")
        } else {
            layout
        }
    }
}

// SAFETY: every block comes from `System` with the layout that `dealloc` gives back, which
// `HugePages::layout` derives from the caller's alone; it is at least as large and as aligned.
unsafe impl GlobalAlloc for HugePages {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let huge = HugePages::layout(layout);
        // SAFETY: `huge` has a non-zero size where `layout` has (the caller's contract).
        let ptr = unsafe { System.alloc(huge) };
        #[cfg(target_os = "linux")]
        if huge.size() >= HUGE && !ptr.is_null() {
            unsafe extern "C" {
                fn madvise(addr: *mut u8, len: usize, advice: i32) -> i32;
            }
            const MADV_HUGEPAGE: i32 = 14;
            // SAFETY: the range is this allocation; advice only, whose failure changes nothing.
            unsafe { madvise(ptr, huge.size(), MADV_HUGEPAGE) };
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` with this layout (the caller's contract).
        unsafe { System.dealloc(ptr, HugePages::layout(layout)) }
    }
}

#[global_allocator]
static ALLOCATOR: HugePages = HugePages;

/// One layer's matrices, `[N, K]` each: q, k, v, o, gate, up, down.
type Shapes = [(usize, usize); 7];

/// stories110M's layer: hidden 768, MLP 2048.
const STORIES110M: Shapes =
    [(768, 768), (768, 768), (768, 768), (768, 768), (2048, 768), (2048, 768), (768, 2048)];

/// TinyLlama-1.1B's layer: hidden 2048, MLP 5632, 4 kv heads of 64.
const TINYLLAMA: Shapes =
    [(2048, 2048), (256, 2048), (256, 2048), (2048, 2048), (5632, 2048), (5632, 2048), (2048, 5632)];

/// The layer shape this run measures: [`STORIES110M`], or [`TINYLLAMA`] with `--tinyllama`.
static SHAPES: OnceLock<&Shapes> = OnceLock::new();

fn shapes() -> &'static Shapes {
    SHAPES.get().expect("main sets the shapes first")
}

/// `$body` with consts `$n` and `$k` set to the `(N, K)` of `$shape`, one of a layer's
/// matrices in [`STORIES110M`] or [`TINYLLAMA`]: the kernels take their shapes as const
/// generics.
macro_rules! at_shape {
    ($shape:expr, |$n:ident, $k:ident| $body:expr) => {
        at_shape!(@arms $shape, $n, $k, $body;
            (768, 768), (2048, 768), (768, 2048),
            (2048, 2048), (256, 2048), (5632, 2048), (2048, 5632))
    };
    (@arms $shape:expr, $n:ident, $k:ident, $body:expr; $(($rows:literal, $cols:literal)),*) => {
        match $shape {
            $(($rows, $cols) => {
                const $n: usize = $rows;
                const $k: usize = $cols;
                $body
            })*
            other => unreachable!("no layer has a matrix of shape {other:?}"),
        }
    };
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let tinyllama = std::env::args().any(|a| a == "--tinyllama");
    let (model, layer) = if tinyllama { ("TinyLlama", &TINYLLAMA) } else { ("stories110M", &STORIES110M) };
    SHAPES.set(layer).expect("set once");
    let (layers, rounds) = match (full, tinyllama) {
        (false, _) => (1, 2),
        (true, false) => (12, 15),
        (true, true) => (22, 7),
    };
    let mut rng = Rng::new(5);
    let f32_layers: Vec<[Vec<f32>; 7]> =
        (0..layers).map(|_| shapes().map(|(n, k)| rng.vec(n * k, 0.05))).collect();
    let bf16: Vec<[Vec<u16>; 7]> = f32_layers
        .iter()
        .map(|l| l.clone().map(|m| m.iter().map(|v| (v.to_bits() >> 16) as u16).collect()))
        .collect();
    let int8: Vec<[(Vec<i8>, Vec<f32>); 7]> =
        f32_layers.iter().map(|l| l.clone().map(|m| quantize(&m))).collect();
    // The AVX-512 products' packed layouts, which are packed with AVX-512 (none without it).
    let avx512 = monogen_kernel_tests::cpu_has!("avx512f", "avx512bw", "avx512vnni");
    let packed_layers = if avx512 { layers } else { 0 };
    let packed: Vec<[Vec<f32>; 7]> = f32_layers[..packed_layers]
        .iter()
        .map(|l| {
            std::array::from_fn(|i| {
                kernels::matmul__avx512_packed_threads::pack(&l[i], shapes()[i].0, shapes()[i].1)
            })
        })
        .collect();
    let f32 = f32_layers;
    // The AVX2 form of the same layout, at half the width.
    let avx2_bf16: Vec<[Tiles; 7]> = bf16
        .iter()
        .map(|l| {
            std::array::from_fn(|i| {
                Tiles::new(&kernels::matmul__bf16_avx2_packed_threads::pack(
                    &l[i],
                    shapes()[i].0,
                    shapes()[i].1,
                ))
            })
        })
        .collect();
    let packed_bf16: Vec<[Tiles; 7]> = bf16[..packed_layers]
        .iter()
        .map(|l| {
            std::array::from_fn(|i| {
                Tiles::new(&kernels::matmul__bf16_avx512_packed_threads::pack(
                    &l[i],
                    shapes()[i].0,
                    shapes()[i].1,
                ))
            })
        })
        .collect();
    // The AMX tiles and the AVX512_BF16 dot products only where this CPU has them (and the
    // kernel grants the tiles), on weights packed by `pack`: the same layout for every
    // implementation over shared/amx_bf16.rs, copied onto whole cache lines as the crates'
    // loader places them.
    let amx = monogen_kernel_tests::cpu_has!("avx512f", "avx512bw", "amx-tile", "amx-bf16");
    let dot = monogen_kernel_tests::cpu_has!("avx512f", "avx512bw", "avx512bf16");
    let tiles: Vec<[Tiles; 7]> = bf16[..packed_layers]
        .iter()
        .map(|l| {
            std::array::from_fn(|i| {
                Tiles::new(&kernels::matmul__bf16act_avx512_threads::pack(
                    &l[i],
                    shapes()[i].0,
                    shapes()[i].1,
                ))
            })
        })
        .collect();
    // The packed int8 blocks, on cache lines as the crates' loader places them.
    let packed_q8: Vec<[PackedQ8; 7]> = int8[..packed_layers]
        .iter()
        .map(|l| {
            std::array::from_fn(|i| {
                let (n, k) = shapes()[i];
                PackedQ8::new(kernels::matmul__q8_avx512_vnni_packed_threads::pack((&l[i].0, &l[i].1), n, k))
            })
        })
        .collect();
    // The AVX2 form of the packed int8 layout, at half the width.
    let avx2_q8: Vec<[PackedQ8; 7]> = int8
        .iter()
        .map(|l| {
            std::array::from_fn(|i| {
                let (n, k) = shapes()[i];
                PackedQ8::new(kernels::matmul__q8_avx2_packed_threads::pack((&l[i].0, &l[i].1), n, k))
            })
        })
        .collect();
    let params: usize = shapes().iter().map(|(n, k)| n * k).sum::<usize>() * layers;
    // Values and f32 scales; the packed kernel holds its scales in binary16.
    let q8_bytes = params + params / 32 * 4;
    let packed_q8_bytes = params + params / 32 * 2;
    // Each implementation: its name, the bytes its weights hold, and one pass over every
    // layer's matrices at `rows` rows.
    let mut runs: Vec<(&str, usize, Pass)> = vec![
        ("f32 (matmul/avx512-threads)", params * 4, over(&f32, f32_product)),
        ("f32 (matmul/avx512-panels-threads)", params * 4, over(&f32, f32_panels)),
        ("f32 (matmul/avx512-packed-threads)", params * 4, over(&packed, f32_packed)),
        ("f32 (matmul/avx512-repack-threads)", params * 4, over(&f32, f32_repack)),
        ("bf16 (matmul/avx512-threads)", params * 2, over(&bf16, bf16_product)),
        ("bf16 (matmul/bf16-avx512-repack-threads)", params * 2, over(&bf16, bf16_repack)),
        ("bf16 (matmul/bf16-avx512-packed-threads)", params * 2, over(&packed_bf16, bf16_packed)),
        // The AVX2 bf16 products too, which CPUs without AVX-512 take.
        ("bf16 (matmul/avx2-fma-team)", params * 2, over(&bf16, bf16_avx2)),
        ("bf16 (matmul/bf16-avx2-packed-threads)", params * 2, over(&avx2_bf16, bf16_avx2_packed)),
        ("int8 (matmul/q8-avx512-vnni-threads)", q8_bytes, over(&int8, q8_product)),
        ("int8 (matmul/q8-avx512-vnni-repack-threads)", q8_bytes, over(&int8, q8_repack)),
        ("int8 (matmul/q8-avx512-vnni-packed-threads)", packed_q8_bytes, over(&packed_q8, q8_packed)),
        ("int8 (matmul/q8-avx512-vnni, 1 thread)", q8_bytes, over(&int8, q8_one)),
        // The AVX2 int8 products too, which CPUs without AVX-512 VNNI take.
        ("int8 (matmul/q8-avx2-threads)", q8_bytes, over(&int8, q8_avx2)),
        ("int8 (matmul/q8-avx2-packed-threads)", packed_q8_bytes, over(&avx2_q8, q8_avx2_packed)),
        // The same tiles as the threaded f32 and bf16 products, on one thread: with the quick
        // run's one layer, from L3, they show whether memory or the instructions set the pace.
        ("f32 (matmul/avx512, 1 thread)", params * 4, over(&f32, f32_one)),
        ("bf16 (matmul/avx512, 1 thread)", params * 2, over(&bf16, bf16_one)),
    ];
    // Without AVX-512 (x86-64-v3 CPUs such as AMD's Zen 3), the AVX2 products instead.
    if !avx512 {
        println!("(no AVX-512 on this CPU: the AVX2 products measured instead)");
        runs = vec![
            ("f32 (matmul/avx2-fma-team)", params * 4, over(&f32, f32_avx2)),
            ("bf16 (matmul/avx2-fma-team)", params * 2, over(&bf16, bf16_avx2)),
            ("bf16 (matmul/bf16-avx2-packed-threads)", params * 2, over(&avx2_bf16, bf16_avx2_packed)),
            ("int8 (matmul/q8-avx2-threads)", q8_bytes, over(&int8, q8_avx2)),
            ("int8 (matmul/q8-avx2-packed-threads)", packed_q8_bytes, over(&avx2_q8, q8_avx2_packed)),
            // What the packed blocks of a prefill gain over the dot tiles, on one thread.
            ("f32 dot tiles, 1 thread (shared/avx2_team_matmul.rs)", params * 4, over(&f32, f32_avx2_dots)),
            ("f32 packed blocks, 1 thread (shared/avx2_repack.rs)", params * 4, over(&f32, f32_avx2_packs)),
            (
                "bf16 dot tiles, 1 thread (shared/avx2_team_matmul.rs)",
                params * 2,
                over(&bf16, bf16_avx2_dots),
            ),
        ];
    }
    // The same packed int8 layout with AVX-VNNI, where the CPU has it.
    if monogen_kernel_tests::cpu_has!("avx2", "fma", "f16c", "avxvnni") {
        let at = runs.iter().position(|r| r.0 == "int8 (matmul/q8-avx2-packed-threads)").unwrap() + 1;
        let name = "int8 (matmul/q8-avxvnni-packed-threads)";
        runs.insert(at, (name, packed_q8_bytes, over(&avx2_q8, q8_avxvnni_packed)));
    }
    let rounded = "bf16, x rounded (matmul/bf16act-avx512-threads)";
    if avx512 {
        runs.insert(9, (rounded, params * 2, over(&tiles, rounded_fma)));
    }
    if dot {
        let name = "bf16, x rounded (matmul/bf16act-avx512bf16-threads)";
        runs.insert(10, (name, params * 2, over(&tiles, rounded_dot)));
    } else {
        println!("(no AVX512_BF16 on this CPU: matmul/bf16act-avx512bf16-threads not measured)");
    }
    if amx {
        runs.insert(7, ("bf16 (matmul/bf16-amx-threads)", params * 2, over(&tiles, bf16_amx)));
        if dot {
            let name = "bf16, x rounded (matmul/bf16act-amx-threads)";
            runs.insert(12, (name, params * 2, over(&tiles, rounded_amx)));
        }
    } else {
        println!("(no AMX-BF16 on this CPU: the amx-threads implementations not measured)");
    }
    // `cargo bench --bench weights -- bf16 int8` measures only the rows whose names hold one of
    // the words.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let words: Vec<String> = args
        .iter()
        .enumerate()
        .filter(|(i, a)| !a.starts_with("--") && (*i == 0 || args[i - 1] != "--rows"))
        .map(|(_, a)| a.clone())
        .collect();
    if !words.is_empty() {
        runs.retain(|(name, _, _)| words.iter().any(|w| name.contains(w.as_str())));
    }
    println!("{model}'s matrices: {layers} layers, {params} weights; 2 threads; median of {rounds} rounds");
    // The widest activation row any matrix takes or gives.
    let width = shapes().iter().map(|&(n, k)| n.max(k)).max().expect("seven matrices");
    let median = |t: &mut Vec<f64>| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    };
    // At TinyLlama's shapes a 128-row pass takes seconds a candidate: the decode only.
    // `--rows 1,16,32` measures those rows instead (a batched decode step's few rows).
    let chosen: Option<Vec<usize>> = std::env::args().skip_while(|a| a != "--rows").nth(1).map(|list| {
        list.split(',').map(|r| r.parse().expect("--rows takes numbers separated by commas")).collect()
    });
    let passes: &[usize] = match &chosen {
        Some(rows) => rows,
        None if tinyllama => &[1],
        None => &[1, 128],
    };
    for &rows in passes {
        let x = rng.vec(rows * width, 1.0);
        let mut out = vec![0f32; rows * width];
        let mut times = vec![Vec::new(); runs.len()];
        let mut reads = Vec::new();
        // Each round starts one row later than the round before (the read counting as a row),
        // so that no row always runs first: on an AMD EPYC (Zen 3) the decode row that ran
        // first, right after the read, measured 0.04-0.12 of the read below the same
        // implementation run third.
        let slots = runs.len() + usize::from(rows == 1);
        for round in 0..rounds {
            for slot in (0..slots).map(|i| (i + round) % slots) {
                if let Some((_, _, pass)) = runs.get(slot) {
                    times[slot].push(time(|| pass(&mut out, &x, rows)));
                } else {
                    reads.push(time(|| read(&f32)));
                }
            }
        }
        // A decode step's floor: the same bytes read as a plain stream in the same rounds.
        let read_gb_s = if rows == 1 {
            let s = median(&mut reads);
            let gb_s = (params * 4) as f64 / s / 1e9;
            let name = "the f32 weights' bytes summed, 2 threads";
            println!("  read    {name:<56} {:>8.3} ms   {gb_s:>6.1} GB/s", s * 1e3);
            gb_s
        } else {
            0.0
        };
        for ((name, bytes, _), t) in runs.iter().zip(&mut times) {
            let s = median(t);
            if rows == 1 {
                let gb_s = *bytes as f64 / s / 1e9;
                // Against the two threads' read; the rows on one thread show the instructions'
                // pace instead.
                let share = if name.contains("1 thread") {
                    String::new()
                } else {
                    format!("  {:.2} of the read", gb_s / read_gb_s)
                };
                println!("  decode  {name:<56} {:>8.3} ms   {gb_s:>6.1} GB/s{share}", s * 1e3);
            } else {
                println!(
                    "  {rows:>3} rows {name:<54} {:>8.3} ms   {:>6.1} GFLOP/s   {:>6.1} GB/s",
                    s * 1e3,
                    2.0 * (params * rows) as f64 / s / 1e9,
                    *bytes as f64 / s / 1e9
                );
            }
        }
    }
}

/// Sums every matrix of `layers` as a plain stream, as `bench/peaks --read-only` does: two
/// threads, each reading its half of each matrix in turn, with four independent AVX2 (or
/// scalar) accumulators so that the adds do not wait on each other. A decode step cannot
/// read its weights faster.
fn read(layers: &[[Vec<f32>; 7]]) {
    std::thread::scope(|s| {
        for half in 0..2 {
            s.spawn(move || {
                let mut total = 0.0;
                for m in layers.iter().flatten() {
                    let part = m.len() / 2;
                    total += sum(&m[half * part..(half + 1) * part]);
                }
                black_box(total)
            });
        }
    });
}

fn sum(values: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if monogen_kernel_tests::cpu_has!("avx2") {
        // SAFETY: the CPU has AVX2.
        return unsafe { sum_avx2(values) };
    }
    values.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sum_avx2(values: &[f32]) -> f32 {
    use std::arch::x86_64::*;
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

/// One pass of an implementation over every layer's matrices: `(out, x, rows)`.
type Pass<'a> = Box<dyn Fn(&mut [f32], &[f32], usize) + 'a>;

/// The pass of `product` over `layers`, each matrix at its shape.
fn over<'a, M>(layers: &'a [[M; 7]], product: fn(usize, usize, &mut [f32], &[f32], &M, usize)) -> Pass<'a> {
    Box::new(move |out, x, rows| {
        for l in layers {
            for (w, &(n, k)) in l.iter().zip(shapes()) {
                product(n, k, out, x, w, rows);
            }
        }
    })
}

fn time(f: impl FnOnce()) -> f64 {
    // Let the previous implementation's team fall asleep (its workers spin 200 µs after their
    // last product), so that no two teams' workers run at once.
    std::thread::sleep(std::time::Duration::from_millis(2));
    let start = Instant::now();
    f();
    black_box(());
    start.elapsed().as_secs_f64()
}

/// Packed bfloat16 weights starting on a cache line, as a crate's loader places them: a tile
/// load (`tileloadd`) from an address that is not a multiple of 64 takes about 6 times as long,
/// and a `Vec<u16>` of that size starts 16 bytes into its mapping.
struct Tiles {
    lines: Vec<Line>,
    len: usize,
}

#[derive(Clone, Copy)]
#[repr(align(64))]
struct Line([u16; 32]);

impl Tiles {
    fn new(values: &[u16]) -> Tiles {
        let mut lines = vec![Line([0; 32]); values.len().div_ceil(32)];
        for (line, values) in lines.iter_mut().zip(values.chunks(32)) {
            line.0[..values.len()].copy_from_slice(values);
        }
        Tiles { lines, len: values.len() }
    }

    fn as_slice(&self) -> &[u16] {
        // SAFETY: the lines hold at least `len` values, and a `Line` is 32 `u16` and nothing
        // else.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast(), self.len) }
    }
}

/// Packed int8 values and scales starting on a cache line, as a crate's loader places them.
struct PackedQ8 {
    lines: Vec<Bytes>,
    len: usize,
}

#[derive(Clone, Copy)]
#[repr(align(64))]
struct Bytes([i8; 64]);

impl PackedQ8 {
    fn new(values: Vec<i8>) -> PackedQ8 {
        let mut lines = vec![Bytes([0; 64]); values.len().div_ceil(64)];
        for (line, values) in lines.iter_mut().zip(values.chunks(64)) {
            line.0[..values.len()].copy_from_slice(values);
        }
        PackedQ8 { lines, len: values.len() }
    }
}

/// `$name`: a pass of the packed int8 product of kernel module `$kernel` over weights packed on
/// cache lines.
macro_rules! packed_q8_pass {
    ($name:ident, $kernel:ident) => {
        fn $name(n: usize, k: usize, out: &mut [f32], x: &[f32], w: &PackedQ8, rows: usize) {
            // SAFETY: the lines hold at least `len` values, and a `Bytes` is 64 `i8` and nothing
            // else.
            let values = unsafe { std::slice::from_raw_parts(w.lines.as_ptr().cast::<i8>(), w.len) };
            let (out, x, values) = (black_box(out), black_box(x), black_box(values));
            use kernels::$kernel::matmul;
            at_shape!((n, k), |N, K| matmul::<N, K>(out, x, (values, &[]), rows))
        }
    };
}

packed_q8_pass!(q8_packed, matmul__q8_avx512_vnni_packed_threads);
packed_q8_pass!(q8_avx2_packed, matmul__q8_avx2_packed_threads);
// The same layout as `q8_avx2_packed`'s, with AVX-VNNI.
packed_q8_pass!(q8_avxvnni_packed, matmul__q8_avxvnni_packed_threads);

/// Blockwise int8 with a scale per 32 values, as the int8 crates quantize at load (the scale
/// rounded up to binary16; these weights keep it among binary16's normal values).
fn quantize(m: &[f32]) -> (Vec<i8>, Vec<f32>) {
    let (mut values, mut scales) = (Vec::with_capacity(m.len()), Vec::new());
    for block in m.chunks(32) {
        let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
        let scale = f32::from_bits(((amax / 127.0).to_bits() + 0x1fff) & !0x1fff);
        let inverse = if amax > 0.0 { 1.0 / scale } else { 0.0 };
        scales.push(scale);
        values.extend(block.iter().map(|v| (v * inverse).round_ties_even() as i8));
    }
    (values, scales)
}

macro_rules! dispatch {
    ($name:ident, $module:ident, $kernel:ident, int8) => {
        fn $name(n: usize, k: usize, out: &mut [f32], x: &[f32], w: &(Vec<i8>, Vec<f32>), rows: usize) {
            let (out, x, (values, scales)) = (black_box(out), black_box(x), black_box(w));
            at_shape!((n, k), |N, K| kernels::$module::$kernel::<N, K>(out, x, (values, scales), rows))
        }
    };
    ($name:ident, $module:ident, $kernel:ident, $w:ty) => {
        fn $name(n: usize, k: usize, out: &mut [f32], x: &[f32], w: &$w, rows: usize) {
            let (out, x, w) = (black_box(out), black_box(x), black_box(w.as_slice()));
            at_shape!((n, k), |N, K| kernels::$module::$kernel::<N, K>(out, x, w, rows))
        }
    };
}

dispatch!(f32_product, matmul__avx512_threads__f32, matmul, Vec<f32>);
dispatch!(f32_panels, matmul__avx512_panels_threads, matmul, Vec<f32>);
dispatch!(f32_packed, matmul__avx512_packed_threads, matmul, Vec<f32>);
dispatch!(f32_repack, matmul__avx512_repack_threads, matmul, Vec<f32>);
dispatch!(bf16_product, matmul__avx512_threads__bf16, matmul, Vec<u16>);
dispatch!(bf16_repack, matmul__bf16_avx512_repack_threads, matmul, Vec<u16>);
dispatch!(bf16_avx2_packed, matmul__bf16_avx2_packed_threads, matmul, Tiles);
dispatch!(bf16_packed, matmul__bf16_avx512_packed_threads, matmul, Tiles);
dispatch!(bf16_amx, matmul__bf16_amx_threads, matmul, Tiles);
dispatch!(rounded_fma, matmul__bf16act_avx512_threads, matmul, Tiles);
dispatch!(rounded_dot, matmul__bf16act_avx512bf16_threads, matmul, Tiles);
dispatch!(rounded_amx, matmul__bf16act_amx_threads, matmul, Tiles);
dispatch!(q8_product, matmul__q8_avx512_vnni_threads, matmul, int8);
dispatch!(q8_repack, matmul__q8_avx512_vnni_repack_threads, matmul, int8);
dispatch!(q8_one, matmul__q8_avx512_vnni, matmul, int8);
dispatch!(f32_one, matmul__avx512__f32, matmul, Vec<f32>);
dispatch!(bf16_one, matmul__avx512__bf16, matmul, Vec<u16>);
dispatch!(f32_avx2, matmul__avx2_fma_team__f32, matmul, Vec<f32>);
dispatch!(bf16_avx2, matmul__avx2_fma_team__bf16, matmul, Vec<u16>);
dispatch!(q8_avx2, matmul__q8_avx2_threads, matmul, int8);

/// One thread's AVX2 f32 product over all `n` columns: the dot tiles alone, or (`repack`) the
/// packed blocks from `REPACK_ROWS` rows on.
fn avx2_one_thread<W: Weight, const N: usize, const K: usize>(
    out: &mut [f32],
    x: &[f32],
    w: &[W],
    rows: usize,
    repack: bool,
) {
    use kernels::shared::avx2_repack::Repack;
    use kernels::shared::avx2_team_matmul::Product;
    assert!(monogen_kernel_tests::cpu_has!("avx2", "fma"));
    let product = Product::new::<N, K>(out, x, w, rows);
    // SAFETY: the CPU has AVX2 and FMA (asserted), `Product::new` checked the slices, and this
    // thread alone writes `out`.
    unsafe {
        if repack {
            Repack::new(product, &std::sync::atomic::AtomicUsize::new(0)).columns(0..N)
        } else {
            product.columns(0..N)
        }
    }
}

#[allow(clippy::ptr_arg)] // the signature that `over` takes
fn f32_avx2_dots(n: usize, k: usize, out: &mut [f32], x: &[f32], w: &Vec<f32>, rows: usize) {
    avx2_shape(n, k, out, x, w, rows, false)
}

#[allow(clippy::ptr_arg)] // the signature that `over` takes
fn f32_avx2_packs(n: usize, k: usize, out: &mut [f32], x: &[f32], w: &Vec<f32>, rows: usize) {
    avx2_shape(n, k, out, x, w, rows, true)
}

#[allow(clippy::ptr_arg)] // the signature that `over` takes
fn bf16_avx2_dots(n: usize, k: usize, out: &mut [f32], x: &[f32], w: &Vec<u16>, rows: usize) {
    avx2_shape(n, k, out, x, w, rows, false)
}

fn avx2_shape<W: Weight>(n: usize, k: usize, out: &mut [f32], x: &[f32], w: &[W], rows: usize, repack: bool) {
    let (out, x, w) = (black_box(out), black_box(x), black_box(w));
    at_shape!((n, k), |N, K| avx2_one_thread::<W, N, K>(out, x, w, rows, repack))
}
