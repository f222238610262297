//! Pruning a LLaVA prompt: [`llava_input`] turns an [`ImageEncoding`] into a [`PruneInput`];
//! [`transform`] is the pruning step of the request path — it takes the [`PromptPlan`] built from
//! the prompt and returns the plan the decoder will run (each image segment replaced by its kept
//! rows at their original position ids) or, for FastV, the in-decoder cut to make; [`prefill`]
//! runs a pruned plan. [`prefill_llava`] composes plan → transform → prefill in one call.
//!
//! Under the `full` feature strategy the projected tokens start with [CLS]: that prefix is always
//! kept, counts toward the budget, and is not a candidate (at least one patch is kept besides it).
//! If a prompt ends with image tokens (a raw prompt `…<image>`), pre-LLM pruning may drop the last
//! row; chat prompts always end with text.

use crate::fastv;
use crate::policy::{Policy, PruneSpec, Stage};
use crate::{select, Grid, PruneInput};
use candle_core::Tensor;
use glance_core::{Error, Result};
use glance_decode::Prefilled;
use glance_models::llava::{FeatureSelect, ImageEncoding, Llava, PromptPlan, SegmentKind};
use glance_models::text::TextModel;
use glance_nn::CausalLm;
use std::time::{Duration, Instant};

/// What pruning did to a prompt.
#[derive(Debug, Clone)]
pub struct PruneStats {
    pub policy: Policy,
    /// Visual tokens in the prompt before pruning (all images).
    pub visual_tokens: usize,
    /// Visual tokens kept (for FastV: in the layers after its pruning layer).
    pub kept_visual_tokens: usize,
    /// Time to score, select and splice (pre-LLM policies; FastV selects inside the prefill).
    pub select_time: Duration,
}

/// FastV's cut, made inside the prefill: keep `keep` of the `visual` rows after layer `layer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FastvCut {
    /// Row indices (into the plan's rows) of every visual row, increasing.
    pub visual: Vec<usize>,
    pub keep: usize,
    pub layer: usize,
}

impl FastvCut {
    /// The cut `spec` asks of a plan with `image_rows` (each image's rows): the budget applies
    /// to each image, the layer is the spec's or the default for `layers` decoder layers.
    pub fn new(image_rows: Vec<Vec<usize>>, spec: &PruneSpec, layers: usize) -> Self {
        let keep = image_rows
            .iter()
            .map(|r| spec.budget.resolve(r.len()))
            .sum();
        Self {
            visual: image_rows.into_iter().flatten().collect(),
            keep,
            layer: spec
                .fastv_layer
                .unwrap_or_else(|| fastv::default_layer(layers)),
        }
    }
}

/// A plan after the pruning step.
#[derive(Debug, Clone)]
pub struct Pruned {
    /// The rows the decoder runs (pre-LLM policies already removed the dropped ones).
    pub plan: PromptPlan,
    /// For FastV: the cut the prefill makes.
    pub fastv: Option<FastvCut>,
    pub stats: PruneStats,
}

/// A prefill state plus what pruning did.
pub struct PrunedPrefill {
    pub state: Prefilled,
    pub stats: PruneStats,
}

impl std::fmt::Debug for PrunedPrefill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrunedPrefill")
            .field("prompt_len", &self.state.prompt_len())
            .field("last_pos", &self.state.last_pos())
            .field("stats", &self.stats)
            .finish()
    }
}

/// The candidates of one image: `(prefix, input)`, where `prefix` leading projected tokens
/// ([CLS] under the `full` strategy) are not candidates. `query` is the text query's pre-LLM
/// embeddings `(q, text_hidden)`.
pub fn llava_input(
    model: &Llava,
    enc: &ImageEncoding,
    query: Option<Tensor>,
) -> Result<(usize, PruneInput)> {
    let c = model.config();
    let grid = Grid {
        rows: c.vision.grid(),
        cols: c.vision.grid(),
    };
    let patches = grid.len();
    let prefix = match c.feature_select {
        FeatureSelect::Default => 0,
        FeatureSelect::Full => 1,
    };
    let n = enc.features.dim(0)?;
    if n != patches + prefix {
        return Err(Error::Input(format!(
            "the image encoding has {n} tokens, expected {}",
            patches + prefix
        )));
    }
    Ok((
        prefix,
        clip_input(enc, enc.features.narrow(0, prefix, patches)?, grid, query)?,
    ))
}

