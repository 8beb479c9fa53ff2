//! Run-time choice of the scoring backend: `Device::Cpu` (the fast CPU engine) or `Device::Cuda`.
//! The CUDA backend exists only in builds with the `cuda` feature; asking for it otherwise, or
//! without a GPU, kernels or loadable CUDA libraries, is a clear `Error::Backend`.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::Model;
pub use crate::run_stats::RunStats;
use crate::sample::Decoder;
use crate::score::Scorer;

/// Where the scoring forward runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
#[non_exhaustive] // more backends may come: a match outside the crate needs a `_` arm
pub enum Device {
    /// The fast CPU backend (f32, rayon).
    #[default]
    Cpu,
    /// The CUDA backend (bf16/f16 weights, cuBLASLt, kernels/*.cu); feature `cuda`, device 0.
    Cuda,
}

impl std::str::FromStr for Device {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda),
            other => Err(Error::input(format!(
                "unknown device {other:?}: expected \"cpu\" or \"cuda\""
            ))),
        }
    }
}

impl Device {
    /// Whether this build contains the CUDA backend (it may still fail to start at run time).
    pub const CUDA_BUILT: bool = cfg!(feature = "cuda");
}

/// Everything the driver needs from one backend: scoring, sampling and decoding on one copy of
/// the weights.
pub trait Engine: Scorer + crate::sample::Sampler + crate::sample::Decoder {}

impl<T: Scorer + crate::sample::Sampler + crate::sample::Decoder> Engine for T {}

/// The whole engine for `device` over `model`: scoring, sampling and decoding on one copy of
/// the weights (a `scorer_for` and a `decoder_for` would hold two).
pub fn engine_for(model: &Model, device: Device) -> Result<Box<dyn Engine>> {
    engine_with_memory_budget(model, device, None)
}

/// `engine_for` with the memory budget of `scorer_with_memory_budget` (None: the backend's
/// default).
pub fn engine_with_memory_budget(
    model: &Model,
    device: Device,
    memory_budget: Option<usize>,
) -> Result<Box<dyn Engine>> {
    match device {
        Device::Cpu => Ok(Box::new(
            crate::cpu::CpuScorer::new(model)
                .with_memory_budget(memory_budget.unwrap_or(crate::cpu::DEFAULT_MEMORY_BUDGET)),
        )),
        Device::Cuda => cuda_engine(model, memory_budget),
    }
}

#[cfg(feature = "cuda")]
fn cuda_engine(model: &Model, memory_budget: Option<usize>) -> Result<Box<dyn Engine>> {
    let options = crate::cuda::CudaOptions {
        memory_budget,
        ..Default::default()
    };
    Ok(Box::new(crate::cuda::CudaScorer::new(model, &options)?))
}

#[cfg(not(feature = "cuda"))]
fn cuda_engine(_model: &Model, _memory_budget: Option<usize>) -> Result<Box<dyn Engine>> {
    Err(cuda_not_built())
}

/// The scorer for `device` over `model`. On CUDA with `CudaOptions::default()`, which reads the
/// `TOOLSIFT_PACK_TILES`, `TOOLSIFT_ATTENTION_MMA` and `TOOLSIFT_CUDA_PROFILE` environment
/// variables (docs/gpu.md); a program that must not pick them up builds `CudaScorer` itself.
pub fn scorer_for(model: &Model, device: Device) -> Result<Box<dyn Scorer>> {
    scorer_with_memory_budget(model, device, None)
}

/// The scorer for `device` over `model`, with the memory of one plan chunk (activations, and on the
/// CPU the planner's own) capped at `memory_budget` bytes (larger batches are split; a single
/// candidate over it still runs, as a chunk of its own). None: the backend's default (2 GiB on the
/// CPU; on CUDA 90% of the device memory free after the weights, the LM head's scratch and 1 GiB).
/// On the CPU the budget holds per call: threads sharing one scorer each plan to it, so give a
/// shared scorer a budget that many calls can hold at once. On CUDA the calls on one scorer run one
/// at a time (one device, one budget).
pub fn scorer_with_memory_budget(
    model: &Model,
    device: Device,
    memory_budget: Option<usize>,
) -> Result<Box<dyn Scorer>> {
    let engine: Box<dyn Scorer> = engine_with_memory_budget(model, device, memory_budget)?;
    Ok(engine)
}

