//! The math of Toolformer's filter (Schick et al. 2023, §2), exactly:
//!
//! ```text
//! L_i(z) = - sum_t w_t * log p(x_{i+t} | z, x_1 .. x_{i+t-1})      t = 0 .. len(w)-1, i+t <= n
//! w_t    = max(0, 1 - 0.2 t) / 3                                 (not renormalised at the end)
//! L-     = min(L_i(empty), L_i(e(c, eps)))        L+ = L_i(e(c, r))
//! keep   iff  L- - L+ >= tau_f
//! ```
//!
//! This module defines candidates, variants, placements and the sequences each variant scores
//! (`variant_sequence`: the specification every backend must match). Backends implement `Scorer`.

pub mod candidate;
pub mod jsonl;
pub mod reference;
pub mod text;
pub mod weights;

use serde::{Deserialize, Serialize};

pub use candidate::{
    validate, variant_sequence, InvalidCandidate, TokenCandidate, VariantSequence,
};
pub use reference::ReferenceScorer;
pub use text::{call_text, score_texts, score_texts_each, splice, TextCandidate};
pub use weights::LossWeights;

use crate::error::{Error, Result};
use crate::model::GptjConfig;

/// Where the call z goes when a variant is scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// The paper's choice (footnote 3): z ++ x_1 .. x_{i+T-1} (T the loss window, 5 by default:
    /// x_{i+4}). An un-finetuned model has never seen a
    /// call mid-text, so the call is scored as a prefix and spliced at i only when C* is written.
    #[default]
    Prefix,
    /// x_1 .. x_{i-1} ++ z ++ x_i .. x_{i+T-1}: the call where it will stand in C*.
    Inline,
}

/// How the call without its result, e(c, eps), is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum CallForm {
    /// The paper's e(c, eps) = "[Tool(input) ->]": arrow, no result.
    #[default]
    Arrow,
    /// "[Tool(input)]".
    Bare,
}

/// The three prefixes each candidate is scored under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Variant {
    /// No call: L_i(empty).
    None = 0,
    /// The call without its result: L_i(e(c, eps)).
    Call = 1,
    /// The call with its result: L_i(e(c, r)).
    CallResult = 2,
}

impl Variant {
    /// The three, in the order of `Scorer::variant_losses`' triples.
    pub const ALL: [Variant; 3] = [Variant::None, Variant::Call, Variant::CallResult];
}

/// How candidates are scored (the same for every candidate of a batch).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScoreOptions {
    /// Where the call goes (`score_texts` also tokenizes the call for it).
    pub placement: Placement,
    /// Loss weights w_0, w_1, ... used for candidates that carry none of their own.
    pub weights: LossWeights,
}

/// The filter's figures for one candidate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Scores {
    /// L_i(empty): no call.
    pub l_none: f64,
    /// L_i(e(c, eps)): the call without its result.
    pub l_call: f64,
    /// L_i(e(c, r)): the call with its result.
    pub l_call_result: f64,
    /// min(l_none, l_call).
    pub l_minus: f64,
    /// l_call_result.
    pub l_plus: f64,
    /// l_minus - l_plus: the call is kept when it is at least tau_f (`kept`).
    pub delta: f64,
}

impl Scores {
    /// From the three variant losses [L_none, L_call, L_call_result].
    pub fn from_losses([l_none, l_call, l_call_result]: [f64; 3]) -> Self {
        let l_minus = l_none.min(l_call);
        let l_plus = l_call_result;
        Scores {
            l_none,
            l_call,
            l_call_result,
            l_minus,
            l_plus,
            delta: l_minus - l_plus,
        }
    }

    /// The paper's filter: keep the call iff L- - L+ >= tau_f, and never when a loss is not
    /// finite (`not_finite`: `f64::min` in L- would pass over a NaN or an infinite L_none). A
    /// NaN `tau_f` keeps nothing.
    pub fn kept(&self, tau_f: f64) -> bool {
        self.losses_finite() && self.delta >= tau_f
    }

    fn losses_finite(&self) -> bool {
        [self.l_none, self.l_call, self.l_call_result]
            .iter()
            .all(|l| l.is_finite())
    }

    /// Why these scores are unusable, when a loss is not finite (weights too large, or the model
    /// overflowed). JSON has no NaN or infinity (serde_json would write null), so such scores
    /// are reported as an error, never written as numbers a consumer could take for scores.
    pub fn not_finite(&self) -> Option<String> {
        (!self.losses_finite()).then(|| {
            format!(
                "a loss is not finite (l_none {}, l_call {}, l_call_result {}): weights too \
                 large, or the model overflowed",
                self.l_none, self.l_call, self.l_call_result
            )
        })
    }
}

