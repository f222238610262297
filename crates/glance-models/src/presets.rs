//! Model shapes the benchmarks build with random weights, defined once.
//!
//! Text backbones carry their real vocabulary (32000, the Llama-2 / TinyLlama tokenizer). A LLaVA
//! preset puts CLIP ViT-L/14-336 (576 visual tokens, feature layer −2, as LLaVA-1.5-7B) in front
//! of a text backbone and pads the vocabulary to 32064, as llava-1.5 checkpoints do (the image and
//! pad tokens are added after the base vocabulary).

use crate::llava::LlavaConfig;
use crate::text::TextConfig;
use glance_core::{Error, Result};
use serde_json::{json, Value};

/// The text backbones, smallest first.
pub const TEXT_PRESETS: [&str; 5] = [
    "llama-134m",
    "tinyllama-1.1b",
    "sheared-llama-2.7b",
    "llama-2-7b",
    "mistral-7b",
];

/// Qwen2.5-VL's decoders (Qwen2 with M-RoPE, their real vocabularies): the language models of
/// Qwen2.5-VL-3B-Instruct and -7B-Instruct. Decoding runs text rows, which turn as 1-D RoPE.
pub const QWEN_PRESETS: [&str; 2] = ["qwen2.5-vl-3b", "qwen2.5-vl-7b"];

/// InternVL-2.5-4B's decoder (Qwen2.5-3B-Instruct with InternVL's vocabulary, 151674 ids), see
/// [`internvl_config`] for the whole model.
pub const INTERNVL_PRESETS: [&str; 1] = ["internvl2.5-4b"];

/// Whole LLaVA models: `llava-7b` is LLaVA-1.5-7B's shape (CLIP ViT-L/14-336 in front of
/// Llama-2-7B); `llava-next-7b` LLaVA-NeXT-7B's (llava-hf/llava-v1.6-mistral-7b-hf: the same
/// tower, anyres tiling over the default pinpoints, up to 2,928 visual tokens an image, in front
/// of Mistral-7B-Instruct-v0.2), see [`llava_preset`].
pub const LLAVA_PRESETS: [&str; 2] = ["llava-7b", "llava-next-7b"];

/// The LLaVA preset `name` ([`LLAVA_PRESETS`]), or `None` if `name` is not one.
pub fn llava_preset(name: &str) -> Option<Result<LlavaConfig>> {
    match name {
        "llava-7b" => Some(llava_config("llama-2-7b")),
        "llava-next-7b" => Some(llava_next_config("mistral-7b")),
        _ => None,
    }
}

/// LLaVA-1.5's vocabulary: the base 32000 plus the added image and pad tokens, padded to 32064.
pub const LLAVA_VOCAB: usize = 32064;

