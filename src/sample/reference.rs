//! `ReferenceSampler`: the sampling interface over the f64 oracle, one full forward per generated
//! token (no KV cache). Slow and obviously correct: the oracle the fast samplers (CPU, CUDA) are
//! checked against.
//!
//! Sample `s` of request `r` draws from `sample_rng(seed, r, s)` with the shared `draw`, exactly as
//! the fast samplers do, so results do not depend on batching, threads or backend.

use super::{
    batch, draw, sample_rng, Choose, Proposal, Sample, SampleOptions, SampleRequest, Sampler,
};
use crate::error::Result;
use crate::model::Model;
use crate::reference::ReferenceModel;

/// `Sampler` over the f64 oracle, one full forward per token (see the module docs).
#[derive(Debug)]
pub struct ReferenceSampler {
    model: ReferenceModel,
}

impl ReferenceSampler {
    /// Widens `model`'s weights to f64 (8 bytes per parameter).
    pub fn new(model: &Model) -> Self {
        ReferenceSampler {
            model: ReferenceModel::new(model.config(), model.weights()),
        }
    }
}

impl Sampler for ReferenceSampler {
    fn token_log_probs(&self, ids: &[u32], tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        let c = self.model.config();
        batch::check_sequence(ids, tokens, c.vocab_size, c.n_positions)?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let lp = self.model.log_softmax(ids);
        Ok((0..ids.len())
            .map(|i| {
                tokens
                    .iter()
                    .map(|&t| lp.row(i)[t as usize] as f32)
                    .collect()
            })
            .collect())
    }

    fn sample(
        &self,
        requests: &[SampleRequest],
        options: &SampleOptions,
    ) -> Result<Vec<Vec<Sample>>> {
        let c = self.model.config();
        batch::check_requests("request", requests, options, c.vocab_size, c.n_positions)?;
        requests
            .iter()
            .enumerate()
            .map(|(r, req)| {
                (0..req.n_samples)
                    .map(|s| {
                        let mut rng = sample_rng(options.seed, r, s);
                        let mut ids = req.prefix.clone();
                        let mut tokens = Vec::new();
                        let mut stopped = false;
                        while tokens.len() < options.max_new_tokens {
                            let lp = self.model.log_softmax(&ids);
                            let row: Vec<f32> =
                                lp.row(ids.len() - 1).iter().map(|&v| v as f32).collect();
                            let next = draw(&row, options, &mut rng);
                            tokens.push(next);
                            ids.push(next);
                            if options.stop_tokens.contains(&next) {
                                stopped = true;
                                break;
                            }
                        }
                        Ok(Sample { tokens, stopped })
                    })
                    .collect()
            })
            .collect()
    }

    /// The trait's `propose`, with the branches checked as the cached samplers check them, so
    /// that a bad one is named "branch r" by every sampler.
    fn propose(
        &self,
        ids: &[u32],
        tokens: &[u32],
        choose: &mut Choose<'_>,
        options: &SampleOptions,
    ) -> Result<Proposal> {
        let c = self.model.config();
        let limits = Some((c.vocab_size, c.n_positions));
        super::propose_in_two_calls(self, ids, tokens, choose, options, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DType, GptjConfig, GptjWeights};

    fn model() -> Model {
        let config = GptjConfig::small(1, 16, 2, 4, 32);
        Model::from_parts(
            config.clone(),
            GptjWeights::random(&config, 3, DType::F32),
            None,
        )
        .unwrap()
    }

    #[test]
    fn sampling_is_seeded_and_deterministic() {
        let s = ReferenceSampler::new(&model());
        let req = [SampleRequest {
            prefix: vec![1, 2, 3],
            n_samples: 3,
        }];
        let opts = SampleOptions {
            max_new_tokens: 6,
            stop_tokens: vec![7],
            seed: 11,
            ..Default::default()
        };
        let a = s.sample(&req, &opts).unwrap();
        assert_eq!(a, s.sample(&req, &opts).unwrap());
        let b = s
            .sample(
                &req,
                &SampleOptions {
                    seed: 12,
                    ..opts.clone()
                },
            )
            .unwrap();
        assert_ne!(a, b, "another seed draws other samples");
        for x in &a[0] {
            assert!(x.tokens.len() <= 6);
            assert_eq!(x.stopped, x.tokens.last() == Some(&7));
        }
    }

    #[test]
    fn log_probs_are_normalised_rows() {
        let s = ReferenceSampler::new(&model());
        let all: Vec<u32> = (0..32).collect();
        let lp = s.token_log_probs(&[1, 2, 3], &all).unwrap();
        for row in lp {
            let total: f64 = row.iter().map(|&l| (l as f64).exp()).sum();
            assert!((total - 1.0).abs() < 1e-5);
        }
    }
}
