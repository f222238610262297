//! InternVL through the whole request path (image file bytes → header size → tile count → chat
//! template → tiles → vision tower → pixel shuffle → plan → prefill → decoding strategy) against
//! transformers' fixtures (`fixtures/internvl/`, `scripts/make_internvl_fixtures.py`): the
//! prompt's logits, visual token counts and greedy tokens with and without the caches; every
//! pruning policy; lossless speculative decoding; packed weights; continuous batching.

mod common;

use candle_core::{Device, Tensor};
use glance_engine::DraftKind;
use glance_engine::{
    Budget, DecodeSpec, Engine, EngineOptions, Flow, Policy, Prompt, PruneSpec, Request,
};
use glance_nn::WeightFormat;
use serde_json::Value;
use std::path::PathBuf;

fn root() -> PathBuf {
    common::fixtures("internvl")
}

fn manifest() -> Value {
    common::manifest(&root())
}

fn cases(m: &Value) -> Vec<Value> {
    m["cases"].as_array().unwrap().clone()
}

/// The case's conversation with each image part as the image file's bytes.
fn prompt(case: &Value) -> Prompt {
    common::prompt(&root(), case)
}

fn tensors(case: &Value) -> std::collections::HashMap<String, Tensor> {
    common::tensors(&root(), case)
}

fn greedy_ids(case: &Value) -> Vec<u32> {
    tensors(case)["greedy_ids"]
        .to_vec1::<i64>()
        .unwrap()
        .into_iter()
        .map(|x| x as u32)
        .collect()
}

fn max_abs(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap()
}

fn two_image_case(m: &Value, model_dir: &str) -> Value {
    cases(m)
        .into_iter()
        .find(|c| c["model"] == model_dir && c["images"].as_array().unwrap().len() == 2)
        .unwrap()
}

#[test]
fn prompt_logits_tokens_and_greedy_answers_equal_transformers() {
    let m = manifest();
    for options in [EngineOptions::single_request(), EngineOptions::default()] {
        let mut engines = std::collections::HashMap::new();
        for c in cases(&m) {
            let name = c["name"].as_str().unwrap();
            let model = c["model"].as_str().unwrap().to_string();
            let e = engines
                .entry(model.clone())
                .or_insert_with(|| Engine::load(&root().join(&model), options.clone()).unwrap());
            let p = prompt(&c);
            let d = max_abs(&e.prompt_logits(&p).unwrap(), &tensors(&c)["logits"]);
            assert!(d <= 1e-4, "{name}: logits differ by {d}");
            let want = greedy_ids(&c);
            // Twice: the second time through the image and prefix caches (when on).
            for _ in 0..2 {
                let r = Request {
                    max_new_tokens: want.len(),
                    ignore_eos: true,
                    decode: DecodeSpec::Autoregressive,
                    ..Request::new(p.clone())
                };
                let got = e.generate(&r, &mut |_| Flow::Continue).unwrap();
                assert_eq!(got.token_ids, want, "{name}: greedy tokens");
                assert_eq!(
                    got.usage.visual_tokens,
                    c["n_image_tokens"].as_u64().unwrap() as usize,
                    "{name}: visual tokens"
                );
                assert_eq!(
                    got.usage.prompt_tokens,
                    c["seq_len"].as_u64().unwrap() as usize
                );
            }
        }
    }
}

/// Every policy on a two-image prompt: the kept tokens are reported on each image's grid (its
/// tiles stacked), the prompt shrinks by what was dropped, and a no-op policy is the unpruned
/// answer. FastV cuts inside the prefill (1-D positions). Video is refused by name.
#[test]
fn every_pruning_policy_runs_and_reports_its_kept_tokens() {
    let m = manifest();
    let c = two_image_case(&m, "models/internvl-qwen2");
    let e = Engine::load(
        &root().join(c["model"].as_str().unwrap()),
        EngineOptions::single_request(),
    )
    .unwrap();
    let tiles: Vec<usize> = serde_json::from_value(c["num_patches"].clone()).unwrap();
    let plain = Request {
        max_new_tokens: 4,
        ignore_eos: true,
        decode: DecodeSpec::Autoregressive,
        ..Request::new(prompt(&c))
    };
    let unpruned = e.generate(&plain, &mut |_| Flow::Continue).unwrap();
    for policy in Policy::ALL {
        let budget = Budget::Ratio(0.5);
        let r = Request {
            prune: Some(PruneSpec::new(policy, budget)),
            ..plain.clone()
        };
        let got = e
            .generate(&r, &mut |_| Flow::Continue)
            .unwrap_or_else(|err| panic!("{policy}: {err}"));
        assert_eq!(got.token_ids.len(), 4, "{policy}");
        if policy == Policy::None {
            assert_eq!(got.token_ids, unpruned.token_ids);
            continue;
        }
        assert_eq!(got.kept_patches.len(), 2, "{policy}");
        let mut kept = 0;
        for (k, &n) in got.kept_patches.iter().zip(&tiles) {
            // 2x2 tokens per tile, tiles stacked.
            assert_eq!((k.rows, k.cols), (2 * n, 2), "{policy}");
            // FastV keeps the prompt's best visual rows over all images together.
            if policy != Policy::FastV {
                assert_eq!(k.kept.len(), budget.resolve(4 * n), "{policy}");
            }
            assert!(k.kept.windows(2).all(|w| w[0] < w[1]), "{policy}");
            assert!(k.kept.iter().all(|&i| (i as usize) < 4 * n), "{policy}");
            kept += k.kept.len();
        }
        assert_eq!(got.usage.kept_visual_tokens, kept, "{policy}");
        let budgets: usize = tiles.iter().map(|&n| budget.resolve(4 * n)).sum();
        assert_eq!(kept, budgets, "{policy}");
        if policy != Policy::FastV {
            assert_eq!(
                got.usage.prompt_rows,
                got.usage.prompt_tokens - (got.usage.visual_tokens - kept),
                "{policy}"
            );
        }
    }
    let raw = Prompt::Raw {
        text: "<video>\nWhat happens?".into(),
        images: Vec::new(),
    };
    let err = e.prompt_logits(&raw).unwrap_err().to_string();
    assert!(err.contains("video"), "{err}");
}

