//! GPT-J's weights under their Hugging Face names, checked against the config: every expected
//! tensor present with its exact shape, nothing unexpected, a supported dtype, every value finite.

use std::collections::HashSet;
use std::path::Path;

use super::checkpoint::TensorMap;
use super::config::GptjConfig;
use super::tensor::{DType, Tensor};
use crate::error::{Error, Result};
use crate::util::rng::Rng;

/// A LayerNorm's affine parameters (`ln_1`, `ln_f`): y = (x - mean) / sqrt(var + eps) * weight +
/// bias, with eps the config's `layer_norm_epsilon`.
#[derive(Debug, Clone)]
pub struct LayerNormWeights {
    /// The scale, `[n_embd]` (`*.weight`).
    pub weight: Tensor,
    /// The shift, `[n_embd]` (`*.bias`).
    pub bias: Tensor,
}

/// A linear layer in PyTorch's layout: `weight` is [out_features, in_features]; y = x W^T + b.
#[derive(Debug, Clone)]
pub struct Linear {
    /// [out_features, in_features] (`*.weight`).
    pub weight: Tensor,
    /// `[out_features]` (`*.bias`); None for the attention projections, which have none in GPT-J.
    pub bias: Option<Tensor>,
}

/// One layer's attention projections, `transformer.h.N.attn.*`. None has a bias.
#[derive(Debug, Clone)]
pub struct AttnWeights {
    /// Queries, [n_embd, n_embd]: heads side by side, `head_dim` output features each.
    pub q_proj: Linear,
    /// Keys, [n_embd, n_embd], laid out as `q_proj`.
    pub k_proj: Linear,
    /// Values, [n_embd, n_embd], laid out as `q_proj`.
    pub v_proj: Linear,
    /// The heads' concatenated outputs back to the residual stream, [n_embd, n_embd].
    pub out_proj: Linear,
}

/// One layer's MLP, `transformer.h.N.mlp.*`: fc_out(gelu_new(fc_in(x))).
#[derive(Debug, Clone)]
pub struct MlpWeights {
    /// `[n_inner, n_embd]` + bias `[n_inner]` (n_inner: `GptjConfig::inner_dim`).
    pub fc_in: Linear,
    /// `[n_embd, n_inner]` + bias `[n_embd]`.
    pub fc_out: Linear,
}

/// One transformer block, `transformer.h.N`: x + attn(ln_1(x)) + mlp(ln_1(x)) (GPT-J's
/// parallel attention and MLP share the one norm).
#[derive(Debug, Clone)]
pub struct BlockWeights {
    /// The block's only LayerNorm, read by both branches.
    pub ln_1: LayerNormWeights,
    /// `attn.q_proj`, `k_proj`, `v_proj`, `out_proj`.
    pub attn: AttnWeights,
    /// `mlp.fc_in`, `mlp.fc_out`.
    pub mlp: MlpWeights,
}

/// `transformer.wte`, `transformer.h.N.*`, `transformer.ln_f`, `lm_head`.
#[derive(Debug, Clone)]
pub struct GptjWeights {
    /// Token embeddings, [vocab_size, n_embd] (`transformer.wte.weight`): row `id` is the
    /// input of token `id`.
    pub wte: Tensor,
    /// The blocks in order, `n_layer` of them (`transformer.h.0` first).
    pub h: Vec<BlockWeights>,
    /// The final LayerNorm before the LM head (`transformer.ln_f`).
    pub ln_f: LayerNormWeights,
    /// Logits, `[vocab_size, n_embd]` + bias `[vocab_size]` (`lm_head.*`). With
    /// `tie_word_embeddings` its weight is `wte` (the same shared bytes; `check` refuses other
    /// values). Loading and `check` require the bias; where it is None all the same, the engines
    /// read zeros.
    pub lm_head: Linear,
}

