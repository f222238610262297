//! Helpers shared by the tests against transformers' fixtures of each family
//! (`fixtures/<family>/manifest.json`, made by the scripts in `scripts/`).
#![allow(dead_code)]

use candle_core::{Device, Tensor};
use glance_engine::{ImageInput, Message, Part, Prompt, Role};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// `fixtures/<family>`.
pub fn fixtures(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(family)
}

/// The fixture set's `manifest.json`.
pub fn manifest(root: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(root.join("manifest.json")).unwrap()).unwrap()
}

/// A case's conversation, each image part as the image file's bytes.
pub fn prompt(root: &Path, case: &Value) -> Prompt {
    let messages = case["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let role = match m["role"].as_str().unwrap() {
                "system" => Role::System,
                "assistant" => Role::Assistant,
                _ => Role::User,
            };
            let content = m["content"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| match p["type"].as_str().unwrap() {
                    "image" => {
                        let path = root.join("images").join(p["image"].as_str().unwrap());
                        Part::Image(ImageInput::bytes(std::fs::read(path).unwrap()))
                    }
                    _ => Part::Text(p["text"].as_str().unwrap().to_string()),
                })
                .collect();
            Message {
                role,
                content,
                extra: Vec::new(),
            }
        })
        .collect();
    Prompt::Chat(messages)
}

/// A case's committed tensors (pixels, logits, tokens).
pub fn tensors(root: &Path, case: &Value) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(root.join(case["tensors"].as_str().unwrap()), &Device::Cpu)
        .unwrap()
}

/// A shipped model directory, `models/<name>`.
pub fn shipped(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name)
}

/// World test image `index`, decoded.
pub fn world_image(index: u64) -> ImageInput {
    let ex = glance_world::sample(glance_world::Split::Test, index).unwrap();
    ImageInput::decoded(image::DynamicImage::ImageRgb8(ex.image))
}

/// A copy of the shipped `kind` head of glance-tiny under `name`, keeping only `vocab` (`None`:
/// the whole vocabulary).
pub fn head_with_vocab(kind: &str, name: &str, vocab: Option<Vec<u32>>) -> PathBuf {
    let from = shipped("glance-tiny").join(format!("draft-{kind}"));
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("draft-vocab-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        from.join("model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    let mut config = glance_models::draft::DraftConfig::load(&from).unwrap();
    match vocab {
        Some(ids) => config.set_draft_vocab(ids).unwrap(),
        None => config.draft_vocab = None,
    }
    config.save(&dir).unwrap();
    dir
}
