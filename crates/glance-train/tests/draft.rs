//! `glance train draft` on a tiny random target: gradients reach every head tensor, the
//! multi-pass forward is what inference computes, the loss falls, and resume is exact.

mod common;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use glance_models::draft::DraftHead;
use glance_nn::{AttnMask, CausalLm, DraftLm, DraftPrompt, Mode};
use glance_train::draft::passes::{sample_loss, PassSettings, Perturbation};
use glance_train::draft::trainer::{Quiet, RunEnd};
use glance_train::draft::{Curriculum, DraftTrainConfig, DraftTrainer, Length};
use glance_train::Budget;
use glance_world::Split;
use std::path::Path;

/// Small pools, short answers, one curriculum stage throughout (half long answers, some
/// distractors), so a few steps see repeated samples.
fn tiny_config(target: &Path, steps: u64) -> DraftTrainConfig {
    let mut c = DraftTrainConfig::vispec(target.to_path_buf(), 4, Budget::Steps(steps));
    c.batch = 3;
    c.long_pool = 4;
    c.short_pool = 3;
    c.max_new_long = 8;
    c.max_new_short = 3;
    c.eval_long = 2;
    c.eval_short = 1;
    c.eval_every = 0;
    c.checkpoint_every = 1000;
    c.cache_mib = 64;
    c.optim = glance_train::OptimSpec {
        weight_decay: 0.0,
        ..glance_train::OptimSpec::with_lr(3e-3, 2)
    };
    c.curriculum = Curriculum {
        short_until: 0.0,
        mixed_until: 0.0,
        mixed_long: 0.5,
        final_long: 0.5,
        distractor: 0.3,
    };
    c
}

fn settings(c: &DraftTrainConfig) -> PassSettings {
    PassSettings {
        passes: c.passes,
        hidden_weight: c.hidden_weight,
        pass_decay: c.pass_decay,
    }
}

#[test]
fn every_head_tensor_gets_a_gradient() {
    let dir = common::scratch("draft-grads");
    common::tiny_target(&dir.join("target"), 100.0);
    let c = tiny_config(&dir.join("target"), 1);
    let mut t = DraftTrainer::new(c.clone(), &dir.join("out")).unwrap();
    let s = t.source.get(Split::Train, Length::Long, 0).unwrap();
    let other = t.source.get(Split::Train, Length::Long, 1).unwrap();
    let visual = other.visual().unwrap();
    for distractor in [None, Some(&visual)] {
        let perturb = Perturbation {
            noise: 0.1,
            noise_seed: 1,
            distractor,
        };
        let out = sample_loss(
            t.head(),
            t.source.target.text(),
            &s,
            &settings(&c),
            &perturb,
            1.0,
        )
        .unwrap();
        assert_eq!(
            out.predictions.len(),
            3,
            "the answer is long enough for 3 passes"
        );
        let grads = out.loss.backward().unwrap();
        let mut zero = Vec::new();
        for p in t.params() {
            match grads.get(p.var.as_tensor()) {
                None => zero.push(format!("{} (no gradient)", p.name)),
                Some(g) => {
                    let m: f32 = g.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
                    if !(m > 0.0 && m.is_finite()) {
                        zero.push(format!("{} (max |g| = {m})", p.name));
                    }
                }
            }
        }
        let names: Vec<&str> = t.params().iter().map(|p| p.name.as_str()).collect();
        for want in [
            "inject.weight",
            "adaptor.queries",
            "fc.weight",
            "norm.weight",
        ] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        assert!(zero.is_empty(), "tensors without gradient: {zero:#?}");
    }
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap()
}

/// Pass k's row r equals what the head computes at inference (fused ops, KV cache) at draft depth
/// k-1 after the prompt rows up to r: the multi-pass masks and positions are the inference ones.
#[test]
fn passes_match_cached_inference() {
    let dir = common::scratch("draft-passes");
    common::tiny_target(&dir.join("target"), 100.0);
    let c = tiny_config(&dir.join("target"), 1);
    let mut t = DraftTrainer::new(c.clone(), &dir.join("out")).unwrap();
    let s = t.source.get(Split::Train, Length::Long, 2).unwrap();
    let train = sample_loss(
        t.head(),
        t.source.target.text(),
        &s,
        &settings(&c),
        &Perturbation::default(),
        1.0,
    )
    .unwrap();
    let vb = VarBuilder::from_varmap(t.varmap(), DType::F32, &Device::Cpu);
    let infer = DraftHead::from_var_builder(&vb, t.head_config.clone(), Mode::Infer).unwrap();
    let (len, p) = (s.len(), s.prompt_len);
    let positions: Vec<u32> = (0..len as u32).collect();
    let start = infer
        .start(&DraftPrompt {
            inputs: &s.rows,
            hidden: &s.hidden,
            positions: &positions,
            images: std::slice::from_ref(&s.image_rows),
        })
        .unwrap();
    let n = start.rows.dim(0).unwrap();
    let lm = t.source.target.text();
    for i in [0usize, 2] {
        let r = p - 1 + i;
        let d = n - (len - r);
        let mut cache = infer.new_cache();
        let out = infer
            .forward(
                &start.rows.narrow(0, 0, d + 1).unwrap(),
                &start.positions[..=d],
                &AttnMask::Causal,
                &mut cache,
            )
            .unwrap();
        let mut prev = out.narrow(0, d, 1).unwrap();
        let got = train.predictions[0].narrow(0, i, 1).unwrap();
        assert!(max_diff(&prev, &got) < 1e-4, "pass 1 row {i}");
        for k in 2..=3 {
            let emb = lm.embed_tokens(&[s.answer[i + k - 2]]).unwrap();
            let x = infer.fuse(&emb, &prev, &start.context).unwrap();
            prev = infer
                .forward(&x, &[(r + k - 1) as u32], &AttnMask::Causal, &mut cache)
                .unwrap();
            let got = train.predictions[k - 1].narrow(0, i, 1).unwrap();
            let diff = max_diff(&prev, &got);
            assert!(diff < 1e-4, "pass {k} row {i}: {diff}");
        }
    }
}

