//! A LLaVA configuration from GGUF metadata: the text model's `{arch}.*` keys and the mmproj's
//! `clip.*` keys (llama.cpp's `gguf-py/gguf/constants.py` names them), written as the Hugging
//! Face `config.json` they stand for and parsed by the same code
//! ([`LlavaConfig::from_value`]), so every check of a model directory applies.
//!
//! What GGUF does not say, and what glance assumes:
//! * Mistral is stored as `llama`; a `llama.attention.sliding_window` key makes it Mistral.
//! * The image placeholder is the vocabulary's `<image>` token (llava-hf's tokenizers have it).
//!   A vocabulary without one (llama.cpp's conversions of the original LLaVA checkpoints) gets
//!   `<image>` added after its last token, with a zero row in the embeddings and LM head that
//!   nothing reads: its rows are replaced by image features, and its logit is masked.
//! * Vision features: `clip.vision.feature_layer` (hidden-state indices) when present, else the
//!   output of the last stored layer (llama.cpp's LLaVA-1.5 mmproj stores the tower without its
//!   last layer); [CLS] dropped unless `glance.vision_feature_select_strategy` is `full`.
//! * Image pre-processing: CLIP's (shortest side to `clip.vision.image_size`, centre crop,
//!   `clip.vision.image_mean` / `image_std`), as llava-hf's `preprocessor_config.json`.

use super::file::GgufFile;
use crate::llava::LlavaConfig;
use crate::processing::image::PreprocessorConfig;
use glance_core::{Error, Result};
use glance_nn::RopeScaling;
use serde_json::{json, Value as Json};

/// Text architectures glance reads (`general.architecture`).
pub const TEXT_ARCHS: [&str; 2] = ["llama", "qwen2"];

/// Checks `general.architecture` of the text model and returns it.
pub fn text_arch(text: &GgufFile) -> Result<&str> {
    let arch = text.str_opt("general.architecture")?.ok_or_else(|| {
        Error::Config(format!(
            "{}: metadata `general.architecture` is missing",
            text.path.display()
        ))
    })?;
    if !TEXT_ARCHS.contains(&arch) {
        return Err(Error::Config(format!(
            "{}: unknown architecture `{arch}`: glance reads GGUF text models of architecture {}{}",
            text.path.display(),
            TEXT_ARCHS.join(", "),
            if arch == "clip" {
                " (this is a CLIP/projector mmproj file: pass it as --mmproj, with the text \
                 model as --model)"
            } else {
                ""
            }
        )));
    }
    Ok(arch)
}

