//! `--decode auto` and cost-aware speculation through the engine: what `auto` chooses under a
//! given cost model, that every choice (plain rounds, drafted rounds, the draft's late start)
//! keeps greedy output equal to autoregressive decoding's, and the on-disk cost cache.

use glance_decode::{CostModel, DraftCost};
use glance_engine::{
    DecodeSpec, DraftKind, Engine, EngineOptions, Flow, ImageInput, Request, Response,
};
use glance_prune::{Budget, Policy, PruneSpec};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn tiny() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/glance-tiny")
}

fn run(e: &Engine, r: &Request) -> Response {
    e.generate(r, &mut |_| Flow::Continue).unwrap()
}

/// `ar` (a request decoded autoregressively) and the same request with `auto`: `auto`'s
/// response, its greedy tokens checked against `ar`'s (`what` names the case).
fn auto_against_ar(e: &Engine, ar: &Request, what: &str) -> Response {
    let want = run(e, ar);
    let got = run(
        e,
        &Request {
            decode: DecodeSpec::auto(),
            ..ar.clone()
        },
    );
    assert_eq!(got.token_ids, want.token_ids, "{what}");
    got
}

/// The cost model's key of glance-tiny's shipped `kind` head.
fn head_key(kind: &str) -> String {
    let dir = tiny().join(format!("draft-{kind}"));
    let head = glance_models::draft::DraftHead::load(&dir, &candle_core::Device::Cpu).unwrap();
    glance_decode::cost::draft_key(&head)
}

/// A cost model: a pass over `k` rows costs `1 + slope (k - 1)`; both heads' draft steps cost
/// `step` and a draft prompt row `row`.
fn cost(slope: f64, step: f64, row: f64) -> CostModel {
    let rows: Vec<usize> = (1..=32).collect();
    let pass_s = rows.iter().map(|&k| 1.0 + slope * (k - 1) as f64).collect();
    let draft = DraftCost {
        step_s: vec![step; 4],
        row_s: row,
    };
    CostModel {
        key: "test".into(),
        rows,
        pass_s,
        // Under the shipped heads' own keys (with their reduced vocabularies): a head the
        // model lacks figures for would be measured on this machine instead.
        drafts: BTreeMap::from([
            (head_key("vispec"), draft.clone()),
            (head_key("eagle"), draft),
        ]),
        measured_s: 0.0,
        // Made-up figures that force a plan on a model they do not describe: trust them, not
        // the clock.
        clock_corrected: false,
    }
}

fn world(index: u64) -> (ImageInput, Vec<String>) {
    let ex = glance_world::sample(glance_world::Split::Test, index).unwrap();
    let image = ImageInput::decoded(image::DynamicImage::ImageRgb8(ex.image.clone()));
    (
        image,
        ex.questions.iter().map(|q| q.question.clone()).collect(),
    )
}

/// Where a draft pays (a pass over many rows costs little more than one), `auto` runs
/// cost-aware speculation with the head predicted fastest, and its greedy tokens are
/// autoregressive decoding's, with and without pruning; trained heads are accepted.
#[test]
fn auto_speculates_where_drafts_pay_and_stays_lossless() {
    let e = Engine::load(&tiny(), EngineOptions::default()).unwrap();
    e.set_cost_model(cost(0.05, 0.05, 0.0)).unwrap();
    let tight = Some(PruneSpec::new(Policy::Adaptive, Budget::Ratio(0.125)));
    let (mut decoded, mut passes) = (0usize, 0u64);
    for index in 0..3 {
        let (image, questions) = world(index);
        let mut prompts: Vec<(String, usize)> = questions.into_iter().map(|q| (q, 16)).collect();
        prompts.push(("Describe the image in detail.".into(), 160));
        for (text, n) in prompts {
            for prune in [None, tight.clone()] {
                let ar = Request {
                    max_new_tokens: n,
                    prune: prune.clone(),
                    ..Request::chat(&text, vec![image.clone()])
                };
                let got = auto_against_ar(&e, &ar, &format!("{index} {text:?} {prune:?}"));
                // The shipped heads' recorded acceptance, at equal draft costs: EAGLE's drafts
                // are accepted more often.
                assert_eq!(got.decode.strategy, "eagle");
                let why = got.decode.auto.as_deref().unwrap();
                assert!(why.contains("cost-aware"), "{why}");
                assert!(
                    why.contains("(measured)") && why.contains("; vispec predicted"),
                    "{why}"
                );
                if n > 16 && prune.is_none() {
                    decoded += got.token_ids.len() - 1;
                    passes += got.decode.forward_passes;
                }
            }
        }
    }
    let per_pass = decoded as f64 / passes as f64;
    assert!(per_pass >= 2.0, "{per_pass:.2} tokens per target pass");
    // Text only: the EAGLE head.
    let text = Request {
        max_new_tokens: 24,
        decode: DecodeSpec::auto(),
        ..Request::chat("What is a red circle?", vec![])
    };
    let got = run(&e, &text);
    assert_eq!(got.decode.strategy, "eagle");
    let ar = run(
        &e,
        &Request {
            decode: DecodeSpec::Autoregressive,
            ..text
        },
    );
    assert_eq!(got.token_ids, ar.token_ids);
}

