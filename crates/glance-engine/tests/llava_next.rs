//! LLaVA-NeXT through the whole request path (image file bytes → header size → anyres token
//! counts → chat template → tiles → vision tower → packed features → prefill → decoding strategy)
//! against transformers' fixtures (`fixtures/llava_next/`, `scripts/make_llava_next_fixtures.py`):
//! the prompt's logits, visual token counts and greedy tokens, with and without the caches,
//! batched, with speculative and block-diffusion decoding, packed weights and every pruning
//! policy.

mod common;

use candle_core::{Device, Tensor};
use glance_engine::{
    Budget, DecodeSpec, Engine, EngineOptions, Event, Flow, ImageInput, Policy, Prompt, PruneSpec,
    Request,
};
use glance_engine::{DiffusionMode, DraftKind};
use serde_json::Value;
use std::path::PathBuf;

fn root() -> PathBuf {
    common::fixtures("llava_next")
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

fn ids(t: &Tensor) -> Vec<u32> {
    t.to_vec1::<i64>()
        .unwrap()
        .into_iter()
        .map(|x| x as u32)
        .collect()
}

fn cases(m: &Value) -> Vec<Value> {
    m["cases"].as_array().unwrap().clone()
}

fn two_image_case(m: &Value, model: &str) -> Value {
    cases(m)
        .into_iter()
        .find(|c| c["model"] == model && c["images"].as_array().unwrap().len() == 2)
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
            let t = tensors(&c);
            let p = prompt(&c);
            // The fixture keeps the text rows' logits.
            let rows = Tensor::new(ids(&t["logits_rows"]), &Device::Cpu).unwrap();
            let logits = e.prompt_logits(&p).unwrap().index_select(&rows, 0).unwrap();
            let d: f32 = (&logits - &t["logits"])
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar()
                .unwrap();
            assert!(d <= 1e-4, "{name}: logits differ by {d}");
            let want = ids(&t["greedy_ids"]);
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

/// Every case of a model in one batch (all joining at once, prompts prefilled in chunks of 16
/// rows) answers as each does alone.
#[test]
fn batched_requests_answer_as_alone() {
    let m = manifest();
    for model in ["models/llava-next-mistral", "models/llava-next-vicuna"] {
        let e = Engine::load(&root().join(model), EngineOptions::default()).unwrap();
        let reqs: Vec<Request> = cases(&m)
            .iter()
            .filter(|c| c["model"] == model)
            .map(|c| Request {
                max_new_tokens: 8,
                ignore_eos: true,
                ..Request::new(prompt(c))
            })
            .collect();
        assert!(reqs.len() >= 3);
        let solo: Vec<Vec<u32>> = reqs
            .iter()
            .map(|r| e.generate(r, &mut |_| Flow::Continue).unwrap().token_ids)
            .collect();
        let mut seqs: Vec<_> = reqs
            .iter()
            .map(|r| {
                let sink = Box::new(|_: Event| Flow::Continue);
                e.sequence(e.prepare(r).unwrap(), sink).unwrap()
            })
            .collect();
        let mut steps = 0;
        while seqs.iter().any(|s| !s.is_done()) {
            e.step(&mut seqs, 16);
            steps += 1;
            assert!(steps < 1000, "the batch never finished");
        }
        for (i, s) in seqs.into_iter().enumerate() {
            let got = s.into_response().unwrap();
            assert_eq!(got.token_ids, solo[i], "{model} request {i}");
        }
    }
}

/// A draft head shaped for the target in `dir`, random weights.
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

/// Speculative decoding is lossless on anyres prompts: greedy ViSpec and EAGLE output (untrained
/// heads, tree and chain, with and without pruning) is autoregressive decoding's, token for token.
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
                    let label = format!("{name} {kind} {tree:?} prune {prune:?}");
                    assert_eq!(got.token_ids, want.token_ids, "{label}");
                    assert!(got.decode.counters["drafts"] >= 1);
                }
            }
        }
    }
}

/// `--weights` bf16 / q8 / q4 run the whole request path: the answer has every token, and the
/// prompt's logits stay near f32's (random weights, so only loosely).
#[test]
fn packed_weight_formats_answer() {
    let m = manifest();
    let c = two_image_case(&m, "models/llava-next-mistral");
    let dir = root().join("models/llava-next-mistral");
    let want = Engine::load(&dir, EngineOptions::single_request())
        .unwrap()
        .prompt_logits(&prompt(&c))
        .unwrap();
    for (f, max_err) in [
        (glance_engine::WeightFormat::Bf16, 0.2),
        (glance_engine::WeightFormat::Q8, 0.5),
        (glance_engine::WeightFormat::Q4, 4.0),
    ] {
        let e = Engine::load(&dir, EngineOptions::single_request().with_weights(f)).unwrap();
        let got = e.prompt_logits(&prompt(&c)).unwrap();
        let d: f32 = (&got - &want)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        println!("{f}: max-abs {d:.3}");
        assert!(d > 0.0 && d <= max_err, "{f}: logits differ by {d}");
        let r = Request {
            max_new_tokens: 6,
            ignore_eos: true,
            ..Request::new(prompt(&c))
        };
        let got = e.generate(&r, &mut |_| Flow::Continue).unwrap();
        assert_eq!(got.token_ids.len(), 6, "{f}");
        assert_eq!(
            got.usage.visual_tokens,
            c["n_image_tokens"].as_u64().unwrap() as usize
        );
    }
}

