//! Decoding strategies. A strategy drives a [`glance_nn::CausalLm`] (rows, positions, mask, cache)
//! and owns sampling; it never sees images, tokenizers or requests.
//!
//! * [`strategy`]: the [`DecodeStrategy`] seam every strategy implements, the [`DecodeSpec`] a
//!   request names, and the [`DecodeStats`] a strategy reports;
//! * [`grammar`]: constrained decoding (JSON schemas) as a mask the sampler applies;
//! * [`sampler`]: greedy and seeded temperature / top-k / top-p sampling — the one place sampling
//!   settings live;
//! * [`autoregressive`]: one token per forward pass, the reference every faster strategy must
//!   reproduce token for token under greedy decoding;
//! * [`speculative`]: draft-head speculative decoding (EAGLE, ViSpec), with fixed trees or rounds
//!   planned from measured costs;
//! * [`cost`]: the measured cost model (a pass over `k` rows, a draft step) plans read;
//! * [`diffusion`]: block-diffusion decoding of converted models (Fast-dVLM): threshold, linear
//!   and quadratic self-speculation;
//! * [`step`]: the per-request [`DecodeState`] a strategy starts, advanced one target pass at a
//!   time, and the shared pass that runs the rows of many requests at once;
//! * [`stop`]: stop-string matching over streamed text.

pub mod autoregressive;
pub mod cost;
pub mod diffusion;
pub mod grammar;
pub mod sampler;
pub mod speculative;
pub mod step;
pub mod stop;
pub mod strategy;

pub use autoregressive::{
    check_prompt, generate, prefill, prefill_mrope, Autoregressive, FinishReason, GenerateConfig,
    Generation, Prefilled, PrefilledImage,
};
pub use cost::{CostModel, DraftCost};
pub use diffusion::{
    BlockDiffusion, DiffusionMode, DiffusionOptions, DiffusionSettings, OptionNames,
};
pub use glance_nn::DraftKind;
pub use grammar::{Grammar, GrammarVocab, OutputFormat};
pub use sampler::{LogprobSink, Sampler, TokenLogprob};
pub use speculative::{Speculative, TreeSettings};
pub use step::{
    draft_alone, run_alone, shared_draft_pass, shared_pass, DecodeState, DraftOutput, DraftPass,
    Load, Pass, PassOutput,
};
pub use stop::StopStrings;
pub use strategy::{DecodeSpec, DecodeStats, DecodeStrategy, TokenSink};
