//! The CUDA backend: executes the same scoring plan as the CPU backend (`crate::plan`), with the
//! layer GEMMs over all unique tokens of a plan chunk through cuBLASLt (16-bit inputs, f32
//! accumulation), and hand-written kernels (kernels/*.cu) for everything else.
//!
//! One forward, top to bottom (T = bf16 or f16 storage; shapes per plan chunk of n tokens):
//!
//! ```text
//! x   = embedding(ids)                                   [n, d]   f32 residual stream
//! per layer:
//!   h   = ln_1(x += previous fc_out bias)                [n, d]   T
//!   qkv = h @ [q_proj; k_proj; v_proj]^T                 [n, 3d]  f32 (cuBLASLt)
//!   q, K[l], V[l] = rotary(qkv)                          [n, d]   T (K/V: per-layer cache rows)
//!   ctx = tree_attention(q, K[l], V[l])                  [n, d]   T
//!   mlp = gelu_new(h @ fc_in^T + fc_in_b)                [n, f]   T (cuBLASLt, then gelu)
//!   x  += ctx @ out_proj^T + mlp @ fc_out^T              [n, d]   f32 (cuBLASLt, beta = 1)
//! head, per chunk of <= head_chunk weighted rows:
//!   hidden = ln_f(x[rows] + last fc_out bias)            [c, d]   T
//!   logits = hidden @ lm_head^T                          [c, V]   f32 (bounded scratch)
//!   log p(target) = lm_head_xent(logits + lm_head_b)     per target
//! losses = Plan::reduce(log p)                           on the host, in f64
//! ```
//!
//! The per-candidate reduction runs on the host through `Plan::reduce`: it is a few adds per
//! target (4 bytes per target come back), it is bitwise deterministic, and the weighting and slot
//! arithmetic then has exactly one implementation shared with the CPU backend.
//! The K/V cache is kept per layer as [capacity, stride(n_embd)] buffers indexed by flat token
//! index (capacity = the chunk's tokens for scoring); the sampling steps (`decode`: `Sampler`,
//! `Decoder`) append to the same layout through the same layer loop (`run_layers`).

pub mod context;
pub mod decode;
pub mod embedding;
pub mod gelu;
pub mod gemm;
pub mod layer_norm;
pub mod lm_head_xent;
pub mod profile;
pub mod rotary;
pub mod tree_attention;
pub mod weights;

use std::time::Instant;

pub use cudarc;
use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use half::{bf16, f16};

pub use context::{stride, CudaDType, DeviceFloat, Gpu, PoolMemory, KERNELS_BUILT};
use decode::HeadGather;
use layer_norm::Rows;
use profile::{Laps, Stage, StageSecs};
use rotary::RotaryShape;
use tree_attention::{AttentionShape, AttentionVariant, DeviceTiles, TreeTiles};
use weights::CudaWeights;

use crate::error::{driver_err, Error, Result};
use crate::model::rotary::RotaryTable;
use crate::model::{DType, GptjConfig, Model};
use crate::plan::Plan;
use crate::run_stats::RunStats;
use crate::score::{ScoreOptions, Scorer, TokenCandidate};

/// Rows of the LM head computed at once: the logits scratch is [rows, vocab] f32
/// (1024 x 50400 x 4 B = 206 MB for GPT-J).
pub const DEFAULT_HEAD_CHUNK_ROWS: usize = 1024;
/// Device memory left free beyond the computed needs (cuBLASLt workspace, allocator slack).
const RESERVE_BYTES: usize = 1 << 30;
/// Elements of the widest per-token operand of one forward, at most (`max_chunk_tokens`).
const MAX_OPERAND_ELEMENTS: usize = i32::MAX as usize;

