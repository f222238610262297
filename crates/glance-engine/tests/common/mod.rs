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

/// Runs `requests` through the scheduler's steps, the way the server does: one request joins the
/// running batch per step, prompts are prefilled `chunk` rows at a time. Returns each request's
/// response and the text its sink was streamed, in request order.
pub fn batched(
    engine: &glance_engine::Engine,
    requests: &[glance_engine::Request],
    chunk: usize,
) -> Vec<(glance_engine::Response, String)> {
    scheduled(engine, requests, chunk).0
}

/// [`batched`], with the most sequences that decoded in one step.
pub fn scheduled(
    engine: &glance_engine::Engine,
    requests: &[glance_engine::Request],
    chunk: usize,
) -> (Vec<(glance_engine::Response, String)>, usize) {
    use glance_engine::{Event, Flow, Sequence};
    use std::sync::{Arc, Mutex};
    let streamed: Vec<Arc<Mutex<String>>> = requests.iter().map(|_| Default::default()).collect();
    let mut waiting: Vec<(usize, Sequence<'_>)> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let out = streamed[i].clone();
            let sink = Box::new(move |e: Event| {
                if let Event::Text(t) = e {
                    out.lock().unwrap().push_str(t);
                }
                Flow::Continue
            });
            let p = engine.prepare(r).unwrap();
            (i, engine.sequence(p, sink).unwrap())
        })
        .collect();
    waiting.reverse();
    // The running sequences and, beside them, which request each one is.
    let (mut seqs, mut which): (Vec<Sequence<'_>>, Vec<usize>) = (Vec::new(), Vec::new());
    let mut done: Vec<Option<glance_engine::Response>> = requests.iter().map(|_| None).collect();
    let (mut steps, mut widest) = (0, 0);
    while !waiting.is_empty() || !seqs.is_empty() {
        if let Some((i, s)) = waiting.pop() {
            seqs.push(s);
            which.push(i);
        }
        widest = widest.max(seqs.iter().filter(|s| s.is_decoding()).count());
        engine.step(&mut seqs, chunk);
        steps += 1;
        assert!(steps < 10_000, "the batch never finished");
        for j in (0..seqs.len()).rev() {
            if seqs[j].is_done() {
                let i = which.remove(j);
                done[i] = Some(seqs.remove(j).into_response().unwrap());
            }
        }
    }
    let out = done
        .into_iter()
        .zip(streamed)
        .map(|(r, s)| (r.unwrap(), s.lock().unwrap().clone()))
        .collect();
    (out, widest)
}