/// The `config.json` text part of a backbone preset.
pub fn text_config_value(name: &str) -> Result<Value> {
    Ok(match name {
        "llama-134m" => json!({"model_type": "llama", "vocab_size": 32000, "hidden_size": 768,
            "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
            "num_key_value_heads": 12, "max_position_embeddings": 4096}),
        "tinyllama-1.1b" => json!({"model_type": "llama", "vocab_size": 32000, "hidden_size": 2048,
            "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
            "num_key_value_heads": 4, "max_position_embeddings": 4096}),
        "sheared-llama-2.7b" => json!({"model_type": "llama", "vocab_size": 32000,
            "hidden_size": 2560, "intermediate_size": 6912, "num_hidden_layers": 32,
            "num_attention_heads": 20, "num_key_value_heads": 20, "max_position_embeddings": 4096}),
        "llama-2-7b" => json!({"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096,
            "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 32, "max_position_embeddings": 4096}),
        // Mistral-7B-Instruct-v0.2, as llava-v1.6-mistral-7b-hf's text_config (no sliding window).
        "mistral-7b" => json!({"model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
        "qwen2.5-vl-3b" => json!({"model_type": "qwen2_5_vl_text", "vocab_size": 151936,
            "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
            "num_attention_heads": 16, "num_key_value_heads": 2, "max_position_embeddings": 128000,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                "mrope_section": [16, 24, 24]}}),
        "qwen2.5-vl-7b" => json!({"model_type": "qwen2_5_vl_text", "vocab_size": 152064,
            "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
            "num_attention_heads": 28, "num_key_value_heads": 4, "max_position_embeddings": 128000,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                "mrope_section": [16, 24, 24]}}),
        "internvl2.5-4b" => json!({"model_type": "qwen2", "vocab_size": 151674,
            "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
            "num_attention_heads": 16, "num_key_value_heads": 2, "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
        other => {
            return Err(Error::InvalidParam(format!(
                "unknown model shape `{other}` (available: {}, {}, {}, {})",
                TEXT_PRESETS.join(", "),
                QWEN_PRESETS.join(", "),
                INTERNVL_PRESETS.join(", "),
                LLAVA_PRESETS.join(", ")
            )))
        }
    })
}

/// A text backbone preset.
pub fn text_config(name: &str) -> Result<TextConfig> {
    TextConfig::from_value(&text_config_value(name)?)
}

/// LLaVA-1.5-7B's vision shape in front of the text backbone `name`.
pub fn llava_config(name: &str) -> Result<LlavaConfig> {
    let mut text = text_config_value(name)?;
    text["vocab_size"] = json!(LLAVA_VOCAB);
    LlavaConfig::from_value(&json!({
        "model_type": "llava", "image_token_index": 32000, "projector_hidden_act": "gelu",
        "vision_feature_layer": -2, "vision_feature_select_strategy": "default",
        "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024,
            "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
            "image_size": 336, "patch_size": 14, "hidden_act": "quick_gelu"},
        "text_config": text,
    }))
}

/// InternVL-2.5-4B's whole shape (OpenGVLab/InternVL2_5-4B-MPO-hf): InternViT-300M-448px-V2.5
/// (24 LayerNorm blocks, width 1024, 448-pixel tiles of 14-pixel patches → 256 tokens per tile
/// after the pixel shuffle) in front of the `internvl2.5-4b` decoder.
pub fn internvl_config() -> Result<crate::internvl::InternVlConfig> {
    crate::internvl::InternVlConfig::from_value(&json!({
        "architectures": ["InternVLForConditionalGeneration"], "image_token_id": 151667,
        "downsample_ratio": 0.5, "projector_hidden_act": "gelu", "tie_word_embeddings": true,
        "vision_config": {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
            "intermediate_size": 4096, "image_size": [448, 448], "patch_size": [14, 14],
            "norm_type": "layer_norm", "use_qk_norm": false, "attention_bias": true,
            "layer_scale_init_value": 0.1, "use_mean_pooling": true},
        "text_config": text_config_value("internvl2.5-4b")?,
    }))
}

/// LLaVA-NeXT-7B's vision shape (LLaVA-1.5's tower, the default `image_grid_pinpoints`) in front
/// of the text backbone `name`.
pub fn llava_next_config(name: &str) -> Result<LlavaConfig> {
    let mut text = text_config_value(name)?;
    text["vocab_size"] = json!(LLAVA_VOCAB);
    LlavaConfig::from_value(&json!({
        "architectures": ["LlavaNextForConditionalGeneration"], "model_type": "llava_next",
        "image_token_index": 32000, "projector_hidden_act": "gelu",
        "vision_feature_layer": -2, "vision_feature_select_strategy": "default",
        "image_grid_pinpoints": crate::llava::DEFAULT_PINPOINTS,
        "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024,
            "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
            "image_size": 336, "patch_size": 14, "hidden_act": "quick_gelu"},
        "text_config": text,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_build_and_agree() {
        for name in TEXT_PRESETS {
            let t = text_config(name).unwrap();
            let l = llava_config(name).unwrap();
            assert_eq!(t.vocab_size, 32000);
            assert_eq!(l.text.vocab_size, LLAVA_VOCAB);
            assert_eq!(l.text.hidden_size, t.hidden_size);
            assert_eq!(l.image_tokens_per_image(), 576);
        }
        let e = text_config("llama-1b").unwrap_err().to_string();
        assert!(
            e.contains("tinyllama-1.1b") && e.contains("llava-7b"),
            "{e}"
        );
        // Qwen2.5-VL-3B's decoder: ~3.1B parameters with tied embeddings; 7B's ~7.6B.
        let q3 = text_config("qwen2.5-vl-3b").unwrap();
        assert_eq!((q3.head_dim, q3.num_kv_heads), (128, 2));
        assert_eq!(q3.mrope_section.as_deref(), Some(&[16, 24, 24][..]));
        assert!((3.0e9..3.2e9).contains(&(q3.num_parameters() as f64)));
        let q7 = text_config("qwen2.5-vl-7b").unwrap();
        assert!((7.5e9..7.7e9).contains(&(q7.num_parameters() as f64)));
        assert!(q7.qkv_bias && !q7.tie_word_embeddings);
        // InternVL-2.5-4B: Qwen2.5-3B's decoder (~3.1B with tied embeddings), 256 tokens a tile.
        let i = internvl_config().unwrap();
        assert_eq!(i.tokens_per_tile(), 256);
        assert_eq!((i.text.num_layers, i.text.num_kv_heads), (36, 2));
        assert!((3.0e9..3.2e9).contains(&(i.text.num_parameters() as f64)));
        assert_eq!(text_config("internvl2.5-4b").unwrap().vocab_size, 151674);
        let l = llava_preset("llava-7b").unwrap().unwrap();
        assert_eq!((l.text.hidden_size, l.text.num_layers), (4096, 32));
        assert_eq!(l.vision.hidden_size, 1024);
        assert!(llava_preset("llama-2-7b").is_none());
        // LLaVA-NeXT-7B: Mistral-7B (~7.2B parameters, GQA 32/8) behind anyres tiling; a
        // 672x672 image (2x2 tiles) is its largest, 576 + 48 · 49 = 2,928 tokens.
        let n = llava_preset("llava-next-7b").unwrap().unwrap();
        assert!(n.is_next());
        assert_eq!((n.text.hidden_size, n.text.num_kv_heads), (4096, 8));
        assert!((7.1e9..7.3e9).contains(&(n.text.num_parameters() as f64)));
        let tiles = crate::llava::Anyres {
            pinpoints: n.grid_pinpoints.clone().unwrap(),
            tile: n.vision.image_size,
            grid: n.vision.grid(),
        };
        assert_eq!(tiles.tokens_for(672, 672), 2928);
    }
}
