//! tokenizer.json through the `tokenizers` crate, with the byte spans that map a text position to a
//! token boundary.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Tokens dropped from the end of a head's encoding (`Tokenizer::encode_head`): the cut is made
/// where no pre-token of the tokenizers we know of crosses it, and these tokens guard the rest.
const HEAD_MARGIN_TOKENS: usize = 8;
/// Bytes of text first tokenized per token wanted (`Tokenizer::encode_head`); English runs at
/// about 4, so the first try usually suffices.
const HEAD_BYTES_PER_TOKEN: usize = 8;
/// The longest stretch with no place to cut a head (no whitespace after a word) that
/// `Tokenizer::encode_head` tokenizes: the tokenizers crate takes ~165 bytes of memory per byte
/// of a single unbroken word (1.3 GB here), and a 64 MiB line would take 10 GB.
pub const MAX_UNCUT_BYTES: usize = 8 << 20;

/// The largest tokenizer.json read: GPT-J's is 1.4 MB; the largest on the Hugging Face hub are
/// some 35 MB.
const MAX_FILE_BYTES: u64 = 64 << 20;

/// A Hugging Face tokenizer.json, with padding and truncation off (a text's own tokens).
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    /// XXH3-64 of the file's bytes (part of `Model::content_xxh3`).
    source_xxh3: u64,
}

/// A tokenized text: ids and, per id, the byte range of the text it covers.
#[derive(Debug, Clone)]
pub struct Encoding {
    /// Token ids, in text order.
    pub ids: Vec<u32>,
    /// Per id, `(start, end)`: the byte range `start..end` of the text it covers (the
    /// `tokenizers` crate's offsets, checked to lie on the text's character boundaries); as
    /// long as `ids`.
    pub spans: Vec<(usize, usize)>,
}

