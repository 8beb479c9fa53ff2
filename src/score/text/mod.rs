//! Text-level candidates: strings and a byte offset, turned into token candidates with the
//! project's conventions (docs/conventions.md):
//!
//! - the text is tokenized once, on its own; the call is tokenized on its own, so the scored text
//!   tokens are identical in all three variants;
//! - e(c, r) = "[Tool(input) -> result]", e(c, eps) = "[Tool(input) ->]" (arrow form, the paper's)
//!   or "[Tool(input)]" (bare form);
//! - prefix placement scores z = e(c) + " " before the text (a single space separates the call
//!   from the text, and "[" is the sequence's first token, without a leading space);
//! - inline placement scores z spliced before x_i as C* writes it (`splice`): " " + e(c)
//!   where the text continues with whitespace (x_i carries its own leading space in byte-level
//!   BPE): "... (or [Calculator(400 / 1400) -> 0.29] 29%)"; e(c) alone where it does not:
//!   "29[Calculator(...) -> 0.29]%)".
//! - the byte offset must fall on a token boundary of the text; otherwise it is an error;
//! - the call must read as the call it is (`check_call`): a tool name of letters, digits and "_"
//!   (what `annotate::calls::parse_call` accepts), an input that parser reads back unchanged
//!   (trimmed, no arrow, balanced parentheses), a result that is not empty and not padded with
//!   whitespace (annotate's never is), no "[" or "]" in the input (the parser's input never has
//!   one) or the result (`annotate::calls::clean_result` turns them into "(" and ")"): a "]"
//!   would end the call early, a "[" open a nested one.

mod call;

#[cfg(feature = "annotate")] // annotate and generate read inputs with it
pub(crate) use call::balanced;
pub use call::{call_insert, call_text, check_call, is_call_name, spaced_at, splice};

use std::collections::HashMap;
use std::sync::Arc;

use super::{CallForm, InvalidCandidate, Placement, ScoreOptions, Scorer, Scores, TokenCandidate};
use crate::error::{Error, Result};
use crate::model::tokenizer::Encoding;
use crate::model::Tokenizer;

/// One candidate call in text form.
#[derive(Debug, Clone, PartialEq)]
pub struct TextCandidate {
    /// Shared: the candidates of one text hold one copy of it (`text.into()` from a `&str` or a
    /// `String`, `Arc::clone` for the next candidate of the same text).
    pub text: Arc<str>,
    /// Byte offset into `text` where the call goes.
    pub position: usize,
    /// The tool's name: letters, digits and "_" (`check_call`).
    pub tool: String,
    /// The call's input, as it is written between the parentheses.
    pub input: String,
    /// The tool's result r, as written in e(c, r).
    pub result: String,
    /// Loss weights for this candidate (`TokenCandidate::weights`); `None` uses the batch's.
    pub weights: Option<Vec<f64>>,
}

impl TextCandidate {
    /// A candidate with the batch's loss weights: a call of `tool` on `input` with `result`,
    /// before byte `position` of `text`.
    pub fn new(
        text: impl Into<Arc<str>>,
        position: usize,
        tool: impl Into<String>,
        input: impl Into<String>,
        result: impl Into<String>,
    ) -> Self {
        TextCandidate {
            text: text.into(),
            position,
            tool: tool.into(),
            input: input.into(),
            result: result.into(),
            weights: None,
        }
    }

    /// This candidate's loss weights, or else `options`' (as `TokenCandidate::weights`).
    pub fn weights<'a>(&'a self, options: &'a ScoreOptions) -> &'a [f64] {
        self.weights
            .as_deref()
            .unwrap_or(options.weights.as_slice())
    }
}

/// A text-level candidate as tokens, or why it cannot be one (the outer `Result` of the
/// functions that return it is the tokenizer's own failure).
pub(crate) type Tokenized = std::result::Result<TokenCandidate, InvalidCandidate>;

/// `value` debug-quoted for an error message, cut after 60 characters.
fn shown(value: &str) -> String {
    const SHOWN: usize = 60;
    match value.char_indices().nth(SHOWN) {
        Some((end, _)) => format!("{:?}… ({} bytes)", &value[..end], value.len()),
        None => format!("{value:?}"),
    }
}

