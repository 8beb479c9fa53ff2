//! GPT-J hyper-parameters, read from a Hugging Face config.json with the field names used verbatim.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Longest context a config may declare (GPT-J-6B has 2048).
pub const MAX_POSITIONS: usize = 1 << 20;

/// The largest config.json read: GPT-J 6B's is under 1 KB; its JSON is held whole as values.
pub(super) const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Most entries of the rotary table (n_positions x rotary_dim, f32), built for every position up
/// front: 256 MB, GPT-J's rotary_dim 64 at `MAX_POSITIONS`.
pub const MAX_ROTARY_TABLE: usize = 1 << 26;

/// The fields of transformers' `GPTJConfig` that change the computation. Unknown fields in
/// config.json (dropout rates, token ids, ...) are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GptjConfig {
    /// Rows of `transformer.wte` and of the LM head: token ids are `0..vocab_size` (config.json
    /// `vocab_size`; 50400 for GPT-J-6B).
    pub vocab_size: usize,
    /// Longest sequence the model scores, in tokens: positions are `0..n_positions`
    /// (`n_positions`; at most `MAX_POSITIONS`).
    pub n_positions: usize,
    /// Width of the residual stream, the model dimension d (`n_embd`; a multiple of `n_head`).
    pub n_embd: usize,
    /// Number of transformer blocks, `transformer.h.0` .. `transformer.h.{n_layer - 1}`
    /// (`n_layer`).
    pub n_layer: usize,
    /// Attention heads per layer, each `n_embd / n_head` wide (`n_head`).
    pub n_head: usize,
    /// Rotary embedding covers the first `rotary_dim` dims of each head. Absent means 64,
    /// transformers' default (GPT-J-6B's); `null` means the whole head, as transformers rotates
    /// the whole query and key then (it reads the head's width only for a single head; we take
    /// the sensible reading).
    #[serde(default = "default_rotary_dim")]
    pub rotary_dim: Option<usize>,
    /// MLP width; `null` means 4 * n_embd, as in transformers.
    #[serde(default)]
    pub n_inner: Option<usize>,
    /// The MLP's activation (`activation_function`); absent means "gelu_new", the only one
    /// `validate` accepts.
    #[serde(default = "default_activation")]
    pub activation_function: String,
    /// The epsilon added to the variance in every LayerNorm (`layer_norm_epsilon`); absent
    /// means 1e-5. Positive and finite.
    #[serde(default = "default_eps")]
    pub layer_norm_epsilon: f64,
    /// The LM head's weight is `transformer.wte.weight` (`tie_word_embeddings`; absent means
    /// false): the checkpoint needs no `lm_head.weight`, and one it has is ignored with a
    /// warning. `lm_head.bias` is still read.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// The architecture's name (`model_type`); `validate` refuses anything but "gptj", and
    /// absent is accepted.
    #[serde(default)]
    pub model_type: Option<String>,
}

fn default_rotary_dim() -> Option<usize> {
    Some(64)
}

fn default_activation() -> String {
    "gelu_new".into()
}

fn default_eps() -> f64 {
    1e-5
}

impl GptjConfig {
    /// Reads and validates `path` (a config.json).
    pub fn from_file(path: &Path) -> Result<Self> {
        let err = |msg: String| Error::Config {
            path: path.to_owned(),
            msg,
        };
        // A pipe or a device under the name would block or never end.
        if let Ok(m) = std::fs::metadata(path) {
            if !m.is_file() {
                return Err(err("exists but is not a regular file".into()));
            }
        }
        let text = crate::util::fs::read_small_text(path, MAX_CONFIG_BYTES, err)?;
        let config: GptjConfig = crate::util::json::object_from_str(&text)
            .map_err(|e| err(format!("not a GPT-J config: {e}")))?;
        config.validate().map_err(err)?;
        Ok(config)
    }