fn losses(dir: &Path) -> Vec<f64> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "step")
        .map(|v| v["loss"].as_f64().unwrap())
        .collect()
}

#[test]
fn a_short_run_lowers_the_loss_and_exports_a_loadable_head() {
    let dir = common::scratch("draft-loss");
    common::tiny_target(&dir.join("target"), 100.0);
    let out = dir.join("out");
    let mut t = DraftTrainer::new(tiny_config(&dir.join("target"), 40), &out).unwrap();
    assert_eq!(t.run(&mut Quiet, None).unwrap(), RunEnd::Finished);
    let l = losses(&out);
    assert_eq!(l.len(), 40);
    let first = l[..5].iter().sum::<f64>() / 5.0;
    let last = l[35..].iter().sum::<f64>() / 5.0;
    assert!(last < 0.7 * first, "loss {first:.4} → {last:.4}");
    let head = DraftHead::load(&DraftTrainer::head_dir(&out), &Device::Cpu).unwrap();
    assert_eq!(head.kind(), glance_nn::DraftKind::Vispec);
    assert_eq!(head.config(), &t.head_config);
}

#[test]
fn resume_reproduces_the_uninterrupted_run() {
    let dir = common::scratch("draft-resume");
    common::tiny_target(&dir.join("target"), 100.0);
    let c = tiny_config(&dir.join("target"), 6);
    let (a, b) = (dir.join("a"), dir.join("b"));
    let mut full = DraftTrainer::new(c.clone(), &a).unwrap();
    assert_eq!(full.run(&mut Quiet, None).unwrap(), RunEnd::Finished);
    let mut part = DraftTrainer::new(c, &b).unwrap();
    assert_eq!(part.run(&mut Quiet, Some(4)).unwrap(), RunEnd::Stopped);
    drop(part);
    let mut rest = DraftTrainer::resume(&b).unwrap();
    assert_eq!(rest.state.step, 4);
    assert_eq!(rest.run(&mut Quiet, None).unwrap(), RunEnd::Finished);
    common::assert_same_params(full.params(), rest.params());
    assert_eq!(losses(&a), losses(&b));
}

/// With token drop on, training samples show the target a pruned image: fewer image rows, each
/// at its own position, the answer after the whole prompt's positions (as `--prune` decodes);
/// validation samples stay whole, and the multi-pass loss runs on the pruned rows.
#[test]
fn token_drop_samples_keep_positions_and_leave_validation_whole() {
    let dir = common::scratch("draft-drop");
    common::tiny_target(&dir.join("target"), 100.0);
    let plain = tiny_config(&dir.join("target"), 1);
    let mut dropped = plain.clone();
    dropped.token_drop = Some(glance_train::TokenDrop::every_policy(1.0));
    let mut a = DraftTrainer::new(plain.clone(), &dir.join("a")).unwrap();
    let mut b = DraftTrainer::new(dropped.clone(), &dir.join("b")).unwrap();
    for j in 0..3 {
        let whole = a.source.get(Split::Train, Length::Long, j).unwrap();
        let pruned = b.source.get(Split::Train, Length::Long, j).unwrap();
        assert_eq!(whole.question, pruned.question);
        let (n, k) = (whole.image_rows.len(), pruned.image_rows.len());
        assert!(k < n, "sample {j}: {k} of {n} image rows kept");
        assert_eq!(pruned.prompt_len, whole.prompt_len - (n - k));
        assert_eq!(pruned.prompt_ids.len(), pruned.prompt_len);
        let p = whole.prompt_len as u32;
        let prompt = &pruned.positions[..pruned.prompt_len];
        assert!(prompt.windows(2).all(|w| w[0] < w[1]), "{prompt:?}");
        assert_eq!(
            prompt.last(),
            Some(&(p - 1)),
            "the question keeps its positions"
        );
        let answer: Vec<u32> = (0..pruned.answer.len() as u32).map(|i| p + i).collect();
        assert_eq!(pruned.positions[pruned.prompt_len..], answer[..]);
        let perturb = Perturbation {
            noise: 0.0,
            noise_seed: 1,
            distractor: None,
        };
        let out = sample_loss(
            b.head(),
            b.source.target.text(),
            &pruned,
            &settings(&dropped),
            &perturb,
            1.0,
        )
        .unwrap();
        assert!(out.loss.to_scalar::<f32>().unwrap().is_finite());
        let held_out = b.source.get(Split::Validation, Length::Short, j).unwrap();
        let same = a.source.get(Split::Validation, Length::Short, j).unwrap();
        assert_eq!(held_out.image_rows, same.image_rows);
        assert_eq!(held_out.answer, same.answer);
    }
}
