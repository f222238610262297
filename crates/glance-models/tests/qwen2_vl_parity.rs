//! Parity with Hugging Face transformers on the Qwen2-VL / Qwen2.5-VL fixtures made by
//! `scripts/make_qwen_fixtures.py` (`fixtures/qwen2_vl/manifest.json`): a Qwen2-VL checkpoint in
//! the published layout and a Qwen2.5-VL one as transformers 5 saves it.
//!
//! * pixels and `image_grid_thw` of seven images (downscaled by `max_pixels`, upscaled by
//!   `min_pixels`, 10:1, already on the grid, narrow), through each checkpoint's own processor
//!   settings;
//! * chat template rendering and tokenisation (two images in one turn, multi-turn chats);
//! * M-RoPE positions (`get_rope_index`), image features, full-sequence logits, greedy tokens and
//!   each KV-cached step's logits.

mod common;

use candle_core::{Device, Tensor};
use common::max_abs;
use glance_core::SamplingParams;
use glance_decode::{prefill_mrope, Autoregressive, DecodeStrategy, GenerateConfig, Sampler};
use glance_models::processing::chat::ChatMessage;
use glance_models::processing::image::load_image;
use glance_models::processing::sized::SizedPrompts;
use glance_models::qwen2_vl::{
    rope_index, ImageGrid, Qwen2Vl, QwenImageEncoding, QwenPixels, QwenVlProcessor, QwenVlVersion,
};
use glance_nn::{AttnMask, CausalLm};
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;

const TOL: f32 = 1e-4;
/// PNG pixels are bit-identical in practice (see `image_parity.rs`).
const PIXEL_TOL: f32 = 1e-5;

fn root() -> PathBuf {
    common::fixtures().join("qwen2_vl")
}

fn manifest() -> Value {
    serde_json::from_str(&std::fs::read_to_string(root().join("manifest.json")).unwrap()).unwrap()
}

fn tensors(rel: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(root().join(rel), &Device::Cpu).unwrap()
}

fn ids(t: &Tensor) -> Vec<u32> {
    common::ids(t)
}

/// The fixture's pixels of `image` (`images/….png`).
fn fixture_pixels(m: &Value, image: &str) -> QwenPixels {
    let e = m["pixels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["image"] == image)
        .unwrap_or_else(|| panic!("no pixels for {image}"));
    let t = tensors(e["tensors"].as_str().unwrap());
    let g: Vec<i64> = t["image_grid_thw"].to_vec1().unwrap();
    QwenPixels {
        patches: t["pixel_values"].clone(),
        grid_thw: [g[0] as usize, g[1] as usize, g[2] as usize],
    }
}

fn models(m: &Value) -> Vec<(String, PathBuf)> {
    m["models"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), root().join(v["dir"].as_str().unwrap())))
        .collect()
}

#[test]
fn both_layouts_load_as_their_version() {
    let m = manifest();
    let mut seen = Vec::new();
    for (name, dir) in models(&m) {
        let model = Qwen2Vl::load(&dir, &Device::Cpu).unwrap_or_else(|e| panic!("{name}: {e}"));
        seen.push(model.config().version);
        let layout = m["models"][&name]["layout"].as_str().unwrap();
        // The published layout has no processor_config.json, transformers 5's no
        // preprocessor_config.json: each processor reads its own.
        assert_eq!(
            dir.join("preprocessor_config.json").is_file(),
            layout == "hub",
            "{name}"
        );
    }
    seen.sort_by_key(|v| *v == QwenVlVersion::V2_5);
    assert_eq!(seen, [QwenVlVersion::V2, QwenVlVersion::V2_5]);
}

#[test]
fn pixels_and_grids_match_transformers_for_every_image_and_layout() {
    let m = manifest();
    let entries = m["pixels"].as_array().unwrap();
    assert!(entries.len() >= 6);
    for (name, dir) in models(&m) {
        let config = glance_models::qwen2_vl::Qwen2VlConfig::from_dir(&dir).unwrap();
        let proc = QwenVlProcessor::from_dir(&dir, &config).unwrap();
        for e in entries {
            let image = e["image"].as_str().unwrap();
            let want = fixture_pixels(&m, image);
            let img = load_image(&root().join(image)).unwrap();
            let got = proc.image.preprocess(&img, &Device::Cpu).unwrap();
            assert_eq!(got.grid_thw, want.grid_thw, "{name} {image}: grid");
            let d = max_abs(&got.patches, &want.patches);
            println!("{name} {image}: grid {:?} pixels {d:.2e}", got.grid_thw);
            assert!(d <= PIXEL_TOL, "{name} {image}: pixels differ by {d}");
            let (h, w) = (img.height() as usize, img.width() as usize);
            assert_eq!(
                proc.image.tokens_for(h, w).unwrap(),
                e["n_image_tokens"].as_u64().unwrap() as usize,
                "{name} {image}: visual tokens"
            );
        }
    }
}

