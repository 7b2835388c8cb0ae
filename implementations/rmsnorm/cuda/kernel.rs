//! RMS norm on a CUDA GPU: launches `rmsnorm` of kernel.cu, one block of 256 threads per row.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use crate::gpu::{CudaSlice, Gpu, GpuError};

/// Normalises `rows` rows of `HIDDEN_SIZE` values on the GPU: `out = weight · x / √(mean(x²) + eps)`.
///
/// `x`, `out`: `[rows, HIDDEN_SIZE]`; `weight`: `[HIDDEN_SIZE]`.
pub fn rmsnorm(
    gpu: &Gpu,
    out: &mut CudaSlice<f32>,
    x: &CudaSlice<f32>,
    weight: &CudaSlice<f32>,
    rows: usize,
) -> Result<(), GpuError> {
    let function = gpu.function("rmsnorm", "rmsnorm")?;
    let config = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let rows = rows as i32;
    let mut launch = gpu.stream().launch_builder(&function);
    launch.arg(out).arg(x).arg(weight).arg(&rows);
    // SAFETY: the arguments are those of `rmsnorm` in kernel.cu, in order, and every buffer
    // holds the rows it reads or writes (the forward pass sizes them).
    unsafe { launch.launch(config) }?;
    Ok(())
}
