//! The assembled InternVL model: tiles → InternViT → pixel shuffle → MLP projector → image
//! tokens; prompt ids + image tokens → the prompt plan (1-D positions, as LLaVA).

use super::config::InternVlConfig;
use super::processor::InternPixels;
use super::vision::InternVision;
use crate::checkpoint;
use crate::llava::{plan_1d, Projector, PromptPlan};
use crate::text::TextModel;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use glance_core::{Error, Result};
use glance_nn::weights::layer_norm;
use glance_nn::{CausalLm, LayerNorm, Mode, WeightFormat, WeightLoad};
use std::path::Path;

/// `eps` of the projector's LayerNorm (`nn.LayerNorm`'s default).
const PROJECTOR_NORM_EPS: f64 = 1e-5;

/// Where a checkpoint keeps each part. Published `-hf` checkpoints and transformers 5's saves:
/// `language_model.model.*`, `language_model.lm_head`, `vision_tower.*`,
/// `multi_modal_projector.*`; transformers 4.52–4.57 saved the in-memory names
/// `model.language_model.*`, `lm_head`, `model.vision_tower.*`, `model.multi_modal_projector.*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InternWeightLayout {
    pub text: String,
    pub lm_head: String,
    pub vision: String,
    pub projector: String,
}

impl InternWeightLayout {
    pub fn hub() -> Self {
        Self {
            text: "language_model.model".into(),
            lm_head: "language_model.lm_head".into(),
            vision: "vision_tower".into(),
            projector: "multi_modal_projector".into(),
        }
    }

    /// Finds the spelling a checkpoint uses (unknown layouts: the hub names, so errors name them).
    pub fn detect(vb: &VarBuilder) -> Self {
        if vb.contains_tensor("model.language_model.embed_tokens.weight") {
            Self {
                text: "model.language_model".into(),
                lm_head: "lm_head".into(),
                vision: "model.vision_tower".into(),
                projector: "model.multi_modal_projector".into(),
            }
        } else {
            Self::hub()
        }
    }
}

/// One encoded image.
#[derive(Debug, Clone)]
pub struct InternImageEncoding {
    /// Image tokens `(tiles · tokens_per_tile, text_hidden)`: tile by tile, row-major over each
    /// tile's shuffled grid.
    pub features: Tensor,
    /// The selected vision hidden state per patch, [CLS] dropped, `(tiles · patches,
    /// vision_hidden)`.
    pub vision_hidden: Tensor,
    /// Each tile's [CLS] state at the same layer `(tiles, vision_hidden)`; the last tile is the
    /// thumbnail when there is more than one.
    pub cls: Tensor,
    /// Tiles (grid tiles and the thumbnail).
    pub tiles: usize,
    /// `(columns, rows)` of the tile grid.
    pub grid: (usize, usize),
}

pub struct InternVl {
    config: InternVlConfig,
    vision: InternVision,
    projector_norm: LayerNorm,
    projector: Projector,
    text: TextModel,
}

