//! The demo tokenizer: GPT-2-style byte-level BPE trained with the tokenizers crate.

use std::collections::HashSet;

use anyhow::{anyhow, ensure, Result};

use super::EOT;

/// Trains GPT-2-style byte-level BPE on `texts`: digits split one per token (" 25" is " ", "2",
/// "5"), the 256 byte symbols always in the vocabulary, merges seen at least twice, and
/// `<|endoftext|>` added last (as GPT-2's id 50256), for `vocab_size` ids at most in all.
pub fn train_tokenizer(texts: &[String], vocab_size: usize) -> Result<tokenizers::Tokenizer> {
    use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
    use tokenizers::models::TrainerWrapper;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::pre_tokenizers::digits::Digits;
    use tokenizers::pre_tokenizers::sequence::Sequence;
    use tokenizers::{AddedToken, PreTokenizerWrapper};

    ensure!(
        vocab_size > 257,
        "vocab_size {vocab_size} leaves no room for merges (256 byte symbols + <|endoftext|>)"
    );
    let mut tok = tokenizers::Tokenizer::new(BPE::default());
    tok.with_pre_tokenizer(Some(Sequence::new(vec![
        PreTokenizerWrapper::Digits(Digits::new(true)),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
    ])));
    tok.with_decoder(Some(ByteLevel::default()));
    tok.with_post_processor(Some(ByteLevel::new(false, false, true)));
    let alphabet: HashSet<char> = ByteLevel::alphabet().into_iter().collect();
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(vocab_size - 1)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(alphabet)
        .build()
        .into();
    tok.train(&mut trainer, texts.iter())
        .map_err(|e| anyhow!("training the tokenizer: {e}"))?;
    tok.add_special_tokens([AddedToken::from(EOT, true)])
        .map_err(|e| anyhow!("adding {EOT}: {e}"))?;
    Ok(tok)
}

/// Checks what the annotate driver and the demo need of a trained tokenizer: `<|endoftext|>`,
/// single-digit tokens, and "[" and " [" as single tokens when the texts contain them. Returns
/// the `<|endoftext|>` id.
pub fn check_tokenizer(tok: &crate::model::Tokenizer, texts: &[String]) -> Result<u32> {
    let eot = tok
        .token_id(EOT)
        .ok_or_else(|| anyhow!("tokenizer has no {EOT}"))?;
    let digits = tok.encode_ids(" 25")?;
    ensure!(
        digits.len() == 3 && tok.decode(&digits[1..2])? == "2",
        "\" 25\" should be \" \", \"2\", \"5\", got {digits:?}"
    );
    for s in ["[", " ["] {
        if texts.iter().any(|t| t.contains(s)) {
            let ids = tok.encode_ids(s)?;
            ensure!(
                ids.len() == 1,
                "{s:?} is {} tokens, the annotate driver needs one (raise --vocab-size?)",
                ids.len()
            );
        }
    }
    Ok(eot)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn loaded(tok: &tokenizers::Tokenizer) -> crate::model::Tokenizer {
        let json = tok.to_string(true).unwrap();
        crate::model::Tokenizer::from_bytes(json.as_bytes(), Path::new("tokenizer.json")).unwrap()
    }

    /// A merge is learned only from a pair seen at least twice: with room to spare, "qz", seen
    /// once, stays two tokens while "ab", seen twice, becomes one.
    #[test]
    fn a_merge_needs_a_pair_seen_twice() {
        let texts = vec!["qz ab".to_string(), "ab".to_string()];
        let tok = loaded(&train_tokenizer(&texts, 300).unwrap());
        assert_eq!(tok.encode_ids("ab").unwrap().len(), 1);
        assert_eq!(tok.encode_ids("qz").unwrap().len(), 2);
    }

    /// A byte-level BPE without the digit rule merges digits (" 25" in one or two tokens),
    /// which the annotate driver's numbers cannot use: `check_tokenizer` refuses it.
    #[test]
    fn a_tokenizer_that_merges_digits_is_refused() {
        use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
        use tokenizers::models::TrainerWrapper;
        use tokenizers::pre_tokenizers::byte_level::ByteLevel;
        use tokenizers::AddedToken;

        let texts: Vec<String> = (0..20).map(|i| format!("paid 25 of 250, {i}")).collect();
        let mut tok = tokenizers::Tokenizer::new(BPE::default());
        tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        tok.with_decoder(Some(ByteLevel::default()));
        let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
            .vocab_size(299)
            .min_frequency(2)
            .show_progress(false)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build()
            .into();
        tok.train(&mut trainer, texts.iter()).unwrap();
        tok.add_special_tokens([AddedToken::from(EOT, true)])
            .unwrap();
        let tok = loaded(&tok);
        assert!(tok.encode_ids(" 25").unwrap().len() < 3);
        let err = check_tokenizer(&tok, &texts).unwrap_err().to_string();
        assert!(err.contains("\" 25\" should be"), "{err}");
    }
}
