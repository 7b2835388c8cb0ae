//! Attention of one decoded token on a CUDA GPU: launches `attention_decode` of kernel.cu, one
//! block of 128 threads per head, which split the positions between them.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use crate::gpu::{CudaSlice, Gpu, GpuError};

/// The query (`q`: `[1, Q_DIM]`) attends to positions `0..len` of a layer's cache (`keys`,
/// `values`: `[MAX_SEQ_LEN, KV_DIM]`); the result goes to `out` (`[1, Q_DIM]`).
pub fn attention_decode(
    gpu: &Gpu,
    out: &mut CudaSlice<f32>,
    q: &CudaSlice<f32>,
    keys: &CudaSlice<f32>,
    values: &CudaSlice<f32>,
    len: usize,
) -> Result<(), GpuError> {
    let function = gpu.function("attention_decode", "attention_decode")?;
    let config = LaunchConfig { grid_dim: (1, crate::NUM_HEADS as u32, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
    let len = len as i32;
    let mut launch = gpu.stream().launch_builder(&function);
    launch.arg(out).arg(q).arg(keys).arg(values).arg(&len);
    // SAFETY: the arguments are those of `attention_decode` in kernel.cu, in order; the
    // positions it reads (below len ≤ MAX_SEQ_LEN) were stored before it runs.
    unsafe { launch.launch(config) }?;
    Ok(())
}
