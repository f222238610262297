//! Continuous batching on the committed fixtures: requests that join at different steps, with
//! their prompts prefilled in small chunks, get exactly the tokens (and text and finish reason)
//! they get alone; a cancelled sequence leaves the others untouched.

mod common;

use common::batched;
use glance_core::SamplingParams;
use glance_engine::DraftKind;
use glance_engine::{Engine, EngineOptions, Flow, ImageInput, Prompt, Request};
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn image(name: &str) -> ImageInput {
    ImageInput::bytes(std::fs::read(fixtures().join("images").join(name)).unwrap())
}

fn requests() -> Vec<Request> {
    let ask = |text: &str, images: Vec<ImageInput>, n: usize| Request {
        max_new_tokens: n,
        ..Request::chat(text, images)
    };
    let mut sampled = ask("Describe the picture.", vec![image("camera_gray.png")], 20);
    sampled.sampling = SamplingParams {
        top_p: 0.9,
        ..SamplingParams::sampled(0.8, 11)
    };
    let mut stopped = ask("Tell me more.", vec![image("astronaut.png")], 24);
    stopped.stop = vec!["e".into()];
    vec![
        ask("What is this?", vec![image("astronaut.png")], 16),
        ask("Hello there, how are you today?", vec![], 30),
        sampled,
        ask(
            "Compare them.",
            vec![image("chelsea.jpg"), image("cup_rgba.png")],
            12,
        ),
        stopped,
        ask(
            "One more question about it.",
            vec![image("astronaut.png")],
            9,
        ),
    ]
}

#[test]
fn batched_decoding_gives_each_request_its_solo_tokens() {
    for model in ["llama-gqa", "mistral", "qwen2"] {
        let dir = fixtures().join("models").join(model);
        let engine =
            Engine::load(&dir, EngineOptions::single_request().with_threads(Some(1))).unwrap();
        let reqs = requests();
        let solo: Vec<_> = reqs
            .iter()
            .map(|r| engine.generate(r, &mut |_| Flow::Continue).unwrap())
            .collect();
        for chunk in [7, 4096] {
            for (i, (b, streamed)) in batched(&engine, &reqs, chunk).into_iter().enumerate() {
                let s = &solo[i];
                let label = format!("{model}, request {i}, chunk {chunk}");
                assert_eq!(b.token_ids, s.token_ids, "{label}");
                assert_eq!(b.text, s.text, "{label}");
                assert_eq!(streamed, s.text, "{label}: streamed text");
                assert_eq!(b.finish_reason, s.finish_reason, "{label}");
                assert_eq!(b.usage, s.usage, "{label}");
            }
        }
    }
}

#[test]
fn a_cancelled_sequence_leaves_the_batch_and_the_others_are_unchanged() {
    let dir = fixtures().join("models/llama-gqa");
    let engine = Engine::load(&dir, EngineOptions::default().with_threads(Some(1))).unwrap();
    let reqs = requests();
    let solo = engine.generate(&reqs[0], &mut |_| Flow::Continue).unwrap();
    let keep = engine
        .sequence(
            engine.prepare(&reqs[0]).unwrap(),
            Box::new(|_| Flow::Continue),
        )
        .unwrap();
    let cancel = engine
        .sequence(
            engine.prepare(&reqs[1]).unwrap(),
            Box::new(|_| Flow::Cancel),
        )
        .unwrap();
    let mut seqs = vec![keep, cancel];
    while !seqs[0].is_done() {
        engine.step(&mut seqs, 16);
    }
    let cancelled = seqs.pop().unwrap();
    assert!(cancelled.is_done());
    let r = cancelled.into_response().unwrap();
    assert_eq!(r.finish_reason, glance_engine::FinishReason::Cancelled);
    let kept = seqs.pop().unwrap().into_response().unwrap();
    assert_eq!(kept.token_ids, solo.token_ids);
    // Bad input fails in `prepare`, before any batch sees it.
    let bad = Request::chat("x", vec![ImageInput::bytes(b"not an image".to_vec())]);
    assert!(engine.prepare(&bad).is_err());
    // So does a strategy the model cannot run (the fixture has no draft head).
    let mut vispec = Request::new(Prompt::Raw {
        text: "hi".into(),
        images: vec![],
    });
    vispec.decode = glance_engine::DecodeSpec::speculative(DraftKind::Vispec);
    assert!(engine.prepare(&vispec).is_err());
}

#[test]
fn batched_requests_share_the_prompt_prefix_cache() {
    let dir = fixtures().join("models/qwen2");
    let solo = Engine::load(&dir, EngineOptions::single_request().with_threads(Some(1))).unwrap();
    let shared = Engine::load(&dir, EngineOptions::default().with_threads(Some(1))).unwrap();
    let ask = |q: &str| Request {
        max_new_tokens: 10,
        ..Request::chat(q, vec![image("chelsea.jpg")])
    };
    let (first, second) = (ask("What is this?"), ask("And what colour is it?"));
    // The first request records the prefix (prefilled in chunks that stop at its end), the
    // second reuses it; both answer as they do alone. Then the plain path reuses it too.
    let out = batched(&shared, std::slice::from_ref(&first), 5);
    assert_eq!(out[0].0.cache.prefix_rows, 0);
    let out2 = batched(&shared, std::slice::from_ref(&second), 5);
    assert!(out2[0].0.cache.prefix_rows > 0, "{:?}", out2[0].0.cache);
    for (r, (b, _)) in [(&first, &out[0]), (&second, &out2[0])] {
        let s = solo.generate(r, &mut |_| Flow::Continue).unwrap();
        assert_eq!(b.token_ids, s.token_ids);
        assert_eq!(b.text, s.text);
    }
    let plain = shared.generate(&first, &mut |_| Flow::Continue).unwrap();
    assert!(plain.cache.prefix_rows > 0);
    assert_eq!(plain.token_ids, out[0].0.token_ids);
}
