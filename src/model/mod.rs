//! GPT-J as stored on disk: config.json, weights (safetensors or pytorch_model.bin), tokenizer.json.

pub mod checkpoint;
pub mod config;
pub mod tensor;
pub mod tokenizer;
pub mod torch_bin;
pub mod weights;

use std::path::{Path, PathBuf};

pub use config::GptjConfig;
pub use tensor::{DType, Tensor};
pub use tokenizer::Tokenizer;
pub use weights::GptjWeights;

use crate::error::Result;

/// A loaded checkpoint folder: validated config and weights (memory-mapped), and the tokenizer when
/// the folder has a tokenizer.json.
pub struct Model {
    pub config: GptjConfig,
    pub weights: GptjWeights,
    pub tokenizer: Option<Tokenizer>,
    pub dir: PathBuf,
}

impl Model {
    /// Loads and validates a Hugging Face GPT-J folder. Every problem is reported with the file and
    /// tensor it concerns before any computation starts.
    pub fn load(dir: &Path) -> Result<Self> {
        let _span = tracing::info_span!("load_model", dir = %dir.display()).entered();
        let config = GptjConfig::from_file(&dir.join("config.json"))?;
        let map = checkpoint::TensorMap::open_dir(dir)?;
        let weights = GptjWeights::from_map(&config, &map, dir)?;
        let tok_path = dir.join("tokenizer.json");
        let tokenizer = if tok_path.is_file() {
            Some(Tokenizer::from_file(&tok_path)?)
        } else {
            None
        };
        Ok(Model {
            config,
            weights,
            tokenizer,
            dir: dir.to_owned(),
        })
    }

    /// A model made from weights in memory (random models for tests and benchmarks).
    pub fn from_parts(
        config: GptjConfig,
        weights: GptjWeights,
        tokenizer: Option<Tokenizer>,
    ) -> Self {
        Model {
            config,
            weights,
            tokenizer,
            dir: PathBuf::new(),
        }
    }

    pub fn tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer.as_ref().ok_or_else(|| {
            crate::error::Error::input(format!(
                "{}: no tokenizer.json, so text-level input cannot be tokenized; \
                 give token-level input instead",
                self.dir.display()
            ))
        })
    }

    /// Writes the model as a safetensors folder (tests, benchmarks); see `checkpoint::convert`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        checkpoint::convert(self, dir, None).map(|_| ())
    }
}
