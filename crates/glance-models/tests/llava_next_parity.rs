//! Parity with Hugging Face transformers on the LLaVA-NeXT fixtures made by
//! `scripts/make_llava_next_fixtures.py` (`fixtures/llava_next/manifest.json`): a Mistral-backbone
//! checkpoint in the published layout and a Vicuna (Llama) one as transformers 5 saves it.
//!
//! * anyres pixels (base image + tiles) and visual token counts of eight images (landscape,
//!   portrait, smaller than a tile, 1x3 and 3x1 grids, a square with nothing unpadded, an odd
//!   unpadding margin), through each checkpoint's own processor settings;
//! * chat template rendering and tokenisation (two images in one turn, multi-turn chats);
//! * packed image features (unpadding, newline rows), full-sequence logits, greedy tokens and each
//!   KV-cached step's logits.

mod common;

use candle_core::{Device, Tensor};
use common::max_abs;
use glance_core::SamplingParams;
use glance_decode::{prefill, Autoregressive, DecodeStrategy, GenerateConfig, Sampler};
use glance_models::family::Family;
use glance_models::llava::{AnyresPixels, ImageEncoding, Llava, LlavaConfig, LlavaProcessor};
use glance_models::processing::chat::ChatMessage;
use glance_models::processing::image::load_image;
use glance_nn::{AttnMask, CausalLm};
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;

const TOL: f32 = 1e-4;
/// PNG pixels are bit-identical in practice (see `image_parity.rs`).
const PIXEL_TOL: f32 = 1e-5;

fn root() -> PathBuf {
    common::fixtures().join("llava_next")
}

fn manifest() -> Value {
    serde_json::from_str(&std::fs::read_to_string(root().join("manifest.json")).unwrap()).unwrap()
}

fn tensors(rel: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(root().join(rel), &Device::Cpu).unwrap()
}

