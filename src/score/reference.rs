//! The oracle scorer: every variant of every candidate as its own sequence through the f64
//! reference forward. Nothing shared, nothing cached: the obviously-correct way.

use super::{variant_sequence, ScoreOptions, Scorer, TokenCandidate, Variant};
use crate::error::Result;
use crate::model::{GptjConfig, Model};
use crate::reference::ReferenceModel;

pub struct ReferenceScorer {
    model: ReferenceModel,
}

impl ReferenceScorer {
    pub fn new(model: &Model) -> Self {
        ReferenceScorer {
            model: ReferenceModel::new(&model.config, &model.weights),
        }
    }

    pub fn model(&self) -> &ReferenceModel {
        &self.model
    }

    /// L_i(z) for an explicit prefix z: the paper's weighted loss of text x at position i. Unlike a
    /// candidate, position 0 is allowed when z is not empty (z provides the context).
    pub fn weighted_loss(
        &self,
        z: &[u32],
        text: &[u32],
        position: usize,
        weights: &[f64],
        placement: super::Placement,
    ) -> f64 {
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
        self.variant_loss(&c, Variant::Call, &options)
    }

    /// L of one variant of one candidate.
    pub fn variant_loss(
        &self,
        c: &TokenCandidate,
        variant: Variant,
        options: &ScoreOptions,
    ) -> f64 {
        let seq = variant_sequence(c, variant, options);
        let rows: Vec<(usize, u32)> = seq.targets.iter().map(|&(r, t, _)| (r, t)).collect();
        let log_probs = self.model.log_probs_at(&seq.ids, &rows);
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

    fn variant_losses(
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
