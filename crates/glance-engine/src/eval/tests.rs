//! Tests of the evaluation runner on the committed random-weight fixture `llama-gqa`.

use super::*;
use crate::EngineOptions;
use glance_prune::{Budget, Policy};
use std::path::PathBuf;

fn fixture(options: EngineOptions) -> Engine {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/llama-gqa");
    Engine::load(&dir, options).unwrap()
}

/// With the caches on (shared encodings, forked prompt prefixes) every answer equals the answer of
/// an engine without caches, which prefills each whole prompt in one pass.
#[test]
fn cached_prefixes_answer_like_a_full_prefill() {
    let options = EvalOptions {
        short_max_new_tokens: 6,
        max_new_tokens: 8,
        record_answers: true,
        ..EvalOptions::new(Split::Test, 2)
    };
    let cached = evaluate(
        &fixture(EngineOptions::default()),
        &options,
        None,
        &mut |_| {},
    )
    .unwrap();
    let plain = evaluate(
        &fixture(EngineOptions::single_request()),
        &options,
        None,
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(cached.questions, cached.answers.len());
    assert!(cached.questions >= 10);
    assert_eq!(cached.answers.len(), plain.answers.len());
    for (a, b) in cached.answers.iter().zip(&plain.answers) {
        assert_eq!((&a.question, &a.answer), (&b.question, &b.answer));
        assert_eq!(a.generated_tokens, b.generated_tokens);
        assert!(a.ttft_s > 0.0 && b.ttft_s > 0.0);
    }
}

#[test]
fn caps_per_family_and_evaluates_every_spec() {
    let engine = fixture(EngineOptions::default());
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
    let reports = evaluate_specs(&engine, &options, &specs, &mut |_| {}).unwrap();
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
    assert!(evaluate(&engine, &bad, None, &mut |_| {}).is_err());
}