impl InternVl {
    /// Loads a checkpoint directory in the weight format it records, else f32.
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        let format = checkpoint::recorded_format(dir)?.unwrap_or(WeightFormat::F32);
        Self::load_as(dir, device, format)
    }

    /// Loads with the decoder's linear weights in `format` and the vision tower's and
    /// projector's in [`WeightFormat::companion`] (as [`crate::llava::Llava::load_as`]).
    pub fn load_as(dir: &Path, device: &Device, format: WeightFormat) -> Result<Self> {
        let config = InternVlConfig::from_dir(dir)?;
        checkpoint::check_format(dir, format)?;
        let vb = checkpoint::var_builder(dir, DType::F32, device)?;
        let layout = InternWeightLayout::detect(&vb);
        let mut load = WeightLoad::new(format);
        if device.is_cpu() {
            load = load.with_source(std::sync::Arc::new(checkpoint::MappedTensors::open(dir)?));
        }
        Self::from_var_builder_as(&vb, config, &layout, Mode::Infer, &load)
    }

    /// Builds the model from any `VarBuilder`, weights held as `load` says.
    pub fn from_var_builder_as(
        vb: &VarBuilder,
        config: InternVlConfig,
        layout: &InternWeightLayout,
        mode: Mode,
        load: &WeightLoad,
    ) -> Result<Self> {
        let companion = load.as_format(load.format.companion());
        let vision = InternVision::load(
            &vb.pp(&layout.vision),
            &config.vision,
            config.feature_layer(),
            mode,
            &companion,
        )?;
        let k = config.shuffle();
        let proj_in = config.vision.hidden_size * k * k;
        let pv = vb.pp(&layout.projector);
        let projector_norm = layer_norm(&pv.pp("layer_norm"), proj_in, PROJECTOR_NORM_EPS, mode)?;
        let projector = Projector::load(
            &pv,
            proj_in,
            config.text.hidden_size,
            config.projector_act,
            true,
            &companion,
        )?;
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
            projector_norm,
            projector,
            text,
        })
    }

    pub fn config(&self) -> &InternVlConfig {
        &self.config
    }

    /// The text decoder, as decoding strategies drive it.
    pub fn text(&self) -> &TextModel {
        &self.text
    }

    pub fn vision(&self) -> &InternVision {
        &self.vision
    }

    /// Masks the logits of ids `>= n`: see [`TextModel::limit_vocab`].
    pub fn limit_vocab(&mut self, n: usize) {
        self.text.limit_vocab(n)
    }

    /// Vision tower, pixel shuffle and projector on one pre-processed image.
    pub fn encode_image(&self, pixels: &InternPixels) -> Result<InternImageEncoding> {
        let c = &self.config;
        let last = c.vision_feature_layer == -1;
        let out = self
            .vision
            .forward(&pixels.tiles, c.feature_layer(), last)?;
        // (tiles, 1 + g·g, C) -> (tiles, g·g, C)
        let (n, t, ch) = out.features.dims3()?;
        let skip = usize::from(c.drop_cls);
        let feats = out.features.narrow(1, skip, t - skip)?;
        let g = c.vision.grid();
        if g * g != t - skip {
            return Err(Error::Config(format!(
                "{} vision tokens per tile do not form the {g}x{g} grid the pixel shuffle needs",
                t - skip
            )));
        }
        let vision_hidden = feats.reshape((n * g * g, ch))?;
        let cls = out.features.narrow(1, 0, 1)?.reshape((n, ch))?;
        let shuffled = pixel_shuffle(&feats.reshape((n, g, g, ch))?, c.shuffle())?;
        let tokens = self
            .projector
            .forward(&self.projector_norm.forward(&shuffled)?)?;
        Ok(InternImageEncoding {
            features: tokens,
            vision_hidden,
            cls,
            tiles: n,
            grid: pixels.grid,
        })
    }

    /// The plan of a prompt: `ids` with each image's placeholder expanded to its token count and
    /// `images` in prompt order; every row at its own index.
    pub fn plan(&self, ids: &[u32], images: &[&InternImageEncoding]) -> Result<PromptPlan> {
        let image_id = self.config.image_token_id;
        let placeholders = ids.iter().filter(|&&i| i == image_id).count();
        let features: Vec<&Tensor> = images.iter().map(|e| &e.features).collect();
        let mut total = 0;
        for f in &features {
            total += f.dim(0)?;
        }
        if placeholders != total {
            return Err(Error::Input(format!(
                "the prompt has {placeholders} image-token positions but its {} image(s) give \
                 {total} tokens",
                images.len()
            )));
        }
        plan_1d(&self.text, image_id, ids, &features)
    }

    /// Logits of every prompt row `(t, vocab)`, one uncached pass.
    pub fn prompt_logits(&self, ids: &[u32], images: &[&InternImageEncoding]) -> Result<Tensor> {
        let plan = self.plan(ids, images)?;
        let hidden = self.text.forward_uncached(
            &plan.rows()?,
            &plan.positions(),
            &glance_nn::AttnMask::causal(),
        )?;
        self.text.logits(&hidden)
    }
}

/// transformers' `InternVLModel.pixel_shuffle` with `scale_factor = 1 / k`, flattened:
/// `(n, g, g, C)` (patch rows, patch columns) → `(n · (g/k)², k² · C)`, tokens row-major over
/// the `(g/k) × (g/k)` grid. Each token holds a `k × k` block of patches: transformers merges `k`
/// adjacent columns into the channels first, then `k` adjacent rows, so a token's values run
/// over (column offset, row offset, channel).
pub fn pixel_shuffle(x: &Tensor, k: usize) -> Result<Tensor> {
    let (n, g, _, c) = x.dims4()?;
    let h = g / k;
    // (n, g, g, C) -> (n, g, g/k, kC): merge k adjacent columns.
    let x = x.reshape((n, g, h, k * c))?;
    // -> (n, g/k, g, kC) -> (n, g/k, g/k, k²C): merge k adjacent rows.
    let x = x
        .transpose(1, 2)?
        .contiguous()?
        .reshape((n, h, h, k * k * c))?;
    // -> (n, g/k [rows], g/k [cols], k²C)
    let x = x.transpose(1, 2)?.contiguous()?;
    Ok(x.reshape((n * h * h, k * k * c))?)
}
