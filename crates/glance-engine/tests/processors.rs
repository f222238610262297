//! The sampling processors (penalties, logit bias, `min_tokens`, `ignore_eos`) and
//! log-probabilities through every strategy, on glance-tiny with its shipped draft heads and on
//! the shipped converted glance-tiny-dvlm, whose drafts are accepted often (so the verification
//! of accepted paths under the processors is exercised, not only the rejections):
//!
//! * greedy answers of every lossless strategy equal autoregressive decoding's, with the
//!   processors neutral and set — and setting them changes the answer;
//! * the log-probabilities are the same whichever strategy produced the tokens, batched or
//!   alone, and equal the log-softmax of the prompt logits of the prompt followed by the answer.

mod common;

use common::{shipped, world_image};
use glance_core::SamplingParams;
use glance_engine::{
    DecodeSpec, Engine, EngineOptions, Event, Flow, ImageInput, Prompt, Request, Response,
};
use glance_engine::{DiffusionMode, DraftKind};
use std::sync::{Arc, Mutex};

fn engine(name: &str) -> Engine {
    Engine::load(&shipped(name), EngineOptions::default()).unwrap()
}

fn run(e: &Engine, r: &Request) -> Response {
    e.generate(r, &mut |_| Flow::Continue).unwrap()
}

/// Neutral processors, then three settings that each change glance-tiny's descriptions.
fn settings() -> Vec<(SamplingParams, bool)> {
    let g = SamplingParams::greedy;
    vec![
        (g(), false),
        (
            SamplingParams {
                repetition_penalty: 1.5,
                presence_penalty: 0.5,
                ..g()
            },
            false,
        ),
        (
            SamplingParams {
                frequency_penalty: 0.7,
                logit_bias: [(5, 1.5), (9, -3.0)].into(),
                ..g()
            },
            false,
        ),
        (
            SamplingParams {
                min_tokens: 40,
                repetition_penalty: 1.2,
                ..g()
            },
            true,
        ),
    ]
}

fn request(image: &ImageInput, sampling: &SamplingParams, ignore_eos: bool) -> Request {
    Request {
        max_new_tokens: 48,
        sampling: sampling.clone(),
        ignore_eos,
        logprobs: Some(3),
        ..Request::chat("Describe the image in detail.", vec![image.clone()])
    }
}

/// Two log-probability lists agree token for token (values to rounding: the strategies run the
/// same rows through different kernels).
fn assert_logprobs_close(a: &Response, b: &Response, what: &str) {
    let (a, b) = (a.logprobs.as_ref().unwrap(), b.logprobs.as_ref().unwrap());
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.token, y.token, "{what} token {i}");
        assert!(
            (x.logprob - y.logprob).abs() < 1e-3,
            "{what} {i}: {x:?} {y:?}"
        );
        let ids = |l: &glance_decode::TokenLogprob| l.top.iter().map(|t| t.0).collect::<Vec<_>>();
        assert_eq!(ids(x).len(), 3, "{what} {i}");
        // The alternatives' order may swap on a near-tie only.
        if ids(x) != ids(y) {
            let gap = (x.top[1].1 - x.top[2].1)
                .abs()
                .min((x.top[0].1 - x.top[1].1).abs());
            assert!(gap < 1e-3, "{what} {i}: {x:?} {y:?}");
        }
    }
}

/// Runs `ar` with each of `specs` and checks that tokens and log-probabilities equal `want`'s;
/// returns the draft tokens accepted.
fn equal_to_ar(e: &Engine, ar: &Request, want: &Response, specs: &[DecodeSpec], what: &str) -> u64 {
    let mut accepted = 0;
    for spec in specs {
        let got = run(
            e,
            &Request {
                decode: spec.clone(),
                ..ar.clone()
            },
        );
        let what = format!("{what} {spec} {:?}", ar.sampling);
        assert_eq!(got.token_ids, want.token_ids, "{what}");
        assert_logprobs_close(&got, want, &what);
        accepted += got.decode.counters["accepted_tokens"];
    }
    accepted
}

#[test]
fn speculative_strategies_equal_autoregressive_decoding_under_every_processor() {
    let e = engine("glance-tiny");
    let mut accepted = 0;
    for index in 0..2 {
        let image = world_image(index);
        let mut answers = Vec::new();
        for (sampling, ignore_eos) in settings() {
            let ar = request(&image, &sampling, ignore_eos);
            let want = run(&e, &ar);
            let specs = [
                DecodeSpec::speculative(DraftKind::Vispec),
                DecodeSpec::speculative(DraftKind::Eagle),
            ];
            accepted += equal_to_ar(&e, &ar, &want, &specs, &format!("image {index}"));
            if sampling.min_tokens > 0 {
                assert!(want.token_ids.len() >= sampling.min_tokens);
            }
            answers.push(want.token_ids);
        }
        // Each setting changes the neutral answer.
        for (i, a) in answers.iter().enumerate().skip(1) {
            assert_ne!(a, &answers[0], "image {index}: setting {i} changed nothing");
        }
    }
    assert!(accepted > 50, "only {accepted} draft tokens accepted");
}

