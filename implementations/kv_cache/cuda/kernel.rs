//! The KV cache on a CUDA GPU: `kv_store` launches `kv_store` of kernel.cu, which copies a
//! step's keys and values into a layer's device buffers at their positions.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use crate::gpu::{CudaSlice, Gpu, GpuError};

/// Stores `rows` rows of keys and values (`k`, `v`: `[rows, KV_DIM]`) at positions
/// `start..start + rows` of a layer's cache (`keys`, `values`: `[MAX_SEQ_LEN, KV_DIM]`).
pub fn kv_store(
    gpu: &Gpu,
    keys: &mut CudaSlice<KV>,
    values: &mut CudaSlice<KV>,
    k: &CudaSlice<f32>,
    v: &CudaSlice<f32>,
    start: usize,
    rows: usize,
) -> Result<(), GpuError> {
    let function = gpu.function("kv_cache", "kv_store")?;
    let n = rows * crate::KV_DIM;
    let config = LaunchConfig { grid_dim: (n.div_ceil(256) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let (start, rows) = (start as i32, rows as i32);
    let mut launch = gpu.stream().launch_builder(&function);
    launch.arg(keys).arg(values).arg(k).arg(v).arg(&start).arg(&rows);
    // SAFETY: the arguments are those of `kv_store` in kernel.cu, in order; start + rows is at
    // most MAX_SEQ_LEN (Session::check), the rows the cache holds.
    unsafe { launch.launch(config) }?;
    Ok(())
}
