//! Typed mirror of a Qwen2-VL / Qwen2.5-VL `config.json` with HF defaults, in both layouts:
//! published checkpoints keep the text settings at the top level (`rope_theta`, `rope_scaling`
//! `{"type": "mrope", "mrope_section": …}`), transformers 5 nests them in `text_config` with
//! `rope_parameters`.

use crate::checkpoint::read_json;
use crate::llava::BlockDiffusionConfig;
use crate::text::{size_in_range, TextConfig};
use glance_core::{Error, Result};
use glance_nn::Activation;
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// Which generation of the family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QwenVlVersion {
    /// `Qwen2VLForConditionalGeneration`: LayerNorm, GELU MLP, full attention in every block.
    V2,
    /// `Qwen2_5_VLForConditionalGeneration`: RMSNorm, SwiGLU MLP, windowed attention except in
    /// `fullatt_block_indexes`.
    V2_5,
}

/// The vision tower's settings (`Qwen2VLVisionConfig` / `Qwen2_5_VLVisionConfig`), resolved.
#[derive(Debug, Clone)]
pub struct QwenVisionConfig {
    pub version: QwenVlVersion,
    pub depth: usize,
    /// Width of the ViT blocks (`embed_dim` in 2, `hidden_size` in 2.5).
    pub width: usize,
    /// Width of the merger's output: the text decoder's hidden size (`hidden_size` in 2,
    /// `out_hidden_size` in 2.5).
    pub out_width: usize,
    /// Hidden width of a block's MLP (`embed_dim * mlp_ratio` in 2, `intermediate_size` in 2.5).
    pub mlp_width: usize,
    pub num_heads: usize,
    pub hidden_act: Activation,
    pub in_channels: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub spatial_merge_size: usize,
    pub rope_theta: f64,
    /// 2.5: side of an attention window in pixels.
    pub window_size: usize,
    /// 2.5: blocks that attend over the whole image.
    pub fullatt_block_indexes: Vec<usize>,
}

impl QwenVisionConfig {
    pub fn head_dim(&self) -> usize {
        self.width / self.num_heads
    }

    /// Values of one patch row of `pixel_values`: `channels · temporal · patch · patch`.
    pub fn patch_dim(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }
}

/// A resolved Qwen2-VL / Qwen2.5-VL configuration.
#[derive(Debug, Clone)]
pub struct Qwen2VlConfig {
    pub version: QwenVlVersion,
    pub vision: QwenVisionConfig,
    pub text: TextConfig,
    pub image_token_id: u32,
    pub video_token_id: u32,
    pub vision_start_token_id: u32,
    pub vision_end_token_id: u32,
    /// Set on a model converted for block-diffusion decoding (glance's own `block_diffusion`
    /// key, as [`crate::llava::LlavaConfig::block_diffusion`]).
    pub block_diffusion: Option<BlockDiffusionConfig>,
}

#[derive(Deserialize, Default)]
struct RawVision {
    depth: Option<usize>,
    embed_dim: Option<usize>,
    hidden_size: Option<usize>,
    out_hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    mlp_ratio: Option<f64>,
    num_heads: Option<usize>,
    hidden_act: Option<Activation>,
    in_channels: Option<usize>,
    patch_size: Option<usize>,
    temporal_patch_size: Option<usize>,
    spatial_merge_size: Option<usize>,
    window_size: Option<usize>,
    fullatt_block_indexes: Option<Vec<usize>>,
    rope_parameters: Option<Value>,
}

