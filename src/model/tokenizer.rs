//! tokenizer.json through the `tokenizers` crate, with the byte spans that map a text position to a
//! token boundary.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

/// A tokenized text: ids and, per id, the byte range of the text it covers.
#[derive(Debug, Clone)]
pub struct Encoding {
    pub ids: Vec<u32>,
    pub spans: Vec<(usize, usize)>,
}

impl Tokenizer {
    pub fn from_file(path: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| Error::Tokenizer {
            path: path.to_owned(),
            msg: e.to_string(),
        })?;
        Ok(Tokenizer {
            inner,
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tokenizes `text` as is: no special tokens added.
    pub fn encode(&self, text: &str) -> Result<Encoding> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| Error::Tokenizer {
                path: self.path.clone(),
                msg: format!("cannot encode {text:?}: {e}"),
            })?;
        Ok(Encoding {
            ids: enc.get_ids().to_vec(),
            spans: enc.get_offsets().to_vec(),
        })
    }

    pub fn encode_ids(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.encode(text)?.ids)
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(|e| Error::Tokenizer {
            path: self.path.clone(),
            msg: format!("cannot decode: {e}"),
        })
    }

    /// The id of a string that is exactly one token, if it is one.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

impl Encoding {
    /// Index of the token that starts at byte `offset`. Byte-level BPE tokens carry their leading
    /// space (" 29"); a tokenizer that trims offsets reports " 29" as starting after the space, so
    /// the end of the previous token counts as a boundary too.
    pub fn token_at_byte(&self, offset: usize) -> std::result::Result<usize, String> {
        for (k, &(start, end)) in self.spans.iter().enumerate() {
            if start == offset || (k > 0 && self.spans[k - 1].1 == offset && offset < end) {
                return Ok(k);
            }
            if start < offset && offset < end {
                return Err(format!(
                    "byte offset {offset} falls inside token {k} (bytes {start}..{end}); \
                     a call must go on a token boundary"
                ));
            }
        }
        Err(format!(
            "byte offset {offset} has no token after it (the text's tokens end at byte {})",
            self.spans.last().map_or(0, |s| s.1)
        ))
    }
}
