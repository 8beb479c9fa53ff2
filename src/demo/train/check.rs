//! The proof that the trained model is the engine's: the written folder, loaded by
//! `Model::load` and run by the f64 oracle, gives candle's log-probs.

use std::path::Path;

use anyhow::{ensure, Result};
use serde::Serialize;

use super::{encode_pieces, TrainModel, TrainOptions};

/// The reference check's result: candle's log-probs against the f64 oracle's.
#[derive(Debug, Clone, Serialize)]
pub struct ReferenceCheck {
    /// Sequences compared.
    pub sequences: usize,
    /// Positions compared, each over all vocab_size ids.
    pub positions: usize,
    /// max |log p candle - log p f64| over every position and id.
    pub max_abs_diff: f64,
    /// Where it is: (sequence, position, id), all 0-based.
    pub worst: (usize, usize, u32),
    /// The f64 log p at `worst`.
    pub worst_log_p: f64,
    /// The same maximum over the entries with an f64 log p >= -20 (the ids a sampler can draw):
    /// f32 rounding grows with |log p|, so the improbable ids carry the largest differences.
    pub max_abs_diff_likely: f64,
    /// For scale: max |log p - log p f64| of toolsift's own f32 CPU engine (`cpu::CpuScorer`) on
    /// the same folder and sequences.
    pub engine_vs_reference: f64,
    /// max |log p candle - log p engine| over the same entries.
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
        loaded.config() == model.config(),
        "config.json reads back as {:?}, trained {:?}",
        loaded.config(),
        model.config()
    );
    let reference = crate::reference::ReferenceModel::new(loaded.config(), loaded.weights());
    let engine = crate::cpu::CpuScorer::new(&loaded);
    let all_ids: Vec<u32> = (0..loaded.config().vocab_size as u32).collect();
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
                check.engine_vs_reference = worst_of(check.engine_vs_reference, (x - b).abs());
                check.candle_vs_engine = worst_of(check.candle_vs_engine, (a - x).abs());
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
                    check.max_abs_diff_likely = worst_of(check.max_abs_diff_likely, d);
                }
            }
        }
        check.positions += s.len();
    }
    Ok(check)
}

/// The larger of a running worst difference and a new one, NaN counting as infinite (`f64::max`
/// would drop it, hiding a NaN from the figures).
fn worst_of(worst: f64, d: f64) -> f64 {
    if d.is_nan() {
        f64::INFINITY
    } else {
        worst.max(d)
    }
}