// By hand: the inner tokenizer's Debug prints its whole vocabulary.
impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.vocab_size())
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Reads a tokenizer.json; errors name the file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes =
            crate::util::fs::read_small_file(path, MAX_FILE_BYTES, |msg| Error::Tokenizer {
                path: path.to_owned(),
                msg,
            })?;
        Self::from_bytes(&bytes, path)
    }

    /// A tokenizer.json's bytes (one embedded in a binary, or fetched by the caller); `path`
    /// names it in errors and is what `path` returns.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self> {
        let err = |msg: String| Error::Tokenizer {
            path: path.to_owned(),
            msg,
        };
        // A byte order mark is skipped, as in config.json; the hash stays the file's.
        let json = crate::util::json::strip_bom_bytes(bytes);
        // Syntax first: the crate panics on some text that is no JSON (an `expect` in its
        // decoder's deserializer) instead of returning the error. Its message would also be the
        // same for JSON that is no tokenizer (a config.json copied over it, say).
        if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(json) {
            return Err(err(format!("is not valid JSON: {e}")));
        }
        let not_tokenizer = |e: &dyn std::fmt::Display| {
            err(format!(
                "is JSON, but not a Hugging Face tokenizer (the tokenizer.json that `tokenizers` \
                 or transformers saves): {e}"
            ))
        };
        // And some JSON that is no tokenizer panics it too (a "Precompiled" normalizer whose
        // charsmap is not a string): a corrupt file is an error, not a crash. The crate's own
        // state is not shared with the caller, so nothing half-built survives the unwind.
        let parsed = crate::util::catch_panic_quietly(|| tokenizers::Tokenizer::from_bytes(json))
            .map_err(|msg| {
            not_tokenizer(&format_args!("the tokenizers crate failed on it ({msg})"))
        })?;
        let mut inner = parsed.map_err(|e| not_tokenizer(&e))?;
        // A text's own tokens, as transformers' tokenizers give them unless a call asks for
        // more: a saved padding or truncation setting would put pad tokens into the scored
        // sequences or cut the text.
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| err(format!("cannot turn truncation off: {e}")))?;
        if let Some(token) = empty_added_token(&inner) {
            return Err(err(format!(
                "the added token {token:?} is empty once normalized, so it matches everywhere: \
                 the tokenizers crate then panics or allocates without bound when it encodes \
                 (tokenizers issue 1349)"
            )));
        }
        Ok(Tokenizer {
            inner,
            path: path.to_owned(),
            source_xxh3: xxhash_rust::xxh3::xxh3_64(bytes),
        })
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// XXH3-64 of the tokenizer.json bytes this was read from.
    pub fn source_xxh3(&self) -> u64 {
        self.source_xxh3
    }

    /// The text of every special added token (GPT-J: "<|endoftext|>"): `encode` turns such text
    /// into that token wherever it appears.
    pub fn special_tokens(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .inner
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special)
            .map(|t| t.content)
            .collect();
        out.sort();
        out
    }

    /// Tokenizes `text` as is: no special tokens added.
    pub fn encode(&self, text: &str) -> Result<Encoding> {
        let enc = self.guarded(format_args!("cannot encode {:?}", preview(text)), |inner| {
            inner.encode(text, false)
        })?;
        let spans = enc.get_offsets().to_vec();
        // Callers slice the text at these offsets: one off a character boundary (a tokenizer
        // whose offsets are not the input's bytes) is this text's error, not a panic later.
        if let Some((start, end)) = span_off_boundaries(text, &spans) {
            return Err(Error::Tokenizer {
                path: self.path.clone(),
                msg: format!(
                    "encoding {:?} gave the token offsets {start}..{end}, which are not a span \
                     of its {} bytes on character boundaries",
                    preview(text),
                    text.len()
                ),
            });
        }
        Ok(Encoding {
            ids: enc.get_ids().to_vec(),
            spans,
        })
    }

    /// The first tokens of `text`'s encoding: all of them, or at least `n`, tokenizing only a
    /// head of the text when that is enough. A document of megabytes whose first thousand
    /// tokens are all a run reads is not tokenized whole (seconds per document).
    ///
    /// The head ends just before a whitespace character that follows a non-whitespace one:
    /// byte-level BPE and Metaspace pre-tokenizers never join a token across that point, so the
    /// head's tokens are the text's; the last `HEAD_MARGIN_TOKENS` are dropped anyway, and a head
    /// that yields too few tokens (or has no such point) doubles until it is the whole text.
    /// Past the first head it tries ((n + 8) 8 bytes: 8 bytes for each of n tokens and a margin
    /// of 8), a head or text with a stretch longer than [`MAX_UNCUT_BYTES`] and no such point
    /// in it is refused (`Error::Input`) rather than tokenized, wherever the stretch lies.
    pub fn encode_head(&self, text: &str, n: usize) -> Result<Encoding> {
        Ok(self.encode_head_whole(text, n)?.0)
    }

    /// `encode_head`, and whether the encoding is the whole text's.
    pub(crate) fn encode_head_whole(&self, text: &str, n: usize) -> Result<(Encoding, bool)> {
        let first_bytes = n
            .saturating_add(HEAD_MARGIN_TOKENS)
            .saturating_mul(HEAD_BYTES_PER_TOKEN);
        self.encode_head_from(text, n, first_bytes)
    }

    fn encode_head_from(
        &self,
        text: &str,
        n: usize,
        first_bytes: usize,
    ) -> Result<(Encoding, bool)> {
        let mut bytes = first_bytes.max(1);
        // What the caller asked for is tokenized as it is; past it, a stretch with no cut must
        // not cost gigabytes (`MAX_UNCUT_BYTES`), even after a word that could end a head.
        let refuse_uncut = |end: usize| -> Result<()> {
            if end <= first_bytes || end <= MAX_UNCUT_BYTES {
                return Ok(());
            }
            let (start, len) = longest_uncut(&text[..end]);
            if len <= MAX_UNCUT_BYTES {
                return Ok(());
            }
            Err(Error::input(format!(
                "a text of {} bytes has no whitespace after a word in the {len} bytes from byte \
                 {start}, so no head of it can be tokenized alone past there, and that is more \
                 than the {} MiB tokenized in one piece",
                text.len(),
                MAX_UNCUT_BYTES >> 20
            )))
        };
        loop {
            if bytes >= text.len() {
                refuse_uncut(text.len())?;
                return Ok((self.encode(text)?, true));
            }
            if let Some(cut) = head_cut(text, bytes) {
                refuse_uncut(cut)?;
                let mut enc = self.encode(&text[..cut])?;
                if enc.ids.len() >= n.saturating_add(HEAD_MARGIN_TOKENS) {
                    let keep = enc.ids.len() - HEAD_MARGIN_TOKENS;
                    enc.ids.truncate(keep);
                    enc.spans.truncate(keep);
                    return Ok((enc, false));
                }
            }
            bytes = bytes.saturating_mul(2);
        }
    }

    /// `encode`'s ids alone.
    pub fn encode_ids(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.encode(text)?.ids)
    }

    /// The text of `ids`, special tokens included; the `tokenizers` crate skips an id it does
    /// not know (one of the model's rows past the tokenizer's vocabulary) without an error.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.guarded("cannot decode", |inner| inner.decode(ids, false))
    }

    /// `call` on the crate's tokenizer, its error or panic as this file's `Error::Tokenizer`
    /// (`what: ...`). The crate has `expect`s on its encoding path (an added token that splits
    /// a normalized string badly); the load refuses the one known cause, and whatever else
    /// reaches them is this text's error, not a crash. Nothing of the crate's is left
    /// half-changed: its caches take their locks with `try_` and skip a poisoned one.
    fn guarded<R, E: std::fmt::Display>(
        &self,
        what: impl std::fmt::Display,
        call: impl FnOnce(&tokenizers::Tokenizer) -> std::result::Result<R, E>,
    ) -> Result<R> {
        let inner = &self.inner;
        let msg =
            match crate::util::catch_panic_quietly(std::panic::AssertUnwindSafe(|| call(inner))) {
                Ok(Ok(r)) => return Ok(r),
                Ok(Err(e)) => e.to_string(),
                Err(panic) => format!("the tokenizers crate failed ({panic})"),
            };
        Err(Error::Tokenizer {
            path: self.path.clone(),
            msg: format!("{what}: {msg}"),
        })
    }

    /// The id of a string that is exactly one token, if it is one.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Tokens in the vocabulary, added tokens included (`id_count` when ids have gaps).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The highest id this tokenizer can produce, plus one (its vocabulary and added tokens):
    /// what a model needs rows for, which `vocab_size` undercounts when ids have gaps.
    pub fn id_count(&self) -> usize {
        self.inner
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&id| id as usize + 1)
    }

    /// Every id of the vocabulary and the added tokens, ascending (only those: ids may have
    /// gaps, and one huge id does not make a long list).
    pub fn ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.inner.get_vocab(true).into_values().collect();
        ids.sort_unstable();
        ids
    }

    /// The `tokenizers` crate's tokenizer, padding and truncation off. Its type is that crate's
    /// (0.23 today): it changes with toolsift's dependency, outside toolsift's own versioning.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Fails on the first id the model has no row for (a tokenizer with more ids than the model's