/// How to open the CUDA backend.
#[derive(Debug, Clone)]
pub struct CudaOptions {
    /// CUDA device ordinal.
    pub device: usize,
    /// Storage type on the device; None: f16 for float16 checkpoints, bf16 otherwise.
    pub dtype: Option<CudaDType>,
    /// Activation budget of one plan chunk in bytes; None: 90% of what is free after the weights,
    /// the LM head's scratch and 1 GiB held back (`RESERVE_BYTES`).
    pub memory_budget: Option<usize>,
    /// LM-head rows computed at once (scoring and sampling heads): sizes the [rows, vocab] f32
    /// logits scratch and its log-softmax twin. Default `DEFAULT_HEAD_CHUNK_ROWS`; 0 counts as 1.
    pub head_chunk_rows: usize,
    /// Pack small sibling subtrees into shared attention tiles (`TreeTiles::from_plan`).
    /// Off by default until the GPU suite has run with it (written after the last H200 run;
    /// its layout is proven on the host against the CPU engine); `TOOLSIFT_PACK_TILES=1`
    /// turns it on.
    pub pack_tiles: bool,
    /// Run multi-query attention with `tree_attention_mma` (S and O in registers; mma.sync),
    /// not the WMMA kernel. Off by default until a GPU has run and timed it (verified by the
    /// host emulator, written without a GPU); `TOOLSIFT_ATTENTION_MMA=1` turns it on.
    pub mma_attention: bool,
    /// Synchronise after every stage of a forward and time it (`stage_secs`, `RunStats`): a
    /// measurement mode, slower. Default: `TOOLSIFT_CUDA_PROFILE=1` turns it on.
    pub profile: bool,
}

/// Whether an on/off environment variable is set to something other than "" or "0".
pub(crate) fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            device: 0,
            dtype: None,
            memory_budget: None,
            head_chunk_rows: DEFAULT_HEAD_CHUNK_ROWS,
            pack_tiles: env_flag("TOOLSIFT_PACK_TILES"),
            mma_attention: env_flag("TOOLSIFT_ATTENTION_MMA"),
            profile: profile::enabled_by_env(),
        }
    }
}

enum DeviceWeights {
    Bf16(CudaWeights<bf16>),
    F16(CudaWeights<f16>),
}

/// The CUDA engine (`Scorer`, `Sampler`, `Decoder`). `Send + Sync`: threads may share one, and
/// its calls then run one at a time (`device_calls`): one device, one memory budget.
pub struct CudaScorer {
    config: GptjConfig,
    gpu: Gpu,
    weights: DeviceWeights,
    cos: CudaSlice<f32>, // [n_positions, rotary_dim / 2]
    sin: CudaSlice<f32>, // [n_positions, rotary_dim / 2]
    memory_budget: usize,
    /// Device bytes held by the KV caches of live decode sessions (`Decoder::session`): they
    /// stay allocated between calls, so every plan takes them off `memory_budget`.
    session_kv_bytes: std::sync::atomic::AtomicUsize,
    head_chunk_rows: usize,
    pack_tiles: bool,
    /// Multi-query tiles run `tree_attention_mma` (`CudaOptions::mma_attention`).
    mma_attention: bool,
    /// Held by every call that runs device work (`Scorer`, `Sampler`, `execute`, a decode
    /// session's `extend`) for its whole duration: calls on one scorer from several threads run
    /// one after another, so each plans to the whole memory budget and writes its own `stats`.
    device_calls: std::sync::Mutex<()>,
    /// The thread holding `device_calls`: a call made on that thread from inside another (a
    /// `choose` of `propose` that scores, say) is an error, not a wait for itself.
    device_holder: std::sync::Mutex<Option<std::thread::ThreadId>>,
    stats: std::sync::Mutex<RunStats>,
    /// `CudaOptions::profile`: synchronise after every stage and time it (`profile.rs`).
    profile: bool,
    stage_secs: std::sync::Mutex<StageSecs>,
}

/// `{ config, dtype, memory_budget, .. }`, as `CpuScorer`'s: a struct holding the engine can
/// derive `Debug`.
impl std::fmt::Debug for CudaScorer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dtype = match self.weights {
            DeviceWeights::Bf16(_) => "bf16",
            DeviceWeights::F16(_) => "f16",
        };
        f.debug_struct("CudaScorer")
            .field("config", &self.config)
            .field("dtype", &dtype)
            .field("memory_budget", &self.memory_budget)
            .finish_non_exhaustive()
    }
}

/// One call's hold on the device (`CudaScorer::lock_device`): clears the holder, then lets the
/// next call in.
pub(crate) struct DeviceCall<'a> {
    _guard: std::sync::MutexGuard<'a, ()>,
    holder: &'a std::sync::Mutex<Option<std::thread::ThreadId>>,
}

