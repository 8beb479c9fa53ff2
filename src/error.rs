//! One error type for the library. Every variant names what it is about (a file, a tensor, an input
//! line) so that a user can act on the message without a debugger.

use std::path::PathBuf;

/// An I/O error placed by `Error::context`: shown as "{at}: {error}", with the OS's error as its
/// `source()`, which `std::io::Error::source` hands on.
#[derive(Debug)]
struct Placed {
    at: String,
    error: std::io::Error,
}

impl std::fmt::Display for Placed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.at, self.error)
    }
}

impl std::error::Error for Placed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// "at: " for a placed candidate error, nothing for one that is not.
fn at_prefix(at: &Option<String>) -> String {
    at.as_ref().map(|at| format!("{at}: ")).unwrap_or_default()
}

/// `std::result::Result` with the crate's `Error`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every error of the library. `is_input` tells a bad request (`Input`, `Candidate`) from a
/// problem of the files, the model or the backend. Non-exhaustive: a `match` needs a `_` arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The OS error is part of the message and deliberately not a `source()`: reporters that
    /// print the whole chain (anyhow's `{:#}`) would show it twice.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file or folder the operation was on, as the caller gave it; a stream is named in
        /// angle brackets instead (`<output>`, `<input line 3>`).
        path: PathBuf,
        /// What the OS reported.
        error: std::io::Error,
    },

    /// config.json is unreadable or describes a model this engine cannot run.
    #[error("{}: {msg}", path.display())]
    Config {
        /// The config.json; "(in memory)" for a config checked with weights built in memory.
        path: PathBuf,
        /// What is wrong, naming the field (`GptjConfig::validate`'s message, or the parser's).
        msg: String,
    },

    /// A checkpoint file is corrupt, truncated or not what it claims to be.
    #[error("{}: {msg}", path.display())]
    Checkpoint {
        /// The file or folder at fault: a weights file or shard index being read, or what
        /// `checkpoint::convert` was writing to or copying from.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },

    /// One tensor of a checkpoint is missing, unexpected, or has the wrong shape or dtype.
    #[error("{}: tensor `{tensor}`: {msg}", path.display())]
    Tensor {
        /// The file holding the tensor; the checkpoint folder when no file holds it (missing),
        /// "(in memory)" for weights built in memory (`GptjWeights::check`).
        path: PathBuf,
        /// The tensor's Hugging Face name (`transformer.h.0.attn.q_proj.weight`).
        tensor: String,
        /// What is wrong with it (missing, unexpected, shape, dtype, a value that is not finite).
        msg: String,
    },

    /// tokenizer.json cannot be used (not JSON, not a Hugging Face tokenizer, not a file), or
    /// the tokenizer failed on a text or on ids.
    #[error("tokenizer {}: {msg}", path.display())]
    Tokenizer {
        /// The tokenizer.json (for `Tokenizer::from_bytes`, the path its caller named it by).
        path: PathBuf,
        /// What went wrong.
        msg: String,
    },

    /// A scoring request that cannot be scored (position off a token boundary, ids outside the
    /// vocabulary, a sequence longer than n_positions, ...).
    #[error("{0}")]
    Input(String),

    /// One candidate of a batch cannot be scored or tokenized; `index` is its place in the
    /// batch, so a caller can drop it and score the rest (or run `score::validate` on each
    /// first), and `reason` says why, as a value to match on. Like `Input`, it is about the
    /// request, not the engine.
    #[error("{}candidate {index}: {reason}", at_prefix(at))]
    #[non_exhaustive]
    Candidate {
        /// 0-based place of the candidate in the batch given to the call.
        index: usize,
        /// Why it cannot be scored.
        reason: InvalidCandidate,
        /// Where the batch was, when a caller placed the error (`Error::context`): the input
        /// lines being scored, say.
        at: Option<String>,
    },

    /// A backend could not run (no GPU, kernels not built, a lost device, ...).
    #[error("{0}")]
    Backend(String),

    /// The device had no memory for an allocation (`CUDA_ERROR_OUT_OF_MEMORY`): unlike the rest
    /// of `Backend`, the engine is intact, and a smaller batch or memory budget
    /// (`scorer_with_memory_budget`) may fit where this did not.
    #[error("{0}")]
    OutOfMemory(String),
}

