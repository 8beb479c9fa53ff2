//! Token-level candidates and the exact sequence each variant scores.

use std::sync::Arc;

use super::{Placement, ScoreOptions, Variant};
pub use crate::error::InvalidCandidate;
use crate::model::GptjConfig;

/// One candidate call at one position of one text, in tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenCandidate {
    /// x_1 .. x_n. Candidates of one text may share this allocation.
    pub text_ids: Arc<[u32]>,
    /// Index into `text_ids` of x_i, the first scored token (the call goes just before it).
    pub position: usize,
    /// e(c, eps) as it is inserted, separator included.
    pub call_ids: Vec<u32>,
    /// e(c, r) as it is inserted, separator included.
    pub call_result_ids: Vec<u32>,
    /// Loss weights for this candidate; `None` uses the batch's.
    pub weights: Option<Vec<f64>>,
}

impl TokenCandidate {
    /// The call ids `variant` inserts (none for `Variant::None`).
    pub fn prefix(&self, variant: Variant) -> &[u32] {
        match variant {
            Variant::None => &[],
            Variant::Call => &self.call_ids,
            Variant::CallResult => &self.call_result_ids,
        }
    }

    /// This candidate's loss weights, or else `options`'.
    pub fn weights<'a>(&'a self, options: &'a ScoreOptions) -> &'a [f64] {
        self.weights
            .as_deref()
            .unwrap_or(options.weights.as_slice())
    }

    /// The weighted window: (t, w_t) for every t up to the last non-zero weight whose token
    /// x_{i+t} is in the text (zero weights before it included, none after it).
    pub fn window<'a>(
        &'a self,
        options: &'a ScoreOptions,
    ) -> impl Iterator<Item = (usize, f64)> + 'a {
        self.weights(options)[..self.scored_len(options)]
            .iter()
            .enumerate()
            .map(|(t, &w)| (t, w))
    }

    /// One past the last text token any variant needs: nothing after x_{i+T-1} is computed, where
    /// w_{T-1} is the last non-zero weight with a token in the text (zero weights after it, and
    /// non-zero ones past the end of the text, add no token; with none, which `validate`
    /// refuses, no text token from x_i on is needed).
    pub fn text_end(&self, options: &ScoreOptions) -> usize {
        (self.position + self.scored_len(options)).min(self.text_ids.len())
    }

    /// The window's length: T as above.
    fn scored_len(&self, options: &ScoreOptions) -> usize {
        let weights = self.weights(options);
        let in_text = self.text_ids.len().saturating_sub(self.position);
        window_len(&weights[..weights.len().min(in_text)])
    }
}

/// T: one past the index of the last non-zero weight (0 when every weight is zero).
pub fn window_len(weights: &[f64]) -> usize {
    weights.iter().rposition(|&w| w != 0.0).map_or(0, |t| t + 1)
}

/// A variant as one causal sequence, and the (row, token, weight) terms of its loss:
/// L = -sum weight * log p(token | ids[0..=row]).
#[derive(Debug, Clone, PartialEq)]
pub struct VariantSequence {
    /// The token ids, cut after the last weighted token.
    pub ids: Vec<u32>,
    /// `(row, token, weight)`: a 0-based index into `ids` whose hidden state predicts `token`
    /// (the id at `row + 1`), and its loss weight w_t; only non-zero weights, in window order.
    pub targets: Vec<(usize, u32, f64)>,
}

/// The specification of what a variant scores; every backend must agree with it.
///
/// Prefix placement: z ++ x_1 .. x_{i+T-1}. Inline: x_1 .. x_{i-1} ++ z ++ x_i .. x_{i+T-1}, T the
/// loss window (the weights up to the last positive one), cut at the text's end. In both,
/// x_{i+t} (1-based) sits at index |z| + i + t - 1 and is predicted by the row before it. `c`
/// must pass `validate` for `options` (otherwise it may panic: a position past the text does
/// inline).
pub fn variant_sequence(
    c: &TokenCandidate,
    variant: Variant,
    options: &ScoreOptions,
) -> VariantSequence {
    let z = c.prefix(variant);
    let x = &c.text_ids[..c.text_end(options)];
    let ids = match options.placement {
        Placement::Prefix => [z, x].concat(),
        Placement::Inline => [&x[..c.position], z, &x[c.position..]].concat(),
    };
    let targets = c
        .window(options)
        .filter(|&(_, w)| w != 0.0)
        .map(|(t, w)| (z.len() + c.position + t - 1, c.text_ids[c.position + t], w))
        .collect();
    VariantSequence { ids, targets }
}