impl Drop for DeviceCall<'_> {
    fn drop(&mut self) {
        // Runs before `_guard` is dropped, so no other call has taken the device yet.
        *self.holder.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// The new tokens of one forward, on the device.
pub(crate) struct NewTokens<'a> {
    pub ids: &'a CudaSlice<u32>,
    pub positions: &'a CudaSlice<u32>,
    pub n: usize,
    pub tiles: &'a DeviceTiles,
    /// Every tile holds one query (decode steps): attention runs `decode_attention`.
    pub single_queries: bool,
}

/// Fails with a backend error unless `cond`.
pub(crate) fn check(cond: bool, msg: &str) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(Error::Backend(format!("cuda: {msg}")))
    }
}

/// Elements a [rows, cols] matrix with row stride `ld` spans.
pub(crate) fn need(rows: usize, ld: usize, cols: usize) -> usize {
    if rows == 0 {
        0
    } else {
        (rows - 1) * ld + cols
    }
}

/// Allocates `len` zeroed elements (at least one: zero-length allocations are not allowed).
pub(crate) fn zeros<T: DeviceRepr + ValidAsZeroBits>(
    gpu: &Gpu,
    len: usize,
) -> Result<CudaSlice<T>> {
    gpu.stream
        .alloc_zeros::<T>(len.max(1))
        .map_err(driver_err("allocating activations"))
}

/// Uploads `v` (at least one element).
pub(crate) fn upload<T: DeviceRepr + Clone + Default>(gpu: &Gpu, v: &[T]) -> Result<CudaSlice<T>> {
    let r = if v.is_empty() {
        gpu.stream.clone_htod(&[T::default()])
    } else {
        gpu.stream.clone_htod(v)
    };
    r.map_err(driver_err("uploading plan data"))
}

impl CudaScorer {
    /// Opens the device and uploads the model's weights.
    pub fn new(model: &Model, options: &CudaOptions) -> Result<Self> {
        let config = model.config().clone();
        let gpu = Gpu::new(options.device)?;
        let dtype = options.dtype.unwrap_or(match model.weights().wte.dtype() {
            DType::F16 => CudaDType::F16,
            _ => CudaDType::BF16,
        });
        let weights = match dtype {
            CudaDType::BF16 => {
                DeviceWeights::Bf16(CudaWeights::new(&gpu, &config, model.weights())?)
            }
            CudaDType::F16 => DeviceWeights::F16(CudaWeights::new(&gpu, &config, model.weights())?),
        };
        let table = RotaryTable::new(config.n_positions, config.rotary_dim());
        let cos = upload(&gpu, &table.cos)?;
        let sin = upload(&gpu, &table.sin)?;
        let head_chunk_rows = options.head_chunk_rows.max(1);
        let mut scorer = CudaScorer {
            config,
            gpu,
            weights,
            cos,
            sin,
            memory_budget: 0,
            session_kv_bytes: Default::default(),
            head_chunk_rows,
            pack_tiles: options.pack_tiles,
            mma_attention: options.mma_attention,
            device_calls: Default::default(),
            device_holder: Default::default(),
            stats: Default::default(),
            profile: options.profile,
            stage_secs: Default::default(),
        };
        scorer.memory_budget = match options.memory_budget {
            Some(b) => b,
            None => {
                scorer.gpu.sync()?;
                let (free, _) = scorer.gpu.mem_info()?;
                let avail = free.saturating_sub(scorer.head_bytes() + RESERVE_BYTES);
                (avail / 10 * 9).max(scorer.bytes_per_token())
            }
        };
        tracing::info!(
            device = %scorer.gpu.name,
            dtype = dtype.name(),
            weights_bytes = scorer.weights_bytes(),
            memory_budget = scorer.memory_budget,
            "cuda backend ready"
        );
        Ok(scorer)
    }

    /// Caps the activation memory of one chunk of a batch; larger batches are split.
    pub fn with_memory_budget(mut self, bytes: usize) -> Self {
        self.memory_budget = bytes;
        self
    }

    /// The device context (stream, cuBLASLt, kernels), for inspection and tests: work launched
    /// on it directly bypasses `device_calls` and the memory budget.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The storage type the weights were uploaded in: `CudaOptions::dtype`, else f16 for float16
    /// checkpoints and bf16 otherwise.
    pub fn dtype(&self) -> CudaDType {
        match self.weights {
            DeviceWeights::Bf16(_) => CudaDType::BF16,
            DeviceWeights::F16(_) => CudaDType::F16,
        }
    }

