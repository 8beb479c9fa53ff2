//! Trains the demo model: a small GPT-J (exactly transformers' `GPTJForCausalLM`, the architecture
//! toolsift runs) with candle's autograd on the CPU, and the byte-level BPE tokenizer it reads.
//!
//! Everything that decides the result comes from one seed and toolsift's own SplitMix64
//! (`util::rng::Rng`): the corpus, the initial weights, the shuffling and batching. candle's CPU
//! kernels and the ops of `fused` are deterministic (one row per task, fixed reduction order), so
//! a seed reproduces the losses bit for bit, whatever the thread count.
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
//!
//! Modules: `tokenizer` (the BPE), `fused` (the custom ops), `model` (the parameters, their
//! initialisation and the forward), `data` (batches, epoch order), `step` (AdamW, one step),
//! `check` (the f64 reference check); here the options, the report and `run`.

mod check;
mod data;
mod fused;
mod model;
mod step;
mod tokenizer;

pub use check::{check_against_reference, check_folder, ReferenceCheck};
pub use data::{encode_pieces, epoch_batches, Batch};
pub use model::TrainModel;
pub use step::{train_step, Optim, PhaseTimes};
pub use tokenizer::{check_tokenizer, train_tokenizer};

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, ensure, Context, Result};
use serde::Serialize;

use crate::model::checkpoint::write_safetensors;
use crate::model::GptjConfig;
use crate::util::rng::Rng;

/// The one special token: end of text, also the padding id (padding is never a target).
pub const EOT: &str = "<|endoftext|>";

/// Everything a training run depends on. `Default` is the demo model's recipe.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainOptions {
    /// Seed of the weights and of the batch order.
    pub seed: u64,
    /// Seed of the corpus generator (`corpus::training_sequences`).
    pub data_seed: u64,
    /// Documents asked of the corpus generator.
    pub docs: usize,
    /// Optimizer steps (default 3000); a new epoch is shuffled whenever the batches run out.
    pub steps: usize,
    /// Sequences per batch (default 32).
    pub batch: usize,
    /// Peak learning rate (AdamW), reached after `warmup` steps, then cosine decay to
    /// `final_lr_frac * lr` at the last step.
    pub lr: f64,
    /// Steps of linear warmup, from `lr / warmup` at step 0 to `lr` (default 100; 0: none).
    pub warmup: usize,
    /// Floor of the cosine decay as a fraction of `lr` (default 0.1).
    pub final_lr_frac: f64,
    /// Decoupled weight decay on matrices and embeddings (not on biases and LayerNorms).
    pub weight_decay: f64,
    /// AdamW's first-moment decay (default 0.9; no `train-demo` flag).
    pub beta1: f64,
    /// AdamW's second-moment decay (default 0.98; no `train-demo` flag).
    pub beta2: f64,
    /// AdamW's epsilon (default 1e-8; no `train-demo` flag).
    pub adam_eps: f64,
    /// Clip the global gradient norm to this (0 = no clipping).
    pub grad_clip: f64,
    /// Tokenizer size asked of the BPE trainer, `<|endoftext|>` included.
    pub vocab_size: usize,
    /// Transformer blocks (default 4).
    pub n_layer: usize,
    /// Hidden size (default 128); head_dim is `n_embd / n_head`.
    pub n_embd: usize,
    /// Attention heads (default 4).
    pub n_head: usize,
    /// Dims of each head that rotary rotates, from the first (default 16).
    pub rotary_dim: usize,
    /// Context length (default 256); longer training sequences are cut to it.
    pub n_positions: usize,
    /// Documents per bucket of the batcher are `batch * bucket_batches`: a bucket is sorted by
    /// length and cut into batches, so a batch pads little.
    pub bucket_batches: usize,
    /// A `LogEntry` and a progress line every this many steps and at the last step (default
    /// 50; 0 counts as 1).
    pub log_every: usize,
    /// Training sequences checked against the f64 reference after training.
    pub check_sequences: usize,
    /// Threads of candle's GEMMs (recorded; the binary sets them before anything runs).
    pub threads: usize,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            seed: crate::demo::TRAIN_SEED,
            data_seed: crate::demo::TRAIN_SEED,
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