impl TextCandidate {
    /// Tokenizes with the conventions above. `text` (the text's encoding and its ids, the same
    /// tokens) may be given when the text was already tokenized (candidates of one text share
    /// it); it must be the whole text's (`Tokenizer::encode`): one that stops short of the text
    /// (`Tokenizer::encode_head`'s) is an error, as it would cut the loss window short where
    /// the text goes on (cut the text where its encoding ends instead). A call `check_call`
    /// refuses is an error.
    pub fn to_tokens(
        &self,
        tokenizer: &Tokenizer,
        placement: Placement,
        form: CallForm,
        text: Option<(&Encoding, Arc<[u32]>)>,
    ) -> Result<TokenCandidate> {
        if let Some((encoding, _)) = &text {
            // What follows the last token must give no token (nothing, or what the tokenizer
            // drops): a head of it is tokenized, enough to find one.
            let end = encoding.spans.last().map_or(0, |s| s.1);
            let whole = match self.text.get(end..) {
                None => false,
                Some("") => true,
                Some(rest) => match tokenizer.encode_head(rest, 1) {
                    Ok(e) => e.ids.is_empty(),
                    Err(Error::Input(_)) => false,
                    Err(e) => return Err(e),
                },
            };
            if !whole {
                return Err(Error::input(format!(
                    "the encoding given ends at byte {end} of the {}-byte text: to_tokens needs \
                     the whole text's (Tokenizer::encode), as a head's would cut the loss \
                     window short where the text goes on",
                    self.text.len()
                )));
            }
        }
        self.to_tokens_within(tokenizer, placement, form, text, None)?
            .map_err(|reason| Error::input(reason.to_string()))
    }

    /// `to_tokens`; with `n_positions`, a call string is tokenized only as far as shows that it
    /// fits the model (`Tokenizer::encode_head`), and one that does not is refused: a 32 MiB
    /// input on one line would otherwise be tokenized whole (gigabytes) before `validate`
    /// refused its sequence as too long. The outer error is the tokenizer's own failure, the
    /// inner one why the candidate cannot be made into tokens.
    pub(crate) fn to_tokens_within(
        &self,
        tokenizer: &Tokenizer,
        placement: Placement,
        form: CallForm,
        text: Option<(&Encoding, Arc<[u32]>)>,
        n_positions: Option<usize>,
    ) -> Result<Tokenized> {
        if let Err(e) = check_call(&self.tool, &self.input, &self.result) {
            // `check_call`'s errors are `Error::Input`, whose text is the message.
            return Ok(Err(InvalidCandidate::Call(e.to_string())));
        }
        let owned;
        let (encoding, text_ids) = match text {
            Some(t) => t,
            None => {
                owned = tokenizer.encode(&self.text)?;
                let ids: Arc<[u32]> = owned.ids.clone().into();
                (&owned, ids)
            }
        };
        // Positions come from the encoding's spans, tokens from the ids: one tokenization.
        debug_assert_eq!(
            &encoding.ids[..],
            &text_ids[..],
            "encoding and ids of two texts"
        );
        let (offset, len) = (self.position, self.text.len());
        if offset > len {
            return Ok(Err(InvalidCandidate::PastText { offset, len }));
        }
        if !self.text.is_char_boundary(offset) {
            return Ok(Err(InvalidCandidate::NotCharBoundary { offset, len }));
        }
        let position = match encoding.locate_byte(offset) {
            // Said here in bytes: the token-level PositionZero's "position 0" would be a token
            // index the caller never gave.
            Ok(0) => return Ok(Err(InvalidCandidate::AtFirstToken { offset })),
            Ok(position) => position,
            Err(reason) => return Ok(Err(reason)),
        };
        let call = call_text(&self.tool, &self.input, None, form);
        let call_result = call_text(&self.tool, &self.input, Some(&self.result), form);
        // Whether the text goes on with whitespace, read at the end of x_{i-1}: the offset
        // annotate splices at. (A tokenizer that trims offsets also takes the byte after the
        // space for x_i, which would put the call after the space C* puts it before.)
        let canonical = encoding.spans[position - 1].1;
        let spaced = spaced_at(&self.text, canonical);
        let insert = |call: &str| -> Result<std::result::Result<Vec<u32>, InvalidCandidate>> {
            let inserted = call_insert(call, placement, spaced);
            let Some(n_positions) = n_positions else {
                return tokenizer.encode_ids(&inserted).map(Ok);
            };
            let (encoding, whole) =
                match tokenizer.encode_head_whole(&inserted, n_positions.saturating_add(1)) {
                    Ok(e) => e,
                    Err(Error::Input(msg)) => {
                        let why = format!("the call {}: {msg}", shown(call));
                        return Ok(Err(InvalidCandidate::Call(why)));
                    }
                    Err(e) => return Err(e),
                };
            if !whole || encoding.ids.len() > n_positions {
                return Ok(Err(InvalidCandidate::TextTooLong {
                    n_positions,
                    detail: format!(
                        "the call {} is longer than the model's n_positions ({n_positions}) \
                         tokens",
                        shown(call)
                    ),
                }));
            }
            Ok(Ok(encoding.ids))
        };
        let call_ids = match insert(&call)? {
            Ok(ids) => ids,
            Err(reason) => return Ok(Err(reason)),
        };
        let call_result_ids = match insert(&call_result)? {
            Ok(ids) => ids,
            Err(reason) => return Ok(Err(reason)),
        };
        Ok(Ok(TokenCandidate {
            text_ids,
            position,
            call_ids,
            call_result_ids,
            weights: self.weights.clone(),
        }))
    }
}

