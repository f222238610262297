//! Visual-token compression for vision-language models: keep `K` of an image's `N` visual tokens
//! so that prefill, the KV cache and every decode step get cheaper.
//!
//! One small trait, [`Pruner`]: given an image's candidate tokens ([`PruneInput`]: projected tokens,
//! the vision tower's [CLS] signals, the text query) keep `k` of them and return the kept rows with
//! their spatial indices ([`Kept`]). Policies ([`Policy`]):
//!
//! | policy | what it keeps | reference |
//! |---|---|---|
//! | `none` | everything | — |
//! | `random` | a seeded uniform sample | — |
//! | `pool` | `k` means over a uniform partition of the patch grid | — |
//! | `saliency` | top-`k` by [CLS]→patch attention (or [CLS] cosine) | FasterVLM, VisionZip |
//! | `text` | top-`k` by relevance to the question's pre-LLM embeddings | AdaFV (text relevance) |
//! | `mix` | a fixed split (default ½ / ½) of the two rankings | AdaFV (fixed-ratio baseline) |
//! | `adaptive` | the self-adaptive split of the two rankings | AdaFV (self-adaptive mixture) |
//! | `fastv` | inside the LLM: after layer `l`, top-`k` by attention from the last row | FastV |
//! | `hier` | saliency → k-means of important tokens + grid means of the rest | ViSpec (hierarchical) |
//!
//! Every policy but `fastv` runs before the LLM ([`Pruner`]); `fastv` is a prefill strategy
//! ([`fastv::prefill`]). Qwen2-VL prompts go through [`transform_qwen`] / [`prefill_qwen`] (kept
//! tokens keep their 3-D positions). LLaVA-NeXT images are pruned as a base image and a tile grid
//! (`next.rs`: newline rows kept, budget shared globally or per tile, [`TileBudget`]).
//! [`prefill_llava`] does the whole job for a LLaVA model: select, splice the
//! kept rows into the prompt at their original position ids (text after the image keeps its
//! positions too), prefill, and hand back a [`glance_decode::Prefilled`] that any decoder continues.
//!
//! Contracts (tested): a budget of all tokens is exactly a no-op (identical logits); kept indices
//! are sorted, unique and exactly `k`; `adaptive` reduces to `saliency` / `text` when the other
//! signal carries no preference; pruned generation runs end to end on every fixture architecture.

pub mod fastv;
mod internvl;
mod llava;
mod merge;
mod next;
mod policy;
mod qwen;
mod select;
pub mod signals;

pub use internvl::{internvl_input, transform_internvl};
pub use llava::{
    llava_input, prefill, prefill_1d, prefill_llava, transform, transform_1d, FastvCut, PruneStats,
    Pruned, PrunedPrefill,
};
pub use merge::{grid_windows, Hier, Pool};
pub use next::allocate;
pub use policy::{Budget, Policy, PruneSpec, Stage, TileBudget};
pub use qwen::{prefill_qwen, qwen_input, transform_qwen};
pub use select::{adaptive_split, Adaptive, Mix, Random, Saliency, SplitChoice, Text};

use candle_core::{DType, Tensor};
use glance_core::{Error, Result};

/// The patch grid the candidate tokens tile, row-major: token `i` is at row `i / cols`, column
/// `i % cols`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    pub rows: usize,
    pub cols: usize,
}

impl Grid {
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `(row, col)` of token `i`.
    pub fn coords(&self, i: usize) -> (usize, usize) {
        (i / self.cols, i % self.cols)
    }
}

/// One image's candidate visual tokens and the signals policies rank them by. Row `i` of every
/// per-token tensor is the same patch.
#[derive(Debug, Clone)]
pub struct PruneInput {
    /// Projected visual tokens `(n, text_hidden)`: what the LLM would receive.
    pub tokens: Tensor,
    /// The grid the `n` tokens tile.
    pub grid: Grid,
    /// Vision-tower features of the tokens at the feature layer, `(n, vision_hidden)`.
    pub vision: Option<Tensor>,
    /// The vision tower's [CLS] at the same layer, `(vision_hidden,)`.
    pub cls: Option<Tensor>,
    /// [CLS]→token attention probabilities at that layer, `(heads, n)` (the [CLS] column removed).
    pub cls_attention: Option<Tensor>,
    /// The text query's pre-LLM token embeddings `(q, text_hidden)`: the question, or the whole
    /// dialogue in multi-turn use. `None` or zero rows when there is no text.
    pub query: Option<Tensor>,
}

