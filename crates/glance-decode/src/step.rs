//! Step-able decoding: a strategy turns a [`Prefilled`] prompt into a per-request
//! [`DecodeState`], and the state advances one target pass at a time. Each step it says which
//! rows it needs from the target ([`Pass`]: one token, a draft tree with its mask, a diffusion
//! block), then takes the target's outputs for those rows and emits tokens.
//!
//! A state with a draft head first runs the head's passes ([`DraftPass`]: the rows the head has
//! not seen yet, then the draft tree level by level), each handed out by
//! [`DecodeState::draft_pass`] and answered through [`DecodeState::absorb_draft`], so a
//! scheduler can run one draft pass per head and level for all its requests
//! ([`shared_draft_pass`]: [`DraftLm::forward_groups`], as vLLM's EAGLE proposer runs each draft
//! step over the whole batch). It then gathers the target passes of every running request into
//! one ([`shared_pass`]: [`CausalLm::forward_groups`]), so requests of any strategy decode side
//! by side; [`run_alone`] is the same loop with one request ([`crate::DecodeStrategy::decode`]).
//! A row gets the same bits in a shared pass as alone, draft rows included, so every lossless
//! contract holds under load.
//!
//! ```text
//! state = strategy.start(model, prefilled, sampler, config)
//! loop
//!     while let Some(d) = state.draft_pass(model, sink)      (may emit; none without a draft)
//!         out = shared_draft_pass(model, head, [(d, draft cache), …])  (one per head for all)
//!         state.absorb_draft(model, out)                     (grows the tree)
//!     let Some(pass) = state.next_pass(model, sink) else break
//!     out = shared_pass(model, [(pass, state.cache()), …])  (one target pass for all)
//!     state.absorb(model, out, sink)                       (verify, keep rows, emit)
//! state.finish() → Generation
//! ```
//!
//! [`Prefilled`]: crate::Prefilled

use crate::autoregressive::Generation;
use crate::strategy::TokenSink;
use candle_core::Tensor;
use glance_core::{Error, Result, TokenId};
use glance_nn::matvec::MAX_SMALL_ROWS;
use glance_nn::{AttnMask, CausalLm, DraftLm, DraftLogits, KvCache, RowGroup};
use std::ops::Range;
use std::sync::Arc;

/// The rows a request needs from the target in one pass.
#[derive(Debug, Clone)]
pub struct Pass {
    /// Tokens whose embeddings are the rows.
    pub ids: Vec<TokenId>,
    /// Position of each row.
    pub positions: Vec<u32>,
    /// Relative to the new rows ([`CausalLm::forward`]).
    pub mask: AttnMask,
    /// Rows computed as one-token decoding computes them alone
    /// ([`CausalLm::forward_batch_invariant`]; block diffusion).
    pub invariant: bool,
    /// Rows whose logits the state reads ([`PassOutput::logits`]).
    pub logits: Range<usize>,
}

impl Pass {
    /// A decode step: `token` at `pos` under the causal mask, its logits wanted.
    pub fn token(token: TokenId, pos: u32) -> Self {
        Self {
            ids: vec![token],
            positions: vec![pos],
            mask: AttnMask::causal(),
            invariant: false,
            logits: 0..1,
        }
    }

    pub fn rows(&self) -> usize {
        self.ids.len()
    }

    fn check(&self) -> Result<()> {
        let t = self.ids.len();
        if t == 0 || self.positions.len() != t || self.logits.end > t || self.logits.is_empty() {
            return Err(Error::Input(format!(
                "a pass of {t} rows with {} positions and logits of rows {:?}",
                self.positions.len(),
                self.logits
            )));
        }
        Ok(())
    }
}

/// The rows a request needs from its draft head in one pass: the rows the head has not run yet
/// (the draft's prompt rows and the tokens emitted since, causal), or one level of a draft tree
/// under its visibility mask ([`crate::speculative::tree::Grower`]).
#[derive(Debug, Clone)]
pub struct DraftPass {
    /// Fused draft rows ([`DraftLm::fuse`]) `(n, hidden)`.
    pub rows: Tensor,
    /// Position of each row (length `n`).
    pub positions: Vec<u32>,
    /// Relative to the new rows, as in [`DraftLm::forward`].
    pub mask: AttnMask,
    /// Rows whose draft logits the state reads ([`DraftOutput::logits`]).
    pub logits: Range<usize>,
}

/// What the other requests brought to a scheduler's last step: the step a cost-aware state
/// plans its next round for ([`DecodeState::share`]). All zero: the request runs alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    /// Rows the others brought to the target pass, and how many requests they were.
    pub rows: usize,
    pub requests: usize,
    /// Rows per level the others brought to the passes of this request's draft head (their
    /// mean over the levels), and how many levels those passes ran.
    pub draft_rows: usize,
    pub draft_levels: usize,
}

