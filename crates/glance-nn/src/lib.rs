//! Layers shared by every glance model: linear, norms, activations, rotary embeddings, attention with
//! masks described relative to the new rows (causal, bidirectional block, tree, boolean) and
//! explicit positions, and a KV cache built for rollback (append, mark / rollback in O(layers),
//! keep an accepted speculative path in O(k × layers), fork, compact).
//!
//! Weight formats (bf16 / f16 kept as 16-bit values, q8 / q4 quantized per block of 32) and their
//! kernels live in [`quant`]; a [`Linear`] holds an f32 tensor or a packed matrix.
//!
//! Shapes: glance runs batch 1 at this level. Token rows are `(t, hidden)`; attention works on
//! `(1, heads, t, head_dim)`.
//!
//! **Train / infer switch.** candle's fused CPU kernels (`softmax_last_dim`, `rms_norm`,
//! `layer_norm`, `rope`) have no backward pass and fail silently in a training graph. Every layer
//! here takes a [`Mode`]; `Mode::Train` selects the composed, differentiable forms.

pub mod activation;
pub mod attend_rows;
pub mod attention;
pub mod attention_bf16;
pub mod fused;
pub mod kv_cache;
pub mod linear;
pub mod lm;
pub mod matvec;
pub mod norm;
pub mod peak;
pub mod quant;
pub mod rope;
mod row_softmax;
pub mod runtime;
pub mod weights;

pub use activation::Activation;
pub use attention::{attention, attention_batch_invariant, AttnMask, TreeMask, VisibleMask};
pub use attention_bf16::attention_full_bf16;
pub use kv_cache::{CacheMark, KvCache, LayerCache};
pub use linear::Linear;
pub use lm::{
    CausalLm, DraftContext, DraftKind, DraftLm, DraftLogits, DraftPrompt, DraftStart, RowGroup,
};
pub use norm::{LayerNorm, RmsNorm};
pub use quant::{WeightFormat, WeightLoad};
pub use rope::{RopeScaling, RotaryEmbedding};

/// Whether a layer is built for inference (fast fused kernels) or training (differentiable ops).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    #[default]
    Infer,
    Train,
}

/// Softmax over the last dimension, fused for inference and differentiable for training.
pub fn softmax_last_dim(
    xs: &candle_core::Tensor,
    mode: Mode,
) -> candle_core::Result<candle_core::Tensor> {
    match mode {
        Mode::Infer => fused::softmax_last_dim_fast(xs),
        Mode::Train => candle_nn::ops::softmax(xs, candle_core::D::Minus1),
    }
}
