//! Pruning an InternVL prompt: an image's candidates are its tiles' tokens, the tiles stacked
//! top to bottom on one grid (`tiles · g/k` rows of `g/k` tokens, `g/k` the shuffled tile side).
//! Positions are 1-D, so every policy runs as on LLaVA ([`crate::transform_1d`]): kept tokens
//! keep their own position ids, FastV cuts inside the prefill.
//!
//! The saliency signals read each token's vision feature (the mean of the `k × k` patches the
//! pixel shuffle folded into it) and, as the global feature, the last tile's [CLS] — the
//! thumbnail's, which sees the whole image, when the image was tiled.

use crate::llava::{transform_1d, Candidates, Pruned};
use crate::policy::PruneSpec;
use crate::{Grid, PruneInput};
use candle_core::Tensor;
use glance_core::{Error, Result};
use glance_models::internvl::{InternImageEncoding, InternVl};
use glance_models::llava::PromptPlan;

/// The candidates of one image. `query`: the text query's pre-LLM embeddings.
pub fn internvl_input(
    model: &InternVl,
    enc: &InternImageEncoding,
    query: Option<Tensor>,
) -> Result<PruneInput> {
    let c = model.config();
    let (k, g) = (c.shuffle(), c.vision.grid());
    let side = g / k;
    let n = enc.features.dim(0)?;
    if n != enc.tiles * side * side {
        return Err(Error::Input(format!(
            "the image encoding has {n} tokens for {} tiles of {side}x{side}",
            enc.tiles
        )));
    }
    let width = enc.vision_hidden.dim(1)?;
    // (tiles · g · g, C) -> (tiles, g/k, k, g/k, k, C) -> (tiles · (g/k)², k², C) -> mean over k²
    let vision = enc
        .vision_hidden
        .reshape((enc.tiles, side, k, side, k, width))?
        .permute((0, 1, 3, 2, 4, 5))?
        .contiguous()?
        .reshape((n, k * k, width))?
        .mean(1)?;
    Ok(PruneInput {
        tokens: enc.features.clone(),
        grid: Grid {
            rows: enc.tiles * side,
            cols: side,
        },
        vision: Some(vision),
        cls: Some(enc.cls.get(enc.tiles - 1)?),
        cls_attention: None,
        query,
    })
}

/// The pruning step for an InternVL plan (built by [`InternVl::plan`]). A no-op request returns
/// the plan unchanged; run the result with [`crate::prefill_1d`].
pub fn transform_internvl(
    model: &InternVl,
    plan: PromptPlan,
    images: &[&InternImageEncoding],
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
            Ok(Candidates::Plain {
                prefix: 0,
                input: internvl_input(model, images[index], query)?,
            })
        },
    )
}