impl Error {
    /// An OS error on `path`.
    pub fn io(path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            error,
        }
    }

    /// A request that cannot be served (`Error::Input`).
    pub fn input(msg: impl Into<String>) -> Self {
        Error::Input(msg.into())
    }

    /// Candidate `index` of a batch cannot be scored, for `reason` (a scorer's own reason in
    /// words becomes `InvalidCandidate::Other`).
    pub fn candidate(index: usize, reason: impl Into<InvalidCandidate>) -> Self {
        Error::Candidate {
            index,
            reason: reason.into(),
            at: None,
        }
    }

    /// The same error with `at` (a corpus line, `corpus.jsonl:48213`) before its message, for
    /// an error raised deep in a run that only its caller can place; the variant, and so
    /// `is_input`, is kept. An `Io` error keeps its kind, and the OS's error stays reachable
    /// as its `source()` (`raw_os_error` included).
    pub fn context(self, at: impl std::fmt::Display) -> Self {
        let placed = |msg: String| format!("{at}: {msg}");
        match self {
            Error::Io { path, error } => Error::Io {
                path,
                error: std::io::Error::new(
                    error.kind(),
                    Placed {
                        at: at.to_string(),
                        error,
                    },
                ),
            },
            Error::Config { path, msg } => Error::Config {
                path,
                msg: placed(msg),
            },
            Error::Checkpoint { path, msg } => Error::Checkpoint {
                path,
                msg: placed(msg),
            },
            Error::Tensor { path, tensor, msg } => Error::Tensor {
                path,
                tensor,
                msg: placed(msg),
            },
            Error::Tokenizer { path, msg } => Error::Tokenizer {
                path,
                msg: placed(msg),
            },
            Error::Input(msg) => Error::Input(placed(msg)),
            Error::Candidate {
                index,
                reason,
                at: inner,
            } => Error::Candidate {
                index,
                reason,
                at: Some(match inner {
                    Some(inner) => placed(inner),
                    None => at.to_string(),
                }),
            },
            Error::Backend(msg) => Error::Backend(placed(msg)),
            Error::OutOfMemory(msg) => Error::OutOfMemory(placed(msg)),
        }
    }

    /// Whether the error is about the request (`Input` or `Candidate`) rather than the files,
    /// the model or the backend: the annotate driver rejects the document and goes on.
    pub fn is_input(&self) -> bool {
        matches!(self, Error::Input(_) | Error::Candidate { .. })
    }
}

/// Maps a CUDA driver error to the crate's error, naming what was being done:
/// `.map_err(driver_err("launching gelu"))`.
#[cfg(feature = "cuda")]
pub(crate) fn driver_err(what: &str) -> impl FnOnce(cudarc::driver::DriverError) -> Error + '_ {
    move |e| {
        let text = e
            .error_string()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let msg = format!("cuda: {what}: {e:?} {text}");
        match e.0 {
            cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Error::OutOfMemory(msg),
            _ => Error::Backend(msg),
        }
    }
}

