//! Numerical parity with Hugging Face transformers on the golden fixtures made by
//! `scripts/make_fixtures.py` (tiny random-weight LLaVA checkpoints with Llama + GQA + llama3 RoPE
//! scaling, Mistral + sliding window + `full` features, Qwen2 + biases + tied embeddings).
//!
//! The model is fed the fixture's own pixel values so this test isolates the model from image
//! pre-processing (checked in `image_parity.rs`).

mod common;

use candle_core::{Device, Tensor};
use common::{fixtures, max_abs};
use glance_core::SamplingParams;
use glance_decode::{generate, GenerateConfig, Sampler};
use glance_models::llava::Llava;
use glance_models::text::TextArch;
use glance_nn::{AttnMask, CausalLm};
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;

const TOL: f32 = 1e-4;

fn manifest() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join("manifest.json")).unwrap())
        .unwrap()
}

struct Case {
    name: String,
    model: Llava,
    t: HashMap<String, Tensor>,
}

fn cases() -> Vec<Case> {
    let m = manifest();
    let mut models: HashMap<String, PathBuf> = HashMap::new();
    m["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let dir = fixtures().join(c["model"].as_str().unwrap());
            models.insert(c["model"].as_str().unwrap().into(), dir.clone());
            Case {
                name: c["name"].as_str().unwrap().into(),
                model: Llava::load(&dir, &Device::Cpu)
                    .unwrap_or_else(|e| panic!("{}: {e}", dir.display())),
                t: candle_core::safetensors::load(
                    fixtures().join(c["tensors"].as_str().unwrap()),
                    &Device::Cpu,
                )
                .unwrap(),
            }
        })
        .collect()
}

#[test]
fn vision_tower_projector_and_logits_match_transformers() {
    let cases = cases();
    assert!(cases.len() >= 6);
    for c in &cases {
        let enc = c.model.encode_image(&c.t["pixel_values"]).unwrap();
        let d_hidden = max_abs(&enc.vision_hidden, &c.t["vision_hidden"]);
        let d_attn = max_abs(enc.cls_attention.as_ref().unwrap(), &c.t["vision_cls_attn"]);
        let d_feat = max_abs(&enc.features, &c.t["image_features"]);
        let input_ids = common::ids(&c.t["input_ids"]);
        let emb = c.model.embed_prompt(&input_ids, &[&enc.features]).unwrap();
        let positions: Vec<u32> = (0..input_ids.len() as u32).collect();
        let text = c.model.text();
        let hidden = text
            .forward_uncached(&emb, &positions, &AttnMask::causal())
            .unwrap();
        let d_logits = max_abs(&text.logits(&hidden).unwrap(), &c.t["logits"]);
        println!("{}: vision {d_hidden:.2e} cls-attn {d_attn:.2e} features {d_feat:.2e} logits {d_logits:.2e}", c.name);
        for (what, d) in [
            ("vision", d_hidden),
            ("cls attention", d_attn),
            ("features", d_feat),
            ("logits", d_logits),
        ] {
            assert!(d <= TOL, "{}: {what} differ by {d}", c.name);
        }
    }
}

#[test]
fn greedy_generation_matches_transformers_and_cached_equals_recomputed() {
    for c in &cases() {
        let input_ids = common::ids(&c.t["input_ids"]);
        let enc = c.model.encode_image(&c.t["pixel_values"]).unwrap();
        let emb = c.model.embed_prompt(&input_ids, &[&enc.features]).unwrap();
        let positions: Vec<u32> = (0..input_ids.len() as u32).collect();
        let want = common::ids(&c.t["greedy_ids"]);
        let cfg = GenerateConfig {
            max_new_tokens: want.len(),
            eos_token_ids: vec![2],
        };
        let text = c.model.text();
        let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let got = generate(text, &emb, &positions, sampler, &cfg, &mut |_| Ok(false)).unwrap();
        assert_eq!(got.tokens, want, "{}: greedy tokens", c.name);

        // Cached decoding == full recomputation: logits of the whole sequence in one uncached pass
        // equal the per-step cached logits transformers recorded.
        let all: Vec<u32> = input_ids
            .iter()
            .chain(&want[..want.len() - 1])
            .copied()
            .collect();
        let gen_emb = text.embed_tokens(&want[..want.len() - 1]).unwrap();
        let full_emb = Tensor::cat(&[&emb, &gen_emb], 0).unwrap();
        let pos: Vec<u32> = (0..all.len() as u32).collect();
        let hidden = text
            .forward_uncached(&full_emb, &pos, &AttnMask::causal())
            .unwrap();
        let tail = hidden.narrow(0, input_ids.len() - 1, want.len()).unwrap();
        let d = max_abs(&text.logits(&tail).unwrap(), &c.t["greedy_logits"]);
        assert!(
            d <= TOL,
            "{}: recomputed vs cached logits differ by {d}",
            c.name
        );
    }
}

#[test]
fn kv_cache_prefill_in_chunks_equals_one_pass() {
    // Feeding the prompt in three chunks through the cache gives the logits of one uncached pass.
    // A Mistral case: the sliding window must hold across chunk boundaries.
    let cases = cases();
    let c = cases
        .iter()
        .find(|c| {
            let t = &c.model.config().text;
            t.arch == TextArch::Mistral && t.layer_windows.iter().any(Option::is_some)
        })
        .expect("a Mistral fixture with a sliding window");
    let input_ids = common::ids(&c.t["input_ids"]);
    let enc = c.model.encode_image(&c.t["pixel_values"]).unwrap();
    let emb = c.model.embed_prompt(&input_ids, &[&enc.features]).unwrap();
    let text = c.model.text();
    let n = input_ids.len();
    let window = c.model.config().text.layer_windows.iter().flatten().min();
    assert!(
        window.is_some_and(|&w| w < n - 10),
        "{}: window {window:?} is not crossed by a {n}-token prompt",
        c.name
    );
    let mut cache = text.new_cache();
    let mut outs = Vec::new();
    for (a, b) in [(0, 10), (10, 31), (31, n)] {
        let pos: Vec<u32> = (a as u32..b as u32).collect();
        outs.push(
            text.forward(
                &emb.narrow(0, a, b - a).unwrap(),
                &pos,
                &AttnMask::causal(),
                &mut cache,
            )
            .unwrap(),
        );
    }
    let chunked = text.logits(&Tensor::cat(&outs, 0).unwrap()).unwrap();
    assert!(max_abs(&chunked, &c.t["logits"]) <= TOL);
    assert_eq!(cache.len(), n);
}