/// The `text_config` object a text GGUF stands for, and its RoPE frequency divisors
/// (`rope_freqs.weight`) if it has them.
/// `extra_rows`: rows the embeddings and LM head gain at load (an added image placeholder).
fn text_config(text: &GgufFile, arch: &str, extra_rows: usize) -> Result<(Json, Option<Vec<f32>>)> {
    let k = |s: &str| format!("{arch}.{s}");
    let hidden = text.size(&k("embedding_length"))?;
    let heads = text.size(&k("attention.head_count"))?;
    let kv = text
        .size_opt(&k("attention.head_count_kv"))?
        .unwrap_or(heads);
    if heads == 0 {
        return Err(Error::Config(format!(
            "{}: `{}` is 0",
            text.path.display(),
            k("attention.head_count")
        )));
    }
    let head_dim = text
        .size_opt(&k("attention.key_length"))?
        .unwrap_or(hidden / heads);
    if let Some(rot) = text.size_opt(&k("rope.dimension_count"))? {
        if rot != head_dim {
            return Err(Error::Config(format!(
                "{}: partial rotary embeddings (`{}` {rot} of head_dim {head_dim}) are not \
                 supported",
                text.path.display(),
                k("rope.dimension_count")
            )));
        }
    }
    let embed = text
        .tensors
        .get("token_embd.weight")
        .ok_or_else(|| Error::MissingTensor {
            name: format!("token_embd.weight (in {})", text.path.display()),
        })?;
    let vocab = embed.shape.first().copied().unwrap_or(0) + extra_rows;
    let window = text.size_opt(&k("attention.sliding_window"))?;
    let model_type = match (arch, window) {
        ("llama", Some(_)) => "mistral",
        (a, _) => a,
    };
    let mut c = json!({
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": text.size(&k("feed_forward_length"))?,
        "num_hidden_layers": text.size(&k("block_count"))?,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "max_position_embeddings": text.size_opt(&k("context_length"))?.unwrap_or(4096),
        "rms_norm_eps": text.float_opt(&k("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5),
        "rope_theta": text.float_opt(&k("rope.freq_base"))?.unwrap_or(10000.0),
        "tie_word_embeddings": !text.tensors.contains_key("output.weight"),
        "attention_bias": text.tensors.contains_key("blk.0.attn_q.bias"),
    });
    if let Some(w) = window {
        c["sliding_window"] = json!(w);
    }
    match text.str_opt(&k("rope.scaling.type"))? {
        None | Some("none") => {}
        Some("linear") => {
            let factor = text.float_opt(&k("rope.scaling.factor"))?.ok_or_else(|| {
                Error::Config(format!(
                    "{}: linear RoPE scaling without `{}`",
                    text.path.display(),
                    k("rope.scaling.factor")
                ))
            })?;
            c["rope_scaling"] = json!({"rope_type": "linear", "factor": factor});
        }
        Some(other) => {
            return Err(Error::Config(format!(
                "{}: RoPE scaling `{other}` is not supported (linear, or per-frequency factors \
                 in rope_freqs.weight)",
                text.path.display()
            )))
        }
    }
    let factors = match text.tensors.get("rope_freqs.weight") {
        None => None,
        Some(t) => Some(super::weights::f32_values(text, "rope_freqs.weight", t)?),
    };
    Ok((c, factors))
}

/// The `vision_config`, feature selection, projector bias and pre-processing of an mmproj.
struct VisionParts {
    vision: Json,
    feature_layers: Vec<i64>,
    select: String,
    projector_bias: bool,
    preprocessor: Json,
}

/// Checks that `mm` is a CLIP mmproj with an MLP projector and reads its parts.
fn vision_parts(mm: &GgufFile) -> Result<VisionParts> {
    let bad = |what: String| Error::Config(format!("{}: {what}", mm.path.display()));
    match mm.str_opt("general.architecture")? {
        Some("clip") => {}
        other => {
            return Err(bad(format!(
                "not an mmproj (CLIP/projector) file: architecture {}, expected `clip`",
                other.map_or("missing".to_string(), |a| format!("`{a}`"))
            )))
        }
    }
    if mm.bool_opt("clip.has_vision_encoder")? == Some(false) {
        return Err(bad("the mmproj has no vision encoder".into()));
    }
    let projector = mm.str_opt("clip.projector_type")?.unwrap_or("mlp");
    if projector != "mlp" {
        return Err(bad(format!(
            "projector type `{projector}` is not supported (glance reads LLaVA's `mlp`)"
        )));
    }
    let size = mm.size("clip.vision.image_size")?;
    let layers = mm.size("clip.vision.block_count")?;
    let vision = json!({
        "model_type": "clip_vision_model",
        "hidden_size": mm.size("clip.vision.embedding_length")?,
        "intermediate_size": mm.size("clip.vision.feed_forward_length")?,
        "num_hidden_layers": layers,
        "num_attention_heads": mm.size("clip.vision.attention.head_count")?,
        "num_channels": 3,
        "image_size": size,
        "patch_size": mm.size("clip.vision.patch_size")?,
        "hidden_act": if mm.bool_opt("clip.use_gelu")?.unwrap_or(false) { "gelu" } else { "quick_gelu" },
        "layer_norm_eps": mm.float_opt("clip.vision.attention.layer_norm_epsilon")?.unwrap_or(1e-5),
    });
    let feature_layers = mm
        .ints_opt("clip.vision.feature_layer")?
        .filter(|l| !l.is_empty())
        .unwrap_or_else(|| vec![layers as i64]);
    let select = mm
        .str_opt("glance.vision_feature_select_strategy")?
        .unwrap_or("default")
        .to_string();
    let mean = mm
        .floats_opt("clip.vision.image_mean")?
        .unwrap_or_else(|| vec![0.48145466, 0.4578275, 0.40821073]);
    let std = mm
        .floats_opt("clip.vision.image_std")?
        .unwrap_or_else(|| vec![0.26862954, 0.26130258, 0.27577711]);
    let preprocessor = json!({
        "image_processor_type": "CLIPImageProcessor",
        "crop_size": {"height": size, "width": size},
        "size": {"shortest_edge": size},
        "do_center_crop": true, "do_convert_rgb": true, "do_normalize": true,
        "do_rescale": true, "do_resize": true, "resample": 3,
        "rescale_factor": 1.0 / 255.0,
        "image_mean": mean, "image_std": std,
    });
    Ok(VisionParts {
        vision,
        feature_layers,
        select,
        projector_bias: mm.tensors.contains_key("mm.0.bias"),
        preprocessor,
    })
}

/// The LLaVA configuration of a text GGUF and its mmproj, and the image pre-processing.
/// `image_token_id` is the vocabulary's placeholder (`<image>`); `extra_rows` the embedding rows
/// added for it when the vocabulary had none.
pub fn llava_config(
    text: &GgufFile,
    mm: &GgufFile,
    image_token_id: u32,
    extra_rows: usize,
) -> Result<(LlavaConfig, PreprocessorConfig)> {
    let arch = text_arch(text)?;
    let (text_config, factors) = text_config(text, arch, extra_rows)?;
    let v = vision_parts(mm)?;
    let name = || format!("{} + {}", text.path.display(), mm.path.display());
    let config = json!({
        "model_type": "llava",
        "text_config": text_config,
        "vision_config": v.vision,
        "image_token_index": image_token_id,
        "projector_hidden_act": "gelu",
        "multimodal_projector_bias": v.projector_bias,
        "vision_feature_select_strategy": v.select,
        "vision_feature_layer": v.feature_layers,
    });
    let mut config = LlavaConfig::from_value(&config).map_err(|e| match e {
        Error::Config(m) => Error::Config(format!("{}: {m}", name())),
        e => e,
    })?;
    if let Some(f) = factors {
        config.text.rope_scaling = Some(RopeScaling::Factors(f));
        config.text.validate().map_err(|e| match e {
            Error::Config(m) => Error::Config(format!("{}: rope_freqs.weight: {m}", name())),
            e => e,
        })?;
    }
    let pre = PreprocessorConfig::from_json(&v.preprocessor)
        .map_err(|e| Error::Config(format!("{}: image pre-processing: {e}", mm.path.display())))?;
    Ok((config, pre))
}
