//! Launcher for kernels/lm_head_xent.cu: log-softmax over the vocabulary of one chunk of LM-head
//! rows, fused with the target gather. The host reduces the log-probs with `Plan::reduce`.

use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use super::context::Gpu;
use super::{check, need};
use crate::error::{driver_err, Result};

/// Block sizes the launcher may pick; the fuzz test runs every one.
pub const BLOCK_CHOICES: [u32; 4] = [32, 128, 512, 1024];

/// The launcher's block size for a vocabulary: 512 from 8192 entries up (GPT-J's 50400), 128
/// below.
pub fn default_block(vocab: usize) -> u32 {
    if vocab >= 8192 {
        512
    } else {
        128
    }
}

/// `lm_head_xent_f32(const float* logits /*[rows, ld]*/, const float* bias /*[vocab]*/,
/// const uint32_t* offsets /*[rows + 1]*/, const uint32_t* tokens, const uint32_t* slots
/// /*[offsets[rows]]*/, float* out /*[n_out]*/, uint32_t rows, uint32_t vocab, uint32_t ld)`.
/// offsets must be non-decreasing, tokens < vocab and slots < out.len() (the caller builds them
/// from a validated plan).
#[allow(clippy::too_many_arguments)]
pub fn lm_head_xent(
    gpu: &Gpu,
    logits: &CudaView<f32>,
    bias: &CudaView<f32>,
    offsets: &CudaView<u32>,
    tokens: &CudaView<u32>,
    slots: &CudaView<u32>,
    out: &mut CudaViewMut<f32>,
    [rows, vocab, ld]: [usize; 3],
    n_targets: usize,
    block: Option<u32>,
) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    let block = block.unwrap_or_else(|| default_block(vocab));
    check(
        block.is_multiple_of(32) && (32..=1024).contains(&block),
        "lm_head_xent: bad block size",
    )?;
    check(
        ld >= vocab
            && logits.len() >= need(rows, ld, vocab)
            && bias.len() >= vocab
            && offsets.len() > rows
            && tokens.len() >= n_targets
            && slots.len() >= n_targets,
        "lm_head_xent: buffers shorter than the shapes",
    )?;
    let (r32, v32, ld32) = (rows as u32, vocab as u32, ld as u32);
    let cfg = LaunchConfig {
        grid_dim: (r32, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: argument types match the C signature above; the check bounds the logits rows and
    // the target arrays; offsets (absolute indices into tokens/slots, offsets[rows] <=
    // n_targets), tokens < vocab and slots < out.len() are the caller's contract.
    unsafe {
        gpu.stream
            .launch_builder(&gpu.kernels.lm_head_xent_f32)
            .arg(logits)
            .arg(bias)
            .arg(offsets)
            .arg(tokens)
            .arg(slots)
            .arg(out)
            .arg(&r32)
            .arg(&v32)
            .arg(&ld32)
            .launch(cfg)
    }
    .map(|_| ())
    .map_err(driver_err("launching lm_head_xent"))
}

/// `log_softmax_f32(const float* logits /*[rows, ld]*/, const float* bias /*[vocab]*/,
/// float* out /*[rows, ld_out]*/, uint32_t rows, uint32_t vocab, uint32_t ld, uint32_t ld_out)`:
/// full log-softmax rows (with the lm_head bias) for the sampling steps.
#[allow(clippy::too_many_arguments)]
pub fn log_softmax(
    gpu: &Gpu,
    logits: &CudaView<f32>,
    bias: &CudaView<f32>,
    out: &mut CudaViewMut<f32>,
    [rows, vocab, ld, ld_out]: [usize; 4],
    block: Option<u32>,
) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    let block = block.unwrap_or_else(|| default_block(vocab));
    check(
        block.is_multiple_of(32) && (32..=1024).contains(&block),
        "log_softmax: bad block size",
    )?;
    check(
        ld >= vocab
            && ld_out >= vocab
            && logits.len() >= need(rows, ld, vocab)
            && bias.len() >= vocab
            && out.len() >= need(rows, ld_out, vocab),
        "log_softmax: buffers shorter than the shapes",
    )?;
    let u = |v: usize| v as u32;
    let cfg = LaunchConfig {
        grid_dim: (u(rows), 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    };
    let (r32, v32, ld32, ldo32) = (u(rows), u(vocab), u(ld), u(ld_out));
    // SAFETY: argument types match the C signature above; the checks bound every row read and
    // written.
    unsafe {
        gpu.stream
            .launch_builder(&gpu.kernels.log_softmax_f32)
            .arg(logits)
            .arg(bias)
            .arg(out)
            .arg(&r32)
            .arg(&v32)
            .arg(&ld32)
            .arg(&ldo32)
            .launch(cfg)
    }
    .map(|_| ())
    .map_err(driver_err("launching log_softmax"))
}
