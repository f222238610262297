//! Typed mirror of an InternVL `config.json` (`InternVLConfig`, `InternVLVisionConfig`) with
//! transformers' defaults. The decoder's settings are always nested in `text_config` (Qwen2 or
//! Llama); `rope_theta` / `rope_scaling` or `rope_parameters` both parse ([`TextConfig`]).

use crate::checkpoint::read_json;
use crate::text::{size_in_range, TextConfig};
use glance_core::{Error, Result};
use glance_nn::Activation;
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// The InternViT block's norm (`norm_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum VisionNorm {
    #[serde(rename = "layer_norm")]
    LayerNorm,
    #[serde(rename = "rms_norm")]
    RmsNorm,
}

/// The vision tower's settings (`InternVLVisionConfig`), resolved.
#[derive(Debug, Clone)]
pub struct InternVisionConfig {
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: Activation,
    pub attention_bias: bool,
    /// RMSNorm over all heads' queries and keys (InternViT-6B).
    pub use_qk_norm: bool,
    pub norm: VisionNorm,
    pub layer_norm_eps: f64,
    /// The tile side in pixels (`image_size`, square).
    pub image_size: usize,
    pub patch_size: usize,
    pub num_channels: usize,
    /// `false`: a final LayerNorm (`layernorm`) after the last block.
    pub use_mean_pooling: bool,
}

impl InternVisionConfig {
    /// Patches per tile side.
    pub fn grid(&self) -> usize {
        self.image_size / self.patch_size
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }
}

/// A resolved InternVL configuration.
#[derive(Debug, Clone)]
pub struct InternVlConfig {
    pub vision: InternVisionConfig,
    pub text: TextConfig,
    pub image_token_id: u32,
    /// Pixel-shuffle factor of the projector's input (0.5: 2×2 patches per token).
    pub downsample_ratio: f64,
    pub projector_act: Activation,
    /// Index into the vision tower's hidden states (-1: the last block's output, after the final
    /// norm when there is one).
    pub vision_feature_layer: i64,
    /// `default` drops [CLS]; `full` is refused (the pixel shuffle needs a square grid).
    pub drop_cls: bool,
}

impl InternVlConfig {
    /// `1 / downsample_ratio`: patches per token side.
    pub fn shuffle(&self) -> usize {
        (1.0 / self.downsample_ratio).round() as usize
    }

    /// Tokens one tile becomes (transformers' `image_seq_length`).
    pub fn tokens_per_tile(&self) -> usize {
        let g = self.vision.grid() / self.shuffle();
        g * g
    }

    /// The hidden-state index `vision_feature_layer` names (0: the embeddings).
    pub fn feature_layer(&self) -> usize {
        let n = self.vision.num_layers as i64 + 1;
        let l = self.vision_feature_layer;
        (if l < 0 { n + l } else { l }) as usize
    }
}

#[derive(Deserialize)]
struct RawVision {
    #[serde(default = "d_hidden")]
    hidden_size: usize,
    #[serde(default = "d_layers")]
    num_hidden_layers: usize,
    #[serde(default = "d_heads")]
    num_attention_heads: usize,
    #[serde(default = "d_inter")]
    intermediate_size: usize,
    #[serde(default = "d_act")]
    hidden_act: Activation,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    use_qk_norm: bool,
    #[serde(default = "d_norm")]
    norm_type: VisionNorm,
    #[serde(default = "d_eps")]
    layer_norm_eps: f64,
    #[serde(default = "d_channels")]
    num_channels: usize,
    #[serde(default = "d_true")]
    use_mean_pooling: bool,
    #[serde(default = "d_true")]
    use_absolute_position_embeddings: bool,
}

fn d_hidden() -> usize {
    1024
}
fn d_layers() -> usize {
    24
}
fn d_heads() -> usize {
    16
}
fn d_inter() -> usize {
    4096
}
fn d_act() -> Activation {
    Activation::Gelu
}
fn d_norm() -> VisionNorm {
    VisionNorm::LayerNorm
}
fn d_eps() -> f64 {
    1e-6
}
fn d_channels() -> usize {
    3
}
fn d_true() -> bool {
    true
}