/// What a draft head computed for a [`DraftPass`].
pub struct DraftOutput {
    /// Predicted hidden state of every row of the pass `(n, hidden)`.
    pub hidden: Tensor,
    /// The draft logits ([`DraftLm::logits`]) of the rows [`DraftPass::logits`] named, in order.
    pub logits: DraftLogits,
}

/// What the target computed for a [`Pass`].
pub struct PassOutput {
    /// Final hidden state of every row of the pass `(t, hidden)`.
    pub hidden: Tensor,
    /// The logits of the rows [`Pass::logits`] named, in order.
    pub logits: Vec<Vec<f32>>,
}

/// One request's decoding between target passes.
pub trait DecodeState: Send {
    /// The rows of the next target pass; `None` once the generation has ended. May emit tokens
    /// (the first one, picked from the prefill). Draft passes the caller has not run
    /// ([`DecodeState::draft_pass`]) run here alone ([`draft_alone`]).
    fn next_pass(&mut self, model: &dyn CausalLm, on_token: TokenSink<'_>) -> Result<Option<Pass>>;

    /// The target's cache the pass appends to.
    fn cache(&mut self) -> &mut KvCache;

    /// The rows of the state's next draft-head pass before its next target pass, opening the
    /// round if it has not (which may emit tokens, or end the generation); `None` once the
    /// round's drafting is done, and always for strategies without a draft head. Run it on
    /// [`DecodeState::draft`] over [`DecodeState::draft_cache`] and hand the outputs to
    /// [`DecodeState::absorb_draft`] before asking again.
    fn draft_pass(
        &mut self,
        model: &dyn CausalLm,
        on_token: TokenSink<'_>,
    ) -> Result<Option<DraftPass>> {
        let _ = (model, on_token);
        Ok(None)
    }

    /// The draft head the state's draft passes run on: a scheduler runs the passes of the
    /// states sharing a head ([`Arc::ptr_eq`]) together.
    fn draft(&self) -> Option<&Arc<dyn DraftLm>> {
        None
    }

    /// The draft head's cache the state's draft passes append to.
    fn draft_cache(&mut self) -> Option<&mut KvCache> {
        None
    }

    /// Takes the draft head's outputs for the rows of the last [`DecodeState::draft_pass`].
    fn absorb_draft(&mut self, model: &dyn CausalLm, out: DraftOutput) -> Result<()> {
        let _ = (model, out);
        Err(Error::Input(
            "draft outputs for a decoding state without a draft head".into(),
        ))
    }

    /// The next step will share its passes with about `load` (what the other requests brought
    /// to the last one): cost-aware states plan their rounds for that shared step.
    fn share(&mut self, load: Load) {
        let _ = load;
    }

    /// Takes the target's outputs for the pass [`DecodeState::next_pass`] returned: verifies,
    /// keeps or drops the pass's cache rows, emits tokens.
    fn absorb(
        &mut self,
        model: &dyn CausalLm,
        out: PassOutput,
        on_token: TokenSink<'_>,
    ) -> Result<()>;

    /// The generation, once [`DecodeState::next_pass`] returned `None` (or the caller stops).
    fn finish(self: Box<Self>) -> Generation;
}

/// One target pass over the rows of several requests: `jobs` pairs each request's pass with its
/// cache. Returns each request's [`PassOutput`], in order.
pub fn shared_pass(
    model: &dyn CausalLm,
    jobs: &mut [(&Pass, &mut KvCache)],
) -> Result<Vec<PassOutput>> {
    for (p, _) in jobs.iter() {
        p.check()?;
    }
    let ids: Vec<TokenId> = jobs
        .iter()
        .flat_map(|(p, _)| p.ids.iter().copied())
        .collect();
    // (n, hidden)
    let xs = model.embed_tokens(&ids)?;
    let mut groups: Vec<RowGroup<'_>> = jobs
        .iter_mut()
        .map(|(p, cache)| RowGroup {
            positions: &p.positions,
            mask: &p.mask,
            cache,
            invariant: p.invariant,
        })
        .collect();
    // (n, hidden)
    let hidden = model.forward_groups(&xs, &mut groups)?;
    drop(groups);
    // The rows whose logits are wanted, gathered for one read of the LM head.
    let mut first = 0;
    let mut wanted = Vec::new();
    let mut spans = Vec::with_capacity(jobs.len());
    for (p, _) in jobs.iter() {
        wanted.push(hidden.narrow(0, first + p.logits.start, p.logits.len())?);
        spans.push((first, p.rows(), p.logits.len()));
        first += p.rows();
    }
    let wanted = if wanted.len() == 1 {
        wanted.pop().expect("one")
    } else {
        Tensor::cat(&wanted, 0)?
    };
    // (Σ logit rows, vocab): one request's rows through the model's own logits (the same bits
    // as the gathered rows' kernel, without its set-up for one pass).
    let logits = if jobs.len() == 1 {
        model.logits(&wanted)?
    } else {
        model.logits_rows(&wanted)?
    };
    let mut logits = logits.to_vec2::<f32>()?.into_iter();
    spans
        .into_iter()
        .map(|(first, rows, n)| {
            Ok(PassOutput {
                hidden: hidden.narrow(0, first, rows)?,
                logits: logits.by_ref().take(n).collect(),
            })
        })
        .collect()
}

/// One draft-head pass over the rows of several requests sharing `draft`, then one read of the
/// head for the draft logits they want (through `target`'s LM head): `jobs` pairs each
/// request's [`DraftPass`] with its draft cache. Returns each request's [`DraftOutput`], in
/// order, with the bits its pass alone gives it.
pub fn shared_draft_pass(
    target: &dyn CausalLm,
    draft: &dyn DraftLm,
    jobs: &mut [(&DraftPass, &mut KvCache)],
) -> Result<Vec<DraftOutput>> {
    for (p, _) in jobs.iter() {
        let n = p.rows.dim(0)?;
        if n == 0 || p.positions.len() != n || p.logits.end > n || p.logits.is_empty() {
            return Err(Error::Input(format!(
                "a draft pass of {n} rows with {} positions and logits of rows {:?}",
                p.positions.len(),
                p.logits
            )));
        }
    }
    // (Σ n, hidden)
    let xs = if jobs.len() == 1 {
        jobs[0].0.rows.clone()
    } else {
        Tensor::cat(&jobs.iter().map(|(p, _)| &p.rows).collect::<Vec<_>>(), 0)?
    };
    let mut groups: Vec<RowGroup<'_>> = jobs
        .iter_mut()
        .map(|(p, cache)| RowGroup {
            positions: &p.positions,
            mask: &p.mask,
            cache,
            invariant: false,
        })
        .collect();
    // (Σ n, hidden)
    let hidden = draft.forward_groups(&xs, &mut groups)?;
    drop(groups);
    // Each request's rows, and the rows whose logits it wants `(k, hidden)`.
    let mut first = 0;
    let mut own = Vec::with_capacity(jobs.len());
    let mut wanted = Vec::with_capacity(jobs.len());
    for (p, _) in jobs.iter() {
        let n = p.positions.len();
        own.push(hidden.narrow(0, first, n)?);
        wanted.push(hidden.narrow(0, first + p.logits.start, p.logits.len())?);
        first += n;
    }
    // A request's own call of more rows than the single-row kernels take runs other kernels:
    // such calls stay apart.
    let small = jobs.iter().all(|(p, _)| p.logits.len() <= MAX_SMALL_ROWS);
    let logits: Vec<DraftLogits> = if jobs.len() > 1 && small {
        // (Σ k, columns): one read of the head for all the requests.
        let all = draft.logits_rows(target, &Tensor::cat(&wanted, 0)?)?;
        let mut first = 0;
        wanted
            .iter()
            .map(|w| {
                let k = w.dim(0)?;
                first += k;
                all.narrow(first - k, k)
            })
            .collect::<Result<_>>()?
    } else {
        wanted
            .iter()
            .map(|w| draft.logits(target, w))
            .collect::<Result<_>>()?
    };
    Ok(own
        .into_iter()
        .zip(logits)
        .map(|(hidden, logits)| DraftOutput { hidden, logits })
        .collect())
}

/// Runs the draft passes `state` has before its next target pass, alone.
pub fn draft_alone<S: DecodeState + ?Sized>(
    model: &dyn CausalLm,
    state: &mut S,
    on_token: TokenSink<'_>,
) -> Result<()> {
    while let Some(pass) = state.draft_pass(model, on_token)? {
        let draft = state
            .draft()
            .cloned()
            .ok_or_else(|| Error::Input("a draft pass without a draft head".into()))?;
        let cache = state
            .draft_cache()
            .ok_or_else(|| Error::Input("a draft pass without a draft cache".into()))?;
        let out = shared_draft_pass(model, draft.as_ref(), &mut [(&pass, cache)])?
            .pop()
            .expect("one pass, one output");
        state.absorb_draft(model, out)?;
    }
    Ok(())
}

/// Runs `state` to the end alone: the scheduler's loop with one request.
pub fn run_alone(
    model: &dyn CausalLm,
    mut state: Box<dyn DecodeState>,
    on_token: TokenSink<'_>,
) -> Result<Generation> {
    loop {
        draft_alone(model, state.as_mut(), on_token)?;
        let Some(pass) = state.next_pass(model, on_token)? else {
            break;
        };
        let out = shared_pass(model, &mut [(&pass, state.cache())])?
            .pop()
            .expect("one pass, one output");
        state.absorb(model, out, on_token)?;
    }
    Ok(state.finish())
}
