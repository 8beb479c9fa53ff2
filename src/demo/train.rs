//! Trains the demo model: a small GPT-J (exactly transformers' `GPTJForCausalLM`, the architecture
//! toolsift runs) with candle's autograd on the CPU, and the byte-level BPE tokenizer it reads.
//!
//! Everything that decides the result comes from one seed and toolsift's own SplitMix64
//! (`util::rng::Rng`): the corpus, the initial weights, the shuffling and batching. candle's CPU
//! kernels and the ops below are deterministic (one row per task, fixed reduction order), so a seed
//! reproduces the losses bit for bit, whatever the thread count.
//!
//! Every op is differentiable: candle's matmul, index_select, reshapes and adds, and five custom
//! ops with explicit backward passes (`fused`: LayerNorm, bias + gelu_new, causal softmax, rotary,
//! cross-entropy), since candle_nn's `layer_norm`, `softmax_last_dim` and `rope_i` are forward-only
//! and the same math from primitives is slow under autograd. The test `fused_ops_match_primitives`
//! checks them against the primitive versions; `check_against_reference` proves after training that
//! the forward is the engine's: the written folder, loaded by `Model::load` and run by the f64
//! oracle (`crate::reference`), gives the same log-probs. docs/demo-model.md has the recipe.
//!
//! The math, as `crate::reference`: embedding; per layer `h = ln_1(x)`, `x = x + attn(h) + mlp(h)`;
//! "rotate every two" rotary on the first `rotary_dim` dims of each head (base 10000); causal
//! softmax attention scaled by 1/sqrt(head_dim), no biases; `gelu_new` MLP with biases; `ln_f`;
//! `lm_head` with bias (untied).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, ensure, Context, Result};
use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use serde::Serialize;

use crate::cpu::ops::RotaryTable;
use crate::model::checkpoint::write_safetensors;
use crate::model::weights::expected_tensors;
use crate::model::{GptjConfig, Tensor as CheckpointTensor};
use crate::util::rng::Rng;

/// The one special token: end of text, also the padding id (padding is never a target).
pub const EOT: &str = "<|endoftext|>";

/// Everything a training run depends on. `Default` is the demo model's recipe.
#[derive(Debug, Clone, Serialize)]
pub struct TrainOptions {
    /// Seed of the weights and of the batch order.
    pub seed: u64,
    /// Seed of the corpus generator (`corpus::training_sequences`).
    pub data_seed: u64,
    /// Documents asked of the corpus generator.
    pub docs: usize,
    pub steps: usize,
    pub batch: usize,
    /// Peak learning rate (AdamW), reached after `warmup` steps, then cosine decay to
    /// `final_lr_frac * lr` at the last step.
    pub lr: f64,
    pub warmup: usize,
    pub final_lr_frac: f64,
    /// Decoupled weight decay on matrices and embeddings (not on biases and LayerNorms).
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub adam_eps: f64,
    /// Clip the global gradient norm to this (0 = no clipping).
    pub grad_clip: f64,
    /// Tokenizer size asked of the BPE trainer, `<|endoftext|>` included.
    pub vocab_size: usize,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub rotary_dim: usize,
    pub n_positions: usize,
    /// Documents per bucket of the batcher are `batch * bucket_batches`: a bucket is sorted by
    /// length and cut into batches, so a batch pads little.
    pub bucket_batches: usize,
    pub log_every: usize,
    /// Training sequences checked against the f64 reference after training.
    pub check_sequences: usize,
    /// Threads of candle's GEMMs (recorded; the binary sets them before anything runs).
    pub threads: usize,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            seed: 1,
            data_seed: 1,
            docs: 20_000,
            steps: 3000,
            batch: 32,
            lr: 3e-3,
            warmup: 100,
            final_lr_frac: 0.1,
            weight_decay: 0.01,
            beta1: 0.9,
            beta2: 0.98,
            adam_eps: 1e-8,
            grad_clip: 1.0,
            vocab_size: 512,
            n_layer: 4,
            n_embd: 128,
            n_head: 4,
            rotary_dim: 16,
            n_positions: 256,
            bucket_batches: 50,
            log_every: 50,
            check_sequences: 4,
            threads: 1,
        }
    }
}

impl TrainOptions {
    /// The model's config for a tokenizer of `tokenizer_size` ids (the vocabulary is padded to a
    /// multiple of 8; the extra rows are never targets).
    pub fn gptj_config(&self, tokenizer_size: usize) -> GptjConfig {
        GptjConfig {
            vocab_size: tokenizer_size.div_ceil(8) * 8,
            n_positions: self.n_positions,
            n_embd: self.n_embd,
            n_layer: self.n_layer,
            n_head: self.n_head,
            rotary_dim: Some(self.rotary_dim),
            n_inner: None,
            activation_function: "gelu_new".into(),
            layer_norm_epsilon: 1e-5,
            tie_word_embeddings: false,
            model_type: Some("gptj".into()),
        }
    }

    /// Learning rate of step `step` (0-based): linear warmup, then cosine to `final_lr_frac`.
    pub fn lr_at(&self, step: usize) -> f64 {
        if step < self.warmup {
            return self.lr * (step + 1) as f64 / self.warmup as f64;
        }
        let span = self.steps.saturating_sub(self.warmup).max(1) as f64;
        let p = ((step - self.warmup) as f64 / span).min(1.0);
        let floor = self.lr * self.final_lr_frac;
        floor + (self.lr - floor) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos())
    }
}

// ---------------------------------------------------------------------------------------------
// Tokenizer

/// Trains GPT-2-style byte-level BPE on `texts`: digits split one per token (" 25" is " ", "2",
/// "5"), the 256 byte symbols always in the vocabulary, merges seen at least twice, and
/// `<|endoftext|>` added last (as GPT-2's id 50256), for `vocab_size` ids at most in all.
pub fn train_tokenizer(texts: &[String], vocab_size: usize) -> Result<tokenizers::Tokenizer> {
    use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
    use tokenizers::models::TrainerWrapper;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::pre_tokenizers::digits::Digits;
    use tokenizers::pre_tokenizers::sequence::Sequence;
    use tokenizers::{AddedToken, PreTokenizerWrapper};

    ensure!(
        vocab_size > 257,
        "vocab_size {vocab_size} leaves no room for merges (256 byte symbols + <|endoftext|>)"
    );
    let mut tok = tokenizers::Tokenizer::new(BPE::default());
    tok.with_pre_tokenizer(Some(Sequence::new(vec![
        PreTokenizerWrapper::Digits(Digits::new(true)),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
    ])));
    tok.with_decoder(Some(ByteLevel::default()));
    tok.with_post_processor(Some(ByteLevel::new(false, false, true)));
    let alphabet: HashSet<char> = ByteLevel::alphabet().into_iter().collect();
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(vocab_size - 1)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(alphabet)
        .build()
        .into();
    tok.train(&mut trainer, texts.iter())
        .map_err(|e| anyhow!("training the tokenizer: {e}"))?;
    tok.add_special_tokens([AddedToken::from(EOT, true)])
        .map_err(|e| anyhow!("adding {EOT}: {e}"))?;
    Ok(tok)
}

/// Checks what the annotate driver and the demo need of a trained tokenizer: `<|endoftext|>`,
/// single-digit tokens, and "[" and " [" as single tokens when the texts contain them. Returns
/// the `<|endoftext|>` id.
pub fn check_tokenizer(tok: &crate::model::Tokenizer, texts: &[String]) -> Result<u32> {
    let eot = tok
        .token_id(EOT)
        .ok_or_else(|| anyhow!("tokenizer has no {EOT}"))?;
    let digits = tok.encode_ids(" 25")?;
    ensure!(
        digits.len() == 3 && tok.decode(&digits[1..2])? == "2",
        "\" 25\" should be \" \", \"2\", \"5\", got {digits:?}"
    );
    for s in ["[", " ["] {
        if texts.iter().any(|t| t.contains(s)) {
            let ids = tok.encode_ids(s)?;
            ensure!(
                ids.len() == 1,
                "{s:?} is {} tokens, the annotate driver needs one (raise --vocab-size?)",
                ids.len()
            );
        }
    }
    Ok(eot)
}

// ---------------------------------------------------------------------------------------------
// Fused ops with their backward passes

/// The hot ops as candle custom ops with explicit backward passes: candle's autograd of the same
/// math written from primitives builds a dozen full-size temporaries per op (gelu's backward alone
/// is ten tensor ops with a `powf`), which made a step three times slower. Each forward is the
/// plain formula, one pass over the rows (rayon, one row per task: deterministic); each backward
/// is one more custom op (no second derivatives are needed).
mod fused {
    use std::sync::Arc;

