//! GPT-J as stored on disk: config.json, weights (safetensors or pytorch_model.bin),
//! tokenizer.json.

pub mod checkpoint;
pub mod config;
pub mod rotary;
mod safetensors_header;
pub mod tensor;
pub mod tokenizer;
pub mod torch_bin;
pub mod weights;

use std::path::{Path, PathBuf};

pub use config::GptjConfig;
pub use tensor::{DType, Tensor};
pub use tokenizer::Tokenizer;
pub use weights::GptjWeights;

use crate::error::{Error, Result};

/// A loaded checkpoint folder: validated config and weights (memory-mapped), and the tokenizer when
/// the folder has a tokenizer.json.
///
/// The fields are private because they are checked together (`load`, `from_parts`): a config
/// edited after the fact would disagree with the weights' shapes, and the engines index by it. To
/// change a model, take it apart (`into_parts`) and build it again (`from_parts`).
pub struct Model {
    config: GptjConfig,
    weights: GptjWeights,
    tokenizer: Option<Tokenizer>,
    dir: PathBuf,
}

// By hand: the weights are gigabytes of tensors.
impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("dir", &self.dir)
            .field("config", &self.config)
            .field("tokenizer", &self.tokenizer)
            .finish_non_exhaustive()
    }
}

impl Model {
    /// Loads and validates a Hugging Face GPT-J folder. Every problem is reported with the file and
    /// tensor it concerns before any computation starts.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        match Self::load_deferring_tokenizer(dir)? {
            (_, Some(e)) => Err(e),
            (model, None) => Ok(model),
        }
    }

    /// `load`, except that a tokenizer.json that fails to load is no error here: the model comes
    /// back without a tokenizer, the tokenizer's error beside it. For a caller that needs the
    /// tokenizer for some inputs only (`score`: token-level lines need none), so that a broken
    /// tokenizer.json fails those alone.
    pub fn load_deferring_tokenizer(dir: impl AsRef<Path>) -> Result<(Self, Option<Error>)> {
        let dir = dir.as_ref();
        // "" is the working directory; kept as "." so that `dir` always says where the files
        // are (`convert` tells a loaded model from one built in memory by it).
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        let _span = tracing::info_span!("load_model", dir = %dir.display()).entered();
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(Error::Config {
                    path: dir.to_owned(),
                    msg: "is not a folder: give the model's folder (config.json, weights, \
                          tokenizer.json)"
                        .into(),
                })
            }
            Err(e) => return Err(Error::io(dir, e)),
        }
        let config = GptjConfig::from_file(&dir.join("config.json"))?;
        let map = checkpoint::TensorMap::open_dir(dir)?;
        let weights = GptjWeights::from_map(&config, &map, dir)?;
        let (tokenizer, tokenizer_error) = match load_tokenizer(&dir.join("tokenizer.json")) {
            Ok(t) => (t, None),
            Err(e) => (None, Some(e)),
        };
        if let Some(tok) = &tokenizer {
            warn_if_tokenizer_exceeds_vocab(tok, config.vocab_size);
        }
        let model = Model {
            config,
            weights,
            tokenizer,
            dir: dir.to_owned(),
        };
        Ok((model, tokenizer_error))
    }

    /// A model made from weights in memory (random models for tests and benchmarks), checked as
    /// `load` checks a folder: the config valid, every tensor with its shape, every value finite
    /// (`GptjWeights::check`; errors name the tensor).
    pub fn from_parts(
        config: GptjConfig,
        weights: GptjWeights,
        tokenizer: Option<Tokenizer>,
    ) -> Result<Self> {
        weights.check(&config)?;
        if let Some(tok) = &tokenizer {
            warn_if_tokenizer_exceeds_vocab(tok, config.vocab_size);
        }
        Ok(Model {
            config,
            weights,
            tokenizer,
            dir: PathBuf::new(),
        })
    }

    /// XXH3-64 of everything that decides the model's outputs: the config, every weight tensor
    /// (name, dtype, shape, bytes) and the tokenizer file's bytes. `annotate` records it in its
    /// journal, so that a resume with another checkpoint in the same folder is refused. Reads
    /// every weight byte once, one rayon task per tensor: ~11 GB/s in memory on the 2-core dev
    /// machine (0.82 GB of f16 weights in 0.07 s: one run, recorded in commit 1020ca3 of
    /// 2026-12-01; no command in the repository measures it), so about a second for GPT-J 6B's
    /// 12 GB once they are in the page cache, where the engine's own load then finds them.
    pub fn content_xxh3(&self) -> Result<u64> {
        use rayon::prelude::*;
        use xxhash_rust::xxh3::{xxh3_64, Xxh3};
        let config =
            serde_json::to_vec(&self.config).map_err(|e| Error::input(format!("config: {e}")))?;
        let tensors = self.weights.named_tensors(&self.config);
        let tensor_hashes: Vec<u64> = tensors
            .par_iter()
            .map(|(_, t)| xxh3_64(t.bytes()))
            .collect();
        let mut h = Xxh3::new();
        h.update(&(config.len() as u64).to_le_bytes());
        h.update(&config);
        for ((name, t), bytes_hash) in tensors.iter().zip(tensor_hashes) {
            h.update(name.as_bytes());
            h.update(&[0]);
            h.update(t.dtype().name().as_bytes());
            for &d in t.shape() {
                h.update(&(d as u64).to_le_bytes());
            }
            h.update(&bytes_hash.to_le_bytes());
        }
        match &self.tokenizer {
            Some(t) => h.update(&t.source_xxh3().to_le_bytes()),
            None => h.update(b"no tokenizer"),
        }
        Ok(h.digest())
    }

    /// The validated config.
    pub fn config(&self) -> &GptjConfig {
        &self.config
    }

    /// The weights, checked against `config()` (memory-mapped when loaded from safetensors).
    pub fn weights(&self) -> &GptjWeights {
        &self.weights
    }

    /// The folder the model was loaded from; empty for one built in memory (`from_parts`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The tokenizer, if the folder has a tokenizer.json (`tokenizer` is the same as an error).
    pub fn tokenizer_if_any(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// Removes the tokenizer, so that the weights can move into an engine (`into_parts`) while
    /// the tokenizer stays with the caller.
    pub fn take_tokenizer(&mut self) -> Option<Tokenizer> {
        self.tokenizer.take()
    }

    /// The config, weights and tokenizer, for an engine that takes the weights by value (the
    /// checkpoint's mapping is then released as they are converted) or to build another model
    /// with `from_parts`.
    pub fn into_parts(self) -> (GptjConfig, GptjWeights, Option<Tokenizer>) {
        (self.config, self.weights, self.tokenizer)
    }

    /// The tokenizer, or an error naming the tokenizer.json the folder does not have: an
    /// `Error::Tokenizer`, the model's problem rather than the request's (`is_input` is false).
    pub fn tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer.as_ref().ok_or_else(|| Error::Tokenizer {
            path: self.dir.join("tokenizer.json"),
            msg: "not in the model folder, and annotate, generate and text-level scoring need \
                  the model's tokenizer (score also takes token-level input without one)"
                .into(),
        })
    }

    /// Writes the model as a safetensors folder (tests, benchmarks); see `checkpoint::convert`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        checkpoint::convert(self, dir, None).map(|_| ())
    }
}

