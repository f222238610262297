//! Qwen2-VL / Qwen2.5-VL through the whole request path (image file bytes → header size →
//! `smart_resize` token counts → chat template → pre-process → vision tower → plan with M-RoPE
//! positions → prefill → decoding strategy) against transformers' fixtures
//! (`fixtures/qwen2_vl/`, `scripts/make_qwen_fixtures.py`): the prompt's logits, visual token
//! counts and greedy tokens, with and without the caches; requests the family cannot serve yet
//! are refused by name.

mod common;

use candle_core::{Device, Tensor};
use glance_engine::{
    Budget, DecodeSpec, Engine, EngineOptions, Flow, Policy, Prompt, PruneSpec, Request,
};
use glance_engine::{DiffusionMode, DraftKind};
use serde_json::Value;
use std::path::PathBuf;

fn root() -> PathBuf {
    common::fixtures("qwen2_vl")
}

fn manifest() -> Value {
    common::manifest(&root())
}

/// The case's conversation with each image part as the image file's bytes.
fn prompt(case: &Value) -> Prompt {
    common::prompt(&root(), case)
}

fn tensors(case: &Value) -> std::collections::HashMap<String, Tensor> {
    common::tensors(&root(), case)
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

#[test]
fn prompt_logits_tokens_and_greedy_answers_equal_transformers() {
    let m = manifest();
    for options in [EngineOptions::single_request(), EngineOptions::default()] {
        let mut engines = std::collections::HashMap::new();
        for c in m["cases"].as_array().unwrap() {
            let name = c["name"].as_str().unwrap();
            let model = c["model"].as_str().unwrap().to_string();
            let e = engines
                .entry(model.clone())
                .or_insert_with(|| Engine::load(&root().join(&model), options.clone()).unwrap());
            let t = tensors(c);
            let p = prompt(c);
            let logits = e.prompt_logits(&p).unwrap();
            let d = max_abs(&logits, &t["logits"]);
            assert!(d <= 1e-4, "{name}: logits differ by {d}");
            let want: Vec<u32> = t["greedy_ids"]
                .to_vec1::<i64>()
                .unwrap()
                .into_iter()
                .map(|x| x as u32)
                .collect();
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

/// Continuous batching with 3-D positions: every case of a model joins the running batch one step
/// after the other (prompts prefilled 5 rows at a time, so chunks cut through the images' M-RoPE
/// rows), beside a pruned copy of each; every request gets transformers' greedy tokens, and each
/// pruned one its solo tokens.
#[test]
fn batched_requests_keep_their_mrope_positions_and_solo_tokens() {
    let m = manifest();
    let cases = m["cases"].as_array().unwrap();
    for model in ["models/qwen2-vl", "models/qwen2_5-vl"] {
        let e = Engine::load(&root().join(model), EngineOptions::default()).unwrap();
        let mine: Vec<&Value> = cases.iter().filter(|c| c["model"] == model).collect();
        let greedy = |c: &Value| -> Vec<u32> {
            let ids = tensors(c)["greedy_ids"].to_vec1::<i64>().unwrap();
            ids.into_iter().map(|x| x as u32).collect()
        };
        let mut reqs = Vec::new();
        for c in &mine {
            let plain = Request {
                max_new_tokens: greedy(c).len(),
                ignore_eos: true,
                decode: DecodeSpec::Autoregressive,
                ..Request::new(prompt(c))
            };
            let pruned = Request {
                prune: Some(PruneSpec::new(Policy::Adaptive, Budget::Ratio(0.5))),
                ..plain.clone()
            };
            reqs.extend([plain, pruned]);
        }
        assert!(reqs.len() >= 6);
        let out = common::batched(&e, &reqs, 5);
        for (i, (got, streamed)) in out.iter().enumerate() {
            let c = mine[i / 2];
            let label = format!("{}, request {i}", c["name"]);
            let want = if i % 2 == 0 {
                greedy(c)
            } else {
                e.generate(&reqs[i], &mut |_| Flow::Continue)
                    .unwrap()
                    .token_ids
            };
            assert_eq!(got.token_ids, want, "{label}");
            assert_eq!(streamed, &got.text, "{label}: streamed text");
        }
    }
}

#[test]
fn pruned_answers_report_kept_tokens_fastv_runs_and_video_is_refused() {
    let m = manifest();
    let c = &m["cases"][1]; // two images
    assert_eq!(c["images"].as_array().unwrap().len(), 2);
    let e = Engine::load(
        &root().join(c["model"].as_str().unwrap()),
        EngineOptions::single_request(),
    )
    .unwrap();
    let r = Request {
        prune: Some(PruneSpec::new(Policy::Adaptive, Budget::Ratio(0.5))),
        max_new_tokens: 4,
        ignore_eos: true,
        ..Request::new(prompt(c))
    };
    let got = e.generate(&r, &mut |_| Flow::Continue).unwrap();
    assert_eq!(got.token_ids.len(), 4);
    let grids: Vec<Vec<usize>> = serde_json::from_value(c["image_grid_thw"].clone()).unwrap();
    let mut kept = 0;
    for (k, g) in got.kept_patches.iter().zip(&grids) {
        let (rows, cols) = (g[1] / 2, g[2] / 2);
        assert_eq!((k.rows, k.cols), (rows, cols));
        assert_eq!(k.kept.len(), Budget::Ratio(0.5).resolve(rows * cols));
        assert!(k.kept.windows(2).all(|w| w[0] < w[1]));
        assert!(k.kept.iter().all(|&i| (i as usize) < rows * cols));
        kept += k.kept.len();
    }
    assert_eq!(got.kept_patches.len(), 2);
    assert_eq!(got.usage.kept_visual_tokens, kept);
    assert_eq!(
        got.usage.prompt_rows,
        got.usage.prompt_tokens - (got.usage.visual_tokens - kept)
    );
    let r = Request {
        prune: Some(PruneSpec::new(Policy::FastV, Budget::Ratio(0.5))),
        max_new_tokens: 2,
        ignore_eos: true,
        ..Request::new(prompt(c))
    };
    let got = e.generate(&r, &mut |_| Flow::Continue).unwrap();
    assert_eq!(got.token_ids.len(), 2);
    let half: usize = grids
        .iter()
        .map(|g| Budget::Ratio(0.5).resolve(g[1] * g[2] / 4))
        .sum();
    assert_eq!(got.usage.kept_visual_tokens, half);
    let raw = Prompt::Raw {
        text: "<|vision_start|><|video_pad|><|vision_end|>What happens?".into(),
        images: Vec::new(),
    };
    let err = e.prompt_logits(&raw).unwrap_err().to_string();
    assert!(err.contains("video"), "{err}");
}

/// A draft head shaped for the target in `dir` (its text config: nested in transformers 5's
/// layout, the whole config in the published one), random weights.
fn random_head(
    dir: &std::path::Path,
    adaptor: Option<usize>,
    injection: bool,
    seed: u64,
) -> glance_models::draft::DraftHead {
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let text = config.get("text_config").cloned().unwrap_or(config);
    let config = glance_models::draft::DraftConfig::for_target(&text, adaptor, injection).unwrap();
    glance_models::draft::DraftHead::from_var_builder(
        &glance_models::random::random_var_builder(seed, &Device::Cpu),
        config,
        glance_nn::Mode::Infer,
    )
    .unwrap()
}

/// Speculative decoding is lossless on M-RoPE prompts: greedy ViSpec and EAGLE output (untrained
/// heads, tree and chain, with and without pruning) is autoregressive decoding's, token for token.
#[test]
fn greedy_speculative_output_equals_autoregressive() {
    let m = manifest();
    for (name, facts) in m["models"].as_object().unwrap() {
        let dir = root().join(facts["dir"].as_str().unwrap());
        let e = Engine::load(&dir, EngineOptions::default()).unwrap();
        e.set_draft(std::sync::Arc::new(random_head(&dir, Some(4), true, 1)));
        e.set_draft(std::sync::Arc::new(random_head(&dir, None, false, 2)));
        let case = m["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["model"] == facts["dir"] && c["images"].as_array().unwrap().len() == 2)
            .unwrap();
        for prune in [
            None,
            Some(PruneSpec::new(Policy::Adaptive, Budget::Ratio(0.5))),
        ] {
            let ar = Request {
                max_new_tokens: 16,
                ignore_eos: true,
                decode: DecodeSpec::Autoregressive,
                prune: prune.clone(),
                ..Request::new(prompt(case))
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

/// Block diffusion's self-speculative modes are lossless on M-RoPE prompts: a Qwen2-VL copy
/// marked as converted (`block_diffusion` in its config.json; the weights are the causal ones,
/// which is all the lossless contract needs) decodes, linear and quadratic, exactly as
/// autoregressive decoding.
#[test]
fn block_diffusion_self_speculation_equals_autoregressive() {
    let m = manifest();
    for (name, facts) in m["models"].as_object().unwrap() {
        let src = root().join(facts["dir"].as_str().unwrap());
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("qwen-dvlm-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        for entry in std::fs::read_dir(&src).unwrap() {
            let p = entry.unwrap().path();
            std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
        }
        let mut config: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        // <|endoftext|>, never in the fixtures' prompts, stands in for the trained mask token.
        let mask = facts["tokenizer_len"].as_u64().unwrap() - 6;
        config["block_diffusion"] = serde_json::json!({"mask_token_id": mask, "block_size": 4});
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        let e = Engine::load(&dir, EngineOptions::default()).unwrap();
        let case = m["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["model"] == facts["dir"])
            .unwrap();
        let ar = Request {
            max_new_tokens: 12,
            ignore_eos: true,
            decode: DecodeSpec::Autoregressive,
            ..Request::new(prompt(case))
        };
        let want = e.generate(&ar, &mut |_| Flow::Continue).unwrap();
        for spec in [
            DecodeSpec::diffusion(DiffusionMode::Linear),
            DecodeSpec::diffusion(DiffusionMode::Quadratic),
        ] {
            let r = Request {
                decode: spec.clone(),
                ..ar.clone()
            };
            let got = e.generate(&r, &mut |_| Flow::Continue).unwrap();
            assert_eq!(got.token_ids, want.token_ids, "{name} {spec}");
            assert_eq!(got.decode.strategy, spec.name());
        }
    }
}
