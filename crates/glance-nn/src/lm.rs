//! The narrow interface between models and decoding strategies.

use crate::{AttnMask, KvCache, Linear};
use candle_core::{Device, Tensor};
use glance_core::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

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

    /// [`CausalLm::forward`] with every row computed as a decode step computes a row alone
    /// (row-wise attention over its visible keys, canonical-order matrix products) at any
    /// number of rows: a row verified among many others (block-diffusion passes of `B (B + 1)`
    /// rows) gets bit for bit what one-token decoding gets. Models without such kernels run
    /// [`CausalLm::forward`].
    fn forward_batch_invariant(
        &self,
        xs: &Tensor,
        positions: &[u32],
        mask: &AttnMask,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        self.forward(xs, positions, mask, cache)
    }

    /// [`CausalLm::forward`] of prompt rows with three-part positions `(temporal, height,
    /// width)`: multimodal RoPE (M-RoPE, Qwen2-VL), where an image row turns at its place in the
    /// image grid. A row whose three parts are equal turns exactly as at that scalar position, so
    /// only prompts need this; generated rows go through [`CausalLm::forward`]. Models with 1-D
    /// positions accept only such rows.
    fn forward_mrope(
        &self,
        xs: &Tensor,
        positions: &[[u32; 3]],
        mask: &AttnMask,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        self.forward(xs, &equal_parts(positions)?, mask, cache)
    }

    /// Hidden states `(t, hidden)` → logits `(t, vocab)`.
    fn logits(&self, hidden: &Tensor) -> Result<Tensor>;

    /// An empty cache for this model.
    fn new_cache(&self) -> KvCache {
        KvCache::new(self.num_layers())
    }

    /// One forward pass over the rows of several requests: `xs` `(Σ rows, hidden)` holds each
    /// group's rows in turn, and each group runs at its own positions under its own mask over
    /// its own cache, as [`CausalLm::forward`] (or [`CausalLm::forward_batch_invariant`] for an
    /// `invariant` group) runs it alone. Returns the final hidden states `(Σ rows, hidden)`.
    ///
    /// Every row gets the bits it gets in its group's pass alone. Models with batched kernels
    /// read each weight once for all groups; this default runs the groups one by one.
    fn forward_groups(&self, xs: &Tensor, groups: &mut [RowGroup<'_>]) -> Result<Tensor> {
        forward_each(self, xs, groups)
    }

    /// The LM head restricted to tokens `ids`, in its format: `(hidden) → (ids.len())` logits,
    /// column `j` computed as [`CausalLm::logits`] computes token `ids[j]`'s (before masking).
    /// `None`: this model cannot hand its head out (a draft then reads the whole head).
    fn lm_head_rows(&self, ids: &[u32]) -> Result<Option<Linear>> {
        let _ = ids;
        Ok(None)
    }

    /// [`CausalLm::logits`] of rows gathered from several requests `(n, hidden)` → `(n, vocab)`;
    /// each row gets the bits [`CausalLm::logits`] gives it in its own pass.
    fn logits_rows(&self, hidden: &Tensor) -> Result<Tensor> {
        self.logits(hidden)
    }
}

/// The scalar positions of rows whose three M-RoPE parts are equal (they turn exactly as at that
/// position in 1-D RoPE); any other row is an error, for a model with 1-D positions only.
pub fn equal_parts(positions: &[[u32; 3]]) -> Result<Vec<u32>> {
    positions
        .iter()
        .map(|p| (p[0] == p[1] && p[1] == p[2]).then_some(p[0]))
        .collect::<Option<Vec<u32>>>()
        .ok_or_else(|| {
            glance_core::Error::InvalidParam(
                "rows with 3-D (M-RoPE) positions given to a model with 1-D positions".into(),
            )
        })
}

