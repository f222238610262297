//! Typed mirror of a LLaVA `config.json` with HF defaults.

use crate::checkpoint::read_json;
use crate::text::TextConfig;
use crate::text::{positive_below_one, size_in_range};
use glance_core::{Error, Result};
use glance_nn::Activation;
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// Which vision tokens feed the projector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeatureSelect {
    /// Drop [CLS]: `(image_size / patch_size)²` tokens.
    Default,
    /// Keep [CLS] as the first token.
    Full,
}

/// CLIP vision tower configuration (`CLIPVisionConfig`).
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct VisionConfig {
    pub model_type: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_channels: usize,
    pub image_size: usize,
    pub patch_size: usize,
    pub hidden_act: Activation,
    pub layer_norm_eps: f64,
}

impl Default for VisionConfig {
    /// `CLIPVisionConfig()`'s defaults (ViT-B/32).
    fn default() -> Self {
        Self {
            model_type: "clip_vision_model".into(),
            hidden_size: 768,
            intermediate_size: 3072,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            num_channels: 3,
            image_size: 224,
            patch_size: 32,
            hidden_act: Activation::QuickGelu,
            layer_norm_eps: 1e-5,
        }
    }
}

impl VisionConfig {
    /// What `LlavaConfig` uses when `vision_config` is absent (CLIP ViT-L/14-336).
    fn llava_default() -> Self {
        Self {
            hidden_size: 1024,
            intermediate_size: 4096,
            num_hidden_layers: 24,
            num_attention_heads: 16,
            image_size: 336,
            patch_size: 14,
            ..Self::default()
        }
    }

    /// Checks sizes and `layer_norm_eps` for values no CLIP tower has (zero or absurd sizes, a
    /// channel count other than RGB's 3, a non-positive epsilon), naming the field and value.
    pub fn validate(&self) -> Result<()> {
        for (field, value, max) in [
            ("hidden_size", self.hidden_size, 1 << 16),
            ("intermediate_size", self.intermediate_size, 1 << 18),
            ("num_hidden_layers", self.num_hidden_layers, 1024),
            ("num_attention_heads", self.num_attention_heads, 1 << 10),
            (
                "image_size",
                self.image_size,
                crate::processing::image::MAX_CONFIG_SIDE,
            ),
            ("patch_size", self.patch_size, self.image_size.max(1)),
        ] {
            size_in_range(&format!("vision_config.{field}"), value, max)?;
        }
        if self.num_channels != 3 {
            return Err(Error::Config(format!(
                "vision_config.num_channels must be 3 (RGB), got {}",
                self.num_channels
            )));
        }
        positive_below_one("vision_config.layer_norm_eps", self.layer_norm_eps)
    }

    /// Patches per side.
    pub fn grid(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Patch tokens (without [CLS]).
    pub fn num_patches(&self) -> usize {
        self.grid() * self.grid()
    }
}

/// A resolved LLaVA configuration.
#[derive(Debug, Clone)]
pub struct LlavaConfig {
    pub vision: VisionConfig,
    pub text: TextConfig,
    pub image_token_id: u32,
    pub projector_hidden_act: Activation,
    pub projector_bias: bool,
    pub feature_select: FeatureSelect,
    /// Indices into the vision tower's hidden-state tuple (normalised to be ≥ 0); several are
    /// concatenated along the feature dimension.
    pub feature_layers: Vec<usize>,
    /// Set on a model converted for block-diffusion decoding (`glance train diffusion`).
    pub block_diffusion: Option<BlockDiffusionConfig>,
    /// LLaVA-NeXT (`llava_next`): the `image_grid_pinpoints`, each `[height, width]` in pixels
    /// (multiples of `vision.image_size`). `None`: LLaVA-1.5, one fixed-size image per picture.
    pub grid_pinpoints: Option<Vec<[usize; 2]>>,
}

/// `LlavaNextConfig`'s default `image_grid_pinpoints`.
pub const DEFAULT_PINPOINTS: [[usize; 2]; 5] =
    [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]];

/// The `block_diffusion` entry of a converted model's `config.json` (glance's own key; Hugging
/// Face loaders ignore it): the mask token the conversion trained, and the block size decoding
/// uses unless told otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BlockDiffusionConfig {
    pub mask_token_id: u32,
    #[serde(default = "default_block")]
    pub block_size: usize,
    /// Block sizes the conversion trained (informational).
    #[serde(default)]
    pub trained_block_sizes: Vec<usize>,
}

fn default_block() -> usize {
    8
}