/// A draft head shaped for the target in `dir` (its nested text config), random weights.
fn random_head(
    dir: &std::path::Path,
    adaptor: Option<usize>,
    injection: bool,
    seed: u64,
) -> glance_models::draft::DraftHead {
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let config =
        glance_models::draft::DraftConfig::for_target(&config["text_config"], adaptor, injection)
            .unwrap();
    glance_models::draft::DraftHead::from_var_builder(
        &glance_models::random::random_var_builder(seed, &Device::Cpu),
        config,
        glance_nn::Mode::Infer,
    )
    .unwrap()
}

/// Speculative decoding is lossless: greedy ViSpec and EAGLE output (untrained heads, tree and
/// chain, with and without pruning) is autoregressive decoding's, token for token.
#[test]
fn greedy_speculative_output_equals_autoregressive() {
    let m = manifest();
    for (name, facts) in m["models"].as_object().unwrap() {
        let dir = root().join(facts["dir"].as_str().unwrap());
        let e = Engine::load(&dir, EngineOptions::default()).unwrap();
        e.set_draft(std::sync::Arc::new(random_head(&dir, Some(4), true, 1)));
        e.set_draft(std::sync::Arc::new(random_head(&dir, None, false, 2)));
        let case = two_image_case(&m, facts["dir"].as_str().unwrap());
        for prune in [
            None,
            Some(PruneSpec::new(Policy::Adaptive, Budget::Ratio(0.5))),
        ] {
            let ar = Request {
                max_new_tokens: 16,
                ignore_eos: true,
                decode: DecodeSpec::Autoregressive,
                prune: prune.clone(),
                ..Request::new(prompt(&case))
            };
            let want = e.generate(&ar, &mut |_| Flow::Continue).unwrap();
            for kind in [DraftKind::Vispec, DraftKind::Eagle] {
                for tree in [
                    glance_decode::TreeSettings::default(),
                    glance_decode::TreeSettings::chain(4),
                ] {
                    let r = Request {
                        decode: DecodeSpec::Speculative {
                            kind,
                            tree: Some(tree.clone()),
                        },
                        ..ar.clone()
                    };
                    let got = e.generate(&r, &mut |_| Flow::Continue).unwrap();
                    assert_eq!(
                        got.token_ids, want.token_ids,
                        "{name} {kind} {tree:?} prune {prune:?}"
                    );
                    assert_eq!(got.decode.strategy, kind.name());
                    assert!(got.decode.counters["drafts"] >= 1);
                }
            }
        }
    }
}

/// `--weights`: the engine loads each packed format and answers; bf16 keeps transformers'
/// greedy answer on the Qwen2-backbone chat (its margins are wide enough).
#[test]
fn packed_weights_load_and_answer() {
    let m = manifest();
    let c = two_image_case(&m, "models/internvl-qwen2");
    let dir = root().join(c["model"].as_str().unwrap());
    for format in [WeightFormat::Bf16, WeightFormat::Q8, WeightFormat::Q4] {
        let options = EngineOptions {
            weights: format,
            ..EngineOptions::single_request()
        };
        let e = Engine::load(&dir, options).unwrap();
        let r = Request {
            max_new_tokens: 6,
            ignore_eos: true,
            decode: DecodeSpec::Autoregressive,
            ..Request::new(prompt(&c))
        };
        let got = e.generate(&r, &mut |_| Flow::Continue).unwrap();
        assert_eq!(got.token_ids.len(), 6, "{format}");
        assert_eq!(
            got.usage.visual_tokens,
            c["n_image_tokens"].as_u64().unwrap() as usize
        );
        let logits = e.prompt_logits(&prompt(&c)).unwrap();
        let d = max_abs(&logits, &tensors(&c)["logits"]);
        assert!(d > 0.0 && d < 5.0, "{format}: logits differ by {d}");
    }
}

/// Continuous batching: every case joins the running batch one step after the other, prompts
/// prefilled 7 rows at a time, and each gets exactly its solo tokens.
#[test]
fn batched_requests_get_their_solo_tokens() {
    let m = manifest();
    for (name, facts) in m["models"].as_object().unwrap() {
        let dir = root().join(facts["dir"].as_str().unwrap());
        let e = Engine::load(&dir, EngineOptions::default().with_threads(Some(1))).unwrap();
        let reqs: Vec<Request> = cases(&m)
            .iter()
            .filter(|c| c["model"] == facts["dir"])
            .map(|c| Request {
                max_new_tokens: 8,
                ignore_eos: true,
                decode: DecodeSpec::Autoregressive,
                ..Request::new(prompt(c))
            })
            .collect();
        assert!(reqs.len() >= 3);
        let solo: Vec<Vec<u32>> = reqs
            .iter()
            .map(|r| e.generate(r, &mut |_| Flow::Continue).unwrap().token_ids)
            .collect();
        for (i, (got, _)) in common::batched(&e, &reqs, 7).into_iter().enumerate() {
            assert_eq!(got.token_ids, solo[i], "{name}: request {i}");
        }
    }
}
