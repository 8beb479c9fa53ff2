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
