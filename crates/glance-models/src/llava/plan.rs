//! The prompt plan: the rows a prefill runs, built once from the expanded token ids and the
//! projected image features.
//!
//! A plan is a list of segments in prompt order — runs of text rows and one segment per image —
//! each with its embedding rows and the position id of every row. Building it is one step;
//! visual-token pruning is a transformation of it (it replaces an image segment's rows and
//! positions with the kept ones, positions preserved); the prefill runs its rows. Nothing in it is
//! computed twice: the rows handed to the decoder are the rows built here.

use super::model::Llava;
use candle_core::Tensor;
use glance_core::{Error, Result};
use glance_nn::CausalLm;
use std::ops::Range;

/// What a segment holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentKind {
    /// Token embeddings of a run of text (and special) tokens.
    Text,
    /// The projected features of image `index` (in prompt order), possibly pruned.
    Image { index: usize },
}

/// A run of prompt rows.
#[derive(Debug, Clone)]
pub struct Segment {
    pub kind: SegmentKind,
    /// `(rows, text_hidden)`.
    pub rows: Tensor,
    /// Position id of each row (`rows.dim(0)` of them). With M-RoPE (`mrope` set), each row's
    /// largest part (`qwen2_vl::largest_part`): its position on text rows.
    pub positions: Vec<u32>,
    /// M-RoPE models (Qwen2-VL): each row's `(temporal, height, width)` position. Image rows
    /// turn at their place in the image grid; pruning keeps a kept row's own three parts.
    /// `None`: the rows turn at `positions` (three equal parts).
    pub mrope: Option<Vec<[u32; 3]>>,
    /// The token ids this segment stands for (indices into [`PromptPlan::ids`]).
    pub source: Range<usize>,
}

/// The rows of one prompt, segment by segment, in prompt order.
#[derive(Debug, Clone)]
pub struct PromptPlan {
    /// The expanded token ids the plan was built from (one image-token id per visual token).
    pub ids: Vec<u32>,
    pub segments: Vec<Segment>,
}

impl PromptPlan {
    /// Rows the decoder will run.
    pub fn len(&self) -> usize {
        self.segments.iter().map(|s| s.positions.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All rows `(len, text_hidden)` in prompt order.
    pub fn rows(&self) -> Result<Tensor> {
        let parts: Vec<&Tensor> = self.segments.iter().map(|s| &s.rows).collect();
        match parts.as_slice() {
            [] => Err(Error::Input("the prompt is empty".into())),
            [one] => Ok((*one).clone()),
            _ => Ok(Tensor::cat(&parts, 0)?),
        }
    }

    /// Position ids of all rows, in prompt order.
    pub fn positions(&self) -> Vec<u32> {
        self.segments
            .iter()
            .flat_map(|s| s.positions.iter().copied())
            .collect()
    }

    /// Three-part positions of all rows in prompt order when any segment has them (M-RoPE
    /// models), rows without them at three equal parts; `None` for 1-D models.
    pub fn mrope_positions(&self) -> Option<Vec<[u32; 3]>> {
        if self.segments.iter().all(|s| s.mrope.is_none()) {
            return None;
        }
        Some(
            self.segments
                .iter()
                .flat_map(|s| match &s.mrope {
                    Some(m) => m.clone(),
                    None => s.positions.iter().map(|&p| [p, p, p]).collect(),
                })
                .collect(),
        )
    }

    /// Visual tokens of the prompt before any pruning.
    pub fn visual_tokens(&self) -> usize {
        self.segments
            .iter()
            .filter(|s| matches!(s.kind, SegmentKind::Image { .. }))
            .map(|s| s.source.len())
            .sum()
    }

    /// For each image, in prompt order, the indices of its rows among [`rows`](Self::rows).
    pub fn image_rows(&self) -> Vec<Vec<usize>> {
        let mut out = Vec::new();
        let mut at = 0;
        for s in &self.segments {
            let n = s.positions.len();
            if let SegmentKind::Image { .. } = s.kind {
                out.push((at..at + n).collect());
            }
            at += n;
        }
        out
    }
}

impl Llava {
    /// The plan of a prompt: `ids` with every image placeholder expanded (one image-token id per
    /// visual token) and `images` the projected features `(n_i, text_hidden)` of each image in
    /// prompt order; the runs of image tokens take the images in order, `n_i` rows each (adjacent
    /// images share one run). Text runs are embedded here, once.
    pub fn plan(&self, ids: &[u32], images: &[&Tensor]) -> Result<PromptPlan> {
        let image_id = self.config().image_token_id;
        let placeholders = ids.iter().filter(|&&i| i == image_id).count();
        let mut features = 0;
        for f in images {
            features += f.dim(0)?;
        }
        if placeholders != features {
            let each = if self.config().is_next() {
                "tokens by their sizes".to_string()
            } else {
                format!("{} tokens", self.config().image_tokens_per_image())
            };
            return Err(Error::Input(format!(
                "the prompt has {placeholders} image-token positions but the images give {features} \
                 features ({} image(s) of {each})",
                images.len(),
            )));
        }
        plan_1d(self.text(), image_id, ids, images)
    }
}

/// The plan of a prompt for a model with 1-D positions (every row at its index): `ids` with every
/// image placeholder expanded to `image_id` tokens and `images` the projected features
/// `(n_i, text_hidden)` of each image in prompt order; the runs of image tokens take the images in
/// order, `n_i` rows each (adjacent images share one run). Text runs are embedded here, once.
pub fn plan_1d(
    text: &crate::text::TextModel,
    image_id: u32,
    ids: &[u32],
    images: &[&Tensor],
) -> Result<PromptPlan> {
    let mut segments = Vec::with_capacity(2 * images.len() + 1);
    let mut next_image = 0;
    let mut i = 0;
    while i < ids.len() {
        let is_image = ids[i] == image_id;
        let end = i + ids[i..]
            .iter()
            .take_while(|&&x| (x == image_id) == is_image)
            .count();
        if !is_image {
            segments.push(Segment {
                kind: SegmentKind::Text,
                rows: text.embed_tokens(&ids[i..end])?,
                positions: (i as u32..end as u32).collect(),
                mrope: None,
                source: i..end,
            });
        }
        // A run of image tokens holds the next images, each `features.dim(0)` rows long.
        let mut at = i;
        while is_image && at < end {
            let f = images.get(next_image).ok_or_else(|| {
                Error::Input(format!(
                    "the prompt has more image tokens than its {} image(s) give",
                    images.len()
                ))
            })?;
            let n = f.dim(0)?;
            if n == 0 || at + n > end {
                return Err(Error::Input(format!(
                    "image {next_image} has {n} features but its run of image tokens holds {}",
                    end - at
                )));
            }
            segments.push(Segment {
                kind: SegmentKind::Image { index: next_image },
                rows: (*f).clone(),
                positions: (at as u32..(at + n) as u32).collect(),
                mrope: None,
                source: at..at + n,
            });
            next_image += 1;
            at += n;
        }
        i = end;
    }
    if next_image != images.len() {
        return Err(Error::Input(format!(
            "the prompt has image tokens for {next_image} image(s) but {} were given",
            images.len()
        )));
    }
    Ok(PromptPlan {
        ids: ids.to_vec(),
        segments,
    })
}