/// Every tensor GPT-J needs, with its shape under `config`, in checkpoint order. Lazy, so that
/// checking a checkpoint against a config with an absurd `n_layer` stops at the first missing
/// tensor instead of first listing billions of names.
pub fn expected_tensors(config: &GptjConfig) -> impl Iterator<Item = (String, Vec<usize>)> {
    let (d, f, v) = (config.n_embd, config.inner_dim(), config.vocab_size);
    let layers = (0..config.n_layer).flat_map(move |i| {
        let p = format!("transformer.h.{i}");
        let mut block = vec![
            (format!("{p}.ln_1.weight"), vec![d]),
            (format!("{p}.ln_1.bias"), vec![d]),
        ];
        for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
            block.push((format!("{p}.attn.{proj}.weight"), vec![d, d]));
        }
        block.push((format!("{p}.mlp.fc_in.weight"), vec![f, d]));
        block.push((format!("{p}.mlp.fc_in.bias"), vec![f]));
        block.push((format!("{p}.mlp.fc_out.weight"), vec![d, f]));
        block.push((format!("{p}.mlp.fc_out.bias"), vec![d]));
        block
    });
    let head = [
        Some(("transformer.ln_f.weight".into(), vec![d])),
        Some(("transformer.ln_f.bias".into(), vec![d])),
        (!config.tie_word_embeddings).then(|| ("lm_head.weight".into(), vec![v, d])),
        Some(("lm_head.bias".into(), vec![v])),
    ];
    std::iter::once(("transformer.wte.weight".to_string(), vec![v, d]))
        .chain(layers)
        .chain(head.into_iter().flatten())
}

/// The path errors about weights built in memory (`GptjWeights::check`) name.
pub const IN_MEMORY: &str = "(in memory)";

/// Elements per task of the finite check: large enough that a task's overhead is nothing, small
/// enough that GPT-J 6B's 6e9 values make thousands of tasks for rayon to balance.
const FINITE_CHUNK: usize = 1 << 20;

/// Fails on the first tensor (in `tensors`' order) holding a NaN or an infinity, naming it, its
/// file, how many such values it has and where the first is: a model with one computes garbage
/// (generate, annotate) or a loss that is not finite (score), without saying where it came from.
/// Every value is read once, in parallel over chunks of every tensor: 12-16 GB/s on 2 cores in
/// memory (docs/architecture.md, Checkpoints), a small part of a load, whose bytes come from disk.
pub fn check_finite(tensors: &[(String, &Tensor, &Path)]) -> Result<()> {
    use rayon::prelude::*;
    let chunks: Vec<(usize, std::ops::Range<usize>)> = tensors
        .iter()
        .enumerate()
        .flat_map(|(i, (_, t, _))| {
            let n = t.numel();
            (0..n.div_ceil(FINITE_CHUNK))
                .map(move |c| (i, c * FINITE_CHUNK..((c + 1) * FINITE_CHUNK).min(n)))
        })
        .collect();
    let counts: Vec<(usize, usize)> = chunks
        .into_par_iter()
        .map(|(i, range)| (i, tensors[i].1.count_non_finite(range)))
        .filter(|&(_, n)| n > 0)
        .collect();
    if counts.is_empty() {
        return Ok(());
    }
    let mut per_tensor = vec![0usize; tensors.len()];
    for (i, n) in counts {
        per_tensor[i] += n;
    }
    let bad: Vec<usize> = (0..tensors.len()).filter(|&i| per_tensor[i] > 0).collect();
    let (name, tensor, path) = &tensors[bad[0]];
    let count = per_tensor[bad[0]];
    let (at, value) = tensor
        .first_non_finite()
        .expect("a tensor with a non-finite value has a first one");
    let what = if value.is_nan() {
        "NaN"
    } else if value > 0.0 {
        "+inf"
    } else {
        "-inf"
    };
    let msg = if count == 1 {
        format!("1 non-finite value ({what} at element {at})")
    } else {
        format!("{count} non-finite values (first: {what} at element {at})")
    };
    let more = match bad.len() - 1 {
        0 => String::new(),
        1 => ", and 1 more tensor has some".to_string(),
        n => format!(", and {n} more tensors have some"),
    };
    Err(Error::Tensor {
        path: path.to_path_buf(),
        tensor: name.clone(),
        msg: format!("{msg}{more}; the checkpoint is corrupt or was saved from a diverged model"),
    })
}