/// Every pruning policy, with the global and the per-tile (HiRED) budget, on a two-image prompt:
/// each image keeps its budget, every newline row at its own position, every other kept row at
/// the position of the token it is (or, merged, stands for); the pruned prompt decodes end to
/// end through the engine.
#[test]
fn every_pruning_policy_keeps_positions_and_newline_rows() {
    use glance_engine::TileBudget;
    use glance_models::llava::{Llava, LlavaConfig, LlavaProcessor, SegmentKind};
    let m = manifest();
    let c = two_image_case(&m, "models/llava-next-vicuna");
    let dir = root().join("models/llava-next-vicuna");
    let model = Llava::load(&dir, &Device::Cpu).unwrap();
    let processor = LlavaProcessor::from_dir(&dir, &LlavaConfig::from_dir(&dir).unwrap()).unwrap();
    let encodings: Vec<_> = c["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let img =
                glance_models::processing::image::load_image(&root().join(i.as_str().unwrap()))
                    .unwrap();
            model.encode_picture(&processor, &img).unwrap()
        })
        .collect();
    let refs: Vec<_> = encodings.iter().collect();
    let ids = ids(&tensors(&c)["input_ids"]);
    let feats: Vec<&Tensor> = encodings.iter().map(|e| &e.features).collect();
    let query = processor
        .query_ids("Describe the picture in detail.")
        .unwrap();
    let budget = Budget::Ratio(0.3);
    let e = Engine::load(&dir, EngineOptions::default()).unwrap();
    for policy in Policy::ALL
        .into_iter()
        .filter(|p| !matches!(p, Policy::None | Policy::FastV))
    {
        for tiles in [TileBudget::Global, TileBudget::PerTile] {
            let label = format!("{policy} {tiles:?}");
            let spec = PruneSpec {
                tiles,
                ..PruneSpec::new(policy, budget)
            };
            let plan = model.plan(&ids, &feats).unwrap();
            let pruned = glance_prune::transform(&model, plan, &refs, &query, &spec).unwrap();
            let mut kept = 0;
            for seg in &pruned.plan.segments {
                let SegmentKind::Image { index } = seg.kind else {
                    continue;
                };
                let enc = &encodings[index];
                let layout = enc.anyres.as_ref().unwrap().layout;
                let start = seg.source.start;
                assert_eq!(seg.positions.len(), budget.resolve(layout.len()), "{label}");
                assert!(seg.positions.windows(2).all(|w| w[0] < w[1]), "{label}");
                let local: Vec<usize> = seg.positions.iter().map(|&p| p as usize - start).collect();
                assert!(local.iter().all(|&i| i < layout.len()), "{label}");
                let newlines = (0..layout.len()).filter(|&i| layout.is_newline(i));
                for i in newlines {
                    assert!(local.contains(&i), "{label}: newline row {i} dropped");
                }
                // Subset policies keep the rows themselves.
                if !matches!(policy, Policy::Pool | Policy::Hier) {
                    let idx = Tensor::new(
                        local.iter().map(|&i| i as u32).collect::<Vec<_>>(),
                        &Device::Cpu,
                    )
                    .unwrap();
                    let want = enc.features.index_select(&idx, 0).unwrap();
                    let d: f32 = (&seg.rows - &want)
                        .unwrap()
                        .abs()
                        .unwrap()
                        .max_all()
                        .unwrap()
                        .to_scalar()
                        .unwrap();
                    assert_eq!(d, 0.0, "{label}: a kept row moved");
                }
                kept += seg.positions.len();
            }
            assert_eq!(pruned.stats.kept_visual_tokens, kept, "{label}");
            let r = Request {
                prune: Some(spec.clone()),
                max_new_tokens: 4,
                ignore_eos: true,
                ..Request::new(prompt(&c))
            };
            let got = e.generate(&r, &mut |_| Flow::Continue).unwrap();
            assert_eq!(got.token_ids.len(), 4, "{label}");
            assert_eq!(got.usage.kept_visual_tokens, kept, "{label}");
            assert_eq!(
                got.usage.prompt_rows,
                got.usage.prompt_tokens - (got.usage.visual_tokens - kept),
                "{label}"
            );
            let base = (layout_side(&model), layout_side(&model));
            for k in &got.kept_patches {
                assert_eq!((k.rows, k.cols), base, "{label}");
                assert!(k.kept.iter().all(|&i| (i as usize) < base.0 * base.1));
            }
        }
    }
    // FastV cuts inside the decoder: it runs on anyres prompts too, and a per-tile budget is
    // refused for it by name.
    let r = Request {
        prune: Some(PruneSpec::new(Policy::FastV, budget)),
        max_new_tokens: 4,
        ignore_eos: true,
        ..Request::new(prompt(&c))
    };
    let got = e.generate(&r, &mut |_| Flow::Continue).unwrap();
    assert_eq!(got.token_ids.len(), 4);
    assert!(got.usage.kept_visual_tokens < got.usage.visual_tokens);
    let spec = PruneSpec {
        tiles: TileBudget::PerTile,
        ..PruneSpec::new(Policy::FastV, budget)
    };
    assert!(spec
        .validate()
        .unwrap_err()
        .to_string()
        .contains("per-tile"));
}