impl PruneInput {
    /// Number of candidate tokens.
    pub fn len(&self) -> Result<usize> {
        Ok(self.tokens.dim(0)?)
    }

    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }
}

/// What a policy keeps: `k` rows for the LLM and, for each, the index of the grid token whose
/// position id it takes.
///
/// A subset policy keeps token rows as they are (`index` = the kept tokens). A merging policy
/// (`pool`, `hier`) returns means of groups of tokens; each merged row takes the index of the group
/// member nearest to the group's spatial centroid (ties: the lowest index) — for a full rectangular
/// window that is its central patch (top-left of centre for even sides). Groups are disjoint, so
/// indices are unique either way.
#[derive(Debug, Clone)]
pub struct Kept {
    /// `(k, text_hidden)`, rows in `index` order.
    pub rows: Tensor,
    /// Strictly increasing token indices `< n`, one per row.
    pub index: Vec<usize>,
}

impl Kept {
    /// The tokens at `index` (any order; duplicates are an error), gathered in spatial order.
    pub fn subset(tokens: &Tensor, mut index: Vec<usize>) -> Result<Self> {
        index.sort_unstable();
        let ids: Vec<u32> = index.iter().map(|&i| i as u32).collect();
        let ids = Tensor::from_vec(ids, index.len(), tokens.device())?;
        Ok(Self {
            rows: tokens.index_select(&ids, 0)?,
            index,
        })
    }

    /// Every token, untouched (the exact no-op).
    pub fn all(tokens: &Tensor) -> Result<Self> {
        Ok(Self {
            rows: tokens.clone(),
            index: (0..tokens.dim(0)?).collect(),
        })
    }

    /// Checks the contract: `k` rows, indices strictly increasing and `< n`.
    pub fn validate(&self, k: usize, n: usize) -> Result<()> {
        let rows = self.rows.dim(0)?;
        let sorted = self.index.windows(2).all(|w| w[0] < w[1]);
        if rows != k
            || self.index.len() != k
            || !sorted
            || self.index.last().is_some_and(|&i| i >= n)
        {
            return Err(Error::InvalidParam(format!(
                "a pruning policy returned {rows} rows and indices {:?} for a budget of {k} of {n}",
                self.index
            )));
        }
        Ok(())
    }
}

/// A visual-token selection policy that runs before the LLM.
pub trait Pruner {
    /// Short name (`saliency`, `adaptive`, …).
    fn name(&self) -> &'static str;

    /// Keeps `k` of the input's `n` tokens, `1 ≤ k < n` (the caller handles `k ≥ n`).
    fn prune(&self, input: &PruneInput, k: usize) -> Result<Kept>;
}

/// Runs `pruner` with the shared rules: `k ≥ n` keeps everything untouched (without calling the
/// policy), `k = 0` is an error, and the result is checked against the [`Kept`] contract.
pub fn select(pruner: &dyn Pruner, input: &PruneInput, k: usize) -> Result<Kept> {
    let n = input.len()?;
    if input.grid.len() != n {
        return Err(Error::InvalidParam(format!(
            "{n} visual tokens do not tile a {}x{} grid",
            input.grid.rows, input.grid.cols
        )));
    }
    if k == 0 {
        return Err(Error::InvalidParam(
            "the visual-token budget must keep at least one token".into(),
        ));
    }
    if k >= n {
        return Kept::all(&input.tokens);
    }
    let kept = pruner.prune(input, k)?;
    kept.validate(k, n)?;
    Ok(kept)
}

/// Indices of the `k` largest scores, ties broken by the lower index (a stable order, so every
/// policy that ranks by a score is deterministic). O(n log n).
pub fn top_k(scores: &[f32], k: usize) -> Vec<usize> {
    let mut order = ranking(scores);
    order.truncate(k);
    order
}

/// All indices by decreasing score, ties by increasing index. NaN ranks last.
pub fn ranking(scores: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    let key = |i: usize| {
        if scores[i].is_nan() {
            f32::NEG_INFINITY
        } else {
            scores[i]
        }
    };
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    order
}

/// A tensor's values as `f32`s (any float dtype, any shape).
pub(crate) fn to_vec_f32(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?)
}