fn fixture_pixels(m: &Value, image: &str) -> AnyresPixels {
    let e = m["pixels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["image"] == image)
        .unwrap_or_else(|| panic!("no pixels for {image}"));
    let t = tensors(e["tensors"].as_str().unwrap());
    let s: Vec<i64> = t["image_sizes"].to_vec1().unwrap();
    AnyresPixels {
        pixels: t["pixel_values"].clone(),
        size: (s[0] as usize, s[1] as usize),
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

fn processor(dir: &std::path::Path) -> LlavaProcessor {
    let config = LlavaConfig::from_dir(dir).unwrap();
    LlavaProcessor::from_dir(dir, &config).unwrap()
}

#[test]
fn both_layouts_load_as_llava_next() {
    let m = manifest();
    let mut layouts = Vec::new();
    for (name, dir) in models(&m) {
        assert_eq!(Family::of_dir(&dir).unwrap(), Family::LlavaNext, "{name}");
        let model = Llava::load(&dir, &Device::Cpu).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(model.image_newline().is_some(), "{name}");
        let layout = m["models"][&name]["layout"].as_str().unwrap().to_string();
        assert_eq!(
            dir.join("preprocessor_config.json").is_file(),
            layout == "hub",
            "{name}"
        );
        layouts.push(layout);
    }
    layouts.sort();
    assert_eq!(layouts, ["hub", "transformers5"]);
}

#[test]
fn pixels_and_token_counts_match_transformers_for_every_image_and_layout() {
    let m = manifest();
    let entries = m["pixels"].as_array().unwrap();
    assert!(entries.len() >= 8);
    for (name, dir) in models(&m) {
        let proc = processor(&dir);
        for e in entries {
            let image = e["image"].as_str().unwrap();
            let want = fixture_pixels(&m, image);
            let img = load_image(&root().join(image)).unwrap();
            let got = proc.anyres_pixels(&img, &Device::Cpu).unwrap();
            assert_eq!(got.size, want.size, "{name} {image}: size");
            let d = max_abs(&got.pixels, &want.pixels);
            println!("{name} {image}: {:?} pixels {d:.2e}", got.pixels.dims());
            assert!(d <= PIXEL_TOL, "{name} {image}: pixels differ by {d}");
            let (h, w) = (img.height() as usize, img.width() as usize);
            assert_eq!(
                proc.tokens_for(h, w),
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

fn encodings(model: &Llava, m: &Value, c: &Case) -> Vec<ImageEncoding> {
    c.meta["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            model
                .encode_anyres(&fixture_pixels(m, i.as_str().unwrap()))
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
        let proc = processor(&root().join(&c.model));
        let messages: Vec<ChatMessage> =
            serde_json::from_value(c.meta["messages"].clone()).unwrap();
        let tokens: Vec<usize> = c.meta["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                let img = load_image(&root().join(i.as_str().unwrap())).unwrap();
                proc.tokens_for(img.height() as usize, img.width() as usize)
            })
            .collect();
        let want: Vec<usize> = serde_json::from_value(c.meta["image_tokens"].clone()).unwrap();
        assert_eq!(tokens, want, "{}: visual tokens", c.name);
        // Without the sizes the counts are unknown: a clear refusal, not a wrong prompt.
        assert!(proc.prepare_chat(&messages).is_err());
        let p = proc.prepare_chat_sized(&messages, &tokens, None).unwrap();
        assert_eq!(p.text, c.meta["rendered"].as_str().unwrap(), "{}", c.name);
        assert_eq!(p.ids, common::ids(&c.t["input_ids"]), "{}: ids", c.name);
        assert_eq!(p.image_tokens, tokens.iter().sum::<usize>());
    }
}

#[test]
fn features_and_logits_match_transformers() {
    let m = manifest();
    let mut loaded: HashMap<String, Llava> = HashMap::new();
    for c in &cases(&m) {
        let model = loaded
            .entry(c.model.clone())
            .or_insert_with(|| Llava::load(&root().join(&c.model), &Device::Cpu).unwrap());
        let input_ids = common::ids(&c.t["input_ids"]);
        let enc = encodings(model, &m, c);
        let feats: Vec<&Tensor> = enc.iter().map(|e| &e.features).collect();
        let d_feat = max_abs(&Tensor::cat(&feats, 0).unwrap(), &c.t["image_features"]);
        let plan = model.plan(&input_ids, &feats).unwrap();
        let text = model.text();
        let hidden = text
            .forward_uncached(
                &plan.rows().unwrap(),
                &plan.positions(),
                &AttnMask::causal(),
            )
            .unwrap();
        // The fixture keeps the text rows' logits (`logits_rows`).
        let rows: Vec<u32> = common::ids(&c.t["logits_rows"]);
        let rows = Tensor::from_vec(rows.clone(), rows.len(), &Device::Cpu).unwrap();
        let logits = text
            .logits(&hidden.index_select(&rows, 0).unwrap())
            .unwrap();
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
    let mut loaded: HashMap<String, Llava> = HashMap::new();
    for c in &cases(&m) {
        let model = loaded
            .entry(c.model.clone())
            .or_insert_with(|| Llava::load(&root().join(&c.model), &Device::Cpu).unwrap());
        let input_ids = common::ids(&c.t["input_ids"]);
        let enc = encodings(model, &m, c);
        let feats: Vec<&Tensor> = enc.iter().map(|e| &e.features).collect();
        let plan = model.plan(&input_ids, &feats).unwrap();
        let (rows, pos) = (plan.rows().unwrap(), plan.positions());
        let want = common::ids(&c.t["greedy_ids"]);
        let cfg = GenerateConfig {
            max_new_tokens: want.len(),
            // Never produced: run all steps.
            eos_token_ids: vec![model.config().text.vocab_size as u32],
        };
        let text = model.text();
        let state = prefill(text, &rows, &pos).unwrap();
        let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let got = Autoregressive
            .decode(text, state, sampler, &cfg, &mut |_| Ok(false))
            .unwrap();
        assert_eq!(got.tokens, want, "{}: greedy tokens", c.name);

        // The cached steps transformers recorded == one uncached pass over prompt + tokens.
        let gen = &want[..want.len() - 1];
        let full = Tensor::cat(&[&rows, &text.embed_tokens(gen).unwrap()], 0).unwrap();
        let all: Vec<u32> = (0..full.dim(0).unwrap() as u32).collect();
        let hidden = text
            .forward_uncached(&full, &all, &AttnMask::causal())
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
fn packed_layout_marks_the_newline_rows() {
    let m = manifest();
    let (_, dir) = models(&m).into_iter().next().unwrap();
    let model = Llava::load(&dir, &Device::Cpu).unwrap();
    let newline = model.image_newline().unwrap().clone();
    for e in m["pixels"].as_array().unwrap() {
        let px = fixture_pixels(&m, e["image"].as_str().unwrap());
        let layout = model.packed_layout(px.size.0, px.size.1).unwrap();
        assert_eq!(layout.len(), e["n_image_tokens"].as_u64().unwrap() as usize);
        let enc = model.encode_anyres(&px).unwrap();
        assert_eq!(enc.features.dim(0).unwrap(), layout.len());
        for i in 0..layout.len() {
            let d = max_abs(&enc.features.get(i).unwrap(), &newline);
            assert_eq!(d == 0.0, layout.is_newline(i), "{}: row {i}", e["image"]);
        }
    }
    // Pixels with the wrong number of tiles for the image's size are refused.
    let mut px = fixture_pixels(&m, "images/wide.png");
    px.size = (200, 300);
    assert!(model.encode_anyres(&px).is_err());
}

/// Images far more elongated than any pinpoint: transformers keeps no pinpoint's pixels, takes
/// the first, and unpads to a single row, or to rows of newline tokens only. The counts are
/// transformers' (`LlavaNextProcessor` on the fixture model, checked by hand), and such images
/// encode to that many rows.
#[test]
fn extreme_aspect_ratios_count_and_encode_like_transformers() {
    let m = manifest();
    let (_, dir) = models(&m).into_iter().next().unwrap();
    let proc = processor(&dir);
    let model = Llava::load(&dir, &Device::Cpu).unwrap();
    for ((w, h), want) in [((1000, 1), 64), ((1, 1000), 56), ((300, 2), 64)] {
        assert_eq!(proc.tokens_for(h, w), want, "{w}x{h}");
        let img = image::DynamicImage::ImageRgb8(image::RgbImage::from_pixel(
            w as u32,
            h as u32,
            image::Rgb([200, 10, 10]),
        ));
        let enc = model.encode_picture(&proc, &img).unwrap();
        assert_eq!(enc.features.dim(0).unwrap(), want, "{w}x{h}");
    }
}
