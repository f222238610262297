//! Checkpoint formats: sharded safetensors with an index, and f16 / bf16 weights on disk (computed
//! in f32). Each variant is written from a fixture checkpoint and must reproduce its logits.

mod common;

use candle_core::{DType, Device, Tensor};
use common::{fixtures, max_abs};
use glance_models::llava::Llava;
use glance_nn::AttnMask;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("glance-ckpt-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Copies every non-weight file of the llama-gqa fixture into `dst`.
fn copy_configs(dst: &Path) {
    for e in std::fs::read_dir(fixtures().join("models/llama-gqa")).unwrap() {
        let e = e.unwrap();
        if !e.file_name().to_string_lossy().ends_with(".safetensors") {
            std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
    }
}

fn weights() -> HashMap<String, Tensor> {
    candle_core::safetensors::load(
        fixtures().join("models/llama-gqa/model.safetensors"),
        &Device::Cpu,
    )
    .unwrap()
}

/// Full-sequence logits of the `llama-gqa-astronaut` case.
fn logits(dir: &Path) -> Tensor {
    let model = Llava::load(dir, &Device::Cpu).unwrap();
    let case = candle_core::safetensors::load(
        fixtures().join("cases/llama-gqa-astronaut.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let ids: Vec<u32> = common::ids(&case["input_ids"]);
    let enc = model.encode_image(&case["pixel_values"]).unwrap();
    let emb = model.embed_prompt(&ids, &[&enc.features]).unwrap();
    let pos: Vec<u32> = (0..ids.len() as u32).collect();
    let text = model.text();
    let h = text
        .forward_uncached(&emb, &pos, &AttnMask::causal())
        .unwrap();
    glance_nn::CausalLm::logits(text, &h).unwrap()
}

#[test]
fn sharded_checkpoint_equals_single_file() {
    let dir = scratch("sharded");
    copy_configs(&dir);
    let mut names: Vec<String> = weights().keys().cloned().collect();
    names.sort();
    let all = weights();
    let mut map = BTreeMap::new();
    for (i, chunk) in names.chunks(names.len() / 2 + 1).enumerate() {
        let file = format!("model-{:05}-of-00002.safetensors", i + 1);
        let part: HashMap<String, Tensor> =
            chunk.iter().map(|n| (n.clone(), all[n].clone())).collect();
        candle_core::safetensors::save(&part, dir.join(&file)).unwrap();
        for n in chunk {
            map.insert(n.clone(), file.clone());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    assert_eq!(
        max_abs(&logits(&dir), &logits(&fixtures().join("models/llama-gqa"))),
        0.0
    );

    // A shard named by the index but missing is reported with its name.
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    let err = Llava::load(&dir, &Device::Cpu)
        .err()
        .expect("missing shard must fail")
        .to_string();
    assert!(err.contains("model-00002-of-00002.safetensors"), "{err}");
}

#[test]
fn half_precision_weights_are_computed_in_f32() {
    for dtype in [DType::F16, DType::BF16] {
        // The half-precision checkpoint, and an f32 one holding exactly the same (rounded) values.
        let half_dir = scratch(&format!("{dtype:?}"));
        let rounded_dir = scratch(&format!("{dtype:?}-rounded"));
        copy_configs(&half_dir);
        copy_configs(&rounded_dir);
        let half: HashMap<String, Tensor> = weights()
            .into_iter()
            .map(|(k, v)| (k, v.to_dtype(dtype).unwrap()))
            .collect();
        let rounded: HashMap<String, Tensor> = half
            .iter()
            .map(|(k, v)| (k.clone(), v.to_dtype(DType::F32).unwrap()))
            .collect();
        candle_core::safetensors::save(&half, half_dir.join("model.safetensors")).unwrap();
        candle_core::safetensors::save(&rounded, rounded_dir.join("model.safetensors")).unwrap();
        let d = max_abs(&logits(&half_dir), &logits(&rounded_dir));
        assert_eq!(
            d, 0.0,
            "{dtype:?}: half weights must be widened exactly, then computed in f32"
        );
    }
}