/// `vocab_size`, which `Model::load` warns about), saying so.
pub(crate) fn check_vocab(ids: &[u32], vocab_size: usize) -> std::result::Result<(), String> {
    match ids.iter().find(|&&t| t as usize >= vocab_size) {
        Some(bad) => Err(format!(
            "token id {bad} is outside the vocabulary (vocab_size {vocab_size}); the tokenizer \
             has more ids than the model"
        )),
        None => Ok(()),
    }
}

/// The end of a head of `text` of at most `bytes` bytes and more than half that: a character
/// boundary followed by whitespace and preceded by something else.
fn head_cut(text: &str, bytes: usize) -> Option<usize> {
    let mut end = bytes.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut next_is_space = text[end..].starts_with(char::is_whitespace);
    for (p, c) in text[..end].char_indices().rev() {
        if p < bytes / 2 {
            break;
        }
        let is_space = c.is_whitespace();
        if next_is_space && !is_space {
            return Some(p + c.len_utf8());
        }
        next_is_space = is_space;
    }
    None
}

/// The longest stretch of `text` between two places a head can end (`head_cut`'s: before
/// whitespace that follows something else), or its start or end: (start, length).
fn longest_uncut(text: &str) -> (usize, usize) {
    let (mut best, mut start) = ((0, 0), 0);
    let mut after_word = false;
    for (p, c) in text.char_indices() {
        let is_space = c.is_whitespace();
        if is_space && after_word {
            if p - start > best.1 {
                best = (start, p - start);
            }
            start = p;
        }
        after_word = !is_space;
    }
    if text.len() - start > best.1 {
        best = (start, text.len() - start);
    }
    best
}

/// The first added token whose text is empty, or empty once the tokenizer's normalizer has run
/// on it (a `normalized` one: the crate matches those in normalized text). The crate builds a
/// matcher with an empty pattern from it, and encoding then panics or allocates without bound.
fn empty_added_token(inner: &tokenizers::Tokenizer) -> Option<String> {
    let mut added: Vec<_> = inner.get_added_tokens_decoder().into_iter().collect();
    added.sort_by_key(|(id, _)| *id);
    added.into_iter().map(|(_, t)| t).find_map(|t| {
        let empty = match (t.normalized, inner.get_normalizer()) {
            (true, Some(normalizer)) => {
                let mut text = tokenizers::NormalizedString::from(t.content.as_str());
                let normalizer = std::panic::AssertUnwindSafe(normalizer);
                // A normalizer that fails or panics on the token's text is not this check's
                // to report: encoding will say so, text by text.
                crate::util::catch_panic_quietly(move || {
                    tokenizers::Normalizer::normalize(*normalizer, &mut text).map(|()| text)
                })
                .ok()
                .and_then(|r| r.ok())
                .is_some_and(|text| text.get().is_empty())
            }
            _ => t.content.is_empty(),
        };
        empty.then_some(t.content)
    })
}

