//! The engine end to end on the committed fixtures (tiny random-weight LLaVA checkpoints made by
//! `scripts/make_fixtures.py` with transformers): parity with transformers through the whole
//! request path, concurrency, caches, conversations, stop strings, cancellation and bad input.

use candle_core::{Device, Tensor};
use glance_core::{Error, SamplingParams};
use glance_engine::{
    Engine, EngineOptions, Event, FinishReason, Flow, ImageInput, Message, Prompt, Request,
};
use glance_prune::{Budget, Policy, PruneSpec};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn engine(model: &str, options: EngineOptions) -> Engine {
    Engine::load(&fixtures().join("models").join(model), options).unwrap()
}

fn image(name: &str) -> ImageInput {
    ImageInput::bytes(std::fs::read(fixtures().join("images").join(name)).unwrap())
}

fn ids(t: &Tensor) -> Vec<u32> {
    t.to_vec1::<i64>()
        .unwrap()
        .into_iter()
        .map(|x| x as u32)
        .collect()
}

fn greedy(prompt: Prompt, max_new_tokens: usize) -> Request {
    Request {
        max_new_tokens,
        ..Request::new(prompt)
    }
}

fn answer(e: &Engine, r: &Request) -> glance_engine::Response {
    e.generate(r, &mut |_| Flow::Continue).unwrap()
}

/// Every fixture case through the whole request path (file bytes → decode → pre-process → encode →
/// plan → prefill → autoregressive strategy) gives transformers' greedy tokens, with and without
/// the caches.
#[test]
fn greedy_answers_equal_transformers_through_the_request_path() {
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("manifest.json")).unwrap())
            .unwrap();
    let cases = manifest["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let model = c["model"].as_str().unwrap().trim_start_matches("models/");
        let t = candle_core::safetensors::load(
            fixtures().join(c["tensors"].as_str().unwrap()),
            &Device::Cpu,
        )
        .unwrap();
        let want = ids(&t["greedy_ids"]);
        let img = std::fs::read(fixtures().join(c["image"].as_str().unwrap())).unwrap();
        let request = greedy(
            Prompt::Raw {
                text: c["prompt"].as_str().unwrap().to_string(),
                images: vec![ImageInput::bytes(img)],
            },
            c["max_new_tokens"].as_u64().unwrap() as usize,
        );
        for options in [EngineOptions::single_request(), EngineOptions::default()] {
            let r = answer(&engine(model, options), &request);
            assert_eq!(r.token_ids, want, "{name}");
            assert_eq!(
                r.usage.prompt_tokens,
                c["seq_len"].as_u64().unwrap() as usize
            );
            assert_eq!(
                r.usage.visual_tokens,
                c["n_image_tokens"].as_u64().unwrap() as usize
            );
            assert_eq!(r.usage.completion_tokens, want.len());
            assert_eq!(r.decode.strategy, "ar");
            assert_eq!(r.decode.forward_passes as usize, want.len() - 1, "{name}");
            assert_eq!(r.decode.tokens_per_step, vec![1; want.len()], "{name}");
        }
    }
}

