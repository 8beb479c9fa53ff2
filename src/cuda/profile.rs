//! Opt-in stage timing for the CUDA forward (`CudaOptions::profile`, by default from
//! `TOOLSIFT_CUDA_PROFILE=1`): the stream is
//! synchronised after every stage and the host wall time since the previous mark is charged to
//! that stage. Synchronising costs throughput, so this is a diagnostic for "where does the time
//! go", never on in benchmarks that report speed.

use std::time::Instant;

use super::context::Gpu;
use crate::error::Result;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Plan upload, buffer allocation and zeroing.
    Setup,
    /// Embedding, layer norms, rotary, gelu: the memory-bound kernels.
    Elementwise,
    /// The trunk's GEMMs (qkv, out_proj, fc_in, fc_out).
    Gemm,
    Attention,
    /// ln_f, the LM head GEMM and the fused log-softmax / gather.
    Head,
}

/// Seconds per stage, summed over a call.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct StageSecs {
    /// Allocation and zeroing of the activations, and the embedding kernel; for scoring also the
    /// plan's uploads (tokens, positions, tiles) and its K/V cache.
    pub setup: f64,
    /// The per-layer memory-bound kernels: ln_1, rotary and gelu.
    pub elementwise: f64,
    /// The trunk's cuBLASLt GEMMs (qkv, fc_in, out_proj and fc_out).
    pub gemm: f64,
    /// `tree_attention` or `decode_attention`, every layer.
    pub attention: f64,
    /// Scoring's head: ln_f, the LM-head GEMMs, `lm_head_xent` and the copy of the log-probs to
    /// the host (the sampling heads are not timed).
    pub head: f64,
}

impl StageSecs {
    pub(crate) fn add(&mut self, other: &StageSecs) {
        self.setup += other.setup;
        self.elementwise += other.elementwise;
        self.gemm += other.gemm;
        self.attention += other.attention;
        self.head += other.head;
    }
}

/// Marks stage boundaries; does nothing (no synchronisation) unless enabled.
pub(crate) struct Laps {
    enabled: bool,
    last: Instant,
    pub secs: StageSecs,
}

impl Laps {
    pub fn new(gpu: &Gpu, enabled: bool) -> Result<Self> {
        if enabled {
            gpu.sync()?;
        }
        Ok(Laps {
            enabled,
            last: Instant::now(),
            secs: StageSecs::default(),
        })
    }

    /// Charges the time since the previous mark to `stage` (after the stream drains).
    pub fn mark(&mut self, gpu: &Gpu, stage: Stage) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        gpu.sync()?;
        let now = Instant::now();
        let dt = (now - self.last).as_secs_f64();
        self.last = now;
        let slot = match stage {
            Stage::Setup => &mut self.secs.setup,
            Stage::Elementwise => &mut self.secs.elementwise,
            Stage::Gemm => &mut self.secs.gemm,
            Stage::Attention => &mut self.secs.attention,
            Stage::Head => &mut self.secs.head,
        };
        *slot += dt;
        Ok(())
    }
}

/// Whether `TOOLSIFT_CUDA_PROFILE` asks for stage timing.
pub(crate) fn enabled_by_env() -> bool {
    super::env_flag("TOOLSIFT_CUDA_PROFILE")
}