    use candle_core::{
        bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor,
    };
    use rayon::prelude::*;

    /// Rows of at most this many elements go to rayon in groups, so a task is not too small.
    const MIN_TASK: usize = 4096;

    fn f32s<'a>(s: &'a CpuStorage, l: &Layout, op: &str) -> Result<&'a [f32]> {
        let CpuStorage::F32(v) = s else {
            bail!("{op}: expected f32")
        };
        match l.contiguous_offsets() {
            Some((a, b)) => Ok(&v[a..b]),
            None => bail!("{op}: expected a contiguous tensor"),
        }
    }

    fn u32s<'a>(s: &'a CpuStorage, l: &Layout, op: &str) -> Result<&'a [u32]> {
        let CpuStorage::U32(v) = s else {
            bail!("{op}: expected u32")
        };
        match l.contiguous_offsets() {
            Some((a, b)) => Ok(&v[a..b]),
            None => bail!("{op}: expected a contiguous tensor"),
        }
    }

    fn min_rows(row: usize) -> usize {
        (MIN_TASK / row.max(1)).max(1)
    }

    /// sqrt(2 / pi).
    const GELU_K: f32 = 0.797_884_6;

    /// gelu_new(x) and its derivative, with the engine's vectorisable tanh (libm's tanhf was a
    /// quarter of a training step).
    #[inline(always)]
    fn gelu_and_grad(x: f32) -> (f32, f32) {
        let t = crate::cpu::ops::tanh(GELU_K * (x + 0.044715 * x * x * x));
        let y = 0.5 * x * (1.0 + t);
        let dy =
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * 0.044715 * x * x);
        (y, dy)
    }

    /// transformers' gelu_new (tanh approximation) of x + bias: (x [N, f], bias [f]) -> [N, f].
    pub struct BiasGelu;

    impl CustomOp2 for BiasGelu {
        fn name(&self) -> &'static str {
            "bias-gelu-new"
        }

        fn cpu_fwd(
            &self,
            s1: &CpuStorage,
            l1: &Layout,
            s2: &CpuStorage,
            l2: &Layout,
        ) -> Result<(CpuStorage, Shape)> {
            let (x, b) = (f32s(s1, l1, self.name())?, f32s(s2, l2, self.name())?);
            let f = b.len();
            if l1.dims()[l1.dims().len() - 1] != f {
                bail!("bias-gelu: shapes {:?} {:?}", l1.dims(), l2.dims());
            }
            let mut out = vec![0f32; x.len()];
            out.par_chunks_mut(f)
                .zip(x.par_chunks(f))
                .with_min_len(min_rows(f))
                .for_each(|(o, x)| {
                    for ((o, &x), &b) in o.iter_mut().zip(x).zip(b) {
                        *o = gelu_and_grad(x + b).0;
                    }
                });
            Ok((CpuStorage::F32(out), l1.shape().clone()))
        }

        fn bwd(
            &self,
            x: &Tensor,
            b: &Tensor,
            _res: &Tensor,
            grad: &Tensor,
        ) -> Result<(Option<Tensor>, Option<Tensor>)> {
            let n = x.elem_count() / b.elem_count();
            let all = x.apply_op3_no_bwd(b, &grad.contiguous()?, &BiasGeluBwd)?;
            let dx = all.narrow(0, 0, n)?.reshape(x.shape())?;
            let db = all.narrow(0, n, 1)?.reshape(b.shape())?;
            Ok((Some(dx), Some(db)))
        }
    }

    /// (x [N, f], bias [f], dy [N, f]) -> [N + 1, f]: dx = dy * gelu_new'(x + bias) in rows 0..N,
    /// d bias (the column sums of dx) in row N.
    struct BiasGeluBwd;

    impl CustomOp3 for BiasGeluBwd {
        fn name(&self) -> &'static str {
            "bias-gelu-new-bwd"
        }

        fn cpu_fwd(
            &self,
            s1: &CpuStorage,
            l1: &Layout,
            s2: &CpuStorage,
            l2: &Layout,
            s3: &CpuStorage,
            l3: &Layout,
        ) -> Result<(CpuStorage, Shape)> {
            let x = f32s(s1, l1, self.name())?;
            let b = f32s(s2, l2, self.name())?;
            let g = f32s(s3, l3, self.name())?;
            let f = b.len();
            let n = x.len() / f;
            let mut out = vec![0f32; (n + 1) * f];
            let (dx, db) = out.split_at_mut(n * f);
            dx.par_chunks_mut(f)
                .zip(x.par_chunks(f).zip(g.par_chunks(f)))
                .with_min_len(min_rows(f))
                .for_each(|(o, (x, g))| {
                    for (((o, &x), &g), &b) in o.iter_mut().zip(x).zip(g).zip(b) {
                        *o = g * gelu_and_grad(x + b).1;
                    }
                });
            column_sums(dx, db);
            Ok((CpuStorage::F32(out), Shape::from((n + 1, f))))
        }
    }

    /// out[c] = sum over rows r of x[r, c] (rows in order: deterministic).
    fn column_sums(x: &[f32], out: &mut [f32]) {
        for row in x.chunks(out.len()) {
            for (o, &v) in out.iter_mut().zip(row) {
                *o += v;
            }
        }
    }

    /// Causal softmax over the last dim of [.., T, T]: row i of each matrix over columns 0..=i,
    /// zeros above the diagonal (the key comes after the query).
    pub struct CausalSoftmax;

    impl CustomOp1 for CausalSoftmax {
        fn name(&self) -> &'static str {
            "causal-softmax"
        }

        fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
            let x = f32s(s, l, self.name())?;
            let dims = l.dims();
            let t = dims[dims.len() - 1];
            if dims.len() < 2 || dims[dims.len() - 2] != t {
                bail!("causal-softmax: expected [.., T, T], got {dims:?}");
            }
            let mut out = vec![0f32; x.len()];
            out.par_chunks_mut(t)
                .zip(x.par_chunks(t))
                .enumerate()
                .with_min_len(min_rows(t))
                .for_each(|(r, (o, x))| {
                    let n = r % t + 1;
                    let max = x[..n].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut sum = 0f32;
                    for (o, &x) in o[..n].iter_mut().zip(&x[..n]) {
                        *o = (x - max).exp();
                        sum += *o;
                    }
                    let inv = 1.0 / sum;
                    o[..n].iter_mut().for_each(|o| *o *= inv);
                });
            Ok((CpuStorage::F32(out), l.shape().clone()))
        }

        fn bwd(&self, _arg: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
            Ok(Some(
                res.apply_op2_no_bwd(&grad.contiguous()?, &SoftmaxBwd)?,
            ))
        }
    }

    /// (y, dy) -> y * (dy - sum(dy * y)) per row (the softmax backward).
    struct SoftmaxBwd;

    impl CustomOp2 for SoftmaxBwd {
        fn name(&self) -> &'static str {
            "softmax-bwd"
        }

        fn cpu_fwd(
            &self,
            s1: &CpuStorage,
            l1: &Layout,
            s2: &CpuStorage,
            l2: &Layout,
        ) -> Result<(CpuStorage, Shape)> {
            let (y, g) = (f32s(s1, l1, self.name())?, f32s(s2, l2, self.name())?);
            let t = l1.dims()[l1.dims().len() - 1];
            let mut out = vec![0f32; y.len()];
            out.par_chunks_mut(t)
                .zip(y.par_chunks(t).zip(g.par_chunks(t)))
                .with_min_len(min_rows(t))
                .for_each(|(o, (y, g))| {
                    let dot: f32 = y.iter().zip(g).map(|(y, g)| y * g).sum();
                    for ((o, &y), &g) in o.iter_mut().zip(y).zip(g) {
                        *o = y * (g - dot);
                    }
                });
            Ok((CpuStorage::F32(out), l1.shape().clone()))
        }
    }

    /// LayerNorm over the last dim (biased variance, as torch): (x [N, d], weight [d], bias [d]).
    pub struct LayerNorm {
        pub eps: f64,
    }

    /// Mean and 1/sqrt(var + eps) of a row, accumulated in f64.
    fn row_stats(x: &[f32], eps: f64) -> (f32, f32) {
        let n = x.len() as f64;
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        (mean as f32, (1.0 / (var + eps).sqrt()) as f32)
    }

    impl CustomOp3 for LayerNorm {
        fn name(&self) -> &'static str {
            "layer-norm"
        }

        fn cpu_fwd(
            &self,
            s1: &CpuStorage,
            l1: &Layout,
            s2: &CpuStorage,
            l2: &Layout,
            s3: &CpuStorage,
            l3: &Layout,
        ) -> Result<(CpuStorage, Shape)> {
            let x = f32s(s1, l1, self.name())?;
            let (w, b) = (f32s(s2, l2, self.name())?, f32s(s3, l3, self.name())?);
            let d = w.len();
            if b.len() != d || l1.dims()[l1.dims().len() - 1] != d {
                bail!(
                    "layer-norm: shapes {:?} {:?} {:?}",
                    l1.dims(),
                    l2.dims(),
                    l3.dims()
                );
            }
            let mut out = vec![0f32; x.len()];
            out.par_chunks_mut(d)
                .zip(x.par_chunks(d))
                .with_min_len(min_rows(d))
                .for_each(|(o, x)| {
                    let (mean, inv) = row_stats(x, self.eps);
                    for c in 0..d {
                        o[c] = (x[c] - mean) * inv * w[c] + b[c];
                    }
                });
            Ok((CpuStorage::F32(out), l1.shape().clone()))
        }

        fn bwd(
            &self,
            x: &Tensor,
            w: &Tensor,
            _b: &Tensor,
            _res: &Tensor,
            grad: &Tensor,
        ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
            let n = x.elem_count() / w.elem_count();
            let all =
                x.apply_op3_no_bwd(w, &grad.contiguous()?, &LayerNormBwd { eps: self.eps })?;
            let dx = all.narrow(0, 0, n)?.reshape(x.shape())?;
            let dw = all.narrow(0, n, 1)?.reshape(w.shape())?;
            let db = all.narrow(0, n + 1, 1)?.reshape(w.shape())?;
            Ok((Some(dx), Some(dw), Some(db)))
        }
    }

    /// (x [N, d], weight [d], dy [N, d]) -> [N + 2, d]: dx in rows 0..N, d weight in row N, d bias
    /// in row N + 1 (one op returns one tensor; the backward narrows it).
    struct LayerNormBwd {
        eps: f64,
    }

    impl CustomOp3 for LayerNormBwd {
        fn name(&self) -> &'static str {
            "layer-norm-bwd"
        }

        fn cpu_fwd(
            &self,
            s1: &CpuStorage,
            l1: &Layout,
            s2: &CpuStorage,
            l2: &Layout,
            s3: &CpuStorage,
            l3: &Layout,
        ) -> Result<(CpuStorage, Shape)> {
            let x = f32s(s1, l1, self.name())?;
            let w = f32s(s2, l2, self.name())?;
            let g = f32s(s3, l3, self.name())?;
            let d = w.len();
            let n = x.len() / d;
            let mut out = vec![0f32; (n + 2) * d];
            let (dx, dwb) = out.split_at_mut(n * d);
            let stats: Vec<(f32, f32)> = dx
                .par_chunks_mut(d)
                .zip(x.par_chunks(d).zip(g.par_chunks(d)))
                .with_min_len(min_rows(d))
                .map(|(o, (x, g))| {
                    let (mean, inv) = row_stats(x, self.eps);
                    let (mut mg, mut mgx) = (0f32, 0f32);
                    for c in 0..d {
                        let gy = g[c] * w[c];
                        mg += gy;
                        mgx += gy * (x[c] - mean) * inv;
                    }
                    let (mg, mgx) = (mg / d as f32, mgx / d as f32);
                    for c in 0..d {
                        let xhat = (x[c] - mean) * inv;
                        o[c] = inv * (g[c] * w[c] - mg - xhat * mgx);
                    }
                    (mean, inv)
                })
                .collect();
            let (dw, db) = dwb.split_at_mut(d);
            for (r, &(mean, inv)) in stats.iter().enumerate() {
                let (x, g) = (&x[r * d..(r + 1) * d], &g[r * d..(r + 1) * d]);
                for c in 0..d {
                    dw[c] += g[c] * (x[c] - mean) * inv;
                    db[c] += g[c];
                }
            }
            Ok((CpuStorage::F32(out), Shape::from((n + 2, d))))
        }
    }

    /// GPT-J's "rotate every two" on the first `2 * half` dims of each head of [B, T, H, hd], at
    /// positions 0..T: the pair (x[2i], x[2i+1]) turns by +angle (or -angle when `inverse`, the
    /// transpose, which is the backward). `cos`/`sin` are [n_positions, half].
    #[derive(Clone)]
    pub struct Rotary {
        pub cos: Arc<Vec<f32>>,
        pub sin: Arc<Vec<f32>>,
        pub half: usize,
        pub inverse: bool,
    }

    impl CustomOp1 for Rotary {
        fn name(&self) -> &'static str {
            "rotary-gptj"
        }

        fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
            let x = f32s(s, l, self.name())?;
            let &[_, t, h, hd] = l.dims() else {
                bail!("rotary: expected [B, T, H, hd], got {:?}", l.dims())
            };
            let half = self.half;
            if 2 * half > hd || t * half > self.cos.len() {
                bail!("rotary: {half} pairs, head dim {hd}, {t} positions: tables too small");
            }
            let sign = if self.inverse { -1.0 } else { 1.0 };
            let row = h * hd;
            let mut out = x.to_vec();
            out.par_chunks_mut(row)
                .enumerate()
                .with_min_len(min_rows(row))
                .for_each(|(r, o)| {
                    let pos = r % t;
                    let (cos, sin) = (
                        &self.cos[pos * half..(pos + 1) * half],
                        &self.sin[pos * half..(pos + 1) * half],
                    );
                    for head in o.chunks_mut(hd) {
                        for i in 0..half {
                            let (a, b) = (head[2 * i], head[2 * i + 1]);
                            let (c, s) = (cos[i], sign * sin[i]);
                            head[2 * i] = a * c - b * s;
                            head[2 * i + 1] = b * c + a * s;
                        }
                    }
                });
            Ok((CpuStorage::F32(out), l.shape().clone()))
        }

        fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
            let inverse = Rotary {
                inverse: !self.inverse,
                ..self.clone()
            };
            Ok(Some(grad.contiguous()?.apply_op1_no_bwd(&inverse)?))
        }
    }

    /// Per-row cross-entropy: (logits [M, V], targets [M] u32) -> logsumexp(row) - row[target]: [M].
    pub struct CrossEntropy;

    impl CustomOp2 for CrossEntropy {
        fn name(&self) -> &'static str {
            "cross-entropy"
        }

        fn cpu_fwd(
            &self,
            s1: &CpuStorage,
            l1: &Layout,
            s2: &CpuStorage,
            l2: &Layout,
        ) -> Result<(CpuStorage, Shape)> {
            let z = f32s(s1, l1, self.name())?;
            let targets = u32s(s2, l2, self.name())?;
            let v = l1.dims()[l1.dims().len() - 1];
            if z.len() != targets.len() * v {
                bail!(
                    "cross-entropy: logits {:?}, targets {:?}",
                    l1.dims(),
                    l2.dims()
                );
            }
            let out: Vec<f32> = z
                .par_chunks(v)
                .zip(targets.par_iter())
                .with_min_len(min_rows(v))
                .map(|(z, &t)| {
                    let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let sum: f32 = z.iter().map(|&z| (z - max).exp()).sum();
                    sum.ln() + max - z[t as usize]
                })
                .collect();
            Ok((CpuStorage::F32(out), Shape::from(targets.len())))
        }

        fn bwd(
            &self,
            logits: &Tensor,
            targets: &Tensor,
            _res: &Tensor,
            grad: &Tensor,
        ) -> Result<(Option<Tensor>, Option<Tensor>)> {
            let d = logits.apply_op3_no_bwd(targets, &grad.contiguous()?, &CrossEntropyBwd)?;
            Ok((Some(d), None))
        }
    }

    /// (logits [M, V], targets [M], dloss [M]) -> dloss_r * (softmax(row) - onehot(target)).
    struct CrossEntropyBwd;

    impl CustomOp3 for CrossEntropyBwd {
        fn name(&self) -> &'static str {
            "cross-entropy-bwd"
        }

        fn cpu_fwd(
            &self,
            s1: &CpuStorage,
            l1: &Layout,
            s2: &CpuStorage,
            l2: &Layout,
            s3: &CpuStorage,
            l3: &Layout,
        ) -> Result<(CpuStorage, Shape)> {
            let z = f32s(s1, l1, self.name())?;
            let targets = u32s(s2, l2, self.name())?;
            let g = f32s(s3, l3, self.name())?;
            let v = l1.dims()[l1.dims().len() - 1];
            let mut out = vec![0f32; z.len()];
            out.par_chunks_mut(v)
                .zip(z.par_chunks(v).zip(targets.par_iter().zip(g.par_iter())))
                .with_min_len(min_rows(v))
                .for_each(|(o, (z, (&t, &g)))| {
                    let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut sum = 0f32;
                    for (o, &z) in o.iter_mut().zip(z) {
                        *o = (z - max).exp();
                        sum += *o;
                    }
                    let k = g / sum;
                    o.iter_mut().for_each(|o| *o *= k);
                    o[t as usize] -= g;
                });
            Ok((CpuStorage::F32(out), l1.shape().clone()))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Model

struct Block {
    ln_1_w: Var,
    ln_1_b: Var,
    q: Var,
    k: Var,
    v: Var,
    out: Var,
    fc_in_w: Var,
    fc_in_b: Var,
    fc_out_w: Var,
    fc_out_b: Var,
}

/// GPT-J's parameters as candle `Var`s, with the forward pass used for training.
pub struct TrainModel {
    config: GptjConfig,
    /// Every parameter under its HF name, in `expected_tensors` order.
    named: Vec<(String, Var)>,
    wte: Var,
    blocks: Vec<Block>,
    ln_f_w: Var,
    ln_f_b: Var,
    lm_head_w: Var,
    lm_head_b: Var,
    /// Rotary tables for positions 0..n_positions, built in f64 and rounded once.
    rotary: fused::Rotary,
}

/// Log-softmax over the last dim from primitives.
fn log_softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let z = x.broadcast_sub(&max)?;
    let lse = z.exp()?.sum_keepdim(D::Minus1)?.log()?;
    Ok(z.broadcast_sub(&lse)?)
}

