//! Where to call: the paper's `p_i = p(<API> | P(x), x_1..x_{i-1})` at every position of x, from
//! one forward over P(x) ++ x.
//!
//! "[" vs " [": GPT-2's byte-level BPE has both, and both open a call, so
//! p_i = p("[") + p(" [") at the row that predicts x_i (a tokenizer with only one of them uses
//! that one). When a call is then sampled at i, the prefix ends with " [" if x_i starts with
//! whitespace (the space moves in front of the call, as in "(or [Calculator(400 / 1400)] 29%)")
//! and with "[" otherwise.
//!
//! Positions are token indices into x, from 1 (position 0 cannot be scored: the no-call variant
//! needs context). A position is eligible only where it maps to a byte offset of the text that is
//! a character and token boundary (byte-level BPE can split a character across tokens).

use crate::model::tokenizer::Encoding;

/// p("[") + p(" [") predicting x_i, for i in 0..x_len, from `Sampler::token_log_probs` (or
/// `propose`) over `P(x) ++ x[..x_len]` with the ids of "[" and " [" as the queried tokens;
/// `prompt_len` = |P(x)|. Entry 0 (before x_1, no text context) is 0.
pub fn call_probabilities(log_probs: &[Vec<f32>], prompt_len: usize, x_len: usize) -> Vec<f64> {
    (0..x_len)
        .map(|i| {
            if i == 0 {
                return 0.0;
            }
            log_probs
                .get(prompt_len + i - 1)
                .map_or(0.0, |row| row.iter().map(|&l| (l as f64).exp()).sum())
        })
        .collect()
}

/// The byte offset where a call before token `i` goes: the end of token i-1 (before x_i's
/// leading space, which tokenizers with trimmed offsets leave outside x_i's span), if that is a
/// character boundary of `text` and maps back to token i.
pub fn splice_byte(text: &str, enc: &Encoding, i: usize) -> Option<usize> {
    if i == 0 || i >= enc.spans.len() {
        return None;
    }
    let b = enc.spans[i - 1].1;
    (text.is_char_boundary(b) && enc.token_at_byte(b) == Ok(i)).then_some(b)
}

/// The positions to sample calls at: eligible positions with p_i > tau_s, the k most probable
/// (ties: the earlier position), returned in text order with their probability.
pub fn select(
    probs: &[f64],
    eligible: impl Fn(usize) -> bool,
    tau_s: f64,
    k: usize,
) -> Vec<(usize, f64)> {
    let mut kept: Vec<(usize, f64)> = probs
        .iter()
        .enumerate()
        .skip(1)
        .filter(|&(i, &p)| p > tau_s && eligible(i))
        .map(|(i, &p)| (i, p))
        .collect();
    kept.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    kept.truncate(k);
    kept.sort_by_key(|&(i, _)| i);
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_above_threshold_in_text_order() {
        let p = [0.9, 0.1, 0.5, 0.01, 0.5, 0.3];
        assert_eq!(
            select(&p, |_| true, 0.05, 3),
            vec![(2, 0.5), (4, 0.5), (5, 0.3)]
        );
        assert_eq!(select(&p, |i| i != 4, 0.2, 5), vec![(2, 0.5), (5, 0.3)]);
        assert!(
            select(&p, |_| true, 0.95, 5).is_empty(),
            "position 0 never counts"
        );
        // p_i > tau_s, strictly (the paper's rule): a position at the threshold is not taken.
        assert!(select(&[0.0, 0.3, 0.2], |_| true, 0.3, 5).is_empty());
        // The most probable first is not text order: the later, likelier position comes second.
        assert_eq!(
            select(&[0.0, 0.2, 0.9], |_| true, 0.1, 2),
            vec![(1, 0.2), (2, 0.9)]
        );
    }

    #[test]
    fn p_i_sums_both_openers_on_the_row_before_x_i() {
        // Rows of P(x) ++ x with |P(x)| = 2: row 2 + i - 1 predicts x_i.
        let ln = |p: f64| p.ln() as f32;
        let rows = vec![
            vec![ln(0.9), ln(0.9)],
            vec![ln(0.1), ln(0.2)],
            vec![ln(0.3), ln(0.3)],
            vec![ln(0.5), ln(0.01)],
        ];
        let p = call_probabilities(&rows, 2, 4);
        let want = [0.0, 0.6, 0.51];
        assert_eq!(p.len(), 4);
        for (got, want) in p.iter().zip(want) {
            assert!((got - want).abs() < 1e-6, "{p:?}");
        }
        // No row for x_3 (log-probs cut short): no call there.
        assert_eq!(p[3], 0.0);
    }

    #[test]
    fn a_call_goes_at_the_previous_tokens_end_where_that_is_x_is_start() {
        // Trimmed offsets: " def" reported as 4..7, its space outside; the call goes at 3.
        let enc = Encoding {
            ids: vec![0, 1],
            spans: vec![(0, 3), (4, 7)],
        };
        assert_eq!(splice_byte("abc def", &enc, 1), Some(3));
        assert_eq!(splice_byte("abc def", &enc, 0), None);
        assert_eq!(splice_byte("abc def", &enc, 2), None, "past the last token");
        // "é" (2 bytes) split across two tokens: the byte between them is no place for a call.
        let split = Encoding {
            ids: vec![0, 1, 2],
            spans: vec![(0, 1), (1, 2), (2, 3)],
        };
        assert_eq!(splice_byte("éa", &split, 1), None);
        assert_eq!(splice_byte("éa", &split, 2), Some(2));
    }

    /// Of positions equally likely, the earlier ones are taken first.
    #[test]
    fn ties_take_the_earlier_position() {
        assert_eq!(
            select(&[0.0, 0.5, 0.5, 0.5], |_| true, 0.1, 2),
            vec![(1, 0.5), (2, 0.5)]
        );
    }

    /// A token that starts inside a character reports the whole character, so the previous
    /// token's end, though a character boundary, falls inside it: no place for a call.
    #[test]
    fn no_call_goes_inside_a_token_that_starts_mid_character() {
        // "xét": "x", the first byte of "é", then its second byte merged with "t" (from byte 1).
        let enc = Encoding {
            ids: vec![0, 1, 2],
            spans: vec![(0, 1), (1, 3), (1, 4)],
        };
        assert_eq!(splice_byte("xét", &enc, 2), None);
        assert_eq!(splice_byte("xét", &enc, 1), Some(1));
    }
}
