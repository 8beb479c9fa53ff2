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
}
