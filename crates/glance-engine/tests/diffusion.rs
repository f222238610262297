//! Block-diffusion decoding (Fast-dVLM) through the engine: the self-speculative modes return
//! exactly the autoregressive tokens — on the transformers fixtures, which were never trained
//! for diffusion (drafts are poor, acceptance low), and on the shipped converted glance-tiny,
//! whose drafts are accepted often — block size 1 is autoregressive decoding, and a model without
//! a conversion is refused with a clear error.

use glance_decode::DiffusionSettings;
use glance_engine::DiffusionMode;
use glance_engine::{DecodeSpec, Engine, EngineOptions, Flow, ImageInput, Request, Response};
use glance_prune::{Budget, Policy, PruneSpec};
use std::path::{Path, PathBuf};

const MODELS: [&str; 3] = ["llama-gqa", "mistral", "qwen2"];
const SELF_SPECULATIVE: [DiffusionMode; 2] = [DiffusionMode::Linear, DiffusionMode::Quadratic];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn image(name: &str) -> ImageInput {
    ImageInput::bytes(std::fs::read(root().join("fixtures/images").join(name)).unwrap())
}

/// A copy of fixture `model` whose config names a mask token (id 1) as a converted model's
/// would: the weights are untouched, so its "drafts" are whatever an autoregressive model
/// predicts over mask tokens.
struct Converted(PathBuf);