/// Why `c` cannot be scored with this model, if it cannot.
pub fn validate(
    c: &TokenCandidate,
    config: &GptjConfig,
    options: &ScoreOptions,
) -> Result<(), InvalidCandidate> {
    validate_at(c, config, options, false)?;
    if c.call_result_ids.is_empty() {
        return Err(InvalidCandidate::EmptyCallResult);
    }
    Ok(())
}

/// `validate`, allowing position 0 when `position_0` is set (the caller has made sure that every
/// scored variant has a non-empty prefix to predict x_0 from).
pub(crate) fn validate_at(
    c: &TokenCandidate,
    config: &GptjConfig,
    options: &ScoreOptions,
    position_0: bool,
) -> Result<(), InvalidCandidate> {
    let n = c.text_ids.len();
    if n == 0 {
        return Err(InvalidCandidate::EmptyText);
    }
    if c.position == 0 && !position_0 {
        return Err(InvalidCandidate::PositionZero);
    }
    if c.position >= n {
        return Err(InvalidCandidate::PositionOutOfRange {
            position: c.position,
            text_len: n,
        });
    }
    if let Some(w) = &c.weights {
        super::weights::check(w).map_err(InvalidCandidate::Weights)?;
    }
    for (field, ids) in [
        ("text_ids", &c.text_ids[..]),
        ("call_ids", &c.call_ids[..]),
        ("call_result_ids", &c.call_result_ids[..]),
    ] {
        if let Some((index, &id)) = ids
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= config.vocab_size)
        {
            return Err(InvalidCandidate::OutOfVocabulary {
                field,
                index,
                id,
                vocab_size: config.vocab_size,
            });
        }
    }
    if c.scored_len(options) == 0 {
        let weights = c.weights(options);
        return Err(InvalidCandidate::NothingWeighted {
            position: c.position,
            tokens_after: n - c.position,
            first_positive: weights
                .iter()
                .position(|&w| w > 0.0)
                .unwrap_or(weights.len()),
        });
    }
    let tokens = c.call_ids.len().max(c.call_result_ids.len()) + c.text_end(options);
    if tokens > config.n_positions {
        return Err(InvalidCandidate::TooLong {
            tokens,
            n_positions: config.n_positions,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand() -> TokenCandidate {
        TokenCandidate {
            text_ids: vec![10, 11, 12, 13, 14, 15, 16, 17].into(),
            position: 3,
            call_ids: vec![1, 2],
            call_result_ids: vec![1, 2, 3],
            weights: None,
        }
    }

    #[test]
    fn a_call_that_inserts_nothing_is_refused() {
        let config = GptjConfig::small(1, 8, 2, 2, 32);
        let options = ScoreOptions::default();
        let empty = TokenCandidate {
            call_ids: Vec::new(),
            call_result_ids: Vec::new(),
            ..cand()
        };
        let err = validate(&empty, &config, &options).unwrap_err();
        assert_eq!(err, InvalidCandidate::EmptyCallResult);
        let err = err.to_string();
        assert!(
            err.contains("call_result_ids is empty") && !err.contains("  "),
            "{err}"
        );
        // The call without its result may be empty: L_call is then L_none, as the paper's
        // min(L_none, L_call) allows.
        let bare = TokenCandidate {
            call_ids: Vec::new(),
            ..cand()
        };
        assert_eq!(validate(&bare, &config, &options), Ok(()));
    }

    /// Each check gives its own reason, with the numbers a caller would act on.
    #[test]
    fn each_refusal_has_its_own_reason() {
        let config = GptjConfig::small(1, 8, 2, 2, 32);
        let o = ScoreOptions::default();
        let refused = |c: TokenCandidate| validate(&c, &config, &o).unwrap_err();
        assert_eq!(
            refused(TokenCandidate {
                text_ids: Vec::new().into(),
                ..cand()
            }),
            InvalidCandidate::EmptyText
        );
        assert_eq!(
            refused(TokenCandidate {
                position: 0,
                ..cand()
            }),
            InvalidCandidate::PositionZero
        );
        let past = refused(TokenCandidate {
            position: 8,
            ..cand()
        });
        assert_eq!(
            past,
            InvalidCandidate::PositionOutOfRange {
                position: 8,
                text_len: 8
            }
        );
        assert!(
            past.to_string().contains("scorable positions are 1 to 7"),
            "{past}"
        );
        let one = TokenCandidate {
            text_ids: vec![1].into(),
            position: 1,
            ..cand()
        };
        let alone = refused(one);
        assert_eq!(
            alone,
            InvalidCandidate::PositionOutOfRange {
                position: 1,
                text_len: 1
            }
        );
        assert!(
            alone.to_string().contains("no position can be scored"),
            "{alone}"
        );
        assert_eq!(
            refused(TokenCandidate {
                call_result_ids: vec![1, 32, 3],
                ..cand()
            }),
            InvalidCandidate::OutOfVocabulary {
                field: "call_result_ids",
                index: 1,
                id: 32,
                vocab_size: 32
            }
        );
        assert!(matches!(
            refused(TokenCandidate {
                weights: Some(vec![f64::NAN]),
                ..cand()
            }),
            InvalidCandidate::Weights(why) if why.contains("weights[0] = NaN")
        ));
    }

    #[test]
    fn prefix_and_inline_sequences() {
        let c = cand();
        let prefix = ScoreOptions::default();
        let s = variant_sequence(&c, Variant::CallResult, &prefix);
        assert_eq!(s.ids, vec![1, 2, 3, 10, 11, 12, 13, 14, 15, 16, 17]);
        assert_eq!(s.targets[0].0, 3 + 3 - 1);
        assert_eq!(s.targets[0].1, 13);
        let inline = ScoreOptions {
            placement: Placement::Inline,
            ..Default::default()
        };
        let s = variant_sequence(&c, Variant::Call, &inline);
        assert_eq!(s.ids, vec![10, 11, 12, 1, 2, 13, 14, 15, 16, 17]);
        assert_eq!(s.targets.len(), 5);
        let (row, token, w) = s.targets[4];
        assert_eq!((row, token), (2 + 3 + 4 - 1, 17));
        assert!((w - 0.2 / 3.0).abs() < 1e-15);
        let s = variant_sequence(&c, Variant::None, &inline);
        assert_eq!(s.ids, vec![10, 11, 12, 13, 14, 15, 16, 17]);
    }

    #[test]
    fn trailing_zero_weights_add_no_tokens() {
        let o = ScoreOptions::default();
        let mut c = cand();
        c.position = 1;
        let base = c.text_end(&o);
        assert_eq!(base, 6);
        let mut padded = o.weights.as_slice().to_vec();
        padded.extend([0.0; 20]);
        c.weights = Some(padded);
        assert_eq!(c.text_end(&o), base);
        assert_eq!(c.window(&o).count(), 5);
        for placement in [Placement::Prefix, Placement::Inline] {
            let o = ScoreOptions {
                placement,
                ..Default::default()
            };
            let mut plain = c.clone();
            plain.weights = None;
            for v in Variant::ALL {
                assert_eq!(variant_sequence(&c, v, &o), variant_sequence(&plain, v, &o));
            }
        }
        // A zero inside the window keeps its token (a later weight needs it).
        c.weights = Some(vec![1.0, 0.0, 0.5, 0.0, 0.0]);
        assert_eq!(c.text_end(&o), 4);
        assert_eq!(c.window(&o).count(), 3);
        assert_eq!(variant_sequence(&c, Variant::None, &o).targets.len(), 2);
        // A non-zero weight past the end of the text adds no token (nor the zeros before it).
        c.weights = Some(vec![1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
        assert_eq!(c.text_end(&o), 2);
        assert_eq!(c.window(&o).count(), 1);
        c.weights = Some(vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
        assert_eq!(c.text_end(&o), 1);
        assert_eq!(c.window(&o).count(), 0);
        // Every weight zero: no text token from x_i on, no target.
        c.weights = Some(vec![0.0; 4]);
        assert_eq!(c.text_end(&o), 1);
        assert_eq!(c.window(&o).count(), 0);
        for v in Variant::ALL {
            let s = variant_sequence(&c, v, &o);
            assert!(s.targets.is_empty());
            assert_eq!(s.ids.len(), c.prefix(v).len() + 1);
        }
    }

    #[test]
    fn trailing_zero_weights_do_not_make_a_candidate_too_long() {
        let config = GptjConfig {
            n_positions: 256,
            ..GptjConfig::small(1, 16, 2, 4, 64)
        };
        let text: Arc<[u32]> = (0..300).map(|k| k % 7).collect::<Vec<_>>().into();
        // 6 call tokens + x_1 .. x_241 = 247 tokens with one weight.
        let mut c = TokenCandidate {
            text_ids: text,
            position: 240,
            call_ids: vec![1; 5],
            call_result_ids: vec![2; 6],
            weights: Some(vec![1.0]),
        };
        let o = ScoreOptions::default();
        assert_eq!(validate(&c, &config, &o), Ok(()));
        let mut w = vec![1.0];
        w.extend([0.0; 20]);
        c.weights = Some(w);
        assert_eq!(validate(&c, &config, &o), Ok(()));
        // A non-zero weight 15 tokens further does need them: 6 + 256 tokens.
        let mut w = vec![1.0];
        w.extend([0.0; 14]);
        w.push(1.0);
        c.weights = Some(w);
        let err = validate(&c, &config, &o).unwrap_err();
        assert_eq!(
            err,
            InvalidCandidate::TooLong {
                tokens: 6 + 256,
                n_positions: 256
            }
        );
        assert!(err.to_string().contains("longer than n_positions (256)"));

        // No weighted token at all (the only positive weight falls past the end of the text):
        // refused, naming the first positive weight, before the length is looked at (251 + 6
        // tokens before the position would not fit either).
        c.position = 251;
        let mut w = vec![0.0; 59];
        w.push(1.0);
        c.weights = Some(w);
        let err = validate(&c, &config, &o).unwrap_err();
        assert_eq!(
            err,
            InvalidCandidate::NothingWeighted {
                position: 251,
                tokens_after: 49,
                first_positive: 59
            }
        );
        let err = err.to_string();
        assert!(
            err.contains("no positive weight falls on a text token")
                && err.contains("49 token(s) follow from position 251")
                && err.contains("w_59"),
            "{err}"
        );
        let all_zero = TokenCandidate {
            weights: Some(vec![0.0]),
            ..c.clone()
        };
        assert!(matches!(
            validate(&all_zero, &config, &o),
            Err(InvalidCandidate::Weights(why)) if why.contains("at least one positive weight")
        ));
        // ... and every scorer refuses it rather than give losses of 0.
        let model = crate::model::Model::from_parts(
            config.clone(),
            crate::model::GptjWeights::random(&config, 1, crate::model::DType::F32),
            None,
        )
        .unwrap();
        let cpu = crate::cpu::CpuScorer::new(&model);
        let reference = super::super::ReferenceScorer::new(&model);
        for scorer in [&cpu as &dyn super::super::Scorer, &reference] {
            let err = scorer
                .variant_losses(std::slice::from_ref(&c), &o)
                .unwrap_err()
                .to_string();
            assert!(err.contains("no positive weight"), "{err}");
        }
    }

    #[test]
    fn window_is_cut_at_the_end_of_the_text_without_renormalising() {
        let mut c = cand();
        c.position = 6;
        let o = ScoreOptions::default();
        let w: Vec<_> = c.window(&o).collect();
        assert_eq!(w, vec![(0, 1.0 / 3.0), (1, 0.8 / 3.0)]);
        assert_eq!(c.text_end(&o), 8);
    }

    /// An id outside the vocabulary is named by its field and its first index there (the first
    /// field checked wins: text_ids, then call_ids, then call_result_ids).
    #[test]
    fn the_first_id_outside_the_vocabulary_is_named() {
        let config = GptjConfig::small(1, 8, 2, 2, 32);
        let o = ScoreOptions::default();
        let refused = |c: TokenCandidate| validate(&c, &config, &o).unwrap_err();
        let oov = |field, index, id| InvalidCandidate::OutOfVocabulary {
            field,
            index,
            id,
            vocab_size: 32,
        };
        let bad_call = TokenCandidate {
            call_ids: vec![1, 40, 2, 33],
            ..cand()
        };
        assert_eq!(refused(bad_call.clone()), oov("call_ids", 1, 40));
        let bad_text = TokenCandidate {
            text_ids: vec![10, 11, 12, 13, 99, 15, 16, 50].into(),
            ..bad_call
        };
        assert_eq!(refused(bad_text), oov("text_ids", 4, 99));
    }
}