/// Where a pass over `k` rows costs `k` steps, no draft can pay: `auto` decodes plainly, says
/// why, and its requests can join a batch.
#[test]
fn auto_decodes_plainly_where_no_draft_can_pay() {
    let e = Engine::load(&tiny(), EngineOptions::default()).unwrap();
    e.set_cost_model(cost(1.0, 0.1, 0.0)).unwrap();
    let (image, _) = world(0);
    let r = Request {
        max_new_tokens: 40,
        decode: DecodeSpec::auto(),
        ..Request::chat("Describe the image.", vec![image])
    };
    let got = run(&e, &r);
    assert_eq!(got.decode.strategy, "ar");
    let why = got.decode.auto.as_deref().unwrap();
    assert!(
        why.starts_with("ar: no draft head is predicted to beat a decode step"),
        "{why}"
    );
    assert_eq!(got.decode.forward_passes as usize, got.token_ids.len() - 1);
    assert_eq!(e.prepare(&r).unwrap().strategy(), "ar");
    e.set_cost_model(cost(0.05, 0.05, 0.0)).unwrap();
    assert_eq!(e.prepare(&r).unwrap().strategy(), "eagle");
}

/// Copies of the shipped heads with `acceptance` recorded (`None`: unmeasured), in a scratch
/// directory named `name`.
fn heads_with(name: &str, vispec: Option<Vec<f64>>, eagle: Option<Vec<f64>>) -> Vec<PathBuf> {
    let dir = std::env::temp_dir().join(format!("glance-auto-{name}-{}", std::process::id()));
    [("vispec", vispec), ("eagle", eagle)]
        .into_iter()
        .map(|(kind, acceptance)| {
            let head = dir.join(kind);
            std::fs::create_dir_all(&head).unwrap();
            let shipped = tiny().join(format!("draft-{kind}"));
            std::fs::copy(
                shipped.join("model.safetensors"),
                head.join("model.safetensors"),
            )
            .unwrap();
            let mut config = glance_models::draft::DraftConfig::load(&shipped).unwrap();
            config.acceptance = acceptance;
            config.save(&head).unwrap();
            head
        })
        .collect()
}

