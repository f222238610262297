//! Pruning Qwen2-VL / Qwen2.5-VL prompts on the fixtures of `scripts/make_qwen_fixtures.py`:
//! every pre-LLM policy keeps the budget of each image, in spatial order, each kept token at its
//! own 3-D (M-RoPE) position and every text row at its own; keeping every token is exactly the
//! unpruned prefill; FastV keeps its rows at their 3-D positions; pruned generation runs end to
//! end.

use candle_core::Device;
use glance_core::SamplingParams;
use glance_decode::{Autoregressive, DecodeStrategy, GenerateConfig, Sampler};
use glance_models::qwen2_vl::{Qwen2Vl, QwenImageEncoding, QwenPixels};
use glance_prune::{prefill_qwen, transform_qwen, Budget, Policy, PruneSpec};
use serde_json::Value;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen2_vl")
}

struct Case {
    name: String,
    model: Qwen2Vl,
    ids: Vec<u32>,
    images: Vec<QwenImageEncoding>,
}

fn cases() -> Vec<Case> {
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("manifest.json")).unwrap())
            .unwrap();
    let pixels = |image: &Value| {
        let e = m["pixels"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| &e["image"] == image)
            .unwrap();
        let t = candle_core::safetensors::load(
            root().join(e["tensors"].as_str().unwrap()),
            &Device::Cpu,
        )
        .unwrap();
        let g: Vec<i64> = t["image_grid_thw"].to_vec1().unwrap();
        QwenPixels {
            patches: t["pixel_values"].clone(),
            grid_thw: [g[0] as usize, g[1] as usize, g[2] as usize],
        }
    };
    m["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let model =
                Qwen2Vl::load(&root().join(c["model"].as_str().unwrap()), &Device::Cpu).unwrap();
            let t = candle_core::safetensors::load(
                root().join(c["tensors"].as_str().unwrap()),
                &Device::Cpu,
            )
            .unwrap();
            let ids = t["input_ids"]
                .to_vec1::<i64>()
                .unwrap()
                .into_iter()
                .map(|x| x as u32)
                .collect();
            let images = c["images"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| model.encode_image(&pixels(i)).unwrap())
                .collect();
            Case {
                name: c["name"].as_str().unwrap().into(),
                model,
                ids,
                images,
            }
        })
        .collect()
}

#[test]
fn kept_tokens_keep_their_own_3d_positions_under_every_policy() {
    let query = [10u32, 11, 12];
    for c in &cases() {
        let refs: Vec<&QwenImageEncoding> = c.images.iter().collect();
        let plan = c.model.plan(&c.ids, &refs).unwrap();
        let full = plan.mrope_positions().unwrap();
        for policy in [
            Policy::Random,
            Policy::Pool,
            Policy::Saliency,
            Policy::Text,
            Policy::Mix,
            Policy::Adaptive,
            Policy::Hier,
        ] {
            let spec = PruneSpec::new(policy, Budget::Ratio(0.5));
            let pruned = transform_qwen(&c.model, plan.clone(), &refs, &query, &spec).unwrap();
            let mut kept_total = 0;
            for (seg, orig) in pruned.plan.segments.iter().zip(&plan.segments) {
                assert_eq!(seg.source, orig.source);
                let (mine, theirs) = (seg.mrope.as_ref(), orig.mrope.as_ref());
                match (mine, theirs) {
                    (None, None) => assert_eq!(seg.positions, orig.positions),
                    (Some(kept), Some(all)) => {
                        let n = all.len();
                        assert_eq!(kept.len(), Budget::Ratio(0.5).resolve(n), "{}", c.name);
                        assert_eq!(seg.rows.dim(0).unwrap(), kept.len());
                        // Each kept token at one of the image's own positions, in raster order.
                        let at: Vec<usize> = kept
                            .iter()
                            .map(|p| all.iter().position(|q| q == p).unwrap())
                            .collect();
                        assert!(at.windows(2).all(|w| w[0] < w[1]), "{} {policy}", c.name);
                        assert!(kept.iter().any(|p| p[1] != p[2] || p[1] != p[0]));
                        kept_total += kept.len();
                    }
                    _ => panic!("segment kinds differ"),
                }
            }
            assert_eq!(pruned.stats.kept_visual_tokens, kept_total);
            // The rows after the last image keep their positions: decoding continues as unpruned.
            let pos = pruned.plan.mrope_positions().unwrap();
            assert_eq!(pos.last(), full.last());
            let state = prefill_qwen(&c.model, &pruned).unwrap();
            assert_eq!(state.prompt_len(), pos.len());
            let cfg = GenerateConfig {
                max_new_tokens: 3,
                eos_token_ids: vec![],
            };
            let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
            let g = Autoregressive
                .decode(c.model.text(), state, sampler, &cfg, &mut |_| Ok(false))
                .unwrap();
            assert_eq!(g.tokens.len(), 3);
        }
    }
}

#[test]
fn keeping_every_token_is_the_unpruned_prefill_and_fastv_cuts_at_3d_positions() {
    for c in cases().iter().take(2) {
        let refs: Vec<&QwenImageEncoding> = c.images.iter().collect();
        let plan = c.model.plan(&c.ids, &refs).unwrap();
        let unpruned = glance_decode::prefill_mrope(
            c.model.text(),
            &plan.rows().unwrap(),
            &plan.mrope_positions().unwrap(),
        )
        .unwrap();
        let spec = PruneSpec::new(Policy::Saliency, Budget::Count(100_000));
        let pruned = transform_qwen(&c.model, plan.clone(), &refs, &[], &spec).unwrap();
        let state = prefill_qwen(&c.model, &pruned).unwrap();
        let d: f32 = (&state.hidden - &unpruned.hidden)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert_eq!(d, 0.0, "{}", c.name);
        assert_eq!(state.positions, unpruned.positions);
        // FastV keeping every visual row is the unpruned prefill too.
        let all = PruneSpec::new(Policy::FastV, Budget::Count(100_000));
        let pruned = transform_qwen(&c.model, plan.clone(), &refs, &[], &all).unwrap();
        let state = prefill_qwen(&c.model, &pruned).unwrap();
        assert_eq!(state.positions, unpruned.positions, "{}", c.name);
        let d: f32 = (&state.hidden - &unpruned.hidden)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert_eq!(d, 0.0, "{}", c.name);
        // At half the visual rows: the cut happens inside the decoder, every text row stays, and
        // the kept rows keep their positions (the largest parts of their 3-D ones).
        let fastv = PruneSpec::new(Policy::FastV, Budget::Ratio(0.5));
        let pruned = transform_qwen(&c.model, plan.clone(), &refs, &[], &fastv).unwrap();
        let cut = pruned.fastv.as_ref().expect("a FastV cut");
        let visual: usize = plan.image_rows().iter().map(|r| r.len()).sum();
        assert_eq!(cut.visual.len(), visual);
        let state = prefill_qwen(&c.model, &pruned).unwrap();
        let t = unpruned.positions.len();
        assert_eq!(state.positions.len(), t - (visual - cut.keep), "{}", c.name);
        let mut rest = unpruned.positions.iter();
        assert!(
            state.positions.iter().all(|p| rest.any(|q| q == p)),
            "kept positions are a subsequence of the prompt's"
        );
        assert_eq!(state.positions.last(), unpruned.positions.last());
        assert_eq!(
            state.hidden.dims(),
            &[state.positions.len(), unpruned.hidden.dim(1).unwrap()]
        );
    }
}
