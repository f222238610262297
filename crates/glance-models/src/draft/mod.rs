//! Speculative draft heads (EAGLE; ViSpec): one decoder layer beside the target that predicts the
//! target's next hidden state, sharing the target's embeddings and LM head.
//!
//! * [`DraftConfig`]: what a head directory's `config.json` holds — the layer's shape (the
//!   target's text config with one layer) and which vision parts are on;
//! * [`DraftHead`]: the head itself, behind [`glance_nn::DraftLm`] for the decoders, with the
//!   differentiable pieces training needs ([`DraftHead::step_after`]).
//!
//! The ViSpec parts (the ViSpec paper, "Accelerating Vision-Language Models with Vision-Aware
//! Speculative Decoding"; design notes in `docs/speculative.md`):
//!
//! * a **vision adaptor**: learnable queries cross-attend over an image's visual rows, and the
//!   resulting few tokens replace the image's rows in the draft's sequence, spread over the
//!   image's positions;
//! * a **global visual feature** (the mean of every visual row of the prompt) fused into every
//!   draft row, as concatenation plus a linear layer initialised to the identity (the published
//!   code's form of the paper's `LayerNorm(h + W_v·v)`): at initialisation it changes nothing.
//!
//! With both off the head is the text-only EAGLE baseline: image rows enter the draft like token
//! rows, their projected features in place of token embeddings.

mod config;
mod head;

pub use config::{DraftConfig, DRAFT_MODEL_TYPE};
pub use head::DraftHead;