/// A scoring backend: the three variant losses of every candidate.
///
/// `Send + Sync`: one scorer (one copy of the weights) can serve several threads, e.g. behind an
/// `Arc`. A backend implements `variant_losses_unchecked`; callers use `score` or
/// `variant_losses`, which check the candidates first.
///
/// The fast backends' losses depend at the f32 rounding level (~1e-6) on the batch a candidate
/// is scored in; the same batch gives the same bits. The CPU backend runs on the calling
/// thread's rayon pool (`ThreadPool::install` gives a call a pool of its own).
///
/// Throughput comes from batches, not from concurrent calls: one CPU call already spreads over
/// every thread of its pool, so calls from several threads at once share the cores (together
/// they take about as long as one call with all their candidates), and each holds up to the
/// scorer's memory budget (`scorer_with_memory_budget`: per call, so N calls at once may hold N
/// budgets). A server that gathers requests into one `score` call gets the plan's sharing
/// across them too. On CUDA the calls on one scorer run one at a time.
pub trait Scorer: Send + Sync {
    /// A short name for logs and benchmark output.
    fn name(&self) -> &str;

    /// The model the backend runs.
    fn config(&self) -> &GptjConfig;

    /// [L_none, L_call, L_call_result] per candidate, in order, without checking the candidates:
    /// each must pass `validate` for this scorer's config and `options` (otherwise it may panic,
    /// or give meaningless losses). For callers that have just validated them.
    fn variant_losses_unchecked(
        &self,
        candidates: &[TokenCandidate],
        options: &ScoreOptions,
    ) -> Result<Vec<[f64; 3]>>;

    /// [L_none, L_call, L_call_result] per candidate, in order, after `validate`: the error names
    /// the first bad candidate.
    fn variant_losses(
        &self,
        candidates: &[TokenCandidate],
        options: &ScoreOptions,
    ) -> Result<Vec<[f64; 3]>> {
        for (k, c) in candidates.iter().enumerate() {
            validate(c, self.config(), options).map_err(|e| Error::candidate(k, e))?;
        }
        let losses = self.variant_losses_unchecked(candidates, options)?;
        check_answer_count(self.name(), losses.len(), candidates.len())?;
        Ok(losses)
    }

    /// `variant_losses`, as scores: L-, L+ and delta per candidate. A loss that is not finite
    /// (weights too large, or a model that overflows) is returned as is: `Scores::not_finite`
    /// says so, and `kept` is false for it.
    fn score(&self, candidates: &[TokenCandidate], options: &ScoreOptions) -> Result<Vec<Scores>> {
        Ok(self
            .variant_losses(candidates, options)?
            .into_iter()
            .map(Scores::from_losses)
            .collect())
    }
}

/// [`Scorer::score`], candidate by candidate: each candidate's scores or its `validate` error
/// (`Error::Candidate`, its `index` the candidate's place), in the order given, with every valid
/// candidate scored in one batch (the token-level [`score_texts_each`]). A candidate the scorer
/// refuses itself, beyond `validate` (an `Error::Candidate` from a backend's own limit), is
/// answered with that refusal, naming its place in `candidates`, and the others are scored
/// again without it. The outer error is any other error of the scorer's (the engine's,
/// `Error::Backend`, ...), and then nothing is returned.
pub fn score_each(
    scorer: &dyn Scorer,
    candidates: &[TokenCandidate],
    options: &ScoreOptions,
) -> Result<Vec<Result<Scores>>> {
    let checked = candidates
        .iter()
        .enumerate()
        .map(|(k, c)| {
            validate(c, scorer.config(), options)
                .map(|()| c.clone())
                .map_err(|reason| Error::candidate(k, reason))
        })
        .collect();
    score_in_place(scorer, checked, options)
}

