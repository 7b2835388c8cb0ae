//! SwiGLU on a CUDA GPU: launches `swiglu` of kernel.cu, one thread per value.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use crate::gpu::{CudaSlice, Gpu, GpuError};

/// `gate = silu(gate) · up` on the GPU, for `rows` rows (`gate`, `up`: `[rows, INTERMEDIATE_SIZE]`).
pub fn swiglu(gpu: &Gpu, gate: &mut CudaSlice<f32>, up: &CudaSlice<f32>, rows: usize) -> Result<(), GpuError> {
    let function = gpu.function("swiglu", "swiglu")?;
    let n = rows * crate::INTERMEDIATE_SIZE;
    let config = LaunchConfig { grid_dim: (n.div_ceil(256) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let rows = rows as i32;
    let mut launch = gpu.stream().launch_builder(&function);
    launch.arg(gate).arg(up).arg(&rows);
    // SAFETY: the arguments are those of `swiglu` in kernel.cu, in order, and both buffers
    // hold `rows` rows (the forward pass sizes them).
    unsafe { launch.launch(config) }?;
    Ok(())
}