#[test]
fn self_speculative_diffusion_equals_autoregressive_decoding_under_every_processor() {
    let e = engine("glance-tiny-dvlm");
    let image = world_image(0);
    let mut accepted = 0;
    for (sampling, ignore_eos) in settings() {
        let ar = request(&image, &sampling, ignore_eos);
        let want = run(&e, &ar);
        let specs = [
            DecodeSpec::diffusion(DiffusionMode::Linear),
            DecodeSpec::diffusion(DiffusionMode::Quadratic),
        ];
        accepted += equal_to_ar(&e, &ar, &want, &specs, "dvlm");
        // The lossy threshold mode runs under the processors too (no log-probabilities).
        let threshold = Request {
            decode: DecodeSpec::diffusion(DiffusionMode::Threshold),
            logprobs: None,
            ..ar.clone()
        };
        assert!(!run(&e, &threshold).token_ids.is_empty());
    }
    assert!(accepted > 20, "only {accepted} drafts accepted");
}

/// A seeded sampled answer with penalties is reproducible and the same batched as alone, with the
/// same log-probabilities; every streamed log-probability comes before its text and matches the
/// response's.
#[test]
fn batched_sampling_with_processors_matches_decoding_alone() {
    let e = engine("glance-tiny");
    let image = world_image(1);
    let r = Request {
        sampling: SamplingParams {
            presence_penalty: 0.8,
            repetition_penalty: 1.1,
            min_p: 0.05,
            ..SamplingParams::sampled(0.9, 7)
        },
        ..request(&image, &SamplingParams::greedy(), false)
    };
    let mut streamed = Vec::new();
    let alone = e
        .generate(&r, &mut |ev| {
            if let Event::Logprob(l) = ev {
                streamed.push(l.clone());
            }
            Flow::Continue
        })
        .unwrap();
    assert_eq!(Some(&streamed), alone.logprobs.as_ref());
    let seen = Arc::new(Mutex::new(0usize));
    let counter = seen.clone();
    let sink = Box::new(move |ev: Event| {
        if let Event::Logprob(_) = ev {
            *counter.lock().unwrap() += 1;
        }
        Flow::Continue
    });
    let mut seqs = vec![e.sequence(e.prepare(&r).unwrap(), sink).unwrap()];
    while !seqs[0].is_done() {
        e.step(&mut seqs, 64);
    }
    let batched = seqs.pop().unwrap().into_response().unwrap();
    assert_eq!(batched.token_ids, alone.token_ids);
    assert_logprobs_close(&batched, &alone, "batched");
    assert_eq!(*seen.lock().unwrap(), alone.token_ids.len());
}

/// The log-probability of each answer token is the log-softmax, at its position, of the prompt
/// logits of the prompt followed by the answer (`glance logits`' hook).
#[test]
fn logprobs_equal_the_prompt_logits_of_prompt_and_answer() {
    let e = engine("glance-tiny");
    let image = world_image(2);
    let prompt = "USER: <image>\nDescribe the image in detail. ASSISTANT:";
    let r = Request {
        max_new_tokens: 12,
        logprobs: Some(2),
        ..Request::new(Prompt::Raw {
            text: prompt.into(),
            images: vec![image.clone()],
        })
    };
    let got = run(&e, &r);
    let lps = got.logprobs.unwrap();
    // The answer up to an end-of-sequence token, which the prompt text cannot spell.
    let eos = e.processor().text.eos_token_ids();
    let answer: Vec<u32> = got
        .token_ids
        .iter()
        .copied()
        .take_while(|t| !eos.contains(t))
        .collect();
    assert!(answer.len() >= 3, "{answer:?}");
    let text = e.processor().text.decode(&answer, false).unwrap();
    let full = Prompt::Raw {
        text: format!("{prompt} {text}"),
        images: vec![image],
    };
    // (prompt + answer, vocab)
    let logits: Vec<Vec<f32>> = e.prompt_logits(&full).unwrap().to_vec2().unwrap();
    // The text re-tokenises to the prompt's tokens and the answer's.
    assert_eq!(logits.len(), got.usage.prompt_tokens + answer.len());
    let start = got.usage.prompt_tokens - 1;
    for (i, l) in lps.iter().take(answer.len()).enumerate() {
        let row = &logits[start + i];
        let want = glance_decode::sampler::logprobs(row, l.token, 2);
        assert!(
            (want.logprob - l.logprob).abs() < 1e-4,
            "token {i}: {want:?} vs {l:?}"
        );
        assert_eq!(
            want.top.iter().map(|t| t.0).collect::<Vec<_>>(),
            l.top.iter().map(|t| t.0).collect::<Vec<_>>()
        );
    }
}