/// The `Ok` candidates of `checked` scored in one batch, each answer in its place and each error
/// kept in its own (`score_each`, `score_texts_each`), through [`score_or_refuse`]: a scorer's
/// own refusal of a candidate is that candidate's answer, naming its place in `checked`.
pub(crate) fn score_in_place(
    scorer: &dyn Scorer,
    checked: Vec<Result<TokenCandidate>>,
    options: &ScoreOptions,
) -> Result<Vec<Result<Scores>>> {
    let mut answers: Vec<Option<Result<Scores>>> = Vec::with_capacity(checked.len());
    let mut good = Vec::new();
    for (k, c) in checked.into_iter().enumerate() {
        match c {
            Ok(c) => {
                good.push((k, c));
                answers.push(None);
            }
            Err(e) => answers.push(Some(Err(e))),
        }
    }
    for (k, answer) in score_or_refuse(scorer, good, options)? {
        answers[k] = Some(answer);
    }
    Ok(answers
        .into_iter()
        .map(|a| a.expect("every candidate answered"))
        .collect())
}

/// `(place, candidate)` pairs scored through `Scorer::score` (so that a scorer's own `score` or
/// `variant_losses` runs), each answered as `(place, scores)`, in order. A candidate the scorer
/// refuses itself, beyond `validate` (an `Error::Candidate`: a backend's own limit), is answered
/// with that refusal, its `index` the candidate's place, and the others are scored again
/// without it: one scorer call per refusal (r refusals in a batch of n cost r + 1 calls over up
/// to n candidates each, each validating them again: meant for a rare limit, not a filter), and
/// no candidate lost to another's. Any other error is the call's, and then nothing is answered.
pub(crate) fn score_or_refuse(
    scorer: &dyn Scorer,
    candidates: Vec<(usize, TokenCandidate)>,
    options: &ScoreOptions,
) -> Result<Vec<(usize, Result<Scores>)>> {
    let (mut places, mut batch): (Vec<usize>, Vec<TokenCandidate>) = candidates.into_iter().unzip();
    let mut refused = Vec::new();
    let scores = loop {
        if batch.is_empty() {
            break Vec::new();
        }
        match scorer.score(&batch, options) {
            Ok(scores) => {
                check_answer_count(scorer.name(), scores.len(), batch.len())?;
                break scores;
            }
            Err(Error::Candidate { index, reason, at }) => {
                if index >= batch.len() {
                    return Err(out_of_batch(scorer, index, batch.len()));
                }
                batch.remove(index);
                let place = places.remove(index);
                let refusal = Error::Candidate {
                    index: place,
                    reason,
                    at,
                };
                refused.push((place, Err(refusal)));
            }
            Err(e) => return Err(e),
        }
    };
    let mut answers: Vec<(usize, Result<Scores>)> =
        places.into_iter().zip(scores.into_iter().map(Ok)).collect();
    answers.extend(refused);
    answers.sort_by_key(|&(place, _)| place);
    Ok(answers)
}

/// A scorer that refused a candidate `index` of a batch of `len`, which it was not given.
pub(crate) fn out_of_batch(scorer: &dyn Scorer, index: usize, len: usize) -> Error {
    Error::Backend(format!(
        "scorer {} refused candidate {index} of a batch of {len}",
        scorer.name()
    ))
}

/// A scorer's answer holds one result per candidate asked: a `Scorer` written outside this
/// crate that returns another count is an error naming it (`scorer`, its `name`), not a panic,
/// a misplaced score or a candidate silently left unscored. Checked wherever an answer is used:
/// the default `variant_losses`, and after every `score` call (which a scorer may override).
pub(crate) fn check_answer_count(scorer: &str, answered: usize, asked: usize) -> Result<()> {
    if answered != asked {
        return Err(Error::Backend(format!(
            "scorer {scorer} returned {answered} results for {asked} candidates"
        )));
    }
    Ok(())
}

/// A scorer as `{ name, .. }`, so that a struct holding a `Box<dyn Scorer>` can derive `Debug`.
impl std::fmt::Debug for dyn Scorer + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scorer")
            .field("name", &self.name())
            .finish_non_exhaustive()
    }
}

// A scorer behind a reference or a smart pointer is one: `scorer_for`'s `Box<dyn Scorer>` or a
// shared `Arc` goes where a generic `S: Scorer` is taken. Every method forwards, so a backend's
// own `variant_losses` or `score` (if it has one) still runs.
macro_rules! forward_scorer {
    ($($ptr:ty),*) => {$(
        impl<S: Scorer + ?Sized> Scorer for $ptr {
            fn name(&self) -> &str {
                (**self).name()
            }
            fn config(&self) -> &GptjConfig {
                (**self).config()
            }
            fn variant_losses_unchecked(
                &self,
                candidates: &[TokenCandidate],
                options: &ScoreOptions,
            ) -> Result<Vec<[f64; 3]>> {
                (**self).variant_losses_unchecked(candidates, options)
            }
            fn variant_losses(
                &self,
                candidates: &[TokenCandidate],
                options: &ScoreOptions,
            ) -> Result<Vec<[f64; 3]>> {
                (**self).variant_losses(candidates, options)
            }
            fn score(
                &self,
                candidates: &[TokenCandidate],
                options: &ScoreOptions,
            ) -> Result<Vec<Scores>> {
                (**self).score(candidates, options)
            }
        }
    )*};
}
forward_scorer!(&S, Box<S>, std::sync::Arc<S>);