/// Requests of every kind run at once on one `Arc<Engine>` answer exactly as they do one by one.
#[test]
fn concurrent_requests_equal_their_sequential_answers() {
    let e = Arc::new(engine("llama-gqa", EngineOptions::default()));
    let sampled = SamplingParams {
        top_k: 20,
        top_p: 0.95,
        ..SamplingParams::sampled(0.9, 11)
    };
    let requests: Vec<Request> = vec![
        greedy(
            Request::chat("What is this?", vec![image("astronaut.png")]).prompt,
            10,
        ),
        Request {
            prune: Some(PruneSpec::new(Policy::Adaptive, Budget::Ratio(0.25))),
            ..greedy(
                Request::chat("Colour?", vec![image("chelsea.jpg")]).prompt,
                10,
            )
        },
        Request {
            sampling: sampled,
            ..greedy(
                Request::chat("Describe.", vec![image("astronaut.png")]).prompt,
                12,
            )
        },
        Request {
            prune: Some(PruneSpec::new(Policy::FastV, Budget::Count(6))),
            ..greedy(
                Request::chat("Two?", vec![image("chelsea.jpg"), image("astronaut.png")]).prompt,
                8,
            )
        },
        greedy(Request::chat("Text only, no image.", vec![]).prompt, 8),
    ];
    let sequential: Vec<Vec<u32>> = requests.iter().map(|r| answer(&e, r).token_ids).collect();
    for round in 0..2 {
        let handles: Vec<_> = requests
            .iter()
            .cloned()
            .map(|r| {
                let e = Arc::clone(&e);
                std::thread::spawn(move || answer(&e, &r).token_ids)
            })
            .collect();
        for (i, (h, want)) in handles.into_iter().zip(&sequential).enumerate() {
            assert_eq!(&h.join().unwrap(), want, "request {i}, round {round}");
        }
    }
    // The shared caches were used, and each holds what it should.
    let stats = e.cache_stats();
    assert_eq!(stats.images, 2);
    assert!(stats.prefixes >= 1 && stats.prefix_bytes > 0);
}