struct Case {
    name: String,
    model: String,
    meta: Value,
    t: HashMap<String, Tensor>,
}

fn cases(m: &Value) -> Vec<Case> {
    m["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().into(),
            model: c["model"].as_str().unwrap().into(),
            meta: c.clone(),
            t: tensors(c["tensors"].as_str().unwrap()),
        })
        .collect()
}

fn encodings(model: &Qwen2Vl, m: &Value, c: &Case) -> Vec<QwenImageEncoding> {
    c.meta["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            model
                .encode_image(&fixture_pixels(m, i.as_str().unwrap()))
                .unwrap()
        })
        .collect()
}

#[test]
fn chat_template_renders_and_tokenizes_like_transformers() {
    let m = manifest();
    let cs = cases(&m);
    assert!(cs
        .iter()
        .any(|c| c.meta["images"].as_array().unwrap().len() == 2));
    assert!(cs
        .iter()
        .any(|c| c.meta["messages"].as_array().unwrap().len() >= 3));
    for c in &cs {
        let dir = root().join(&c.model);
        let config = glance_models::qwen2_vl::Qwen2VlConfig::from_dir(&dir).unwrap();
        let proc = QwenVlProcessor::from_dir(&dir, &config).unwrap();
        let messages: Vec<ChatMessage> =
            serde_json::from_value(c.meta["messages"].clone()).unwrap();
        let tokens: Vec<usize> = c.meta["image_grid_thw"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                let g: Vec<usize> = serde_json::from_value(g.clone()).unwrap();
                g[0] * g[1] * g[2] / 4
            })
            .collect();
        let p = proc.prepare_chat(&messages, &tokens).unwrap();
        assert_eq!(p.text, c.meta["rendered"].as_str().unwrap(), "{}", c.name);
        assert_eq!(p.ids, ids(&c.t["input_ids"]), "{}: ids", c.name);
        assert_eq!(
            p.image_tokens,
            c.meta["n_image_tokens"].as_u64().unwrap() as usize
        );
    }
}

#[test]
fn positions_features_and_logits_match_transformers() {
    let m = manifest();
    let mut loaded: HashMap<String, Qwen2Vl> = HashMap::new();
    for c in &cases(&m) {
        let model = loaded
            .entry(c.model.clone())
            .or_insert_with(|| Qwen2Vl::load(&root().join(&c.model), &Device::Cpu).unwrap());
        let input_ids = ids(&c.t["input_ids"]);
        let enc = encodings(model, &m, c);
        // M-RoPE positions: (3, seq) in the fixture.
        let grids: Vec<ImageGrid> = enc.iter().map(|e| e.grid).collect();
        let (pos, delta) = rope_index(&input_ids, model.config().image_token_id, &grids).unwrap();
        let want: Vec<Vec<i64>> = c.t["position_ids"].to_vec2().unwrap();
        for (r, p) in pos.iter().enumerate() {
            for k in 0..3 {
                assert_eq!(p[k] as i64, want[k][r], "{}: position ({k}, {r})", c.name);
            }
        }
        assert_eq!(delta, c.meta["rope_delta"].as_i64().unwrap(), "{}", c.name);
        let feats: Vec<&Tensor> = enc.iter().map(|e| &e.features).collect();
        let d_feat = max_abs(&Tensor::cat(&feats, 0).unwrap(), &c.t["image_features"]);
        let refs: Vec<&QwenImageEncoding> = enc.iter().collect();
        let logits = model.prompt_logits(&input_ids, &refs).unwrap();
        let d_logits = max_abs(&logits, &c.t["logits"]);
        println!(
            "{}: {} image tokens, features {d_feat:.2e}, logits {d_logits:.2e}",
            c.name, c.meta["n_image_tokens"]
        );
        assert!(d_feat <= TOL, "{}: features differ by {d_feat}", c.name);
        assert!(d_logits <= TOL, "{}: logits differ by {d_logits}", c.name);
    }
}