#[cfg(test)]
mod tests {
    use super::Scores;

    #[test]
    fn a_loss_that_is_not_finite_is_never_kept() {
        assert!(Scores::from_losses([3.0, 2.5, 1.0]).kept(1.5));
        assert!(!Scores::from_losses([3.0, 2.5, 1.0]).kept(1.6));
        // min(L_none, L_call) passes over a NaN or an infinite L_none; `kept` does not.
        for bad in [
            [f64::NAN, 2.5, 1.0],
            [f64::INFINITY, 2.5, 1.0],
            [3.0, f64::NAN, 1.0],
            [3.0, 2.5, f64::NEG_INFINITY],
        ] {
            let s = Scores::from_losses(bad);
            assert!(s.not_finite().is_some(), "{bad:?}");
            assert!(!s.kept(f64::NEG_INFINITY), "{bad:?}");
        }
        assert!(!Scores::from_losses([3.0, 2.5, 1.0]).kept(f64::NAN));
    }

    /// `score_or_refuse` answers in the order of the places it was given, each refusal in its
    /// place among the scores (annotate reads the answers in that order), however many rounds
    /// the refusals took.
    #[test]
    fn refusals_are_answered_in_the_order_given() {
        use super::{score_or_refuse, Error, GptjConfig, Result, ScoreOptions, Scorer};
        use super::{InvalidCandidate, TokenCandidate};
        /// Refuses the first candidate at an odd position of every batch; scores the others
        /// with their position as L_none.
        struct RefusesOdd(GptjConfig);
        impl Scorer for RefusesOdd {
            fn name(&self) -> &str {
                "refuses odd"
            }
            fn config(&self) -> &GptjConfig {
                &self.0
            }
            fn variant_losses_unchecked(
                &self,
                candidates: &[TokenCandidate],
                _: &ScoreOptions,
            ) -> Result<Vec<[f64; 3]>> {
                if let Some(k) = candidates.iter().position(|c| c.position % 2 == 1) {
                    return Err(Error::candidate(k, "odd"));
                }
                Ok(candidates
                    .iter()
                    .map(|c| [c.position as f64, 9.0, 0.0])
                    .collect())
            }
        }
        let scorer = RefusesOdd(GptjConfig::small(1, 8, 2, 2, 32));
        let given = (1..=4)
            .map(|position| {
                let c = TokenCandidate {
                    text_ids: vec![1; 8].into(),
                    position,
                    call_ids: vec![2],
                    call_result_ids: vec![3],
                    weights: None,
                };
                (10 + position, c)
            })
            .collect();
        let answers = score_or_refuse(&scorer, given, &ScoreOptions::default()).unwrap();
        let places: Vec<usize> = answers.iter().map(|(place, _)| *place).collect();
        assert_eq!(places, [11, 12, 13, 14]);
        for (place, answer) in answers {
            match answer {
                Ok(s) => assert_eq!(s.l_none, (place - 10) as f64, "{place}"),
                Err(Error::Candidate { index, reason, .. }) => {
                    assert_eq!(index, place);
                    assert_eq!(reason, InvalidCandidate::from("odd"));
                    assert_eq!(place % 2, 1);
                }
                Err(e) => panic!("{place}: {e}"),
            }
        }
    }

    /// delta is exactly L- - L+, and the filter is the paper's ">=": a call whose delta is
    /// tau_f is kept, and one with tau_f a float above it is not.
    #[test]
    fn a_delta_of_exactly_tau_f_is_kept() {
        let s = Scores::from_losses([3.0, 2.5, 1.0]);
        assert_eq!((s.l_minus, s.l_plus, s.delta), (2.5, 1.0, 1.5));
        let just_above = f64::from_bits(1.5f64.to_bits() + 1);
        assert!(s.kept(1.5));
        assert!(!s.kept(just_above));
    }
}