/// [`CausalLm::forward_groups`] one group at a time: each group's own pass.
pub fn forward_each<M: CausalLm + ?Sized>(
    model: &M,
    xs: &Tensor,
    groups: &mut [RowGroup<'_>],
) -> Result<Tensor> {
    each_group(xs, groups, |x, g| {
        if g.invariant {
            model.forward_batch_invariant(x, g.positions, g.mask, g.cache)
        } else {
            model.forward(x, g.positions, g.mask, g.cache)
        }
    })
}

/// Runs `pass` on each group's rows of `xs` `(Σ rows, hidden)` in turn and stacks the outputs
/// `(Σ rows, hidden)`.
fn each_group(
    xs: &Tensor,
    groups: &mut [RowGroup<'_>],
    mut pass: impl FnMut(&Tensor, &mut RowGroup<'_>) -> Result<Tensor>,
) -> Result<Tensor> {
    let mut outs = Vec::with_capacity(groups.len());
    let mut first = 0;
    for g in groups.iter_mut() {
        let x = xs.narrow(0, first, g.positions.len())?;
        first += g.positions.len();
        // (t, hidden)
        outs.push(pass(&x, g)?);
    }
    if outs.len() == 1 {
        return Ok(outs.pop().expect("one"));
    }
    Ok(Tensor::cat(&outs, 0)?)
}

/// [`DraftLm::forward_groups`] one group at a time: each group's own pass.
pub fn draft_forward_each<D: DraftLm + ?Sized>(
    draft: &D,
    xs: &Tensor,
    groups: &mut [RowGroup<'_>],
) -> Result<Tensor> {
    if groups.iter().any(|g| g.invariant) {
        return Err(Error::InvalidParam(
            "a draft head has no batch-invariant forward".into(),
        ));
    }
    let rows: usize = groups.iter().map(|g| g.positions.len()).sum();
    if rows != xs.dim(0)? {
        return Err(Error::Input(format!(
            "a shared draft pass of {} rows for groups of {rows} rows",
            xs.dim(0)?
        )));
    }
    each_group(xs, groups, |x, g| {
        draft.forward(x, g.positions, g.mask, g.cache)
    })
}

/// One request's rows in a shared forward pass ([`CausalLm::forward_groups`]).
pub struct RowGroup<'a> {
    /// Position of each of the group's rows (its row count).
    pub positions: &'a [u32],
    /// Relative to the group's new rows, as in [`CausalLm::forward`].
    pub mask: &'a AttnMask,
    pub cache: &'a mut KvCache,
    /// Rows computed as one-token decoding computes them alone
    /// ([`CausalLm::forward_batch_invariant`]).
    pub invariant: bool,
}

/// What a draft head reads of the target's prefill to build its own prompt rows.
pub struct DraftPrompt<'a> {
    /// The prompt rows as the target's first layer saw them `(t, hidden)`: token embeddings, and
    /// projected visual tokens (after any pruning) in the image rows.
    pub inputs: &'a Tensor,
    /// The target's final hidden state of every row `(t, hidden)`.
    pub hidden: &'a Tensor,
    /// Position id of every row (length `t`).
    pub positions: &'a [u32],
    /// Per image, the rows (indices into `inputs`) that hold its visual tokens, increasing.
    pub images: &'a [Vec<usize>],
}

/// The draft's rows for a prompt, ready for [`DraftLm::forward`], and the request's conditioning.
pub struct DraftStart {
    /// `(n, hidden)`
    pub rows: Tensor,
    /// Position of each row (length `n`).
    pub positions: Vec<u32>,
    pub context: DraftContext,
}

/// Per-request conditioning every draft step sees (e.g. ViSpec's global visual feature).
#[derive(Clone, Default)]
pub struct DraftContext {
    /// `(1, hidden)`, or `None` when the head does not inject one or the prompt has no image.
    pub global: Option<Tensor>,
}

/// Which kind of draft head: what its config holds decides it, and a speculative request names
/// the kind it wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DraftKind {
    /// A vision adaptor and / or a global visual feature (ViSpec).
    Vispec,
    /// Text only: neither of ViSpec's parts (the EAGLE-style baseline).
    Eagle,
}

impl DraftKind {
    pub const ALL: [DraftKind; 2] = [DraftKind::Vispec, DraftKind::Eagle];

    pub fn name(self) -> &'static str {
        match self {
            DraftKind::Vispec => "vispec",
            DraftKind::Eagle => "eagle",
        }
    }
}

impl fmt::Display for DraftKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DraftKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "vispec" => Ok(DraftKind::Vispec),
            "eagle" => Ok(DraftKind::Eagle),
            _ => Err(Error::InvalidParam(format!(
                "unknown draft kind `{s}` (available: vispec, eagle)"
            ))),
        }
    }
}

/// A speculative draft head as a decoding strategy sees it (EAGLE; ViSpec): it predicts the
/// target's next final hidden state from (the token's embedding, the previous hidden state), one
/// decoder layer over its own cache; the target's LM head turns its output into draft logits.
///
/// Draft row `r` reads token `x_r` and the hidden state `h_{r-1}` that predicted it, sits at
/// `x_r`'s position, and predicts `h_r` (hence `x_{r+1}`).
pub trait DraftLm: Send + Sync {
    /// `vispec` when the head has a vision adaptor or a global visual feature, else `eagle`.
    fn kind(&self) -> DraftKind;

    /// An empty cache for the head.
    fn new_cache(&self) -> KvCache;

