//! The AVX-512 VNNI matrix product with blockwise int8 weights that the `matmul<q8>`
//! implementations share, computed over a range of weight rows (output columns) so that
//! threads can share a call.
//!
//! [`Q8Product::prepared`] first quantizes the activations, once per call, into buffers of the
//! calling thread: each row's int8 values, padded with zeros to a multiple of 64, and its
//! block scales, each pair of them spread over the 16 lanes of a vector (8 lanes each) so
//! that they line up with the sums below.
//!
//! A step along K takes 64 values: one load of 64 weights, and per activation row one
//! `vpdpbusd`, which adds 4 products of unsigned by signed bytes into each of 16 i32 lanes
//! (lanes 0–7 hold the first block of 32, lanes 8–15 the second). The activations are signed.
//! A lone row's magnitudes |qx| are the unsigned operand and the weights take the row's signs
//! (negated, with a mask, where qx is negative): |qx| · ±w = qx · w. A tile of several rows
//! offsets them instead, qx + 128 (never above 255), and starts each sum at −128 · Σw, which
//! one `vpdpbusd` of 128s by the weights gives for all the tile's rows: one instruction per
//! row and step rather than two. Each lane's sum becomes
//! f32 and is multiplied into its accumulator by dx · dw of its block. At the end of K, the
//! 16 lanes of each accumulator are added.
//!
//! A tile holds 4 activation rows × 4 weight rows (1 × 8 for a lone row, a decode step); the
//! 4 weight rows stay in L1 while every tile of rows passes over them, so each weight is read
//! from memory once per call. The last step of a row whose K is not a multiple of 64 loads
//! its weights and scales with masks.
//!
//! # Safety
//!
//! [`Q8Product::columns`] may be called only on a CPU with AVX-512F, AVX-512BW and AVX-512
//! VNNI, from inside [`Q8Product::prepared`], with pointers that hold `[n, k]` weights, their
//! `[n, ⌈k/32⌉]` scales and `[rows, n]` outputs, and never twice at once on overlapping column
//! ranges of the same `out`.
#![allow(dead_code, clippy::missing_safety_doc, clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::job::{self, Extent, Job};

/// Values of K that share one scale.
pub const BLOCK: usize = 32;

/// Values of K per step: the bytes of one AVX-512 register, two blocks. [`quantize_row`] pads a
/// row to a whole number of steps.
pub const STEP: usize = 64;

/// Rows from which a product runs as panels on packed activations.
pub const PANEL_ROWS: usize = 32;