/// Why one candidate cannot be scored: what [`score::validate`] finds, what tokenizing a
/// text-level candidate finds, or a scorer's own limit. It is [`Error::Candidate`]'s `reason`, so
/// that a caller can act on the cause (cut a text that is too long, drop a call with an unknown
/// token) without reading the message. Non-exhaustive: a `match` needs a `_` arm. It lives here,
/// beside `Error`, so that the model's tokenizer and the scorers name it without depending on
/// each other.
///
/// [`score::validate`]: crate::score::validate
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidCandidate {
    /// `text_ids` is empty.
    #[error("text is empty")]
    EmptyText,

    /// `position` is 0: L_none would predict x_1 from nothing.
    #[error(
        "position 0 cannot be scored: the no-call variant has no context to predict the first \
         text token from (positions start at 1)"
    )]
    PositionZero,

    /// `position` is past the text's last token.
    #[error("{}", out_of_range(*position, *text_len))]
    PositionOutOfRange {
        /// The candidate's position.
        position: usize,
        /// Tokens in its text (at least 1; an empty text is `EmptyText`).
        text_len: usize,
    },

    /// The candidate's own loss weights are unusable (`weights::check`'s reason).
    #[error("{0}")]
    Weights(String),

    /// A token id is not below the model's vocab_size.
    #[error("{field}[{index}] = {id} is outside the vocabulary (vocab_size {vocab_size})")]
    OutOfVocabulary {
        /// `text_ids`, `call_ids` or `call_result_ids`.
        field: &'static str,
        /// The id's place in that field.
        index: usize,
        /// The id.
        id: u32,
        /// The model's vocab_size.
        vocab_size: usize,
    },

    /// No positive weight falls on a token of the text: every loss would be 0 with nothing
    /// measured, and a delta of 0 would keep the call at any tau_f <= 0.
    #[error(
        "no positive weight falls on a text token: {tokens_after} token(s) follow from \
         position {position}, and the first positive weight is w_{first_positive}; nothing \
         would be measured"
    )]
    NothingWeighted {
        /// The candidate's position.
        position: usize,
        /// Text tokens from the position on (x_i .. x_n).
        tokens_after: usize,
        /// t of the first positive weight w_t (the weights' length when there is none).
        first_positive: usize,
    },

    /// The longest variant the engine runs does not fit the model's n_positions. (A text-level
    /// candidate found too long before its text is tokenized whole is `TextTooLong`.)
    #[error(
        "sequence of {tokens} tokens (call + text up to the last weighted token) is longer \
         than n_positions ({n_positions})"
    )]
    TooLong {
        /// Tokens of the longest variant: the longer call, and the text up to the last
        /// weighted token.
        tokens: usize,
        /// The model's n_positions.
        n_positions: usize,
    },

    /// `call_result_ids` is empty: e(c, r) would insert nothing, so L_call_result would be
    /// L_none, and a delta of 0 would keep a call that is not there at any tau_f <= 0. (An empty
    /// `call_ids` is allowed: L_call is then L_none, as the paper's min(L_none, L_call) allows.)
    #[error(
        "call_result_ids is empty: the call with its result would insert no token, so there is \
         no call to measure"
    )]
    EmptyCallResult,

    /// A text-level candidate that cannot fit the model, found before its text is tokenized
    /// whole (so without an exact length, which `TooLong` has): its call alone is longer than
    /// n_positions, or its position or window lies past the first n_positions + 1 tokens of the
    /// text.
    #[error("{detail}")]
    TextTooLong {
        /// The model's n_positions.
        n_positions: usize,
        /// What reads too far.
        detail: String,
    },

    /// A text-level candidate's byte offset past the end of its text.
    #[error("position {offset} is past the end of the {len}-byte text")]
    PastText {
        /// The candidate's byte offset.
        offset: usize,
        /// The text's length in bytes.
        len: usize,
    },

    /// A text-level candidate's byte offset inside a character of its text.
    #[error("position {offset} is not a character boundary of the text ({len} bytes)")]
    NotCharBoundary {
        /// The candidate's byte offset.
        offset: usize,
        /// The text's length in bytes.
        len: usize,
    },

    /// A text-level candidate's byte offset inside a token: a call goes between tokens. `start`
    /// and `end` are the token's bytes, the two offsets nearby that are boundaries.
    #[error(
        "byte offset {offset} falls inside token {token} (bytes {start}..{end}); a call must go \
         on a token boundary"
    )]
    InsideToken {
        /// The candidate's byte offset.
        offset: usize,
        /// The token's index in the text's encoding.
        token: usize,
        /// The token's first byte.
        start: usize,
        /// The byte after the token.
        end: usize,
    },

    /// A text-level candidate's byte offset at the text's first token: the no-call variant would
    /// have no context to predict it from (the token-level `PositionZero`).
    #[error(
        "byte offset {offset} is at the text's first token: a call there cannot be scored (the \
         no-call variant has no context to predict that token from)"
    )]
    AtFirstToken {
        /// The candidate's byte offset.
        offset: usize,
    },

    /// A text-level candidate's byte offset after the text's last token (trailing text the
    /// tokenizer drops, say): no x_i follows it.
    #[error("byte offset {offset} has no token after it (the text's tokens end at byte {end})")]
    NoTokenAfter {
        /// The candidate's byte offset.
        offset: usize,
        /// The byte after the text's last token.
        end: usize,
    },

    /// A text-level candidate's call that cannot be written as e(c) / e(c, r) and read back as
    /// the same call (`check_call`: a tool name that is not a name, an input with an arrow or
    /// unbalanced parentheses, a result that is empty or holds a bracket, ...).
    #[error("{0}")]
    Call(String),

    /// A text-level candidate that cannot be made into tokens for another reason (a text that
    /// cannot be cut for a head: `Tokenizer::encode_head`).
    #[error("{0}")]
    Text(String),

    /// A limit of the scorer itself, beyond `validate` (a scorer written outside this crate, or
    /// the naive baseline, which runs the whole text).
    #[error("{0}")]
    Other(String),
}