/// Checks an existing model folder (one `train-demo` wrote, or any GPT-J folder with a
/// tokenizer) the way `run` checks what it trained: the first `o.check_sequences` training
/// sequences of `o.data_seed`, tokenized by the folder's tokenizer, through candle and the f64
/// reference.
pub fn check_folder(dir: &Path, o: &TrainOptions) -> Result<ReferenceCheck> {
    let loaded = crate::Model::load(dir)?;
    let tok = loaded.tokenizer()?;
    let model = TrainModel::from_weights(loaded.config(), loaded.weights())?;
    let mut seqs = Vec::new();
    for p in crate::demo::corpus::training_sequences(o.data_seed, o.check_sequences.max(1)) {
        let mut ids = encode_pieces(tok, &p)?;
        ids.truncate(loaded.config().n_positions);
        seqs.push(ids);
    }
    seqs.truncate(o.check_sequences.max(1));
    check_against_reference(dir, &model, &seqs)
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;
    use crate::demo::train::tests::write_checked_folder;

    fn check(max_abs_diff: f64, engine_vs_reference: f64) -> ReferenceCheck {
        ReferenceCheck {
            sequences: 1,
            positions: 1,
            max_abs_diff,
            worst: (0, 0, 0),
            worst_log_p: 0.0,
            max_abs_diff_likely: 0.0,
            engine_vs_reference,
            candle_vs_engine: 0.0,
        }
    }

    /// The gate: within 1e-4 of the reference passes whatever the engine's error, beyond it only
    /// within twice the engine's own error.
    #[test]
    fn the_gate_is_1e_4_or_twice_the_engines_error() {
        assert!(check(5e-5, 0.0).passes());
        assert!(check(1e-4, 0.0).passes());
        assert!(check(1e-3, 6e-4).passes());
        assert!(!check(1e-3, 4e-4).passes());
        assert!(!check(f64::INFINITY, 1.0).passes());
    }

    /// A candle forward that gives NaN (a NaN weight the written folder does not have) is the
    /// worst difference and fails the check, not a difference of 0; positions count every token.
    #[test]
    fn a_nan_in_candles_log_probs_fails_the_check() {
        let config = small_config();
        let model = TrainModel::init(&config, 2).unwrap();
        let dir = tempfile::tempdir().unwrap();
        write_checked_folder(dir.path(), &config, 23, &model.named_tensors().unwrap());
        let seqs = vec![vec![1, 2, 3], vec![4, 5]];
        let ok = check_against_reference(dir.path(), &model, &seqs).unwrap();
        assert!(ok.passes() && ok.max_abs_diff < 1e-5, "{ok:?}");
        assert_eq!((ok.sequences, ok.positions), (2, 5));
        let (_, bias) = model
            .named_vars()
            .iter()
            .find(|(n, _)| n == "lm_head.bias")
            .unwrap();
        bias.set(&Tensor::full(f32::NAN, 24, &Device::Cpu).unwrap())
            .unwrap();
        let bad = check_against_reference(dir.path(), &model, &seqs).unwrap();
        assert_eq!(bad.max_abs_diff, f64::INFINITY);
        assert!(!bad.passes());
    }

    #[test]
    fn a_nan_difference_is_the_worst_and_stays_so() {
        let worst = [0.5, f64::NAN, 2.0].into_iter().fold(0.0, worst_of);
        assert_eq!(worst, f64::INFINITY);
        assert_eq!([0.5, 2.0, 1.0].into_iter().fold(0.0, worst_of), 2.0);
    }

    /// One layer, 16 wide, two heads, 24 ids.
    fn small_config() -> crate::model::GptjConfig {
        TrainOptions {
            n_layer: 1,
            n_embd: 16,
            n_head: 2,
            rotary_dim: 4,
            n_positions: 16,
            ..TrainOptions::default()
        }
        .gptj_config(24)
    }

    /// Each figure compares its own pair and `worst` names the entry of `max_abs_diff`: a
    /// folder whose lm_head bias puts id 5 near log p -43 while candle's model (bias 0) has it
    /// near -3 differs most there, `worst_log_p` is the reference's log p (not candle's), and
    /// those entries stay out of the likely figure (the reference's log p is below -20);
    /// the engine runs the folder, so it agrees with the reference and not with candle.
    #[test]
    fn the_worst_entry_is_located_at_the_references_log_p_and_kept_out_of_the_likely_figure() {
        let config = small_config();
        let model = TrainModel::init(&config, 2).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut tensors = model.named_tensors().unwrap();
        for (name, t) in &mut tensors {
            if name == "lm_head.bias" {
                let mut v = vec![0f32; 24];
                v[5] = -40.0;
                *t = crate::model::Tensor::from_f32(vec![24], &v);
            }
        }
        write_checked_folder(dir.path(), &config, 23, &tensors);
        let seqs = vec![vec![1, 2, 3], vec![4, 6, 7, 8]];
        let check = check_against_reference(dir.path(), &model, &seqs).unwrap();

        let loaded = crate::Model::load(dir.path()).unwrap();
        let reference = crate::reference::ReferenceModel::new(loaded.config(), loaded.weights());
        let (k, i, id) = check.worst;
        let r = reference.log_softmax(&seqs[k]);
        let c = model.log_softmax(&seqs[k]).unwrap();
        assert_eq!(id, 5, "{check:?}");
        assert_eq!(check.worst_log_p, r.row(i)[5]);
        assert_eq!((c[i][5] as f64 - r.row(i)[5]).abs(), check.max_abs_diff);
        assert!(
            check.max_abs_diff > 30.0 && check.worst_log_p < -40.0,
            "{check:?}"
        );
        assert!(check.max_abs_diff_likely < 0.1, "{check:?}");
        assert!(check.engine_vs_reference < 1e-4, "{check:?}");
        let engine = crate::cpu::CpuScorer::new(&loaded);
        let ids: Vec<u32> = (0..24).collect();
        let mut candle_vs_engine = 0f64;
        for s in &seqs {
            let c = model.log_softmax(s).unwrap();
            let e = crate::sample::Sampler::token_log_probs(&engine, s, &ids).unwrap();
            for (a, x) in c.iter().flatten().zip(e.iter().flatten()) {
                candle_vs_engine = candle_vs_engine.max((*a as f64 - *x as f64).abs());
            }
        }
        assert_eq!(check.candle_vs_engine, candle_vs_engine);
        assert!(!check.passes());
    }

    /// A folder whose config.json is not the model's (another n_positions, with which the
    /// weights still load and the log-probs still agree) is refused rather than compared.
    #[test]
    fn a_folder_whose_config_is_not_the_models_is_refused() {
        let config = small_config();
        let model = TrainModel::init(&config, 3).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let other = crate::model::GptjConfig {
            n_positions: 32,
            ..config.clone()
        };
        write_checked_folder(dir.path(), &other, 23, &model.named_tensors().unwrap());
        let err = check_against_reference(dir.path(), &model, &[vec![1, 2, 3]])
            .unwrap_err()
            .to_string();
        assert!(err.contains("config.json reads back as"), "{err}");
    }

    /// The log line puts each figure in its place.
    #[test]
    fn the_log_line_puts_each_figure_in_its_place() {
        let c = ReferenceCheck {
            sequences: 3,
            positions: 40,
            max_abs_diff: 2.5e-5,
            worst: (2, 7, 11),
            worst_log_p: -23.456,
            max_abs_diff_likely: 1.25e-6,
            engine_vs_reference: 3.5e-6,
            candle_vs_engine: 4.5e-5,
        };
        assert_eq!(
            c.describe(24),
            "reference check: 3 sequences (40 positions x 24 ids): max |log p candle - log p \
             f64| = 2.500e-5 (at sequence 2 position 7 id 11, log p -23.46); 1.250e-6 where log \
             p >= -20; toolsift's f32 CPU engine vs f64: 3.500e-6, candle vs the engine: 4.500e-5"
        );
    }
}
