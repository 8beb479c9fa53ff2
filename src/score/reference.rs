//! The oracle scorer: every variant of every candidate as its own sequence through the f64
//! reference forward. Nothing shared, nothing cached: the obviously-correct way.

use super::{variant_sequence, ScoreOptions, Scorer, TokenCandidate, Variant};
use crate::error::{Error, Result};
use crate::model::{GptjConfig, Model};
use crate::reference::ReferenceModel;

/// The f64 oracle as a `Scorer`: slow, for small models and for rescoring candidates near tau_f.
#[derive(Debug)]
pub struct ReferenceScorer {
    model: ReferenceModel,
}

impl ReferenceScorer {
    /// Widens `model`'s weights to f64 (8 bytes per parameter).
    pub fn new(model: &Model) -> Self {
        ReferenceScorer {
            model: ReferenceModel::new(model.config(), model.weights()),
        }
    }

    /// The f64 forward it scores with.
    pub fn model(&self) -> &ReferenceModel {
        &self.model
    }

    /// L_i(z) for an explicit prefix z: the paper's weighted loss of text x at position i. Unlike a
    /// candidate, position 0 is allowed when z is not empty (z provides the context). An error
    /// when the arguments cannot be scored: an empty text, position 0 with an empty z, a position
    /// past the text, bad weights, an id outside the vocabulary, z + the text up to its last
    /// weighted token longer than n_positions.
    pub fn weighted_loss(
        &self,
        z: &[u32],
        text: &[u32],
        position: usize,
        weights: &[f64],
        placement: super::Placement,
    ) -> Result<f64> {
        if position == 0 && z.is_empty() && !text.is_empty() {
            return Err(Error::input(
                "position 0 cannot be scored with an empty prefix z: nothing predicts the first \
                 text token",
            ));
        }
        let c = TokenCandidate {
            text_ids: text.into(),
            position,
            call_ids: z.to_vec(),
            call_result_ids: Vec::new(),
            weights: Some(weights.to_vec()),
        };
        let options = ScoreOptions {
            placement,
            ..Default::default()
        };
        super::candidate::validate_at(&c, self.model.config(), &options, true)
            .map_err(|e| Error::input(e.to_string()))?;
        Ok(self.variant_loss(&c, Variant::Call, &options))
    }

    /// L of one variant of one candidate, which passed `validate` (an id outside the vocabulary
    /// would index past the embedding).
    fn variant_loss(&self, c: &TokenCandidate, variant: Variant, options: &ScoreOptions) -> f64 {
        let seq = variant_sequence(c, variant, options);
        let rows: Vec<(usize, u32)> = seq.targets.iter().map(|&(r, t, _)| (r, t)).collect();
        let log_probs = if rows.is_empty() {
            Vec::new() // every weight is zero: nothing to compute
        } else {
            self.model.log_probs_at(&seq.ids, &rows)
        };
        -seq.targets
            .iter()
            .zip(log_probs)
            .map(|(&(_, _, w), lp)| w * lp)
            .sum::<f64>()
    }
}

impl Scorer for ReferenceScorer {
    fn name(&self) -> &str {
        "cpu-reference"
    }

    fn config(&self) -> &GptjConfig {
        self.model.config()
    }