/// The candidates of one CLIP image: `tokens` its `grid` of projected patch tokens, the signals
/// from `enc`'s tower outputs (of the same image).
pub(crate) fn clip_input(
    enc: &ImageEncoding,
    tokens: Tensor,
    grid: Grid,
    query: Option<Tensor>,
) -> Result<PruneInput> {
    let patches = grid.len();
    // (1 + patches, vision_hidden), [CLS] first
    let vh = &enc.vision_hidden;
    Ok(PruneInput {
        tokens,
        grid,
        vision: Some(vh.narrow(0, 1, patches)?),
        cls: Some(vh.get(0)?),
        // (heads, 1 + patches) -> (heads, patches)
        cls_attention: enc
            .cls_attention
            .as_ref()
            .map(|a| a.narrow(1, 1, patches))
            .transpose()?,
        query,
    })
}

/// The pruning step: `plan` (built from the prompt by [`Llava::plan`]) with its images pruned as
/// `spec` says. `images` are the plan's images in prompt order; `query_ids` the text query's
/// token ids — the question, or the whole dialogue in multi-turn use — embedded with the LLM's
/// input embeddings (only read by `text`, `mix`, `adaptive`). The budget applies to each image (a
/// count is per image). A no-op request returns the plan unchanged.
pub fn transform(
    model: &Llava,
    plan: PromptPlan,
    images: &[&ImageEncoding],
    query_ids: &[u32],
    spec: &PruneSpec,
) -> Result<Pruned> {
    transform_1d(
        model.text(),
        plan,
        images.len(),
        query_ids,
        spec,
        |index, query| {
            let enc = images[index];
            Ok(match &enc.anyres {
                Some(signals) => Candidates::Anyres(enc, signals),
                None => {
                    let (prefix, input) = llava_input(model, enc, query)?;
                    Candidates::Plain { prefix, input }
                }
            })
        },
    )
}

/// One image's candidates for [`transform_1d`].
pub enum Candidates<'a> {
    /// `prefix` leading rows always kept and not candidates, then `input`'s candidates.
    Plain { prefix: usize, input: PruneInput },
    /// A LLaVA-NeXT image: its base image and tiles as two candidate grids, the newline rows
    /// kept ([`crate::next`]).
    Anyres(&'a ImageEncoding, &'a glance_models::llava::AnyresSignals),
}

