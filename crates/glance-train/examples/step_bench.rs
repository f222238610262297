//! Times training steps of one stage, split into data / forward / backward / optimiser.
//!
//! `cargo run --release -p glance-train --example step_bench -- base llava 8 8 10 [notune|alloc|both] [workers]`
//! (preset, stage, images per step, turns per image, steps, cpu settings, workers).

use candle_core::Device;
use glance_train::data::WorldData;
use glance_train::export::write_model_files;
use glance_train::optim::AdamW;
use glance_train::step::{batch_grads, pack_images, Batch};
use glance_train::{OptimSpec, Stage, TrainConfig, TrainModel};
use std::time::Instant;

fn main() -> glance_train::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let preset = a.get(1).map_or("base", |s| s.as_str());
    let stage = match a.get(2).map_or("llava", |s| s.as_str()) {
        "vision" => Stage::Vision,
        "e2e" => Stage::EndToEnd,
        _ => Stage::Llava,
    };
    let images: usize = a.get(3).and_then(|s| s.parse().ok()).unwrap_or(8);
    let turns: usize = a.get(4).and_then(|s| s.parse().ok()).unwrap_or(8);
    let steps: usize = a.get(5).and_then(|s| s.parse().ok()).unwrap_or(10);
    let workers: usize = a.get(7).and_then(|s| s.parse().ok()).unwrap_or(1);
    match a.get(6).map(|s| s.as_str()) {
        Some("notune") => {}
        Some("alloc") => println!(
            "allocator tuned: {}",
            glance_train::runtime::tune_allocator()
        ),
        _ => println!("{:?}", glance_train::runtime::prepare_cpu_for_training()),
    }
    if workers > 1 {
        std::env::set_var("RAYON_NUM_THREADS", "1");
    }
    let cfg = TrainConfig::preset(preset)?;
    let dir = std::env::temp_dir().join(format!("glance-step-bench-{}", std::process::id()));
    write_model_files(&dir, &cfg.model)?;
    let model = TrainModel::new(&cfg.model, 0, &Device::Cpu)?;
    let data = WorldData::new(&dir, &model.config, &Device::Cpu)?;
    let params = model.stage_params(stage);
    println!(
        "{preset} {stage}: {} trainable params, {images} images × {turns} turns",
        TrainModel::count(&params)
    );
    let mut opt = AdamW::new(params, OptimSpec::with_lr(1e-3, 10), 1000);
    let mut cursor = 0;
    let mut tot = [0f64; 4];
    for s in 0..steps {
        let t0 = Instant::now();
        let ims = data.next_images(&mut cursor, images, 6)?;
        let t1 = Instant::now();
        let pixels: Vec<&candle_core::Tensor> = ims.iter().map(|im| &im.pixels).collect();
        let (targets, packed);
        let input = match stage {
            Stage::Vision => {
                targets = ims
                    .iter()
                    .map(|im| data.vision_targets(&im.scene))
                    .collect::<Result<Vec<_>, _>>()?;
                Batch::Vision {
                    pixels,
                    targets: &targets,
                }
            }
            _ => {
                packed = pack_images(&data, &ims, turns)?;
                Batch::Qa {
                    items: pixels.into_iter().zip(&packed).collect(),
                    drops: &[],
                    align: None,
                }
            }
        };
        let t2 = Instant::now();
        let b = batch_grads(&model, stage, &input, workers)?;
        let loss = b.loss;
        let t3 = Instant::now();
        opt.step(&b.stores)?;
        let t4 = Instant::now();
        let d = [t1 - t0, t2 - t1, t3 - t2, t4 - t3].map(|x| x.as_secs_f64());
        println!("step {s}: loss {loss:.4} units {} | data {:.3} pack {:.3} fwd+bwd {:.3} opt {:.3} = {:.3} s", b.units, d[0], d[1], d[2], d[3], d.iter().sum::<f64>());
        if s > 0 {
            for k in 0..4 {
                tot[k] += d[k];
            }
        }
    }
    let n = (steps - 1).max(1) as f64;
    let per = tot.iter().sum::<f64>() / n;
    println!(
        "mean (steps 2..): data {:.3} pack {:.3} fwd+bwd {:.3} opt {:.3} = {per:.3} s/step, {:.2} images/s",
        tot[0] / n, tot[1] / n, tot[2] / n, tot[3] / n, images as f64 / per
    );
    Ok(())
}