/// How many tokens of `text` a candidate at byte `position` reads with `weights`: x_i is within
/// the first position + 1 tokens when a token covers at least one byte, and the window follows
/// it (`TextHeads::tokens_for` reads further when a normalizer broke that).
/// A position past the text is refused here, before anything is tokenized.
pub(crate) fn head_tokens_needed(
    text: &str,
    position: usize,
    weights: &[f64],
) -> std::result::Result<usize, InvalidCandidate> {
    if position > text.len() {
        return Err(InvalidCandidate::PastText {
            offset: position,
            len: text.len(),
        });
    }
    Ok(position
        .saturating_add(super::candidate::window_len(weights))
        .saturating_add(1))
}

/// Scores text-level candidates: each distinct text tokenized once, as far as its candidates
/// read (`Tokenizer::encode_head`, as `toolsift score` does) and never further than the model
/// can hold, every call with `options.placement` (the placement the scorer then uses, so the two
/// cannot disagree) and `form`. An error names the first candidate, in order, that cannot be
/// tokenized or scored.
pub fn score_texts(
    scorer: &dyn Scorer,
    tokenizer: &Tokenizer,
    candidates: &[TextCandidate],
    options: &ScoreOptions,
    form: CallForm,
) -> Result<Vec<Scores>> {
    let tokens = texts_to_tokens(scorer, tokenizer, candidates, options, form)
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    let scores = scorer.score(&tokens, options)?;
    super::check_answer_count(scorer.name(), scores.len(), tokens.len())?;
    Ok(scores)
}

/// [`score_texts`], candidate by candidate: each candidate's scores or the reason it cannot be
/// scored (its tokenizing or `validate` error, as an `Error::Candidate` whose `index` is its
/// place; a tokenizer that fails on its text gives its own error, as `Tokenizer::encode`
/// would), in the order given, with every candidate that can be scored scored together. A
/// candidate the scorer refuses itself (`score_each`) is answered with that refusal, naming its
/// place in `candidates`, and the others are scored again without it. The outer error is any
/// other error of the scorer's (the engine's, `Error::Backend`, ...), and then nothing is
/// returned. A batch with a few bad candidates is tokenized once, where
/// `score_texts` fails it as a whole for the first.
pub fn score_texts_each(
    scorer: &dyn Scorer,
    tokenizer: &Tokenizer,
    candidates: &[TextCandidate],
    options: &ScoreOptions,
    form: CallForm,
) -> Result<Vec<Result<Scores>>> {
    let tokens = texts_to_tokens(scorer, tokenizer, candidates, options, form);
    super::score_in_place(scorer, tokens, options)
}

/// Each candidate tokenized ([`TextHeads`]: each distinct text once, as far as its candidates
/// read, never past the model's n_positions) and checked by `validate`, in order; one that
/// cannot be is an `Error::Candidate` naming its place, and a tokenizer that fails on its text
/// gives its own error (`Error::Tokenizer`, not about the request), placed at the candidate.
fn texts_to_tokens(
    scorer: &dyn Scorer,
    tokenizer: &Tokenizer,
    candidates: &[TextCandidate],
    options: &ScoreOptions,
    form: CallForm,
) -> Vec<Result<TokenCandidate>> {
    let config = scorer.config();
    let mut heads = TextHeads::within(config.n_positions);
    // Tokens each text must yield: as many as its furthest-reading candidate needs, so that a
    // text is tokenized once. (A candidate refused here is refused again, in order, below.)
    for c in candidates {
        if let Ok(n) = head_tokens_needed(&c.text, c.position, c.weights(options)) {
            heads.ask(&c.text, n);
        }
    }
    candidates
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let tokenized = heads
                .tokens_for(tokenizer, c, c.weights(options), options.placement, form)
                .map_err(|e| e.context(format!("candidate {k}")))?;
            tokenized
                .and_then(|candidate| {
                    super::candidate::validate(&candidate, config, options)?;
                    Ok(candidate)
                })
                .map_err(|reason| Error::candidate(k, reason))
        })
        .collect()
}

/// Texts tokenized once each, as far as their candidates read (`Tokenizer::encode_head`), so
/// that the candidates of one text share its head. A text asked for more tokens than its head
/// holds is tokenized again, further; never past `n_positions` + 1 tokens when the model's
/// `n_positions` is given (`within`), since no candidate reading further fits the model.
#[derive(Default)]
pub(crate) struct TextHeads {
    heads: HashMap<Arc<str>, TextHead>,
    /// Tokens each text will be asked for (`ask`), so that the first `get` tokenizes that far.
    asked: HashMap<Arc<str>, usize>,
    n_positions: Option<usize>,
}

