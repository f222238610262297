//! The error type of glance-train.

use std::path::PathBuf;

/// Errors of the training library. The CLI wraps them with `anyhow` context.
///
/// Wrapped errors are printed inline and not exposed as `source()` (as in `glance_core::Error`),
/// so a reporter walking the chain (`anyhow`'s `{:#}`) prints each cause once.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A model-side error (config, weights, tokenizer, pre-processing).
    #[error(transparent)]
    Model(#[from] glance_core::Error),
    /// A tensor operation failed.
    #[error("tensor op: {0}")]
    Candle(candle_core::Error),
    /// The world generator refused a request.
    #[error("world: {0}")]
    World(glance_world::WorldError),
    /// A file could not be read or written.
    #[error("{}: {cause}", path.display())]
    Io {
        path: PathBuf,
        cause: std::io::Error,
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
    Json(serde_json::Error),
}

impl From<candle_core::Error> for TrainError {
    fn from(e: candle_core::Error) -> Self {
        TrainError::Candle(e)
    }
}

impl From<glance_world::WorldError> for TrainError {
    fn from(e: glance_world::WorldError) -> Self {
        TrainError::World(e)
    }
}

impl From<serde_json::Error> for TrainError {
    fn from(e: serde_json::Error) -> Self {
        TrainError::Json(e)
    }
}

/// `Result` with [`TrainError`].
pub type Result<T> = std::result::Result<T, TrainError>;

impl TrainError {
    /// A [`TrainError::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, cause: std::io::Error) -> Self {
        TrainError::Io {
            path: path.into(),
            cause,
        }
    }
}
