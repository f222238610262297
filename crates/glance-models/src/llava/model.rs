//! The assembled LLaVA model: image → projected tokens; prompt ids + image tokens → embeddings for
//! the text decoder.

use super::config::{FeatureSelect, LlavaConfig};
use super::projector::Projector;
use super::vision::ClipVision;
use crate::checkpoint;
use crate::text::TextModel;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use glance_core::Result;
use glance_nn::{Mode, WeightFormat, WeightLoad};
use std::path::Path;

/// Where a checkpoint keeps each part (weight-name prefixes; see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightLayout {
    pub text: String,
    pub lm_head: String,
    pub vision: String,
    pub projector: String,
    /// LLaVA-NeXT's `image_newline` tensor.
    pub newline: String,
}

impl WeightLayout {
    /// The layout of checkpoints on the Hugging Face hub (llava-hf/*), which transformers of every
    /// version loads. glance writes new checkpoints this way.
    pub fn hub() -> Self {
        Self {
            text: "language_model.model".into(),
            lm_head: "language_model.lm_head".into(),
            vision: "vision_tower.vision_model".into(),
            projector: "multi_modal_projector".into(),
            newline: "image_newline".into(),
        }
    }

    /// Finds the spelling a checkpoint uses. transformers ≥ 4.52 nests everything under `model.`
    /// in memory; transformers 5 saves the text part in hub spelling but drops the vision tower's
    /// `vision_model.` level. Unknown layouts fall back to the hub names, so errors name those.
    pub fn detect(vb: &VarBuilder) -> Self {
        let has = |p: &str, leaf: &str| vb.contains_tensor(&format!("{p}.{leaf}"));
        let mut l = if has("model.language_model", "embed_tokens.weight") {
            Self {
                text: "model.language_model".into(),
                lm_head: "lm_head".into(),
                vision: "model.vision_tower.vision_model".into(),
                projector: "model.multi_modal_projector".into(),
                newline: "model.image_newline".into(),
            }
        } else {
            Self::hub()
        };
        let vision_candidates = [
            "vision_tower.vision_model",
            "vision_tower",
            "model.vision_tower.vision_model",
            "model.vision_tower",
        ];
        if let Some(v) = vision_candidates
            .iter()
            .find(|p| has(p, "embeddings.class_embedding"))
        {
            l.vision = v.to_string();
        }
        if let Some(n) = ["image_newline", "model.image_newline"]
            .into_iter()
            .find(|n| vb.contains_tensor(n))
        {
            l.newline = n.into();
        }
        if !has(&l.lm_head, "weight") && has("lm_head", "weight") {
            l.lm_head = "lm_head".into();
        }
        l
    }
}

/// One image after the vision tower and projector.
#[derive(Debug, Clone)]
pub struct ImageEncoding {
    /// Projected image tokens `(n_image_tokens, text_hidden)`, in spatial order ([CLS] first under
    /// the `full` strategy).
    pub features: Tensor,
    /// Vision hidden state at the deepest feature layer, `(1 + patches, vision_hidden)`, [CLS] first.
    pub vision_hidden: Tensor,
    /// [CLS]→token attention at that layer, `(heads, 1 + patches)`.
    pub cls_attention: Option<Tensor>,
    /// LLaVA-NeXT: where the packed tokens lie and the tiles' own signals (the fields above are
    /// the base image's). `None` for LLaVA-1.5.
    pub anyres: Option<super::next::AnyresSignals>,
}

pub struct Llava {
    config: LlavaConfig,
    vision: ClipVision,
    projector: Projector,
    text: TextModel,
    /// LLaVA-NeXT: the `(text_hidden,)` row closing each row of an image's tile grid.
    image_newline: Option<Tensor>,
}