#[derive(Deserialize)]
struct Raw {
    #[serde(default)]
    architectures: Option<Vec<String>>,
    #[serde(default)]
    model_type: Option<String>,
    text_config: Option<Value>,
    vision_config: Option<Value>,
    #[serde(alias = "image_token_id")]
    image_token_index: Option<u32>,
    projector_hidden_act: Option<Activation>,
    multimodal_projector_bias: Option<bool>,
    vision_feature_select_strategy: Option<FeatureSelect>,
    vision_feature_layer: Option<Value>,
    #[serde(default)]
    block_diffusion: Option<BlockDiffusionConfig>,
    #[serde(default)]
    image_grid_pinpoints: Option<Vec<[usize; 2]>>,
}

impl LlavaConfig {
    /// Reads `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = crate::checkpoint::required_file(dir, "config.json")?;
        let v: Value = read_json(&path)?;
        Self::from_value(&v).map_err(|e| match e {
            Error::Config(m) => Error::Config(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    pub fn from_value(v: &Value) -> Result<Self> {
        let raw: Raw =
            serde_json::from_value(v.clone()).map_err(|e| Error::Config(e.to_string()))?;
        let arch = |name: &str| {
            raw.architectures
                .as_ref()
                .is_some_and(|a| a.iter().any(|s| s == name))
        };
        let is_next = raw.model_type.as_deref() == Some("llava_next")
            || arch("LlavaNextForConditionalGeneration");
        let is_llava = raw.model_type.as_deref() == Some("llava")
            || arch("LlavaForConditionalGeneration")
            || is_next;
        if !is_llava {
            return Err(Error::Config(format!(
                "model_type {:?} is not a LLaVA checkpoint (expected \"llava\" or \"llava_next\")",
                raw.model_type
            )));
        }
        let vision: VisionConfig = match raw.vision_config {
            None => VisionConfig::llava_default(),
            Some(vc) => serde_json::from_value(vc)
                .map_err(|e| Error::Config(format!("vision_config: {e}")))?,
        };
        if vision.model_type != "clip_vision_model" {
            return Err(Error::Config(format!(
                "vision tower `{}` is not supported (clip_vision_model)",
                vision.model_type
            )));
        }
        vision.validate()?;
        if vision.patch_size == 0 || !vision.image_size.is_multiple_of(vision.patch_size) {
            return Err(Error::Config(format!(
                "image_size {} is not a multiple of patch_size {}",
                vision.image_size, vision.patch_size
            )));
        }
        if vision.num_attention_heads == 0
            || !vision
                .hidden_size
                .is_multiple_of(vision.num_attention_heads)
        {
            return Err(Error::Config(
                "vision hidden_size must be a multiple of num_attention_heads".into(),
            ));
        }
        let text =
            TextConfig::from_value(&raw.text_config.unwrap_or_else(|| serde_json::json!({})))?;
        let n_states = vision.num_hidden_layers as i64 + 1;
        let layers: Vec<i64> = match raw.vision_feature_layer {
            None => vec![-2],
            Some(Value::Number(n)) => vec![n
                .as_i64()
                .ok_or_else(|| Error::Config("vision_feature_layer".into()))?],
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_i64().ok_or_else(|| {
                        Error::Config("vision_feature_layer entries must be integers".into())
                    })
                })
                .collect::<Result<_>>()?,
            Some(other) => {
                return Err(Error::Config(format!(
                    "vision_feature_layer: unexpected {other}"
                )))
            }
        };
        let feature_layers = layers
            .iter()
            .map(|&l| {
                let idx = if l < 0 { l + n_states } else { l };
                if (0..n_states).contains(&idx) {
                    Ok(idx as usize)
                } else {
                    Err(Error::Config(format!(
                        "vision_feature_layer {l} is out of range for {} layers",
                        vision.num_hidden_layers
                    )))
                }
            })
            .collect::<Result<Vec<_>>>()?;
        if feature_layers.is_empty() {
            return Err(Error::Config("vision_feature_layer is empty".into()));
        }
        let image_token_id = raw.image_token_index.unwrap_or(32000);
        if image_token_id as usize >= text.vocab_size {
            return Err(Error::Config(format!(
                "image_token_index {image_token_id} is outside the text vocabulary \
                 (text_config.vocab_size {})",
                text.vocab_size
            )));
        }
        if let Some(bd) = &raw.block_diffusion {
            if bd.mask_token_id as usize >= text.vocab_size || bd.block_size == 0 {
                return Err(Error::Config(format!(
                    "block_diffusion: mask_token_id {} must be in the text vocabulary ({}) and \
                     block_size ({}) at least 1",
                    bd.mask_token_id, text.vocab_size, bd.block_size
                )));
            }
        }
        let feature_select = raw
            .vision_feature_select_strategy
            .unwrap_or(FeatureSelect::Default);
        let grid_pinpoints = if is_next {
            let p = raw
                .image_grid_pinpoints
                .unwrap_or_else(|| DEFAULT_PINPOINTS.to_vec());
            super::anyres::check_pinpoints(&p, vision.image_size)?;
            if feature_select != FeatureSelect::Default {
                return Err(Error::Config(
                    "LLaVA-NeXT needs vision_feature_select_strategy \"default\" (its tiles are \
                     patch grids without [CLS])"
                        .into(),
                ));
            }
            Some(p)
        } else {
            None
        };
        Ok(Self {
            grid_pinpoints,
            block_diffusion: raw.block_diffusion,
            vision,
            text,
            image_token_id,
            projector_hidden_act: raw.projector_hidden_act.unwrap_or(Activation::Gelu),
            projector_bias: raw.multimodal_projector_bias.unwrap_or(true),
            feature_select,
            feature_layers,
        })
    }

    /// Whether this is a LLaVA-NeXT (anyres) model.
    pub fn is_next(&self) -> bool {
        self.grid_pinpoints.is_some()
    }

    /// Image tokens one image expands to in the prompt (LLaVA-NeXT: the base image's; the whole
    /// count depends on the image's size, see [`super::Anyres::tokens_for`]).
    pub fn image_tokens_per_image(&self) -> usize {
        match self.feature_select {
            FeatureSelect::Default => self.vision.num_patches(),
            FeatureSelect::Full => self.vision.num_patches() + 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn llava_1_5_7b_config() {
        // The config.json of llava-hf/llava-1.5-7b-hf (abridged as shipped).
        let c = LlavaConfig::from_value(&json!({
            "architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
            "ignore_index": -100, "image_token_index": 32000, "pad_token_id": 32001,
            "projector_hidden_act": "gelu",
            "text_config": {"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096,
                            "model_type": "llama", "rms_norm_eps": 1e-05, "torch_dtype": "float16", "vocab_size": 32064},
            "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
                              "model_type": "clip_vision_model", "num_attention_heads": 16,
                              "num_hidden_layers": 24, "patch_size": 14, "projection_dim": 768, "vocab_size": 32000},
            "vision_feature_layer": -2, "vision_feature_select_strategy": "default"
        }))
        .unwrap();
        assert_eq!(c.image_tokens_per_image(), 576);
        assert_eq!(c.feature_layers, vec![23]);
        assert_eq!(c.vision.hidden_act, Activation::QuickGelu);
        assert_eq!(c.text.max_position_embeddings, 4096);
    }

    #[test]
    fn rejects_bad_configs() {
        assert!(LlavaConfig::from_value(&json!({"model_type": "llama"})).is_err());
        assert!(LlavaConfig::from_value(
            &json!({"model_type": "llava", "vision_feature_layer": 30})
        )
        .is_err());
        assert!(LlavaConfig::from_value(
            &json!({"model_type": "llava", "vision_feature_select_strategy": "cls"})
        )
        .is_err());
        assert!(LlavaConfig::from_value(&json!({"model_type": "llava",
            "vision_config": {"model_type": "siglip_vision_model"}}))
        .is_err());
    }

    #[test]
    fn absurd_vision_values_and_token_ids_are_refused() {
        let vision = |k: &str, v: Value| {
            let mut vc = json!({"model_type": "clip_vision_model", "hidden_size": 48,
                "intermediate_size": 80, "num_hidden_layers": 3, "num_attention_heads": 4,
                "image_size": 56, "patch_size": 14});
            vc[k] = v;
            json!({"model_type": "llava", "vision_config": vc,
                   "text_config": {"vocab_size": 32064}})
        };
        assert!(LlavaConfig::from_value(&vision("hidden_size", json!(48))).is_ok());
        for (config, field) in [
            (vision("layer_norm_eps", json!(-1e-5)), "layer_norm_eps"),
            (vision("layer_norm_eps", json!(0.0)), "layer_norm_eps"),
            (vision("num_hidden_layers", json!(0)), "num_hidden_layers"),
            (vision("hidden_size", json!(0)), "hidden_size"),
            (vision("intermediate_size", json!(0)), "intermediate_size"),
            (vision("image_size", json!(0)), "image_size"),
            (vision("image_size", json!(1 << 20)), "image_size"),
            (vision("patch_size", json!(0)), "patch_size"),
            (vision("num_channels", json!(4)), "num_channels"),
            (
                json!({"model_type": "llava", "image_token_index": 32000,
                       "text_config": {"vocab_size": 32000}}),
                "image_token_index",
            ),
            (
                json!({"model_type": "llava",
                       "text_config": {"vocab_size": 32064, "rope_theta": -1.0}}),
                "rope_theta",
            ),
        ] {
            match LlavaConfig::from_value(&config) {
                Err(Error::Config(m)) => assert!(m.contains(field), "{config}: {m}"),
                other => panic!("{config}: {other:?}"),
            }
        }
    }
}