/// x W^T (+ b) with W in PyTorch's [out, in] layout: [N, in] -> [N, out].
fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let y = x.matmul(&w.t()?)?;
    Ok(match b {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    })
}

impl TrainModel {
    /// Weights drawn from `seed` with toolsift's SplitMix64, tensor by tensor in HF order:
    /// normal(0, 0.02) for embeddings and matrices, out_proj and fc_out scaled by
    /// 1/sqrt(2 n_layer) (GPT-2's residual scaling), LayerNorm weights 1, biases 0.
    pub fn init(config: &GptjConfig, seed: u64) -> Result<Self> {
        let mut rng = Rng::new(seed);
        let resid_std = 0.02 / (2.0 * config.n_layer as f64).sqrt();
        let mut values = Vec::new();
        for (name, shape) in expected_tensors(config) {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = if name.ends_with("ln_1.weight") || name.ends_with("ln_f.weight") {
                vec![1.0; n]
            } else if name.ends_with(".bias") {
                vec![0.0; n]
            } else {
                let std = if name.ends_with("out_proj.weight") || name.ends_with("fc_out.weight") {
                    resid_std
                } else {
                    0.02
                };
                (0..n).map(|_| (rng.normal() as f64 * std) as f32).collect()
            };
            values.push((name, shape, data));
        }
        Self::from_values(config, values)
    }