/// The folder's tokenizer.json: None when there is none; an error when the name is there but is
/// not a file (a folder, a link to nothing), which is a broken folder, not one without a tokenizer.
fn load_tokenizer(path: &Path) -> Result<Option<Tokenizer>> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Tokenizer::from_file(path).map(Some),
        Ok(_) => Err(Error::Tokenizer {
            path: path.to_owned(),
            msg: "exists but is not a file (a folder?)".into(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(path).is_ok() {
                Err(Error::Tokenizer {
                    path: path.to_owned(),
                    msg: "is a symbolic link to a file that does not exist".into(),
                })
            } else {
                Ok(None)
            }
        }
        Err(e) => Err(Error::io(path, e)),
    }
}

/// Warns when the tokenizer has ids the model has no rows for: a prompt or a tool result with
/// one of them cannot be computed (generate and annotate then fail that line). Fewer ids than
/// rows is normal (GPT-J's 50257 tokens, 50400 rows).
fn warn_if_tokenizer_exceeds_vocab(tokenizer: &Tokenizer, vocab_size: usize) -> bool {
    let ids = tokenizer.id_count();
    if ids > vocab_size {
        tracing::warn!(
            "{}: the tokenizer has ids up to {}, but config.json's vocab_size is {vocab_size}: \
             a text with a token id of {vocab_size} or more cannot be computed (is this the \
             model's tokenizer?)",
            tokenizer.path().display(),
            ids - 1
        );
    }
    ids > vocab_size
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(config: &GptjConfig, seed: u64, tokenizer: Option<Tokenizer>) -> Model {
        Model::from_parts(
            config.clone(),
            GptjWeights::random(config, seed, DType::F32),
            tokenizer,
        )
        .unwrap()
    }

    #[test]
    #[cfg(feature = "annotate")] // the demo tokenizer
    fn a_tokenizer_with_more_ids_than_the_vocabulary_is_flagged() {
        let tokenizer = Tokenizer::from_file(
            &crate::demo::assets::materialize()
                .unwrap()
                .join("tokenizer.json"),
        )
        .unwrap();
        let ids = tokenizer.id_count();
        assert!(ids > 256, "{ids}");
        assert!(warn_if_tokenizer_exceeds_vocab(&tokenizer, ids - 1));
        assert!(!warn_if_tokenizer_exceeds_vocab(&tokenizer, ids));
        assert!(!warn_if_tokenizer_exceeds_vocab(&tokenizer, ids + 143));
    }

    #[test]
    fn weights_built_in_memory_are_checked_against_the_config() {
        let config = GptjConfig::small(2, 16, 2, 4, 32);
        let random = |c: &GptjConfig| GptjWeights::random(c, 1, DType::F32);
        assert!(Model::from_parts(config.clone(), random(&config), None).is_ok());
        // The error of `w` under `c` names every one of `needles`.
        let refused = |c: &GptjConfig, w: GptjWeights, needles: &[&str]| {
            let e = Model::from_parts(c.clone(), w, None)
                .err()
                .unwrap()
                .to_string();
            assert!(needles.iter().all(|n| e.contains(n)), "{e}");
        };
        // A config the engines cannot run.
        let mut heads = config.clone();
        heads.n_head = 5;
        refused(&heads, random(&config), &["n_head"]);
        // Weights of another width, another depth, a missing bias, a NaN.
        let mut wide = config.clone();
        wide.n_embd = 32;
        refused(&config, random(&wide), &["transformer.wte.weight", "shape"]);
        let mut deep = config.clone();
        deep.n_layer = 3;
        refused(
            &config,
            random(&deep),
            &["transformer.h.2.ln_1.weight", "unexpected"],
        );
        refused(
            &deep,
            random(&config),
            &["transformer.h.2.ln_1.weight", "missing"],
        );
        let mut no_bias = random(&config);
        no_bias.h[1].mlp.fc_in.bias = None;
        refused(
            &config,
            no_bias,
            &["transformer.h.1.mlp.fc_in.bias", "missing"],
        );
        // An attention bias would be applied by the reference and dropped by the engines.
        let mut attn_bias = random(&config);
        attn_bias.h[0].attn.v_proj.bias = Some(attn_bias.ln_f.bias.clone());
        refused(
            &config,
            attn_bias,
            &["transformer.h.0.attn.v_proj.bias", "unexpected"],
        );
        let mut nan = random(&config);
        let mut values = nan.ln_f.bias.to_f32();
        values[3] = f32::NAN;
        nan.ln_f.bias = Tensor::from_f32(vec![16], &values);
        refused(&config, nan, &["transformer.ln_f.bias", "(in memory)"]);
        // With tied embeddings the head is wte (the engines read the field): not another shape,
        // nor other values of its shape, which the engines would score with while the model
        // saves (and hashes) wte alone.
        let mut tied = config.clone();
        tied.tie_word_embeddings = true;
        for (shape, value, names) in [
            (
                vec![8, 16],
                0.5,
                &["lm_head.weight", "tie_word_embeddings"][..],
            ),
            (vec![32, 16], f32::NAN, &["lm_head.weight"][..]),
            (
                vec![32, 16],
                0.25,
                &["lm_head.weight", "differs from transformer.wte.weight"][..],
            ),
        ] {
            let mut weights = random(&tied);
            let n = shape.iter().product();
            weights.lm_head.weight = Tensor::from_f32(shape, &vec![value; n]);
            refused(&tied, weights, names);
        }
        assert!(Model::from_parts(tied.clone(), random(&tied), None).is_ok());
        // The CPU engine's own constructor checks too.
        let mut wide_w = config.clone();
        wide_w.n_embd = 32;
        assert!(crate::cpu::CpuScorer::from_weights(&config, random(&wide_w)).is_err());
    }

    #[test]
    fn content_hash_follows_weights_config_and_tokenizer() {
        let config = GptjConfig::small(1, 16, 2, 4, 32);
        let hash = |m: Model| m.content_xxh3().unwrap();
        let base = hash(model(&config, 3, None));
        assert_eq!(base, hash(model(&config, 3, None)), "deterministic");
        assert_ne!(base, hash(model(&config, 4, None)), "other weights");
        let mut eps = config.clone();
        eps.layer_norm_epsilon = 1e-6;
        assert_ne!(base, hash(model(&eps, 3, None)), "another config");
        let tokenizer = Tokenizer::from_file(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/tiny-gptj/tokenizer.json"),
        )
        .unwrap();
        assert_ne!(
            base,
            hash(model(&config, 3, Some(tokenizer))),
            "a tokenizer"
        );
    }

    /// A model built in memory has no folder: `dir` is empty.
    #[test]
    fn a_model_built_in_memory_has_no_folder() {
        let config = GptjConfig::small(1, 16, 2, 4, 32);
        assert_eq!(model(&config, 1, None).dir(), Path::new(""));
    }

    /// The content hash follows the tokenizer file's bytes: two tokenizer.json files that differ
    /// (here by a trailing newline alone) give two hashes.
    #[test]
    fn content_hash_follows_the_tokenizer_file() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-gptj/tokenizer.json");
        let bytes = std::fs::read(&path).unwrap();
        let config = GptjConfig::small(1, 16, 2, 4, 32);
        let hash = |bytes: &[u8]| {
            let tokenizer = Tokenizer::from_bytes(bytes, &path).unwrap();
            model(&config, 3, Some(tokenizer)).content_xxh3().unwrap()
        };
        assert_ne!(hash(&bytes), hash(&[&bytes[..], b"\n"].concat()));
    }
}
