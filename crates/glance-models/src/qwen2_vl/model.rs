//! The assembled Qwen2-VL / Qwen2.5-VL model: patch rows → merged image tokens; prompt ids +
//! image tokens → the prompt plan, each row with its 3-D (M-RoPE) position.

use super::config::Qwen2VlConfig;
use super::processor::QwenPixels;
use super::vision::{QwenVision, QwenVisionOutput};
use crate::checkpoint;
use crate::llava::{PromptPlan, Segment, SegmentKind};
use crate::text::TextModel;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use glance_core::{Error, Result};
use glance_nn::{CausalLm, Mode, WeightFormat, WeightLoad};
use std::path::Path;

/// Where a checkpoint keeps each part. Published checkpoints and transformers 5's saves use
/// `model.*` (decoder), `visual.*`, `lm_head`; transformers 5 in memory (and some re-saves)
/// `model.language_model.*`, `model.visual.*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QwenWeightLayout {
    pub text: String,
    pub lm_head: String,
    pub vision: String,
}

impl QwenWeightLayout {
    pub fn hub() -> Self {
        Self {
            text: "model".into(),
            lm_head: "lm_head".into(),
            vision: "visual".into(),
        }
    }

    /// Finds the spelling a checkpoint uses (unknown layouts: the hub names, so errors name them).
    pub fn detect(vb: &VarBuilder) -> Self {
        let mut l = Self::hub();
        if vb.contains_tensor("model.language_model.embed_tokens.weight") {
            l.text = "model.language_model".into();
        }
        if vb.contains_tensor("model.visual.patch_embed.proj.weight") {
            l.vision = "model.visual".into();
        }
        l
    }
}

/// Where one image sits in the prompt's M-RoPE positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageGrid {
    /// `image_grid_thw` in patches.
    pub thw: [usize; 3],
    /// The spatial merge size (2): tokens are `(h / merge) × (w / merge)`.
    pub merge: usize,
}

impl ImageGrid {
    /// Merged tokens `(rows, cols)` of the image in the prompt.
    pub fn tokens_hw(&self) -> (usize, usize) {
        (self.thw[1] / self.merge, self.thw[2] / self.merge)
    }

    pub fn tokens(&self) -> usize {
        let (h, w) = self.tokens_hw();
        self.thw[0] * h * w
    }
}

/// transformers' `get_rope_index` for images: text rows count up from 0; an image's tokens sit
/// at `(start, start + row, start + col)` on its merged grid; the text after it continues at
/// `start + max(rows, cols)`. `ids` hold one `image_token_id` per image token; the runs of them
/// take `grids` in order (an image per `tokens()` of a run). Returns the positions and
/// transformers' `rope_deltas` (largest position + 1 − rows): generated token `k` (0-based) sits
/// at `rows + k + delta`.
pub fn rope_index(
    ids: &[u32],
    image_token_id: u32,
    grids: &[ImageGrid],
) -> Result<(Vec<[u32; 3]>, i64)> {
    let mut out = Vec::with_capacity(ids.len());
    let mut pos: u32 = 0;
    let mut next = 0;
    let mut i = 0;
    while i < ids.len() {
        if ids[i] != image_token_id {
            out.push([pos; 3]);
            pos += 1;
            i += 1;
            continue;
        }
        let grid = grids.get(next).ok_or_else(|| {
            Error::Input(format!(
                "the prompt has more image tokens than its {} image(s) give",
                grids.len()
            ))
        })?;
        let (h, w) = grid.tokens_hw();
        let n = grid.tokens();
        let run = ids[i..]
            .iter()
            .take_while(|&&x| x == image_token_id)
            .count();
        if n == 0 || n > run || grid.thw[0] != 1 {
            return Err(Error::Input(format!(
                "image {next} ({:?} patches) needs {n} image tokens but its run holds {run}",
                grid.thw
            )));
        }
        for y in 0..h as u32 {
            for x in 0..w as u32 {
                out.push([pos, pos + y, pos + x]);
            }
        }
        pos += h.max(w) as u32;
        next += 1;
        i += n;
    }
    if next != grids.len() {
        return Err(Error::Input(format!(
            "the prompt has image tokens for {next} image(s) but {} were given",
            grids.len()
        )));
    }
    let largest = out
        .iter()
        .map(|p| p[0].max(p[1]).max(p[2]))
        .max()
        .unwrap_or(0);
    let delta = if out.is_empty() {
        0
    } else {
        largest as i64 + 1 - out.len() as i64
    };
    Ok((out, delta))
}

