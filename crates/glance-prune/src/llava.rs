//! Pruning a LLaVA prompt: [`llava_input`] turns an [`ImageEncoding`] into a [`PruneInput`];
//! [`prefill_llava`] selects, splices the kept rows into the prompt at their original position ids,
//! and prefills (or runs FastV), returning the state [`glance_decode::decode`] continues from.
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
use glance_models::llava::{FeatureSelect, ImageEncoding, Llava};
use glance_nn::CausalLm;
use std::time::{Duration, Instant};

/// What a pruned prefill did.
#[derive(Debug, Clone)]
pub struct PruneStats {
    pub policy: Policy,
    /// Visual tokens in the prompt before pruning (all images).
    pub visual_tokens: usize,
    /// Visual tokens kept (for FastV: in the layers after its pruning layer).
    pub kept_visual_tokens: usize,
    /// Prompt rows the LLM ran (for FastV: in the layers after its pruning layer).
    pub prompt_rows: usize,
    /// Time to score, select and splice (pre-LLM policies; FastV selects inside the prefill).
    pub select_time: Duration,
}

/// A prefill state plus what pruning did.
pub struct PrunedPrefill {
    pub state: Prefilled,
    pub stats: PruneStats,
}

impl std::fmt::Debug for PrunedPrefill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrunedPrefill")
            .field("prompt_len", &self.state.prompt_len)
            .field("last_pos", &self.state.last_pos)
            .field("stats", &self.stats)
            .finish()
    }
}

/// `(start, len)` of each image's token run in `ids`, in prompt order; adjacent images' runs are
/// split every `per_image` tokens.
pub fn image_spans(
    ids: &[u32],
    image_token_id: u32,
    per_image: usize,
) -> Result<Vec<(usize, usize)>> {
    let mut spans = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        if ids[i] != image_token_id {
            i += 1;
            continue;
        }
        let len = ids[i..]
            .iter()
            .take_while(|&&x| x == image_token_id)
            .count();
        if per_image == 0 || len % per_image != 0 {
            return Err(Error::Input(format!(
                "a run of {len} image tokens is not a whole number of images of {per_image} tokens"
            )));
        }
        spans.extend((0..len / per_image).map(|j| (i + j * per_image, per_image)));
        i += len;
    }
    Ok(spans)
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
    // (1 + patches, vision_hidden), [CLS] first
    let vh = &enc.vision_hidden;
    Ok((
        prefix,
        PruneInput {
            tokens: enc.features.narrow(0, prefix, patches)?,
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
        },
    ))
}

/// Prefills `ids` (image placeholders expanded; one run per image) with `images` pruned as `spec`
/// says. `query_ids` are the text query's token ids — the question, or the whole dialogue in
/// multi-turn use — embedded with the LLM's input embeddings (only read by `text`, `mix`,
/// `adaptive`). The budget applies to each image (a count is per image). A no-op request is
/// exactly the unpruned prefill.
pub fn prefill_llava(
    model: &Llava,
    ids: &[u32],
    images: &[&ImageEncoding],
    query_ids: &[u32],
    spec: &PruneSpec,
) -> Result<PrunedPrefill> {
    spec.validate()?;
    let text = model.text();
    let c = model.config();
    let spans = image_spans(ids, c.image_token_id, c.image_tokens_per_image())?;
    if spans.len() != images.len() {
        return Err(Error::Input(format!(
            "the prompt has {} image(s) worth of image tokens but {} image(s) were given",
            spans.len(),
            images.len()
        )));
    }
    let visual_tokens: usize = spans.iter().map(|s| s.1).sum();
    let features: Vec<&Tensor> = images.iter().map(|e| &e.features).collect();
    let stats = |kept: usize, rows: usize, select_time| PruneStats {
        policy: spec.policy,
        visual_tokens,
        kept_visual_tokens: kept,
        prompt_rows: rows,
        select_time,
    };
    let plain = || -> Result<PrunedPrefill> {
        let rows = model.embed_prompt(ids, &features)?;
        let positions: Vec<u32> = (0..ids.len() as u32).collect();
        let state = glance_decode::prefill(text, &rows, &positions)?;
        Ok(PrunedPrefill {
            state,
            stats: stats(visual_tokens, ids.len(), Duration::ZERO),
        })
    };
    if spec.is_noop() || images.is_empty() {
        return plain();
    }
    match spec.policy.stage() {
        Stage::Off => plain(),
        Stage::InLlm => {
            let rows = model.embed_prompt(ids, &features)?;
            let positions: Vec<u32> = (0..ids.len() as u32).collect();
            let visual: Vec<usize> = spans.iter().flat_map(|&(s, l)| s..s + l).collect();
            let keep: usize = spans.iter().map(|&(_, l)| spec.budget.resolve(l)).sum();
            let layer = spec
                .fastv_layer
                .unwrap_or_else(|| fastv::default_layer(text.num_layers()));
            let state = fastv::prefill(text, &rows, &positions, &visual, keep, layer)?;
            let rows_after = state.prompt_len;
            let kept = keep.min(visual_tokens);
            Ok(PrunedPrefill {
                state,
                stats: stats(kept, rows_after, Duration::ZERO),
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
            let (mut pieces, mut positions) = (Vec::new(), Vec::new());
            let mut cursor = 0;
            let mut kept_total = 0;
            for (&(s, len), enc) in spans.iter().zip(images) {
                if cursor < s {
                    pieces.push(text.embed_tokens(&ids[cursor..s])?);
                    positions.extend(cursor as u32..s as u32);
                }
                let (prefix, input) = llava_input(model, enc, query.clone())?;
                let k = spec.budget.resolve(len).saturating_sub(prefix).max(1);
                let kept = select(pruner.as_ref(), &input, k)?;
                if prefix > 0 {
                    pieces.push(enc.features.narrow(0, 0, prefix)?);
                    positions.extend((s..s + prefix).map(|p| p as u32));
                }
                pieces.push(kept.rows);
                positions.extend(kept.index.iter().map(|&i| (s + prefix + i) as u32));
                kept_total += prefix + kept.index.len();
                cursor = s + len;
            }
            if cursor < ids.len() {
                pieces.push(text.embed_tokens(&ids[cursor..])?);
                positions.extend(cursor as u32..ids.len() as u32);
            }
            // (t', text_hidden): text rows and kept visual rows in prompt order.
            let rows = Tensor::cat(&pieces, 0)?;
            let select_time = start.elapsed();
            let state = glance_decode::prefill(text, &rows, &positions)?;
            Ok(PrunedPrefill {
                state,
                stats: stats(kept_total, positions.len(), select_time),
            })
        }
    }
}