impl Qwen2VlConfig {
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = crate::checkpoint::required_file(dir, "config.json")?;
        let v: Value = read_json(&path)?;
        Self::from_value(&v).map_err(|e| match e {
            Error::Config(m) => Error::Config(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    pub fn from_value(v: &Value) -> Result<Self> {
        let version = match crate::family::Family::of_config(v)? {
            crate::family::Family::Qwen2Vl => QwenVlVersion::V2,
            crate::family::Family::Qwen25Vl => QwenVlVersion::V2_5,
            other => {
                return Err(Error::Config(format!(
                    "{other:?} checkpoint, not Qwen2-VL / Qwen2.5-VL"
                )))
            }
        };
        // transformers 5 nests the decoder's settings; published configs keep them flat.
        let text_value = match v.get("text_config").filter(|t| t.is_object()) {
            Some(t) => t.clone(),
            None => {
                let mut flat = v.clone();
                if let Some(o) = flat.as_object_mut() {
                    o.remove("vision_config");
                }
                flat
            }
        };
        let mut text_value = text_value;
        if let Some(o) = text_value.as_object_mut() {
            o.insert("model_type".into(), Value::String("qwen2".into()));
            // Pre-v5 saves put `tie_word_embeddings` at the top level only.
            if !o.contains_key("tie_word_embeddings") {
                if let Some(t) = v.get("tie_word_embeddings") {
                    o.insert("tie_word_embeddings".into(), t.clone());
                }
            }
        }
        let text = TextConfig::from_value(&text_value)?;
        if text.mrope_section.is_none() {
            return Err(Error::Config(
                "no mrope_section in the RoPE settings (rope_scaling / rope_parameters)".into(),
            ));
        }
        let raw: RawVision = match v.get("vision_config") {
            Some(vc) => serde_json::from_value(vc.clone())
                .map_err(|e| Error::Config(format!("vision_config: {e}")))?,
            None => RawVision::default(),
        };
        let vision = resolve_vision(version, raw)?;
        if vision.out_width != text.hidden_size {
            return Err(Error::Config(format!(
                "the vision merger outputs {} values per token but the decoder's hidden size is {}",
                vision.out_width, text.hidden_size
            )));
        }
        let id = |k: &str, default: u32| -> Result<u32> {
            match v.get(k).filter(|x| !x.is_null()) {
                None => Ok(default),
                Some(x) => x
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| Error::Config(format!("`{k}` must be a token id, got {x}"))),
            }
        };
        let block_diffusion: Option<BlockDiffusionConfig> = match v.get("block_diffusion") {
            None | Some(Value::Null) => None,
            Some(b) => Some(
                serde_json::from_value(b.clone())
                    .map_err(|e| Error::Config(format!("block_diffusion: {e}")))?,
            ),
        };
        if let Some(bd) = &block_diffusion {
            if bd.mask_token_id as usize >= text.vocab_size || bd.block_size == 0 {
                return Err(Error::Config(format!(
                    "block_diffusion: mask_token_id {} must be in the text vocabulary ({}) and \
                     block_size ({}) at least 1",
                    bd.mask_token_id, text.vocab_size, bd.block_size
                )));
            }
        }
        let config = Self {
            block_diffusion,
            version,
            vision,
            image_token_id: id("image_token_id", 151655)?,
            video_token_id: id("video_token_id", 151656)?,
            vision_start_token_id: id("vision_start_token_id", 151652)?,
            vision_end_token_id: id("vision_end_token_id", 151653)?,
            text,
        };
        if config.image_token_id as usize >= config.text.vocab_size {
            return Err(Error::Config(format!(
                "image_token_id {} is outside the vocabulary ({})",
                config.image_token_id, config.text.vocab_size
            )));
        }
        Ok(config)
    }
}

fn resolve_vision(version: QwenVlVersion, r: RawVision) -> Result<QwenVisionConfig> {
    let theta = r
        .rope_parameters
        .as_ref()
        .and_then(|p| p.get("rope_theta"))
        .and_then(Value::as_f64)
        .unwrap_or(10000.0);
    let c = match version {
        QwenVlVersion::V2 => {
            let width = r.embed_dim.unwrap_or(1280);
            let ratio = r.mlp_ratio.unwrap_or(4.0);
            QwenVisionConfig {
                version,
                depth: r.depth.unwrap_or(32),
                width,
                out_width: r.hidden_size.unwrap_or(3584),
                // Python: int(embed_dim * mlp_ratio)
                mlp_width: (width as f64 * ratio) as usize,
                num_heads: r.num_heads.unwrap_or(16),
                hidden_act: r.hidden_act.unwrap_or(Activation::QuickGelu),
                in_channels: r.in_channels.unwrap_or(3),
                patch_size: r.patch_size.unwrap_or(14),
                temporal_patch_size: r.temporal_patch_size.unwrap_or(2),
                spatial_merge_size: r.spatial_merge_size.unwrap_or(2),
                rope_theta: theta,
                window_size: 0,
                fullatt_block_indexes: Vec::new(),
            }
        }
        QwenVlVersion::V2_5 => QwenVisionConfig {
            version,
            depth: r.depth.unwrap_or(32),
            width: r.hidden_size.unwrap_or(3584),
            out_width: r.out_hidden_size.unwrap_or(3584),
            mlp_width: r.intermediate_size.unwrap_or(3420),
            num_heads: r.num_heads.unwrap_or(16),
            hidden_act: r.hidden_act.unwrap_or(Activation::Silu),
            in_channels: r.in_channels.unwrap_or(3),
            patch_size: r.patch_size.unwrap_or(14),
            temporal_patch_size: r.temporal_patch_size.unwrap_or(2),
            spatial_merge_size: r.spatial_merge_size.unwrap_or(2),
            rope_theta: theta,
            window_size: r.window_size.unwrap_or(112),
            fullatt_block_indexes: r
                .fullatt_block_indexes
                .unwrap_or_else(|| vec![7, 15, 23, 31]),
        },
    };
    for (field, value, max) in [
        ("depth", c.depth, 1024),
        ("width", c.width, 1 << 16),
        ("out_width", c.out_width, 1 << 20),
        ("mlp_width", c.mlp_width, 1 << 20),
        ("num_heads", c.num_heads, 1 << 10),
        ("patch_size", c.patch_size, 1024),
        ("temporal_patch_size", c.temporal_patch_size, 16),
        ("spatial_merge_size", c.spatial_merge_size, 16),
    ] {
        size_in_range(&format!("vision_config.{field}"), value, max)?;
    }
    if c.in_channels != 3 {
        return Err(Error::Config(format!(
            "vision_config.in_channels must be 3 (RGB), got {}",
            c.in_channels
        )));
    }
    if !c.width.is_multiple_of(c.num_heads) || !c.head_dim().is_multiple_of(4) {
        return Err(Error::Config(format!(
            "vision width {} over {} heads must give a head size divisible by 4 (2-D rotary)",
            c.width, c.num_heads
        )));
    }
    if c.version == QwenVlVersion::V2_5 {
        let unit = c.spatial_merge_size * c.patch_size;
        if c.window_size < unit || !c.window_size.is_multiple_of(unit) {
            return Err(Error::Config(format!(
                "vision_config.window_size {} must be a positive multiple of spatial_merge_size × \
                 patch_size = {unit}",
                c.window_size
            )));
        }
        if let Some(&b) = c.fullatt_block_indexes.iter().find(|&&b| b >= c.depth) {
            return Err(Error::Config(format!(
                "vision_config.fullatt_block_indexes names block {b} of {}",
                c.depth
            )));
        }
    }
    if !(c.rope_theta > 0.0 && c.rope_theta.is_finite()) {
        return Err(Error::Config(format!(
            "vision rope_theta must be positive, got {}",
            c.rope_theta
        )));
    }
    Ok(c)
}
