//! `glance train diffusion` on a tiny random model: a short conversion lowers both losses and
//! exports a model directory the engine reads as converted, and resume is exact.

mod common;

use glance_models::llava::LlavaConfig;
use glance_train::diffusion::trainer::{DiffusionObserver, RunEnd};
use glance_train::diffusion::{DiffusionTrainConfig, DiffusionTrainer};
use glance_train::Budget;
use std::path::Path;

struct Quiet;
impl DiffusionObserver for Quiet {}

/// Small pools and answers, blocks of 2 and 4, a high learning rate: a few steps move the
/// losses. The source's LM head is left as initialised, so its greedy answers are not yet its
/// own near-certain predictions and the causal loss has room to fall too.
fn tiny_config(source: &Path, steps: u64) -> DiffusionTrainConfig {
    let mut c = DiffusionTrainConfig::new(source.to_path_buf(), Budget::Steps(steps));
    c.batch = 2;
    c.long_pool = 3;
    c.short_pool = 2;
    c.max_new_long = 12;
    c.max_new_short = 4;
    c.block_sizes = vec![2, 4];
    c.eval_long = 2;
    c.eval_short = 1;
    c.eval_blocks = vec![4];
    c.eval_every = 0;
    c.checkpoint_every = 1000;
    c.cache_mib = 64;
    c.optim = glance_train::OptimSpec {
        weight_decay: 0.0,
        ..glance_train::OptimSpec::with_lr(3e-3, 2)
    };
    c
}

#[test]
fn a_short_conversion_lowers_both_losses_and_exports_a_converted_model() {
    let dir = common::scratch("diffusion-loss");
    common::tiny_target(&dir.join("source"), 1.0);
    let out = dir.join("out");
    let mut t = DiffusionTrainer::new(tiny_config(&dir.join("source"), 30), &out).unwrap();
    let before = t.evaluate().unwrap();
    assert_eq!(t.run(&mut Quiet, None).unwrap(), RunEnd::Finished);
    let after = t.evaluate().unwrap();
    assert!(
        after.diffusion_loss < 0.8 * before.diffusion_loss,
        "diffusion loss {} → {}",
        before.diffusion_loss,
        after.diffusion_loss
    );
    assert!(
        after.causal_loss < before.causal_loss,
        "causal loss {} → {}",
        before.causal_loss,
        after.causal_loss
    );
    let model = DiffusionTrainer::model_dir(&out);
    let config = LlavaConfig::from_dir(&model).unwrap();
    let bd = config.block_diffusion.expect("a block_diffusion entry");
    assert_eq!(bd.mask_token_id, t.mask_id());
    assert_eq!(bd.trained_block_sizes, vec![2, 4]);
    for f in [
        "tokenizer.json",
        "model.safetensors",
        "preprocessor_config.json",
    ] {
        assert!(model.join(f).is_file(), "{f} missing");
    }
    glance_models::llava::Llava::load(&model, &candle_core::Device::Cpu).unwrap();
}

#[test]
fn resume_reproduces_the_uninterrupted_conversion() {
    let dir = common::scratch("diffusion-resume");
    common::tiny_target(&dir.join("source"), 1.0);
    let c = tiny_config(&dir.join("source"), 5);
    let (a, b) = (dir.join("a"), dir.join("b"));
    let mut full = DiffusionTrainer::new(c.clone(), &a).unwrap();
    assert_eq!(full.run(&mut Quiet, None).unwrap(), RunEnd::Finished);
    let mut part = DiffusionTrainer::new(c, &b).unwrap();
    assert_eq!(part.run(&mut Quiet, Some(3)).unwrap(), RunEnd::Stopped);
    drop(part);
    let mut rest = DiffusionTrainer::resume(&b).unwrap();
    assert_eq!(rest.state.step, 3);
    assert_eq!(rest.run(&mut Quiet, None).unwrap(), RunEnd::Finished);
    common::assert_same_params(full.params(), rest.params());
    let steps = |d: &Path| -> Vec<String> {
        std::fs::read_to_string(d.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .filter(|l| l.contains("\"step\"") && l.contains("\"kind\":\"step\""))
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                format!("{} {} {}", v["step"], v["diffusion"], v["causal"])
            })
            .collect()
    };
    assert_eq!(steps(&a).len(), 5);
    assert_eq!(steps(&a), steps(&b));
}

/// Under token drop the train split's samples are pruned prompts with the source's own greedy
/// answers; before any step the converted model is the source, so its causal predictions
/// reproduce those answers exactly, and a short run on them finishes. (Where each row sits is
/// checked by the unit test of `row_positions`: this random model barely depends on position.)
#[test]
fn pruned_samples_train_at_the_positions_decoding_used() {
    let dir = common::scratch("diffusion-drop");
    common::tiny_target(&dir.join("source"), 1.0);
    let mut c = tiny_config(&dir.join("source"), 2);
    c.token_drop = Some(glance_train::TokenDrop::every_policy(1.0));
    let mut t = DiffusionTrainer::new(c, &dir.join("out")).unwrap();
    let pruned = t
        .source
        .get(
            glance_world::Split::Train,
            glance_train::draft::Length::Long,
            0,
        )
        .unwrap();
    assert!(
        pruned.positions[pruned.prompt_len] as usize > pruned.prompt_len,
        "pruned"
    );
    let r = t.evaluate_on(glance_world::Split::Train).unwrap();
    assert_eq!(r.causal_agreement, 1.0, "{r:?}");
    assert_eq!(t.run(&mut Quiet, None).unwrap(), RunEnd::Finished);
}
