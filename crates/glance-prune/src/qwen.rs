//! Pruning a Qwen2-VL / Qwen2.5-VL prompt: the candidates of an image are its merged tokens on
//! the merged grid (`grid_h / 2 × grid_w / 2`); a kept token keeps its own 3-D (M-RoPE) position
//! `(start, start + row, start + col)`, and the text after the image keeps its positions too.
//!
//! Qwen's vision tower has no [CLS]: the saliency signals read each merged token's vision
//! feature (the mean of its 2×2 patches' last-block states) and, as the global feature, the mean
//! over the image (ViSpec's global visual feature is such a pooled summary). FastV cuts rows inside
//! the prefill, each kept row at its own 3-D position ([`crate::fastv::prefill`]).

use crate::llava::{FastvCut, PruneStats, Pruned};
use crate::policy::{PruneSpec, Stage};
use crate::{select, Grid, PruneInput};
use candle_core::Tensor;
use glance_core::{Error, Result};
use glance_decode::Prefilled;
use glance_models::llava::{PromptPlan, SegmentKind};
use glance_models::qwen2_vl::{largest_part, Qwen2Vl, QwenImageEncoding};
use glance_nn::CausalLm;
use std::time::{Duration, Instant};

/// The candidates of one image: its merged tokens on the merged grid, with pooled vision
/// features as the saliency signals. `query`: the text query's pre-LLM embeddings.
pub fn qwen_input(enc: &QwenImageEncoding, query: Option<Tensor>) -> Result<PruneInput> {
    let (rows, cols) = enc.grid.tokens_hw();
    let m = enc.grid.merge;
    let n = enc.features.dim(0)?;
    if n != rows * cols {
        return Err(Error::Input(format!(
            "the image encoding has {n} tokens for a {rows}x{cols} merged grid"
        )));
    }
    // (n·m², width) in the processor's block order -> (n, m², width) -> (n, width)
    let width = enc.vision_hidden.dim(1)?;
    let vision = enc.vision_hidden.reshape((n, m * m, width))?.mean(1)?;
    // (width,): the whole image's mean, the stand-in for a [CLS] feature.
    let global = vision.mean(0)?;
    Ok(PruneInput {
        tokens: enc.features.clone(),
        grid: Grid { rows, cols },
        vision: Some(vision),
        cls: Some(global),
        cls_attention: None,
        query,
    })
}

/// The pruning step for a Qwen2-VL plan (built by [`Qwen2Vl::plan`]): each image segment
/// replaced by its kept rows with their own 3-D positions. A no-op request returns the plan
/// unchanged.
pub fn transform_qwen(
    model: &Qwen2Vl,
    mut plan: PromptPlan,
    images: &[&QwenImageEncoding],
    query_ids: &[u32],
    spec: &PruneSpec,
) -> Result<Pruned> {
    spec.validate()?;
    let visual_tokens = plan.visual_tokens();
    if plan.image_rows().len() != images.len() {
        return Err(Error::Input(format!(
            "the prompt plan has {} image(s) but {} image encoding(s) were given",
            plan.image_rows().len(),
            images.len()
        )));
    }
    let stats = |kept: usize, select_time| PruneStats {
        policy: spec.policy,
        visual_tokens,
        kept_visual_tokens: kept,
        select_time,
    };
    let stage = if spec.is_noop() || images.is_empty() {
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
            let cut = FastvCut::new(plan.image_rows(), spec, model.text().num_layers());
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
                Some(model.text().embed_tokens(query_ids)?)
            } else {
                None
            };
            let mut kept_total = 0;
            for seg in plan.segments.iter_mut() {
                let SegmentKind::Image { index } = seg.kind else {
                    continue;
                };
                let enc = images[index];
                let mrope = seg.mrope.clone().ok_or_else(|| {
                    Error::Input("a Qwen2-VL image segment without 3-D positions".into())
                })?;
                let input = qwen_input(enc, query.clone())?;
                let k = spec.budget.resolve(seg.source.len());
                let kept = select(pruner.as_ref(), &input, k)?;
                let kept_pos: Vec<[u32; 3]> = kept.index.iter().map(|&i| mrope[i]).collect();
                seg.rows = kept.rows;
                seg.positions = kept_pos.iter().map(largest_part).collect();
                seg.mrope = Some(kept_pos);
                kept_total += kept.index.len();
            }
            Ok(Pruned {
                plan,
                fastv: None,
                stats: stats(kept_total, start.elapsed()),
            })
        }
    }
}

/// Runs a pruned Qwen2-VL plan: a causal prefill of its rows at their 3-D positions, or FastV's
/// two-part prefill.
pub fn prefill_qwen(model: &Qwen2Vl, pruned: &Pruned) -> Result<Prefilled> {
    let rows = pruned.plan.rows()?;
    let positions = pruned
        .plan
        .mrope_positions()
        .unwrap_or_else(|| pruned.plan.positions().iter().map(|&p| [p; 3]).collect());
    match &pruned.fastv {
        None => glance_decode::prefill_mrope(model.text(), &rows, &positions),
        Some(cut) => {
            let largest: Vec<u32> = positions.iter().map(largest_part).collect();
            crate::fastv::prefill(
                model.text(),
                &rows,
                &largest,
                Some(&positions),
                &cut.visual,
                cut.keep,
                cut.layer,
            )
        }
    }
}