/// The start of a text, for an error message.
fn preview(text: &str) -> String {
    const SHOWN: usize = 200;
    match text.char_indices().nth(SHOWN) {
        Some((end, _)) => format!("{}… ({} bytes)", &text[..end], text.len()),
        None => text.to_owned(),
    }
}

impl Encoding {
    /// Index of the token that starts at byte `offset`. Byte-level BPE tokens carry their leading
    /// space (" 29"); a tokenizer that trims offsets reports " 29" as starting after the space, so
    /// the end of the previous token counts as a boundary too, when the token's reported start
    /// is not before it. A token that begins inside a character (the second byte of "é" merged
    /// with "t") reports the whole character, so its start is before the previous token's end:
    /// that offset falls inside it.
    pub fn token_at_byte(&self, offset: usize) -> std::result::Result<usize, String> {
        self.locate_byte(offset).map_err(|miss| miss.to_string())
    }

    /// `token_at_byte`, its refusal as a value (the text-level candidate's reason).
    pub(crate) fn locate_byte(
        &self,
        offset: usize,
    ) -> std::result::Result<usize, crate::error::InvalidCandidate> {
        use crate::error::InvalidCandidate;
        if self.spans.is_empty() {
            // As a token-level candidate says it (`validate`).
            return Err(InvalidCandidate::EmptyText);
        }
        for (k, &(start, end)) in self.spans.iter().enumerate() {
            let after_previous = k > 0 && self.spans[k - 1].1 == offset && start >= offset;
            if start == offset || (after_previous && offset < end) {
                return Ok(k);
            }
            if start < offset && offset < end {
                return Err(InvalidCandidate::InsideToken {
                    offset,
                    token: k,
                    start,
                    end,
                });
            }
        }
        Err(InvalidCandidate::NoTokenAfter {
            offset,
            end: self.spans.last().map_or(0, |s| s.1),
        })
    }
}