/// `auto` chooses among the model's heads by the speed-up each is predicted, from its recorded
/// acceptance: the better-accepted head wins whatever the prompt; unmeasured heads (the prior
/// for both) tie, and the tie goes to ViSpec for a prompt with images and EAGLE for text.
#[test]
fn auto_chooses_the_head_its_measured_acceptance_predicts_fastest() {
    let (image, _) = world(0);
    let with_image = Request {
        max_new_tokens: 8,
        decode: DecodeSpec::auto(),
        ..Request::chat("Describe the image.", vec![image])
    };
    let text = Request {
        max_new_tokens: 8,
        decode: DecodeSpec::auto(),
        ..Request::chat("What is a red circle?", vec![])
    };
    let good = Some(vec![0.95, 0.9, 0.9]);
    let poor = Some(vec![0.5, 0.4]);
    for (name, vispec, eagle, images, words) in [
        (
            "vispec-better",
            good.clone(),
            poor.clone(),
            "vispec",
            "vispec",
        ),
        ("eagle-better", poor.clone(), good.clone(), "eagle", "eagle"),
        ("unmeasured", None, None, "vispec", "eagle"),
    ] {
        let drafts = heads_with(name, vispec, eagle);
        let e = Engine::load(
            &tiny(),
            EngineOptions {
                drafts: drafts.clone(),
                ..EngineOptions::default()
            },
        )
        .unwrap();
        e.set_cost_model(cost(0.05, 0.05, 0.0)).unwrap();
        for (r, want) in [(&with_image, images), (&text, words)] {
            let got = run(&e, r);
            assert_eq!(got.decode.strategy, want, "{name}");
            let ar = run(
                &e,
                &Request {
                    decode: DecodeSpec::Autoregressive,
                    ..r.clone()
                },
            );
            assert_eq!(got.token_ids, ar.token_ids, "{name}");
        }
        std::fs::remove_dir_all(drafts[0].parent().unwrap()).unwrap();
    }
}

/// A draft start that costs several steps and a middling curve: the answer begins plainly (the
/// start is paid only once the rounds after it would earn it back), then drafts; rounds that
/// draft and rounds that do not mix in one answer, and the tokens are still autoregressive
/// decoding's, greedy and seeded.
#[test]
fn plain_and_drafted_rounds_mix_losslessly() {
    let e = Engine::load(&tiny(), EngineOptions::default()).unwrap();
    // A start of ~265 rows at 0.02 steps each (~5 steps), earned back at a round predicted
    // about 1.5× a step after ~16 plain steps.
    e.set_cost_model(cost(0.3, 0.1, 0.02)).unwrap();
    let (image, _) = world(1);
    let ar = Request {
        max_new_tokens: 160,
        ..Request::chat("Describe the image in detail.", vec![image])
    };
    let want = run(&e, &ar);
    let auto = Request {
        decode: DecodeSpec::auto(),
        ..ar.clone()
    };
    let got = run(&e, &auto);
    assert_eq!(got.token_ids, want.token_ids);
    let c = &got.decode.counters;
    assert!(c["plain_rounds"] >= 5, "{c:?}");
    assert!(c["drafts"] >= 1 && c["accepted_tokens"] >= 1, "{c:?}");
    // Seeded sampling: the same answer twice.
    let sampled = Request {
        sampling: glance_core::SamplingParams::sampled(0.8, 7),
        ..auto
    };
    assert_eq!(run(&e, &sampled).token_ids, run(&e, &sampled).token_ids);
}

/// glance-tiny's own figures (measured on an AMD EPYC: c(2) 1.41, c(8) 3.97, a draft step 0.29
/// of a decode step, a prompt row 0.12): a round is predicted a little faster than a step, but
/// the draft's start over a 265-row prompt costs ~32 steps. Its descriptions never draft, and
/// once 8 of them are remembered `auto` decodes plainly and says why; the tokens are `ar`'s.
#[test]
fn auto_declines_a_draft_whose_start_the_answers_never_pay_for() {
    let e = Engine::load(&tiny(), EngineOptions::default()).unwrap();
    let mut c = cost(0.0, 0.29, 0.12);
    let curve = [1.0, 1.41, 1.72, 2.04, 2.47, 2.91, 3.44, 3.97];
    c.pass_s = c
        .rows
        .iter()
        .map(|&k| curve.get(k - 1).copied().unwrap_or(0.5 * k as f64))
        .collect();
    e.set_cost_model(c).unwrap();
    let mut chosen = Vec::new();
    for index in 0..10 {
        let (image, _) = world(index);
        let ar = Request {
            max_new_tokens: 96,
            ..Request::chat("Describe the image in detail.", vec![image])
        };
        let got = auto_against_ar(&e, &ar, &index.to_string());
        assert_eq!(got.decode.counters.get("drafts").copied().unwrap_or(0), 0);
        chosen.push((got.decode.strategy, got.decode.auto.unwrap_or_default()));
    }
    // The first 8 with the draft (too few answers to judge), then plainly.
    assert!(chosen[..8].iter().all(|(s, _)| s == "eagle"), "{chosen:?}");
    for (strategy, why) in &chosen[8..] {
        assert_eq!(strategy, "ar");
        assert!(why.contains("would not pay for itself"), "{why}");
    }
}