impl GptjWeights {
    /// Validates `map` against `config` and binds the tensors. `dir` names the checkpoint in errors
    /// about tensors that are missing (no file holds them).
    pub fn from_map(config: &GptjConfig, map: &TensorMap, dir: &Path) -> Result<Self> {
        // Every expected tensor is checked before the list is kept, so it is never longer than
        // the checkpoint's own.
        let mut expected = HashSet::new();
        let mut in_order = Vec::new();
        for (name, shape) in expected_tensors(config) {
            let Some((tensor, path)) = map.get(&name) else {
                return Err(Error::Tensor {
                    path: dir.to_owned(),
                    tensor: name.clone(),
                    msg: "missing from the checkpoint".into(),
                });
            };
            if tensor.shape() != shape.as_slice() {
                return Err(Error::Tensor {
                    path: path.clone(),
                    tensor: name.clone(),
                    msg: format!(
                        "shape {:?} does not match the config, expected {:?}",
                        tensor.shape(),
                        shape
                    ),
                });
            }
            in_order.push((name.clone(), tensor, path.as_path()));
            expected.insert(name);
        }
        let mut unexpected: Vec<&str> = map
            .names()
            .filter(|n| !expected.contains(*n))
            .filter(|n| !(config.tie_word_embeddings && *n == "lm_head.weight"))
            .collect();
        unexpected.sort_unstable();
        if let Some(name) = unexpected.first() {
            let (_, path) = map.get(name).expect("listed name");
            return Err(Error::Tensor {
                path: path.clone(),
                tensor: name.to_string(),
                msg: format!(
                    "unexpected tensor (not part of GPT-J with n_layer = {}){}",
                    config.n_layer,
                    if unexpected.len() > 1 {
                        format!(", and {} more", unexpected.len() - 1)
                    } else {
                        String::new()
                    }
                ),
            });
        }
        if config.tie_word_embeddings {
            if let Some((_, path)) = map.get("lm_head.weight") {
                // transformers ties them too, but a user may expect this tensor to be used.
                tracing::warn!(
                    "{}: lm_head.weight is ignored: tie_word_embeddings is set, so the LM head \
                     uses transformer.wte.weight",
                    path.display()
                );
            }
        }
        check_finite(&in_order)?;
        let get = |name: &str| map.get(name).expect("validated above").0.clone();
        Ok(Self::bind(config, get))
    }

    /// Checks weights built in memory as `from_map` checks a checkpoint's: `config` valid, every
    /// tensor present under its name with the config's shape, every value finite. Errors name
    /// the tensor, under the path "(in memory)".
    pub fn check(&self, config: &GptjConfig) -> Result<()> {
        let here = Path::new(IN_MEMORY);
        config.validate().map_err(|msg| Error::Config {
            path: here.to_owned(),
            msg,
        })?;
        let layers = self.h.len();
        if layers != config.n_layer {
            let first_odd = layers.min(config.n_layer);
            return Err(Error::Tensor {
                path: here.to_owned(),
                tensor: format!("transformer.h.{first_odd}.ln_1.weight"),
                msg: format!(
                    "{}: the weights have {layers} layers, the config {}",
                    if layers > config.n_layer {
                        "unexpected"
                    } else {
                        "missing"
                    },
                    config.n_layer
                ),
            });
        }
        // GPT-J's attention projections have no bias; one set here would be applied by the
        // reference and dropped by the fast engines, so the backends would disagree.
        for (i, b) in self.h.iter().enumerate() {
            let a = &b.attn;
            for (name, l) in [
                ("q_proj", &a.q_proj),
                ("k_proj", &a.k_proj),
                ("v_proj", &a.v_proj),
                ("out_proj", &a.out_proj),
            ] {
                if l.bias.is_some() {
                    return Err(Error::Tensor {
                        path: here.to_owned(),
                        tensor: format!("transformer.h.{i}.attn.{name}.bias"),
                        msg: "unexpected: GPT-J's attention projections have no bias".into(),
                    });
                }
            }
        }
        let tensors = self.named_tensors(config);
        let mut have = tensors.iter();
        for (name, shape) in expected_tensors(config) {
            let tensor_err = |msg: String| Error::Tensor {
                path: here.to_owned(),
                tensor: name.clone(),
                msg,
            };
            // Only a bias can be absent (`Linear::bias`), which shifts the names after it.
            match have.next() {
                Some((got, tensor)) if *got == name => {
                    if tensor.shape() != shape.as_slice() {
                        return Err(tensor_err(format!(
                            "shape {:?} does not match the config, expected {:?}",
                            tensor.shape(),
                            shape
                        )));
                    }
                }
                _ => return Err(tensor_err("missing".into())),
            }
        }
        let mut named: Vec<(String, &Tensor, &Path)> =
            tensors.iter().map(|(n, t)| (n.clone(), t, here)).collect();
        if config.tie_word_embeddings {
            // Not a tensor of the checkpoint (`bind` makes it wte), but a field the engines
            // read: built in memory, it may be anything.
            let (head, wte) = (&self.lm_head.weight, &self.wte);
            if head.shape() != wte.shape() {
                return Err(Error::Tensor {
                    path: here.to_owned(),
                    tensor: "lm_head.weight".into(),
                    msg: format!(
                        "shape {:?}: with tie_word_embeddings it is transformer.wte.weight, {:?}",
                        head.shape(),
                        wte.shape()
                    ),
                });
            }
            // The engines compute with lm_head.weight, but a saved model (and its content
            // hash) has wte alone: another head would score one way and save as another model.
            if head.dtype() != wte.dtype() || head.bytes() != wte.bytes() {
                return Err(Error::Tensor {
                    path: here.to_owned(),
                    tensor: "lm_head.weight".into(),
                    msg: "differs from transformer.wte.weight, which it is with \
                          tie_word_embeddings; give wte's values, or untie the config"
                        .into(),
                });
            }
            named.push(("lm_head.weight".into(), head, here));
        }
        check_finite(&named)
    }

