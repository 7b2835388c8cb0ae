//! Rotary position embedding on a CUDA GPU. The tables are the reference's (`rope_table`,
//! torch-exact f32 angles, cos and sin evaluated in f64), made on the host and uploaded once;
//! `rope` launches `rope` of kernel.cu, one block per row.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use crate::gpu::{CudaSlice, Gpu, GpuError};

/// Builds the cos and sin tables, each `[positions, HEAD_DIM / 2]`, for base `theta`, on the host.
pub fn rope_table<const HEAD_DIM: usize>(theta: f32, positions: usize) -> (Vec<f32>, Vec<f32>) {
    let inv_freq: Vec<f32> =
        (0..HEAD_DIM / 2).map(|i| 1.0 / theta.powf((2 * i) as f32 / HEAD_DIM as f32)).collect();
    rope_table_from::<HEAD_DIM>(&inv_freq, positions)
}

/// Builds the cos and sin tables, each `[positions, HEAD_DIM / 2]`, for the given inverse
/// frequencies (`HEAD_DIM / 2` of them), on the host: the angle `p · f` in f32, its cos and sin
/// in f64, rounded to f32.
pub fn rope_table_from<const HEAD_DIM: usize>(inv_freq: &[f32], positions: usize) -> (Vec<f32>, Vec<f32>) {
    let half = HEAD_DIM / 2;
    let mut cos = Vec::with_capacity(positions * half);
    let mut sin = Vec::with_capacity(positions * half);
    for p in 0..positions {
        for &f in &inv_freq[..half] {
            let angle = f64::from(p as f32 * f);
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (cos, sin)
}

/// Rotates, in place on the GPU, the queries (`[rows, Q_DIM]`) and keys (`[rows, KV_DIM]`) of
/// positions `start..start + rows`, with tables from [`rope_table`].
pub fn rope(
    gpu: &Gpu,
    q: &mut CudaSlice<f32>,
    k: &mut CudaSlice<f32>,
    cos: &CudaSlice<f32>,
    sin: &CudaSlice<f32>,
    start: usize,
    rows: usize,
) -> Result<(), GpuError> {
    let function = gpu.function("rope", "rope")?;
    let config = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
    let (start, rows) = (start as i32, rows as i32);
    let mut launch = gpu.stream().launch_builder(&function);
    launch.arg(q).arg(k).arg(cos).arg(sin).arg(&start).arg(&rows);
    // SAFETY: the arguments are those of `rope` in kernel.cu, in order; the tables hold every
    // position below MAX_SEQ_LEN, and start + rows is at most that (Session::check).
    unsafe { launch.launch(config) }?;
    Ok(())
}
