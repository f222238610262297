//! Tests of the evaluation runner on the committed random-weight fixture `llama-gqa`.

use super::*;
use glance_models::llava::LlavaConfig;
use glance_prune::{Budget, Policy};
use std::path::PathBuf;

fn fixture() -> (Llava, LlavaProcessor) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/llama-gqa");
    let config = LlavaConfig::from_dir(&dir).unwrap();
    let processor = LlavaProcessor::from_dir(&dir, &config).unwrap();
    (Llava::load(&dir, &Device::Cpu).unwrap(), processor)
}

/// The shared-prefix (forked cache) path answers as a plain unpruned prefill of each prompt.
#[test]
fn forked_prefix_answers_like_a_full_prefill() {
    let (model, processor) = fixture();
    let options = EvalOptions {
        short_max_new_tokens: 6,
        max_new_tokens: 8,
        record_answers: true,
        ..EvalOptions::new(Split::Test, 2)
    };
    let r = evaluate(&model, &processor, &options, None, &mut |_| {}).unwrap();
    assert_eq!(r.questions, r.answers.len());
    assert!(r.questions >= 10);
    for a in &r.answers {
        let ex = glance_world::sample(Split::Test, a.image).unwrap();
        let img = image::DynamicImage::ImageRgb8(ex.image.clone());
        let pixels = processor
            .image
            .preprocess_tensor(&img, &Device::Cpu)
            .unwrap();
        let enc = model.encode_image(&pixels).unwrap();
        let ids = processor
            .prepare(&a.question, 1, PromptFormat::Chat)
            .unwrap()
            .ids;
        let p = prefill_llava(&model, &ids, &[&enc], &[], &PruneSpec::default()).unwrap();
        let max = if a.family == Family::Description {
            8
        } else {
            6
        };
        let config = GenerateConfig {
            max_new_tokens: max,
            sampling: SamplingParams::greedy(),
            eos_token_ids: processor.text.eos_token_ids().to_vec(),
        };
        let sampler = Sampler::new(config.sampling.clone()).unwrap();
        let g = decode(model.text(), p.state, sampler, &config, &mut |_| Ok(false)).unwrap();
        let want = processor.text.decode(&g.tokens, true).unwrap();
        assert_eq!(a.answer, want, "{}", a.question);
    }
}

#[test]
fn caps_per_family_and_evaluates_every_spec() {
    let (model, processor) = fixture();
    let options = EvalOptions {
        per_family: Some(1),
        short_max_new_tokens: 2,
        max_new_tokens: 2,
        ..EvalOptions::new(Split::Validation, 8)
    };
    let specs = [
        PruneSpec::default(),
        PruneSpec::new(Policy::Adaptive, Budget::Ratio(0.25)),
    ];
    let reports = evaluate_specs(&model, &processor, &options, &specs, &mut |_| {}).unwrap();
    assert_eq!(reports.len(), 2);
    for r in &reports {
        assert_eq!(r.families.len(), 6);
        assert!(r.families.iter().all(|f| f.questions == 1), "{r:?}");
        assert!(r.images < 8, "stops once every family has its question");
        let d = r.description.unwrap();
        assert!((0.0..=1.0).contains(&d.f1));
    }
    assert_eq!(reports[0].prune.mean_kept_visual_tokens, 16.0);
    assert_eq!(reports[1].prune.mean_kept_visual_tokens, 4.0);
    assert_eq!(reports[1].prune.policy, "adaptive");
    let bad = EvalOptions::new(Split::Test, 0);
    assert!(evaluate(&model, &processor, &bad, None, &mut |_| {}).is_err());
}