/// The pruning step of any model with 1-D positions (LLaVA, LLaVA-NeXT, InternVL): `plan` with
/// its images pruned as `spec` says, kept rows at their own position ids. `n_images` encodings
/// are behind `input_of(index, query)`, which gives image `index`'s [`Candidates`]. `text` embeds
/// the query and runs FastV.
pub fn transform_1d<'a>(
    text: &TextModel,
    mut plan: PromptPlan,
    n_images: usize,
    query_ids: &[u32],
    spec: &PruneSpec,
    input_of: impl Fn(usize, Option<Tensor>) -> Result<Candidates<'a>>,
) -> Result<Pruned> {
    spec.validate()?;
    let visual_tokens = plan.visual_tokens();
    let image_rows = plan.image_rows();
    if image_rows.len() != n_images {
        return Err(Error::Input(format!(
            "the prompt plan has {} image(s) but {} image encoding(s) were given",
            image_rows.len(),
            n_images
        )));
    }
    let stats = |kept: usize, select_time| PruneStats {
        policy: spec.policy,
        visual_tokens,
        kept_visual_tokens: kept,
        select_time,
    };
    let stage = if spec.is_noop() || n_images == 0 {
        Stage::Off
    } else {
        spec.policy.stage()
    };
    match stage {
        Stage::Off => Ok(Pruned {
            plan,
            fastv: None,
            stats: stats(visual_tokens, Duration::ZERO),
        }),
        Stage::InLlm => {
            let cut = FastvCut::new(image_rows, spec, text.num_layers());
            Ok(Pruned {
                plan,
                stats: stats(cut.keep.min(visual_tokens), Duration::ZERO),
                fastv: Some(cut),
            })
        }
        Stage::PreLlm => {
            let start = Instant::now();
            let pruner = spec.pruner().ok_or_else(|| {
                Error::Config(format!("policy `{}` has no pre-LLM selector", spec.policy))
            })?;
            let query = if spec.policy.uses_query() && !query_ids.is_empty() {
                Some(text.embed_tokens(query_ids)?)
            } else {
                None
            };
            let mut kept_total = 0;
            for seg in plan.segments.iter_mut() {
                let SegmentKind::Image { index } = seg.kind else {
                    continue;
                };
                let (s, len) = (seg.source.start, seg.source.len());
                let (prefix, input) = match input_of(index, query.clone())? {
                    Candidates::Plain { prefix, input } => (prefix, input),
                    Candidates::Anyres(enc, signals) => {
                        let (rows, kept) = crate::next::prune(
                            enc,
                            signals,
                            query.clone(),
                            pruner.as_ref(),
                            spec,
                            len,
                        )?;
                        seg.positions = kept.iter().map(|&i| (s + i) as u32).collect();
                        seg.rows = rows;
                        kept_total += kept.len();
                        continue;
                    }
                };
                let k = spec.budget.resolve(len).saturating_sub(prefix).max(1);
                let kept = select(pruner.as_ref(), &input, k)?;
                let mut positions: Vec<u32> = (s..s + prefix).map(|p| p as u32).collect();
                positions.extend(kept.index.iter().map(|&i| (s + prefix + i) as u32));
                // (prefix + k, text_hidden): the prefix rows (LLaVA's [CLS] under `full`) then
                // the kept tokens.
                seg.rows = if prefix > 0 {
                    Tensor::cat(&[&seg.rows.narrow(0, 0, prefix)?, &kept.rows], 0)?
                } else {
                    kept.rows
                };
                kept_total += positions.len();
                seg.positions = positions;
            }
            Ok(Pruned {
                plan,
                fastv: None,
                stats: stats(kept_total, start.elapsed()),
            })
        }
    }
}

/// Runs a pruned plan: a causal prefill of its rows, or FastV's two-part prefill.
pub fn prefill(model: &Llava, pruned: &Pruned) -> Result<Prefilled> {
    prefill_1d(model.text(), pruned)
}

/// [`prefill`] on the decoder of any model with 1-D positions.
pub fn prefill_1d(text: &TextModel, pruned: &Pruned) -> Result<Prefilled> {
    let rows = pruned.plan.rows()?;
    let positions = pruned.plan.positions();
    match &pruned.fastv {
        None => glance_decode::prefill(text, &rows, &positions),
        Some(cut) => fastv::prefill(
            text,
            &rows,
            &positions,
            None,
            &cut.visual,
            cut.keep,
            cut.layer,
        ),
    }
}

/// Plan → [`transform`] → [`prefill`] in one call: prefills `ids` (image placeholders expanded;
/// one run per image) with `images` pruned as `spec` says. A no-op request is exactly the unpruned
/// prefill.
pub fn prefill_llava(
    model: &Llava,
    ids: &[u32],
    images: &[&ImageEncoding],
    query_ids: &[u32],
    spec: &PruneSpec,
) -> Result<PrunedPrefill> {
    let features: Vec<&Tensor> = images.iter().map(|e| &e.features).collect();
    let plan = model.plan(ids, &features)?;
    let pruned = transform(model, plan, images, query_ids, spec)?;
    let state = prefill(model, &pruned)?;
    Ok(PrunedPrefill {
        state,
        stats: pruned.stats,
    })
}
