//! The standard scoring workload of the benchmarks (docs/benchmarks.md), named and seeded: texts of
//! 256 tokens, 25 candidates per text (5 positions x 5 calls) at positions uniform in [10, 250],
//! calls of ~12 tokens and results of ~4 tokens, the paper's window of 5.
//!
//! Calls have the shape of real ones, so that the sharing a real batch offers is there and no
//! more: e(c, eps) = "[" Tool "(" input ")" " ->" "]" + separator (12 tokens in prefix placement;
//! inline, " [" ... "]" with no separator, 11), e(c, r) adds 4 result tokens before "]". Each
//! position draws its tool from five, and its five calls differ in input.

use std::sync::Arc;

use crate::score::{Placement, TokenCandidate};
use crate::util::rng::Rng;

/// Parameters of a workload; `standard()` is the one every benchmark quotes.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// Texts (bench's `--texts`); each gives `positions_per_text * calls_per_position`
    /// candidates.
    pub n_texts: usize,
    /// Tokens per text, uniform random ids below min(vocab_size, 50257): 256 in the standard one.
    pub text_len: usize,
    /// Positions drawn per text (independently: two may coincide); 5.
    pub positions_per_text: usize,
    /// Calls per position, one tool drawn from five, each call with its own input; 5.
    pub calls_per_position: usize,
    /// Inclusive range positions are drawn from.
    pub position_range: (usize, usize),
    /// Tokens of a call's input (the rest of e(c, eps) is 8 tokens of syntax in prefix placement).
    pub input_len: usize,
    /// Tokens of a call's result, the difference between e(c, r) and e(c, eps); 4.
    pub result_len: usize,
    /// Seed of every draw (`Rng`): the same workload gives the same candidates on any machine.
    pub seed: u64,
}

impl Workload {
    /// The standard workload of `n_texts` texts (the module's docs give its shape).
    pub fn standard(n_texts: usize, seed: u64) -> Self {
        Workload {
            n_texts,
            text_len: 256,
            positions_per_text: 5,
            calls_per_position: 5,
            position_range: (10, 250),
            input_len: 4,
            result_len: 4,
            seed,
        }
    }

    /// Candidates `generate` returns: texts x positions per text x calls per position.
    pub fn n_candidates(&self) -> usize {
        self.n_texts * self.positions_per_text * self.calls_per_position
    }