thread_local! {
    /// The quantized activations of the calling thread's current product: the values
    /// (`[rows, k padded to 64]`) and the spread scales (`[rows, steps, 16]`).
    static QUANTIZED: RefCell<(Vec<i8>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    /// The same packed for the panels (see [`Q8Product::xp`]).
    static PACKED: RefCell<(Vec<u8>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    /// The weight sums of a panel's rows, per block, in a thread of the team.
    static WEIGHT_SUMS: RefCell<Vec<i32>> = const { RefCell::new(Vec::new()) };
}

/// One call's operands: `out[r, j]` for `r < rows`, `j < n`, from `x: [rows, k]` and the
/// weights `w: [n, k]` with their `scales: [n, ⌈k/32⌉]`.
#[derive(Clone, Copy)]
pub struct Q8Product {
    pub out: *mut f32,
    pub x: *const f32,
    pub w: *const i8,
    pub scales: *const f32,
    pub rows: usize,
    pub n: usize,
    pub k: usize,
    /// The quantized activations, `[rows, steps · 64]`, once `prepared` has written them.
    pub qx: *const i8,
    /// Their scales, `[rows, steps, 16]`: lanes 0–7 the first block of a step, 8–15 the second.
    pub dx: *const f32,
    /// From [`PANEL_ROWS`] rows on, the quantized activations packed for the panels instead:
    /// per group of 16 rows and per 4 values of K, 16 lanes of 4 bytes, each `qx + 128`
    /// (`[groups, ⌈k/4⌉, 16, 4]`); null otherwise.
    pub xp: *const u8,
    /// The packed rows' scales, `[groups, blocks, 16]`.
    pub dxp: *const f32,
}

// SAFETY: a product is only pointers to buffers that its caller keeps alive and shares out
// by disjoint column ranges until every thread is done (see the module's safety section).
unsafe impl Send for Q8Product {}
unsafe impl Sync for Q8Product {}

impl Q8Product {
    /// The product of `rows` rows over `[N, K]` weights, with the slices' lengths checked.
    #[inline]
    pub fn new<const N: usize, const K: usize>(
        out: &mut [f32],
        x: &[f32],
        w: &[i8],
        scales: &[f32],
        rows: usize,
    ) -> Q8Product {
        let blocks = K.div_ceil(BLOCK);
        assert!(x.len() >= rows * K, "matmul: x is shorter than {rows} rows of {K}");
        assert!(w.len() >= N * K, "matmul: w is shorter than {N} rows of {K}");
        assert!(scales.len() >= N * blocks, "matmul: scales is shorter than {N} rows of {blocks}");
        assert!(out.len() >= rows * N, "matmul: out is shorter than {rows} rows of {N}");
        Q8Product {
            out: out.as_mut_ptr(),
            x: x.as_ptr(),
            w: w.as_ptr(),
            scales: scales.as_ptr(),
            rows,
            n: N,
            k: K,
            qx: std::ptr::null(),
            dx: std::ptr::null(),
            xp: std::ptr::null(),
            dxp: std::ptr::null(),
        }
    }

    /// Steps of 64 along K.
    fn steps(&self) -> usize {
        self.k.div_ceil(STEP)
    }

    /// Quantizes the activations into this thread's buffers (alive until `f` returns), then
    /// runs `f` on the product.
    ///
    /// # Safety
    ///
    /// Only on a CPU with AVX-512F and AVX-512BW, with `x` holding `[rows, k]` values.
    pub unsafe fn prepared<T>(mut self, f: impl FnOnce(&Q8Product) -> T) -> T {
        QUANTIZED.with_borrow_mut(|(qx, dx)| {
            let steps = self.steps();
            qx.clear();
            qx.resize(self.rows * steps * STEP, 0);
            dx.clear();
            dx.resize(self.rows * steps * 16, 0.0);
            for r in 0..self.rows {
                // SAFETY: row `r` of x holds k values (the caller's contract), and the rows of
                // the buffers have the sizes `quantize_row` writes.
                unsafe {
                    quantize_row(
                        std::slice::from_raw_parts(self.x.add(r * self.k), self.k),
                        &mut qx[r * steps * STEP..(r + 1) * steps * STEP],
                        &mut dx[r * steps * 16..(r + 1) * steps * 16],
                    )
                };
            }
            self.qx = qx.as_ptr();
            self.dx = dx.as_ptr();
            if self.rows < PANEL_ROWS {
                return f(&self);
            }
            PACKED.with_borrow_mut(|(xp, dxp)| {
                self.pack(qx, dx, xp, dxp);
                self.xp = xp.as_ptr();
                self.dxp = dxp.as_ptr();
                f(&self)
            })
        })
    }

    /// Packs the quantized rows for the panels: per group of 16 rows, each 4 values of K as
    /// one 32-bit lane of a row (made unsigned by adding 128), and each block's scales as 16
    /// lanes. Rows past the end are zeros with scale 0.
    fn pack(&self, qx: &[i8], dx: &[f32], xp: &mut Vec<u8>, dxp: &mut Vec<f32>) {
        let (steps, blocks, quads) = (self.steps(), self.k.div_ceil(BLOCK), self.k.div_ceil(4));
        let groups = self.rows.div_ceil(16);
        xp.clear();
        xp.resize(groups * quads * 64, 128);
        dxp.clear();
        dxp.resize(groups * blocks * 16, 0.0);
        for r in 0..self.rows {
            let (g, lane) = (r / 16, r % 16);
            let row = &qx[r * steps * STEP..][..quads * 4];
            for (q, values) in row.chunks_exact(4).enumerate() {
                let at = (g * quads + q) * 64 + lane * 4;
                for (o, &v) in xp[at..at + 4].iter_mut().zip(values) {
                    *o = (v as u8) ^ 0x80;
                }
            }
            for b in 0..blocks {
                dxp[(g * blocks + b) * 16 + lane] = dx[r * steps * 16 + b * 8];
            }
        }
    }

    /// Computes the columns `cols` (weight rows) of every row of `out`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn columns(&self, cols: Range<usize>) {
        if !self.xp.is_null() {
            // SAFETY: the caller's contract; `xp` was written by `prepared`.
            unsafe { self.columns_panels(cols) };
            return;
        }
        let mut j = cols.start;
        if self.rows == 1 {
            while j + 8 <= cols.end {
                // SAFETY: the columns and the row are in range (the caller's contract).
                unsafe { self.tile::<1, 8>(0, j) };
                j += 8;
            }
        }
        while j + 4 <= cols.end {
            // SAFETY: as above.
            unsafe { self.all_rows::<4>(j) };
            j += 4;
        }
        while j < cols.end {
            // SAFETY: as above.
            unsafe { self.all_rows::<1>(j) };
            j += 1;
        }
    }

    /// The columns `cols` of every row, from the packed activations: 4 weight rows at a time
    /// (then 1), each over panels of 32 rows (then 16).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn columns_panels(&self, cols: Range<usize>) {
        WEIGHT_SUMS.with_borrow_mut(|sums| {
            let mut j = cols.start;
            while j + 4 <= cols.end {
                // SAFETY: the columns are in range (the caller's contract).
                unsafe { self.panel_columns::<4>(j, sums) };
                j += 4;
            }
            while j < cols.end {
                // SAFETY: as above.
                unsafe { self.panel_columns::<1>(j, sums) };
                j += 1;
            }
        })
    }

    /// Columns `j..j + C` of every row: the weight rows' sums per block (which correct for
    /// the 128 added to the activations), then the panels of all the rows.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn panel_columns<const C: usize>(&self, j: usize, sums: &mut Vec<i32>) {
        let k = self.k;
        sums.clear();
        for c in 0..C {
            // SAFETY: weight row `j + c` holds k values.
            let row = unsafe { std::slice::from_raw_parts(self.w.add((j + c) * k), k) };
            sums.extend(row.chunks(BLOCK).map(|b| 128 * b.iter().map(|&v| i32::from(v)).sum::<i32>()));
        }
        let groups = self.rows.div_ceil(16);
        let mut g = 0;
        while g + 2 <= groups {
            // SAFETY: groups `g..g + 2` are packed and the columns are in range.
            unsafe { self.panel::<2, C>(g, j, sums) };
            g += 2;
        }
        if g < groups {
            // SAFETY: as above.
            unsafe { self.panel::<1, C>(g, j, sums) };
        }
    }

    /// Rows `16·g..16·(g + V)` (those below `rows`) of columns `j..j + C`: per block, 8 steps
    /// of 4 values of K, each one `vpdpbusd` per group and weight row (16 rows × 4 products,
    /// the 4 weights broadcast to every lane), then the block's i32 sums are scaled into f32
    /// accumulators.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn panel<const V: usize, const C: usize>(&self, g: usize, j: usize, sums: &[i32]) {
        let (k, blocks, quads) = (self.k, self.k.div_ceil(BLOCK), self.k.div_ceil(4));
        let mut acc = [[_mm512_setzero_ps(); V]; C];
        // SAFETY (every pointer below): groups `g..g + V` hold `quads` packed steps and
        // `blocks` scales, weight rows `j..j + C` hold k values and `blocks` scales.
        let xs: [*const u8; V] = std::array::from_fn(|v| unsafe { self.xp.add((g + v) * quads * 64) });
        let ds: [*const f32; V] = std::array::from_fn(|v| unsafe { self.dxp.add((g + v) * blocks * 16) });
        let ws: [*const i8; C] = std::array::from_fn(|c| unsafe { self.w.add((j + c) * k) });
        for b in 0..blocks {
            // Each sum starts at minus the correction: Σ (qx + 128) · w − 128 · Σ w = Σ qx · w.
            let dots_init: [__m512i; C] = std::array::from_fn(|c| _mm512_set1_epi32(-sums[c * blocks + b]));
            let mut dots: [[__m512i; V]; C] = std::array::from_fn(|c| [dots_init[c]; V]);
            let (first, last) = (8 * b, (8 * b + 8).min(quads));
            if last * 4 <= k && last - first == 8 {
                // A whole block: 8 steps, each weight a plain 4-byte load.
                for q in first..last {
                    // SAFETY: the 4 weights at 4·q lie inside each row (checked above).
                    unsafe {
                        Self::step::<V, C>(&mut dots, xs, q, |c| {
                            std::ptr::read_unaligned(ws[c].add(4 * q).cast())
                        })
                    };
                }
            } else {
                for q in first..last {
                    let four = |c: usize| {
                        // The row's last values may be fewer than 4: zeros after them.
                        let mut bytes = [0u8; 4];
                        for (i, byte) in bytes.iter_mut().enumerate().take(k - 4 * q) {
                            // SAFETY: value 4·q + i < k of weight row j + c.
                            *byte = unsafe { *ws[c].add(4 * q + i) } as u8;
                        }
                        i32::from_le_bytes(bytes)
                    };
                    // SAFETY: as above; `four` reads only values of the rows.
                    unsafe { Self::step::<V, C>(&mut dots, xs, q, four) };
                }
            }
            for c in 0..C {
                let dw = _mm512_set1_ps(unsafe { *self.scales.add((j + c) * blocks + b) });
                for v in 0..V {
                    let exact = _mm512_cvtepi32_ps(dots[c][v]);
                    let scale = _mm512_mul_ps(dw, unsafe { _mm512_loadu_ps(ds[v].add(b * 16)) });
                    acc[c][v] = _mm512_fmadd_ps(exact, scale, acc[c][v]);
                }
            }
        }
        let mut lanes = [0.0f32; 16];
        for c in 0..C {
            for v in 0..V {
                // SAFETY: `lanes` holds 16 floats.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc[c][v]) };
                let row0 = (g + v) * 16;
                for (i, &value) in lanes.iter().enumerate().take(self.rows.saturating_sub(row0)) {
                    // SAFETY: row `row0 + i` is below `rows`, and column `j + c` is in range
                    // and in this thread's columns.
                    unsafe { *self.out.add((row0 + i) * self.n + j + c) = value };
                }
            }
        }
    }

    /// One step of a panel: the packed activations of 4 values of K for each group, times the
    /// 4 weights `four(c)` of each weight row, broadcast.
    ///
    /// # Safety
    ///
    /// Step `q` of groups `xs` is packed.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn step<const V: usize, const C: usize>(
        dots: &mut [[__m512i; V]; C],
        xs: [*const u8; V],
        q: usize,
        four: impl Fn(usize) -> i32,
    ) {
        let mut xv = [_mm512_setzero_si512(); V];
        for v in 0..V {
            // SAFETY: the caller's contract.
            xv[v] = unsafe { _mm512_loadu_si512(xs[v].add(q * 64).cast()) };
        }
        for c in 0..C {
            let wv = _mm512_set1_epi32(four(c));
            for v in 0..V {
                dots[c][v] = _mm512_dpbusd_epi32(dots[c][v], xv[v], wv);
            }
        }
    }

    /// Columns `j..j + C` of every row: 4-row tiles, then one smaller tile for the rest.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn all_rows<const C: usize>(&self, j: usize) {
        let mut r = 0;
        while r + 4 <= self.rows {
            // SAFETY: rows `r..r + 4` and the columns are in range.
            unsafe { self.tile::<4, C>(r, j) };
            r += 4;
        }
        // SAFETY: as above, for the rows that are left.
        match self.rows - r {
            3 => unsafe { self.tile::<3, C>(r, j) },
            2 => unsafe { self.tile::<2, C>(r, j) },
            1 => unsafe { self.tile::<1, C>(r, j) },
            _ => {}
        }
    }

    /// The `R × C` block of `out` at row `r`, column `j`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn tile<const R: usize, const C: usize>(&self, r: usize, j: usize) {
        let (k, steps) = (self.k, self.steps());
        let blocks = k.div_ceil(BLOCK);
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        // SAFETY (every pointer below): rows `r..r + R` of the quantized activations hold
        // `steps` steps, weight rows `j..j + C` hold `k` values and `blocks` scales, and the
        // last step's loads are masked to the end of the row.
        let qx: [*const i8; R] = std::array::from_fn(|i| unsafe { self.qx.add((r + i) * steps * STEP) });
        let dx: [*const f32; R] = std::array::from_fn(|i| unsafe { self.dx.add((r + i) * steps * 16) });
        let ws: [*const i8; C] = std::array::from_fn(|c| unsafe { self.w.add((j + c) * k) });
        let ss: [*const f32; C] = std::array::from_fn(|c| unsafe { self.scales.add((j + c) * blocks) });
        for s in 0..steps {
            let at = s * STEP;
            let left = k - at;
            // A lone row: |qx| and its signs. Several rows: qx + 128 (qx ^ 0x80 as unsigned
            // bytes), whose extra 128 · Σw each weight row's correction takes back once for
            // all the rows.
            let mut magnitude = [_mm512_setzero_si512(); R];
            let mut negative = [0 as __mmask64; R];
            for i in 0..R {
                let q = unsafe { _mm512_loadu_si512(qx[i].add(at).cast()) };
                if R == 1 {
                    negative[i] = _mm512_movepi8_mask(q);
                    magnitude[i] = _mm512_abs_epi8(q);
                } else {
                    magnitude[i] = _mm512_xor_si512(q, _mm512_set1_epi8(i8::MIN));
                }
            }
            if R == 1 {
                for w in ws {
                    // The same line of the next tile's weight rows (a prefetch never faults).
                    _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(C * k + at).cast());
                }
            }
            for c in 0..C {
                let (wv, dw) = if left >= STEP {
                    let w = unsafe { _mm512_loadu_si512(ws[c].add(at).cast()) };
                    let d = unsafe {
                        _mm512_mask_blend_ps(
                            0xff00,
                            _mm512_set1_ps(*ss[c].add(2 * s)),
                            _mm512_set1_ps(*ss[c].add(2 * s + 1)),
                        )
                    };
                    (w, d)
                } else {
                    let w = unsafe { _mm512_maskz_loadu_epi8(u64::MAX >> (STEP - left), ws[c].add(at)) };
                    let second = if left > BLOCK { unsafe { *ss[c].add(2 * s + 1) } } else { 0.0 };
                    let d = unsafe {
                        _mm512_mask_blend_ps(
                            0xff00,
                            _mm512_set1_ps(*ss[c].add(2 * s)),
                            _mm512_set1_ps(second),
                        )
                    };
                    (w, d)
                };
                // −128 · Σw over each lane's 4 weights, where the rows are offset by 128.
                let correction = if R == 1 {
                    _mm512_setzero_si512()
                } else {
                    let offset = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(i8::MIN), wv);
                    _mm512_sub_epi32(_mm512_setzero_si512(), offset)
                };
                for i in 0..R {
                    let sums = if R == 1 {
                        let signed = _mm512_mask_sub_epi8(wv, negative[i], _mm512_setzero_si512(), wv);
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), magnitude[i], signed)
                    } else {
                        _mm512_dpbusd_epi32(correction, magnitude[i], wv)
                    };
                    let scale = _mm512_mul_ps(dw, unsafe { _mm512_loadu_ps(dx[i].add(s * 16)) });
                    acc[i][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scale, acc[i][c]);
                }
            }
        }
        for i in 0..R {
            for c in 0..C {
                // SAFETY: row `r + i`, column `j + c` of `out` is in range and in this
                // thread's columns.
                unsafe { *self.out.add((r + i) * self.n + j + c) = _mm512_reduce_add_ps(acc[i][c]) };
            }
        }
    }
}

