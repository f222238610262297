//! Helpers shared by the integration tests.
#![allow(dead_code)]

use candle_core::Device;
use glance_train::data::WorldData;
use glance_train::export::write_model_files;
use glance_train::{ModelSpec, TrainModel};
use std::path::PathBuf;

/// Element-wise ops on one thread, allocator tuned: once per test binary, before any tensor work.
pub fn setup() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        glance_train::runtime::prepare_cpu_for_training();
    });
}

/// A tiny training configuration: every stage, a few steps each, no validation.
pub fn tiny_config(steps: [u64; 3]) -> glance_train::TrainConfig {
    use glance_train::{Budget, OptimSpec, Stage, StageSpec, TrainConfig};
    let stage = |s, n, turns, lr| StageSpec {
        curriculum_start: Some(2),
        ..StageSpec::new(s, Budget::Steps(n), 2, turns, OptimSpec::with_lr(lr, 2))
    };
    TrainConfig {
        model: ModelSpec::tiny(),
        stages: vec![
            stage(Stage::Vision, steps[0], 0, 3e-3),
            stage(Stage::Llava, steps[1], 3, 3e-3),
            stage(Stage::EndToEnd, steps[2], 3, 1e-3),
        ],
        seed: 3,
        checkpoint_every: 1000,
        eval_every: 0,
        eval_per_family: 0,
        eval_max_new_tokens: 40,
        workers: 2,
    }
}

/// A scratch directory, removed when dropped.
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh, empty scratch directory for one test.
pub fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("glance-train-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// The tiny model (patch 56) with its data pipeline.
pub fn tiny(name: &str) -> (TrainModel, WorldData, Scratch) {
    setup();
    let spec = ModelSpec::tiny();
    let dir = scratch(name);
    write_model_files(&dir, &spec).unwrap();
    let model = TrainModel::new(&spec, 1, &Device::Cpu).unwrap();
    let data = WorldData::new(&dir, &model.config, &Device::Cpu).unwrap();
    (model, data, dir)
}

/// A random tiny LLaVA target (patch 56: 16 visual tokens, width 32) written to `dir`, its LM
/// head scaled by `head_scale`: scaled up, its next-token distributions are peaked (a freshly
/// initialised one is near uniform, leaving a draft little to learn beyond the entropy floor).
pub fn tiny_target(dir: &std::path::Path, head_scale: f64) {
    setup();
    let spec = ModelSpec::tiny();
    write_model_files(dir, &spec).unwrap();
    let model = TrainModel::new(&spec, 5, &Device::Cpu).unwrap();
    for p in model.export_params() {
        if p.name.ends_with("lm_head.weight") {
            p.var
                .set(&(p.var.as_tensor() * head_scale).unwrap())
                .unwrap();
        }
    }
    glance_train::export::write_weights(dir, &model.export_params()).unwrap();
}

/// Two runs' parameters are the same, name for name and bit for bit.
pub fn assert_same_params(a: &[glance_train::params::Param], b: &[glance_train::params::Param]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.name, y.name);
        let xv: Vec<f32> = x.var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let yv: Vec<f32> = y.var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        assert!(
            xv.iter().zip(&yv).all(|(p, q)| p.to_bits() == q.to_bits()),
            "{} differs after resume",
            x.name
        );
    }
}