    /// The candidates, token-level, for a model with `vocab_size` ids.
    pub fn generate(&self, vocab_size: usize, placement: Placement) -> Vec<TokenCandidate> {
        let mut rng = Rng::new(self.seed);
        // GPT-2 BPE ids of the call syntax when the vocabulary has them, stand-ins otherwise.
        let text_vocab = vocab_size.min(50257);
        let id = |gpt2: u32| gpt2 % text_vocab as u32;
        let (open, open_sp, paren, close_paren, arrow, close, space) =
            (id(58), id(685), id(7), id(8), id(4613), id(60), id(220));
        let tools: Vec<[u32; 2]> = (0..5)
            .map(|_| {
                [
                    rng.range(0, text_vocab - 1) as u32,
                    rng.range(0, text_vocab - 1) as u32,
                ]
            })
            .collect();
        let mut out = Vec::with_capacity(self.n_candidates());
        for _ in 0..self.n_texts {
            let text: Arc<[u32]> = (0..self.text_len)
                .map(|_| rng.range(0, text_vocab - 1) as u32)
                .collect();
            for _ in 0..self.positions_per_text {
                let position = rng.range(self.position_range.0, self.position_range.1);
                let tool = tools[rng.range(0, tools.len() - 1)];
                for _ in 0..self.calls_per_position {
                    let input: Vec<u32> = (0..self.input_len)
                        .map(|_| rng.range(0, text_vocab - 1) as u32)
                        .collect();
                    let result: Vec<u32> = (0..self.result_len)
                        .map(|_| rng.range(0, text_vocab - 1) as u32)
                        .collect();
                    // Prefix: "[Tool(input) ->]" + " "; inline: " [Tool(input) ->]".
                    let (lead, trail): (&[u32], &[u32]) = match placement {
                        Placement::Prefix => (&[open], &[space]),
                        Placement::Inline => (&[open_sp], &[]),
                    };
                    let head = [lead, &tool, &[paren], &input, &[close_paren, arrow]].concat();
                    out.push(TokenCandidate {
                        text_ids: text.clone(),
                        position,
                        call_ids: [&head[..], &[close], trail].concat(),
                        call_result_ids: [&head[..], &result, &[close], trail].concat(),
                        weights: None,
                    });
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_workload_has_the_documented_shape() {
        let w = Workload::standard(3, 1);
        let c = w.generate(50400, Placement::Prefix);
        assert_eq!(c.len(), 75);
        assert!(c.iter().all(|c| c.text_ids.len() == 256));
        assert!(c.iter().all(|c| (10..=250).contains(&c.position)));
        assert!(c
            .iter()
            .all(|c| c.call_ids.len() == 12 && c.call_result_ids.len() == 16));
        assert_eq!(c, w.generate(50400, Placement::Prefix), "seeded");
        let small = w.generate(100, Placement::Inline);
        assert!(small.iter().all(|c| c.call_ids.iter().all(|&t| t < 100)));
    }

    /// n_candidates is what generate returns, for a shape whose factors differ.
    #[test]
    fn n_candidates_counts_texts_positions_and_calls() {
        let w = Workload {
            positions_per_text: 3,
            calls_per_position: 2,
            ..Workload::standard(4, 1)
        };
        assert_eq!(w.n_candidates(), 24);
        assert_eq!(w.generate(1000, Placement::Prefix).len(), 24);
    }

    /// A call is "[" Tool "(" input ") ->" "]" + " " in prefix placement and " [" ... "]" inline,
    /// with GPT-2's ids of that syntax; e(c, r) puts the result before "]". The calls at one
    /// position share their tool and differ in input.
    #[test]
    fn calls_have_the_documented_syntax() {
        let w = Workload::standard(2, 3);
        for (placement, lead, trail) in [
            (Placement::Prefix, 58, &[220][..]),
            (Placement::Inline, 685, &[][..]),
        ] {
            let cands = w.generate(50400, placement);
            for c in &cands {
                let (call, result) = (&c.call_ids, &c.call_result_ids);
                let n = 1 + 2 + 1 + w.input_len;
                assert_eq!(call[0], lead);
                assert_eq!(call[3], 7, "(");
                assert_eq!(call[n..], [&[8, 4613, 60][..], trail].concat()[..]);
                assert_eq!(result[..n + 2], call[..n + 2]);
                assert_eq!(result[n + 2 + w.result_len..], call[n + 2..]);
            }
            for at in cands.chunks(w.calls_per_position) {
                assert!(at.iter().all(|c| c.position == at[0].position));
                assert!(at.iter().all(|c| c.call_ids[1..3] == at[0].call_ids[1..3]));
                assert!(at[1..]
                    .iter()
                    .all(|c| c.call_ids[4..8] != at[0].call_ids[4..8]));
            }
        }
    }

    /// Positions reach both ends of their inclusive range; ids stay below GPT-2's 50257 in a
    /// larger vocabulary.
    #[test]
    fn draws_cover_their_whole_ranges() {
        let w = Workload {
            position_range: (10, 11),
            ..Workload::standard(8, 5)
        };
        let cands = w.generate(50400, Placement::Prefix);
        for end in [10, 11] {
            assert!(cands.iter().any(|c| c.position == end), "position {end}");
        }
        let ids = cands.iter().flat_map(|c| {
            c.text_ids
                .iter()
                .chain(&c.call_ids)
                .chain(&c.call_result_ids)
        });
        assert!(ids.clone().all(|&t| t < 50257));
        // Texts of 256 uniform ids in a vocabulary of 3: every id shows up, the last one too.
        let tiny = Workload::standard(1, 5).generate(3, Placement::Prefix);
        assert!((0..3).all(|id| tiny[0].text_ids.contains(&id)));
    }

    /// The same seed gives the same candidates on any machine (the benchmarks quote them):
    /// pinned, with another seed giving others.
    #[test]
    fn a_seed_gives_the_same_candidates_everywhere() {
        let c = Workload::standard(1, 7).generate(50400, Placement::Prefix);
        assert_eq!(c[0].position, 47);
        assert_eq!(
            c[0].call_ids,
            [58, 35127, 12468, 7, 13223, 48242, 16632, 4256, 8, 4613, 60, 220]
        );
        let result = [41002, 31176, 39934, 16016];
        assert_eq!(
            c[0].call_result_ids,
            [&c[0].call_ids[..10], &result, &[60, 220]].concat()
        );
        assert_eq!(c[0].text_ids[..4], [10103, 19280, 25550, 25111]);
        let other = Workload::standard(1, 8).generate(50400, Placement::Prefix);
        assert_ne!(other[0].text_ids, c[0].text_ids);
    }
}
