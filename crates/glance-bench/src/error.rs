//! The benchmarks' error type. Like [`glance_core::Error`], each message is self-contained: a
//! variant that wraps another error prints it inline and does not expose it as
//! [`std::error::Error::source`], so `anyhow`'s `{:#}` prints every cause once.

/// Errors of a benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Loading, preparing or running a model (every glance library reports this one type).
    #[error(transparent)]
    Glance(#[from] glance_core::Error),
    /// The synthetic world (an image index past the split's end).
    #[error(transparent)]
    World(#[from] glance_world::WorldError),
    /// A tensor operation of a measurement.
    #[error(transparent)]
    Tensor(#[from] candle_core::Error),
    /// The server of a serving benchmark.
    #[error(transparent)]
    Serve(#[from] glance_serve::ServeError),
    /// A client's connection to the server, or a file.
    #[error("I/O: {0}")]
    Io(String),
    /// A server's answer that is not the JSON it should be.
    #[error("JSON: {0}")]
    Json(String),
    /// A thread pool for a measurement could not be built.
    #[error("thread pool: {0}")]
    Pool(String),
    /// An option out of its range, or options that contradict each other (the message names
    /// the flag of `glance bench`).
    #[error("{0}")]
    Options(String),
    /// A benchmark found what it checks broken (a lossless strategy's answers differ, a run
    /// stopped early).
    #[error("{0}")]
    Check(String),
    /// Another error, with what was being done.
    #[error("{context}: {cause}")]
    Context {
        context: String,
        cause: Box<BenchError>,
    },
}

impl From<rayon::ThreadPoolBuildError> for BenchError {
    fn from(e: rayon::ThreadPoolBuildError) -> Self {
        BenchError::Pool(e.to_string())
    }
}

impl From<std::io::Error> for BenchError {
    fn from(e: std::io::Error) -> Self {
        BenchError::Io(e.to_string())
    }
}

impl From<serde_json::Error> for BenchError {
    fn from(e: serde_json::Error) -> Self {
        BenchError::Json(e.to_string())
    }
}

/// A benchmark's result.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;

/// Says what was being done when an error happened.
pub trait Context<T> {
    fn context(self, context: impl Into<String>) -> Result<T>;
    fn with_context(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<BenchError>> Context<T> for std::result::Result<T, E> {
    fn context(self, context: impl Into<String>) -> Result<T> {
        self.map_err(|e| BenchError::Context {
            context: context.into(),
            cause: Box::new(e.into()),
        })
    }

    fn with_context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| BenchError::Context {
            context: context(),
            cause: Box::new(e.into()),
        })
    }
}

/// Refuses with [`BenchError::Options`].
macro_rules! bail_options {
    ($($arg:tt)*) => {
        return Err($crate::BenchError::Options(format!($($arg)*)))
    };
}
pub(crate) use bail_options;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_prints_each_cause_once() {
        let e: Result<()> = Err(BenchError::Options("--n must be at least 1".into()));
        let e = e.context("spec").unwrap_err();
        assert_eq!(e.to_string(), "spec: --n must be at least 1");
        assert!(std::error::Error::source(&e).is_none());
    }
}
