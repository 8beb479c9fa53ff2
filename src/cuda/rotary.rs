//! Launcher for kernels/rotary.cu: GPT-J rotary on q and k, split of the f32 qkv GEMM output into
//! the query buffer and this layer's K/V cache rows, narrowed to T.

use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use super::context::{DeviceFloat, Gpu};
use super::{check, need};
use crate::error::{driver_err, Result};

/// Threads per block of a rotary launch: one block per token, its threads striding over the
/// token's n_embd columns (the kernel takes any multiple of 32).
pub const BLOCK: u32 = 256;

/// Shapes of a rotary launch.
#[derive(Debug, Clone, Copy)]
pub struct RotaryShape {
    /// Tokens (rows of qkv and positions); the grid has one block per token.
    pub n: usize,
    /// Attention heads; n_head * head_dim = n_embd.
    pub n_head: usize,
    /// Dimensions per head.
    pub head_dim: usize,
    /// Leading dimensions of each head that are rotated (even, <= head_dim); the cos/sin tables
    /// have rotary_dim / 2 columns.
    pub rotary_dim: usize,
    /// Row stride of qkv (>= 3 * n_embd).
    pub ld_qkv: usize,
    /// Row stride of q, k and v (>= n_embd).
    pub ld: usize,
    /// Rows of the cos/sin tables (n_positions): every position must be below it.
    pub n_positions: usize,
}

/// `rotary_<T>(const float* qkv /*[n, ld_qkv]*/, const uint32_t* positions /*[n]*/,
/// const float* cos_table, const float* sin_table /*[n_positions, rotary_dim / 2]*/,
/// T* q_out, T* k_out, T* v_out /*[n, ld]*/, uint32_t n, uint32_t n_head, uint32_t head_dim,
/// uint32_t rotary_dim, uint32_t ld_qkv, uint32_t ld)`.
/// `k_out` / `v_out` start at the cache row of the first token. Positions must be < n_positions
/// (checked by the caller on the host).
#[allow(clippy::too_many_arguments)]
pub fn rotary<T: DeviceFloat>(
    gpu: &Gpu,
    qkv: &CudaView<f32>,
    positions: &CudaView<u32>,
    cos: &CudaView<f32>,
    sin: &CudaView<f32>,
    q_out: &mut CudaViewMut<T>,
    k_out: &mut CudaViewMut<T>,
    v_out: &mut CudaViewMut<T>,
    s: RotaryShape,
) -> Result<()> {
    if s.n == 0 {
        return Ok(());
    }
    let d = s.n_head * s.head_dim;
    let table = s.n_positions * (s.rotary_dim / 2);
    check(
        s.rotary_dim <= s.head_dim
            && s.rotary_dim.is_multiple_of(2)
            && s.ld_qkv >= 3 * d
            && s.ld >= d
            && qkv.len() >= need(s.n, s.ld_qkv, 3 * d)
            && positions.len() >= s.n
            && cos.len() >= table
            && sin.len() >= table
            && q_out.len() >= need(s.n, s.ld, d)
            && k_out.len() >= need(s.n, s.ld, d)
            && v_out.len() >= need(s.n, s.ld, d),
        "rotary: buffers shorter than the shapes",
    )?;
    let u = |v: usize| v as u32;
    let (n, nh, hd, rd, lq, ld) = (
        u(s.n),
        u(s.n_head),
        u(s.head_dim),
        u(s.rotary_dim),
        u(s.ld_qkv),
        u(s.ld),
    );
    let cfg = LaunchConfig {
        grid_dim: (n, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: argument types match the C signature above; the check bounds every access, given
    // positions < n_positions (the caller's contract).
    unsafe {
        gpu.stream
            .launch_builder(T::pick(&gpu.kernels.rotary))
            .arg(qkv)
            .arg(positions)
            .arg(cos)
            .arg(sin)
            .arg(q_out)
            .arg(k_out)
            .arg(v_out)
            .arg(&n)
            .arg(&nh)
            .arg(&hd)
            .arg(&rd)
            .arg(&lq)
            .arg(&ld)
            .launch(cfg)
    }
    .map(|_| ())
    .map_err(driver_err("launching rotary"))
}
