//! Shared types of glance: the typed error every library returns, token ids and sampling parameters.
//!
//! This crate sits at the bottom of the workspace: everything depends on it, it depends on nothing
//! of glance.

mod error;
pub mod io;
pub mod rng;
mod sampling;

pub use error::{Error, Result};
pub use rng::Rng;
pub use sampling::{SamplingParams, MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS, MIN_TEMPERATURE};

/// A token id in a model's vocabulary.
pub type TokenId = u32;