/// Quantizes one row of activations: per block of 32, `d = max|x| / 127` and
/// `q = round(x · (127 / max|x|))` (ties to even, as the CPU rounds by default); `q` is padded
/// with zeros to whole steps and `d` spread over 8 lanes per block.
#[target_feature(enable = "avx512f,avx512bw")]
pub fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    assert!(q.len() >= x.len().div_ceil(STEP) * STEP && d.len() >= x.len().div_ceil(STEP) * 16);
    for (b, block) in x.chunks(BLOCK).enumerate() {
        let (low, high) = block.split_at(block.len().min(16));
        // SAFETY: the masks limit each load to the values of the block.
        let (low, high) = unsafe {
            (
                _mm512_maskz_loadu_ps(mask16(low.len()), low.as_ptr()),
                _mm512_maskz_loadu_ps(mask16(high.len()), high.as_ptr()),
            )
        };
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(low), _mm512_abs_ps(high)));
        let inverse = _mm512_set1_ps(if amax > 0.0 { 127.0 / amax } else { 0.0 });
        for (half, v) in [low, high].into_iter().enumerate() {
            let bytes = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v, inverse)));
            // SAFETY: block `b`'s half lies inside `q`, whose length was checked above.
            unsafe { _mm_storeu_si128(q.as_mut_ptr().add(b * BLOCK + half * 16).cast(), bytes) };
        }
        let scale = amax / 127.0;
        d[b * 8..(b + 1) * 8].fill(scale);
    }
}

/// A mask of the first `len` (≤ 16) lanes.
fn mask16(len: usize) -> __mmask16 {
    if len >= 16 { u16::MAX } else { (1u16 << len) - 1 }
}

/// A product as a team shares it, by weight rows.
impl Job for Q8Product {
    fn extent(&self) -> Extent {
        Extent::product(self.rows, self.n, self.k, job::GRANULE)
    }

    unsafe fn columns(&self, cols: Range<usize>) {
        // SAFETY: the caller's contract, which `team::run` keeps.
        unsafe { self.columns(cols) }
    }
}
