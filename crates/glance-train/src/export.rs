//! The standard HF LLaVA directory: `config.json`, `model.safetensors` (hub weight names, no
//! training heads), `tokenizer.json` + `tokenizer_config.json` (glance-world's word-level
//! tokenizer and chat template; the template also as `chat_template.jinja`, where transformers 5
//! processors look), `preprocessor_config.json` (a `CLIPImageProcessor` at 224 px with
//! CLIP mean / std — the same `ImageProcessor` the training pixels go through),
//! `processor_config.json` (for transformers' `LlavaProcessor`) and `generation_config.json`.
//!
//! Every file is written atomically (temporary file + rename).

use crate::config::ModelSpec;
use crate::params::Param;
use crate::{Result, TrainError};
use glance_models::processing::image::{OPENAI_CLIP_MEAN, OPENAI_CLIP_STD};
use glance_world::vocab;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` through a temporary file in the same directory, fsynced, then renamed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        Ok(())
    };
    write().map_err(|e| TrainError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| TrainError::io(path, e))
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    write_atomic(path, serde_json::to_string_pretty(v)?.as_bytes())
}

/// The `CLIPImageProcessor` configuration of the world model.
pub fn preprocessor_config() -> Value {
    let s = glance_world::IMAGE_SIZE;
    json!({
        "image_processor_type": "CLIPImageProcessor",
        "processor_class": "LlavaProcessor",
        "do_resize": true,
        "size": {"shortest_edge": s},
        "resample": 3,
        "do_center_crop": true,
        "crop_size": {"height": s, "width": s},
        "do_rescale": true,
        "rescale_factor": 1.0 / 255.0,
        "do_normalize": true,
        "image_mean": OPENAI_CLIP_MEAN,
        "image_std": OPENAI_CLIP_STD,
        "do_convert_rgb": true,
    })
}

/// Everything but the weights: config, tokenizer, processors, generation defaults.
pub fn write_model_files(dir: &Path, spec: &ModelSpec) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
    write_json(&dir.join("config.json"), &spec.hf_config()?)?;
    write_atomic(
        &dir.join("tokenizer.json"),
        glance_world::tokenizer::tokenizer_json().as_bytes(),
    )?;
    write_atomic(
        &dir.join("tokenizer_config.json"),
        glance_world::tokenizer::tokenizer_config_json().as_bytes(),
    )?;
    // transformers 5's processors read the template from here (the tokenizer keeps its copy).
    write_atomic(
        &dir.join("chat_template.jinja"),
        glance_world::tokenizer::CHAT_TEMPLATE.as_bytes(),
    )?;
    write_json(
        &dir.join("preprocessor_config.json"),
        &preprocessor_config(),
    )?;
    write_json(
        &dir.join("processor_config.json"),
        &json!({
            "processor_class": "LlavaProcessor",
            "image_token": vocab::IMAGE,
            "patch_size": spec.patch_size,
            "vision_feature_select_strategy": "default",
            "num_additional_image_tokens": 1,
        }),
    )?;
    let id = |t: &str| vocab::token_id(t);
    write_json(
        &dir.join("generation_config.json"),
        &json!({
            "bos_token_id": id(vocab::BOS),
            "eos_token_id": id(vocab::EOS),
            "pad_token_id": id(vocab::PAD),
            "do_sample": false,
        }),
    )
}

/// Serialises named f32 tensors as safetensors with `metadata` (transformers requires
/// `{"format": "pt"}` on model files).
pub fn safetensors_bytes(
    tensors: &[(String, candle_core::Tensor)],
    metadata: HashMap<String, String>,
) -> Result<Vec<u8>> {
    let mut owned: Vec<(String, Vec<u8>, Vec<usize>)> = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let vals: Vec<f32> = t.flatten_all()?.to_vec1()?;
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        owned.push((name.clone(), bytes, t.dims().to_vec()));
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = owned
        .iter()
        .map(|(n, b, s)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| TrainError::Config(format!("safetensors view of {n}: {e}")))
        })
        .collect::<Result<_>>()?;
    safetensors::tensor::serialize(views, Some(metadata))
        .map_err(|e| TrainError::Config(format!("safetensors: {e}")))
}

/// `model.safetensors` from `params` (hub names).
pub fn write_weights(dir: &Path, params: &[Param]) -> Result<()> {
    let tensors: Vec<(String, candle_core::Tensor)> = params
        .iter()
        .map(|p| (p.name.clone(), p.var.as_tensor().clone()))
        .collect();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    write_atomic(
        &dir.join("model.safetensors"),
        &safetensors_bytes(&tensors, meta)?,
    )
}
