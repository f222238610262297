//! The engine of glance: the one way to ask a model something.
//!
//! [`Engine::load`] reads a Hugging Face LLaVA directory and owns everything a request needs —
//! the model, its processors, a thread pool, an image-encoding cache and a prompt-prefix cache.
//! [`Engine::generate`] answers a [`Request`] (OpenAI-style messages with images, sampling, stop
//! strings, an optional pruning spec, a decoding strategy) and streams the answer through a
//! callback that can cancel; the [`Response`] carries the text, token ids, finish reason, usage,
//! timings and the strategy's statistics.
//!
//! The request path: render and tokenise → encode the images (cached by content) → build the
//! prompt plan (rows embedded once) → prune it (a transformation of the plan, glance-prune) →
//! prefill (prefix cache) → the [`glance_decode::DecodeStrategy`] → stop strings. `glance run`,
//! `logits`, `eval`, `demo`, the benchmarks, the training validation and the server all go
//! through it. [`eval`] is the world evaluation runner; [`messages`] parses OpenAI chat messages.

mod cache;
mod engine;
pub mod eval;
pub mod messages;
mod options;
mod request;

pub use cache::ImageKey;
pub use engine::scheduler::{Prepared, Sequence, SharedPrefill};
pub use engine::{CacheStats, Engine, Model, ModelConfig, Processor, TextRef};
pub use options::{
    cores, max_threads, resolve_threads, thread_pool, EngineOptions, TwinShape, WeightFormat,
    DEFAULT_MAX_IMAGES, MAX_IMAGES_LIMIT,
};
pub use request::{
    CacheUse, Event, FinishReason, Flow, ImageInput, KeptPatches, Message, Part, Prompt, Request,
    Response, Role, Timings, Usage, MAX_STOP_BYTES, MAX_STOP_STRINGS,
};

pub use glance_decode::{
    DecodeSpec, DecodeStats, DiffusionMode, DiffusionOptions, DiffusionSettings, DraftKind,
    OptionNames, OutputFormat, TokenLogprob, TreeSettings,
};
pub use glance_prune::{Budget, Policy, PruneSpec, TileBudget};