/// One logged point of training.
#[derive(Debug, Clone, Serialize)]
pub struct LogEntry {
    /// Steps done (1-based).
    pub step: usize,
    /// Mean loss of the steps since the previous entry.
    pub loss: f64,
    /// Learning rate of the entry's last step.
    pub lr: f64,
    /// Global gradient norm of the entry's last step, before clipping.
    pub grad_norm: f64,
    /// Mean wall seconds per step since the previous entry.
    pub step_s: f64,
    /// Mean seconds per step by phase since the previous entry.
    pub phases: PhaseTimes,
    /// Mean padded length (input tokens per row) of the batches since the previous entry.
    pub padded_len: f64,
    /// Mean predicted tokens (padding excluded) per batch since the previous entry.
    pub tokens: f64,
}

/// The training data after tokenization (training.json's "data").
#[derive(Debug, Clone, Serialize)]
pub struct DataStats {
    /// Documents asked of the corpus generator (`TrainOptions::docs`).
    pub docs: usize,
    /// Training sequences kept (two per document, less `dropped_short`).
    pub sequences: usize,
    /// Sequences left out for having fewer than 2 tokens.
    pub dropped_short: usize,
    /// Sequences cut to `n_positions` tokens.
    pub truncated: usize,
    /// Tokens of the kept sequences, after cutting.
    pub tokens: usize,
    /// Mean tokens per kept sequence.
    pub mean_len: f64,
    /// Tokens of the longest kept sequence.
    pub max_len: usize,
    /// Ids of the trained tokenizer, `<|endoftext|>` included (before the vocabulary is padded
    /// to a multiple of 8).
    pub tokenizer_size: usize,
    /// The `<|endoftext|>` id, also the padding id.
    pub eot_id: u32,
}

