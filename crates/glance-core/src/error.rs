//! The one error type of glance's libraries. Every variant says what a user can act on: which file,
//! which tensor, which parameter.

use std::path::PathBuf;

/// Errors returned by glance's libraries. The binary wraps them with `anyhow` context.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A JSON file did not parse into what it must describe.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A model directory lacks a file it needs.
    #[error("{dir}: missing {what}")]
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
    /// A safetensors file is corrupt or truncated.
    #[error("{path}: not a valid safetensors file: {reason}")]
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
    /// An error from the tensor library.
    #[error("tensor op: {0}")]
    Candle(#[from] candle_core::Error),
}

/// `Result` with glance's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An [`Error::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
