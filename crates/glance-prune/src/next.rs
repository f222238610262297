//! Pruning a LLaVA-NeXT image. Its packed tokens (`glance_models::llava::PackedLayout`) are the
//! base image's `grid × grid` patches, then the unpadded tile grid with a newline row closing each
//! grid row. The candidates are two grids with their own signals — the base image (its tower's
//! [CLS] attention and features) and the tile grid (each token with its own tile's) — and the
//! newline rows are always kept: they mark where each row ends, and count toward the budget.
//! Every kept row keeps its own position in the prompt.
//!
//! The content budget (the image's budget less its newline rows) is shared by
//! [`TileBudget`]: `Global` gives the base image and the grid the same share of their tokens;
//! `PerTile` (HiRED) gives the base image its size share and the tiles the rest in proportion to
//! the base image's [CLS] attention over each tile's area, each tile selecting on its own.

use crate::llava::clip_input;
use crate::policy::{PruneSpec, TileBudget};
use crate::{select, Grid, Kept, PruneInput, Pruner};
use candle_core::{DType, Tensor};
use glance_core::{Error, Result};
use glance_models::llava::{AnyresSignals, ImageEncoding};

/// Splits `total` into integer shares proportional to `weights` (uniform when they sum to 0),
/// none above its cap, as close to proportional as whole numbers allow (largest remainders, ties
/// to the lower index). The shares sum to `min(total, Σ caps)`.
pub fn allocate(total: usize, weights: &[f64], caps: &[usize]) -> Vec<usize> {
    let mut out = vec![0usize; caps.len()];
    let mut left = total.min(caps.iter().sum());
    while left > 0 {
        let open: Vec<usize> = (0..caps.len()).filter(|&i| out[i] < caps[i]).collect();
        let w: f64 = open.iter().map(|&i| weights[i].max(0.0)).sum();
        let mut given = 0;
        let mut remainders = Vec::with_capacity(open.len());
        for &i in &open {
            let share = if w > 0.0 {
                left as f64 * weights[i].max(0.0) / w
            } else {
                left as f64 / open.len() as f64
            };
            let take = (share.floor() as usize).min(caps[i] - out[i]);
            out[i] += take;
            given += take;
            remainders.push((share - share.floor(), i));
        }
        left -= given;
        if given == 0 {
            remainders.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            for (_, i) in remainders {
                if left > 0 && out[i] < caps[i] {
                    out[i] += 1;
                    left -= 1;
                }
            }
        }
    }
    out
}

/// `input` restricted to the tokens at `index` (a `grid`-shaped rectangle of it, row-major).
fn sub_input(input: &PruneInput, index: &[usize], grid: Grid) -> Result<PruneInput> {
    let ids = Tensor::from_vec(
        index.iter().map(|&i| i as u32).collect::<Vec<_>>(),
        index.len(),
        input.tokens.device(),
    )?;
    Ok(PruneInput {
        tokens: input.tokens.index_select(&ids, 0)?,
        grid,
        vision: input
            .vision
            .as_ref()
            .map(|v| v.index_select(&ids, 0))
            .transpose()?,
        cls: input.cls.clone(),
        cls_attention: input
            .cls_attention
            .as_ref()
            .map(|a| a.index_select(&ids, 1))
            .transpose()?,
        query: input.query.clone(),
    })
}

/// Each tile's share of the base image's [CLS] attention (mean over heads): a base patch counts
/// for the tile holding the grid token at the same relative place. `None` without attention.
fn tile_saliency(enc: &ImageEncoding, s: &AnyresSignals) -> Result<Option<Vec<f64>>> {
    let Some(att) = &enc.cls_attention else {
        return Ok(None);
    };
    let l = &s.layout;
    if l.rows == 0 || l.cols == 0 {
        return Ok(None);
    }
    // (heads, 1 + grid²) -> (grid²,)
    let per_patch: Vec<f32> = att
        .narrow(1, 1, l.grid * l.grid)?
        .mean(0)?
        .to_dtype(DType::F32)?
        .to_vec1()?;
    let mut score = vec![0f64; s.tiles.0 * s.tiles.1];
    for (p, &a) in per_patch.iter().enumerate() {
        let (i, j) = (p / l.grid, p % l.grid);
        let r = ((i as f64 + 0.5) * l.rows as f64 / l.grid as f64) as usize;
        let c = ((j as f64 + 0.5) * l.cols as f64 / l.grid as f64) as usize;
        let t = s.tile_of[r.min(l.rows - 1) * l.cols + c.min(l.cols - 1)];
        score[t] += a as f64;
    }
    Ok(Some(score))
}