/// A pruned answer says which patches of each image it kept (what the server's page draws), and
/// where each token's text ends; an unpruned one keeps every patch and lists none.
#[test]
fn pruned_answers_report_the_kept_patches_of_each_image() {
    let e = engine("llama-gqa", EngineOptions::single_request());
    let config = e.model().llava().unwrap().config();
    let side = config.vision.grid();
    // Leading projected tokens that are not patches ([CLS] under the `full` strategy).
    let prefix = config.image_tokens_per_image() - side * side;
    let ask = |prune: Option<PruneSpec>| {
        let r = Request {
            prune,
            ..greedy(
                Request::chat("Two?", vec![image("chelsea.jpg"), image("astronaut.png")]).prompt,
                6,
            )
        };
        answer(&e, &r)
    };
    let plain = ask(None);
    assert!(plain.kept_patches.is_empty());
    for spec in [
        PruneSpec::new(Policy::Adaptive, Budget::Ratio(0.25)),
        PruneSpec::new(Policy::Pool, Budget::Count(5)),
        PruneSpec::new(Policy::FastV, Budget::Count(6)),
    ] {
        let r = ask(Some(spec.clone()));
        assert_eq!(r.kept_patches.len(), 2, "{spec:?}");
        let mut kept = 0;
        for p in &r.kept_patches {
            assert_eq!((p.rows, p.cols), (side, side));
            assert!(p.kept.windows(2).all(|w| w[0] < w[1]), "{spec:?}: {p:?}");
            assert!(p.kept.iter().all(|&i| (i as usize) < side * side));
            if spec.policy != Policy::FastV {
                // The budget applies to each image; a [CLS] prefix is kept and counts.
                let budget = spec.budget.resolve(side * side + prefix);
                assert_eq!(
                    p.kept.len(),
                    budget.saturating_sub(prefix).max(1),
                    "{spec:?}"
                );
            }
            kept += p.kept.len();
        }
        if spec.policy == Policy::FastV {
            assert!(kept <= r.usage.kept_visual_tokens, "{spec:?}");
        } else {
            assert_eq!(kept + 2 * prefix, r.usage.kept_visual_tokens, "{spec:?}");
        }
    }
    // One text end per token, increasing, the last at the end of the text.
    let ends = &plain.token_ends;
    assert_eq!(ends.len(), plain.token_ids.len());
    assert!(ends.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(
        ends.last().copied(),
        Some(plain.text.chars().count() as u32)
    );
}

/// A second question about the same image reuses its encoding and its prompt prefix, and the
/// answer equals that of an engine without caches.
#[test]
fn caches_are_reused_and_change_no_answer() {
    let cached = engine("mistral", EngineOptions::default());
    let plain = engine("mistral", EngineOptions::single_request());
    let ask = |q: &str| greedy(Request::chat(q, vec![image("chelsea.jpg")]).prompt, 10);
    let first = answer(&cached, &ask("What is it?"));
    assert_eq!((first.cache.image_hits, first.cache.prefix_rows), (0, 0));
    assert!(first.timings.vision_s > 0.0);
    let second = answer(&cached, &ask("Where is it?"));
    assert_eq!(second.cache.image_hits, 1);
    assert!(second.cache.prefix_rows > second.usage.visual_tokens);
    assert_eq!(second.timings.vision_s, 0.0);
    assert!(second.timings.cache_saved_s > 0.0);
    assert_eq!(
        second.token_ids,
        answer(&plain, &ask("Where is it?")).token_ids
    );
    assert_eq!(
        first.token_ids,
        answer(&plain, &ask("What is it?")).token_ids
    );
}

/// Several images and several turns: the images take their places in the template, the answer
/// equals the reference path (plan of the same ids and encodings, causal prefill, greedy decode).
#[test]
fn conversations_with_several_images() {
    let e = engine("qwen2", EngineOptions::single_request());
    let messages = vec![
        Message::system("Answer briefly."),
        Message::user(
            "Compare them.",
            vec![image("astronaut.png"), image("chelsea.jpg")],
        ),
        Message::assistant("They differ."),
        Message::user("And this one?", vec![image("coffee_palette.png")]),
    ];
    let r = answer(&e, &greedy(Prompt::Chat(messages.clone()), 8));
    let per_image = e.model().llava().unwrap().config().image_tokens_per_image();
    assert_eq!(r.usage.visual_tokens, 3 * per_image);
    // The reference: the same conversation prefilled by hand.
    let chat: Vec<_> = messages
        .iter()
        .map(|m| {
            let parts = m
                .content
                .iter()
                .map(|p| match p {
                    glance_engine::Part::Text(t) => {
                        glance_models::processing::chat::ContentPart::Text { text: t.clone() }
                    }
                    glance_engine::Part::Image(_) => {
                        glance_models::processing::chat::ContentPart::Image {}
                    }
                })
                .collect();
            glance_models::processing::chat::ChatMessage::new(m.role.name(), parts)
        })
        .collect();
    let prompt = e.processor().prepare_chat(&chat).unwrap();
    assert_eq!(r.usage.prompt_tokens, prompt.ids.len());
    let encodings: Vec<Tensor> = ["astronaut.png", "chelsea.jpg", "coffee_palette.png"]
        .iter()
        .map(|n| {
            let img =
                glance_models::processing::image::load_image(&fixtures().join("images").join(n))
                    .unwrap();
            let px = e
                .processor()
                .llava()
                .unwrap()
                .image
                .preprocess_tensor(&img, &Device::Cpu)
                .unwrap();
            e.model()
                .llava()
                .unwrap()
                .encode_image(&px)
                .unwrap()
                .features
        })
        .collect();
    let refs: Vec<&Tensor> = encodings.iter().collect();
    let rows = e
        .model()
        .llava()
        .unwrap()
        .embed_prompt(&prompt.ids, &refs)
        .unwrap();
    let positions: Vec<u32> = (0..prompt.ids.len() as u32).collect();
    let want = glance_decode::generate(
        e.model().text(),
        &rows,
        &positions,
        glance_decode::Sampler::new(SamplingParams::greedy()).unwrap(),
        &glance_decode::GenerateConfig {
            max_new_tokens: 8,
            eos_token_ids: e.processor().text.eos_token_ids().to_vec(),
        },
        &mut |_| Ok(false),
    )
    .unwrap();
    assert_eq!(r.token_ids, want.tokens);
}

/// Stop strings end the answer before the match; the callback can cancel; streamed text is the
/// response's text.
#[test]
fn stop_strings_cancellation_and_streaming() {
    let e = engine("llama-gqa", EngineOptions::single_request());
    let base = greedy(
        Request::chat(
            "What is the astronaut holding?",
            vec![image("astronaut.png")],
        )
        .prompt,
        16,
    );
    let mut streamed = String::new();
    let full = e
        .generate(&base, &mut |e| {
            if let Event::Text(t) = e {
                streamed.push_str(t);
            }
            Flow::Continue
        })
        .unwrap();
    assert_eq!(streamed, full.text);
    assert_eq!(full.finish_reason, FinishReason::Length);
    let chars: Vec<char> = full.text.chars().collect();
    assert!(chars.len() >= 4, "{:?}", full.text);
    // Stop on a piece from the middle of the answer.
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let cut = full.text.find(&stop).unwrap();
    let stopped = answer(
        &e,
        &Request {
            stop: vec![stop.clone()],
            ..base.clone()
        },
    );
    assert_eq!(stopped.finish_reason, FinishReason::Stop);
    assert_eq!(stopped.text, full.text[..cut], "stop {stop:?}");
    assert!(stopped.token_ids.len() < full.token_ids.len());
    // Cancel after the first piece of text.
    let cancelled = e.generate(&base, &mut |_| Flow::Cancel).unwrap();
    assert_eq!(cancelled.finish_reason, FinishReason::Cancelled);
    assert!(cancelled.token_ids.len() < full.token_ids.len());
    assert!(full.text.starts_with(&cancelled.text) && !cancelled.text.is_empty());
}

/// Bad requests are refused with the error a caller can act on, and the engine keeps serving.
#[test]
fn bad_requests_get_clear_errors() {
    let e = engine("llama-gqa", EngineOptions::default());
    let ok = greedy(Request::chat("Hi", vec![image("astronaut.png")]).prompt, 3);
    let cases: Vec<(Request, &str)> = vec![
        (
            greedy(
                Request::chat("x", vec![ImageInput::bytes(vec![0u8; 10])]).prompt,
                3,
            ),
            "not a PNG, JPEG or WebP",
        ),
        (
            greedy(
                Request::chat(
                    "x",
                    vec![ImageInput::bytes(b"\x89PNG\r\n\x1a\nbroken".to_vec())],
                )
                .prompt,
                3,
            ),
            "image",
        ),
        (
            greedy(
                Request::chat("x", vec![image("astronaut.png"); 17]).prompt,
                3,
            ),
            "at most 16",
        ),
        (
            Request {
                max_new_tokens: 0,
                ..ok.clone()
            },
            "at least 1",
        ),
        (greedy(Prompt::Chat(vec![]), 3), "no message"),
        (
            Request {
                stop: vec![String::new()],
                ..ok.clone()
            },
            "stop string",
        ),
        (
            Request {
                sampling: SamplingParams {
                    temperature: -1.0,
                    ..SamplingParams::greedy()
                },
                ..ok.clone()
            },
            "temperature",
        ),
        (
            greedy(
                Prompt::Raw {
                    text: "no placeholder".into(),
                    images: vec![image("astronaut.png")],
                },
                3,
            ),
            "placeholder",
        ),
        (
            greedy(Request::chat(&"word ".repeat(5000), vec![]).prompt, 3),
            "context",
        ),
    ];
    for (request, want) in cases {
        let err = e.generate(&request, &mut |_| Flow::Continue).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(want), "expected `{want}` in: {msg}");
        assert!(!matches!(err, Error::Candle(_)), "{msg}");
    }
    assert_eq!(answer(&e, &ok).token_ids.len(), 3);
}

/// `prompt_logits` gives every prompt row's logits, and the first answer token is the argmax of
/// the last row's.
#[test]
fn prompt_logits_match_the_plan() {
    let e = engine("llama-gqa", EngineOptions::single_request());
    let prompt = Request::chat("What is it?", vec![image("chelsea.jpg")]).prompt;
    let logits = e.prompt_logits(&prompt).unwrap();
    let r = answer(&e, &greedy(prompt, 1));
    let (t, vocab) = logits.dims2().unwrap();
    assert_eq!(t, r.usage.prompt_tokens);
    assert_eq!(vocab, e.model().config().text.vocab_size);
    // The first answer token is the argmax of the last prompt row's logits.
    let last: Vec<f32> = logits.get(t - 1).unwrap().to_vec1().unwrap();
    assert_eq!(r.token_ids[0], glance_decode::sampler::argmax(&last));
}