    /// Checks that the numbers describe a model the engine can run; the message names the field.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if let Some(t) = &self.model_type {
            if t != "gptj" {
                return Err(format!("model_type is {t:?}, expected \"gptj\""));
            }
        }
        for (name, value) in [
            ("vocab_size", self.vocab_size),
            ("n_positions", self.n_positions),
            ("n_embd", self.n_embd),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
        ] {
            if value == 0 {
                return Err(format!("{name} must be positive"));
            }
        }
        if self.n_positions > MAX_POSITIONS {
            return Err(format!(
                "n_positions ({}) is larger than toolsift supports ({MAX_POSITIONS}): the engines \
                 build a rotary table for every position up front and index tokens with 32 bits",
                self.n_positions
            ));
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            return Err(format!(
                "n_embd ({}) is not divisible by n_head ({})",
                self.n_embd, self.n_head
            ));
        }
        let head_dim = self.head_dim();
        let rotary_dim = self.rotary_dim();
        if rotary_dim > head_dim {
            return Err(format!(
                "rotary_dim ({rotary_dim}) is larger than the head dimension ({head_dim} = n_embd \
                 / n_head; a config without the key means 64, transformers' default)"
            ));
        }
        // The engines build the rotary table for every position up front.
        if self.n_positions.saturating_mul(rotary_dim) > MAX_ROTARY_TABLE {
            return Err(format!(
                "n_positions ({}) x rotary_dim ({rotary_dim}) is larger than toolsift supports \
                 ({MAX_ROTARY_TABLE}: the engines build a rotary table for every position up \
                 front, 4 bytes each)",
                self.n_positions
            ));
        }
        if !rotary_dim.is_multiple_of(2) {
            return Err(format!(
                "rotary_dim ({rotary_dim}) must be even: GPT-J rotates pairs of dims"
            ));
        }
        if self.n_inner == Some(0) {
            return Err("n_inner must be positive (or null for 4 * n_embd)".into());
        }
        if self.activation_function != "gelu_new" {
            return Err(format!(
                "activation_function {:?} is not supported (GPT-J uses \"gelu_new\")",
                self.activation_function
            ));
        }
        if self.checked_n_params().is_none() {
            return Err(format!(
                "sizes too large: the parameter count of n_embd {}, n_layer {}, vocab_size {} \
                 and an MLP of {} overflows 64 bits",
                self.n_embd,
                self.n_layer,
                self.vocab_size,
                self.inner_dim()
            ));
        }
        // The fast paths add it in f32: one that rounds to 0 there (or to a subnormal, which a
        // kernel may flush) turns a constant row's LayerNorm into 0 x inf = NaN, where the f64
        // reference returns the bias.
        let eps_f32 = self.layer_norm_epsilon as f32;
        if !(eps_f32 >= f32::MIN_POSITIVE && eps_f32.is_finite()) {
            return Err(format!(
                "layer_norm_epsilon ({}) must be positive and finite, and a normal f32 (between \
                 {:e} and {:e}): the fast paths compute in f32",
                self.layer_norm_epsilon,
                f32::MIN_POSITIVE,
                f32::MAX
            ));
        }
        Ok(())
    }

    /// Width of one attention head: `n_embd / n_head`.
    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }

    /// Dims of each head that are rotated: the `rotary_dim` field, or the whole head when it is
    /// `null`.
    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim.unwrap_or_else(|| self.head_dim())
    }

    /// Width of the MLP (fc_in's outputs): the `n_inner` field, or `4 * n_embd` when it is
    /// `null` (saturating, so that `validate` can report absurd sizes instead of overflowing).
    pub fn inner_dim(&self) -> usize {
        self.n_inner
            .unwrap_or_else(|| self.n_embd.saturating_mul(4))
    }

    /// Parameter count (embedding, blocks, final norm, LM head with bias).
    ///
    /// # Panics
    /// When the count overflows `usize` (a config `validate` refuses); `checked_n_params`
    /// returns None instead.
    pub fn n_params(&self) -> usize {
        self.checked_n_params()
            .expect("parameter count overflows usize")
    }

    /// `n_params`, or None when it overflows usize (absurd sizes from a flag or a config file).
    pub fn checked_n_params(&self) -> Option<usize> {
        let (d, f, v) = (self.n_embd, self.inner_dim(), self.vocab_size);
        let mul = usize::checked_mul;
        let dd = mul(d, d)?;
        let fd = mul(f, d)?;
        // 2d (ln_1) + 4d^2 (q, k, v, out) + fd + f (fc_in) + df + d (fc_out).
        let block = mul(4, dd)?
            .checked_add(mul(2, fd)?)?
            .checked_add(mul(3, d)?.checked_add(f)?)?;
        let vd = mul(v, d)?;
        let head = if self.tie_word_embeddings {
            v
        } else {
            vd.checked_add(v)?
        };
        vd.checked_add(mul(self.n_layer, block)?)?
            .checked_add(mul(2, d)?)?
            .checked_add(head)
    }

    /// Forward FLOPs per token through the trunk (the layer GEMMs; attention scores excluded).
    pub fn trunk_flops_per_token(&self) -> f64 {
        let (d, f) = (self.n_embd as f64, self.inner_dim() as f64);
        self.n_layer as f64 * 2.0 * (4.0 * d * d + 2.0 * d * f)
    }

    /// A GPT-J of the 6B shape (EleutherAI/gpt-j-6b).
    pub fn gptj_6b() -> Self {
        GptjConfig {
            vocab_size: 50400,
            n_positions: 2048,
            n_embd: 4096,
            n_layer: 28,
            n_head: 16,
            rotary_dim: Some(64),
            n_inner: None,
            activation_function: "gelu_new".into(),
            layer_norm_epsilon: 1e-5,
            tie_word_embeddings: false,
            model_type: Some("gptj".into()),
        }
    }

    /// A small config from its sizes, with GPT-J's other settings.
    pub fn small(
        n_layer: usize,
        n_embd: usize,
        n_head: usize,
        rotary_dim: usize,
        vocab_size: usize,
    ) -> Self {
        GptjConfig {
            vocab_size,
            n_positions: 2048,
            n_embd,
            n_layer,
            n_head,
            rotary_dim: Some(rotary_dim),
            n_inner: None,
            activation_function: "gelu_new".into(),
            layer_norm_epsilon: 1e-5,
            tie_word_embeddings: false,
            model_type: Some("gptj".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// transformers' reading: no key is 64, `null` the whole head.
    #[test]
    fn rotary_dim_absent_is_64_and_null_is_the_whole_head() {
        let json = |rotary: &str| {
            format!(
                r#"{{"vocab_size": 10, "n_positions": 8, "n_embd": 256, "n_layer": 1,
                   "n_head": 2{rotary}}}"#
            )
        };
        let read = |text: String| serde_json::from_str::<GptjConfig>(&text).unwrap();
        assert_eq!(read(json("")).rotary_dim(), 64);
        assert_eq!(read(json(r#", "rotary_dim": null"#)).rotary_dim(), 128);
        assert_eq!(read(json(r#", "rotary_dim": 8"#)).rotary_dim(), 8);
        // 0: no rotation at all (the property tests run it; transformers cannot).
        assert!(read(json(r#", "rotary_dim": 0"#)).validate().is_ok());
        // A head narrower than the default: the error says where 64 came from.
        let mut narrow = read(json(""));
        narrow.n_embd = 64;
        let err = narrow.validate().unwrap_err();
        assert!(err.contains("without the key means 64"), "{err}");
    }

    /// The rotary table is built whole: its size is bounded, not only n_positions.
    #[test]
    fn the_rotary_table_is_bounded() {
        let mut c = GptjConfig::gptj_6b();
        c.n_positions = MAX_POSITIONS;
        assert!(
            c.validate().is_ok(),
            "GPT-J's rotary_dim at the longest context"
        );
        c.n_embd = 1 << 16;
        c.n_head = 1;
        c.rotary_dim = None;
        let err = c.validate().unwrap_err();
        assert!(err.contains("x rotary_dim"), "{err}");
    }

    /// Every path computes LayerNorm with this epsilon, the f32 ones included.
    #[test]
    fn layer_norm_epsilon_must_be_a_normal_f32() {
        let mut c = GptjConfig::gptj_6b();
        for eps in [1e-5, 1e-12, f32::MIN_POSITIVE as f64, 1.0] {
            c.layer_norm_epsilon = eps;
            assert!(c.validate().is_ok(), "{eps}");
        }
        for eps in [0.0, -1e-5, 1e-50, 1e-40, 1e39, f64::NAN, f64::INFINITY] {
            c.layer_norm_epsilon = eps;
            let err = c.validate().unwrap_err();
            assert!(err.contains("layer_norm_epsilon"), "{eps}: {err}");
        }
    }

    #[test]
    fn an_absurd_size_has_no_parameter_count() {
        let mut c = GptjConfig::gptj_6b();
        c.n_embd = 1 << 40;
        assert_eq!(c.checked_n_params(), None);
    }

    #[test]
    fn gptj_6b_has_six_billion_parameters() {
        let c = GptjConfig::gptj_6b();
        assert_eq!(c.head_dim(), 256);
        let n = c.n_params() as f64;
        assert!((n - 6.05e9).abs() < 0.01e9, "{n}");
        // The usual ~12.1 GFLOP per token is 2 x parameters; the matmuls proper (layers + head,
        // the embedding gather is no FLOP) are 11.7 GFLOP.
        assert!((2.0 * n - 12.1e9).abs() < 0.05e9);
        let flops = c.trunk_flops_per_token() + 2.0 * 4096.0 * 50400.0;
        assert!((flops - 11.69e9).abs() < 0.01e9, "{flops}");
    }

    /// n_inner 0 (an MLP of no units) is refused; null is 4 * n_embd, and any other size is
    /// the MLP's.
    #[test]
    fn n_inner_must_be_positive_and_null_is_four_times_n_embd() {
        let mut c = GptjConfig::small(1, 16, 2, 4, 32);
        assert_eq!(c.inner_dim(), 64);
        c.n_inner = Some(24);
        assert!(c.validate().is_ok());
        assert_eq!(c.inner_dim(), 24);
        c.n_inner = Some(0);
        let err = c.validate().unwrap_err();
        assert!(err.contains("n_inner must be positive"), "{err}");
    }

    /// A size of 0 is refused naming its field: an empty vocabulary, context, residual stream,
    /// stack or head count is no model (and n_head 0 would divide by 0 for the head width).
    #[test]
    fn a_size_of_zero_is_refused_naming_its_field() {
        for field in ["vocab_size", "n_positions", "n_embd", "n_layer", "n_head"] {
            let mut json = serde_json::to_value(GptjConfig::gptj_6b()).unwrap();
            json[field] = 0.into();
            let c: GptjConfig = serde_json::from_value(json).unwrap();
            let err = c.validate().unwrap_err();
            assert!(err.contains(&format!("{field} must be positive")), "{err}");
        }
    }

    /// A rotary_dim of the whole head is accepted (rotary_dim <= head_dim), given or as null;
    /// two past it is not.
    #[test]
    fn a_rotary_dim_of_the_whole_head_is_accepted() {
        let mut c = GptjConfig::small(1, 16, 2, 8, 32);
        assert_eq!(c.head_dim(), 8);
        assert_eq!(c.validate(), Ok(()));
        c.rotary_dim = None;
        assert_eq!((c.rotary_dim(), c.validate()), (8, Ok(())));
        c.rotary_dim = Some(10);
        assert!(c.validate().unwrap_err().contains("rotary_dim (10)"));
    }

    /// A config.json with the required sizes alone reads transformers' defaults for the rest:
    /// layer_norm_epsilon 1e-5, activation_function "gelu_new", an MLP of 4 * n_embd, untied
    /// embeddings and no model_type; and it is valid.
    #[test]
    fn absent_optional_fields_read_transformers_defaults() {
        let c: GptjConfig = serde_json::from_str(
            r#"{"vocab_size": 10, "n_positions": 8, "n_embd": 128, "n_layer": 1, "n_head": 2}"#,
        )
        .unwrap();
        assert_eq!(c.layer_norm_epsilon, 1e-5);
        assert_eq!(c.activation_function, "gelu_new");
        assert_eq!(c.inner_dim(), 512);
        assert!(!c.tie_word_embeddings);
        assert_eq!(c.model_type, None);
        assert_eq!(c.validate(), Ok(()));
    }

    /// With tied embeddings the LM head adds its bias alone: its weight is wte, counted once.
    #[test]
    fn a_tied_head_counts_its_bias_alone() {
        let mut c = GptjConfig::small(1, 16, 2, 4, 32);
        let untied = c.n_params();
        c.tie_word_embeddings = true;
        assert_eq!(c.n_params(), untied - 32 * 16);
    }
}