/// `PositionOutOfRange`'s message: the range that can be scored, or that none can (a text of
/// one token has no x_i with a token before it).
fn out_of_range(position: usize, text_len: usize) -> String {
    if text_len < 2 {
        format!(
            "position {position} is out of range: the text has {text_len} token, so no position \
             can be scored (a call goes before a token that has one before it)"
        )
    } else {
        format!(
            "position {position} is out of range: the text has {text_len} tokens, so the \
             scorable positions are 1 to {}",
            text_len - 1
        )
    }
}

/// A scorer's own reason, in words (`InvalidCandidate::Other`): `Error::candidate(k, "...")`.
impl From<String> for InvalidCandidate {
    fn from(why: String) -> Self {
        InvalidCandidate::Other(why)
    }
}

/// As `From<String>`.
impl From<&str> for InvalidCandidate {
    fn from(why: &str) -> Self {
        InvalidCandidate::Other(why.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `context` puts its place before the message and keeps the variant, so `is_input` and a
    /// caller's `match` still see what the error was.
    #[test]
    fn context_keeps_the_variant() {
        let at = "annotating c.jsonl:7";
        let backend = Error::Backend("cuda: out of memory".into()).context(at);
        assert!(matches!(&backend, Error::Backend(_)) && !backend.is_input());
        assert_eq!(
            backend.to_string(),
            "annotating c.jsonl:7: cuda: out of memory"
        );
        let input = Error::input("bad").context(at);
        assert!(input.is_input());
        // A candidate's reason stays a value to match on; each place goes before the last.
        let reason = InvalidCandidate::TooLong {
            tokens: 9,
            n_positions: 8,
        };
        let candidate = Error::candidate(3, reason.clone())
            .context("scoring input lines 5-9")
            .context(at);
        assert!(candidate.is_input());
        assert!(
            matches!(&candidate, Error::Candidate { index: 3, reason: r, .. } if *r == reason),
            "{candidate:?}"
        );
        assert_eq!(
            candidate.to_string(),
            format!("annotating c.jsonl:7: scoring input lines 5-9: candidate 3: {reason}")
        );
        let io = Error::io("idx/meta.json", std::io::ErrorKind::NotFound.into()).context(at);
        let Error::Io { path, error } = &io else {
            panic!("{io:?}")
        };
        assert_eq!(
            (path.to_str(), error.kind()),
            (Some("idx/meta.json"), std::io::ErrorKind::NotFound)
        );
        assert!(
            io.to_string()
                .starts_with("idx/meta.json: annotating c.jsonl:7: "),
            "{io}"
        );
        // The OS's error is still there, its code included, and told once in the message.
        let os = Error::io("d/x", std::io::Error::from_raw_os_error(28)).context(at);
        let Error::Io { error, .. } = &os else {
            panic!("{os:?}")
        };
        let inner = std::error::Error::source(error)
            .and_then(|e| e.downcast_ref::<std::io::Error>())
            .expect("the OS's error as the source");
        assert_eq!(inner.raw_os_error(), Some(28));
        assert_eq!(error.kind(), std::io::ErrorKind::StorageFull);
        let text = os.to_string();
        assert_eq!(text.matches("(os error 28)").count(), 1, "{text}");
        let tok = Error::Tokenizer {
            path: "t.json".into(),
            msg: "cannot decode".into(),
        }
        .context(at);
        assert_eq!(
            tok.to_string(),
            "tokenizer t.json: annotating c.jsonl:7: cannot decode"
        );
    }

    /// The variants the test above does not place: each keeps its variant and path, and puts
    /// the place before the message (a tensor's name stays first), and out of memory stays
    /// out of memory (a caller retries it with a smaller batch).
    #[test]
    fn context_places_every_variant() {
        let at = "converting m";
        let config = Error::Config {
            path: "c/config.json".into(),
            msg: "n_head is 0".into(),
        };
        assert_eq!(
            config.context(at).to_string(),
            "c/config.json: converting m: n_head is 0"
        );
        let checkpoint = Error::Checkpoint {
            path: "c/model.bin".into(),
            msg: "truncated".into(),
        };
        assert_eq!(
            checkpoint.context(at).to_string(),
            "c/model.bin: converting m: truncated"
        );
        let tensor = Error::Tensor {
            path: "c/model.bin".into(),
            tensor: "transformer.wte.weight".into(),
            msg: "missing".into(),
        };
        assert_eq!(
            tensor.context(at).to_string(),
            "c/model.bin: tensor `transformer.wte.weight`: converting m: missing"
        );
        let oom = Error::OutOfMemory("cuda: out of memory".into()).context(at);
        assert!(
            matches!(&oom, Error::OutOfMemory(_)) && !oom.is_input(),
            "{oom:?}"
        );
        assert_eq!(oom.to_string(), "converting m: cuda: out of memory");
    }

    /// Only a request's errors are input errors: the files', the model's and the backend's
    /// (out of memory included) stop a run.
    #[test]
    fn only_input_and_candidate_errors_are_input() {
        assert!(Error::input("x").is_input() && Error::candidate(0, "x").is_input());
        for engine in [
            Error::io("f", std::io::ErrorKind::NotFound.into()),
            Error::Backend("lost".into()),
            Error::OutOfMemory("full".into()),
            Error::Checkpoint {
                path: "f".into(),
                msg: "x".into(),
            },
        ] {
            assert!(!engine.is_input(), "{engine:?}");
        }
    }

    /// A text of two tokens has one scorable position, 1; one of a token has none.
    #[test]
    fn out_of_range_names_the_scorable_positions() {
        let two = InvalidCandidate::PositionOutOfRange {
            position: 2,
            text_len: 2,
        };
        assert!(
            two.to_string()
                .ends_with("the text has 2 tokens, so the scorable positions are 1 to 1"),
            "{two}"
        );
        let one = InvalidCandidate::PositionOutOfRange {
            position: 1,
            text_len: 1,
        };
        assert!(
            one.to_string()
                .contains("1 token, so no position can be scored"),
            "{one}"
        );
    }
}