impl Llava {
    /// Loads a checkpoint directory (config.json + safetensors) with its weights in the format
    /// the directory records ([`checkpoint::recorded_format`]: a `glance quantize` output), else
    /// in f32.
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        let format = checkpoint::recorded_format(dir)?.unwrap_or(WeightFormat::F32);
        Self::load_as(dir, device, format)
    }

    /// Loads a checkpoint directory with the text decoder's linear weights in `format` and the
    /// vision tower's and projector's in [`WeightFormat::companion`] (f32 for f32, else a 16-bit
    /// float: the anchors quantize the language model only). Weights the file already stores in
    /// the wanted 16-bit dtype are used in place from the memory-mapped file.
    /// A directory written by `glance quantize` loads in the format it records only
    /// ([`checkpoint::check_format`]).
    pub fn load_as(dir: &Path, device: &Device, format: WeightFormat) -> Result<Self> {
        let config = LlavaConfig::from_dir(dir)?;
        checkpoint::check_format(dir, format)?;
        let vb = checkpoint::var_builder(dir, DType::F32, device)?;
        let layout = WeightLayout::detect(&vb);
        let mut load = WeightLoad::new(format);
        // The tensors as stored: 16-bit weights used in place, packed ones read as they are (and
        // a checkpoint of packed weights refused by name in any other format).
        if device.is_cpu() {
            load = load.with_source(std::sync::Arc::new(checkpoint::MappedTensors::open(dir)?));
        }
        Self::from_var_builder_as(&vb, config, &layout, Mode::Infer, &load)
    }

    /// Builds the model from any `VarBuilder` (a checkpoint, or a `VarMap` when training).
    pub fn from_var_builder(
        vb: &VarBuilder,
        config: LlavaConfig,
        layout: &WeightLayout,
        mode: Mode,
    ) -> Result<Self> {
        Self::from_var_builder_as(vb, config, layout, mode, &WeightLoad::f32())
    }

    /// [`Llava::from_var_builder`] with the weights held as `load` says (see [`Llava::load_as`]).
    pub fn from_var_builder_as(
        vb: &VarBuilder,
        config: LlavaConfig,
        layout: &WeightLayout,
        mode: Mode,
        load: &WeightLoad,
    ) -> Result<Self> {
        let companion = load.as_format(load.format.companion());
        let deepest = *config
            .feature_layers
            .iter()
            .max()
            .expect("config validated: non-empty");
        let vision = ClipVision::load_as(
            &vb.pp(&layout.vision),
            &config.vision,
            deepest,
            mode,
            &companion,
        )?;
        let proj_in = config.vision.hidden_size * config.feature_layers.len();
        let projector = Projector::load(
            &vb.pp(&layout.projector),
            proj_in,
            config.text.hidden_size,
            config.projector_hidden_act,
            config.projector_bias,
            &companion,
        )?;
        let text = TextModel::load_as(
            &vb.pp(&layout.text),
            &vb.pp(&layout.lm_head),
            &config.text,
            mode,
            load,
        )?;
        let image_newline = if config.is_next() {
            Some(glance_nn::weights::param(
                vb,
                config.text.hidden_size,
                &layout.newline,
            )?)
        } else {
            None
        };
        Ok(Self {
            config,
            vision,
            projector,
            text,
            image_newline,
        })
    }

    pub fn config(&self) -> &LlavaConfig {
        &self.config
    }

    /// The text decoder, as decoding strategies drive it.
    pub fn text(&self) -> &TextModel {
        &self.text
    }

    /// Masks the logits of ids `>= n`: see [`TextModel::limit_vocab`].
    pub fn limit_vocab(&mut self, n: usize) {
        self.text.limit_vocab(n)
    }

    pub fn vision(&self) -> &ClipVision {
        &self.vision
    }

    pub fn projector(&self) -> &Projector {
        &self.projector
    }

    /// LLaVA-NeXT's newline row `(text_hidden,)`; `None` for LLaVA-1.5.
    pub fn image_newline(&self) -> Option<&Tensor> {
        self.image_newline.as_ref()
    }

    /// Vision tower + feature selection + projector for one image, `pixels` `(3, H, W)`.
    /// LLaVA-NeXT images are tiled first: see [`Llava::encode_anyres`] and
    /// [`Llava::encode_picture`].
    pub fn encode_image(&self, pixels: &Tensor) -> Result<ImageEncoding> {
        if self.config.is_next() {
            return Err(glance_core::Error::InvalidParam(
                "a LLaVA-NeXT image is tiled before encoding: use encode_anyres / encode_picture"
                    .into(),
            ));
        }
        let tower = self.encode_tower(pixels)?;
        Ok(ImageEncoding {
            features: self.projector.forward(&tower.features)?,
            vision_hidden: tower.vision_hidden,
            cls_attention: tower.cls_attention,
            anyres: None,
        })
    }

    /// Vision tower + feature selection for one image: an [`ImageEncoding`] whose `features` are
    /// the selected tower features `(n_image_tokens, vision_hidden · n_feature_layers)`, before
    /// the projector.
    pub fn encode_tower(&self, pixels: &Tensor) -> Result<ImageEncoding> {
        let out = self.vision.forward(pixels, &self.config.feature_layers)?;
        // (1 + patches, vision_hidden · n_layers)
        let feats = Tensor::cat(&out.hidden_states, 1)?;
        let feats = match self.config.feature_select {
            FeatureSelect::Default => feats.narrow(0, 1, feats.dim(0)? - 1)?,
            FeatureSelect::Full => feats,
        };
        let deepest_pos = self
            .config
            .feature_layers
            .iter()
            .enumerate()
            .max_by_key(|(_, &l)| l)
            .map(|(i, _)| i)
            .unwrap_or(0);
        Ok(ImageEncoding {
            features: feats,
            vision_hidden: out.hidden_states[deepest_pos].clone(),
            cls_attention: out.cls_attention,
            anyres: None,
        })
    }

    /// Prompt embeddings `(t, text_hidden)`: token embeddings with every run of image-token rows
    /// replaced by the next image's features, in order (the rows of [`Llava::plan`]).
    pub fn embed_prompt(&self, ids: &[u32], images: &[&Tensor]) -> Result<Tensor> {
        self.plan(ids, images)?.rows()
    }
}
