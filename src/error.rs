//! One error type for the library. Every variant names what it is about (a file, a tensor, an input
//! line) so that a user can act on the message without a debugger.

use std::path::PathBuf;

use crate::score::candidate::InvalidCandidate;

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
}
