//! Launcher for kernels/gelu.cu: x = gelu_new(x + bias) in place.

use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use super::context::{DeviceFloat, Gpu};
use super::{check, need};
use crate::error::{driver_err, Result};

/// Threads per block of every gelu launch (the grid-stride loop does not depend on it).
pub const BLOCK: u32 = 256;

/// Grid sizes the launcher may pick: enough blocks to cover the elements, capped (grid-stride
/// loop beyond). The fuzz test also runs a tiny cap so that the stride loop is exercised.
pub fn default_grid(gpu: &Gpu, elements: usize) -> u32 {
    let cap = gpu.sm_count.max(1) as usize * 32;
    elements.div_ceil(BLOCK as usize).clamp(1, cap) as u32
}

/// `gelu_<T>(T* x /*[n, ld]*/, const float* bias /*[f]*/, uint32_t n, uint32_t f, uint32_t ld)`.
pub fn gelu<T: DeviceFloat>(
    gpu: &Gpu,
    x: &mut CudaViewMut<T>,
    bias: &CudaView<f32>,
    [n, f, ld]: [usize; 3],
    grid: Option<u32>,
) -> Result<()> {
    if n == 0 || f == 0 {
        return Ok(());
    }
    check(
        ld >= f && x.len() >= need(n, ld, f) && bias.len() >= f,
        "gelu: buffers shorter than the shapes",
    )?;
    let grid = grid.unwrap_or_else(|| default_grid(gpu, n * f)).max(1);
    let (n32, f32_, ld32) = (n as u32, f as u32, ld as u32);
    let cfg = LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: argument types match the C signature above; the check bounds every access.
    unsafe {
        gpu.stream
            .launch_builder(T::pick(&gpu.kernels.gelu))
            .arg(x)
            .arg(bias)
            .arg(&n32)
            .arg(&f32_)
            .arg(&ld32)
            .launch(cfg)
    }
    .map(|_| ())
    .map_err(driver_err("launching gelu"))
}