    /// Builds the struct from a name -> tensor function (names already validated).
    fn bind(config: &GptjConfig, get: impl Fn(&str) -> Tensor) -> Self {
        let ln = |p: &str| LayerNormWeights {
            weight: get(&format!("{p}.weight")),
            bias: get(&format!("{p}.bias")),
        };
        let linear = |p: &str| Linear {
            weight: get(&format!("{p}.weight")),
            bias: None,
        };
        let linear_b = |p: &str| Linear {
            weight: get(&format!("{p}.weight")),
            bias: Some(get(&format!("{p}.bias"))),
        };
        let h = (0..config.n_layer)
            .map(|i| {
                let p = format!("transformer.h.{i}");
                BlockWeights {
                    ln_1: ln(&format!("{p}.ln_1")),
                    attn: AttnWeights {
                        q_proj: linear(&format!("{p}.attn.q_proj")),
                        k_proj: linear(&format!("{p}.attn.k_proj")),
                        v_proj: linear(&format!("{p}.attn.v_proj")),
                        out_proj: linear(&format!("{p}.attn.out_proj")),
                    },
                    mlp: MlpWeights {
                        fc_in: linear_b(&format!("{p}.mlp.fc_in")),
                        fc_out: linear_b(&format!("{p}.mlp.fc_out")),
                    },
                }
            })
            .collect();
        let wte = get("transformer.wte.weight");
        let lm_head_weight = if config.tie_word_embeddings {
            wte.clone()
        } else {
            get("lm_head.weight")
        };
        GptjWeights {
            wte,
            h,
            ln_f: ln("transformer.ln_f"),
            lm_head: Linear {
                weight: lm_head_weight,
                bias: Some(get("lm_head.bias")),
            },
        }
    }