/// The per-tile budget shares the tiles' part by the base image's attention: on an image whose
/// tiles differ, some tile keeps a different number of tokens than under the global budget's
/// uniform share, and the totals agree.
#[test]
fn per_tile_budget_follows_tile_saliency() {
    use glance_engine::TileBudget;
    use glance_models::llava::{Llava, LlavaConfig, LlavaProcessor};
    let dir = root().join("models/llava-next-mistral");
    let model = Llava::load(&dir, &Device::Cpu).unwrap();
    let processor = LlavaProcessor::from_dir(&dir, &LlavaConfig::from_dir(&dir).unwrap()).unwrap();
    let img =
        glance_models::processing::image::load_image(&root().join("images/astronaut.png")).unwrap();
    let enc = model.encode_picture(&processor, &img).unwrap();
    let s = enc.anyres.as_ref().unwrap();
    let layout = s.layout;
    let n = layout.len();
    let prompt_ids: Vec<u32> = vec![model.config().image_token_id; n];
    let per_tile = |tiles: TileBudget| -> Vec<usize> {
        let spec = PruneSpec {
            tiles,
            ..PruneSpec::new(Policy::Saliency, Budget::Ratio(0.3))
        };
        let plan = model.plan(&prompt_ids, &[&enc.features]).unwrap();
        let pruned = glance_prune::transform(&model, plan, &[&enc], &[], &spec).unwrap();
        let mut counts = vec![0; s.tiles.0 * s.tiles.1];
        for &p in &pruned.plan.segments[0].positions {
            let i = p as usize;
            if i >= layout.base && !layout.is_newline(i) {
                let g = i - layout.base;
                let (r, c) = (g / (layout.cols + 1), g % (layout.cols + 1));
                counts[s.tile_of[r * layout.cols + c]] += 1;
            }
        }
        counts
    };
    let (global, tiled) = (per_tile(TileBudget::Global), per_tile(TileBudget::PerTile));
    println!("kept per tile: global {global:?}, per-tile {tiled:?}");
    assert_eq!(global.iter().sum::<usize>(), tiled.iter().sum::<usize>());
    assert_ne!(global, tiled);
}

fn layout_side(model: &glance_models::llava::Llava) -> usize {
    model.config().vision.grid()
}

/// Images far more elongated than any pinpoint unpad to one row, or to newline rows only: every
/// policy still prunes them (the base image carries the budget) and answers.
#[test]
fn extreme_aspect_images_prune_and_answer() {
    let dir = root().join("models/llava-next-vicuna");
    let e = Engine::load(&dir, EngineOptions::default()).unwrap();
    for (w, h) in [(1000u32, 1u32), (1, 1000)] {
        let img = image::DynamicImage::ImageRgb8(image::RgbImage::from_pixel(
            w,
            h,
            image::Rgb([200, 10, 10]),
        ));
        for policy in [Policy::Adaptive, Policy::Pool, Policy::Hier, Policy::FastV] {
            let mut r = Request::chat(
                "What colour is the strip?",
                vec![ImageInput::decoded(img.clone())],
            );
            r.prune = Some(PruneSpec::new(policy, Budget::Ratio(0.25)));
            r.max_new_tokens = 3;
            r.ignore_eos = true;
            let got = e.generate(&r, &mut |_| Flow::Continue).unwrap();
            assert_eq!(got.token_ids.len(), 3, "{w}x{h} {policy}");
            assert!(
                got.usage.kept_visual_tokens < got.usage.visual_tokens,
                "{w}x{h} {policy}: {:?}",
                got.usage
            );
        }
    }
}

/// Block diffusion's self-speculative modes are lossless on anyres prompts: a LLaVA-NeXT copy
/// marked as converted (`block_diffusion` in its config.json; the causal weights are all the
/// lossless contract needs) decodes, linear and quadratic, exactly as autoregressive decoding.
#[test]
fn block_diffusion_self_speculation_equals_autoregressive() {
    let m = manifest();
    let src = root().join("models/llava-next-mistral");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("llava-next-dvlm");
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    // <unk> (id 0), never in the fixtures' prompts, stands in for the trained mask token.
    config["block_diffusion"] = serde_json::json!({"mask_token_id": 0, "block_size": 4});
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let e = Engine::load(&dir, EngineOptions::default()).unwrap();
    let case = two_image_case(&m, "models/llava-next-mistral");
    let ar = Request {
        max_new_tokens: 12,
        ignore_eos: true,
        decode: DecodeSpec::Autoregressive,
        ..Request::new(prompt(&case))
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
        assert_eq!(got.token_ids, want.token_ids, "{spec}");
        assert_eq!(got.decode.strategy, spec.name());
    }
}