impl Converted {
    /// `tag` keeps the copies of tests running at once apart.
    fn new(model: &str, tag: &str) -> Self {
        let src = root().join("fixtures/models").join(model);
        let dir = std::env::temp_dir().join(format!(
            "glance-diffusion-test-{model}-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for e in std::fs::read_dir(&src).unwrap() {
            let e = e.unwrap();
            if e.path().is_file() {
                std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
            }
        }
        let path = dir.join("config.json");
        let mut c: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        c["block_diffusion"] = serde_json::json!({"mask_token_id": 1, "block_size": 4});
        std::fs::write(&path, c.to_string()).unwrap();
        Converted(dir)
    }
}

impl Drop for Converted {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn engine(dir: &Path) -> Engine {
    Engine::load(dir, EngineOptions::default()).unwrap()
}

fn run(e: &Engine, r: &Request) -> Response {
    e.generate(r, &mut |_| Flow::Continue).unwrap()
}

fn settings(block: usize, dynamic: bool) -> DiffusionSettings {
    DiffusionSettings {
        min_block: 1,
        ..DiffusionSettings::sized(Some(block), None, dynamic)
    }
}

#[test]
fn self_speculation_equals_autoregressive_decoding_on_untrained_fixtures() {
    for model in MODELS {
        let conv = Converted::new(model, "lossless");
        let e = engine(&conv.0);
        for prune in [
            None,
            Some(PruneSpec::new(Policy::Adaptive, Budget::Ratio(0.5))),
        ] {
            let ar = Request {
                max_new_tokens: 24,
                prune: prune.clone(),
                ..Request::chat("Describe the image.", vec![image("astronaut.png")])
            };
            let want = run(&e, &ar);
            for mode in SELF_SPECULATIVE {
                for (block, dynamic) in [(2, false), (4, false), (8, false), (4, true)] {
                    let r = Request {
                        decode: DecodeSpec::Diffusion {
                            mode,
                            settings: Some(settings(block, dynamic)),
                        },
                        ..ar.clone()
                    };
                    let got = run(&e, &r);
                    let what = format!("{model} {mode:?} B={block} dynamic={dynamic} {prune:?}");
                    assert_eq!(got.token_ids, want.token_ids, "{what}");
                    assert_eq!(got.finish_reason, want.finish_reason, "{what}");
                    let c = &got.decode.counters;
                    assert_eq!(got.decode.strategy, mode.name());
                    assert!(c["steps"] >= 1 && c["draft_tokens"] >= c["accepted_tokens"]);
                    // Each step emits its accepted drafts and the verifier's own token.
                    let emitted = c["steps"] + c["accepted_tokens"];
                    assert!(emitted + 1 >= got.token_ids.len() as u64, "{what}");
                    let per_step = if mode == DiffusionMode::Linear { 2 } else { 1 };
                    assert!(got.decode.forward_passes <= per_step * c["steps"], "{what}");
                    // The prefill's token, then one entry per step (those that emitted).
                    let steps = &got.decode.tokens_per_step;
                    let sum: u32 = steps.iter().sum();
                    assert_eq!(sum as usize, got.token_ids.len(), "{what}: {steps:?}");
                    assert!(steps.len() as u64 <= c["steps"] + 1, "{what}: {steps:?}");
                    // A step emits its block at most (a dynamic block grows up to 64).
                    let most = if dynamic { 64 } else { block };
                    assert!(
                        steps.iter().all(|&n| n >= 1 && n as usize <= most),
                        "{what}"
                    );
                }
            }
        }
    }
}

#[test]
fn block_size_one_is_autoregressive_decoding() {
    let conv = Converted::new("llama-gqa", "b1");
    let e = engine(&conv.0);
    let ar = Request {
        max_new_tokens: 16,
        ..Request::chat("What is in the picture?", vec![image("chelsea.jpg")])
    };
    let want = run(&e, &ar);
    for mode in [
        DiffusionMode::Threshold,
        DiffusionMode::Linear,
        DiffusionMode::Quadratic,
    ] {
        let spec = DecodeSpec::Diffusion {
            mode,
            settings: Some(settings(1, false)),
        };
        let r = Request {
            decode: spec.clone(),
            ..ar.clone()
        };
        let got = run(&e, &r);
        assert_eq!(got.token_ids, want.token_ids, "{spec}");
        assert_eq!(
            got.decode.forward_passes, want.decode.forward_passes,
            "{spec}: one pass per token"
        );
    }
}

#[test]
fn threshold_decoding_reports_its_passes() {
    let conv = Converted::new("qwen2", "threshold");
    let e = engine(&conv.0);
    for tau in [0.5, 1.0] {
        let r = Request {
            max_new_tokens: 20,
            decode: DecodeSpec::Diffusion {
                mode: DiffusionMode::Threshold,
                settings: Some(DiffusionSettings {
                    block: 4,
                    threshold: tau,
                    ..DiffusionSettings::default()
                }),
            },
            ..Request::chat("Describe the image.", vec![image("astronaut.png")])
        };
        let got = run(&e, &r);
        let c = &got.decode.counters;
        assert!(!got.token_ids.is_empty() && got.token_ids.len() <= 20);
        // One causal pass per block beside its denoising passes (none for the block that ends
        // the answer); a block of 4 takes 1 to 3 denoising passes.
        let (passes, steps, iterations) = (got.decode.forward_passes, c["steps"], c["iterations"]);
        assert!(passes + 1 >= iterations + steps && passes <= iterations + steps);
        assert!(iterations >= steps && iterations <= 3 * steps);
        if tau == 1.0 {
            // Nothing is certain: one slot per pass.
            let h = &got.decode.histograms["accepted_length"];
            assert_eq!(h[1..], [iterations], "{h:?}");
        }
    }
}

#[test]
fn an_unconverted_model_is_refused() {
    let e = engine(&root().join("fixtures/models/llama-gqa"));
    let r = Request {
        decode: DecodeSpec::diffusion(DiffusionMode::Linear),
        ..Request::chat("Hi", vec![])
    };
    let err = e.generate(&r, &mut |_| Flow::Continue).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("block_diffusion") && msg.contains("glance train diffusion"),
        "{msg}"
    );
    let bad = Request {
        decode: DecodeSpec::Diffusion {
            mode: DiffusionMode::Linear,
            settings: Some(settings(0, false)),
        },
        ..Request::chat("Hi", vec![])
    };
    assert!(e.generate(&bad, &mut |_| Flow::Continue).is_err());
}

/// The shipped converted glance-tiny: its drafts are accepted often, which exercises long
/// accepted runs, and the answers are still the converted model's own autoregressive ones.
#[test]
fn the_shipped_converted_model_is_lossless_and_accepts_drafts() {
    let dir = root().join("models/glance-tiny-dvlm");
    let e = engine(&dir);
    let img = std::fs::read(root().join("fixtures/images/astronaut.png")).unwrap();
    let mut accepted = 0;
    for prompt in ["Describe the image in detail.", "What shape is the object?"] {
        let ar = Request {
            max_new_tokens: 96,
            ..Request::chat(prompt, vec![ImageInput::bytes(img.clone())])
        };
        let want = run(&e, &ar);
        for mode in SELF_SPECULATIVE {
            for (block, dynamic) in [(8, false), (16, false), (4, true)] {
                let r = Request {
                    decode: DecodeSpec::Diffusion {
                        mode,
                        settings: Some(settings(block, dynamic)),
                    },
                    ..ar.clone()
                };
                let got = run(&e, &r);
                assert_eq!(got.token_ids, want.token_ids, "{mode:?} B={block} {prompt}");
                accepted += got.decode.counters["accepted_tokens"];
            }
        }
    }
    assert!(accepted > 0);
}
