//! The training loop: the loss falls, a stopped-and-resumed run equals the uninterrupted one.

mod common;

use glance_train::metrics::{records, Record};
use glance_train::trainer::{RunEnd, Silent};
use glance_train::{Stage, Trainer};
use std::collections::HashMap;

fn weights(t: &Trainer) -> HashMap<String, Vec<f32>> {
    t.model
        .all_params()
        .into_iter()
        .map(|p| {
            (
                p.name,
                p.var.as_tensor().flatten_all().unwrap().to_vec1().unwrap(),
            )
        })
        .collect()
}

fn losses(dir: &std::path::Path, stage: Stage) -> Vec<f64> {
    let file = std::fs::File::open(dir.join("metrics.jsonl")).unwrap();
    records(std::io::BufReader::new(file))
        .map(|r| r.unwrap().1)
        .filter_map(|r| match r {
            Record::Step(s) if s.stage == stage => Some(f64::from(s.loss)),
            _ => None,
        })
        .collect()
}

fn step_seconds(dir: &std::path::Path, stage: Stage) -> Vec<f64> {
    let file = std::fs::File::open(dir.join("metrics.jsonl")).unwrap();
    records(std::io::BufReader::new(file))
        .map(|r| r.unwrap().1)
        .filter_map(|r| match r {
            Record::Step(s) if s.stage == stage => Some(s.seconds),
            _ => None,
        })
        .collect()
}

/// Stopping after k steps and resuming from the checkpoint reproduces the uninterrupted run
/// bit for bit: weights, optimiser moments, data cursor, curriculum, schedule, token drops and the
/// alignment term (both on in the QA stages here).
#[test]
fn resume_reproduces_the_uninterrupted_run() {
    common::setup();
    let mut config = common::tiny_config([5, 5, 3]);
    for s in &mut config.stages[1..] {
        s.token_drop = Some(glance_train::TokenDrop::every_policy(0.5));
        s.align = Some(1.0);
    }
    let a = common::scratch("resume-a");
    let mut full = Trainer::new(config.clone(), &a).unwrap();
    assert_eq!(full.run(&mut Silent, None).unwrap(), RunEnd::Finished);

    let b = common::scratch("resume-b");
    let mut part = Trainer::new(config, &b).unwrap();
    // Stop mid-vision, then mid-LLaVA (optimiser state restored mid-stage both times).
    assert_eq!(part.run(&mut Silent, Some(3)).unwrap(), RunEnd::Stopped);
    drop(part);
    let mut part = Trainer::resume(&b).unwrap();
    assert_eq!((part.state.stage_index, part.state.stage_step), (0, 3));
    assert_eq!(part.run(&mut Silent, Some(4)).unwrap(), RunEnd::Stopped);
    drop(part);
    let mut part = Trainer::resume(&b).unwrap();
    assert_eq!((part.state.stage_index, part.state.stage_step), (1, 2));
    assert_eq!(part.run(&mut Silent, None).unwrap(), RunEnd::Finished);

    let (wa, wb) = (weights(&full), weights(&part));
    assert_eq!(wa.len(), wb.len());
    let mut worst = 0f32;
    for (name, va) in &wa {
        let vb = &wb[name];
        for (x, y) in va.iter().zip(vb) {
            worst = worst.max((x - y).abs());
        }
    }
    assert!(worst <= 1e-6, "resumed weights differ by up to {worst}");
    eprintln!("largest weight difference after resume: {worst}");
    assert_eq!(full.state.cursor, part.state.cursor);
    // The step losses logged by the two runs agree too.
    assert_eq!(losses(&a, Stage::Llava), losses(&b, Stage::Llava));
}

/// A short run on the tiny model lowers the loss of the vision and the LLaVA stage.
#[test]
fn short_run_lowers_the_loss() {
    common::setup();
    let mut config = common::tiny_config([60, 60, 0]);
    config.stages.truncate(2);
    for s in &mut config.stages {
        s.curriculum_start = None;
        s.images_per_step = 4;
    }
    let dir = common::scratch("loss");
    let mut t = Trainer::new(config, &dir).unwrap();
    t.run(&mut Silent, None).unwrap();
    // Deterministic run (seeded weights, fixed data): no flakiness in these thresholds.
    for (stage, ratio) in [(Stage::Vision, 0.85), (Stage::Llava, 0.75)] {
        let l = losses(&dir, stage);
        let head: f64 = l[..5].iter().sum::<f64>() / 5.0;
        let tail: f64 = l[l.len() - 5..].iter().sum::<f64>() / 5.0;
        assert!(
            tail < ratio * head,
            "stage {stage}: loss {head:.3} → {tail:.3}"
        );
    }
}