/// A square size given as `n` or `[n, n]`.
fn square(v: Option<&Value>, what: &str, default: usize) -> Result<usize> {
    let bad = || {
        Error::Config(format!(
            "vision_config.{what} must be a number or a square [n, n]"
        ))
    };
    match v {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Number(n)) => n.as_u64().map(|n| n as usize).ok_or_else(bad),
        Some(Value::Array(a)) => {
            let s: Vec<u64> = a.iter().filter_map(Value::as_u64).collect();
            match s[..] {
                [h, w] if h == w && a.len() == 2 => Ok(h as usize),
                _ => Err(bad()),
            }
        }
        Some(_) => Err(bad()),
    }
}

impl InternVlConfig {
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = crate::checkpoint::required_file(dir, "config.json")?;
        let v: Value = read_json(&path)?;
        Self::from_value(&v).map_err(|e| match e {
            Error::Config(m) => Error::Config(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    pub fn from_value(v: &Value) -> Result<Self> {
        let family = crate::family::Family::of_config(v)?;
        if family != crate::family::Family::InternVl {
            return Err(Error::Config(format!(
                "{family:?} checkpoint, not InternVL"
            )));
        }
        let mut text_value = v
            .get("text_config")
            .filter(|t| t.is_object())
            .cloned()
            .unwrap_or_else(|| serde_json::json!({"model_type": "qwen2"}));
        if let Some(o) = text_value.as_object_mut() {
            o.entry("model_type")
                .or_insert(Value::String("qwen2".into()));
            // transformers ties the output head by the top-level flag (default true).
            let tie = v
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            o.insert("tie_word_embeddings".into(), Value::Bool(tie));
        }
        let text = TextConfig::from_value(&text_value)?;
        let vc = v.get("vision_config").filter(|x| !x.is_null());
        let raw: RawVision = serde_json::from_value(vc.cloned().unwrap_or(serde_json::json!({})))
            .map_err(|e| Error::Config(format!("vision_config: {e}")))?;
        let image_size = square(vc.and_then(|x| x.get("image_size")), "image_size", 448)?;
        let patch_size = square(vc.and_then(|x| x.get("patch_size")), "patch_size", 14)?;
        if !raw.use_absolute_position_embeddings {
            return Err(Error::Config(
                "vision_config.use_absolute_position_embeddings false is not supported".into(),
            ));
        }
        let checked = |k: &str, v: usize, max: usize| size_in_range(k, v, max).map(|_| v);
        let vision = InternVisionConfig {
            hidden_size: checked("vision_config.hidden_size", raw.hidden_size, 1 << 16)?,
            num_layers: checked(
                "vision_config.num_hidden_layers",
                raw.num_hidden_layers,
                1024,
            )?,
            num_heads: checked(
                "vision_config.num_attention_heads",
                raw.num_attention_heads,
                1024,
            )?,
            intermediate_size: checked(
                "vision_config.intermediate_size",
                raw.intermediate_size,
                1 << 20,
            )?,
            hidden_act: raw.hidden_act,
            attention_bias: raw.attention_bias,
            use_qk_norm: raw.use_qk_norm,
            norm: raw.norm_type,
            layer_norm_eps: raw.layer_norm_eps,
            image_size: checked("vision_config.image_size", image_size, 1 << 14)?,
            patch_size: checked("vision_config.patch_size", patch_size, 1 << 10)?,
            num_channels: checked("vision_config.num_channels", raw.num_channels, 16)?,
            use_mean_pooling: raw.use_mean_pooling,
        };
        if !vision.hidden_size.is_multiple_of(vision.num_heads)
            || !vision.image_size.is_multiple_of(vision.patch_size)
        {
            return Err(Error::Config(format!(
                "vision_config: hidden_size {} must split over {} heads and image_size {} into \
                 {}-pixel patches",
                vision.hidden_size, vision.num_heads, vision.image_size, vision.patch_size
            )));
        }
        let num = |k: &str| v.get(k).filter(|x| !x.is_null());
        let downsample_ratio = num("downsample_ratio")
            .map(|x| {
                x.as_f64().ok_or_else(|| {
                    Error::Config(format!("`downsample_ratio` must be a number, got {x}"))
                })
            })
            .transpose()?
            .unwrap_or(0.5);
        let projector_act: Activation = match num("projector_hidden_act") {
            None => Activation::Gelu,
            Some(a) => serde_json::from_value(a.clone())
                .map_err(|e| Error::Config(format!("projector_hidden_act: {e}")))?,
        };
        let vision_feature_layer = match num("vision_feature_layer") {
            None => -1,
            Some(x) => x.as_i64().ok_or_else(|| {
                Error::Config(format!(
                    "`vision_feature_layer` must be one layer index, got {x}"
                ))
            })?,
        };
        let drop_cls = match num("vision_feature_select_strategy").and_then(Value::as_str) {
            None | Some("default") => true,
            Some(other) => {
                return Err(Error::Config(format!(
                    "vision_feature_select_strategy `{other}` is not supported (default)"
                )))
            }
        };
        let image_token_id = match num("image_token_id") {
            None => 151667,
            Some(x) => x
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    Error::Config(format!("`image_token_id` must be a token id, got {x}"))
                })?,
        };
        let config = Self {
            vision,
            text,
            image_token_id,
            downsample_ratio,
            projector_act,
            vision_feature_layer,
            drop_cls,
        };
        let s = 1.0 / downsample_ratio;
        let grid = config.vision.grid();
        if !(s >= 1.0 && (s - s.round()).abs() < 1e-9 && grid.is_multiple_of(config.shuffle())) {
            return Err(Error::Config(format!(
                "downsample_ratio {downsample_ratio} must be 1/k for a k dividing the {grid}-patch \
                 tile side"
            )));
        }
        let layers = config.vision.num_layers as i64;
        if vision_feature_layer > layers || vision_feature_layer < -(layers + 1) {
            return Err(Error::Config(format!(
                "vision_feature_layer {vision_feature_layer} is outside the {layers} vision layers"
            )));
        }
        if config.image_token_id as usize >= config.text.vocab_size {
            return Err(Error::Config(format!(
                "image_token_id {} is outside the vocabulary ({})",
                config.image_token_id, config.text.vocab_size
            )));
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({"architectures": ["InternVLForConditionalGeneration"], "image_token_id": 10,
               "text_config": {"model_type": "qwen2", "vocab_size": 100, "hidden_size": 32,
                               "num_attention_heads": 4, "num_key_value_heads": 2,
                               "intermediate_size": 48, "num_hidden_layers": 1},
               "vision_config": {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                                 "intermediate_size": 32, "image_size": [56, 56], "patch_size": 14}})
    }

    #[test]
    fn parses_defaults_and_derived_sizes() {
        let c = InternVlConfig::from_value(&base()).unwrap();
        assert_eq!(
            (c.vision.grid(), c.shuffle(), c.tokens_per_tile()),
            (4, 2, 4)
        );
        assert_eq!(c.feature_layer(), 2);
        assert!(c.text.tie_word_embeddings && c.drop_cls);
        assert_eq!(c.vision.norm, VisionNorm::LayerNorm);
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        for (k, v) in [
            ("downsample_ratio", json!(0.3)),
            ("vision_feature_layer", json!(5)),
            ("vision_feature_select_strategy", json!("full")),
            ("image_token_id", json!(100)),
        ] {
            let mut c = base();
            c[k] = v;
            let e = InternVlConfig::from_value(&c).unwrap_err().to_string();
            assert!(e.contains(k.split('_').next().unwrap()), "{k}: {e}");
        }
        let mut c = base();
        c["vision_config"]["norm_type"] = json!("batch_norm");
        assert!(InternVlConfig::from_value(&c).is_err());
    }
}
