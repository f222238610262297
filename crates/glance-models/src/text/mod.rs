//! Llama-family text decoders: Llama, Mistral and Qwen2 share one implementation and differ only in
//! configuration (biases, sliding window, tied embeddings, RoPE parameters).

mod config;
mod decoder;

pub(crate) use config::{positive_below_one, size_in_range};
pub use config::{TextArch, TextConfig};
pub use decoder::TextModel;
pub(crate) use decoder::{batchable, layers_groups, Keys, Layer, Step};
