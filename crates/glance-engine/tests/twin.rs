//! Twins through the engine: glance-tiny's twin at reduced shapes (d512, 8 layers, 8 heads;
//! the real presets are checked by the CLI test and measured by `glance eval --twin`) gives
//! glance-tiny's greedy answers on world test images in f32 and in q4, speculative decoding with
//! the twinned ViSpec head and block diffusion on the twinned glance-tiny-dvlm stay lossless, and
//! the engine masks the ids its tokenizer cannot decode.

mod common;

use common::shipped;
use glance_engine::DraftKind;
use glance_engine::{
    DecodeSpec, Engine, EngineOptions, Flow, ImageInput, Request, TwinShape, WeightFormat,
};
use serde_json::json;
use std::path::PathBuf;

/// glance-tiny (d256, 4 layers, 4 heads of 64) into d512, 8 layers, 8 query / 4 KV heads of
/// `head_dim` (8·64 = 512, or 128 to place each head in one twice its size).
fn shape(head_dim: usize) -> TwinShape {
    TwinShape::custom(
        &format!("d512-hd{head_dim}"),
        json!({"model_type": "llama", "vocab_size": 256, "hidden_size": 512,
            "intermediate_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 8,
            "num_key_value_heads": 4, "head_dim": head_dim}),
    )
}

/// Each question of world test images 0..2, greedy, 24 tokens at most.
fn requests() -> Vec<Request> {
    let mut out = Vec::new();
    for index in 0..2 {
        let ex = glance_world::sample(glance_world::Split::Test, index).unwrap();
        for qa in ex.questions.iter().filter(|q| !q.follow_up) {
            let image = ImageInput::decoded(image::DynamicImage::ImageRgb8(ex.image.clone()));
            let mut r = Request::chat(&qa.question, vec![image]);
            r.max_new_tokens = 24;
            out.push(r);
        }
    }
    out
}

fn load(dir: &str, weights: WeightFormat, twin: Option<TwinShape>) -> Engine {
    let options = EngineOptions::single_request()
        .with_threads(Some(2))
        .with_weights(weights)
        .with_twin(twin);
    Engine::load(&shipped(dir), options).unwrap()
}

fn answers(e: &Engine, requests: &[Request]) -> Vec<Vec<u32>> {
    requests
        .iter()
        .map(|r| e.generate(r, &mut |_| Flow::Continue).unwrap().token_ids)
        .collect()
}

#[test]
fn twins_give_glance_tiny_answers_in_f32_and_q4() {
    let requests = requests();
    for (weights, head_dim) in [(WeightFormat::F32, 128), (WeightFormat::Q4, 64)] {
        let small = load("glance-tiny", weights, None);
        let twin = load("glance-tiny", weights, Some(shape(head_dim)));
        let t = twin.model().text().config();
        assert_eq!(
            (t.hidden_size, t.num_layers, t.head_dim),
            (512, 8, head_dim)
        );
        assert_eq!(twin.model().text().decodable_vocab(), 141);
        let want = answers(&small, &requests);
        assert!(want.iter().all(|a| !a.is_empty()));
        assert_eq!(answers(&twin, &requests), want, "{weights} twin");
    }
}

#[test]
fn speculative_and_diffusion_decoding_run_losslessly_at_the_twin_shape() {
    let requests = &requests()[..2];
    let twin = load("glance-tiny", WeightFormat::F32, Some(shape(128)));
    let ar = answers(&twin, requests);
    for kind in [
        DecodeSpec::speculative(DraftKind::Vispec),
        DecodeSpec::speculative(DraftKind::Eagle),
    ] {
        let spec: Vec<Request> = requests
            .iter()
            .map(|r| Request {
                decode: kind.clone(),
                ..r.clone()
            })
            .collect();
        assert_eq!(answers(&twin, &spec), ar, "{kind}");
    }
    // (A head of glance-tiny's size would have been refused: the engine checks that a head
    // fits its target's hidden size.)
    let dvlm = load("glance-tiny-dvlm", WeightFormat::F32, Some(shape(128)));
    let ar = answers(&dvlm, requests);
    let quadratic: Vec<Request> = requests
        .iter()
        .map(|r| Request {
            decode: "diffusion-quadratic".parse().unwrap(),
            ..r.clone()
        })
        .collect();
    assert_eq!(answers(&dvlm, &quadratic), ar, "diffusion-quadratic");
    let small = load("glance-tiny-dvlm", WeightFormat::F32, None);
    assert_eq!(answers(&small, requests), ar, "the dvlm twin's answers");
}

#[test]
fn the_engine_masks_ids_its_tokenizer_cannot_decode() {
    // llama-gqa's decoder has 413 rows, its tokenizer 402 ids.
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/llama-gqa");
    let e = Engine::load(&dir, EngineOptions::single_request()).unwrap();
    let text = e.model().text();
    assert_eq!(
        (text.config().vocab_size, text.decodable_vocab()),
        (413, 402)
    );
    // The parity hook keeps every logit.
    let r = Request::chat("hi", vec![]);
    let logits = e.prompt_logits(&r.prompt).unwrap();
    let last: Vec<f32> = logits
        .get(logits.dim(0).unwrap() - 1)
        .unwrap()
        .to_vec1()
        .unwrap();
    assert!(last.iter().all(|x| x.is_finite()));
}
