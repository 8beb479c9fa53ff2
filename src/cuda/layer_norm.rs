//! Launcher for kernels/layer_norm.cu: LayerNorm over rows (all of them, or a gathered subset),
//! with the previous layer's pending fc_out bias folded into the residual stream.

use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use super::context::{DeviceFloat, Gpu};
use super::{check, need};
use crate::error::{driver_err, Result};

/// Block sizes the launcher may pick; the fuzz test runs every one.
pub const BLOCK_CHOICES: [u32; 5] = [32, 128, 256, 512, 1024];

/// The launcher's choice: about 8 to 16 columns per thread, at least one warp.
pub fn default_block(d: usize) -> u32 {
    match d {
        0..=256 => 32,
        257..=2048 => 128,
        2049..=4096 => 256,
        4097..=8192 => 512,
        _ => 1024,
    }
}

/// Row selection and the optional residual bias of a LayerNorm launch.
pub struct Rows<'a> {
    /// `None`: rows 0..n of x; `Some(rows)`: `x[rows[i]]` for i < n (read only).
    pub gather: Option<&'a CudaView<'a, u32>>,
    /// Added to x before normalising; written back into x when `gather` is None.
    pub residual_bias: Option<&'a CudaView<'a, f32>>,
}

/// `layer_norm_<T>(float* x, const float* residual_bias /*[d] or null*/,
/// const uint32_t* rows /*[n] or null*/, const float* weight /*[d]*/, const float* bias /*[d]*/,
/// T* out /*[n, ld_out]*/, uint32_t n, uint32_t d, uint32_t ld_x, uint32_t ld_out, float eps)`.
/// With `rows`, every `rows[i]` must be < x_rows (checked by the caller on the host).
#[allow(clippy::too_many_arguments)]
pub fn layer_norm<T: DeviceFloat>(
    gpu: &Gpu,
    x: &mut CudaViewMut<f32>,
    x_rows: usize,
    rows: Rows,
    weight: &CudaView<f32>,
    bias: &CudaView<f32>,
    out: &mut CudaViewMut<T>,
    [n, d, ld_x, ld_out]: [usize; 4],
    eps: f32,
    block: Option<u32>,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let block = block.unwrap_or_else(|| default_block(d));
    check(
        block.is_multiple_of(32) && (32..=1024).contains(&block),
        "layer_norm: bad block size",
    )?;
    // A stride under d would overlap rows: blocks writing each other's elements.
    check(
        ld_x >= d && ld_out >= d,
        "layer_norm: a row stride under the row width",
    )?;
    check(
        (rows.gather.is_some() || n <= x_rows)
            && x.len() >= need(x_rows, ld_x, d)
            && rows.gather.is_none_or(|r| r.len() >= n)
            && rows.residual_bias.is_none_or(|b| b.len() >= d)
            && weight.len() >= d
            && bias.len() >= d
            && out.len() >= need(n, ld_out, d),
        "layer_norm: buffers shorter than the shapes",
    )?;
    let null = 0u64;
    let (n32, d32, lx, lo) = (n as u32, d as u32, ld_x as u32, ld_out as u32);
    let cfg = LaunchConfig {
        grid_dim: (n32, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut launch = gpu.stream.launch_builder(T::pick(&gpu.kernels.layer_norm));
    launch.arg(x);
    match rows.residual_bias {
        Some(b) => launch.arg(b),
        None => launch.arg(&null),
    };
    match rows.gather {
        Some(r) => launch.arg(r),
        None => launch.arg(&null),
    };
    launch
        .arg(weight)
        .arg(bias)
        .arg(out)
        .arg(&n32)
        .arg(&d32)
        .arg(&lx)
        .arg(&lo)
        .arg(&eps);
    // SAFETY: argument types match the C signature above (a null pointer is passed as a 64-bit
    // zero); the check bounds every access, given rows[i] < x_rows (the caller's contract).
    unsafe { launch.launch(cfg) }
        .map(|_| ())
        .map_err(driver_err("launching layer_norm"))
}
