//! Attention of one decoded token on a CUDA GPU, split over the KV length: launches
//! `attention_decode_spans` of kernel.cu, one block of 128 threads per (span of 256 positions,
//! head), which leaves each span's largest score, sum of exponentials and weighted values in
//! `scratch`, then `attention_decode_combine`, one block per head, which combines them.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use crate::gpu::{CudaSlice, Gpu, GpuError};

/// Positions one block of `attention_decode_spans` scores (ATTENTION_SPAN of kernel.cu).
const SPAN: usize = 256;

/// The query (`q`: `[1, Q_DIM]`) attends to positions `0..len` of a layer's cache (`keys`,
/// `values`: `[MAX_SEQ_LEN, KV_DIM]`); the result goes to `out` (`[1, Q_DIM]`). `scratch`
/// (`[NUM_HEADS, MAX_SEQ_LEN + HEAD_DIM + 2]`) holds the spans' partial sums.
pub fn attention_decode(
    gpu: &Gpu,
    out: &mut CudaSlice<f32>,
    q: &CudaSlice<f32>,
    keys: &CudaSlice<KV>,
    values: &CudaSlice<KV>,
    scratch: &mut CudaSlice<f32>,
    len: usize,
) -> Result<(), GpuError> {
    let heads = crate::NUM_HEADS as u32;
    let spans = gpu.function("attention_decode", "attention_decode_spans")?;
    let config = LaunchConfig { grid_dim: (len.div_ceil(SPAN) as u32, heads, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
    let len = len as i32;
    let mut launch = gpu.stream().launch_builder(&spans);
    launch.arg(&mut *scratch).arg(q).arg(keys).arg(values).arg(&len);
    // SAFETY: the arguments are those of `attention_decode_spans` in kernel.cu, in order; the
    // positions it reads (below len ≤ MAX_SEQ_LEN) were stored before it runs, and scratch holds
    // NUM_HEADS × (MAX_SEQ_LEN + HEAD_DIM + 2) values, each head's spans' partials within its row.
    unsafe { launch.launch(config) }?;
    let combine = gpu.function("attention_decode", "attention_decode_combine")?;
    let config = LaunchConfig { grid_dim: (heads, 1, 1), block_dim: (64, 1, 1), shared_mem_bytes: 0 };
    let mut launch = gpu.stream().launch_builder(&combine);
    launch.arg(out).arg(&*scratch).arg(&len);
    // SAFETY: the arguments are those of `attention_decode_combine` in kernel.cu, in order; it
    // reads the partials the launch before wrote, on the same stream.
    unsafe { launch.launch(config) }?;
    Ok(())
}
