//! The narrow interface between models and decoding strategies.

use crate::{AttnMask, KvCache};
use candle_core::{Device, Tensor};
use glance_core::Result;

/// A causal language model as a decoding strategy sees it: embed tokens, run rows at explicit
/// positions under a mask over a cache, turn hidden states into logits. It never samples and never
/// knows about requests.
pub trait CausalLm {
    fn hidden_size(&self) -> usize;
    fn vocab_size(&self) -> usize;
    /// Longest sequence (cache rows) the model supports.
    fn max_positions(&self) -> usize;
    fn num_layers(&self) -> usize;
    fn device(&self) -> &Device;

    /// `ids` → embeddings `(t, hidden)`.
    fn embed_tokens(&self, ids: &[u32]) -> Result<Tensor>;

    /// Runs rows `xs` `(t, hidden)` placed at `positions` (length `t`) after the rows already in
    /// `cache`, appends their keys / values to it, and returns the final-normed hidden states
    /// `(t, hidden)`. `mask` is relative to the new rows and materialised per layer (window,
    /// cached rows); tree rows go at `start + depth` ([`TreeMask::positions`]). Speculative
    /// rows are discarded with [`KvCache::mark`] / [`KvCache::rollback`] or
    /// [`KvCache::keep_speculative`].
    ///
    /// [`TreeMask::positions`]: crate::attention::TreeMask::positions
    fn forward(
        &self,
        xs: &Tensor,
        positions: &[u32],
        mask: &AttnMask,
        cache: &mut KvCache,
    ) -> Result<Tensor>;

    /// Hidden states `(t, hidden)` → logits `(t, vocab)`.
    fn logits(&self, hidden: &Tensor) -> Result<Tensor>;

    /// An empty cache for this model.
    fn new_cache(&self) -> KvCache {
        KvCache::new(self.num_layers())
    }
}