#[test]
fn greedy_generation_matches_transformers_and_cached_equals_recomputed() {
    let m = manifest();
    let mut loaded: HashMap<String, Qwen2Vl> = HashMap::new();
    for c in &cases(&m) {
        let model = loaded
            .entry(c.model.clone())
            .or_insert_with(|| Qwen2Vl::load(&root().join(&c.model), &Device::Cpu).unwrap());
        let input_ids = ids(&c.t["input_ids"]);
        let enc = encodings(model, &m, c);
        let refs: Vec<&QwenImageEncoding> = enc.iter().collect();
        let plan = model.plan(&input_ids, &refs).unwrap();
        let rows = plan.rows().unwrap();
        let pos = plan.mrope_positions().unwrap();
        let want = ids(&c.t["greedy_ids"]);
        let eos = model.config().text.vocab_size as u32; // never produced: run all steps
        let cfg = GenerateConfig {
            max_new_tokens: want.len(),
            eos_token_ids: vec![eos],
        };
        let text = model.text();
        let state = prefill_mrope(text, &rows, &pos).unwrap();
        // A prompt cut right after its last image token continues where transformers places
        // the next row: the position the token after the image has in the whole prompt.
        let e = input_ids
            .iter()
            .rposition(|&i| i == model.config().image_token_id)
            .unwrap();
        let cut = model.plan(&input_ids[..=e], &refs).unwrap();
        let head =
            prefill_mrope(text, &cut.rows().unwrap(), &cut.mrope_positions().unwrap()).unwrap();
        assert_eq!(head.last_pos() + 1, pos[e + 1][0], "{}", c.name);
        let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let got = Autoregressive
            .decode(text, state, sampler, &cfg, &mut |_| Ok(false))
            .unwrap();
        assert_eq!(got.tokens, want, "{}: greedy tokens", c.name);

        // The cached steps transformers recorded == one uncached pass over prompt + tokens, the
        // generated rows at max + 1, max + 2, … (three equal parts).
        let gen = &want[..want.len() - 1];
        let full = Tensor::cat(&[&rows, &text.embed_tokens(gen).unwrap()], 0).unwrap();
        let next = pos.iter().map(|p| p[0].max(p[1]).max(p[2])).max().unwrap() + 1;
        let mut all = pos.clone();
        all.extend((0..gen.len() as u32).map(|k| [next + k; 3]));
        let hidden = text
            .forward_uncached_mrope(&full, &all, &AttnMask::causal())
            .unwrap();
        let tail = hidden
            .narrow(0, rows.dim(0).unwrap() - 1, want.len())
            .unwrap();
        let d = max_abs(&text.logits(&tail).unwrap(), &c.t["greedy_logits"]);
        println!("{}: greedy {:?} step logits {d:.2e}", c.name, got.tokens);
        assert!(d <= TOL, "{}: step logits differ by {d}", c.name);
    }
}

#[test]
fn video_placeholders_are_refused() {
    let m = manifest();
    let (_, dir) = models(&m).into_iter().next().unwrap();
    let config = glance_models::qwen2_vl::Qwen2VlConfig::from_dir(&dir).unwrap();
    let proc = QwenVlProcessor::from_dir(&dir, &config).unwrap();
    let e = proc
        .tokenize(
            "<|vision_start|><|video_pad|><|vision_end|>".into(),
            &[],
            glance_models::llava::PromptFormat::Raw,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("video"), "{e}");
    let model = Qwen2Vl::load(&dir, &Device::Cpu).unwrap();
    let e = model
        .plan(&[config.video_token_id], &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("video"), "{e}");
}

/// Packed weight formats (`--weights`) on both models: the decoder's linear weights in the
/// format, the vision tower's in its 16-bit companion. Largest logit error and top-1 agreement
/// against transformers' f32 logits over every prompt row, bounded near the levels measured
/// when added (random-weight fixtures have close runners-up, so a small weight error flips some
/// argmaxes; Qwen2.5-VL's hidden size 48 is not a multiple of 32, so its q8 / q4 matrices fall
/// back to bf16, while Qwen2-VL's decoder (64) is quantized).
#[test]
fn packed_weight_formats_keep_the_logits() {
    use glance_nn::WeightFormat;
    let m = manifest();
    let cs = cases(&m);
    for (f, max_err, min_top1) in [
        (WeightFormat::Bf16, 0.15, 0.95),
        (WeightFormat::Q8, 0.6, 0.9),
        (WeightFormat::Q4, 5.0, 0.65),
    ] {
        let (mut err, mut agree, mut rows) = (0f32, 0, 0);
        for (name, dir) in models(&m) {
            let model = Qwen2Vl::load_as(&dir, &Device::Cpu, f).unwrap();
            for c in cs.iter().filter(|c| c.model.ends_with(&name)) {
                let enc = encodings(&model, &m, c);
                let refs: Vec<&QwenImageEncoding> = enc.iter().collect();
                let got = model.prompt_logits(&ids(&c.t["input_ids"]), &refs).unwrap();
                let want = &c.t["logits"];
                err = err.max(max_abs(&got, want));
                let top = |t: &Tensor| t.argmax(1).unwrap().to_vec1::<u32>().unwrap();
                let (g, w) = (top(&got), top(want));
                agree += g.iter().zip(&w).filter(|(a, b)| a == b).count();
                rows += w.len();
            }
        }
        let top1 = agree as f64 / rows as f64;
        println!("{f}: max-abs {err:.2e}, top-1 {top1:.4} ({agree}/{rows})");
        assert!(rows > 300);
        assert!(
            err <= max_err && top1 >= min_top1,
            "{f}: error {err}, top-1 {top1}"
        );
    }
}