/// A time-budgeted stage times its first steps, fixes its step count (saved for resume) and
/// stops there.
#[test]
fn time_budget_fixes_the_step_count() {
    use glance_train::Budget;
    common::setup();
    let mut config = common::tiny_config([0, 0, 0]);
    config.stages.truncate(1);
    config.stages[0].budget = Budget::Seconds(1.0);
    let dir = common::scratch("budget");
    let mut t = Trainer::new(config, &dir).unwrap();
    assert_eq!(t.run(&mut Silent, None).unwrap(), RunEnd::Finished);
    let seconds = step_seconds(&dir, Stage::Vision);
    let steps = seconds.len() as u64;
    let probe = glance_train::trainer::PROBE_STEPS;
    assert!(steps >= probe, "{steps} steps");
    // The count is the budget over the mean time of the probe steps after the first (the logged
    // step times are the ones the trainer used).
    let probe_time: f64 = seconds[1..probe as usize].iter().sum();
    let per_step = probe_time / (probe - 1) as f64;
    let want = ((1.0 / per_step).floor() as u64).max(probe);
    assert_eq!(steps, want, "{per_step} s/step");
    assert_eq!(t.state.stage_seconds[0], seconds.iter().sum::<f64>());
}

/// `--init`: weights load back from an exported directory by name.
#[test]
fn init_loads_exported_weights() {
    common::setup();
    let mut config = common::tiny_config([2, 0, 0]);
    config.stages.truncate(1);
    let dir = common::scratch("init");
    let mut t = Trainer::new(config.clone(), &dir).unwrap();
    t.run(&mut Silent, None).unwrap();
    let mut reseeded = config;
    reseeded.seed = 99;
    let other = Trainer::new(reseeded, &common::scratch("init-b")).unwrap();
    let n = other.model.load_weights(&Trainer::model_dir(&dir)).unwrap();
    assert_eq!(n, t.model.export_params().len());
    let (a, b) = (weights(&t), weights(&other));
    for p in t.model.export_params() {
        assert_eq!(a[&p.name], b[&p.name], "{}", p.name);
    }
    // The training heads are not exported, so they keep the other run's initialisation.
    assert_ne!(a["train_heads.cls.weight"], b["train_heads.cls.weight"]);
}

/// The brief's long form of the resume check: 2,000 steps uninterrupted vs 1,000 + resume 1,000
/// (tiny model). About a minute on 2 cores, so not in CI: `cargo test --release -p glance-train
/// --test train -- --ignored`.
#[test]
#[ignore]
fn resume_after_1000_of_2000_steps() {
    common::setup();
    let config = common::tiny_config([1000, 1000, 0]);
    let mut config = config;
    config.stages.truncate(2);
    config.checkpoint_every = 250;
    let a = common::scratch("resume-long-a");
    let mut full = Trainer::new(config.clone(), &a).unwrap();
    full.run(&mut Silent, None).unwrap();
    let b = common::scratch("resume-long-b");
    Trainer::new(config, &b)
        .unwrap()
        .run(&mut Silent, Some(1000))
        .unwrap();
    let mut part = Trainer::resume(&b).unwrap();
    assert_eq!((part.state.stage_index, part.state.stage_step), (1, 0));
    part.run(&mut Silent, None).unwrap();
    let (wa, wb) = (weights(&full), weights(&part));
    let worst = wa
        .iter()
        .flat_map(|(n, va)| va.iter().zip(&wb[n]).map(|(x, y)| (x - y).abs()))
        .fold(0f32, f32::max);
    eprintln!("2000 vs 1000 + 1000 steps: largest weight difference {worst}");
    assert!(worst <= 1e-6, "{worst}");
}
