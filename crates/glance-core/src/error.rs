//! The one error type of glance's libraries. Every variant says what a user can act on: which file,
//! which tensor, which parameter.
//!
//! Each message is self-contained: a variant that wraps an underlying error (I/O, JSON, tensor op)
//! prints it inline and does not also expose it as [`std::error::Error::source`], so a reporter
//! that walks the source chain (`anyhow`'s `{:#}`) prints every cause exactly once.

use std::path::PathBuf;

/// Errors returned by glance's libraries. The binary wraps them with `anyhow` context.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{}: {cause}", path.display())]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// A JSON file did not parse into what it must describe.
    #[error("{}: invalid JSON: {cause}", path.display())]
    Json {
        path: PathBuf,
        cause: serde_json::Error,
    },
    /// A file is larger than glance reads for its kind (a guard against `/dev/zero`, mislabelled
    /// multi-gigabyte files and the like).
    #[error("{}: larger than the {} limit for {what}", path.display(), human_bytes(*limit))]
    TooLarge {
        path: PathBuf,
        /// What the file should have been (`"an image"`, `"a JSON file"`).
        what: String,
        /// The limit in bytes.
        limit: u64,
    },
    /// A model directory lacks a file it needs.
    #[error("{}: missing {what}", dir.display())]
    MissingFile { dir: PathBuf, what: String },
    /// A configuration value glance does not (yet) support, or one that contradicts another.
    #[error("unsupported configuration: {0}")]
    Config(String),
    /// A weight the architecture needs is not in the checkpoint.
    #[error("missing tensor `{name}` in the checkpoint")]
    MissingTensor { name: String },
    /// A weight has a different shape from what the configuration implies.
    #[error("tensor `{name}` has shape {found:?} but the configuration implies {expected:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    /// A safetensors file is corrupt, truncated, or holds a tensor glance cannot use.
    #[error("{}: not a valid safetensors file: {reason}", path.display())]
    Safetensors { path: PathBuf, reason: String },
    /// An image could not be decoded or is unusable (zero-sized, too large).
    #[error("image: {0}")]
    Image(String),
    /// Tokenizer loading, encoding or decoding failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template failed to load or render.
    #[error("chat template: {0}")]
    Template(String),
    /// The prompt (with its image tokens) does not fit the model's context.
    #[error("prompt is {len} tokens long but the model's context holds {max}")]
    PromptTooLong { len: usize, max: usize },
    /// A request parameter is out of its valid range.
    #[error("invalid parameter: {0}")]
    InvalidParam(String),
    /// The prompt and the images do not agree (e.g. an `<image>` placeholder without an image).
    #[error("input: {0}")]
    Input(String),
    /// The model computed NaN or infinite values where a decision needs finite ones (e.g. the
    /// logits a token is sampled from): usually NaN / infinite weights in the checkpoint.
    #[error("non-finite values: {0}")]
    NonFinite(String),
    /// An error from the tensor library.
    #[error("tensor op: {0}")]
    Candle(candle_core::Error),
}

impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Self {
        Error::Candle(e)
    }
}

/// `Result` with glance's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An [`Error::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, cause: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            cause,
        }
    }

    /// An [`Error::Json`] for `path`.
    pub fn json(path: impl Into<PathBuf>, cause: serde_json::Error) -> Self {
        Error::Json {
            path: path.into(),
            cause,
        }
    }
}

/// `n` bytes as `"16 MiB"` (whole MiB or KiB when exact, bytes otherwise).
fn human_bytes(n: u64) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn causes_print_once() {
        let io = Error::io("/x/config.json", std::io::Error::other("disk on fire"));
        assert_eq!(io.to_string(), "/x/config.json: disk on fire");
        assert!(io.source().is_none(), "the cause is in the message already");
        let bad = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let json = Error::json("/x/config.json", bad);
        assert!(json.to_string().contains("EOF"), "{json}");
        assert!(json.source().is_none());
        let candle = Error::from(candle_core::Error::Msg("boom".into()));
        assert_eq!(candle.to_string(), "tensor op: boom");
        assert!(candle.source().is_none());
    }

    #[test]
    fn too_large_names_file_and_limit() {
        let e = Error::TooLarge {
            path: "/dev/zero".into(),
            what: "an image".into(),
            limit: 128 << 20,
        };
        assert_eq!(
            e.to_string(),
            "/dev/zero: larger than the 128 MiB limit for an image"
        );
    }
}
