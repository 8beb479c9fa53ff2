//! Launcher for kernels/embedding.cu: `x[t, :] = wte[ids[t], :]` in f32.

use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use super::context::{DeviceFloat, Gpu};
use super::{check, need};
use crate::error::{driver_err, Result};

/// Threads per block (the kernel takes any multiple of 32).
pub const BLOCK: u32 = 256;

/// `embedding_<T>(const uint32_t* ids /*[n]*/, const T* wte /*[vocab, ld_wte]*/,
/// float* x /*[n, ld_x]*/, uint32_t n, uint32_t d, uint32_t ld_wte, uint32_t ld_x)`.
/// Every id must be < `vocab` (the caller checks the plan's tokens on the host).
#[allow(clippy::too_many_arguments)]
pub fn embedding<T: DeviceFloat>(
    gpu: &Gpu,
    ids: &CudaView<u32>,
    wte: &CudaView<T>,
    vocab: usize,
    x: &mut CudaViewMut<f32>,
    [n, d, ld_wte, ld_x]: [usize; 4],
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    // A stride under d would overlap rows: blocks writing each other's elements.
    check(
        ld_wte >= d && ld_x >= d,
        "embedding: a row stride under the row width",
    )?;
    check(
        ids.len() >= n && wte.len() >= need(vocab, ld_wte, d) && x.len() >= need(n, ld_x, d),
        "embedding: buffers shorter than the shapes",
    )?;
    let (n32, d32, lw, lx) = (n as u32, d as u32, ld_wte as u32, ld_x as u32);
    let cfg = LaunchConfig {
        grid_dim: (n32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: argument types match the C signature above; the check bounds every row and column
    // the kernel touches, given ids < vocab (the caller's contract).
    unsafe {
        gpu.stream
            .launch_builder(T::pick(&gpu.kernels.embedding))
            .arg(ids)
            .arg(wte)
            .arg(x)
            .arg(&n32)
            .arg(&d32)
            .arg(&lw)
            .arg(&lx)
            .launch(cfg)
    }
    .map(|_| ())
    .map_err(driver_err("launching embedding"))
}
