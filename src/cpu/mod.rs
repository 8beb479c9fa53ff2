//! The fast CPU backend: executes a scoring plan with all unique tokens of a batch going through
//! each layer's GEMMs together (rayon-parallel, `gemm` crate), tree attention over the plan's
//! segments, and the LM head only at weighted rows, fused with log-softmax and the target gather.
//! Computes in f32 whatever the checkpoint's storage type.
//!
//! The element-wise loops over rows (LayerNorm, gelu, rotary, biases, the softmaxes, the head's
//! exponentials) are compiled three times, for baseline x86-64, AVX2 and AVX-512, and the widest
//! the CPU has runs, detected once (`row_kernel!`, the multiversion crate): the release build
//! stays portable and still uses the machine's vectors (the GEMMs' `gemm` crate does the same).
//! The copies give the same bits: Rust never fuses a multiply and an add on its own, and every
//! sum's order is written out (explicit lanes), so wider vectors do the same operations more at
//! a time. (One exception no output shows: a max over +0 and -0 may come out as either.) Tests
//! run each copy the test machine can and compare them bit for bit (`each_copy!`).

/// Defines `$name` compiled for baseline x86-64, AVX2 + FMA and AVX-512 and dispatched at run
/// time, and, in tests, the module `$copies` with each copy on its own (`baseline`, `avx2`,
/// `avx512`) for `each_copy!`. Whatever the body calls should be `#[inline(always)]`, so that it
/// is compiled with the body rather than left at the baseline.
macro_rules! row_kernel {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident / $copies:ident ($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?
        $body:block
    ) => {
        $(#[$meta])*
        #[multiversion::multiversion(targets(
            "x86_64+avx512f+avx512bw+avx512vl+avx512dq",
            "x86_64+avx2+fma",
        ))]
        $vis fn $name($($arg: $ty),*) $(-> $ret)? $body

        /// The kernel's copies one by one, for the bit-for-bit tests.
        #[cfg(test)]
        mod $copies {
            #[allow(unused_imports)]
            use super::*;

            pub fn baseline($($arg: $ty),*) $(-> $ret)? $body

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            pub fn avx2($($arg: $ty),*) $(-> $ret)? $body

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
            pub fn avx512($($arg: $ty),*) $(-> $ret)? $body
        }
    };
}

/// `$run` with `$f` bound to each copy of a `row_kernel!` (its `$copies` module) that this CPU
/// can run, baseline first: `vec![(copy name, result)]`. A copy the CPU cannot run is left out,
/// and said so on stderr.
#[cfg(test)]
macro_rules! each_copy {
    ($copies:ident, |$f:ident| $run:expr) => {{
        let mut results = Vec::new();
        {
            let $f = $copies::baseline;
            results.push(("baseline", $run));
        }
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                let $f = $copies::avx2;
                // SAFETY: this CPU has AVX2 and FMA, all that the copy is compiled for.
                results.push(("avx2", unsafe { $run }));
            } else {
                eprintln!("{}: no AVX2 here, its copy not run", stringify!($copies));
            }
            if std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vl")
                && std::is_x86_feature_detected!("avx512dq")
            {
                let $f = $copies::avx512;
                // SAFETY: this CPU has the four AVX-512 extensions the copy is compiled for.
                results.push(("avx512", unsafe { $run }));
            } else {
                eprintln!("{}: no AVX-512 here, its copy not run", stringify!($copies));
            }
        }
        results
    }};
}

/// Asserts that every copy's result (`each_copy!`) has the baseline's bits, as `to_bits` gives
/// them.
#[cfg(test)]
pub(crate) fn assert_same_bits<T: PartialEq + std::fmt::Debug>(results: &[(&str, T)], what: &str) {
    let (_, baseline) = &results[0];
    for (copy, got) in &results[1..] {
        assert_eq!(
            got, baseline,
            "{what}: the {copy} copy against the baseline"
        );
    }
}

/// The bits of `x`, for comparisons that tell -0 from +0 and NaN from NaN.
#[cfg(test)]
pub(crate) fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

pub mod attention;
pub mod decode;
pub mod gemm;
pub mod head;
pub mod ops;
pub mod sampler;
mod trunk;
pub mod weights;

use std::time::Instant;

use crate::error::Result;
use crate::model::rotary::RotaryTable;
use crate::model::{GptjConfig, Model};
use crate::plan::Plan;
use crate::run_stats::RunStats;
use crate::score::{ScoreOptions, Scorer, TokenCandidate};
use weights::CpuWeights;

/// Default memory budget of one plan chunk (bytes): activations and the planner's own memory.
pub const DEFAULT_MEMORY_BUDGET: usize = 2 << 30;

/// Runs `op` on a worker of the caller's rayon pool: the global one, or the one a caller's
/// `ThreadPool::install` entered (directly when the caller is a worker already).
///
/// Every parallel loop and parallel gemm started from a thread outside the pool is injected
/// into it and the caller sleeps until it is done: a wake-up and a sleep per operation, dozens per
/// forward. Small models and decoding steps are made of such short operations; entering the pool
/// once per forward removes all of those hand-offs but one.
pub(crate) fn on_pool<R: Send>(op: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| op())
}