    /// A model from the weights of a loaded checkpoint (any storage dtype, converted to f32).
    pub fn from_weights(config: &GptjConfig, weights: &crate::model::GptjWeights) -> Result<Self> {
        let values = weights
            .named_tensors(config)
            .into_iter()
            .map(|(name, t)| (name, t.shape().to_vec(), t.to_f32()))
            .collect();
        Self::from_values(config, values)
    }

    fn from_values(
        config: &GptjConfig,
        values: Vec<(String, Vec<usize>, Vec<f32>)>,
    ) -> Result<Self> {
        config.validate().map_err(|e| anyhow!("config: {e}"))?;
        let device = Device::Cpu;
        let mut named = Vec::with_capacity(values.len());
        for (name, shape, data) in values {
            let var = Var::from_tensor(&Tensor::from_vec(data, shape, &device)?)?;
            named.push((name, var));
        }
        let by_name: HashMap<&str, &Var> = named.iter().map(|(n, v)| (n.as_str(), v)).collect();
        let get = |name: &str| -> Result<Var> {
            by_name
                .get(name)
                .map(|v| (*v).clone())
                .ok_or_else(|| anyhow!("no tensor {name}"))
        };
        let blocks = (0..config.n_layer)
            .map(|i| {
                let p = format!("transformer.h.{i}");
                Ok(Block {
                    ln_1_w: get(&format!("{p}.ln_1.weight"))?,
                    ln_1_b: get(&format!("{p}.ln_1.bias"))?,
                    q: get(&format!("{p}.attn.q_proj.weight"))?,
                    k: get(&format!("{p}.attn.k_proj.weight"))?,
                    v: get(&format!("{p}.attn.v_proj.weight"))?,
                    out: get(&format!("{p}.attn.out_proj.weight"))?,
                    fc_in_w: get(&format!("{p}.mlp.fc_in.weight"))?,
                    fc_in_b: get(&format!("{p}.mlp.fc_in.bias"))?,
                    fc_out_w: get(&format!("{p}.mlp.fc_out.weight"))?,
                    fc_out_b: get(&format!("{p}.mlp.fc_out.bias"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // The engine's own table, so training and inference rotate by the same f32 values.
        let table = RotaryTable::new(config.n_positions, config.rotary_dim());
        Ok(TrainModel {
            config: config.clone(),
            wte: get("transformer.wte.weight")?,
            ln_f_w: get("transformer.ln_f.weight")?,
            ln_f_b: get("transformer.ln_f.bias")?,
            lm_head_w: get("lm_head.weight")?,
            lm_head_b: get("lm_head.bias")?,
            blocks,
            named,
            rotary: fused::Rotary {
                cos: Arc::new(table.cos),
                sin: Arc::new(table.sin),
                half: table.half,
                inverse: false,
            },
        })
    }

    pub fn config(&self) -> &GptjConfig {
        &self.config
    }

    /// Every parameter under its HF name.
    pub fn named_vars(&self) -> &[(String, Var)] {
        &self.named
    }

    /// The weights as checkpoint tensors (f32) under their HF names.
    pub fn named_tensors(&self) -> Result<Vec<(String, CheckpointTensor)>> {
        self.named
            .iter()
            .map(|(name, var)| {
                let t = var.as_tensor();
                let values = t.flatten_all()?.to_vec1::<f32>()?;
                Ok((
                    name.clone(),
                    CheckpointTensor::from_f32(t.dims().to_vec(), &values),
                ))
            })
            .collect()
    }

    /// Final hidden states (after ln_f) of right-padded ids [B, T] (u32): [B * T, n_embd]. Every
    /// row starts at position 0 and only the causal mask applies, so padding after a sequence
    /// cannot affect it.
    pub fn hidden(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        ensure!(
            t <= self.config.n_positions,
            "{t} tokens, n_positions is {}",
            self.config.n_positions
        );
        let mut x = self.wte.index_select(&ids.flatten_all()?, 0)?; // [N, d]
        for blk in &self.blocks {
            let h = self.layer_norm(&x, &blk.ln_1_w, &blk.ln_1_b)?; // [N, d]
            let attn = self.attention(&h, blk, b, t)?; // [N, d]
            let inner = linear(&h, &blk.fc_in_w, None)?.apply_op2(&blk.fc_in_b, fused::BiasGelu)?;
            let mlp = linear(&inner, &blk.fc_out_w, Some(&blk.fc_out_b))?; // [N, d]
            x = ((x + attn)? + mlp)?; // parallel residual
        }
        self.layer_norm(&x, &self.ln_f_w, &self.ln_f_b)
    }

    fn layer_norm(&self, x: &Tensor, w: &Var, b: &Var) -> Result<Tensor> {
        let eps = self.config.layer_norm_epsilon;
        Ok(x.apply_op3(w.as_tensor(), b.as_tensor(), fused::LayerNorm { eps })?)
    }

    /// LM-head logits of hidden rows: [M, n_embd] -> [M, vocab_size].
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        linear(hidden, &self.lm_head_w, Some(&self.lm_head_b))
    }

    /// Causal self-attention (no biases) and out_proj: [B * T, d] -> [B * T, d].
    fn attention(&self, h: &Tensor, blk: &Block, b: usize, t: usize) -> Result<Tensor> {
        let c = &self.config;
        let (n_head, head_dim, d) = (c.n_head, c.head_dim(), c.n_embd);
        let scale = 1.0 / (head_dim as f64).sqrt();
        let split = |x: Tensor| x.reshape((b, t, n_head, head_dim)); // [B, T, H, hd]
        let q = self.rotary(&split(linear(h, &blk.q, None)?)?)?;
        let q = (q.transpose(1, 2)? * scale)?; // [B, H, T, hd], contiguous
        let k = self.rotary(&split(linear(h, &blk.k, None)?)?)?;
        let k = k.transpose(1, 2)?.contiguous()?; // [B, H, T, hd]
        let v = split(linear(h, &blk.v, None)?)?
            .transpose(1, 2)?
            .contiguous()?; // [B, H, T, hd]
        let scores = q.matmul(&k.t()?)?; // [B, H, T, T]
        let probs = scores.apply_op1(fused::CausalSoftmax)?; // zeros above the diagonal
        let ctx = probs
            .matmul(&v)? // [B, H, T, hd]
            .transpose(1, 2)? // [B, T, H, hd]
            .reshape((b * t, d))?;
        linear(&ctx, &blk.out, None)
    }

    /// "Rotate every two" on the first rotary_dim dims of each head, positions 0..T:
    /// [B, T, H, hd] -> [B, T, H, hd].
    fn rotary(&self, x: &Tensor) -> Result<Tensor> {
        if self.rotary.half == 0 {
            return Ok(x.clone());
        }
        Ok(x.contiguous()?.apply_op1(self.rotary.clone())?)
    }

    /// Mean cross-entropy of a batch: the hidden state of each (row, position) in `rows` (flat
    /// indices into [B * T]) predicts the matching `targets` id.
    pub fn loss(&self, batch: &Batch) -> Result<Tensor> {
        let hidden = self.hidden(&batch.ids)?; // [B * T, d]
        let picked = hidden.index_select(&batch.rows, 0)?; // [M, d]
        let logits = self.logits(&picked)?; // [M, V]
        let per_row = logits.apply_op2(&batch.targets, fused::CrossEntropy)?; // [M]
        Ok(per_row.mean_all()?)
    }

    /// log p(v | ids[0..=i]) for every position i and id v, one sequence: [n, vocab_size] as rows.
    pub fn log_softmax(&self, ids: &[u32]) -> Result<Vec<Vec<f32>>> {
        let ids = Tensor::from_slice(ids, (1, ids.len()), &Device::Cpu)?;
        let lp = log_softmax_last_dim(&self.logits(&self.hidden(&ids)?)?)?;
        Ok(lp.to_vec2::<f32>()?)
    }
}

// ---------------------------------------------------------------------------------------------
// Data

/// One padded batch: ids [B, T] (u32, right-padded), the flat rows that predict and their targets.
pub struct Batch {
    pub ids: Tensor,
    /// Flat indices into [B * T] of the positions that have a next token: [M] u32.
    pub rows: Tensor,
    /// The next token of each of those positions: [M] u32.
    pub targets: Tensor,
    pub tokens: usize,
    pub padded_len: usize,
}

impl Batch {
    /// Sequences `seqs[i]` for i in `idx`, inputs `s[..n-1]`, targets `s[1..]`, padded with `pad`.
    pub fn new(seqs: &[Vec<u32>], idx: &[usize], pad: u32) -> Result<Self> {
        let t = idx.iter().map(|&i| seqs[i].len() - 1).max().unwrap_or(0);
        ensure!(t > 0, "a batch needs sequences of at least 2 tokens");
        let mut ids = Vec::with_capacity(idx.len() * t);
        let mut rows = Vec::new();
        let mut targets = Vec::new();
        for (r, &i) in idx.iter().enumerate() {
            let s = &seqs[i];
            let n = s.len() - 1;
            ids.extend_from_slice(&s[..n]);
            ids.extend(std::iter::repeat_n(pad, t - n));
            rows.extend((0..n).map(|p| (r * t + p) as u32));
            targets.extend_from_slice(&s[1..]);
        }
        let m = rows.len();
        Ok(Batch {
            ids: Tensor::from_vec(ids, (idx.len(), t), &Device::Cpu)?,
            rows: Tensor::from_vec(rows, m, &Device::Cpu)?,
            targets: Tensor::from_vec(targets, m, &Device::Cpu)?,
            tokens: m,
            padded_len: t,
        })
    }
}

fn shuffle<T>(v: &mut [T], rng: &mut Rng) {
    for i in (1..v.len()).rev() {
        v.swap(i, rng.range(0, i));
    }
}

/// One epoch's batches: shuffle, cut into buckets of `batch * bucket_batches`, sort each bucket by
/// length (stable) and cut it into batches, shuffle the batches.
pub fn epoch_batches(
    lens: &[usize],
    batch: usize,
    bucket_batches: usize,
    rng: &mut Rng,
) -> Vec<Vec<usize>> {
    let mut idx: Vec<usize> = (0..lens.len()).collect();
    shuffle(&mut idx, rng);
    let mut batches = Vec::new();
    for bucket in idx.chunks(batch * bucket_batches.max(1)) {
        let mut bucket = bucket.to_vec();
        bucket.sort_by_key(|&i| lens[i]);
        batches.extend(bucket.chunks(batch).map(<[usize]>::to_vec));
    }
    shuffle(&mut batches, rng);
    batches
}

/// Pieces tokenized separately (no special tokens) and concatenated.
pub fn encode_pieces(tok: &crate::model::Tokenizer, pieces: &[String]) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    for p in pieces {
        ids.extend(tok.encode_ids(p)?);
    }
    Ok(ids)
}

// ---------------------------------------------------------------------------------------------
// Training

/// The optimizer: AdamW with weight decay on matrices and embeddings, one without on biases and
/// LayerNorms, both on the same schedule.
pub struct Optim {
    decay: AdamW,
    no_decay: AdamW,
    vars: Vec<Var>,
    clip: f64,
}

impl Optim {
    pub fn new(model: &TrainModel, o: &TrainOptions) -> Result<Self> {
        let params = |weight_decay| ParamsAdamW {
            lr: o.lr,
            beta1: o.beta1,
            beta2: o.beta2,
            eps: o.adam_eps,
            weight_decay,
        };
        let (mut decay, mut no_decay) = (Vec::new(), Vec::new());
        for (_, var) in model.named_vars() {
            if var.rank() >= 2 {
                decay.push(var.clone());
            } else {
                no_decay.push(var.clone());
            }
        }
        Ok(Optim {
            decay: AdamW::new(decay, params(o.weight_decay))?,
            no_decay: AdamW::new(no_decay, params(0.0))?,
            vars: model.named_vars().iter().map(|(_, v)| v.clone()).collect(),
            clip: o.grad_clip,
        })
    }

    /// Clips the global gradient norm, then steps both optimizers at `lr`. Returns the norm
    /// before clipping.
    pub fn step(&mut self, grads: &mut GradStore, lr: f64) -> Result<f64> {
        let mut sq = 0f64;
        for var in &self.vars {
            if let Some(g) = grads.get(var) {
                sq += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
            }
        }
        let norm = sq.sqrt();
        if self.clip > 0.0 && norm > self.clip {
            let s = self.clip / norm;
            for var in &self.vars {
                if let Some(g) = grads.remove(var) {
                    grads.insert(var, (g * s)?);
                }
            }
        }
        self.decay.set_learning_rate(lr);
        self.no_decay.set_learning_rate(lr);
        self.decay.step(grads)?;
        self.no_decay.step(grads)?;
        Ok(norm)
    }
}

/// Seconds spent in each phase of a step.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PhaseTimes {
    pub batch: f64,
    pub forward: f64,
    pub backward: f64,
    pub optimizer: f64,
}

impl PhaseTimes {
    pub fn total(&self) -> f64 {
        self.batch + self.forward + self.backward + self.optimizer
    }

    fn add(&mut self, o: &PhaseTimes) {
        self.batch += o.batch;
        self.forward += o.forward;
        self.backward += o.backward;
        self.optimizer += o.optimizer;
    }

    fn scaled(&self, s: f64) -> PhaseTimes {
        PhaseTimes {
            batch: self.batch * s,
            forward: self.forward * s,
            backward: self.backward * s,
            optimizer: self.optimizer * s,
        }
    }
}

/// One optimizer step on `batch`: (loss, gradient norm, phase times).
pub fn train_step(
    model: &TrainModel,
    optim: &mut Optim,
    batch: &Batch,
    lr: f64,
) -> Result<(f32, f64, PhaseTimes)> {
    let mut times = PhaseTimes::default();
    let t0 = Instant::now();
    let loss = model.loss(batch)?;
    let loss_value = loss.to_scalar::<f32>()?;
    ensure!(loss_value.is_finite(), "loss is {loss_value}");
    let t1 = Instant::now();
    let mut grads = loss.backward()?;
    let t2 = Instant::now();
    let norm = optim.step(&mut grads, lr)?;
    let t3 = Instant::now();
    times.forward = (t1 - t0).as_secs_f64();
    times.backward = (t2 - t1).as_secs_f64();
    times.optimizer = (t3 - t2).as_secs_f64();
    Ok((loss_value, norm, times))
}

/// One logged point of training.
#[derive(Debug, Clone, Serialize)]
pub struct LogEntry {
    /// Steps done (1-based).
    pub step: usize,
    /// Mean loss of the steps since the previous entry.
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    /// Mean wall seconds per step since the previous entry, and by phase.
    pub step_s: f64,
    pub phases: PhaseTimes,
    /// Mean padded length and real tokens per batch since the previous entry.
    pub padded_len: f64,
    pub tokens: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct DataStats {
    pub docs: usize,
    pub sequences: usize,
    pub dropped_short: usize,
    pub truncated: usize,
    pub tokens: usize,
    pub mean_len: f64,
    pub max_len: usize,
    pub tokenizer_size: usize,
    pub eot_id: u32,
}

/// training.json: what was run and what came out.
#[derive(Debug, Clone, Serialize)]
pub struct TrainReport {
    pub command: String,
    pub seed: u64,
    pub steps: usize,
    pub threads: usize,
    pub options: TrainOptions,
    pub config: GptjConfig,
    pub n_params: usize,
    pub data: DataStats,
    pub losses: Vec<LogEntry>,
    /// The loss of every step, in order (for determinism checks).
    pub step_losses: Vec<f32>,
    pub tokenizer_s: f64,
    pub train_s: f64,
    pub mean_step_s: f64,
    pub wall_s: f64,
    /// candle against the f64 reference on the written folder.
    pub reference: ReferenceCheck,
}

/// Writes config.json in Hugging Face's GPTJConfig format (the keys of the tiny fixture).
pub fn write_config(dir: &Path, c: &GptjConfig, eot: u32) -> Result<()> {
    let v = serde_json::json!({
        "activation_function": c.activation_function,
        "architectures": ["GPTJForCausalLM"],
        "attn_pdrop": 0.0,
        "bos_token_id": eot,
        "embd_pdrop": 0.0,
        "eos_token_id": eot,
        "initializer_range": 0.02,
        "layer_norm_epsilon": c.layer_norm_epsilon,
        "model_type": "gptj",
        "n_embd": c.n_embd,
        "n_head": c.n_head,
        "n_inner": c.n_inner,
        "n_layer": c.n_layer,
        "n_positions": c.n_positions,
        "pad_token_id": eot,
        "resid_pdrop": 0.0,
        "rotary_dim": c.rotary_dim,
        "tie_word_embeddings": c.tie_word_embeddings,
        "torch_dtype": "float32",
        "use_cache": true,
        "vocab_size": c.vocab_size,
    });
    let path = dir.join("config.json");
    std::fs::write(&path, serde_json::to_string_pretty(&v)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

/// The reference check's result: candle's log-probs against the f64 oracle's.
#[derive(Debug, Clone, Serialize)]
pub struct ReferenceCheck {
    pub sequences: usize,
    /// Positions compared, each over all vocab_size ids.
    pub positions: usize,
    /// max |log p candle - log p f64| over every position and id.
    pub max_abs_diff: f64,
    /// Where it is: (sequence, position, id) and the f64 log p there.
    pub worst: (usize, usize, u32),
    pub worst_log_p: f64,
    /// The same maximum over the entries with an f64 log p >= -20 (the ids a sampler can draw):
    /// f32 rounding grows with |log p|, so the improbable ids carry the largest differences.
    pub max_abs_diff_likely: f64,
    /// For scale: max |log p - log p f64| of toolsift's own f32 CPU engine (`cpu::CpuScorer`) on
    /// the same folder and sequences, and max |log p candle - log p engine|.
    pub engine_vs_reference: f64,
    pub candle_vs_engine: f64,
}

impl ReferenceCheck {
    /// The gate: candle within 1e-4 of the f64 reference, or (a longer-trained model's larger
    /// logits carry larger f32 rounding) no farther from it than twice toolsift's own f32 engine
    /// is. A different architecture is off by orders of magnitude more (0.1 and up).
    pub fn passes(&self) -> bool {
        self.max_abs_diff <= 1e-4 || self.max_abs_diff <= 2.0 * self.engine_vs_reference
    }

    /// One line for the log.
    pub fn describe(&self, vocab_size: usize) -> String {
        format!(
            "reference check: {} sequences ({} positions x {vocab_size} ids): max |log p candle - \
             log p f64| = {:.3e} (at sequence {} position {} id {}, log p {:.2}); {:.3e} where log p >= \
             -20; toolsift's f32 CPU engine vs f64: {:.3e}, candle vs the engine: {:.3e}",
            self.sequences,
            self.positions,
            self.max_abs_diff,
            self.worst.0,
            self.worst.1,
            self.worst.2,
            self.worst_log_p,
            self.max_abs_diff_likely,
            self.engine_vs_reference,
            self.candle_vs_engine
        )
    }
}

/// Loads `dir` with `Model::load` and compares the f64 reference's log-probs with this model's
/// candle forward, at every position of `seqs` and over every id.
pub fn check_against_reference(
    dir: &Path,
    model: &TrainModel,
    seqs: &[Vec<u32>],
) -> Result<ReferenceCheck> {
    let loaded = crate::Model::load(dir)?;
    ensure!(
        &loaded.config == model.config(),
        "config.json reads back as {:?}, trained {:?}",
        loaded.config,
        model.config()
    );
    let reference = crate::reference::ReferenceModel::new(&loaded.config, &loaded.weights);
    let engine = crate::cpu::CpuScorer::new(&loaded);
    let all_ids: Vec<u32> = (0..loaded.config.vocab_size as u32).collect();
    let mut check = ReferenceCheck {
        sequences: seqs.len(),
        positions: 0,
        max_abs_diff: 0.0,
        worst: (0, 0, 0),
        worst_log_p: 0.0,
        max_abs_diff_likely: 0.0,
        engine_vs_reference: 0.0,
        candle_vs_engine: 0.0,
    };
    for (k, s) in seqs.iter().enumerate() {
        let r = reference.log_softmax(s);
        let c = model.log_softmax(s)?;
        let e = crate::sample::Sampler::token_log_probs(&engine, s, &all_ids)?;
        for (i, (row, erow)) in c.iter().zip(&e).enumerate() {
            for ((a, b), x) in row.iter().zip(r.row(i)).zip(erow) {
                let (a, x) = (*a as f64, *x as f64);
                check.engine_vs_reference = check.engine_vs_reference.max((x - b).abs());
                check.candle_vs_engine = check.candle_vs_engine.max((a - x).abs());
            }
            for (id, (a, b)) in row.iter().zip(r.row(i)).enumerate() {
                let d = (*a as f64 - b).abs();
                // NaN counts as the worst difference.
                if d.is_nan() || d > check.max_abs_diff {
                    check.max_abs_diff = if d.is_nan() { f64::INFINITY } else { d };
                    check.worst = (k, i, id as u32);
                    check.worst_log_p = *b;
                }
                if *b >= -20.0 {
                    check.max_abs_diff_likely = check.max_abs_diff_likely.max(d);
                }
            }
        }
        check.positions += s.len();
    }
    Ok(check)
}

/// Checks an existing model folder (one `train-demo` wrote, or any GPT-J folder with a
/// tokenizer) the way `run` checks what it trained: the first `o.check_sequences` training
/// sequences of `o.data_seed`, tokenized by the folder's tokenizer, through candle and the f64
/// reference.
pub fn check_folder(dir: &Path, o: &TrainOptions) -> Result<ReferenceCheck> {
    let loaded = crate::Model::load(dir)?;
    let tok = loaded.tokenizer()?;
    let model = TrainModel::from_weights(&loaded.config, &loaded.weights)?;
    let mut seqs = Vec::new();
    for p in crate::demo::corpus::training_sequences(o.data_seed, o.check_sequences.max(1)) {
        let mut ids = encode_pieces(tok, &p)?;
        ids.truncate(loaded.config.n_positions);
        seqs.push(ids);
    }
    seqs.truncate(o.check_sequences.max(1));
    check_against_reference(dir, &model, &seqs)
}

/// Everything the binary does: data, tokenizer, training, the folder, the reference check.
/// `log` receives the progress lines.
pub fn run(
    out: &Path,
    o: &TrainOptions,
    command: &str,
    log: &mut dyn FnMut(&str),
) -> Result<TrainReport> {
    let wall = Instant::now();
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;

    // Corpus and tokenizer.
    let t = Instant::now();
    let pieces = crate::demo::corpus::training_sequences(o.data_seed, o.docs);
    let texts = crate::demo::corpus::tokenizer_texts(o.data_seed, o.docs);
    let tok = train_tokenizer(&texts, o.vocab_size)?;
    let tok_path = out.join("tokenizer.json");
    tok.save(&tok_path, true)
        .map_err(|e| anyhow!("writing {}: {e}", tok_path.display()))?;
    let tok = crate::model::Tokenizer::from_file(&tok_path)?;
    let eot = check_tokenizer(&tok, &texts)?;
    let tokenizer_size = tok.vocab_size();
    let mut seqs = Vec::with_capacity(pieces.len());
    let (mut dropped_short, mut truncated) = (0, 0);
    for p in &pieces {
        let mut ids = encode_pieces(&tok, p)?;
        if ids.len() > o.n_positions {
            ids.truncate(o.n_positions);
            truncated += 1;
        }
        if ids.len() < 2 {
            dropped_short += 1;
            continue;
        }
        seqs.push(ids);
    }
    ensure!(!seqs.is_empty(), "no training sequence of 2 tokens or more");
    let tokenizer_s = t.elapsed().as_secs_f64();
    let lens: Vec<usize> = seqs.iter().map(Vec::len).collect();
    let n_tokens: usize = lens.iter().sum();
    let data = DataStats {
        docs: o.docs,
        sequences: seqs.len(),
        dropped_short,
        truncated,
        tokens: n_tokens,
        mean_len: n_tokens as f64 / seqs.len() as f64,
        max_len: lens.iter().copied().max().unwrap_or(0),
        tokenizer_size,
        eot_id: eot,
    };
    log(&format!(
        "data: {} sequences, {} tokens (mean {:.1}, max {}), {} truncated to {}, {} dropped; \
         tokenizer {} ids, {EOT} = {eot}; {:.1}s",
        data.sequences,
        data.tokens,
        data.mean_len,
        data.max_len,
        truncated,
        o.n_positions,
        dropped_short,
        tokenizer_size,
        tokenizer_s
    ));

    // Model.
    let config = o.gptj_config(tokenizer_size);
    let model = TrainModel::init(&config, o.seed)?;
    let mut optim = Optim::new(&model, o)?;
    log(&format!(
        "model: n_layer {} n_embd {} n_head {} rotary_dim {} vocab {} n_positions {}: {} parameters; \
         {} steps of batch {}, lr {} (warmup {}), {} threads",
        config.n_layer,
        config.n_embd,
        config.n_head,
        config.rotary_dim(),
        config.vocab_size,
        config.n_positions,
        config.n_params(),
        o.steps,
        o.batch,
        o.lr,
        o.warmup,
        o.threads
    ));

    // Training.
    let train_start = Instant::now();
    let mut rng = Rng::new(o.seed ^ 0x5EED_BA7C_0000_0001);
    let mut batches = Vec::new().into_iter();
    let mut epoch = 0;
    let mut losses = Vec::new();
    let mut step_losses = Vec::with_capacity(o.steps);
    let (mut win_loss, mut win_n, mut win_len, mut win_tok) = (0f64, 0usize, 0f64, 0f64);
    let mut win_times = PhaseTimes::default();
    let mut win_start = Instant::now();
    for step in 0..o.steps {
        let t_batch = Instant::now();
        let idx = match batches.next() {
            Some(b) => b,
            None => {
                epoch += 1;
                batches = epoch_batches(&lens, o.batch, o.bucket_batches, &mut rng).into_iter();
                batches.next().expect("at least one batch")
            }
        };
        let batch = Batch::new(&seqs, &idx, eot)?;
        let batch_s = t_batch.elapsed().as_secs_f64();
        let lr = o.lr_at(step);
        let (loss, norm, mut times) = train_step(&model, &mut optim, &batch, lr)
            .with_context(|| format!("step {}", step + 1))?;
        times.batch = batch_s;
        step_losses.push(loss);
        win_loss += loss as f64;
        win_n += 1;
        win_len += batch.padded_len as f64;
        win_tok += batch.tokens as f64;
        win_times.add(&times);
        if (step + 1) % o.log_every.max(1) == 0 || step + 1 == o.steps {
            let k = 1.0 / win_n as f64;
            let entry = LogEntry {
                step: step + 1,
                loss: win_loss * k,
                lr,
                grad_norm: norm,
                step_s: win_start.elapsed().as_secs_f64() * k,
                phases: win_times.scaled(k),
                padded_len: win_len * k,
                tokens: win_tok * k,
            };
            log(&format!(
                "step {:>5}/{} epoch {epoch} loss {:.4} lr {:.2e} |g| {:.3} {:.3}s/step \
                 (fwd {:.3} bwd {:.3} opt {:.3}) T {:.0} tok {:.0} elapsed {:.0}s",
                entry.step,
                o.steps,
                entry.loss,
                entry.lr,
                entry.grad_norm,
                entry.step_s,
                entry.phases.forward,
                entry.phases.backward,
                entry.phases.optimizer,
                entry.padded_len,
                entry.tokens,
                train_start.elapsed().as_secs_f64()
            ));
            losses.push(entry);
            (win_loss, win_n, win_len, win_tok) = (0.0, 0, 0.0, 0.0);
            win_times = PhaseTimes::default();
            win_start = Instant::now();
        }
    }
    let train_s = train_start.elapsed().as_secs_f64();

    // The folder, then the proof that the engine computes what was trained.
    write_config(out, &config, eot)?;
    write_safetensors(&out.join("model.safetensors"), &model.named_tensors()?)?;
    let check: Vec<Vec<u32>> = seqs.iter().take(o.check_sequences).cloned().collect();
    let reference = check_against_reference(out, &model, &check)?;
    log(&reference.describe(config.vocab_size));
    let max_diff = reference.max_abs_diff;
    let report = TrainReport {
        command: command.to_owned(),
        seed: o.seed,
        steps: o.steps,
        threads: o.threads,
        options: o.clone(),
        n_params: config.n_params(),
        config,
        data,
        losses,
        step_losses,
        tokenizer_s,
        train_s,
        mean_step_s: train_s / o.steps.max(1) as f64,
        wall_s: wall.elapsed().as_secs_f64(),
        reference,
    };
    let path = out.join("training.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    if !report.reference.passes() {
        bail!(
            "the trained model and toolsift's reference disagree: max |log p difference| = \
             {max_diff:e} > 1e-4 and > twice the engine's own f32 error ({:e})",
            report.reference.engine_vs_reference
        );
    }
    Ok(report)
}

/// Times `steps` training steps on random ids [batch, len] at the given sizes (no corpus, no
/// output): the mean phase times over the steps after the first.
pub fn profile(o: &TrainOptions, len: usize, steps: usize) -> Result<PhaseTimes> {
    let config = o.gptj_config(o.vocab_size);
    let model = TrainModel::init(&config, o.seed)?;
    let mut optim = Optim::new(&model, o)?;
    let mut rng = Rng::new(o.seed);
    let seqs: Vec<Vec<u32>> = (0..o.batch)
        .map(|_| {
            (0..len + 1)
                .map(|_| rng.range(0, o.vocab_size - 2) as u32)
                .collect()
        })
        .collect();
    let idx: Vec<usize> = (0..o.batch).collect();
    let mut total = PhaseTimes::default();
    for step in 0..steps.max(1) + 1 {
        let t = Instant::now();
        let batch = Batch::new(&seqs, &idx, 0)?;
        let batch_s = t.elapsed().as_secs_f64();
        let (_, _, mut times) = train_step(&model, &mut optim, &batch, o.lr)?;
        times.batch = batch_s;
        if step > 0 {
            total.add(&times);
        }
    }
    Ok(total.scaled(1.0 / steps.max(1) as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(shape: &[usize], rng: &mut Rng, scale: f32) -> Tensor {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.normal() * scale).collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    /// max |a - b| over two tensors of the same shape.
    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar()
            .unwrap()
    }

    /// The value and the gradients (w.r.t. `inputs`) of sum(f(inputs) * probe).
    fn value_and_grads(
        inputs: &[Tensor],
        probe: &Tensor,
        f: impl Fn(&[Tensor]) -> Tensor,
    ) -> (Tensor, Vec<Tensor>) {
        let vars: Vec<Var> = inputs
            .iter()
            .map(|t| Var::from_tensor(t).unwrap())
            .collect();
        let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
        let out = f(&ts);
        let loss = (&out * probe).unwrap().sum_all().unwrap();
        let grads = loss.backward().unwrap();
        let g = vars.iter().map(|v| grads.get(v).unwrap().clone()).collect();
        (out, g)
    }

    /// Each fused op against the same math from candle primitives (candle's own autograd):
    /// forward values and the gradients of every input.
    #[test]
    fn fused_ops_match_primitives() {
        let mut rng = Rng::new(3);
        let check = |name: &str,
                     inputs: &[Tensor],
                     fused: &dyn Fn(&[Tensor]) -> Tensor,
                     prim: &dyn Fn(&[Tensor]) -> Tensor,
                     rng: &mut Rng| {
            let out_shape = prim(inputs).dims().to_vec();
            let probe = random(&out_shape, rng, 1.0);
            let (a, ga) = value_and_grads(inputs, &probe, fused);
            let (b, gb) = value_and_grads(inputs, &probe, prim);
            let d = max_diff(&a, &b);
            assert!(d < 1e-5, "{name}: forward differs by {d}");
            for (i, (x, y)) in ga.iter().zip(&gb).enumerate() {
                let d = max_diff(x, y);
                assert!(d < 1e-4, "{name}: gradient of input {i} differs by {d}");
            }
        };

        // LayerNorm.
        let ln = [
            random(&[6, 16], &mut rng, 2.0),
            random(&[16], &mut rng, 1.0),
            random(&[16], &mut rng, 1.0),
        ];
        check(
            "layer norm",
            &ln,
            &|t| {
                t[0].apply_op3(&t[1], &t[2], fused::LayerNorm { eps: 1e-5 })
                    .unwrap()
            },
            &|t| {
                let mean = t[0].mean_keepdim(1).unwrap();
                let xc = t[0].broadcast_sub(&mean).unwrap();
                let var = xc.sqr().unwrap().mean_keepdim(1).unwrap();
                let xn = xc
                    .broadcast_div(&(var + 1e-5).unwrap().sqrt().unwrap())
                    .unwrap();
                xn.broadcast_mul(&t[1])
                    .unwrap()
                    .broadcast_add(&t[2])
                    .unwrap()
            },
            &mut rng,
        );

        // Bias + gelu_new (candle's `gelu` is the tanh approximation).
        let gelu = [
            random(&[5, 24], &mut rng, 2.0),
            random(&[24], &mut rng, 1.0),
        ];
        check(
            "bias gelu",
            &gelu,
            &|t| t[0].apply_op2(&t[1], fused::BiasGelu).unwrap(),
            &|t| t[0].broadcast_add(&t[1]).unwrap().gelu().unwrap(),
            &mut rng,
        );

        // Causal softmax over [.., T, T].
        let t = 7;
        let mask: Vec<f32> = (0..t)
            .flat_map(|i| (0..t).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 }))
            .collect();
        let mask = Tensor::from_vec(mask, (t, t), &Device::Cpu).unwrap();
        check(
            "causal softmax",
            &[random(&[2, 3, t, t], &mut rng, 3.0)],
            &|x| x[0].apply_op1(fused::CausalSoftmax).unwrap(),
            &|x| {
                let x = x[0].broadcast_add(&mask).unwrap();
                let max = x.max_keepdim(D::Minus1).unwrap().detach();
                let e = x.broadcast_sub(&max).unwrap().exp().unwrap();
                e.broadcast_div(&e.sum_keepdim(D::Minus1).unwrap()).unwrap()
            },
            &mut rng,
        );

        // Rotary: [B, T, H, hd] with 3 of 4 pairs rotated.
        let (b, t, h, hd, half, n_pos) = (2, 5, 3, 8, 3, 9);
        let rt = RotaryTable::new(n_pos, 2 * half);
        let rotary = fused::Rotary {
            cos: Arc::new(rt.cos.clone()),
            sin: Arc::new(rt.sin.clone()),
            half,
            inverse: false,
        };
        let table = |v: &[f32]| {
            Tensor::from_vec(v[..t * half].to_vec(), (t, 1, half, 1), &Device::Cpu).unwrap()
        };
        let (cos, sin) = (table(&rt.cos), table(&rt.sin));
        check(
            "rotary",
            &[random(&[b, t, h, hd], &mut rng, 1.0)],
            &|x| x[0].apply_op1(rotary.clone()).unwrap(),
            &|x| {
                let pairs = x[0]
                    .narrow(3, 0, 2 * half)
                    .unwrap()
                    .reshape((b, t, h, half, 2))
                    .unwrap();
                let (x0, x1) = (
                    pairs.narrow(4, 0, 1).unwrap(),
                    pairs.narrow(4, 1, 1).unwrap(),
                );
                let r0 =
                    (x0.broadcast_mul(&cos).unwrap() - x1.broadcast_mul(&sin).unwrap()).unwrap();
                let r1 =
                    (x1.broadcast_mul(&cos).unwrap() + x0.broadcast_mul(&sin).unwrap()).unwrap();
                let r = Tensor::cat(&[r0, r1], 4)
                    .unwrap()
                    .reshape((b, t, h, 2 * half))
                    .unwrap();
                Tensor::cat(&[r, x[0].narrow(3, 2 * half, hd - 2 * half).unwrap()], 3).unwrap()
            },
            &mut rng,
        );

        // Cross-entropy against log-softmax + gather.
        let targets = Tensor::new(&[3u32, 0, 9, 9, 4], &Device::Cpu).unwrap();
        check(
            "cross-entropy",
            &[random(&[5, 10], &mut rng, 3.0)],
            &|x| x[0].apply_op2(&targets, fused::CrossEntropy).unwrap(),
            &|x| {
                let lp = log_softmax_last_dim(&x[0]).unwrap();
                lp.gather(&targets.unsqueeze(1).unwrap(), 1)
                    .unwrap()
                    .squeeze(1)
                    .unwrap()
                    .neg()
                    .unwrap()
            },
            &mut rng,
        );
    }

    #[test]
    fn forward_matches_reference_and_learns() {
        let o = TrainOptions {
            n_layer: 2,
            n_embd: 32,
            n_head: 4,
            rotary_dim: 4,
            n_positions: 32,
            ..TrainOptions::default()
        };
        let config = o.gptj_config(60);
        let model = TrainModel::init(&config, 7).unwrap();
        let dir = tempfile::tempdir().unwrap();
        write_config(dir.path(), &config, 59).unwrap();
        write_safetensors(
            &dir.path().join("model.safetensors"),
            &model.named_tensors().unwrap(),
        )
        .unwrap();
        let seqs = vec![vec![1, 5, 9, 2, 33, 40, 7], vec![3; 20]];
        let check = check_against_reference(dir.path(), &model, &seqs).unwrap();
        assert!(check.max_abs_diff < 1e-5, "{check:?}");

        // A padded batch's loss equals the mean over its sequences' own tokens, and steps lower it.
        let batch = Batch::new(&seqs, &[0, 1], 0).unwrap();
        assert_eq!(batch.tokens, 6 + 19);
        let mut optim = Optim::new(&model, &o).unwrap();
        let first = train_step(&model, &mut optim, &batch, 1e-2).unwrap().0;
        let mut last = first;
        for _ in 0..20 {
            last = train_step(&model, &mut optim, &batch, 1e-2).unwrap().0;
        }
        assert!(last < first * 0.8, "{first} -> {last}");
    }

    #[test]
    fn tokenizer_splits_digits_and_keeps_brackets() {
        let texts: Vec<String> = (0..50)
            .map(|i| format!("Out of {i}00 people [Calculator({i} / 7) -> 0.{i}] passed, see [x]."))
            .collect();
        let tok = train_tokenizer(&texts, 300).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        tok.save(&path, false).unwrap();
        let tok = crate::model::Tokenizer::from_file(&path).unwrap();
        let eot = check_tokenizer(&tok, &texts).unwrap();
        assert_eq!(eot as usize, tok.vocab_size() - 1);
        assert_eq!(tok.encode_ids(" 25").unwrap().len(), 3);
    }
}