/// training.json: what was run and what came out.
#[derive(Debug, Clone, Serialize)]
pub struct TrainReport {
    /// The command line as given to `run` (`train-demo` passes its own: program and arguments
    /// joined by spaces).
    pub command: String,
    /// `TrainOptions::seed`.
    pub seed: u64,
    /// `TrainOptions::steps`.
    pub steps: usize,
    /// `TrainOptions::threads`.
    pub threads: usize,
    /// Every option of the run.
    pub options: TrainOptions,
    /// The model's config, as written to config.json.
    pub config: GptjConfig,
    /// Parameters of the model (`GptjConfig::n_params`).
    pub n_params: usize,
    /// The training data's statistics.
    pub data: DataStats,
    /// One entry every `log_every` steps and one at the last step.
    pub losses: Vec<LogEntry>,
    /// The loss of every step, in order (for determinism checks).
    pub step_losses: Vec<f32>,
    /// Seconds for the corpus, the tokenizer's training and the tokenization of the sequences.
    pub tokenizer_s: f64,
    /// Seconds of the training loop.
    pub train_s: f64,
    /// `train_s / steps`.
    pub mean_step_s: f64,
    /// Seconds of the whole run up to writing training.json, the reference check included.
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

/// Written into `--out` before the model's files and removed once training.json is there: it
/// marks a folder whose run stopped in between (its reference check failed to load the model,
/// a write failed, the process was killed) as train-demo's own, so the rerun is taken.
const INCOMPLETE_MARKER: &str = "train-demo.incomplete";

/// `--out` must be a new or empty folder, or an earlier train-demo output (its training.json,
/// or the marker of a run that stopped while writing): the run writes config.json,
/// model.safetensors and tokenizer.json there, and a model folder of someone else's would be
/// left with a new tokenizer beside old weights by a run that fails, or replaced by one that
/// does not.
fn check_out_folder(out: &Path) -> Result<()> {
    let fresh =
        crate::util::fs::missing_or_empty(out).map_err(|e| anyhow!("{}: {e}", out.display()))?;
    if fresh || out.join("training.json").is_file() || out.join(INCOMPLETE_MARKER).is_file() {
        return Ok(());
    }
    Err(anyhow!(
        "{}: not empty and not a train-demo output (no training.json): give a new folder",
        out.display()
    ))
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
    // The model's sizes, checked before anything is written (the tokenizer's size is not
    // known yet: --vocab-size bounds it).
    o.gptj_config(o.vocab_size).validate().map_err(|e| {
        anyhow!(
            "the model flags (--n-layer, --n-embd, --n-head, --rotary-dim, --n-positions, \
             --vocab-size): {e}"
        )
    })?;
    check_out_folder(out)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;

    // Corpus and tokenizer.
    let data = tokenized_corpus(out, o, log)?;

    // Model.
    let config = o.gptj_config(data.stats.tokenizer_size);
    let model = TrainModel::init(&config, o.seed)?;
    let mut optim = Optim::new(&model, o)?;
    log(&describe_model(&config, o));

    // Training.
    let trained = train_model(o, &model, &mut optim, &data, log)?;

    // The folder, then the proof that the engine computes what was trained.
    let marker = write_model_files(out, command, &config, &model, &data)?;
    let check: Vec<Vec<u32>> = data
        .seqs
        .iter()
        .take(o.check_sequences.max(1))
        .cloned()
        .collect();
    let reference = check_against_reference(out, &model, &check)?;
    log(&reference.describe(config.vocab_size));
    let report = TrainReport {
        command: command.to_owned(),
        seed: o.seed,
        steps: o.steps,
        threads: o.threads,
        options: o.clone(),
        n_params: config.n_params(),
        config,
        data: data.stats,
        losses: trained.losses,
        step_losses: trained.step_losses,
        tokenizer_s: data.tokenizer_s,
        train_s: trained.train_s,
        mean_step_s: trained.train_s / o.steps.max(1) as f64,
        wall_s: wall.elapsed().as_secs_f64(),
        reference,
    };
    finish_folder(out, &marker, &report)?;
    Ok(report)
}

/// The training data: the tokenizer trained on the corpus, and the corpus's sequences it encodes.
struct TokenizedCorpus {
    /// Where the tokenizer goes (written with the model, at the end).
    tok_path: PathBuf,
    /// The tokenizer's tokenizer.json.
    tok_json: String,
    /// The kept training sequences, cut to `n_positions`.
    seqs: Vec<Vec<u32>>,
    /// The length of each of `seqs`.
    lens: Vec<usize>,
    /// training.json's "data".
    stats: DataStats,
    /// Seconds for the corpus, the tokenizer's training and the tokenization of the sequences.
    tokenizer_s: f64,
}

/// Generates the corpus, trains the tokenizer on it (checked by `check_tokenizer`) and encodes
/// the training sequences; logs the data's line.
fn tokenized_corpus(
    out: &Path,
    o: &TrainOptions,
    log: &mut dyn FnMut(&str),
) -> Result<TokenizedCorpus> {
    let t = Instant::now();
    let pieces = crate::demo::corpus::training_sequences(o.data_seed, o.docs);
    let texts = crate::demo::corpus::tokenizer_texts(o.data_seed, o.docs);
    let tok = train_tokenizer(&texts, o.vocab_size)?;
    // Written into the folder with the model, at the end: a run that fails before then (a
    // tokenizer `check_tokenizer` refuses, an interrupted training) leaves no file there that
    // would make `check_out_folder` refuse the rerun.
    let tok_path = out.join("tokenizer.json");
    let tok_json = tok
        .to_string(true)
        .map_err(|e| anyhow!("serialising the tokenizer: {e}"))?;
    let tok = crate::model::Tokenizer::from_bytes(tok_json.as_bytes(), &tok_path)?;
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
    Ok(TokenizedCorpus {
        tok_path,
        tok_json,
        seqs,
        lens,
        stats: data,
        tokenizer_s,
    })
}

/// The model's progress line: its sizes, its parameters and the training's settings.
fn describe_model(config: &GptjConfig, o: &TrainOptions) -> String {
    format!(
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
    )
}

/// What the training loop produced (training.json's "losses", "step_losses" and "train_s").
struct Trained {
    /// One entry every `log_every` steps and one at the last step.
    losses: Vec<LogEntry>,
    /// The loss of every step, in order.
    step_losses: Vec<f32>,
    /// Seconds of the training loop.
    train_s: f64,
}

/// The training loop: `o.steps` steps over batches of `data`'s sequences, a new shuffled epoch
/// whenever the batches run out; logs a progress line every `log_every` steps and at the last.
fn train_model(
    o: &TrainOptions,
    model: &TrainModel,
    optim: &mut Optim,
    data: &TokenizedCorpus,
    log: &mut dyn FnMut(&str),
) -> Result<Trained> {
    let (seqs, lens, eot) = (&data.seqs, &data.lens, data.stats.eot_id);
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
                batches = epoch_batches(lens, o.batch, o.bucket_batches, &mut rng).into_iter();
                batches.next().expect("at least one batch")
            }
        };
        let batch = Batch::new(seqs, &idx, eot)?;
        let batch_s = t_batch.elapsed().as_secs_f64();
        let lr = o.lr_at(step);
        let (loss, norm, mut times) =
            train_step(model, optim, &batch, lr).with_context(|| format!("step {}", step + 1))?;
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
    Ok(Trained {
        losses,
        step_losses,
        train_s: train_start.elapsed().as_secs_f64(),
    })
}