    /// The draft rows for prompt rows `1..t` (each row with its predecessor's hidden state), with
    /// each image's rows replaced by the head's compressed image tokens if it has an adaptor.
    fn start(&self, prompt: &DraftPrompt<'_>) -> Result<DraftStart>;

    /// Rows [`DraftLm::start`] runs for a prompt of `rows` rows whose images hold `image_rows`
    /// rows each (what the start costs): the prompt's rows unless the head compresses images.
    fn start_rows(&self, rows: usize, image_rows: &[usize]) -> usize {
        let _ = image_rows;
        rows
    }

    /// Rows for tokens with embeddings `emb` `(n, hidden)` and predecessor hidden states `prev`
    /// `(n, hidden)`: `(n, hidden)`.
    fn fuse(&self, emb: &Tensor, prev: &Tensor, context: &DraftContext) -> Result<Tensor>;

    /// Runs rows `(n, hidden)` at `positions` after those in `cache` under `mask`, appending to
    /// the cache; returns the predicted hidden states `(n, hidden)`.
    fn forward(
        &self,
        xs: &Tensor,
        positions: &[u32],
        mask: &AttnMask,
        cache: &mut KvCache,
    ) -> Result<Tensor>;

    /// One draft forward over the rows of several requests: `xs` `(Σ rows, hidden)` holds each
    /// group's rows in turn, and each group runs at its own positions under its own mask over
    /// its own draft cache, as [`DraftLm::forward`] runs it alone. Returns the predicted hidden
    /// states `(Σ rows, hidden)`, every row with the bits its group's pass alone gives it.
    ///
    /// A scheduler runs one such pass per head and tree level for all its requests, so heads
    /// with batched kernels read their weights once per level rather than once per request;
    /// this default runs the groups one by one. Draft rows have no batch-invariant kernels: an
    /// `invariant` group is an error.
    fn forward_groups(&self, xs: &Tensor, groups: &mut [RowGroup<'_>]) -> Result<Tensor> {
        draft_forward_each(self, xs, groups)
    }

    /// The tokens the head may propose, if it keeps a reduced vocabulary (FR-Spec: the tokens
    /// its target emits, most frequent first); `None`: every token of the target's.
    fn vocab(&self) -> Option<&[u32]> {
        None
    }

    /// The head's measured acceptance, if recorded: at each depth `d` (index `d - 1`), how often
    /// its top-1 draft is accepted given that the depths above it were. `None`: unmeasured.
    fn acceptance(&self) -> Option<&[f64]> {
        None
    }

    /// Draft logits of predicted hidden states `(n, hidden)` through `target`'s LM head: over
    /// the whole vocabulary, or over [`DraftLm::vocab`] only where the head keeps one (its
    /// draft steps then read a fraction of the head). A token outside the reduced vocabulary is
    /// never proposed, and verification is the target's own, so decoding stays lossless.
    fn logits(&self, target: &dyn CausalLm, hidden: &Tensor) -> Result<DraftLogits> {
        Ok(DraftLogits {
            logits: target.logits(hidden)?,
            ids: None,
        })
    }

    /// [`DraftLm::logits`] of predicted hidden states gathered from several requests
    /// `(n, hidden)` (one read of the head for a level of all their trees): each row gets the
    /// bits [`DraftLm::logits`] gives it in its own request's call of at most
    /// [`crate::matvec::MAX_SMALL_ROWS`] rows ([`CausalLm::logits_rows`]). A head that
    /// overrides [`DraftLm::logits`] overrides this too.
    fn logits_rows(&self, target: &dyn CausalLm, hidden: &Tensor) -> Result<DraftLogits> {
        Ok(DraftLogits {
            logits: target.logits_rows(hidden)?,
            ids: None,
        })
    }
}

/// What [`DraftLm::logits`] returns.
#[derive(Debug, Clone)]
pub struct DraftLogits {
    /// `(n, columns)`.
    pub logits: Tensor,
    /// The token of each column; `None`: column `j` is token `j` (the whole vocabulary).
    pub ids: Option<std::sync::Arc<[u32]>>,
}

impl DraftLogits {
    /// Rows `first..first + n` (one request's, of logits gathered from several).
    pub fn narrow(&self, first: usize, n: usize) -> Result<Self> {
        Ok(Self {
            logits: self.logits.narrow(0, first, n)?,
            ids: self.ids.clone(),
        })
    }

    /// The token of column `j`.
    pub fn token(&self, j: usize) -> u32 {
        match &self.ids {
            Some(ids) => ids[j],
            None => j as u32,
        }
    }
}
