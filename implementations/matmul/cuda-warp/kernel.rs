//! Matrix product on a CUDA GPU: launches `matmul_N_K` of kernel.cu (one warp per output
//! value), a grid of ⌈N / 8⌉ × rows blocks of 8 warps.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use crate::gpu::{CudaSlice, Gpu, GpuError};

/// `out = x · wᵀ` on the GPU, at one of the forward pass's shapes (its kernel is compiled for
/// each (N, K) the crate lists).
///
/// `x`: `[rows, K]`; `w`: `[N, K]`; `out`: `[rows, N]`.
pub fn matmul<const N: usize, const K: usize>(
    gpu: &Gpu,
    out: &mut CudaSlice<f32>,
    x: &CudaSlice<f32>,
    w: &CudaSlice<W>,
    rows: usize,
) -> Result<(), GpuError> {
    let function = gpu.function("matmul", &format!("matmul_{N}_{K}"))?;
    let config = LaunchConfig {
        grid_dim: (N.div_ceil(8) as u32, rows as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let rows = rows as i32;
    let mut launch = gpu.stream().launch_builder(&function);
    launch.arg(out).arg(x).arg(w).arg(&rows);
    // SAFETY: the arguments are those of `matmul_N_K` in kernel.cu, in order, and the buffers
    // hold the rows and the matrix it reads and writes (the forward pass sizes them).
    unsafe { launch.launch(config) }?;
    Ok(())
}