/// Writes the model's files into `out`: the `INCOMPLETE_MARKER` first, then config.json,
/// tokenizer.json and model.safetensors. Returns the marker's path, for `finish_folder`.
fn write_model_files(
    out: &Path,
    command: &str,
    config: &GptjConfig,
    model: &TrainModel,
    data: &TokenizedCorpus,
) -> Result<PathBuf> {
    let marker = out.join(INCOMPLETE_MARKER);
    std::fs::write(
        &marker,
        format!(
            "train-demo stopped after writing some of this folder's files and before \
             training.json; rerun it into this folder to replace them:\n{command}\n"
        ),
    )
    .with_context(|| format!("writing {}", marker.display()))?;
    write_config(out, config, data.stats.eot_id)?;
    std::fs::write(&data.tok_path, &data.tok_json)
        .with_context(|| format!("writing {}", data.tok_path.display()))?;
    write_safetensors(&out.join("model.safetensors"), &model.named_tensors()?)?;
    Ok(marker)
}

/// Writes training.json, then removes the marker: the folder is complete. Then an error if the
/// reference check did not pass.
fn finish_folder(out: &Path, marker: &Path, report: &TrainReport) -> Result<()> {
    let path = out.join("training.json");
    std::fs::write(&path, serde_json::to_string_pretty(report)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    std::fs::remove_file(marker).with_context(|| format!("removing {}", marker.display()))?;
    if !report.reference.passes() {
        bail!(
            "the trained model and toolsift's reference disagree: max |log p difference| = \
             {:e} > 1e-4 and > twice the engine's own f32 error ({:e})",
            report.reference.max_abs_diff,
            report.reference.engine_vs_reference
        );
    }
    Ok(())
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
    use std::sync::Arc;

    use candle_core::{Device, Tensor, Var, D};

    use super::model::log_softmax_last_dim;
    use super::*;
    use crate::model::rotary::RotaryTable;

    /// Sizes the model cannot have, and a folder the run did not write, are refused before
    /// anything is written: a failed run left a new tokenizer beside someone's old weights.
    #[test]
    fn a_run_refuses_bad_sizes_and_foreign_folders_before_writing() {
        let tmp = tempfile::tempdir().unwrap();
        let mut log = |_: &str| {};
        let bad = TrainOptions {
            n_embd: 7,
            ..TrainOptions::default()
        };
        let out = tmp.path().join("new");
        let err = run(&out, &bad, "test", &mut log).unwrap_err().to_string();
        assert!(
            err.contains("--n-embd") && err.contains("n_embd (7)"),
            "{err}"
        );
        assert!(!out.exists());
        let theirs = tmp.path().join("model");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::write(theirs.join("tokenizer.json"), "theirs").unwrap();
        let err = run(&theirs, &TrainOptions::default(), "test", &mut log)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a train-demo output"), "{err}");
        assert_eq!(
            std::fs::read_to_string(theirs.join("tokenizer.json")).unwrap(),
            "theirs"
        );
    }

    /// A tensor of `shape` with normal entries times `scale` (the train module's tests share it).
    pub(super) fn random(shape: &[usize], rng: &mut Rng, scale: f32) -> Tensor {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.normal() * scale).collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    /// max |a - b| over two tensors of the same shape, a NaN counting as infinite (a tensor max
    /// may skip it).
    pub(super) fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        let (a, b) = (a.flatten_all().unwrap(), b.flatten_all().unwrap());
        let (a, b) = (a.to_vec1::<f32>().unwrap(), b.to_vec1::<f32>().unwrap());
        assert_eq!(a.len(), b.len());
        a.iter().zip(&b).fold(0f32, |m, (x, y)| {
            let d = (x - y).abs();
            if d.is_nan() {
                f32::INFINITY
            } else {
                m.max(d)
            }
        })
    }

    /// Writes the folder `check_against_reference` reads: config.json (end-of-text id `eot`)
    /// and `tensors` as model.safetensors.
    pub(super) fn write_checked_folder(
        dir: &Path,
        config: &GptjConfig,
        eot: u32,
        tensors: &[(String, crate::model::Tensor)],
    ) {
        write_config(dir, config, eot).unwrap();
        write_safetensors(&dir.join("model.safetensors"), tensors).unwrap();
    }

    /// The value and the gradients (w.r.t. `inputs`) of sum(f(inputs) * probe).
    pub(super) fn value_and_grads(
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
        write_checked_folder(dir.path(), &config, 59, &model.named_tensors().unwrap());
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

    /// The schedule at its corners: warmup from lr / warmup at step 0 to lr at step warmup - 1,
    /// the cosine from lr at step `warmup` (over `steps - warmup`, not `steps`) to the floor
    /// `final_lr_frac * lr` at the last step and after; warmup 0 starts at lr.
    #[test]
    fn lr_warms_up_linearly_then_decays_by_cosine_to_the_floor() {
        let o = TrainOptions {
            lr: 1.0,
            warmup: 4,
            steps: 14,
            final_lr_frac: 0.1,
            ..TrainOptions::default()
        };
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        for (step, want) in [
            (0, 0.25),
            (1, 0.5),
            (3, 1.0),
            (4, 1.0),
            (9, 0.55),
            (14, 0.1),
            (99, 0.1),
        ] {
            let got = o.lr_at(step);
            assert!(close(got, want), "step {step}: {got}, want {want}");
        }
        let none = TrainOptions { warmup: 0, ..o };
        assert!(close(none.lr_at(0), 1.0) && close(none.lr_at(7), 0.55));
    }

    /// The model's vocabulary is the tokenizer's size rounded up to a multiple of 8.
    #[test]
    fn the_vocabulary_is_padded_to_a_multiple_of_8() {
        let o = TrainOptions::default();
        let sizes: Vec<usize> = [505, 511, 512, 513]
            .map(|n| o.gptj_config(n).vocab_size)
            .to_vec();
        assert_eq!(sizes, [512, 512, 512, 520]);
    }

    /// The demo recipe's data (`TrainOptions::default()`: 20,000 documents of seed 1) gives
    /// the committed tokenizer byte for byte and the data line of the committed model's
    /// training log. docs/demo.md says `train-demo --seed 1` rebuilds the committed files
    /// exactly; a change to the generator, its seeds, the tokenizer's training or the encoding
    /// would break that unseen, and fails here (training itself is left to a rerun).
    #[test]
    fn the_demo_recipes_data_gives_the_committed_tokenizer_and_data_line() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let committed = std::fs::read_to_string(root.join("assets/demo/tokenizer.json")).unwrap();
        let log: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(root.join("docs/results/demo-training.json")).unwrap(),
        )
        .unwrap();
        let o = TrainOptions::default();
        assert_eq!(
            log["options"]["data_seed"], o.data_seed,
            "the log is of the recipe"
        );
        assert_eq!(log["options"]["docs"], o.docs);
        let out = tempfile::tempdir().unwrap();
        let data = tokenized_corpus(out.path(), &o, &mut |_| {}).unwrap();
        assert!(
            data.tok_json == committed,
            "the trained tokenizer is not the committed one"
        );
        assert_eq!(serde_json::to_value(&data.stats).unwrap(), log["data"]);
    }

    /// A run of a second or less: 1 layer of 16 dims, 5 steps of 4 sequences over 6 documents,
    /// sequences cut to 24 tokens, a log entry every 2 steps, 2 sequences checked.
    fn tiny_run() -> TrainOptions {
        TrainOptions {
            docs: 6,
            steps: 5,
            batch: 4,
            bucket_batches: 1,
            warmup: 2,
            vocab_size: 400,
            n_layer: 1,
            n_embd: 16,
            n_head: 2,
            rotary_dim: 4,
            n_positions: 24,
            log_every: 2,
            check_sequences: 2,
            ..TrainOptions::default()
        }
    }

    /// A run that fails after its tokenizer is trained (one `check_tokenizer` refuses: too few
    /// ids for " [" to be one token) leaves its new folder empty, so the rerun with a larger
    /// vocabulary is not refused as "not a train-demo output"; so is the rerun into a folder a
    /// run left while writing its files (its marker, half its files), and a finished run
    /// removes the marker.
    #[test]
    fn a_failed_run_leaves_its_folder_to_the_rerun() {
        let o = TrainOptions {
            steps: 1,
            ..tiny_run()
        };
        let too_small = TrainOptions {
            vocab_size: 259,
            ..o.clone()
        };
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("m");
        let err = run(&out, &too_small, "test", &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(err.contains("raise --vocab-size"), "{err}");
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
        // What a run stopped between its config and its training.json leaves.
        std::fs::write(out.join(INCOMPLETE_MARKER), "stopped").unwrap();
        std::fs::write(out.join("config.json"), "{}").unwrap();
        run(&out, &o, "test", &mut |_| {}).unwrap();
        assert!(out.join("tokenizer.json").is_file() && out.join("training.json").is_file());
        assert!(!out.join(INCOMPLETE_MARKER).exists());
        // Without the marker, the same half-written folder is someone else's.
        std::fs::remove_file(out.join("training.json")).unwrap();
        let err = check_out_folder(&out).unwrap_err().to_string();
        assert!(err.contains("not a train-demo output"), "{err}");
    }

    /// A tiny run end to end (1 layer, 3 steps over 2 epochs): the data statistics against the
    /// written tokenizer, one log entry every `log_every` steps and one at the last, the batch
    /// order (each entry's tokens: a new shuffle for the second epoch), `check_sequences`
    /// compared, `mean_step_s`; a second run into its own output is allowed and gives the same
    /// losses; `check_folder` cuts sequences to n_positions as `run` does; only sequences
    /// longer than n_positions count as truncated.
    #[test]
    fn a_tiny_run_reports_its_data_log_and_check_and_reruns_into_its_folder() {
        let o = tiny_run();
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("m");
        let r = run(&out, &o, "test", &mut |_| {}).unwrap();

        let tok = crate::model::Tokenizer::from_file(&out.join("tokenizer.json")).unwrap();
        let full: Vec<usize> = crate::demo::corpus::training_sequences(o.data_seed, o.docs)
            .iter()
            .map(|p| encode_pieces(&tok, p).unwrap().len())
            .collect();
        let lens: Vec<usize> = full.iter().map(|&n| n.min(o.n_positions)).collect();
        let d = &r.data;
        assert_eq!(d.sequences, lens.len());
        assert_eq!(d.dropped_short, 0);
        assert_eq!(d.truncated, full.iter().filter(|&&n| n > 24).count());
        assert!(d.truncated > 0 && d.truncated < d.sequences, "{d:?}");
        assert_eq!(d.tokens, lens.iter().sum::<usize>());
        assert_eq!(d.max_len, 24);
        assert_eq!(d.tokenizer_size, tok.vocab_size());
        assert_eq!(r.config.vocab_size, d.tokenizer_size.div_ceil(8) * 8);

        let steps: Vec<usize> = r.losses.iter().map(|e| e.step).collect();
        assert_eq!(steps, [2, 4, 5]);
        assert_eq!(r.step_losses.len(), 5);
        let mut rng = Rng::new(o.seed ^ 0x5EED_BA7C_0000_0001);
        let mut order = epoch_batches(&lens, 4, 1, &mut rng);
        assert_eq!(order.len(), 3, "{lens:?}");
        order.extend(epoch_batches(&lens, 4, 1, &mut rng));
        let tokens: Vec<f64> = order
            .iter()
            .map(|b| b.iter().map(|&i| lens[i] - 1).sum::<usize>() as f64)
            .collect();
        let want = [
            (tokens[0] + tokens[1]) / 2.0,
            (tokens[2] + tokens[3]) / 2.0,
            tokens[4],
        ];
        let got: Vec<f64> = r.losses.iter().map(|e| e.tokens).collect();
        assert_eq!(got, want);
        assert_eq!(r.reference.sequences, 2);
        assert!(r.reference.passes(), "{:?}", r.reference);
        assert!((r.mean_step_s - r.train_s / 5.0).abs() < 1e-12);

        let again = run(&out, &o, "test", &mut |_| {}).unwrap();
        assert_eq!(again.step_losses, r.step_losses);
        let check = check_folder(&out, &o).unwrap();
        assert_eq!(check.sequences, 2);
        assert!(check.passes(), "{check:?}");

        // A sequence of exactly n_positions tokens is kept whole, not counted as truncated.
        let mut sorted = full.clone();
        sorted.sort();
        let at = sorted[sorted.len() / 2];
        assert!(at < sorted[sorted.len() - 1]);
        let o = TrainOptions {
            n_positions: at,
            steps: 1,
            ..o
        };
        let r = run(&tmp.path().join("m2"), &o, "test", &mut |_| {}).unwrap();
        assert_eq!(r.data.truncated, full.iter().filter(|&&n| n > at).count());
        assert_eq!(r.data.max_len, at);
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

    /// 258 ids (256 bytes, one merge, <|endoftext|>) is the smallest tokenizer; with so few
    /// merges " [" is two tokens, which `check_tokenizer` refuses when the texts hold it.
    #[test]
    fn the_smallest_tokenizer_is_258_ids_and_a_split_bracket_is_refused() {
        let texts: Vec<String> = (0..20).map(|i| format!("total {i} of 7 passed")).collect();
        let err = train_tokenizer(&texts, 257).unwrap_err().to_string();
        assert!(err.contains("no room for merges"), "{err}");
        let tok = train_tokenizer(&texts, 258).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        tok.save(&path, false).unwrap();
        let tok = crate::model::Tokenizer::from_file(&path).unwrap();
        assert_eq!(tok.vocab_size(), 258);
        assert!(check_tokenizer(&tok, &texts).is_ok());
        let bracket = vec!["see [x]".to_string()];
        let err = check_tokenizer(&tok, &bracket).unwrap_err().to_string();
        assert!(err.contains("raise --vocab-size"), "{err}");
    }

    /// The lengths of `data_seed`'s training sequences as a run encodes them with the tokenizer
    /// in `out`: before and after the cut to n_positions, and the sequences cut.
    fn encoded(out: &Path, o: &TrainOptions) -> (Vec<usize>, Vec<Vec<u32>>) {
        let tok = crate::model::Tokenizer::from_file(&out.join("tokenizer.json")).unwrap();
        let mut full = Vec::new();
        let mut seqs = Vec::new();
        for p in crate::demo::corpus::training_sequences(o.data_seed, o.docs) {
            let mut ids = encode_pieces(&tok, &p).unwrap();
            full.push(ids.len());
            ids.truncate(o.n_positions);
            seqs.push(ids);
        }
        (full, seqs)
    }

    /// `seed` draws the weights and the batch order, `data_seed` the corpus: a run with the two
    /// apart records its seed, writes the tokenizer trained on `data_seed`'s texts, starts from
    /// `seed`'s weights (its first loss is theirs on its first batch), and `check_folder`
    /// checks `data_seed`'s first sequences cut to n_positions.
    #[test]
    fn a_run_takes_its_corpus_from_data_seed_and_its_weights_from_seed() {
        let o = TrainOptions {
            seed: 5,
            data_seed: 9,
            steps: 1,
            check_sequences: 3,
            ..tiny_run()
        };
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("m");
        let r = run(&out, &o, "test", &mut |_| {}).unwrap();
        assert_eq!((r.seed, r.options.data_seed), (5, 9));
        let texts = crate::demo::corpus::tokenizer_texts(9, o.docs);
        let tok = train_tokenizer(&texts, o.vocab_size).unwrap();
        assert!(
            std::fs::read_to_string(out.join("tokenizer.json")).unwrap()
                == tok.to_string(true).unwrap(),
            "the tokenizer is not the one of data_seed's texts"
        );

        let (full, seqs) = encoded(&out, &o);
        assert!(seqs.iter().all(|s| s.len() >= 2));
        let lens: Vec<usize> = seqs.iter().map(Vec::len).collect();
        let mut rng = Rng::new(5 ^ 0x5EED_BA7C_0000_0001);
        let first = epoch_batches(&lens, o.batch, o.bucket_batches, &mut rng).remove(0);
        let batch = Batch::new(&seqs, &first, r.data.eot_id).unwrap();
        let model = TrainModel::init(&r.config, 5).unwrap();
        let loss = model.loss(&batch).unwrap().to_scalar::<f32>().unwrap();
        assert_eq!(loss, r.step_losses[0]);

        assert!(full[..3].iter().any(|&n| n > o.n_positions), "{full:?}");
        let check = check_folder(&out, &o).unwrap();
        let loaded = crate::Model::load(&out).unwrap();
        let trained = TrainModel::from_weights(loaded.config(), loaded.weights()).unwrap();
        let want = check_against_reference(&out, &trained, &seqs[..3]).unwrap();
        assert_eq!(check.positions, want.positions);
        assert_eq!(check.max_abs_diff, want.max_abs_diff);
    }

    /// Each log entry averages its own window: the loss is the mean of the window's step
    /// losses and padded_len the mean of its batches' padded lengths; lr is the window's last
    /// step's, and grad_norm the norm before clipping (a clip of 1e-3 is below every norm).
    #[test]
    fn each_log_entry_averages_its_window_with_the_last_steps_lr_and_unclipped_norm() {
        // Sequences cut to 256 tokens rather than 24, so that batches differ in padded length.
        let o = TrainOptions {
            grad_clip: 1e-3,
            n_positions: 256,
            ..tiny_run()
        };
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("m");
        let r = run(&out, &o, "test", &mut |_| {}).unwrap();
        let (_, seqs) = encoded(&out, &o);
        let lens: Vec<usize> = seqs.iter().map(Vec::len).collect();
        let mut rng = Rng::new(o.seed ^ 0x5EED_BA7C_0000_0001);
        let mut order = epoch_batches(&lens, 4, 1, &mut rng);
        order.extend(epoch_batches(&lens, 4, 1, &mut rng));
        let padded: Vec<f64> = order
            .iter()
            .map(|b| b.iter().map(|&i| lens[i] - 1).max().unwrap() as f64)
            .collect();
        assert!(
            [(0, 1), (2, 3)]
                .iter()
                .all(|&(a, b)| padded[a] != padded[b]),
            "{padded:?}"
        );
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs();
        assert_eq!(r.losses.len(), 3);
        for (e, (a, b)) in r.losses.iter().zip([(0, 2), (2, 4), (4, 5)]) {
            let n = (b - a) as f64;
            let loss = r.step_losses[a..b].iter().map(|&l| l as f64).sum::<f64>() / n;
            assert!(
                close(e.loss, loss),
                "step {}: loss {} vs {loss}",
                e.step,
                e.loss
            );
            let len = padded[a..b].iter().sum::<f64>() / n;
            assert!(
                close(e.padded_len, len),
                "step {}: {} vs {len}",
                e.step,
                e.padded_len
            );
            assert_eq!(e.lr, o.lr_at(b - 1), "step {}", e.step);
            assert!(
                e.grad_norm > 10.0 * o.grad_clip,
                "step {}: {}",
                e.step,
                e.grad_norm
            );
        }
    }

    /// A run whose reference check fails still completes its folder (training.json, with the
    /// figures to read, and no marker) and then fails, naming both figures.
    #[test]
    fn a_failed_reference_check_completes_the_folder_and_fails_the_run() {
        let o = TrainOptions {
            steps: 1,
            ..tiny_run()
        };
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("m");
        let mut report = run(&out, &o, "test", &mut |_| {}).unwrap();
        report.reference.max_abs_diff = 0.5;
        report.reference.engine_vs_reference = 1e-6;
        std::fs::remove_file(out.join("training.json")).unwrap();
        let marker = out.join(INCOMPLETE_MARKER);
        std::fs::write(&marker, "stopped").unwrap();
        let err = finish_folder(&out, &marker, &report)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("disagree") && err.contains("= 5e-1") && err.contains("(1e-6)"),
            "{err}"
        );
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("training.json")).unwrap())
                .unwrap();
        assert_eq!(written["reference"]["max_abs_diff"], 0.5);
        assert!(!marker.exists());
    }

    /// Sequences cut to 2 tokens (n_positions 2) are kept: 2 tokens is one prediction.
    #[test]
    fn sequences_cut_to_two_tokens_are_kept() {
        let o = TrainOptions {
            n_positions: 2,
            steps: 1,
            ..tiny_run()
        };
        let tmp = tempfile::tempdir().unwrap();
        let r = run(&tmp.path().join("m"), &o, "test", &mut |_| {}).unwrap();
        let n = crate::demo::corpus::training_sequences(o.data_seed, o.docs).len();
        let d = &r.data;
        assert_eq!(
            (d.sequences, d.dropped_short, d.truncated, d.max_len),
            (n, 0, n, 2)
        );
    }

    /// config.json names the <|endoftext|> id as bos, eos and pad, and keeps the config's
    /// epsilon (the reference and the engine read it).
    #[test]
    fn config_json_names_the_eot_id_and_keeps_the_epsilon() {
        let mut config = TrainOptions::default().gptj_config(500);
        config.layer_norm_epsilon = 1e-3;
        let dir = tempfile::tempdir().unwrap();
        write_config(dir.path(), &config, 499).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
                .unwrap();
        for key in ["bos_token_id", "eos_token_id", "pad_token_id"] {
            assert_eq!(v[key], 499, "{key}");
        }
        assert_eq!(v["layer_norm_epsilon"], 1e-3);
        let read = GptjConfig::from_file(&dir.path().join("config.json")).unwrap();
        assert_eq!(read, config);
    }
}