/// The scalar position glance keeps for a row with M-RoPE position `p`: its largest part. On text
/// rows that is the position itself; on an image's last row it is `start + max(rows, cols) - 1`,
/// so decoding after a prompt that ends with image tokens continues where transformers does
/// (`rope_deltas`: the largest position + 1). Different images' rows and text rows never share one.
pub fn largest_part(p: &[u32; 3]) -> u32 {
    p[0].max(p[1]).max(p[2])
}

/// One encoded image.
#[derive(Debug, Clone)]
pub struct QwenImageEncoding {
    /// Merged tokens `(tokens, text_hidden)`, row-major over the merged grid.
    pub features: Tensor,
    /// The last vision block's output per patch `(grid_h · grid_w, vision_width)`.
    pub vision_hidden: Tensor,
    pub grid: ImageGrid,
}

pub struct Qwen2Vl {
    config: Qwen2VlConfig,
    vision: QwenVision,
    text: TextModel,
}

impl Qwen2Vl {
    /// Loads a checkpoint directory in the weight format it records, else f32.
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        let format = checkpoint::recorded_format(dir)?.unwrap_or(WeightFormat::F32);
        Self::load_as(dir, device, format)
    }

    /// Loads with the decoder's linear weights in `format` and the vision tower's in
    /// [`WeightFormat::companion`] (as [`crate::llava::Llava::load_as`]).
    pub fn load_as(dir: &Path, device: &Device, format: WeightFormat) -> Result<Self> {
        let config = Qwen2VlConfig::from_dir(dir)?;
        checkpoint::check_format(dir, format)?;
        let vb = checkpoint::var_builder(dir, DType::F32, device)?;
        let layout = QwenWeightLayout::detect(&vb);
        let mut load = WeightLoad::new(format);
        if device.is_cpu() {
            load = load.with_source(std::sync::Arc::new(checkpoint::MappedTensors::open(dir)?));
        }
        Self::from_var_builder_as(&vb, config, &layout, Mode::Infer, &load)
    }

    /// Builds the model from any `VarBuilder`, weights held as `load` says.
    pub fn from_var_builder_as(
        vb: &VarBuilder,
        config: Qwen2VlConfig,
        layout: &QwenWeightLayout,
        mode: Mode,
        load: &WeightLoad,
    ) -> Result<Self> {
        let companion = load.as_format(load.format.companion());
        let vision = QwenVision::load(&vb.pp(&layout.vision), &config.vision, mode, &companion)?;
        let text = TextModel::load_as(
            &vb.pp(&layout.text),
            &vb.pp(&layout.lm_head),
            &config.text,
            mode,
            load,
        )?;
        Ok(Self {
            config,
            vision,
            text,
        })
    }

    pub fn config(&self) -> &Qwen2VlConfig {
        &self.config
    }

    /// The text decoder, as decoding strategies drive it.
    pub fn text(&self) -> &TextModel {
        &self.text
    }

    pub fn vision(&self) -> &QwenVision {
        &self.vision
    }

    /// Masks the logits of ids `>= n`: see [`TextModel::limit_vocab`].
    pub fn limit_vocab(&mut self, n: usize) {
        self.text.limit_vocab(n)
    }

    /// The vision tower and merger on one pre-processed image.
    pub fn encode_image(&self, pixels: &QwenPixels) -> Result<QwenImageEncoding> {
        let QwenVisionOutput { features, hidden } =
            self.vision.forward(&pixels.patches, pixels.grid_thw)?;
        Ok(QwenImageEncoding {
            features,
            vision_hidden: hidden,
            grid: ImageGrid {
                thw: pixels.grid_thw,
                merge: self.config.vision.spatial_merge_size,
            },
        })
    }

    /// The plan of a prompt: `ids` with each image's placeholder expanded to its token count and
    /// `images` in prompt order. Every row carries its M-RoPE position ([`rope_index`]); the
    /// scalar positions are each row's largest part ([`largest_part`]).
    pub fn plan(&self, ids: &[u32], images: &[&QwenImageEncoding]) -> Result<PromptPlan> {
        let image_id = self.config.image_token_id;
        if ids.contains(&self.config.video_token_id) {
            return Err(Error::Input(
                "video input is not supported: glance runs Qwen2-VL on images only".into(),
            ));
        }
        let grids: Vec<ImageGrid> = images.iter().map(|e| e.grid).collect();
        let (mrope, _) = rope_index(ids, image_id, &grids)?;
        for (k, e) in images.iter().enumerate() {
            if e.features.dim(0)? != e.grid.tokens() {
                return Err(Error::Input(format!(
                    "image {k} has {} features for a grid of {} tokens",
                    e.features.dim(0)?,
                    e.grid.tokens()
                )));
            }
        }
        let text = self.text();
        let mut segments = Vec::with_capacity(2 * images.len() + 1);
        let mut next = 0;
        let mut i = 0;
        while i < ids.len() {
            if ids[i] == image_id {
                let e = images[next];
                let n = e.grid.tokens();
                let m = mrope[i..i + n].to_vec();
                segments.push(Segment {
                    kind: SegmentKind::Image { index: next },
                    rows: e.features.clone(),
                    positions: m.iter().map(largest_part).collect(),
                    mrope: Some(m),
                    source: i..i + n,
                });
                next += 1;
                i += n;
                continue;
            }
            let end = i + ids[i..].iter().take_while(|&&x| x != image_id).count();
            segments.push(Segment {
                kind: SegmentKind::Text,
                rows: text.embed_tokens(&ids[i..end])?,
                positions: mrope[i..end].iter().map(largest_part).collect(),
                mrope: None,
                source: i..end,
            });
            i = end;
        }
        Ok(PromptPlan {
            ids: ids.to_vec(),
            segments,
        })
    }

    /// Logits of every prompt row `(t, vocab)` (ids the tokenizer lacks masked as
    /// [`TextModel::limit_vocab`] says), one uncached pass.
    pub fn prompt_logits(&self, ids: &[u32], images: &[&QwenImageEncoding]) -> Result<Tensor> {
        let plan = self.plan(ids, images)?;
        let rows = plan.rows()?;
        let positions = plan
            .mrope_positions()
            .unwrap_or_else(|| plan.positions().iter().map(|&p| [p; 3]).collect());
        let hidden =
            self.text
                .forward_uncached_mrope(&rows, &positions, &glance_nn::AttnMask::causal())?;
        self.text.logits(&hidden)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_index_places_images_on_their_grid_and_continues_after_the_longest_side() {
        let grid = ImageGrid {
            thw: [1, 4, 6],
            merge: 2,
        };
        // text, text, 6 image tokens (2 x 3), text
        let ids = [5, 6, 9, 9, 9, 9, 9, 9, 7];
        let (p, delta) = rope_index(&ids, 9, &[grid]).unwrap();
        assert_eq!(&p[..2], &[[0, 0, 0], [1, 1, 1]]);
        assert_eq!(&p[2..5], &[[2, 2, 2], [2, 2, 3], [2, 2, 4]]);
        assert_eq!(p[5], [2, 3, 2]);
        assert_eq!(p[8], [5, 5, 5]); // 2 + max(2, 3)
        assert_eq!(delta, 6 - 9);
        assert!(rope_index(&ids, 9, &[]).is_err());
        assert!(rope_index(&ids[..5], 9, &[grid]).is_err());
    }
}