/// At least `tokens_asked` tokens of a text's encoding, or all of them (`whole`).
struct TextHead {
    encoding: Encoding,
    ids: Arc<[u32]>,
    tokens_asked: usize,
    whole: bool,
}

impl TextHeads {
    /// Heads for a model of `n_positions`: a text is never tokenized past n_positions + 1 tokens
    /// and a call string never past n_positions (`TextCandidate::to_tokens_within`).
    pub(crate) fn within(n_positions: usize) -> Self {
        TextHeads {
            n_positions: Some(n_positions),
            ..TextHeads::default()
        }
    }

    /// The most tokens a head is tokenized to.
    fn cap(&self) -> usize {
        self.n_positions.map_or(usize::MAX, |n| n.saturating_add(1))
    }

    /// Announces that `text` will be asked for `tokens` tokens, so that its first tokenization
    /// goes that far.
    fn ask(&mut self, text: &Arc<str>, tokens: usize) {
        let most = self.asked.entry(text.clone()).or_default();
        *most = (*most).max(tokens);
    }

    /// The head of `text` holding at least `tokens` tokens (or the whole text), for
    /// `TextCandidate::to_tokens`.
    fn get(&mut self, tokenizer: &Tokenizer, text: &Arc<str>, tokens: usize) -> Result<&TextHead> {
        let tokens = tokens
            .max(self.asked.get(text).copied().unwrap_or(0))
            .min(self.cap());
        if self
            .heads
            .get(text)
            .is_none_or(|h| !h.whole && h.tokens_asked < tokens)
        {
            let (encoding, whole) = tokenizer.encode_head_whole(text, tokens)?;
            let head = TextHead {
                ids: encoding.ids.clone().into(),
                encoding,
                tokens_asked: tokens,
                whole,
            };
            self.heads.insert(text.clone(), head);
        }
        Ok(&self.heads[text])
    }