    fn variant_losses_unchecked(
        &self,
        candidates: &[TokenCandidate],
        options: &ScoreOptions,
    ) -> Result<Vec<[f64; 3]>> {
        Ok(candidates
            .iter()
            .map(|c| Variant::ALL.map(|v| self.variant_loss(c, v, options)))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::cpu::CpuScorer;
    use crate::model::{DType, GptjWeights};
    use crate::score::{LossWeights, Placement};

    fn model(n_positions: usize) -> Model {
        let mut config = GptjConfig::small(1, 8, 2, 2, 40);
        config.n_positions = n_positions;
        let weights = GptjWeights::random(&config, 7, DType::F32);
        Model::from_parts(config, weights, None).unwrap()
    }

    #[test]
    fn weighted_loss_refuses_what_it_cannot_score() {
        let scorer = ReferenceScorer::new(&model(64));
        let text = [3, 4, 5, 6];
        let w = [1.0, 0.5];
        let err = scorer
            .weighted_loss(&[], &text, 0, &w, Placement::Prefix)
            .unwrap_err()
            .to_string();
        assert!(err.contains("position 0"), "{err}");
        for (z, position, weights) in [
            (&[1u32][..], 4, &w[..]),  // past the text
            (&[99][..], 1, &w[..]),    // outside the vocabulary
            (&[1][..], 1, &[][..]),    // no weights
            (&[1; 70][..], 1, &w[..]), // longer than n_positions
        ] {
            assert!(scorer
                .weighted_loss(z, &text, position, weights, Placement::Inline)
                .is_err());
        }
        assert!(scorer
            .weighted_loss(&[], &[], 0, &w, Placement::Prefix)
            .is_err());
        // Position 0 with a prefix: z gives the context.
        for placement in [Placement::Prefix, Placement::Inline] {
            let got = scorer
                .weighted_loss(&[1, 2], &text, 0, &w, placement)
                .unwrap();
            assert!(got.is_finite() && got > 0.0);
        }
    }

    #[test]
    fn trailing_zero_weights_change_no_score() {
        let m = model(32);
        let reference = ReferenceScorer::new(&m);
        let cpu = CpuScorer::new(&m);
        let text: Arc<[u32]> = (0..30).map(|k| (k * 7 + 3) % 40).collect();
        let cand = |position: usize, weights: Option<Vec<f64>>| TokenCandidate {
            text_ids: text.clone(),
            position,
            call_ids: vec![1, 5, 9],
            call_result_ids: vec![1, 5, 9, 2, 11],
            weights,
        };
        let padded = |w: &[f64], zeros: usize| {
            let mut w = w.to_vec();
            w.extend(std::iter::repeat_n(0.0, zeros));
            w
        };
        let paper = LossWeights::default().as_slice().to_vec();
        for placement in [Placement::Prefix, Placement::Inline] {
            let options = ScoreOptions {
                placement,
                ..Default::default()
            };
            // Position 26 with [1]: 5 call tokens + 27 text tokens = 32 = n_positions.
            let plain = vec![
                cand(3, None),
                cand(20, Some(paper.clone())),
                cand(26, Some(vec![1.0])),
                cand(20, Some(vec![0.5, 0.0, 0.25])),
            ];
            let with_zeros = vec![
                cand(3, Some(padded(&paper, 3))),
                cand(20, Some(padded(&paper, 20))),
                cand(26, Some(padded(&[1.0], 20))),
                cand(20, Some(padded(&[0.5, 0.0, 0.25], 1))),
            ];
            for scorer in [&reference as &dyn Scorer, &cpu] {
                let a = scorer.score(&plain, &options).unwrap();
                let b = scorer.score(&with_zeros, &options).unwrap();
                assert_eq!(a, b, "{} {placement:?}", scorer.name());
            }
            // No positive weight before the end of the 30-token text: refused by both scorers,
            // as an all-zero vector is (each would give losses of 0 with nothing measured).
            let late = |zeros: usize, w: f64| {
                let mut v = vec![0.0; zeros];
                v.push(w);
                v
            };
            for c in [
                cand(5, Some(late(25, 1.0))),
                cand(25, Some(late(5, 0.5))),
                cand(5, Some(vec![0.0; 3])),
            ] {
                let batch = [plain[0].clone(), c];
                for scorer in [&reference as &dyn Scorer, &cpu] {
                    let err = scorer.score(&batch, &options).unwrap_err().to_string();
                    assert!(
                        err.contains("candidate 1")
                            && (err.contains("no positive weight falls on a text token")
                                || err.contains("at least one positive weight")),
                        "{}: {err}",
                        scorer.name()
                    );
                }
            }
        }
    }

    /// weighted_loss is L_i(z) under the placement and the weights it is given: the l_call that
    /// `score` gives a candidate whose call is z, with those weights, prefix and inline.
    #[test]
    fn weighted_loss_is_the_call_variants_loss_under_its_placement_and_weights() {
        let scorer = ReferenceScorer::new(&model(64));
        let text: Arc<[u32]> = (0..12).map(|k| (k * 11 + 5) % 40).collect();
        let (z, w) = (vec![7, 2, 31], vec![0.9, 0.3, 0.6]);
        let mut losses = Vec::new();
        for placement in [Placement::Prefix, Placement::Inline] {
            let c = TokenCandidate {
                text_ids: text.clone(),
                position: 5,
                call_ids: z.clone(),
                call_result_ids: vec![7, 2, 31, 19],
                weights: Some(w.clone()),
            };
            let options = ScoreOptions {
                placement,
                ..Default::default()
            };
            let want = scorer.score(&[c], &options).unwrap()[0].l_call;
            let got = scorer.weighted_loss(&z, &text, 5, &w, placement).unwrap();
            assert_eq!(got, want, "{placement:?}");
            losses.push(got);
        }
        assert_ne!(losses[0], losses[1]);
    }

    /// An empty text is refused as empty, with or without z: at position 0 with no z too, where
    /// "position 0" would send the caller looking for a prefix that cannot help.
    #[test]
    fn an_empty_text_is_refused_as_empty_with_or_without_z() {
        let scorer = ReferenceScorer::new(&model(64));
        for z in [&[][..], &[1, 2][..]] {
            let err = scorer
                .weighted_loss(z, &[], 0, &[1.0], Placement::Prefix)
                .unwrap_err()
                .to_string();
            assert!(err.contains("text is empty"), "{z:?}: {err}");
        }
    }

    /// The oracle is told from the engines by its name, as "cpu" and "cuda" are.
    #[test]
    fn the_oracle_scorer_is_named_cpu_reference() {
        assert_eq!(ReferenceScorer::new(&model(64)).name(), "cpu-reference");
    }
}
