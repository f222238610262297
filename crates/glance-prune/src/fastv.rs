//! FastV (Chen et al., "An Image is Worth 1/2 Tokens After Layer 2", ECCV 2024) as a prefill
//! strategy: run the whole prompt through decoder layers `0..l`, rank the visual rows by the
//! attention the last prompt row pays them in layer `l - 1` (mean over heads), keep the top `k`,
//! and run only the kept rows (all text rows + `k` visual rows, original position ids) through
//! layers `l..L`.
//!
//! The KV cache of layers `0..l` holds every prompt row (those layers saw them all); layers `l..L`
//! hold only the kept rows. Decoding continues with any [`glance_decode::DecodeStrategy`]: each layer's mask
//! is sized to its own cache. With a sliding window (Mistral) the window counts cache rows, so in
//! the pruned layers it reaches further back in positions.

use crate::top_k;
use candle_core::Tensor;
use glance_core::{Error, Result};
use glance_decode::Prefilled;
use glance_models::text::TextModel;
use glance_nn::{AttnMask, CausalLm};
use std::time::Instant;

/// The layer FastV prunes after when none is given: 2 (the paper's K), or the last layer boundary
/// of a shallower model.
pub fn default_layer(num_layers: usize) -> usize {
    2.min(num_layers.saturating_sub(1)).max(1)
}

/// Prefills `rows` `(t, hidden)` at `positions`, dropping all but `keep` of the rows `visual`
/// (strictly increasing row indices) after decoder layer `layer` (`1 ≤ layer < layers`). The last
/// prompt row is never dropped. `keep ≥ visual.len()` is a plain prefill. `mrope`: the rows' 3-D
/// positions for an M-RoPE decoder (Qwen2-VL; `positions` are then their largest parts); a kept
/// row keeps its own.
pub fn prefill(
    model: &TextModel,
    rows: &Tensor,
    positions: &[u32],
    mrope: Option<&[[u32; 3]]>,
    visual: &[usize],
    keep: usize,
    layer: usize,
) -> Result<Prefilled> {
    let t = rows.dim(0)?;
    let layers = model.num_layers();
    glance_decode::check_prompt(model, t, positions)?;
    if layer == 0 || layer >= layers {
        return Err(Error::InvalidParam(format!(
            "the FastV layer must be between 1 and {} (the model has {layers} decoder layers), got {layer}",
            layers.saturating_sub(1)
        )));
    }
    if visual.windows(2).any(|w| w[0] >= w[1]) || visual.last().is_some_and(|&v| v >= t) {
        return Err(Error::Input(
            "FastV: visual rows must be increasing indices into the prompt".into(),
        ));
    }
    if mrope.is_some_and(|m| m.len() != t) {
        return Err(Error::Input(format!(
            "FastV: {t} prompt rows with {} 3-D positions",
            mrope.map_or(0, |m| m.len())
        )));
    }
    if keep >= visual.len() {
        return match mrope {
            Some(m) => glance_decode::prefill_mrope(model, rows, m),
            None => glance_decode::prefill(model, rows, positions),
        };
    }
    let start = Instant::now();
    let mut cache = model.new_cache();
    let mask = AttnMask::causal();
    let layers_at = |x: &Tensor, kept: &[usize], cache: &mut _, range, probe| match mrope {
        Some(m) => {
            let m: Vec<[u32; 3]> = kept.iter().map(|&r| m[r]).collect();
            model.forward_layers_mrope(x, &m, &mask, cache, range, probe)
        }
        None => {
            let p: Vec<u32> = kept.iter().map(|&r| positions[r]).collect();
            model.forward_layers(x, &p, &mask, cache, range, probe)
        }
    };
    let every: Vec<usize> = (0..t).collect();
    let (x, probs) = layers_at(rows, &every, &mut cache, 0..layer, Some(layer - 1))?;
    let probs = probs.ok_or_else(|| {
        Error::Config("FastV: the decoder returned no attention probabilities".into())
    })?;
    // (heads, t) -> (t): the attention the last row pays each row, averaged over heads.
    let received: Vec<f32> = probs.mean(0)?.to_vec1()?;
    // The last row is the one the next token is predicted from: never a candidate.
    let candidates: Vec<usize> = visual.iter().copied().filter(|&r| r != t - 1).collect();
    let forced = visual.len() - candidates.len();
    let scores: Vec<f32> = candidates.iter().map(|&r| received[r]).collect();
    let mut drop = vec![false; t];
    candidates.iter().for_each(|&r| drop[r] = true);
    for i in top_k(&scores, keep.saturating_sub(forced)) {
        drop[candidates[i]] = false;
    }
    let kept: Vec<usize> = (0..t).filter(|&r| !drop[r]).collect();
    let ids: Vec<u32> = kept.iter().map(|&r| r as u32).collect();
    let ids = Tensor::from_vec(ids, kept.len(), rows.device())?;
    // (t, hidden) -> (t', hidden)
    let x = x.index_select(&ids, 0)?;
    let kept_positions: Vec<u32> = kept.iter().map(|&r| positions[r]).collect();
    let (x, _) = layers_at(&x, &kept, &mut cache, layer..layers, None)?;
    // (t', hidden): the final hidden state of every row the last layer ran.
    let hidden = model.final_norm(&x)?;
    Ok(Prefilled {
        cache,
        inputs: rows.index_select(&ids, 0)?,
        hidden,
        positions: kept_positions,
        images: Vec::new(),
        elapsed: start.elapsed(),
    })
}