/// The fast CPU engine: `Scorer`, `Sampler` and `Decoder` over one f32 copy of the weights,
/// `Send + Sync`, on the calling thread's rayon pool (`scorer_for` builds one for
/// `Device::Cpu`).
pub struct CpuScorer {
    config: GptjConfig,
    weights: CpuWeights,
    rotary: RotaryTable,
    memory_budget: usize,
    stats: std::sync::Mutex<RunStats>,
}

// By hand: the weights are gigabytes of floats.
impl std::fmt::Debug for CpuScorer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuScorer")
            .field("config", &self.config)
            .field("memory_budget", &self.memory_budget)
            .finish_non_exhaustive()
    }
}

impl CpuScorer {
    /// The engine for `model`: its own f32 copy of the weights, laid out for the CPU, beside
    /// the model's tensors (`from_model` converts without keeping both).
    pub fn new(model: &Model) -> Self {
        Self::build(model.config(), model.weights().clone())
    }

    /// Takes ownership of `model`'s weights, converting and releasing them tensor by tensor (a
    /// checkpoint's mapping is gone once the engine is built).
    pub fn from_model(model: Model) -> Self {
        let (config, weights, _) = model.into_parts();
        Self::build(&config, weights)
    }

    /// From weights built in memory: checked against `config` first (`GptjWeights::check`),
    /// then converted as `from_model` converts them.
    pub fn from_weights(config: &GptjConfig, weights: crate::model::GptjWeights) -> Result<Self> {
        weights.check(config)?;
        Ok(Self::build(config, weights))
    }

    /// `config` and `weights` agree (a `Model`'s, or checked).
    fn build(config: &GptjConfig, weights: crate::model::GptjWeights) -> Self {
        CpuScorer {
            config: config.clone(),
            weights: CpuWeights::from_owned(config, weights),
            rotary: RotaryTable::new(config.n_positions, config.rotary_dim()),
            memory_budget: DEFAULT_MEMORY_BUDGET,
            stats: Default::default(),
        }
    }

    /// Caps the memory of one chunk of a batch (activations and the planner's); larger batches are
    /// split. Per call: concurrent calls on one scorer each use up to this much.
    pub fn with_memory_budget(mut self, bytes: usize) -> Self {
        self.memory_budget = bytes;
        self
    }

    /// Bytes of the engine's f32 weights.
    pub fn weights_bytes(&self) -> usize {
        self.weights.bytes()
    }

    /// Activation bytes per unique token: x, ln_1 output, qkv, attention context, MLP hidden.
    pub fn bytes_per_token(&self) -> usize {
        4 * (6 * self.config.n_embd + self.config.inner_dim())
    }

    /// The stats of the last call to finish, whichever thread made it: meaningful when one
    /// caller uses the scorer at a time (the bench does).
    pub fn last_stats(&self) -> RunStats {
        *self.stats.lock().expect("stats lock")
    }

    /// Runs one plan of validated candidates (`plan_chunks`): log p(target | row) for every
    /// target. A token, position or row outside the model's ranges panics.
    pub(crate) fn execute(&self, plan: &Plan, stats: &mut RunStats) -> Vec<f64> {
        let c = &self.config;
        let (n_head, head_dim) = (c.n_head, c.head_dim());
        if plan.n_tokens() == 0 {
            return Vec::new();
        }
        on_pool(|| {
            let x = self.trunk(
                &plan.tokens,
                &plan.positions,
                |_, qkv, ctx| attention::tree_attention(plan, qkv, n_head, head_dim, ctx),
                stats,
            );
            let t = Instant::now();
            let eps = c.layer_norm_epsilon as f32;
            let out = head::head_log_probs(plan, &x, &self.weights, c.n_embd, c.vocab_size, eps);
            stats.head_secs += t.elapsed().as_secs_f64();
            out
        })
    }

    /// Plans `candidates`, splitting the batch into chunks whose activations fit the budget.
    /// The planner's own memory counts too (its ancestor lists included, which can outgrow the
    /// tokens): it is host memory, like the activations.
    pub fn plan_chunks<'a>(
        &self,
        candidates: &'a [TokenCandidate],
        options: &'a ScoreOptions,
    ) -> crate::plan::Chunks<'a> {
        crate::plan::chunked_in_bytes(
            candidates,
            options,
            self.memory_budget,
            self.bytes_per_token(),
        )
    }
}

impl Scorer for CpuScorer {
    fn name(&self) -> &str {
        "cpu"
    }

    fn config(&self) -> &GptjConfig {
        &self.config
    }

    fn variant_losses_unchecked(
        &self,
        candidates: &[TokenCandidate],
        options: &ScoreOptions,
    ) -> Result<Vec<[f64; 3]>> {
        let start = Instant::now();
        let mut stats = RunStats::default();
        let mut losses = Vec::with_capacity(candidates.len());
        for (_, plan) in self.plan_chunks(candidates, options) {
            let _span = tracing::debug_span!("cpu_plan", tokens = plan.n_tokens()).entered();
            stats.unique_tokens += plan.n_tokens();
            stats.head_rows += plan.head_rows.len();
            stats.chunks += 1;
            let log_probs = self.execute(&plan, &mut stats);
            losses.extend(plan.reduce(&log_probs));
        }
        stats.total_secs = start.elapsed().as_secs_f64();
        *self.stats.lock().expect("stats lock") = stats;
        Ok(losses)
    }
}