    /// Device bytes the uploaded weights hold (padded rows included; counted at upload).
    pub fn weights_bytes(&self) -> usize {
        match &self.weights {
            DeviceWeights::Bf16(w) => w.bytes,
            DeviceWeights::F16(w) => w.bytes,
        }
    }

    /// Activation bytes per unique token: x (f32), h, q, ctx (T), qkv (f32), MLP hidden (T), the
    /// K/V cache of every layer (T), ids, positions and a margin for the attention context map.
    pub fn bytes_per_token(&self) -> usize {
        let c = &self.config;
        let (ds, fs, l3) = (
            stride(c.n_embd),
            stride(c.inner_dim()),
            stride(3 * c.n_embd),
        );
        let e = 2;
        4 * ds + 3 * e * ds + 4 * l3 + e * fs + self.kv_bytes_per_token() + 8 + 64
    }

    /// The part of `bytes_per_token` that is one token's K/V cache (T, every layer): what a
    /// sampler keeps for as long as the sequence decodes.
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * 2 * stride(self.config.n_embd) * self.config.n_layer
    }

    /// What one call may plan with: the memory budget less the live decode sessions' caches.
    fn available_budget(&self) -> usize {
        let held = self
            .session_kv_bytes
            .load(std::sync::atomic::Ordering::Relaxed);
        self.memory_budget.saturating_sub(held)
    }

    /// Device bytes the KV caches of live decode sessions hold (counted against the budget).
    pub fn session_kv_bytes(&self) -> usize {
        self.session_kv_bytes
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Unique tokens one forward may run: the budget's (less live decode sessions' caches), and
    /// no more than keeps every per-token operand (qkv, the MLP hidden) under 2^31 elements.
    /// Kernels index in 64 bits and cuBLASLt takes 64-bit shapes, but no GPU run has gone past
    /// 1.05e9 elements (an 85k-token chunk at 6B) and the cap costs nothing: 131k tokens at 6B
    /// already fill the card.
    pub fn max_chunk_tokens(&self) -> usize {
        self.max_tokens_at(self.bytes_per_token())
    }

    /// As `max_chunk_tokens`, for a forward whose K/V rows are already allocated and counted (a
    /// decode session grows its cache before it computes): only the activations count.
    fn max_cached_tokens(&self) -> usize {
        self.max_tokens_at(self.bytes_per_token() - self.kv_bytes_per_token())
    }

    /// Tokens of `per_token` bytes the available budget holds, within the operand cap.
    fn max_tokens_at(&self, per_token: usize) -> usize {
        let c = &self.config;
        let widest = stride(c.inner_dim()).max(stride(3 * c.n_embd)).max(1);
        let by_budget = (self.available_budget() / per_token.max(1)).max(1);
        by_budget.min((MAX_OPERAND_ELEMENTS / widest).max(1))
    }

    /// Bytes of the LM head's scratch: hidden rows, the bounded logits buffer and the sampler's
    /// log-softmax rows of the same size. Outside the memory budget: the default budget is what
    /// is free after it (and `RESERVE_BYTES`).
    pub fn head_bytes(&self) -> usize {
        let c = &self.config;
        self.head_chunk_rows * (2 * stride(c.n_embd) + 2 * 4 * stride(c.vocab_size))
    }

    /// Takes `device_calls` for one call (see the field); an error if this thread holds it.
    fn lock_device(&self) -> Result<DeviceCall<'_>> {
        // A panic in another call while it held a lock poisons it; that call's device buffers
        // were freed as it unwound and neither lock guards data a panic could leave half
        // written, so this call goes on.
        let holder = || self.device_holder.lock().unwrap_or_else(|e| e.into_inner());
        let me = std::thread::current().id();
        if *holder() == Some(me) {
            return Err(Error::Backend(
                "cuda: a call on this scorer from inside another of its calls on the same thread \
                 (a `choose` of `propose` that scores or samples, say) would wait for itself"
                    .into(),
            ));
        }
        let guard = self.device_calls.lock().unwrap_or_else(|e| e.into_inner());
        *holder() = Some(me);
        Ok(DeviceCall {
            _guard: guard,
            holder: &self.device_holder,
        })
    }

    /// Figures of the last `variant_losses` call to finish (on any thread).
    pub fn last_stats(&self) -> RunStats {
        *self.stats.lock().expect("stats lock")
    }

    /// Seconds per stage since the last `variant_losses` call began (sampling and decoding
    /// calls since then add theirs); all zero unless `CudaOptions::profile` (by default
    /// `TOOLSIFT_CUDA_PROFILE`) is set (see `profile.rs`).
    pub fn last_stage_secs(&self) -> StageSecs {
        *self.stage_secs.lock().expect("stage lock")
    }

    fn add_stage_secs(&self, laps: &Laps) {
        if self.profile {
            self.stage_secs.lock().expect("stage lock").add(&laps.secs);
        }
    }

    /// Plans `candidates`, splitting the batch into chunks whose activations and attention
    /// context map fit the budget, within the operand cap (`max_chunk_tokens`). The context map
    /// holds a u32 per ancestor entry besides its per-token part (`bytes_per_token`'s margin):
    /// a deep tree of short segments can need more than that margin.
    pub fn plan_chunks<'a>(
        &self,
        candidates: &'a [TokenCandidate],
        options: &'a ScoreOptions,
    ) -> crate::plan::Chunks<'a> {
        let per_token = self.bytes_per_token();
        let budget = self
            .available_budget()
            .min(self.max_chunk_tokens().saturating_mul(per_token));
        crate::plan::chunked_on_device(candidates, options, budget, per_token, 4)
    }

    /// Runs one plan: log p(target | row) for every target, in `plan.targets` order. Waits for
    /// the calls of other threads on this scorer (`device_calls`).
    pub fn execute(&self, plan: &Plan) -> Result<Vec<f64>> {
        let _device = self.lock_device()?;
        self.execute_locked(plan)
    }

    /// `execute`, with `device_calls` held by the caller.
    fn execute_locked(&self, plan: &Plan) -> Result<Vec<f64>> {
        let c = &self.config;
        check(
            plan.tokens.iter().all(|&t| (t as usize) < c.vocab_size),
            "a plan token is outside the vocabulary",
        )?;
        check(
            plan.positions.iter().all(|&p| (p as usize) < c.n_positions),
            "a plan position is beyond n_positions",
        )?;
        check(
            plan.targets
                .iter()
                .all(|t| (t.token as usize) < c.vocab_size),
            "a target token is outside the vocabulary",
        )?;
        match &self.weights {
            DeviceWeights::Bf16(w) => self.forward(w, plan),
            DeviceWeights::F16(w) => self.forward(w, plan),
        }
    }

    /// The layer loop over `t.n` new tokens (embedding to the last layer's residual stream, the
    /// last fc_out bias NOT yet added: the head's ln_f adds it). Their K/V rows are written at
    /// rows `base..base + t.n` of every layer's cache; attention reads keys through `t.tiles`
    /// (query rows relative to this call, context entries absolute cache rows). Scoring runs it
    /// with `base` 0 over a fresh cache; the KV tree (`decode`) appends.
    pub(crate) fn run_layers<T: DeviceFloat>(
        &self,
        w: &CudaWeights<T>,
        t: NewTokens<'_>,
        k_cache: &mut [CudaSlice<T>],
        v_cache: &mut [CudaSlice<T>],
        base: usize,
    ) -> Result<CudaSlice<f32>> {
        let (c, gpu) = (&self.config, &self.gpu);
        let n = t.n;
        let (d, f, vocab) = (c.n_embd, c.inner_dim(), c.vocab_size);
        let (ds, fs, l3) = (stride(d), stride(f), stride(3 * d));
        let eps = c.layer_norm_epsilon as f32;
        check(
            k_cache.len() == c.n_layer
                && v_cache.len() == c.n_layer
                && k_cache
                    .iter()
                    .chain(v_cache.iter())
                    .all(|b| b.len() >= (base + n) * ds),
            "run_layers: K/V cache shorter than the new rows",
        )?;
        let mut laps = Laps::new(gpu, self.profile)?;
        let mut x = zeros::<f32>(gpu, n * ds)?; // [n, ds] residual stream
        let mut h = zeros::<T>(gpu, n * ds)?; // [n, ds] ln_1 output
        let mut qkv = zeros::<f32>(gpu, n * l3)?; // [n, l3]
        let mut q = zeros::<T>(gpu, n * ds)?; // [n, ds] rotated queries
        let mut ctx = zeros::<T>(gpu, n * ds)?; // [n, ds] attention output
        let mut mlp = zeros::<T>(gpu, n * fs)?; // [n, fs]
        let rot = RotaryShape {
            n,
            n_head: c.n_head,
            head_dim: c.head_dim(),
            rotary_dim: c.rotary_dim(),
            ld_qkv: l3,
            ld: ds,
            n_positions: c.n_positions,
        };
        let att = AttentionShape {
            n_head: c.n_head,
            head_dim: c.head_dim(),
            ld: ds,
            ld_out: ds,
        };

        laps.mark(gpu, Stage::Setup)?;
        embedding::embedding(
            gpu,
            &t.ids.as_view(),
            &w.wte.as_view(),
            vocab,
            &mut x.as_view_mut(),
            [n, d, ds, ds],
        )?;
        laps.mark(gpu, Stage::Elementwise)?;
        let mut pending_bias: Option<&CudaSlice<f32>> = None;
        for (l, blk) in w.h.iter().enumerate() {
            let _span = tracing::trace_span!("cuda_layer", l).entered();
            let rb = pending_bias.map(|b| b.as_view());
            layer_norm::layer_norm(
                gpu,
                &mut x.as_view_mut(),
                n,
                Rows {
                    gather: None,
                    residual_bias: rb.as_ref(),
                },
                &blk.ln_1.weight.as_view(),
                &blk.ln_1.bias.as_view(),
                &mut h.as_view_mut(),
                [n, d, ds, ds],
                eps,
                None,
            )?;
            laps.mark(gpu, Stage::Elementwise)?;
            gpu.blas.linear(
                &h.as_view(),
                ds,
                &blk.qkv.as_view(),
                ds,
                &mut qkv.as_view_mut(),
                l3,
                [n, 3 * d, d],
                false,
            )?;
            laps.mark(gpu, Stage::Gemm)?;
            rotary::rotary(
                gpu,
                &qkv.as_view(),
                &t.positions.as_view(),
                &self.cos.as_view(),
                &self.sin.as_view(),
                &mut q.as_view_mut(),
                &mut k_cache[l].slice_mut(base * ds..),
                &mut v_cache[l].slice_mut(base * ds..),
                rot,
            )?;
            laps.mark(gpu, Stage::Elementwise)?;
            if t.single_queries {
                tree_attention::decode_attention(
                    gpu,
                    &q.as_view(),
                    &k_cache[l].as_view(),
                    &v_cache[l].as_view(),
                    t.tiles,
                    &mut ctx.as_view_mut(),
                    att,
                )?;
            } else {
                let (q, k, v) = (q.as_view(), k_cache[l].as_view(), v_cache[l].as_view());
                // The WMMA kernel is the launcher's default choice; the mma one needs its loads
                // picked here.
                let variant = self.mma_attention.then(|| {
                    AttentionVariant::pick(true, tree_attention::vec_allowed(gpu, att, &q, &k, &v))
                });
                tree_attention::tree_attention(
                    gpu,
                    &q,
                    &k,
                    &v,
                    t.tiles,
                    &mut ctx.as_view_mut(),
                    att,
                    variant,
                )?;
            }
            laps.mark(gpu, Stage::Attention)?;
            gpu.blas.linear(
                &h.as_view(),
                ds,
                &blk.fc_in.as_view(),
                ds,
                &mut mlp.as_view_mut(),
                fs,
                [n, f, d],
                false,
            )?;
            laps.mark(gpu, Stage::Gemm)?;
            gelu::gelu(
                gpu,
                &mut mlp.as_view_mut(),
                &blk.fc_in_b.as_view(),
                [n, f, fs],
                None,
            )?;
            laps.mark(gpu, Stage::Elementwise)?;
            // Parallel residual: x += out_proj(ctx) + fc_out(mlp); fc_out's bias is pending.
            gpu.blas.linear(
                &ctx.as_view(),
                ds,
                &blk.out_proj.as_view(),
                ds,
                &mut x.as_view_mut(),
                ds,
                [n, d, d],
                true,
            )?;
            gpu.blas.linear(
                &mlp.as_view(),
                fs,
                &blk.fc_out.as_view(),
                fs,
                &mut x.as_view_mut(),
                ds,
                [n, d, f],
                true,
            )?;
            laps.mark(gpu, Stage::Gemm)?;
            pending_bias = Some(&blk.fc_out_b);
        }
        self.add_stage_secs(&laps);
        Ok(x)
    }

    fn forward<T: DeviceFloat>(&self, w: &CudaWeights<T>, plan: &Plan) -> Result<Vec<f64>> {
        let (c, gpu) = (&self.config, &self.gpu);
        let n = plan.n_tokens();
        if n == 0 || plan.targets.is_empty() {
            return Ok(vec![0.0; plan.targets.len()]);
        }
        let ds = stride(c.n_embd);
        let mut laps = Laps::new(gpu, self.profile)?;
        let ids = upload(gpu, &plan.tokens)?;
        let positions = upload(gpu, &plan.positions)?;
        let tiles = if self.pack_tiles {
            TreeTiles::from_plan(plan, 0)
        } else {
            TreeTiles::from_plan_unpacked(plan, 0)
        };
        let tiles = tiles.upload(gpu)?;
        let mut k_cache = Vec::with_capacity(c.n_layer); // per layer [n, ds]
        let mut v_cache = Vec::with_capacity(c.n_layer); // per layer [n, ds]
        for _ in 0..c.n_layer {
            k_cache.push(zeros::<T>(gpu, n * ds)?);
            v_cache.push(zeros::<T>(gpu, n * ds)?);
        }
        laps.mark(gpu, Stage::Setup)?;
        self.add_stage_secs(&laps);
        let mut x = self.run_layers(
            w,
            NewTokens {
                ids: &ids,
                positions: &positions,
                n,
                tiles: &tiles,
                single_queries: false,
            },
            &mut k_cache,
            &mut v_cache,
            0,
        )?;
        // LM head at the weighted rows only, chunk by chunk.
        let mut laps = Laps::new(gpu, self.profile)?;
        let n_rows = plan.head_rows.len();
        let mut by_row: Vec<Vec<u32>> = vec![Vec::new(); n_rows];
        for (k, t) in plan.targets.iter().enumerate() {
            by_row[t.head_row as usize].push(k as u32);
        }
        let mut gather = HeadGather {
            offsets: Vec::with_capacity(n_rows + 1),
            tokens: Vec::with_capacity(plan.targets.len()),
            slots: Vec::with_capacity(plan.targets.len()),
            n_out: plan.targets.len(),
        };
        gather.offsets.push(0u32);
        for ks in &by_row {
            for &k in ks {
                gather.tokens.push(plan.targets[k as usize].token);
                gather.slots.push(k);
            }
            gather.offsets.push(gather.tokens.len() as u32);
        }
        // ln_f + lm_head GEMM per chunk of rows (shared with decoding), then the fused
        // log-softmax / gather into each target's slot.
        let log_probs = self.head_gather(w, &mut x, n, &plan.head_rows, &gather)?;
        laps.mark(gpu, Stage::Head)?;
        self.add_stage_secs(&laps);
        Ok(log_probs.iter().map(|&v| v as f64).collect())
    }
}

