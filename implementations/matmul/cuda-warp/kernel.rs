//! Matrix product on a CUDA GPU: for fewer than `TILED_ROWS` rows (a decode step) launches
//! `matmul_N_K` of kernel.cu, one warp per output value, a grid of ⌈N / 8⌉ × rows blocks of 8
//! warps; for more (prefill), `matmul_tiles_N_K`, a block of 256 threads per tile of 64 rows ×
//! 64 outputs.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use crate::gpu::{CudaSlice, Gpu, GpuError};

/// Rows from which a product runs in tiles: below, a warp per output reads each weight row
/// once per row, which costs less than a tile's staging for so few rows.
const TILED_ROWS: usize = 8;

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
    let (function, config) = if rows < TILED_ROWS {
        let config = LaunchConfig { grid_dim: (N.div_ceil(8) as u32, rows as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        (gpu.function("matmul", &format!("matmul_{N}_{K}"))?, config)
    } else {
        let config = LaunchConfig {
            grid_dim: (N.div_ceil(64) as u32, rows.div_ceil(64) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        (gpu.function("matmul", &format!("matmul_tiles_{N}_{K}"))?, config)
    };
    let rows = rows as i32;
    let mut launch = gpu.stream().launch_builder(&function);
    launch.arg(out).arg(x).arg(w).arg(&rows);
    // SAFETY: the arguments are those of `matmul_N_K` and `matmul_tiles_N_K` in kernel.cu, in
    // order, and the buffers hold the rows and the matrix they read and write (the forward pass
    // sizes them).
    unsafe { launch.launch(config) }?;
    Ok(())
}