/// The measured cost model is written to the cost cache and read back by a later engine on the
/// same model, format and threads, without measuring again.
#[test]
fn the_cost_model_is_measured_once_and_cached_on_disk() {
    let dir = std::env::temp_dir().join(format!("glance-cost-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let options = EngineOptions {
        cost_cache: Some(dir.clone()),
        threads: Some(1),
        ..EngineOptions::default()
    };
    let e = Engine::load(&tiny(), options.clone()).unwrap();
    assert!(e.measured_cost().is_none());
    let r = Request {
        max_new_tokens: 4,
        decode: DecodeSpec::auto(),
        ..Request::chat("What is a red circle?", vec![])
    };
    run(&e, &r);
    let first = e.measured_cost().unwrap();
    let eagle = e.draft(DraftKind::Eagle).unwrap();
    assert!(first.pass(1) > 0.0 && first.c(8) >= 1.0 && first.draft(eagle.as_ref()).is_some());
    assert!(first.key.contains("threads 1"), "{}", first.key);
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(files.len(), 1);
    let again = Engine::load(&tiny(), options).unwrap();
    run(&again, &r);
    let read = again.measured_cost().unwrap();
    assert_eq!(read.key, first.key);
    let same = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs();
    assert!(read
        .pass_s
        .iter()
        .zip(&first.pass_s)
        .all(|(&a, &b)| same(a, b)));
    assert!(same(read.measured_s, first.measured_s));
    // Another thread count is another machine configuration: measured anew.
    let two = Engine::load(
        &tiny(),
        EngineOptions {
            cost_cache: Some(dir.clone()),
            threads: Some(2),
            ..EngineOptions::default()
        },
    )
    .unwrap();
    run(&two, &r);
    assert_ne!(two.measured_cost().unwrap().key, first.key);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// On a model converted for block diffusion (no draft heads), `auto` runs linear
/// self-speculation with cost-aware blocks where a block can pay — the converted model's own
/// autoregressive tokens, with plain steps and drafted blocks mixed — and `ar` where none can.
#[test]
fn auto_plans_diffusion_blocks_on_a_converted_model() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/glance-tiny-dvlm");
    let e = Engine::load(&dir, EngineOptions::default()).unwrap();
    let (image, _) = world(2);
    let ar = Request {
        max_new_tokens: 120,
        ..Request::chat("Describe the image in detail.", vec![image])
    };
    let want = run(&e, &ar);
    let auto = Request {
        decode: DecodeSpec::auto(),
        ..ar.clone()
    };
    e.set_cost_model(cost(0.05, 0.05, 0.0)).unwrap();
    let got = run(&e, &auto);
    assert_eq!(got.decode.strategy, "diffusion-linear");
    assert!(got
        .decode
        .auto
        .as_deref()
        .unwrap()
        .contains("cost-aware blocks"));
    assert_eq!(got.token_ids, want.token_ids);
    let passes = got.decode.forward_passes as usize;
    assert!(passes < got.token_ids.len() - 1, "{passes} passes");
    // A middling curve: blocks where acceptance pays for them, plain steps otherwise.
    e.set_cost_model(cost(0.4, 0.05, 0.0)).unwrap();
    let got = run(&e, &auto);
    assert_eq!(got.token_ids, want.token_ids);
    e.set_cost_model(cost(1.0, 0.05, 0.0)).unwrap();
    let got = run(&e, &auto);
    assert_eq!(got.decode.strategy, "ar");
    assert_eq!(got.token_ids, want.token_ids);
}
