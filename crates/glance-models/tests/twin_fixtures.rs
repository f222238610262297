//! Twins of the transformers golden fixtures (Llama + GQA + llama3 RoPE scaling, Mistral +
//! sliding window, Qwen2 + biases + tied embeddings) at reduced shapes — twice the width, twice
//! the head_dim and KV heads, an extra layer, a padded vocabulary — give the greedy tokens
//! transformers recorded for the small models, and their prompt logits equal the small model's.

mod common;

use candle_core::{Device, Tensor};
use common::{fixtures, max_abs};
use glance_core::SamplingParams;
use glance_decode::{generate, GenerateConfig, Sampler};
use glance_models::llava::Llava;
use glance_models::twin::{load_llava, TwinShape};
use glance_nn::{AttnMask, CausalLm, WeightFormat};
use serde_json::{json, Value};

fn read_json(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A shape twice the small decoder's in every size, with one more layer and 37 more ids.
fn doubled(dir: &std::path::Path) -> TwinShape {
    let t = Llava::load(dir, &Device::Cpu)
        .unwrap()
        .config()
        .text
        .clone();
    TwinShape::custom(
        "doubled",
        json!({"model_type": "llama", "vocab_size": t.vocab_size + 37,
            "hidden_size": 2 * t.hidden_size + 32, "intermediate_size": 2 * t.intermediate_size,
            "num_hidden_layers": t.num_layers + 1, "num_attention_heads": 2 * t.num_heads,
            "num_key_value_heads": 2 * t.num_kv_heads, "head_dim": 2 * t.head_dim}),
    )
}

#[test]
fn fixture_twins_give_the_transformers_greedy_tokens() {
    let manifest = read_json(&fixtures().join("manifest.json"));
    for case in manifest["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let dir = fixtures().join(case["model"].as_str().unwrap());
        let t = candle_core::safetensors::load(
            fixtures().join(case["tensors"].as_str().unwrap()),
            &Device::Cpu,
        )
        .unwrap();
        let small = Llava::load(&dir, &Device::Cpu).unwrap();
        let twin = load_llava(&dir, &Device::Cpu, WeightFormat::F32, &doubled(&dir)).unwrap();
        assert!(twin.config().text.hidden_size > small.config().text.hidden_size);
        let ids: Vec<u32> = common::ids(&t["input_ids"]);
        let want: Vec<u32> = common::ids(&t["greedy_ids"]);
        let positions: Vec<u32> = (0..ids.len() as u32).collect();
        let run = |m: &Llava| -> (Tensor, Vec<u32>) {
            let enc = m.encode_image(&t["pixel_values"]).unwrap();
            let emb = m.embed_prompt(&ids, &[&enc.features]).unwrap();
            let text = m.text();
            let hidden = text
                .forward_uncached(&emb, &positions, &AttnMask::causal())
                .unwrap();
            let cfg = GenerateConfig {
                max_new_tokens: want.len(),
                eos_token_ids: vec![2],
            };
            let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
            let got = generate(text, &emb, &positions, sampler, &cfg, &mut |_| Ok(false)).unwrap();
            (text.logits(&hidden).unwrap(), got.tokens)
        };
        let (small_logits, small_tokens) = run(&small);
        let (twin_logits, twin_tokens) = run(&twin);
        assert_eq!(small_tokens, want, "{name}: the small model");
        assert_eq!(twin_tokens, want, "{name}: the twin's greedy tokens");
        let v = small_logits.dim(1).unwrap();
        let d = max_abs(&twin_logits.narrow(1, 0, v).unwrap(), &small_logits);
        assert!(d < 1e-4, "{name}: twin logits differ by {d}");
    }
}
