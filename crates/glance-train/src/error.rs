//! The error type of glance-train.

use std::path::PathBuf;

/// Errors of the training library. The CLI wraps them with `anyhow` context.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A model-side error (config, weights, tokenizer, pre-processing).
    #[error(transparent)]
    Model(#[from] glance_core::Error),
    /// A tensor operation failed.
    #[error("tensor op: {0}")]
    Candle(#[from] candle_core::Error),
    /// The world generator refused a request.
    #[error("world: {0}")]
    World(#[from] glance_world::WorldError),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint is missing, corrupt, or belongs to another configuration.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint { path: PathBuf, reason: String },
    /// A training setting is out of range or contradicts another.
    #[error("invalid training setting: {0}")]
    Config(String),
    /// The loss became NaN or infinite.
    #[error("loss is not finite ({loss}) at stage {stage}, step {step}")]
    NonFiniteLoss { stage: String, step: u64, loss: f32 },
    /// JSON (de)serialisation of training state failed.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// `Result` with [`TrainError`].
pub type Result<T> = std::result::Result<T, TrainError>;

impl TrainError {
    /// A [`TrainError::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        TrainError::Io {
            path: path.into(),
            source,
        }
    }
}