    /// Every tensor under its Hugging Face name (what a safetensors file of this model holds).
    pub fn named_tensors(&self, config: &GptjConfig) -> Vec<(String, Tensor)> {
        let mut out = vec![("transformer.wte.weight".to_string(), self.wte.clone())];
        for (i, b) in self.h.iter().enumerate() {
            let p = format!("transformer.h.{i}");
            out.push((format!("{p}.ln_1.weight"), b.ln_1.weight.clone()));
            out.push((format!("{p}.ln_1.bias"), b.ln_1.bias.clone()));
            for (name, l) in [
                ("q_proj", &b.attn.q_proj),
                ("k_proj", &b.attn.k_proj),
                ("v_proj", &b.attn.v_proj),
                ("out_proj", &b.attn.out_proj),
            ] {
                out.push((format!("{p}.attn.{name}.weight"), l.weight.clone()));
            }
            for (name, l) in [("fc_in", &b.mlp.fc_in), ("fc_out", &b.mlp.fc_out)] {
                out.push((format!("{p}.mlp.{name}.weight"), l.weight.clone()));
                if let Some(bias) = &l.bias {
                    out.push((format!("{p}.mlp.{name}.bias"), bias.clone()));
                }
            }
        }
        out.push(("transformer.ln_f.weight".into(), self.ln_f.weight.clone()));
        out.push(("transformer.ln_f.bias".into(), self.ln_f.bias.clone()));
        if !config.tie_word_embeddings {
            out.push(("lm_head.weight".into(), self.lm_head.weight.clone()));
        }
        if let Some(bias) = &self.lm_head.bias {
            out.push(("lm_head.bias".into(), bias.clone()));
        }
        out
    }

    /// Random weights for tests and benchmarks, scaled so that next-token distributions are peaked
    /// (as in a trained model) rather than uniform: a default N(0, 0.02) init makes every loss
    /// ~log(vocab) and every delta ~0, which proves nothing. Deterministic in `seed`.
    ///
    /// It does not check the config: one that `GptjConfig::validate` refuses (n_embd not a
    /// multiple of n_head, say) gives weights that `Model::from_parts` then refuses.
    ///
    /// # Panics
    /// On sizes past memory (an allocation failure).
    pub fn random(config: &GptjConfig, seed: u64, dtype: DType) -> Self {
        let mut rng = Rng::new(seed);
        let (d, f) = (config.n_embd as f32, config.inner_dim() as f32);
        let shapes = expected_tensors(config);
        let tensors: std::collections::HashMap<String, Tensor> = shapes
            .into_iter()
            .map(|(name, shape)| {
                let n: usize = shape.iter().product();
                let values: Vec<f32> =
                    if name.ends_with("ln_1.weight") || name.ends_with("ln_f.weight") {
                        (0..n).map(|_| 1.0 + 0.1 * rng.normal()).collect()
                    } else {
                        // Fan-in scaled so activations stay O(1); the head is sharpened on purpose.
                        let std = if name == "transformer.wte.weight" {
                            1.0
                        } else if name == "lm_head.weight" {
                            4.0 / d.sqrt()
                        } else if name.ends_with(".bias") {
                            0.1
                        } else if name.contains("fc_out") {
                            1.0 / f.sqrt()
                        } else {
                            1.0 / d.sqrt()
                        };
                        (0..n).map(|_| std * rng.normal()).collect()
                    };
                (name, Tensor::from_f32_as(shape, &values, dtype))
            })
            .collect();
        Self::bind(config, |name| tensors[name].clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A non-finite value is found wherever it lies, a chunk's last element and the next chunk's
    /// first included (the check splits each tensor in chunks of FINITE_CHUNK elements).
    #[test]
    fn a_non_finite_value_at_a_chunk_edge_is_found() {
        let n = FINITE_CHUNK + 1;
        for at in [0, FINITE_CHUNK - 1, FINITE_CHUNK] {
            let mut values = vec![0.25f32; n];
            values[at] = f32::INFINITY;
            let t = Tensor::from_f32_as(vec![n], &values, DType::F16);
            let err = check_finite(&[("w".into(), &t, Path::new("m.safetensors"))])
                .expect_err("an infinity");
            assert!(
                err.to_string()
                    .contains(&format!("1 non-finite value (+inf at element {at})")),
                "{err}"
            );
        }
    }

    /// Each kind of non-finite value is named as what it is.
    #[test]
    fn each_kind_of_non_finite_value_is_named() {
        for (value, what) in [
            (f32::NEG_INFINITY, "-inf"),
            (f32::INFINITY, "+inf"),
            (f32::NAN, "NaN"),
        ] {
            let t = Tensor::from_f32(vec![2], &[0.5, value]);
            let err = check_finite(&[("w".into(), &t, Path::new("m.safetensors"))])
                .expect_err("a non-finite value");
            let want = format!("1 non-finite value ({what} at element 1)");
            assert!(err.to_string().contains(&want), "{err}");
        }
    }
}