    /// `c` as tokens (`TextCandidate::to_tokens`), its text tokenized as far as a window of
    /// `weights` after its position reads. That is first taken to be `head_tokens_needed`
    /// tokens, which holds when a token covers at least one byte; a normalizer that expands
    /// text (NFKC turns one character into up to 18) can put x_i past that, and the head is
    /// then tokenized further, so the window is never cut short of the text's end. With a
    /// model's `n_positions` (`within`), a candidate that would read past n_positions + 1
    /// tokens is refused once that many are tokenized.
    pub(crate) fn tokens_for(
        &mut self,
        tokenizer: &Tokenizer,
        c: &TextCandidate,
        weights: &[f64],
        placement: Placement,
        form: CallForm,
    ) -> Result<Tokenized> {
        let mut tokens = match head_tokens_needed(&c.text, c.position, weights) {
            Ok(tokens) => tokens,
            Err(reason) => return Ok(Err(reason)),
        };
        let cap = self.cap();
        let too_far = |what: &str| {
            Ok(Err(InvalidCandidate::TextTooLong {
                n_positions: cap - 1,
                detail: format!(
                    "{what} past the first n_positions ({}) tokens of the text, so no sequence \
                     of the candidate fits the model",
                    cap - 1
                ),
            }))
        };
        loop {
            let n_positions = self.n_positions;
            let head = match self.get(tokenizer, &c.text, tokens) {
                Ok(head) => head,
                // A text that cannot be cut for a head (`Tokenizer::encode_head`): this
                // candidate's reason, not the tokenizer's failure.
                Err(Error::Input(msg)) => return Ok(Err(InvalidCandidate::Text(msg))),
                Err(e) => return Err(e),
            };
            let reaches = head.encoding.spans.last().is_some_and(|s| s.1 > c.position);
            let capped = !head.whole && head.tokens_asked >= cap;
            if !head.whole && !reaches {
                if capped {
                    return too_far(&format!("position {} is", c.position));
                }
                tokens = tokens.saturating_mul(2);
                continue;
            }
            let held = head.ids.len();
            let whole = head.whole;
            let candidate = match c.to_tokens_within(
                tokenizer,
                placement,
                form,
                Some((&head.encoding, head.ids.clone())),
                n_positions,
            )? {
                Ok(candidate) => candidate,
                Err(reason) => return Ok(Err(reason)),
            };
            let reads = candidate.position + super::candidate::window_len(weights);
            if whole || reads <= held {
                return Ok(Ok(candidate));
            }
            if capped {
                return too_far("its window of weighted tokens reads");
            }
            tokens = reads.saturating_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiny GPT-J fixture's folder.
    fn tiny_gptj() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-gptj")
    }

    /// The tiny GPT-J fixture's tokenizer.
    fn fixture_tokenizer() -> Tokenizer {
        Tokenizer::from_file(&tiny_gptj().join("tokenizer.json")).unwrap()
    }

    /// Every call annotate's parser accepts, with a result as annotate cleans it, passes, and
    /// the call reads back as the same call.
    #[test]
    #[cfg(feature = "annotate")]
    fn calls_annotate_parses_pass() {
        use crate::annotate::calls::{clean_result, parse_call};
        let tok = fixture_tokenizer();
        let text = "Out of 1400 participants, 400 (or 29%) passed.";
        for (sampled, answer) in [
            ("Calculator(400 / 1400)]", "0.29"),
            ("Calculator((2 + 3) * 4) -> 20]", "20"),
            (" Calendar()] and more", "Today is Monday, January 1, 2024."),
            ("QA(What is f(x)?) -> a map]", "a map [of sorts] -> y"),
            ("QA(Who?) -> Paris (France)]", "Paris (France)"),
            ("MT(chien)]", " dog\n "),
            ("Überprüfer_2(a (b))]", "[]"),
            ("WikiSearch(Paris (France))]", "x) -> y (and largest city)"),
        ] {
            let (tool, input) = parse_call(sampled).unwrap();
            let result = clean_result(answer, &[]);
            check_call(&tool, &input, &result).unwrap();
            let c = TextCandidate {
                text: text.into(),
                position: text.find(" 29%").unwrap(),
                tool: tool.clone(),
                input: input.clone(),
                result,
                weights: None,
            };
            c.to_tokens(&tok, Placement::Prefix, CallForm::Arrow, None)
                .unwrap();
            let call = call_text(&tool, &input, Some(&c.result), CallForm::Arrow);
            assert_eq!(parse_call(&call[1..]).unwrap(), (tool, input), "{call}");
        }
    }

    /// An encoding of the text's head given to `to_tokens` would make the window of a call near
    /// its end shorter than the text's: refused, and the text cut where it ends is scored.
    #[test]
    fn to_tokens_refuses_an_encoding_of_part_of_the_text() {
        let tok = fixture_tokenizer();
        let text =
            "The population grew by 29% in the decade to 2020, and then it grew again. ".repeat(20);
        let head = tok.encode_head(&text, 12).unwrap();
        let ids: Arc<[u32]> = head.ids.clone().into();
        let end = head.spans.last().unwrap().1;
        assert!(end < text.len());
        let call = |text: &str| {
            TextCandidate::new(
                text,
                head.spans[head.ids.len() - 2].0,
                "Calculator",
                "1",
                "1",
            )
        };
        let err = call(&text)
            .to_tokens(
                &tok,
                Placement::Prefix,
                CallForm::Arrow,
                Some((&head, ids.clone())),
            )
            .unwrap_err();
        assert!(err.to_string().contains("the whole text's"), "{err}");
        // The head's own text, and the whole text's encoding, are accepted.
        let cut = call(&text[..end])
            .to_tokens(&tok, Placement::Prefix, CallForm::Arrow, Some((&head, ids)))
            .unwrap();
        let whole = tok.encode(&text).unwrap();
        let whole_ids: Arc<[u32]> = whole.ids.clone().into();
        let full = call(&text)
            .to_tokens(
                &tok,
                Placement::Prefix,
                CallForm::Arrow,
                Some((&whole, whole_ids)),
            )
            .unwrap();
        assert_eq!(cut.position, full.position);
        assert!(cut.text_ids.len() < full.text_ids.len());
        // Whitespace the tokenizer gives tokens to counts as text: an encoding without them is
        // refused too.
        let text = "The answer is 42.\n\n";
        let mut short = tok.encode(text).unwrap();
        assert_eq!(short.spans.last().unwrap().1, text.len());
        short.ids.pop();
        short.spans.pop();
        let ids: Arc<[u32]> = short.ids.clone().into();
        let c = TextCandidate::new(text, text.find(" 42").unwrap(), "Calculator", "1", "1");
        let err = c
            .to_tokens(
                &tok,
                Placement::Prefix,
                CallForm::Arrow,
                Some((&short, ids)),
            )
            .unwrap_err();
        assert!(err.to_string().contains("the whole text's"), "{err}");
    }

    /// A WordLevel tokenizer whose normalizer writes each "x" as `copies` "y" words (so a text
    /// grows when tokenized), with `word` its one other word, written into `dir`.
    fn expanding_tokenizer(dir: &std::path::Path, copies: usize, word: &str) -> Tokenizer {
        let path = dir.join("tokenizer.json");
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": {"type": "Replace", "pattern": {"String": "x"},
                           "content": vec!["y"; copies].join(" ")},
            "pre_tokenizer": {"type": "WhitespaceSplit"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "y": 1, word: 2},
                      "unk_token": "[UNK]"},
        });
        std::fs::write(&path, json.to_string()).unwrap();
        Tokenizer::from_file(&path).unwrap()
    }

    /// `c` tokenized from a head (`TextHeads::tokens_for`) and whole (`to_tokens`), prefix
    /// placement, default options: both put x_i at `position`, and every variant's sequence is
    /// the same. Returns the head's candidate.
    fn head_reads_as_whole(tok: &Tokenizer, c: &TextCandidate, position: usize) -> TokenCandidate {
        let options = ScoreOptions::default();
        let weights = options.weights.as_slice();
        let whole = c
            .to_tokens(tok, Placement::Prefix, CallForm::Arrow, None)
            .unwrap();
        assert_eq!(whole.position, position);
        let head = TextHeads::default()
            .tokens_for(tok, c, weights, Placement::Prefix, CallForm::Arrow)
            .unwrap()
            .unwrap();
        assert_eq!(head.position, position);
        for v in super::super::Variant::ALL {
            assert_eq!(
                super::super::variant_sequence(&head, v, &options),
                super::super::variant_sequence(&whole, v, &options)
            );
        }
        head
    }

    /// A normalizer that expands text puts x_i past the `position + 1` tokens its byte offset
    /// allows: the head is tokenized further until the whole window is in it, as tokenizing the
    /// whole text gives. (Each "x" becomes 20 words, and the words after the position are
    /// 100-byte ones, so that a head of 8 bytes per token holds too few tokens after it.)
    #[test]
    fn a_normalizer_that_expands_text_does_not_cut_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let long = "a".repeat(100);
        let tok = expanding_tokenizer(dir.path(), 20, &long);
        let text = format!("{}{}", "x ".repeat(30), format!("{long} ").repeat(200));
        let c = TextCandidate {
            text: text.into(),
            position: 60,
            tool: "Calculator".into(),
            input: "1 + 2".into(),
            result: "3".into(),
            weights: None,
        };
        let options = ScoreOptions::default();
        let head = head_reads_as_whole(&tok, &c, 600);
        assert_eq!(
            head.window(&options).count(),
            options.weights.as_slice().len()
        );
    }

    #[test]
    fn to_tokens_refuses_what_check_call_refuses() {
        let tok = fixture_tokenizer();
        let c = TextCandidate {
            text: "It costs 3 dollars.".into(),
            position: 8,
            tool: "Calculator".into(),
            input: "1 + 2".into(),
            result: "3] more".into(),
            weights: None,
        };
        let err = c
            .to_tokens(&tok, Placement::Prefix, CallForm::Arrow, None)
            .unwrap_err();
        assert!(err.to_string().contains("result \"3] more\""), "{err}");
    }

    /// Inline, the scored call is what C* splices in: with a space only where the text
    /// continues with whitespace.
    #[test]
    fn inline_calls_are_scored_as_they_are_spliced() {
        let tok = fixture_tokenizer();
        let text = "Out of 1400 participants, 400 (or 29%) passed.";
        for at in [text.find(" 29%").unwrap(), text.find("%)").unwrap()] {
            let c = TextCandidate {
                text: text.into(),
                position: at,
                tool: "Calculator".into(),
                input: "400 / 1400".into(),
                result: "0.29".into(),
                weights: None,
            };
            let t = c
                .to_tokens(&tok, Placement::Inline, CallForm::Arrow, None)
                .unwrap();
            let spliced = splice(
                text,
                &[(
                    at,
                    call_text(&c.tool, &c.input, Some(&c.result), CallForm::Arrow),
                )],
            );
            let scored = tok
                .decode(
                    &[
                        &t.text_ids[..t.position],
                        &t.call_result_ids,
                        &t.text_ids[t.position..],
                    ]
                    .concat(),
                )
                .unwrap();
            assert_eq!(scored, spliced);
        }
    }

    /// A tokenizer that trims offsets gives x_i = " 29" both the end of "or" and the byte after
    /// the space: both offsets score the call where C* splices it, before the space.
    #[test]
    fn inline_calls_read_the_space_at_the_end_of_the_previous_token() {
        let path = tiny_gptj().join("tokenizer.json");
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        json["post_processor"]["trim_offsets"] = true.into();
        let dir = tempfile::tempdir().unwrap();
        let trimming = dir.path().join("tokenizer.json");
        std::fs::write(&trimming, json.to_string()).unwrap();
        let tok = Tokenizer::from_file(&trimming).unwrap();
        let text = "Out of 1400 participants, 400 (or 29%) passed.";
        let (before, after) = (text.find(" 29%").unwrap(), text.find("29%").unwrap());
        let k = tok.encode(text).unwrap().token_at_byte(after).unwrap();
        assert_eq!(tok.encode(text).unwrap().token_at_byte(before), Ok(k));
        let tokens = |at: usize| {
            TextCandidate {
                text: text.into(),
                position: at,
                tool: "Calculator".into(),
                input: "400 / 1400".into(),
                result: "0.29".into(),
                weights: None,
            }
            .to_tokens(&tok, Placement::Inline, CallForm::Arrow, None)
            .unwrap()
        };
        let (a, b) = (tokens(before), tokens(after));
        assert_eq!(
            (&a.call_ids, &a.call_result_ids),
            (&b.call_ids, &b.call_result_ids)
        );
        let scored = tok
            .decode(
                &[
                    &b.text_ids[..b.position],
                    &b.call_result_ids,
                    &b.text_ids[b.position..],
                ]
                .concat(),
            )
            .unwrap();
        assert!(
            scored.contains("(or [Calculator(400 / 1400) -> 0.29] 29%)"),
            "{scored}"
        );
    }

    /// The head is tokenized further when the window reads exactly one token past it. "x"
    /// expands to 4 words, so x_i (at byte 2) is the 5th token: the head asked for by the byte
    /// offset (2 + 5 + 1 = 8 tokens) is cut by `encode_head` before the 13th 9-letter word, 8
    /// tokens long, and the window x_4 .. x_8 needs a 9th.
    #[test]
    fn a_window_one_token_past_the_head_is_read_further() {
        let dir = tempfile::tempdir().unwrap();
        let tok = expanding_tokenizer(dir.path(), 4, "abcdefghi");
        let text = format!("x {}", "abcdefghi ".repeat(40));
        let c = TextCandidate::new(text, 2, "Calculator", "1 + 2", "3");
        // The premise: the first head asked for holds x_0 .. x_7, one short of the window.
        assert_eq!(tok.encode_head(&c.text, 8).unwrap().ids.len(), 8);
        let options = ScoreOptions::default();
        let head = head_reads_as_whole(&tok, &c, 4);
        assert_eq!(
            head.window(&options).count(),
            options.weights.as_slice().len()
        );
    }

    /// A head whose last token ends at the candidate's offset does not hold x_i: it is
    /// tokenized further, not taken for the end of the text. "x" expands to 4 words, so the
    /// head asked for by the offset (5 + 5 + 1 = 11 tokens) is cut by `encode_head` after the
    /// third "x" (12 tokens, the 8 words after it its margin), where the offset is.
    #[test]
    fn a_head_that_ends_at_the_offset_is_read_further() {
        let dir = tempfile::tempdir().unwrap();
        let word = "abcdefghijklmnop";
        let tok = expanding_tokenizer(dir.path(), 4, word);
        let text = format!("x x x {}", format!("{word} ").repeat(40));
        let c = TextCandidate::new(text, 5, "Calculator", "1 + 2", "3");
        // The premise: the first head asked for ends with the third "x", at the offset.
        let first = tok.encode_head(&c.text, 11).unwrap();
        assert_eq!((first.ids.len(), first.spans.last().unwrap().1), (12, 5));
        head_reads_as_whole(&tok, &c, 12);
    }

    /// A candidate's own weights may read further than the batch's: its text is tokenized as
    /// far as they reach, so score_texts scores what the whole text's tokens give.
    #[test]
    fn a_candidates_own_longer_weights_read_its_text_as_far_as_they_reach() {
        let dir = tiny_gptj();
        let model = crate::model::Model::load(&dir).unwrap();
        let tok = model.tokenizer().unwrap();
        let scorer = crate::score::ReferenceScorer::new(&model);
        let text =
            "The population grew by 29% in the decade to 2020, and it grew again. ".repeat(12);
        let at = text.find(" 29%").unwrap();
        let mut c = TextCandidate::new(text.as_str(), at, "Calculator", "1 + 2", "3");
        c.weights = Some((0..120).map(|t| 1.0 / (t + 1) as f64).collect());
        let options = ScoreOptions::default();
        let got = score_texts(&scorer, tok, &[c.clone()], &options, CallForm::Arrow).unwrap();
        let whole = c
            .to_tokens(tok, options.placement, CallForm::Arrow, None)
            .unwrap();
        assert_eq!(whole.window(&options).count(), 120);
        assert_eq!(got, scorer.score(&[whole], &options).unwrap());
    }

    /// The first candidate in order that cannot be scored is the one named, even when a later
    /// one cannot be tokenized at all: candidate 0's own weights are refused by `validate`,
    /// candidate 1's call by `check_call`.
    #[test]
    fn score_texts_names_a_refused_candidate_before_a_later_one_that_cannot_be_tokenized() {
        let dir = tiny_gptj();
        let model = crate::model::Model::load(&dir).unwrap();
        let tok = model.tokenizer().unwrap();
        let scorer = crate::score::ReferenceScorer::new(&model);
        let text = "It costs 3 dollars, or 29% of what it cost.";
        let at = text.find(" 29%").unwrap();
        let mut bad_weights = TextCandidate::new(text, at, "Calculator", "1 + 2", "3");
        bad_weights.weights = Some(vec![0.5, -1.0]);
        let bad_call = TextCandidate::new(text, at, "Calculator", "1 + 2", "3] more");
        let options = ScoreOptions::default();
        let cands = [bad_weights, bad_call];
        let err = score_texts(&scorer, tok, &cands, &options, CallForm::Arrow).unwrap_err();
        assert!(
            matches!(&err, Error::Candidate { index: 0, .. }) && err.to_string().contains("-1"),
            "{err}"
        );
    }

    /// A text the tokenizer itself cannot encode (a character its vocabulary lacks, with no
    /// unknown token in it) fails the batch naming the candidate whose text it is.
    #[test]
    fn a_text_the_tokenizer_cannot_encode_is_named_by_its_candidate() {
        let fixture = tiny_gptj();
        let model = crate::model::Model::load(&fixture).unwrap();
        let scorer = crate::score::ReferenceScorer::new(&model);
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixture.join("tokenizer.json")).unwrap())
                .unwrap();
        // "~" is in no merge, so the rest of the vocabulary encodes as before.
        json["model"]["vocab"].as_object_mut().unwrap().remove("~");
        json["model"]["unk_token"] = "<unk>".into();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, json.to_string()).unwrap();
        let tok = Tokenizer::from_file(&path).unwrap();
        let plain = "It costs 3 dollars, or 29% of what it cost.";
        let tilde = "It costs ~3 dollars, or 29% of what it cost.";
        let cands = [plain, tilde].map(|text| {
            let at = text.find(" 29%").unwrap();
            TextCandidate::new(text, at, "Calculator", "1 + 2", "3")
        });
        let options = ScoreOptions::default();
        let err = score_texts(&scorer, &tok, &cands, &options, CallForm::Arrow).unwrap_err();
        let want = format!(
            "tokenizer {}: candidate 1: cannot encode \"{tilde}\"",
            path.display()
        );
        assert!(err.to_string().starts_with(&want), "{err}");
    }

    /// With a model's n_positions, a candidate that reads past the first n_positions + 1 tokens
    /// of its text is refused naming what reads there: its window, or its position itself.
    #[test]
    fn a_text_read_past_n_positions_is_refused_naming_what_reads_there() {
        let tok = fixture_tokenizer();
        let text =
            "The population grew by 29% in the decade to 2020, and it grew again. ".repeat(8);
        let weights = vec![1.0; 200];
        let refusal = |position: usize| {
            let c = TextCandidate::new(text.as_str(), position, "Calculator", "1 + 2", "3");
            match TextHeads::within(16)
                .tokens_for(&tok, &c, &weights, Placement::Prefix, CallForm::Arrow)
                .unwrap()
            {
                Err(reason) => reason.to_string(),
                Ok(t) => panic!("{t:?}"),
            }
        };
        let msg = refusal(text.find(" 29%").unwrap());
        assert!(
            msg.contains(
                "its window of weighted tokens reads past the first n_positions (16) tokens of \
                 the text"
            ),
            "{msg}"
        );
        let far = text.rfind(" 29%").unwrap();
        let msg = refusal(far);
        assert!(
            msg.contains(&format!(
                "position {far} is past the first n_positions (16) tokens"
            )),
            "{msg}"
        );
    }

    /// An encoding that goes past the end of the text (another, longer text's) is refused too.
    #[test]
    fn to_tokens_refuses_an_encoding_of_a_longer_text() {
        let tok = fixture_tokenizer();
        let text = "The population grew by 29% in the decade to 2020.";
        let longer = tok.encode(&format!("{text} Then it grew again.")).unwrap();
        let ids: Arc<[u32]> = longer.ids.clone().into();
        let c = TextCandidate::new(text, text.find(" 29%").unwrap(), "Calculator", "1", "1");
        let err = c
            .to_tokens(
                &tok,
                Placement::Prefix,
                CallForm::Arrow,
                Some((&longer, ids)),
            )
            .unwrap_err();
        assert!(err.to_string().contains("the whole text's"), "{err}");
    }

    /// A call of exactly n_positions tokens is not "longer than" n_positions: the call check
    /// lets it through (its sequences, text and all, are `validate`'s to refuse), and one token
    /// fewer of n_positions refuses it.
    #[test]
    fn a_call_of_exactly_n_positions_tokens_is_not_refused_as_longer() {
        let tok = fixture_tokenizer();
        let text = "It costs 3 dollars, or 29% of what it cost.";
        let c = TextCandidate::new(text, text.find(" 29%").unwrap(), "Calculator", "1 + 2", "3");
        let within = |n: usize| {
            c.to_tokens_within(&tok, Placement::Prefix, CallForm::Arrow, None, Some(n))
                .unwrap()
        };
        let unbounded = within(usize::MAX).unwrap();
        let n = unbounded.call_result_ids.len();
        assert_eq!(within(n), Ok(unbounded));
        let msg = within(n - 1).unwrap_err().to_string();
        assert!(msg.contains(&format!("n_positions ({})", n - 1)), "{msg}");
    }
}