impl Scorer for CudaScorer {
    fn name(&self) -> &str {
        "cuda"
    }

    fn config(&self) -> &GptjConfig {
        &self.config
    }

    fn variant_losses_unchecked(
        &self,
        candidates: &[TokenCandidate],
        options: &ScoreOptions,
    ) -> Result<Vec<[f64; 3]>> {
        let _device = self.lock_device()?;
        let start = Instant::now();
        let mut stats = RunStats::default();
        *self.stage_secs.lock().expect("stage lock") = StageSecs::default();
        let mut losses = Vec::with_capacity(candidates.len());
        for (_, plan) in self.plan_chunks(candidates, options) {
            let _span = tracing::debug_span!("cuda_plan", tokens = plan.n_tokens()).entered();
            stats.unique_tokens += plan.n_tokens();
            stats.head_rows += plan.head_rows.len();
            stats.chunks += 1;
            let log_probs = self.execute_locked(&plan)?;
            losses.extend(plan.reduce(&log_probs));
        }
        stats.total_secs = start.elapsed().as_secs_f64();
        let stages = self.last_stage_secs();
        stats.trunk_gemm_secs = stages.gemm;
        stats.attention_secs = stages.attention;
        stats.head_secs = stages.head;
        *self.stats.lock().expect("stats lock") = stats;
        Ok(losses)
    }
}
