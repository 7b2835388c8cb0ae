//! Causal attention of a chunk of prompt rows on a CUDA GPU, in the flash style: launches
//! `attention_prefill` of kernel.cu, one block of 4 warps per (tile of 16 rows, head).

use cudarc::driver::{LaunchConfig, PushKernelArg};

use crate::gpu::{CudaSlice, Gpu, GpuError};

/// Row `r` of `q` (`[rows, Q_DIM]`, at position `start + r`) attends to positions
/// `0..=start + r` of a layer's cache (`keys`, `values`: `[MAX_SEQ_LEN, KV_DIM]`); the result
/// goes to row `r` of `out` (`[rows, Q_DIM]`).
pub fn attention_prefill(
    gpu: &Gpu,
    out: &mut CudaSlice<f32>,
    q: &CudaSlice<f32>,
    keys: &CudaSlice<KV>,
    values: &CudaSlice<KV>,
    start: usize,
    rows: usize,
) -> Result<(), GpuError> {
    let function = gpu.function("attention_prefill", "attention_prefill")?;
    let config = LaunchConfig {
        grid_dim: (rows.div_ceil(16) as u32, crate::NUM_HEADS as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    let (start, rows) = (start as i32, rows as i32);
    let mut launch = gpu.stream().launch_builder(&function);
    launch.arg(out).arg(q).arg(keys).arg(values).arg(&start).arg(&rows);
    // SAFETY: the arguments are those of `attention_prefill` in kernel.cu, in order; the
    // positions it reads (below start + rows ≤ MAX_SEQ_LEN) were stored before it runs.
    unsafe { launch.launch(config) }?;
    Ok(())
}