/// The first span that is not a byte range of `text` on character boundaries.
fn span_off_boundaries(text: &str, spans: &[(usize, usize)]) -> Option<(usize, usize)> {
    spans.iter().copied().find(|&(start, end)| {
        start > end || !text.is_char_boundary(start) || !text.is_char_boundary(end)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn demo_tokenizer() -> Tokenizer {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo/tokenizer.json");
        Tokenizer::from_file(&path).unwrap()
    }

    /// A WordPiece tokenizer with BERT's normalizer and added tokens, as in tokenizers issue
    /// 1349: "\u200c" normalizes to nothing, and with it encoding "£" panicked the crate
    /// (added_vocabulary.rs) and encoding "aa" tried to allocate 6 GiB and aborted.
    fn wordpiece_json(added: &[(&str, bool)]) -> String {
        let added: Vec<serde_json::Value> = added
            .iter()
            .enumerate()
            .map(|(i, (content, normalized))| {
                serde_json::json!({"id": 10 + i, "content": content, "single_word": false,
                    "lstrip": false, "rstrip": false, "normalized": normalized,
                    "special": false})
            })
            .collect();
        serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
            "normalizer": {"type": "BertNormalizer", "clean_text": true,
                "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordPiece", "unk_token": "[UNK]",
                "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
                "vocab": {"[UNK]": 0, "a": 1, "b": 2, "c": 3, "\u{a3}": 4}}
        })
        .to_string()
    }

    #[test]
    fn an_added_token_that_normalizes_to_nothing_is_refused_at_load() {
        let path = Path::new("bad/tokenizer.json");
        let bad = wordpiece_json(&[("aaaa", true), ("eg", true), ("\u{200c}", true)]);
        match Tokenizer::from_bytes(bad.as_bytes(), path) {
            Err(Error::Tokenizer { path: p, msg }) => {
                assert_eq!(p, path);
                assert!(
                    msg.contains(r#"the added token "\u{200c}" is empty once normalized"#),
                    "{msg}"
                );
            }
            other => panic!("{other:?}"),
        }
        // The same token matched in the raw text is not empty, and encodes.
        let ok = wordpiece_json(&[("aaaa", true), ("eg", true), ("\u{200c}", false)]);
        let tok = Tokenizer::from_bytes(ok.as_bytes(), path).unwrap();
        assert_eq!(tok.encode_ids("\u{a3}").unwrap(), [4]);
        assert_eq!(tok.encode_ids("aa").unwrap(), [0]);

        // Past the load check (built by hand here), the crate's panic on "£" is the text's
        // error. ("aa" is not tried: an allocation failure aborts, which nothing can catch.)
        crate::util::install_quiet_panic_hook();
        let unchecked = Tokenizer {
            inner: tokenizers::Tokenizer::from_bytes(bad.as_bytes()).unwrap(),
            path: path.to_owned(),
            source_xxh3: 0,
        };
        match unchecked.encode("\u{a3}") {
            Err(Error::Tokenizer { msg, .. }) => assert!(
                msg.contains("cannot encode \"\u{a3}\": the tokenizers crate failed"),
                "{msg}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn spans_must_lie_on_character_boundaries() {
        let text = "a\u{e9}b"; // bytes: a, 0xC3 0xA9, b
        assert_eq!(span_off_boundaries(text, &[(0, 1), (1, 3), (3, 4)]), None);
        assert_eq!(span_off_boundaries(text, &[(0, 4), (4, 4)]), None);
        for bad in [(1, 2), (2, 3), (3, 5), (3, 1)] {
            assert_eq!(span_off_boundaries(text, &[(0, 1), bad]), Some(bad));
        }
        // The tokenizers' own: byte-level BPE may split a character over two tokens, each
        // given the whole character's span.
        for tok in [demo_tokenizer(), gptj_tokenizer()] {
            let text = "Caf\u{e9} \u{1F600} na\u{ef}ve \u{4e2d}\u{6587}";
            let enc = tok.encode(text).unwrap();
            assert_eq!(span_off_boundaries(text, &enc.spans), None);
        }
    }

    fn gptj_tokenizer() -> Tokenizer {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-gptj/tokenizer.json");
        Tokenizer::from_file(&path).unwrap()
    }

    /// A tokenizer.json saved with padding or truncation on encodes a text to its own tokens,
    /// as transformers does when a call does not ask for either.
    #[test]
    fn saved_padding_and_truncation_are_not_applied() {
        let dir = tempfile::tempdir().unwrap();
        let fixture =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-gptj/tokenizer.json");
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&fixture).unwrap()).unwrap();
        json["padding"] = serde_json::json!({"strategy": {"Fixed": 40}, "direction": "Right",
            "pad_to_multiple_of": 8, "pad_id": 0, "pad_type_id": 0, "pad_token": "<|endoftext|>"});
        json["truncation"] = serde_json::json!({"direction": "Right", "max_length": 4,
            "strategy": "LongestFirst", "stride": 0});
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, json.to_string()).unwrap();
        let text = "Out of 1400 participants, 400 (or 29%) passed the test.";
        let want = gptj_tokenizer().encode(text).unwrap();
        let got = Tokenizer::from_file(&path).unwrap().encode(text).unwrap();
        assert!(want.ids.len() > 4 && want.ids.len() < 40);
        assert_eq!((got.ids, got.spans), (want.ids, want.spans));
    }

    #[test]
    fn token_boundaries_of_leading_space_trimmed_and_cross_character_tokens() {
        // "x été y" as byte-level BPE reports it with a merge of the second byte of "é" and
        // "t": "x", " ", "Ã" (bytes 2..4), "©t" (really 3..5, reported 2..5), "Ã", "©", " ", "y".
        let enc = Encoding {
            ids: (0..8).collect(),
            spans: vec![
                (0, 1),
                (1, 2),
                (2, 4),
                (2, 5),
                (5, 7),
                (5, 7),
                (7, 8),
                (8, 9),
            ],
        };
        for (offset, token) in [(0, 0), (1, 1), (2, 2), (5, 4), (7, 6), (8, 7)] {
            assert_eq!(enc.token_at_byte(offset), Ok(token), "byte {offset}");
        }
        // Byte 4 starts "t", inside "©t": no token starts there.
        let err = enc.token_at_byte(4).unwrap_err();
        assert!(err.contains("inside token 3"), "{err}");
        assert!(enc.token_at_byte(3).is_err() && enc.token_at_byte(9).is_err());
        // A tokenizer that trims offsets: " 29" reported as 3..5 after "or" (0..2).
        let trimmed = Encoding {
            ids: vec![0, 1],
            spans: vec![(0, 2), (3, 5)],
        };
        assert_eq!(trimmed.token_at_byte(2), Ok(1));
        assert_eq!(trimmed.token_at_byte(3), Ok(1));
    }

    #[test]
    fn longest_uncut_stretch() {
        assert_eq!(longest_uncut(""), (0, 0));
        assert_eq!(longest_uncut("abc"), (0, 3));
        // Cuts at 2 ("ab|  cd") and 9 ("  cd\u{e9}f| gh"): the stretch from 2 is 7 bytes.
        assert_eq!(longest_uncut("ab  cd\u{e9}f gh"), (2, 7));
        assert_eq!(longest_uncut("   ab"), (0, 5));
        assert_eq!(longest_uncut("a b cdefg"), (3, 6));
    }

    #[test]
    fn head_cut_ends_before_whitespace_after_a_word() {
        let text = "ab  cd\u{e9}f gh";
        // "ab  cd\u{e9}f" | " gh", and "ab" | "  cd\u{e9}f gh".
        assert_eq!(head_cut(text, 9), Some(9));
        assert_eq!(head_cut(text, 3), Some(2));
        // Inside "\u{e9}", and no word ends in bytes 3..6.
        assert_eq!(head_cut(text, 7), None);
        assert_eq!(head_cut("abcdefghij kl", 8), None);
        assert_eq!(head_cut("abcd efgh ij", 8), None);
        assert_eq!(head_cut("abcd efgh ij", 9), Some(9));
    }

    /// Asking for every token reads the whole text (no overflow); a huge text with nowhere to
    /// cut the head asked for is refused, one with places to cut is not, and a short one is
    /// tokenized whole.
    #[test]
    fn encode_head_bounds() {
        let tok = demo_tokenizer();
        let text = "Out of 1400 participants, 400 passed. ".repeat(40);
        assert_eq!(
            tok.encode_head(&text, usize::MAX).unwrap().ids,
            tok.encode(&text).unwrap().ids
        );
        let word = "a".repeat(MAX_UNCUT_BYTES + 1);
        let err = tok.encode_head(&word, 10).unwrap_err();
        assert!(matches!(err, Error::Input(_)), "{err}");
        assert!(
            err.to_string().contains("no whitespace after a word"),
            "{err}"
        );
        assert!(
            err.to_string().contains("than the 8 MiB tokenized"),
            "{err}"
        );
        // A word before the huge one does not help: its tokens are needed too. Nor does one
        // past the first head tried (its cut would leave the huge word uncut after it), nor a
        // spaced text around it (its heads would hold it).
        let after_a_word = format!("word {word}");
        assert!(tok.encode_head(&after_a_word, 10).is_err());
        // (130 bytes, 10 tokens: past the first head's cut at 72 bytes, and too few for it.)
        let late_cut = format!("{} {word}", "<|endoftext|>".repeat(10));
        let err = tok.encode_head(&late_cut, 10).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("in the {} bytes from byte 130", word.len() + 1)),
            "{err}"
        );
        // (1000 tokens before the word: enough for 50, not for 1100.)
        let spaced_around = format!("{}{word}{}", "w ".repeat(1000), " w".repeat(2000));
        assert!(tok.encode_head(&spaced_around, 1100).is_err());
        assert!(tok.encode_head(&spaced_around, 50).is_ok());
        let spaced = "word ".repeat(MAX_UNCUT_BYTES / 5 + 1);
        assert!((10..200).contains(&tok.encode_head(&spaced, 10).unwrap().ids.len()));
        let short = "a".repeat(1000);
        assert!(!tok.encode_head(&short, 10).unwrap().ids.is_empty());
    }

    #[test]
    fn a_long_text_is_tokenized_by_its_head() {
        let tok = demo_tokenizer();
        let text = "Out of 1400 participants, 400 (or 29%) passed the test. ".repeat(20_000);
        let head = tok.encode_head(&text, 100).unwrap();
        assert!((100..1000).contains(&head.ids.len()), "{}", head.ids.len());
        let full = tok.encode(&text[..4000]).unwrap();
        assert_eq!(head.ids[..], full.ids[..head.ids.len()]);
    }

    fn texts() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            "[a-zA-Z]{1,12}",
            "[0-9]{1,6}",
            Just(" ".to_string()),
            Just("  ".to_string()),
            Just("\n".to_string()),
            Just("\n\n ".to_string()),
            Just("\t".to_string()),
            "[.,;:!?()%$-]{1,3}",
            Just("caf\u{e9} \u{4e2d}\u{6587}".to_string()),
            Just("[Calculator(3 * 4) -> 12]".to_string()),
        ];
        prop::collection::vec(piece, 0..120).prop_map(|p| p.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// A head's tokens and spans are the whole text's first ones, for any head size.
        #[test]
        fn head_tokens_are_the_texts(
            text in texts(),
            n in 0usize..40,
            first_bytes in 1usize..200,
        ) {
            for tok in [demo_tokenizer(), gptj_tokenizer()] {
                let full = tok.encode(&text).unwrap();
                let (head, _) = tok.encode_head_from(&text, n, first_bytes).unwrap();
                let len = head.ids.len();
                prop_assert!(len >= n.min(full.ids.len()));
                prop_assert_eq!(&head.ids[..], &full.ids[..len]);
                prop_assert_eq!(&head.spans[..], &full.spans[..len]);
            }
        }
    }

    /// special_tokens lists the added tokens marked special, and only those.
    #[test]
    fn special_tokens_are_the_added_tokens_marked_special() {
        let mut json: serde_json::Value =
            serde_json::from_str(&wordpiece_json(&[("aaaa", true), ("eg", false)])).unwrap();
        json["added_tokens"][1]["special"] = true.into();
        let path = Path::new("t/tokenizer.json");
        let tok = Tokenizer::from_bytes(json.to_string().as_bytes(), path).unwrap();
        assert_eq!(tok.special_tokens(), ["eg"]);
        assert_eq!(gptj_tokenizer().special_tokens(), ["<|endoftext|>"]);
    }

    /// An id equal to vocab_size is outside the vocabulary (its ids run to vocab_size - 1).
    #[test]
    fn an_id_of_vocab_size_is_outside_the_vocabulary() {
        assert!(check_vocab(&[0, 9, 3], 10).is_ok());
        let err = check_vocab(&[3, 10, 11], 10).unwrap_err();
        assert!(
            err.contains("token id 10 is outside the vocabulary (vocab_size 10)"),
            "{err}"
        );
    }

    /// id_count is one past the largest id, added tokens included (the fixture's ids run from 0
    /// to 499, <|endoftext|>).
    #[test]
    fn id_count_is_one_past_the_largest_id() {
        let tok = gptj_tokenizer();
        assert_eq!(tok.ids().last(), Some(&499));
        assert_eq!(tok.id_count(), 500);
    }

    /// The hash is of the bytes as read, a byte order mark included: it identifies the file,
    /// while the tokens are those of the text after the mark.
    #[test]
    fn source_hash_is_of_the_bytes_read_byte_order_mark_included() {
        let fixture =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-gptj/tokenizer.json");
        let plain = std::fs::read(fixture).unwrap();
        let with_bom = [&b"\xEF\xBB\xBF"[..], &plain].concat();
        let path = Path::new("t/tokenizer.json");
        let a = Tokenizer::from_bytes(&plain, path).unwrap();
        let b = Tokenizer::from_bytes(&with_bom, path).unwrap();
        assert_eq!(a.source_xxh3(), xxhash_rust::xxh3::xxh3_64(&plain));
        assert_eq!(b.source_xxh3(), xxhash_rust::xxh3::xxh3_64(&with_bom));
        assert_ne!(a.source_xxh3(), b.source_xxh3());
        let text = "Out of 1400 participants, 400 passed.";
        assert_eq!(a.encode_ids(text).unwrap(), b.encode_ids(text).unwrap());
    }

    /// special_tokens is sorted by text, whatever the ids' order (the crate hands them over
    /// from a hash map).
    #[test]
    fn special_tokens_are_sorted_by_text() {
        let added = [
            ("zz", true),
            ("mm", true),
            ("aa", true),
            ("yy", true),
            ("bb", true),
        ];
        let mut json: serde_json::Value = serde_json::from_str(&wordpiece_json(&added)).unwrap();
        for k in 0..added.len() {
            json["added_tokens"][k]["special"] = true.into();
        }
        let path = Path::new("t/tokenizer.json");
        let tok = Tokenizer::from_bytes(json.to_string().as_bytes(), path).unwrap();
        assert_eq!(tok.special_tokens(), ["aa", "bb", "mm", "yy", "zz"]);
    }

    /// A tokenizer whose post-processor adds [CLS] and [SEP] (BERT's) encodes a text to its own
    /// tokens: `encode` adds no special tokens.
    #[test]
    fn encode_adds_no_special_tokens() {
        let mut json: serde_json::Value = serde_json::from_str(&wordpiece_json(&[])).unwrap();
        json["model"]["vocab"]["[CLS]"] = 5.into();
        json["model"]["vocab"]["[SEP]"] = 6.into();
        let special = |id: &str| serde_json::json!({"SpecialToken": {"id": id, "type_id": 0}});
        let seq = |id: &str| serde_json::json!({"Sequence": {"id": id, "type_id": 0}});
        json["post_processor"] = serde_json::json!({
            "type": "TemplateProcessing",
            "single": [special("[CLS]"), seq("A"), special("[SEP]")],
            "pair": [special("[CLS]"), seq("A"), special("[SEP]"), seq("B"), special("[SEP]")],
            "special_tokens": {
                "[CLS]": {"id": "[CLS]", "ids": [5], "tokens": ["[CLS]"]},
                "[SEP]": {"id": "[SEP]", "ids": [6], "tokens": ["[SEP]"]}
            }
        });
        let path = Path::new("t/tokenizer.json");
        let tok = Tokenizer::from_bytes(json.to_string().as_bytes(), path).unwrap();
        let enc = tok.encode("a b").unwrap();
        assert_eq!(enc.ids, [1, 2]);
        assert_eq!(enc.spans, [(0, 1), (2, 3)]);
    }

    /// vocab_size counts the added tokens (the fixture's 499 ids and <|endoftext|>).
    #[test]
    fn vocab_size_counts_added_tokens() {
        let tok = gptj_tokenizer();
        assert_eq!(tok.vocab_size(), 500);
        assert_eq!(tok.vocab_size(), tok.ids().len());
    }

    /// A text exactly as long as the first head tried is tokenized whole, and says so.
    #[test]
    fn a_text_as_long_as_the_first_head_is_encoded_whole() {
        let tok = demo_tokenizer();
        // (2 + 8) tokens x 8 bytes: the first head is the whole 80 bytes.
        let text = "a ".repeat(40);
        let (enc, whole) = tok.encode_head_whole(&text, 2).unwrap();
        assert!(whole);
        assert_eq!(enc.ids, tok.encode(&text).unwrap().ids);
    }

    /// A head cut past a stretch of more than MAX_UNCUT_BYTES with no place to cut is refused
    /// too, not only the whole text: here the head with enough tokens ends before the text does.
    #[test]
    fn a_head_cut_past_a_long_uncut_stretch_is_refused() {
        let tok = demo_tokenizer();
        let word = "a".repeat(MAX_UNCUT_BYTES + 1);
        // 1000 tokens before the word, too few for 1100; a tail of 2 MiB after it.
        let text = format!("{}{word}{}", "w ".repeat(1000), " w".repeat(1 << 20));
        let err = match tok.encode_head(&text, 1100) {
            Ok(enc) => panic!("{} tokens, not refused", enc.ids.len()),
            Err(e) => e,
        };
        assert!(matches!(err, Error::Input(_)), "{err}");
        assert!(
            err.to_string()
                .contains(&format!("in the {} bytes from byte 1999", word.len() + 1)),
            "{err}"
        );
    }

    /// Of two longest stretches, the first is reported (the error names where it starts), the
    /// text's last one included.
    #[test]
    fn longest_uncut_reports_the_first_of_equal_stretches() {
        assert_eq!(longest_uncut("abc de f"), (0, 3));
        assert_eq!(longest_uncut("abc de"), (0, 3));
    }

    /// Of several added tokens that normalize to nothing, the one of the lowest id is named
    /// (the crate hands them over from a hash map).
    #[test]
    fn of_several_empty_added_tokens_the_lowest_id_is_named() {
        let path = Path::new("t/tokenizer.json");
        let json = wordpiece_json(&[("\u{200b}", true), ("\u{200c}", true)]);
        let msg = match Tokenizer::from_bytes(json.as_bytes(), path) {
            Err(Error::Tokenizer { msg, .. }) => msg,
            other => panic!("{other:?}"),
        };
        assert!(
            msg.contains(r#"the added token "\u{200b}" is empty"#),
            "{msg}"
        );
    }

    /// An error shows a text's first 200 characters and its length, not a whole document.
    #[test]
    fn preview_shows_the_first_200_characters() {
        let short = "\u{e9}".repeat(200);
        assert_eq!(preview(&short), short);
        let long = "\u{e9}".repeat(201);
        assert_eq!(preview(&long), format!("{short}\u{2026} (402 bytes)"));
    }

    /// An offset at or past the last token's end says where the tokens end.
    #[test]
    fn an_offset_after_the_last_token_names_where_the_tokens_end() {
        let enc = Encoding {
            ids: vec![0, 1],
            spans: vec![(0, 1), (1, 3)],
        };
        for offset in [3, 5] {
            assert_eq!(
                enc.locate_byte(offset),
                Err(crate::error::InvalidCandidate::NoTokenAfter { offset, end: 3 })
            );
        }
    }

    /// decode writes special tokens out (a completion that ends in <|endoftext|> shows it).
    #[test]
    fn decode_keeps_special_tokens() {
        let tok = gptj_tokenizer();
        let eot = tok.token_id("<|endoftext|>").unwrap();
        let ids = [tok.encode_ids("a b").unwrap(), vec![eot]].concat();
        assert_eq!(tok.decode(&ids).unwrap(), "a b<|endoftext|>");
    }
}