/// As `scorer_with_memory_budget`, taking the model: on the CPU its weights are converted and
/// released tensor by tensor (`CpuScorer::from_model`), so a checkpoint is never held twice; on
/// CUDA it is dropped once uploaded. For a caller that has no other use for the model.
pub fn scorer_from_model(
    model: Model,
    device: Device,
    memory_budget: Option<usize>,
) -> Result<Box<dyn Scorer>> {
    match device {
        Device::Cpu => Ok(Box::new(
            crate::cpu::CpuScorer::from_model(model)
                .with_memory_budget(memory_budget.unwrap_or(crate::cpu::DEFAULT_MEMORY_BUDGET)),
        )),
        Device::Cuda => {
            let engine: Box<dyn Scorer> = cuda_engine(&model, memory_budget)?;
            Ok(engine)
        }
    }
}

/// The incremental decoder (KV-cached generation) for `device` over `model`; shareable across
/// threads, each opening its own sessions. It holds its own copy of the weights: to score and
/// decode with one, take `engine_for`.
pub fn decoder_for(model: &Model, device: Device) -> Result<Box<dyn Decoder + Send + Sync>> {
    let engine: Box<dyn Decoder + Send + Sync> = engine_for(model, device)?;
    Ok(engine)
}

/// The error for asking a build without the `cuda` feature for the CUDA backend.
pub fn cuda_not_built() -> Error {
    Error::Backend(
        "toolsift was built without the `cuda` feature; rebuild with --features cuda".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DType, GptjConfig, GptjWeights};

    #[test]
    fn device_parses() {
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::Cpu);
        assert_eq!("cuda".parse::<Device>().unwrap(), Device::Cuda);
        assert!("tpu".parse::<Device>().is_err());
    }

    #[test]
    fn cpu_scorer_is_available() {
        let config = GptjConfig::small(1, 8, 2, 2, 16);
        let model = Model::from_parts(
            config.clone(),
            GptjWeights::random(&config, 1, DType::F32),
            None,
        )
        .unwrap();
        assert_eq!(scorer_for(&model, Device::Cpu).unwrap().name(), "cpu");
    }

    /// Without the feature, or on a machine without a usable GPU, asking for CUDA is an error
    /// that says why (never a panic, never a silent CPU fallback).
    #[test]
    fn cuda_without_feature_or_gpu_is_a_clear_error() {
        let config = GptjConfig::small(1, 8, 2, 2, 16);
        let model = Model::from_parts(
            config.clone(),
            GptjWeights::random(&config, 1, DType::F32),
            None,
        )
        .unwrap();
        match scorer_for(&model, Device::Cuda) {
            Ok(s) => assert_eq!(s.name(), "cuda"),
            Err(Error::Backend(msg)) => {
                eprintln!("cuda backend unavailable (expected on a GPU-less machine): {msg}");
                if !Device::CUDA_BUILT {
                    assert!(msg.contains("--features cuda"), "{msg}");
                }
            }
            Err(e) => panic!("unexpected error kind: {e}"),
        }
    }

    /// Device names are exact: no other case or spelling is taken, and the refusal names the
    /// value and the choices.
    #[test]
    fn device_names_are_exact() {
        for bad in ["CPU", "Cuda", "", " cpu", "gpu"] {
            let err = bad.parse::<Device>().unwrap_err();
            assert!(matches!(err, Error::Input(_)), "{bad:?}: {err}");
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("{bad:?}")) && msg.contains("\"cuda\""),
                "{msg}"
            );
        }
    }

    /// The decoder, like the scorer, is never a silent CPU fallback for CUDA.
    #[test]
    fn a_cuda_decoder_is_cuda_or_a_backend_error() {
        let config = GptjConfig::small(1, 8, 2, 2, 16);
        let weights = GptjWeights::random(&config, 1, DType::F32);
        let model = Model::from_parts(config, weights, None).unwrap();
        match decoder_for(&model, Device::Cuda) {
            Ok(_) if Device::CUDA_BUILT => {}
            Ok(_) => panic!("a decoder without the cuda feature"),
            Err(Error::Backend(msg)) => {
                if !Device::CUDA_BUILT {
                    assert!(msg.contains("--features cuda"), "{msg}");
                }
            }
            Err(e) => panic!("unexpected error kind: {e}"),
        }
    }
}