/// Prunes one LLaVA-NeXT image of `len` tokens: its kept rows `(k, text_hidden)` and, for each,
/// its index among the image's packed tokens (increasing).
pub(crate) fn prune(
    enc: &ImageEncoding,
    s: &AnyresSignals,
    query: Option<Tensor>,
    pruner: &dyn Pruner,
    spec: &PruneSpec,
    len: usize,
) -> Result<(Tensor, Vec<usize>)> {
    let l = s.layout;
    let features = &enc.features;
    if features.dim(0)? != l.len() || len != l.len() {
        return Err(Error::Input(format!(
            "the image encoding has {} tokens and its prompt run {len}, its layout {}",
            features.dim(0)?,
            l.len()
        )));
    }
    let (n_base, n_grid) = (l.base, l.rows * l.cols);
    let grid_packed: Vec<usize> = (0..n_grid)
        .map(|i| l.base + (i / l.cols) * (l.cols + 1) + i % l.cols)
        .collect();
    let newlines: Vec<usize> = (0..l.rows)
        .map(|r| l.base + r * (l.cols + 1) + l.cols)
        .collect();
    let base_grid = Grid {
        rows: l.grid,
        cols: l.grid,
    };
    let base_input = clip_input(
        enc,
        features.narrow(0, 0, n_base)?,
        base_grid,
        query.clone(),
    )?;
    let grid_input = PruneInput {
        tokens: Kept::subset(features, grid_packed.clone())?.rows,
        grid: Grid {
            rows: l.rows,
            cols: l.cols,
        },
        vision: Some(s.vision.clone()),
        cls: Some(enc.vision_hidden.get(0)?),
        cls_attention: s.cls_attention.clone(),
        query,
    };
    // Content budget: the image's, less its newline rows; at least one token per part.
    let k = spec
        .budget
        .resolve(len)
        .saturating_sub(l.rows)
        .max(2)
        .min(n_base + n_grid);
    let split = allocate(k, &[n_base as f64, n_grid as f64], &[n_base, n_grid]);
    let (k_base, k_grid) = (split[0].max(1), split[1].max(1));
    // (kept rows, their packed indices) of each part.
    let mut parts: Vec<(Tensor, Vec<usize>)> = Vec::new();
    let base = select(pruner, &base_input, k_base)?;
    parts.push((base.rows, base.index));
    let saliency = match spec.tiles {
        TileBudget::Global => None,
        TileBudget::PerTile => tile_saliency(enc, s)?,
    };
    match saliency {
        None => {
            let kept = select(pruner, &grid_input, k_grid)?;
            let index = kept.index.iter().map(|&i| grid_packed[i]).collect();
            parts.push((kept.rows, index));
        }
        Some(score) => {
            let members: Vec<Vec<usize>> = (0..score.len())
                .map(|t| (0..n_grid).filter(|&i| s.tile_of[i] == t).collect())
                .collect();
            let caps: Vec<usize> = members.iter().map(Vec::len).collect();
            for (t, k_t) in allocate(k_grid, &score, &caps).into_iter().enumerate() {
                let m = &members[t];
                if k_t == 0 {
                    continue;
                }
                // A tile's unpadded part is a rectangle of the grid.
                let rows = m.last().map_or(0, |&i| i / l.cols) - m[0] / l.cols + 1;
                let grid = Grid {
                    rows,
                    cols: m.len() / rows,
                };
                let kept = select(pruner, &sub_input(&grid_input, m, grid)?, k_t)?;
                let index = kept.index.iter().map(|&i| grid_packed[m[i]]).collect();
                parts.push((kept.rows, index));
            }
        }
    }
    let nl = Kept::subset(features, newlines.clone())?;
    parts.push((nl.rows, newlines));
    // Every kept row in packed order.
    let mut index: Vec<usize> = parts.iter().flat_map(|p| p.1.iter().copied()).collect();
    let rows = Tensor::cat(&parts.iter().map(|p| &p.0).collect::<Vec<_>>(), 0)?;
    let mut order: Vec<usize> = (0..index.len()).collect();
    order.sort_by_key(|&i| index[i]);
    let order_t = Tensor::from_vec(
        order.iter().map(|&i| i as u32).collect::<Vec<_>>(),
        order.len(),
        rows.device(),
    )?;
    index = order.iter().map(|&i| index[i]).collect();
    Ok((rows.index_select(&order_t, 0)?, index))
}

#[cfg(test)]
mod tests {
    use super::allocate;

    #[test]
    fn allocate_is_proportional_capped_and_exact() {
        assert_eq!(allocate(10, &[1.0, 1.0], &[100, 100]), vec![5, 5]);
        assert_eq!(allocate(10, &[3.0, 1.0], &[100, 100]), vec![8, 2]);
        // Capped shares go to the others.
        assert_eq!(allocate(10, &[9.0, 1.0], &[4, 100]), vec![4, 6]);
        // Zero weights share uniformly; the total never exceeds the caps.
        assert_eq!(allocate(3, &[0.0, 0.0, 0.0], &[5, 5, 5]), vec![1, 1, 1]);
        assert_eq!(allocate(99, &[1.0, 2.0], &[2, 3]), vec![2, 3]);
        let got = allocate(7, &[0.2, 0.5, 0.3], &[10, 10, 10]);
        assert_eq!(got.iter().sum::<usize>(), 7);
        assert_eq!(got, vec![1, 4, 2]);
    }
}
