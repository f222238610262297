//! Decoding strategies. A strategy drives a [`glance_nn::CausalLm`] (rows, positions, mask, cache)
//! and owns sampling; it never sees images, tokenizers or requests.
//!
//! * [`sampler`]: greedy and seeded temperature / top-k / top-p sampling;
//! * [`autoregressive`]: one token per forward pass, the reference every faster strategy must
//!   reproduce token for token under greedy decoding;
//! * [`stop`]: stop-string matching over streamed text.

pub mod autoregressive;
pub mod sampler;
pub mod stop;

pub use autoregressive::{
    check_prompt, decode, generate, prefill, FinishReason, GenerateConfig, Generation, Prefilled,
};
pub use sampler::Sampler;
pub use stop::StopStrings;
